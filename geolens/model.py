"""GeoTransformer: the paper's post-norm transformer as a TransformerLens HookedRootModule.

Parameter names and shapes follow HookedTransformer (embed.W_E [d_vocab, d_model],
pos_embed.W_pos [n_ctx, d_model], blocks.L.attn.W_Q/W_K/W_V [n_heads, d_model, d_head],
W_O [n_heads, d_head, d_model], blocks.L.mlp.W_in/b_in/W_out/b_out, unembed.W_U
[d_model, d_vocab_out]). The topology differs from HookedTransformer in one way, as in the paper:
normalisation is *post*-norm and its output replaces the residual stream:

    h = embed_norm(W_E[x] + W_pos)                    -> blocks.0.hook_resid_pre
    h = blocks.L.attn_norm(h + attn(h))               -> blocks.L.hook_resid_mid
    h = blocks.L.mlp_norm(h + mlp(h))                 -> blocks.L.hook_resid_post
    logits = unembed(h[:, -1])                        -> [batch, d_vocab_out]

Extra hook points: every norm has hook_scale (the norm of its input before projection) and
hook_normalized (its output); the bounded unembedding has hook_in, hook_scores (cosines against
the normalised W_U columns) and hook_logits (tau * scores).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from geolens.config import GeoConfig


# ---- normalisations (post-norm; the output replaces the residual stream) --------------------
class LayerNorm(nn.Module):
    """(x - mean) / sqrt(var + eps) * w + b. hook_scale: [batch, pos, 1]."""

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.eps = cfg.ln_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.b = nn.Parameter(torch.zeros(cfg.d_model))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        x = x - x.mean(-1, keepdim=True)
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w + self.b)


class RMSNorm(nn.Module):
    """x * rsqrt(mean(x^2) + eps) * w, w learnable (init 1). hook_scale: [batch, pos, 1]."""

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.eps = cfg.rms_eps
        self.w = nn.Parameter(torch.ones(cfg.d_model))
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        scale = self.hook_scale((x.pow(2).mean(-1, keepdim=True) + self.eps).sqrt())
        return self.hook_normalized(x / scale * self.w)


class SphereNorm(nn.Module):
    """Projection onto the unit sphere, x / max(||x||_2, eps); no parameters. hook_scale: ||x||."""

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.eps = cfg.sphere_eps
        self.hook_scale = HookPoint()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        scale = self.hook_scale(x.norm(dim=-1, keepdim=True).clamp_min(self.eps))
        return self.hook_normalized(x / scale)


class NoNorm(nn.Module):
    """Identity (the 'none' baseline); keeps a hook_normalized so hook names do not depend on the norm."""

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.hook_normalized = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        return self.hook_normalized(x)


NORM_CLASSES = {"layernorm": LayerNorm, "rmsnorm": RMSNorm, "sphere": SphereNorm, "none": NoNorm}


# ---- embeddings ------------------------------------------------------------------------------
class Embed(nn.Module):
    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.W_E = nn.Parameter(torch.empty(cfg.d_vocab, cfg.d_model))

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_E[tokens]


class PosEmbed(nn.Module):
    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.W_pos = nn.Parameter(torch.empty(cfg.n_ctx, cfg.d_model))

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        return self.W_pos[: tokens.shape[1]].unsqueeze(0).expand(tokens.shape[0], -1, -1)


# ---- attention and MLP -----------------------------------------------------------------------
class Attention(nn.Module):
    """Multi-head attention without biases. Uniform mode zeroes the scores before the softmax."""

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.cfg = cfg
        H, D, Dh = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(H, D, Dh))
        self.W_K = nn.Parameter(torch.empty(H, D, Dh))
        self.W_V = nn.Parameter(torch.empty(H, D, Dh))
        self.W_O = nn.Parameter(torch.empty(H, Dh, D))
        for name in ("q", "k", "v", "attn_scores", "pattern", "z"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        q = self.hook_q(torch.einsum("bpd,hde->bphe", x, self.W_Q))
        k = self.hook_k(torch.einsum("bpd,hde->bphe", x, self.W_K))
        v = self.hook_v(torch.einsum("bpd,hde->bphe", x, self.W_V))
        if self.cfg.attention == "uniform":
            scores = x.new_zeros(x.shape[0], self.cfg.n_heads, x.shape[1], x.shape[1])
        else:
            scores = torch.einsum("bqhe,bkhe->bhqk", q, k) / math.sqrt(self.cfg.d_head)
        if self.cfg.causal:
            n = x.shape[1]
            mask = torch.triu(torch.ones(n, n, dtype=torch.bool, device=x.device), diagonal=1)
            scores = scores.masked_fill(mask, float("-inf"))
        scores = self.hook_attn_scores(scores)
        pattern = self.hook_pattern(scores.softmax(dim=-1))
        z = self.hook_z(torch.einsum("bhqk,bkhe->bqhe", pattern, v))
        return torch.einsum("bqhe,hed->bqd", z, self.W_O)


class MLP(nn.Module):
    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.W_in = nn.Parameter(torch.empty(cfg.d_model, cfg.d_mlp))
        self.b_in = nn.Parameter(torch.empty(cfg.d_mlp))
        self.W_out = nn.Parameter(torch.empty(cfg.d_mlp, cfg.d_model))
        self.b_out = nn.Parameter(torch.empty(cfg.d_model))
        self.hook_pre = HookPoint()
        self.hook_post = HookPoint()

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        pre = self.hook_pre(x @ self.W_in + self.b_in)
        post = self.hook_post(F.relu(pre))
        return post @ self.W_out + self.b_out


class Block(nn.Module):
    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.attn = Attention(cfg)
        self.attn_norm = NORM_CLASSES[cfg.norm](cfg)
        self.mlp = MLP(cfg)
        self.mlp_norm = NORM_CLASSES[cfg.norm](cfg)
        for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        attn_out = self.hook_attn_out(self.attn(resid))
        resid = self.hook_resid_mid(self.attn_norm(resid + attn_out))
        mlp_out = self.hook_mlp_out(self.mlp(resid))
        return self.hook_resid_post(self.mlp_norm(resid + mlp_out))


# ---- readouts --------------------------------------------------------------------------------
class Unembed(nn.Module):
    """Raw readout logits = h @ W_U; bounded readout logits = tau * h . (W_U column / ||column||).

    The bounded readout does not normalise h (on the sphere h is already unit norm, so the
    logits are tau times a cosine).
    """

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.bounded = cfg.unembed == "bounded"
        self.tau = cfg.tau
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out))
        self.hook_in = HookPoint()
        if self.bounded:
            self.hook_scores = HookPoint()
        self.hook_logits = HookPoint()

    def readout_matrix(self) -> Float[Tensor, "d_model d_vocab_out"]:
        """The matrix the readout multiplies h by (column-normalised W_U for bounded, times tau)."""
        if self.bounded:
            return self.tau * self.W_U / self.W_U.norm(dim=0, keepdim=True).clamp_min(1e-12)
        return self.W_U

    def forward(self, h: Float[Tensor, "batch d_model"]) -> Float[Tensor, "batch d_vocab_out"]:
        h = self.hook_in(h)
        if self.bounded:
            W = self.W_U / self.W_U.norm(dim=0, keepdim=True).clamp_min(1e-12)
            return self.hook_logits(self.tau * self.hook_scores(h @ W))
        return self.hook_logits(h @ self.W_U)


# ---- the model -------------------------------------------------------------------------------
class GeoTransformer(HookedRootModule):
    """The paper's transformer with switchable topology; forward gives logits at the last position.

    forward(tokens [batch, n_ctx]) -> logits [batch, d_vocab_out].
    """

    def __init__(self, cfg: GeoConfig, seed: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        self.pos_embed = PosEmbed(cfg)
        self.hook_pos_embed = HookPoint()
        self.embed_norm = NORM_CLASSES[cfg.norm](cfg)
        self.blocks = nn.ModuleList([Block(cfg) for _ in range(cfg.n_layers)])
        self.unembed = Unembed(cfg)
        self.init_weights(cfg.seed if seed is None else seed)
        self.setup()

    # ---- initialisation ----
    @torch.no_grad()
    def init_weights(self, seed: int) -> None:
        """'paper': the distributions of the author's notebooks (embeddings N(0,1), linear weights and
        biases U(+-1/sqrt(fan_in))), drawn from a private generator in parameter order. 'notebook':
        exactly the notebooks' initial tensors for this seed (_init_like_notebooks). 'tl':
        HookedTransformer-style N(0, (0.8/sqrt(d_model))^2) weights, zero biases. Norm gains 1,
        offsets 0. Then the optional Fourier embedding."""
        cfg = self.cfg
        if cfg.init == "notebook":
            self._init_like_notebooks(seed)
            if cfg.fourier_init:
                self.apply_fourier_init(cfg.fourier_init)
            return
        g = torch.Generator().manual_seed(seed)
        for name, param in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf == "w":
                param.fill_(1.0)
            elif leaf == "b":
                param.zero_()
            elif cfg.init == "tl":
                if leaf.startswith("b_"):
                    param.zero_()
                else:
                    param.normal_(0.0, 0.8 / math.sqrt(cfg.d_model), generator=g)
            elif leaf in ("W_E", "W_pos"):
                param.normal_(0.0, 1.0, generator=g)
            else:
                fan_in = _FAN_IN[leaf](cfg)
                bound = 1.0 / math.sqrt(fan_in)
                param.uniform_(-bound, bound, generator=g)
        if cfg.fourier_init:
            self.apply_fourier_init(cfg.fourier_init)

    @torch.no_grad()
    def _init_like_notebooks(self, seed: int) -> None:
        """The author's notebooks' initial weights for `seed`: torch.manual_seed(seed), then the
        notebook modules built in their order with PyTorch's default initialisation, mapped onto the
        HookedTransformer layout (an nn.Linear weight is [out, in]; heads are contiguous blocks of
        d_head outputs of W_Q/W_K/W_V and of d_head inputs of W_O). Norms draw nothing. The global
        generator is forked, so the caller's random state is left as it was."""
        cfg = self.cfg
        H, D, Dh = cfg.n_heads, cfg.d_model, cfg.d_head
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            tok, pos = nn.Embedding(cfg.d_vocab, D), nn.Embedding(cfg.n_ctx, D)
            self.embed.W_E.copy_(tok.weight)
            self.pos_embed.W_pos.copy_(pos.weight)
            for block in self.blocks:
                attn, mlp = block.attn, block.mlp
                for W in (attn.W_Q, attn.W_K, attn.W_V):  # [H * Dh, D] -> [H, D, Dh]
                    W.copy_(nn.Linear(D, H * Dh, bias=False).weight.T.reshape(D, H, Dh).permute(1, 0, 2))
                attn.W_O.copy_(nn.Linear(H * Dh, D, bias=False).weight.T.reshape(H, Dh, D))
                mlp_in, mlp_out = nn.Linear(D, cfg.d_mlp), nn.Linear(cfg.d_mlp, D)
                mlp.W_in.copy_(mlp_in.weight.T)
                mlp.b_in.copy_(mlp_in.bias)
                mlp.W_out.copy_(mlp_out.weight.T)
                mlp.b_out.copy_(mlp_out.bias)
            self.unembed.W_U.copy_(nn.Linear(D, cfg.d_vocab_out, bias=False).weight.T)
        for name, param in self.named_parameters():
            leaf = name.rsplit(".", 1)[-1]
            if leaf in ("w", "b"):
                param.fill_(1.0 if leaf == "w" else 0.0)

    @torch.no_grad()
    def apply_fourier_init(self, freqs: list[int]) -> None:
        """Overwrite embedding dims 2i, 2i+1 of tokens x < p with cos, sin(2 pi k_i x / p)."""
        p = self.cfg.p
        x = torch.arange(p, dtype=torch.float64)
        for i, k in enumerate(freqs):
            self.embed.W_E[:p, 2 * i] = torch.cos(2 * math.pi * k * x / p).to(self.embed.W_E.dtype)
            self.embed.W_E[:p, 2 * i + 1] = torch.sin(2 * math.pi * k * x / p).to(self.embed.W_E.dtype)

    # ---- forward ----
    def residual_after_embed(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch pos d_model"]:
        embed = self.hook_embed(self.embed(tokens))
        pos = self.hook_pos_embed(self.pos_embed(tokens))
        return self.embed_norm(embed + pos)

    def forward(self, tokens: Int[Tensor, "batch pos"]) -> Float[Tensor, "batch d_vocab_out"]:
        resid = self.residual_after_embed(tokens)
        for block in self.blocks:
            resid = block(resid)
        return self.unembed(resid[:, -1])

    def run_with_cache(self, *args, **kwargs) -> tuple[Tensor, ActivationCache]:  # type: ignore[override]
        """Like HookedRootModule.run_with_cache, but the cache is a TransformerLens ActivationCache."""
        out, cache_dict = super().run_with_cache(*args, **kwargs)
        return out, ActivationCache(cache_dict, self)

    # ---- attributes ActivationCache and analysis code read (HookedTransformer-compatible) ----
    @property
    def W_L(self) -> Float[Tensor, "d_mlp d_vocab_out"]:
        """Neuron-to-logit map of the last block, W_out @ readout matrix (normalised W_U, no tau, when bounded)."""
        W = self.unembed.readout_matrix()
        if self.unembed.bounded:
            W = W / self.cfg.tau
        return self.blocks[-1].mlp.W_out @ W

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> Tensor:
        """Sum of MLP output biases before `layer` (attention has no biases), shape [d_model]."""
        total = torch.zeros(self.cfg.d_model)
        for i in range(layer):
            if include_mlp_biases:
                total = total + self.blocks[i].mlp.b_out
        return total

    def tokens_to_residual_directions(self, tokens: Tensor | int) -> Tensor:
        """Readout direction(s) in the residual stream for the given output token(s): [*, d_model]."""
        W = self.unembed.readout_matrix()
        return W[:, tokens].T if isinstance(tokens, Tensor) else W[:, tokens]


_FAN_IN = {
    "W_Q": lambda c: c.d_model,
    "W_K": lambda c: c.d_model,
    "W_V": lambda c: c.d_model,
    "W_O": lambda c: c.n_heads * c.d_head,
    "W_in": lambda c: c.d_model,
    "b_in": lambda c: c.d_model,
    "W_out": lambda c: c.d_mlp,
    "b_out": lambda c: c.d_mlp,
    "W_U": lambda c: c.d_model,
}
