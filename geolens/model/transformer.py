"""GeoTransformer: the paper's post-norm transformer as a TransformerLens HookedRootModule.

Parameter names and shapes follow HookedTransformer (embed.W_E [d_vocab, d_model],
pos_embed.W_pos [n_ctx, d_model], blocks.L.attn.W_Q/W_K/W_V [n_heads, d_model, d_head],
W_O [n_heads, d_head, d_model], blocks.L.mlp.W_in/b_in/W_out/b_out, unembed.W_U
[d_model, d_vocab_out]), and so do the model-level views (W_Q [n_layers, n_heads, d_model,
d_head], ..., OV, QK), forward(tokens, return_type=...) and to_tokens / to_str_tokens. Where the
norm sits is cfg.norm_placement. 'post' (the paper's, the default): the norm's output replaces the
residual stream:

    h = embed_norm(W_E[x] + W_pos)                    -> blocks.0.hook_resid_pre
    h = blocks.L.attn_norm(h + attn(h))               -> blocks.L.hook_resid_mid
    h = blocks.L.mlp_norm(h + mlp(h))                 -> blocks.L.hook_resid_post
    logits = unembed(h)                               -> [batch, pos, d_vocab_out]

'pre' (HookedTransformer's): the norms read the inputs of the sublayers and of the readout, the
residual stream is their sum (with `sphere`, the sublayer inputs are projected on the unit sphere and
the stream is free):

    h = W_E[x] + W_pos                                -> blocks.0.hook_resid_pre
    h = h + attn(blocks.L.ln1(h))                     -> blocks.L.hook_resid_mid
    h = h + mlp(blocks.L.ln2(h))                      -> blocks.L.hook_resid_post
    logits = unembed(ln_final(h))

cfg.norm may name one norm per layer (a hybrid, e.g. 'sphere,layernorm'): layer L's norms are
cfg.layer_norms[L]; embed_norm is layer 0's, ln_final the last layer's. Task add3 reads [a, b, c, =].

The readout is applied at every position; the prediction is the last position's (`=`),
logits[:, -1]. Extra hook points: every norm has hook_scale (the norm of its input before
projection) and hook_normalized (its output); the unembedding has hook_in, hook_scores (bounded
only: cosines against the normalised W_U columns) and hook_logits. run_with_cache returns a
geolens.model.cache.GeoActivationCache, whose residual decompositions are exact for this topology.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor
from transformer_lens.FactoredMatrix import FactoredMatrix
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from geolens.errors import GeoAttributeError, GeoError
from geolens.model import tasks, weight_processing
from geolens.model.cache import GeoActivationCache
from geolens.model.config import GeoConfig
from geolens.model.readout import bounded_readout, unit_columns

RETURN_TYPES = ("logits", "loss", "both", None)


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
    """Multi-head attention. Uniform mode zeroes the scores before the softmax.

    The model has no attention biases: b_Q, b_K, b_V [n_heads, d_head] and b_O [d_model] are zero buffers
    (HookedTransformer's names and shapes; not parameters and not in the state dict, so training, the
    optimizer state and checkpoints do not see them) that fold_layer_norm fills. With
    cfg.use_attn_result (GeoTransformer.set_use_attn_result) each head's write z_h W_O^h is hooked at
    hook_result [batch, pos, head, d_model] and summed.
    """

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.cfg = cfg
        H, D, Dh = cfg.n_heads, cfg.d_model, cfg.d_head
        self.W_Q = nn.Parameter(torch.empty(H, D, Dh))
        self.W_K = nn.Parameter(torch.empty(H, D, Dh))
        self.W_V = nn.Parameter(torch.empty(H, D, Dh))
        self.W_O = nn.Parameter(torch.empty(H, Dh, D))
        for name in ("b_Q", "b_K", "b_V"):
            self.register_buffer(name, torch.zeros(H, Dh), persistent=False)
        self.register_buffer("b_O", torch.zeros(D), persistent=False)
        for name in ("q", "k", "v", "attn_scores", "pattern", "z", "result"):
            setattr(self, f"hook_{name}", HookPoint())

    def forward(self, x: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        q = self.hook_q(torch.einsum("bpd,hde->bphe", x, self.W_Q) + self.b_Q)
        k = self.hook_k(torch.einsum("bpd,hde->bphe", x, self.W_K) + self.b_K)
        v = self.hook_v(torch.einsum("bpd,hde->bphe", x, self.W_V) + self.b_V)
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
        if self.cfg.use_attn_result:
            return self.hook_result(torch.einsum("bqhe,hed->bqhd", z, self.W_O)).sum(-2) + self.b_O
        return torch.einsum("bqhe,hed->bqd", z, self.W_O) + self.b_O


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
    """Layer `layer`: post-norm (attn_norm, mlp_norm replace the stream) or pre-norm (ln1, ln2 read the
    sublayer inputs; TransformerLens's names), as cfg.norm_placement says (module docstring); its norms
    are cfg.layer_norms[layer]."""

    def __init__(self, cfg: GeoConfig, layer: int = 0):
        super().__init__()
        self.pre = cfg.norm_placement == "pre"
        Norm = NORM_CLASSES[cfg.layer_norms[layer]]
        if self.pre:
            self.ln1 = Norm(cfg)
        self.attn = Attention(cfg)
        if self.pre:
            self.ln2 = Norm(cfg)
        else:
            self.attn_norm = Norm(cfg)
        self.mlp = MLP(cfg)
        if not self.pre:
            self.mlp_norm = Norm(cfg)
        for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post"):
            setattr(self, f"hook_{name}", HookPoint())

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            _refuse_other_placement(name, self.__dict__.get("pre"), "blocks.L")
            raise

    def forward(self, resid: Float[Tensor, "batch pos d_model"]) -> Float[Tensor, "batch pos d_model"]:
        resid = self.hook_resid_pre(resid)
        if self.pre:
            resid = self.hook_resid_mid(resid + self.hook_attn_out(self.attn(self.ln1(resid))))
            return self.hook_resid_post(resid + self.hook_mlp_out(self.mlp(self.ln2(resid))))
        attn_out = self.hook_attn_out(self.attn(resid))
        resid = self.hook_resid_mid(self.attn_norm(resid + attn_out))
        mlp_out = self.hook_mlp_out(self.mlp(resid))
        return self.hook_resid_post(self.mlp_norm(resid + mlp_out))


# ---- readouts --------------------------------------------------------------------------------
class Unembed(nn.Module):
    """Raw readout logits = h @ W_U + b_U; bounded readout logits = tau * h . (W_U column / ||column||) + b_U.

    h: [..., d_model] (the model passes every position) -> logits [..., d_vocab_out]. The bounded
    readout does not normalise h (on the sphere h is already unit norm, so the logits are tau
    times a cosine). W_U is the trained parameter (bounded: its columns are normalised on the fly);
    readout_matrix() is the matrix h is multiplied by. b_U [d_vocab_out] is a zero buffer (the paper's
    readout has no bias; not a parameter, not in the state dict) that fold_layer_norm / center_unembed set.
    """

    def __init__(self, cfg: GeoConfig):
        super().__init__()
        self.bounded = cfg.unembed == "bounded"
        self.tau = cfg.tau
        self.W_U = nn.Parameter(torch.empty(cfg.d_model, cfg.d_vocab_out))
        self.register_buffer("b_U", torch.zeros(cfg.d_vocab_out), persistent=False)
        self.hook_in = HookPoint()
        if self.bounded:
            self.hook_scores = HookPoint()
        self.hook_logits = HookPoint()

    def readout_matrix(self) -> Float[Tensor, "d_model d_vocab_out"]:
        """The matrix the readout multiplies h by (geolens.model.readout.bounded_readout for bounded: tau
        times unit-norm W_U columns)."""
        if self.bounded:
            return bounded_readout(self.W_U, self.tau)
        return self.W_U

    def forward(self, h: Float[Tensor, "... d_model"]) -> Float[Tensor, "... d_vocab_out"]:
        h = self.hook_in(h)
        if self.bounded:  # cosines against the unit-norm columns, then tau (the order training used)
            W = unit_columns(self.W_U)
            return self.hook_logits(self.tau * self.hook_scores(_rows_then_last(h, W)) + self.b_U)
        return self.hook_logits(_rows_then_last(h, self.W_U) + self.b_U)


def _refuse_other_placement(name: str, pre: bool | None, where: str) -> None:
    """Raise GeoAttributeError when `name` is a norm of the other placement (TransformerLens's ln1 / ln2 /
    ln_final asked of a post-norm model, or embed_norm / attn_norm / mlp_norm of a pre-norm one)."""
    if pre is None:
        return
    pre_names = {"ln1": "blocks.L.attn_norm", "ln2": "blocks.L.mlp_norm", "ln_final": "blocks[-1].mlp_norm"}
    post_names = {"embed_norm": "blocks.0.ln1", "attn_norm": "blocks.L.ln2", "mlp_norm": "blocks.(L+1).ln1 / ln_final"}
    if not pre and name in pre_names:
        raise GeoAttributeError(
            f"{where}.{name} is a pre-norm module and this GeoTransformer is post-norm (cfg.norm_placement = 'post'): "
            f"each norm's output replaces the stream (embed_norm, blocks.L.attn_norm, blocks.L.mlp_norm) and the "
            f"readout reads blocks[-1].hook_resid_post directly; the nearest module is {pre_names[name]}")
    if pre and name in post_names:
        raise GeoAttributeError(
            f"{where}.{name} is a post-norm module and this GeoTransformer is pre-norm (cfg.norm_placement = 'pre'); "
            f"the norm that reads the same sublayer input is {post_names[name]}")


def _rows_then_last(h: Float[Tensor, "... pos d_model"], W: Float[Tensor, "d_model C"]) -> Float[Tensor, "... pos C"]:
    """h @ W, with the last position (`=`) multiplied on its own. Same values; it keeps the float
    operations of training on logits[:, -1] (the `=` row's matmul and W's gradient, which the
    other rows' zero gradients add exact zeros to) those of the earlier last-position-only
    readout, so hooked-engine runs and their resumes stay bit-identical."""
    if h.dim() < 2:
        return h @ W
    return torch.cat([h[..., :-1, :] @ W, (h[..., -1, :] @ W).unsqueeze(-2)], dim=-2)


# ---- the model -------------------------------------------------------------------------------
class GeoTransformer(HookedRootModule):
    """The paper's transformer with switchable topology, HookedTransformer-style.

    forward(tokens [batch, n_ctx]) -> logits [batch, n_ctx, d_vocab_out]; the prediction for
    [a, b, =] is logits[:, -1]. See forward for return_type and the loss.
    """

    def __init__(self, cfg: GeoConfig, seed: int | None = None):
        super().__init__()
        self.cfg = cfg
        self.embed = Embed(cfg)
        self.hook_embed = HookPoint()
        self.pos_embed = PosEmbed(cfg)
        self.hook_pos_embed = HookPoint()
        self.pre_norm = cfg.norm_placement == "pre"
        if not self.pre_norm:
            self.embed_norm = NORM_CLASSES[cfg.layer_norms[0]](cfg)
        self.blocks = nn.ModuleList([Block(cfg, layer) for layer in range(cfg.n_layers)])
        if self.pre_norm:
            self.ln_final = NORM_CLASSES[cfg.layer_norms[-1]](cfg)
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
        """The stream blocks.0 reads: embed_norm(W_E[x] + W_pos) post-norm, W_E[x] + W_pos pre-norm."""
        embed = self.hook_embed(self.embed(tokens))
        pos = self.hook_pos_embed(self.pos_embed(tokens))
        return embed + pos if self.pre_norm else self.embed_norm(embed + pos)

    def forward(self, input, return_type: str | None = "logits", loss_per_token: bool = False,
                labels: Int[Tensor, "batch"] | None = None):
        """Run the model, as HookedTransformer.forward.

        input: tokens [batch, n_ctx], or examples to_tokens reads ('17 + 42 =', (17, 42), or a
        list of them). return_type: 'logits' -> [batch, n_ctx, d_vocab_out] (the readout at every
        position; the prediction is logits[:, -1]); 'loss' -> the loss; 'both' -> (logits, loss);
        None -> None (the readout is skipped).

        The loss is not next-token prediction (the model never predicts its own inputs): it is
        the mean cross-entropy of the prediction at the last position, logits[:, -1], against
        `labels` [batch], by default the task's true answers a o b read off the tokens
        (geolens.model.tasks.answers: compose_table of cfg). loss_per_token=True gives the per-example
        losses [batch] instead of their mean.
        """
        if return_type not in RETURN_TYPES:
            raise GeoError(f"return_type = {return_type!r} is not valid; use one of {', '.join(map(repr, RETURN_TYPES))}")
        tokens = input if isinstance(input, Tensor) else self.to_tokens(input)
        resid = self.residual_after_embed(tokens)
        for block in self.blocks:
            resid = block(resid)
        if return_type is None:
            return None
        logits = self.unembed(self.ln_final(resid) if self.pre_norm else resid)
        if return_type == "logits":
            return logits
        loss = self.loss_fn(logits, tokens, labels, per_token=loss_per_token)
        return loss if return_type == "loss" else (logits, loss)

    def loss_fn(self, logits: Float[Tensor, "batch pos d_vocab_out"], tokens: Int[Tensor, "batch pos"],
                labels: Int[Tensor, "batch"] | None = None, per_token: bool = False) -> Tensor:
        """Cross-entropy of logits[:, -1] against labels (default: the task's answers to tokens);
        the mean, or per example [batch] with per_token."""
        if labels is None:
            labels = tasks.answers(self.cfg, tokens, self._answer_table)
        return F.cross_entropy(logits[:, -1], labels.to(logits.device), reduction="none" if per_token else "mean")

    @functools.cached_property
    def _answer_table(self) -> Int[Tensor, "n_classes n_classes"]:
        return tasks.compose_table(self.cfg)

    def run_with_cache(self, *model_args, return_cache_object: bool = True, remove_batch_dim: bool = False,
                       **kwargs) -> tuple[Tensor, GeoActivationCache | dict[str, Tensor]]:  # type: ignore[override]
        """Like HookedTransformer.run_with_cache: (output, cache). The cache is a
        geolens.model.cache.GeoActivationCache (TransformerLens's ActivationCache with residual
        decompositions that are exact for this post-norm model), or the plain dict with
        return_cache_object=False."""
        out, cache_dict = super().run_with_cache(*model_args, remove_batch_dim=remove_batch_dim, **kwargs)
        if not return_cache_object:
            return out, cache_dict
        return out, GeoActivationCache(cache_dict, self, has_batch_dim=not remove_batch_dim)

    def __getattr__(self, name: str):
        try:
            return super().__getattr__(name)
        except AttributeError:
            _refuse_other_placement(name, self.__dict__.get("pre_norm"), "model")
            raise

    def to(self, *args, print_details: bool = False, **kwargs) -> "GeoTransformer":  # type: ignore[override]
        """nn.Module.to, accepting HookedTransformer's print_details keyword (code written for TL passes it)."""
        return super().to(*args, **kwargs)

    # ---- HookedTransformer's weight processing and flags (geolens.model.weight_processing) ----
    def fold_layer_norm(self, center_weights: bool = True) -> "GeoTransformer":
        """Fold each pre-norm's gain and offset into the weights and biases that read it, in place; the
        logits are unchanged and cfg.normalization_type becomes 'LNPre' / 'RMSPre' (as TransformerLens's).
        Refused post-norm and into the bounded readout (geolens.model.weight_processing says why)."""
        weight_processing.fold_layer_norm(self, center_weights)
        return self

    def center_writing_weights(self) -> "GeoTransformer":
        """Remove the d_model mean of W_E, W_pos, W_O, b_O, W_out, b_out, in place (every norm a LayerNorm,
        either placement; logits unchanged)."""
        weight_processing.center_writing_weights(self)
        return self

    def center_unembed(self) -> "GeoTransformer":
        """Remove the vocabulary mean of W_U and b_U, in place (raw readout; the softmax is unchanged)."""
        weight_processing.center_unembed(self)
        return self

    def process_weights_(self, fold_ln: bool = True, center_writing_weights: bool = True,
                         center_unembed: bool = True) -> "GeoTransformer":
        """HookedTransformer.process_weights_: the chosen steps above, each refused where it does not apply."""
        if fold_ln:
            self.fold_layer_norm()
        if center_writing_weights:
            self.center_writing_weights()
        if center_unembed:
            self.center_unembed()
        return self

    def set_use_attn_result(self, use_attn_result: bool) -> None:
        """Hook each head's write z_h W_O^h at blocks.L.attn.hook_result [batch, pos, head, d_model] (as
        HookedTransformer's; post-norm it is the head's part of its attn_norm's input). Sets this model's own
        cfg.use_attn_result."""
        weight_processing.own_cfg(self)
        self.cfg.use_attn_result = bool(use_attn_result)

    def to_transformer_bridge(self):
        """This model as a TransformerLens 4 TransformerBridge (TransformerBridge.boot_native) with the same
        weights and logits, for the topologies TransformerLens has; refused in one line for the others
        (geolens.model.bridge)."""
        from geolens.model.bridge import to_transformer_bridge

        return to_transformer_bridge(self)

    # ---- text <-> tokens (the task's vocabulary: operands, then `=`) ----
    def to_tokens(self, input) -> Int[Tensor, "batch n_ctx"]:
        """Tokens [batch, n_ctx] = [a, b, =] of one example or a list: '17 + 42 =' (operator and '='
        optional), a pair of operand ids (17, 42); S_n operands in one-line notation '20134'; add3
        [a, b, c, =] from '1 + 2 + 3 =' or (1, 2, 3)."""
        return tasks.encode(self.cfg, input).to(self.embed.W_E.device)

    def to_str_tokens(self, input) -> list:
        """The tokens as text: ['17', '42', '='] for one example (a string, a pair or a [pos]
        tensor), a list of such lists for a batch (a list of examples or a [batch, pos] tensor)."""
        if isinstance(input, Tensor):
            return tasks.decode(self.cfg, input)
        tokens = tasks.decode(self.cfg, tasks.encode(self.cfg, input))
        return tokens if isinstance(input, (list, tuple)) and not tasks.is_pair(input, self.cfg.n_operands) else tokens[0]

    def to_single_token(self, string: str) -> int:
        """The token id of one token's text ('17', '=', an S_n permutation '20134')."""
        return tasks.token_id(self.cfg, string)

    # ---- HookedTransformer's weight views ----
    @property
    def W_E(self) -> Float[Tensor, "d_vocab d_model"]:
        return self.embed.W_E

    @property
    def W_pos(self) -> Float[Tensor, "n_ctx d_model"]:
        return self.pos_embed.W_pos

    @property
    def W_U(self) -> Float[Tensor, "d_model d_vocab_out"]:
        """The matrix the readout multiplies the final stream by, so that final @ W_U + b_U is the logits
        (HookedTransformer's logit lens; final = blocks[-1].hook_resid_post post-norm, ln_final of it
        pre-norm). Raw readout: the parameter unembed.W_U itself. Bounded readout: tau * unit-norm columns
        of unembed.W_U (geolens.model.readout.bounded_readout), computed from the parameter with its
        gradient; the parameter unembed.W_U keeps its name because every checkpoint, optimizer state and
        fork mapping is keyed by it."""
        return self.unembed.readout_matrix()

    @property
    def b_U(self) -> Float[Tensor, "d_vocab_out"]:
        """The readout's bias: zeros unless fold_layer_norm / center_unembed set it."""
        return self.unembed.b_U

    @property
    def b_Q(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        """Query biases (zeros: the model has none; fold_layer_norm fills them)."""
        return self._stacked("attn", "b_Q")

    @property
    def b_K(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._stacked("attn", "b_K")

    @property
    def b_V(self) -> Float[Tensor, "n_layers n_heads d_head"]:
        return self._stacked("attn", "b_V")

    @property
    def b_O(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stacked("attn", "b_O")

    def _stacked(self, sub: str, name: str) -> Tensor:
        return torch.stack([getattr(getattr(block, sub), name) for block in self.blocks], dim=0)

    @property
    def W_Q(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stacked("attn", "W_Q")

    @property
    def W_K(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stacked("attn", "W_K")

    @property
    def W_V(self) -> Float[Tensor, "n_layers n_heads d_model d_head"]:
        return self._stacked("attn", "W_V")

    @property
    def W_O(self) -> Float[Tensor, "n_layers n_heads d_head d_model"]:
        return self._stacked("attn", "W_O")

    @property
    def W_in(self) -> Float[Tensor, "n_layers d_model d_mlp"]:
        return self._stacked("mlp", "W_in")

    @property
    def b_in(self) -> Float[Tensor, "n_layers d_mlp"]:
        return self._stacked("mlp", "b_in")

    @property
    def W_out(self) -> Float[Tensor, "n_layers d_mlp d_model"]:
        return self._stacked("mlp", "W_out")

    @property
    def b_out(self) -> Float[Tensor, "n_layers d_model"]:
        return self._stacked("mlp", "b_out")

    @property
    def QK(self) -> FactoredMatrix:
        """W_Q @ W_K^T per layer and head, [n_layers, n_heads, d_model, d_model] (attention scores
        are resid_q QK resid_k^T / sqrt(d_head); under uniform attention they are not used)."""
        return FactoredMatrix(self.W_Q, self.W_K.transpose(-2, -1))

    @property
    def OV(self) -> FactoredMatrix:
        """W_V @ W_O per layer and head, [n_layers, n_heads, d_model, d_model]: what a head writes
        (into its attn_norm's input) per unit of attention to a residual vector."""
        return FactoredMatrix(self.W_V, self.W_O)

    @property
    def W_L(self) -> Float[Tensor, "d_mlp d_vocab_out"]:
        """Neuron-to-logit map of the last block: W_out @ W_U (raw readout) or W_out @ (W_U with
        unit-norm columns) (bounded readout: the logits are tau times that, so W_L is in the
        normalised space of the DLA). The last mlp_norm (pre-norm: ln_final) is not applied (it scales
        per input).
        A plain tensor without gradient (safe to .numpy() for plotting)."""
        with torch.no_grad():
            W = self.unembed.readout_matrix()
            if self.unembed.bounded:  # bounded_readout / tau (not unit_columns: the cached metrics' rounding)
                W = W / self.cfg.tau
            return self.blocks[-1].mlp.W_out @ W

    def accumulated_bias(self, layer: int, mlp_input: bool = False, include_mlp_biases: bool = True) -> Tensor:
        """Pre-norm: the sum of the biases written into the stream before the input of `layer` (every earlier
        attention's b_O, zero unless folded, and with include_mlp_biases every earlier MLP's b_out; with
        mlp_input also layer `layer`'s b_O), [d_model], as HookedTransformer's. Refused post-norm: there the biases reach a stream through norms that
        scale per input, so there is no input-independent accumulated bias."""
        if not self.pre_norm:
            raise GeoError("accumulated_bias has no input-independent value in a post-norm GeoTransformer; use the "
                           "'bias' part of cache.get_full_resid_decomposition() or geolens.model.decompose.residual_parts")
        bias = self.embed.W_E.new_zeros(self.cfg.d_model)
        for block in self.blocks[:layer]:
            bias = bias + block.attn.b_O
            if include_mlp_biases:
                bias = bias + block.mlp.b_out
        if mlp_input:
            bias = bias + self.blocks[layer].attn.b_O
        return bias

    def tokens_to_residual_directions(self, tokens) -> Tensor:
        """Readout direction(s) of output token(s), [*tokens.shape, d_model] (int or str: [d_model]): W_U
        columns, or tau * unit-norm W_U columns for the bounded readout. Post-norm: h . direction is
        exactly that token's logit for the final stream h. Pre-norm: the direction is taken in the space
        of ln_final's normalised input (its gain w folded in, as HookedTransformer folds it into W_U), so
        cache.apply_ln_to_stack(parts) . direction adds up to the logit minus ln_final's offset b . W_U."""
        if isinstance(tokens, str):
            tokens = self.to_single_token(tokens)
        directions = self.unembed.readout_matrix().T[tokens]
        w = getattr(self.ln_final, "w", None) if self.pre_norm else None
        return directions if w is None else directions * w


def param_group(name: str) -> str:
    """The group of a GeoTransformer parameter: embed (W_E, W_pos), attn (W_Q, W_K, W_V, W_O), mlp
    (W_in, b_in, W_out, b_out), unembed (W_U), norm (every norm's gain and offset)."""
    if name.startswith(("embed.", "pos_embed.")):
        return "embed"
    if ".attn." in name:
        return "attn"
    if ".mlp." in name:
        return "mlp"
    if name.startswith("unembed."):
        return "unembed"
    return "norm"


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
