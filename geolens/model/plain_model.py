"""PlainTransformer: the paper's model in plain PyTorch layers, the one reference forward.

The hooked GeoTransformer is checked against it (tests/test_model.py: equal logits at every
position, for every topology) and it is the "straightforward" baseline of the training benchmark
(benchmarks/bench_train.py). It is written from the paper's equations with torch's own layers and
uses no geolens computation: nn.Embedding, bias-free nn.Linear Q/K/V/O (heads are contiguous blocks
of d_head features), softmax attention over the n_ctx positions, a ReLU MLP, torch's nn.LayerNorm /
nn.RMSNorm or the sphere projection as post-norms or pre-norms, and F.normalize for the bounded readout:

    post-norm:  h = N1(W_E[x] + W_pos)
                per layer:  h = N2(h + Attn(h));  h = N3(h + W_out relu(W_in h + b_in) + b_out)
                logits = R(h)
    pre-norm:   h = W_E[x] + W_pos
                per layer:  h = h + Attn(N2(h));  h = h + W_out relu(W_in N3(h) + b_in) + b_out
                logits = R(N1(h))
    R(h) = h @ W_U  (raw)  or  tau * h @ (W_U with unit-norm columns)  (bounded)

Each layer's N2, N3 are its own norm (cfg.layer_norms, a hybrid when they differ); N1 is layer 0's (post)
or the last layer's (pre).

load_from(model) copies a GeoTransformer's weights (HookedTransformer layout) into the nn.Linear
layout ([out, in]).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from geolens.model.config import GeoConfig


class SphereNorm(nn.Module):
    """x / max(||x||, eps): projection onto the unit sphere."""

    def __init__(self, eps: float):
        super().__init__()
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        return x / x.norm(dim=-1, keepdim=True).clamp_min(self.eps)


def plain_norm(cfg: GeoConfig, kind: str) -> nn.Module:
    """The norm `kind` (one of config.NORMS) as a torch module (an identity for 'none')."""
    if kind == "layernorm":
        return nn.LayerNorm(cfg.d_model, eps=cfg.ln_eps)
    if kind == "rmsnorm":
        return nn.RMSNorm(cfg.d_model, eps=cfg.rms_eps)
    if kind == "sphere":
        return SphereNorm(cfg.sphere_eps)
    return nn.Identity()


class PlainBlock(nn.Module):
    """One layer: attention, then the MLP, each followed (post-norm) or preceded (pre-norm) by its norm `kind`."""

    def __init__(self, cfg: GeoConfig, kind: str):
        super().__init__()
        D, HD = cfg.d_model, cfg.n_heads * cfg.d_head
        self.cfg = cfg
        self.q, self.k, self.v = (nn.Linear(D, HD, bias=False) for _ in range(3))
        self.o = nn.Linear(HD, D, bias=False)
        self.fc1, self.fc2 = nn.Linear(D, cfg.d_mlp), nn.Linear(cfg.d_mlp, D)
        self.norm_attn, self.norm_mlp = plain_norm(cfg, kind), plain_norm(cfg, kind)
        self.pre = cfg.norm_placement == "pre"

    def forward(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        if self.pre:
            h = h + self.attend(self.norm_attn(h))
            return h + self.fc2(F.relu(self.fc1(self.norm_mlp(h))))
        h = self.norm_attn(h + self.attend(h))
        return self.norm_mlp(h + self.fc2(F.relu(self.fc1(h))))

    def attend(self, h: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        """Multi-head softmax attention of every position over the n_ctx positions, projected by W_O."""
        cfg = self.cfg
        B, n, _ = h.shape
        H, dh = cfg.n_heads, cfg.d_head
        q, k, v = (lin(h).view(B, n, H, dh).transpose(1, 2) for lin in (self.q, self.k, self.v))  # [B, H, n, dh]
        scores = q @ k.transpose(-1, -2) / math.sqrt(dh)
        if cfg.attention == "uniform":
            scores = torch.zeros_like(scores)
        if cfg.causal:
            scores = scores.masked_fill(torch.ones(n, n, dtype=torch.bool, device=h.device).triu(1), float("-inf"))
        z = (scores.softmax(-1) @ v).transpose(1, 2).reshape(B, n, H * dh)
        return self.o(z)


class PlainTransformer(nn.Module):
    """The transformer of the module docstring (post- or pre-norm, any task's n_ctx), computed at every
    position; N1 is the embedding's norm (post) or the final one (pre)."""

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.d_vocab, cfg.d_model)
        self.pos = nn.Embedding(cfg.n_ctx, cfg.d_model)
        kinds = cfg.layer_norms
        self.norm_embed = plain_norm(cfg, kinds[-1] if cfg.norm_placement == "pre" else kinds[0])
        self.blocks = nn.ModuleList(PlainBlock(cfg, kind) for kind in kinds)
        self.unembed = nn.Linear(cfg.d_model, cfg.d_vocab_out, bias=False)

    def forward(self, tokens: Int[Tensor, "batch pos"], last_only: bool = False) -> Tensor:
        """Logits [batch, pos, d_vocab_out], or [batch, d_vocab_out] at the last position (`=`, the
        prediction) with last_only."""
        h = self.tok(tokens) + self.pos(torch.arange(tokens.shape[1], device=tokens.device))
        pre = self.cfg.norm_placement == "pre"
        if not pre:
            h = self.norm_embed(h)
        for block in self.blocks:
            h = block(h)
        if pre:
            h = self.norm_embed(h)
        if last_only:
            h = h[:, -1]
        if self.cfg.unembed == "bounded":
            return self.cfg.tau * h @ F.normalize(self.unembed.weight, dim=1).T
        return self.unembed(h)

    @torch.no_grad()
    def load_from(self, model) -> "PlainTransformer":
        """Take a GeoTransformer's weights (and its dtype and device); returns self."""
        cfg = self.cfg
        D, HD = cfg.d_model, cfg.n_heads * cfg.d_head
        self.to(model.embed.W_E)
        self.tok.weight.copy_(model.embed.W_E)
        self.pos.weight.copy_(model.pos_embed.W_pos)
        pre = cfg.norm_placement == "pre"
        norms = [(self.norm_embed, model.ln_final if pre else model.embed_norm)]
        for mine, theirs in zip(self.blocks, model.blocks):
            for lin, W in ((mine.q, theirs.attn.W_Q), (mine.k, theirs.attn.W_K), (mine.v, theirs.attn.W_V)):
                lin.weight.copy_(W.permute(1, 0, 2).reshape(D, HD).T)  # [H, D, dh] -> [H*dh, D]
            mine.o.weight.copy_(theirs.attn.W_O.reshape(HD, D).T)
            mine.fc1.weight.copy_(theirs.mlp.W_in.T)
            mine.fc1.bias.copy_(theirs.mlp.b_in)
            mine.fc2.weight.copy_(theirs.mlp.W_out.T)
            mine.fc2.bias.copy_(theirs.mlp.b_out)
            norms += ([(mine.norm_attn, theirs.ln1), (mine.norm_mlp, theirs.ln2)] if pre else
                      [(mine.norm_attn, theirs.attn_norm), (mine.norm_mlp, theirs.mlp_norm)])
        for mine, theirs in norms:
            if hasattr(theirs, "w"):
                mine.weight.copy_(theirs.w)
            if hasattr(theirs, "b"):
                mine.bias.copy_(theirs.b)
        self.unembed.weight.copy_(model.unembed.W_U.T)
        return self
