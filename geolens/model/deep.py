"""The deep engine: the exact training forward of any GeoTransformer, M members stacked.

geolens.model.fast computes one-layer post-norm [a, b, =] models from per-token tables; its premise (a
layer's input depends only on token and position) holds for layer 0 alone. This engine serves every
depth, placement (post / pre), per-layer norm (hybrids) and task length: a hook-free functional
statement of geolens.model.transformer with autograd, doing only the work the training loss needs:

- only the last position (`=`) reaches the logits, so the last layer computes keys and values at every
  position but its query, attention output, MLP, final norm and readout at `=` alone; earlier layers
  compute every position (their outputs feed the last layer's keys and values);
- layer 0's input depends only on (token, position): its stream rows (post-norm: embed_norm(W_E[t] +
  W_pos[j]); pre-norm: W_E[t] + W_pos[j]) are a table of n_ctx * d_vocab rows, and so is its attention:
  the scores of every (query row, key row) pair [n V, n V, H] and the value-output rows A0 W_V[h] W_O[h]
  [n V, H, D], read per example by a gather and an embedding bag (_table_attention): layer 0 does no
  per-example Q, K, V or O matmul. The lookups' indices depend on the tokens alone and are built once per
  token tensors with their sorted order (geolens.model.lookups), so their backward is an embedding bag over
  the gradient rows, not torch's per-step sort and single-threaded scatter-add.

Per layer (post-norm; pre-norm as in transformer.py, with ln1 / ln2 before the sublayers and ln_final
before the readout), M members, B examples, n = n_ctx positions, nq query positions (n, or 1 in the last
layer):

    q, k, v  = a_in @ W_Q, W_K, W_V              [M, B, nq | n, H, dh]   (layer 0: table rows)
    scores   = q . k / sqrt(dh) (causal mask)     [M, B, nq, n, H]        (uniform: constants, W_Q/W_K unused)
    z        = sum_k softmax(scores)_k v_k        [M, B, nq, H, dh]
    h        = N2(h[:, :, query] + z @ W_O)       [M, B, nq, D]
    h        = N3(h + relu(h @ W_in + b_in) @ W_out + b_out)
    logits   = h[:, :, -1] @ Wr                   [M, B, C]   (Wr = W_U, or tau W_U / ||column|| bounded)

The attention over n <= 4 keys is written as broadcast products and sums (a [.., 3, 32] x [.., 32, 3]
batched matmul per head is slower on the CPU). Every matmul is a bmm over the member axis (M = 1 for
one model). Same float32 math as the hooked model in another order: logits agree to ~1e-6 relative, and
the hooked GeoTransformer stays the source of truth (tests/test_engines.py compares logits, every
gradient and trajectories over every registered engine).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import ATTENTIONS, NORMS, PLACEMENTS, TASKS, UNEMBEDS, GeoConfig, config_fields
from geolens.model.fast import _mm
from geolens.model.lookups import BagLookup, RowLookup, bag_rows, cached_plan, gather_rows
from geolens.model.readout import bounded_readout
from geolens.model.roles import IGNORED, VALUE

__all__ = ["deep_unsupported_reason", "deep_logits", "stacked_deep_logits", "deep_eq_values", "deep_flops", "full_flops"]

# every GeoConfig field declares how this engine reads it (geolens.model.roles): the values this engine
# computes of the fields it reads as a choice (tests/test_engines.py checks they are those fields), the
# fields read as values, and those that are no part of the forward
DEEP_CHOICES = (("norm", NORMS), ("norm_placement", PLACEMENTS), ("unembed", UNEMBEDS), ("attention", ATTENTIONS),
                ("task", TASKS))
DEEP_VALUE_FIELDS = frozenset(config_fields(deep=VALUE))
DEEP_IGNORED_FIELDS = frozenset(config_fields(deep=IGNORED))


MLP_WEIGHTS = ("W_in", "b_in", "W_out", "b_out")


def deep_unsupported_reason(cfg: GeoConfig) -> str | None:
    """None when this engine computes the model exactly (every declared choice), else a one-line reason."""
    if str(cfg.normalization_type).endswith("Pre"):
        return (f"its weights were processed (fold_layer_norm: normalization_type '{cfg.normalization_type}'); the "
                "folded biases b_Q, b_K, b_V, b_O, b_U are buffers that only the hooked forward reads")
    for field, supported in DEEP_CHOICES:
        values = cfg.layer_norms if field == "norm" else (getattr(cfg, field),)
        for value in values:
            if value not in supported:
                return f"{field} = '{value}'; the deep engine supports {field} {', '.join(sorted(supported))}"
    return None


def deep_flops(cfg: GeoConfig, n_examples: int, backward: bool = True) -> int:
    """FLOPs (2 x multiply-adds) of the matmul-like work of one member's deep forward (x3 with the backward)
    on n_examples: every position of the layers before the last but layer 0's attention (tables and an
    embedding bag of n * nq * H rows per example), the last layer's keys and values at every position and
    its query, output, MLP and readout at `=`."""
    D, HD, Dm, n, C, L = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp, cfg.n_ctx, cfg.d_vocab_out, cfg.n_layers
    full = n * (4 * D * HD + 2 * D * Dm + 2 * n * HD)
    nq0 = 1 if L == 1 else n
    layer0 = nq0 * n * cfg.n_heads * D + (nq0 * 2 * D * Dm if L > 1 else 0)
    middle = max(L - 2, 0) * full
    last = (n * 2 * D * HD + D * HD + 2 * n * HD + HD * D if L > 1 else 0) + 2 * D * Dm + D * C
    return 2 * n_examples * (layer0 + middle + last) * (3 if backward else 1)


def full_flops(cfg: GeoConfig, n_examples: int, backward: bool = True) -> int:
    """FLOPs of the straightforward forward (x3 with the backward): every position in every layer, logits at
    every position (the hooked model's work)."""
    D, HD, Dm, n, C = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp, cfg.n_ctx, cfg.d_vocab_out
    per_example = cfg.n_layers * n * (4 * D * HD + 2 * D * Dm + 2 * n * HD) + n * D * C
    return 2 * n_examples * per_example * (3 if backward else 1)


def _eps(cfg: GeoConfig, kind: str) -> float:
    return {"layernorm": cfg.ln_eps, "rmsnorm": cfg.rms_eps, "sphere": cfg.sphere_eps}.get(kind, 0.0)


def _norm(kind: str, x: Float[Tensor, "M ... D"], w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    """The norm `kind` of x with per-member gain w and offset b ([M, D] or None), as transformer.py's."""
    if kind == "none":
        return x
    if kind == "sphere":
        return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)
    shape = (x.shape[0],) + (1,) * (x.dim() - 2) + (x.shape[-1],)
    if kind == "layernorm":
        if x.shape[0] == 1:  # one member: the fused kernel with its gain and offset
            return F.layer_norm(x, x.shape[-1:], w[0], b[0], eps)
        return torch.addcmul(b.view(shape), F.layer_norm(x, x.shape[-1:], eps=eps), w.view(shape))
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.view(shape)


class _Names:
    """Parameter names of layer `layer`'s norms for the placement: (before attention, before/after the
    MLP) and the readout's final norm (None post-norm)."""

    def __init__(self, cfg: GeoConfig):
        self.pre = cfg.norm_placement == "pre"
        self.first = "blocks.0.ln1" if self.pre else "embed_norm"
        self.final = "ln_final" if self.pre else None

    def attn(self, layer: int) -> str:
        return f"blocks.{layer}.ln1" if self.pre else f"blocks.{layer}.attn_norm"

    def mlp(self, layer: int) -> str:
        return f"blocks.{layer}.ln2" if self.pre else f"blocks.{layer}.mlp_norm"


class _MLP(torch.autograd.Function):
    """relu(x @ W_in + b_in) @ W_out + b_out for x [M, N, D] (stacked weights), keeping relu(pre) [M, N, Dm]
    (returned too, for the analysis) and writing the ReLU and its backward in place: two [N, Dm]
    buffers fewer than autograd's graph of the same ops. The matmuls are geolens.model.fast._mm's (oneDNN for
    one float32 CPU member)."""

    @staticmethod
    def forward(ctx, x, W_in, b_in, W_out, b_out):
        post = _mm(x, W_in, b_in[:, None]).relu_()
        ctx.save_for_backward(x, W_in, W_out, post)
        ctx.mark_non_differentiable(post)
        ctx.set_materialize_grads(False)  # no zero-filled [N, Dm] gradient for `post`
        return _mm(post, W_out, b_out[:, None]), post

    @staticmethod
    def backward(ctx, g_out, _):
        x, W_in, W_out, post = ctx.saved_tensors
        g_pre = _mm(g_out, W_out.transpose(1, 2))
        torch.ops.aten.threshold_backward.grad_input(g_pre, post, 0.0, grad_input=g_pre)  # 0 where pre <= 0
        return (_mm(g_pre, W_in.transpose(1, 2)), torch.bmm(x.transpose(1, 2), g_pre), g_pre.sum(1),
                torch.bmm(post.transpose(1, 2), g_out), g_out.sum(1))


def _attend(cfg: GeoConfig, q: Tensor | None, k: Tensor | None, v: Float[Tensor, "M B n H dh"], nq: int,
            keep: dict | None, layer: int) -> Float[Tensor, "M B nq H dh"]:
    """z of the nq last positions' queries over the n keys (q [M, B, nq, H, dh]; q, k None: uniform)."""
    n = v.shape[2]
    mask = _causal_mask(n, nq, v.device) if cfg.causal else None
    if q is None:
        pattern = torch.zeros(nq, n, dtype=v.dtype, device=v.device)
        if mask is not None:
            pattern = pattern.masked_fill(mask, float("-inf"))
        pattern = pattern.softmax(-1)[None, None, :, :, None]  # [1, 1, nq, n, 1]
    else:
        scores = (q.unsqueeze(3) * k.unsqueeze(2)).sum(-1) * (1.0 / math.sqrt(cfg.d_head))  # [M, B, nq, n, H]
        if keep is not None:
            keep[f"blocks.{layer}.attn.hook_attn_scores"] = scores[:, :, -1].transpose(2, 3)  # [M, B, H, n]
        if mask is not None:
            scores = scores.masked_fill(mask[:, :, None], float("-inf"))
        pattern = scores.softmax(3)
    if keep is not None:
        keep[f"blocks.{layer}.attn.hook_pattern"] = pattern[..., -1, :, :].expand(*v.shape[:2], n, cfg.n_heads)
    return (pattern.unsqueeze(-1) * v.unsqueeze(2)).sum(3)


def _causal_mask(n: int, nq: int, device) -> Tensor:
    """[nq, n] True where key j is hidden from the query at position i (j > i), queries the last nq positions."""
    return torch.arange(n, device=device)[None, :] > torch.arange(n - nq, n, device=device)[:, None]


class _Lookups:
    """The members' token-dependent indices (tokens [M, B, n]; member-local table rows j * V + t, member m's rows
    of a stacked table after those of the members before it): `stream` the stream rows of every position
    [M, B, n] (tables of M n V rows); learned attention: `scores` the (query row, key row) pairs of the nq0
    queries [M, B, nq0, n] (M nq0 V n V rows of H scores) and `bag` each query's n H value-output rows
    [M B nq0, n H] (M n V H rows)."""

    def __init__(self, cfg: GeoConfig, tokens: list[Tensor], nq: int):
        tok = torch.stack(tokens)  # [M, B, n]
        M, B, n = tok.shape
        V, H, dev = cfg.d_vocab, cfg.n_heads, tok.device
        nV = n * V
        members = torch.arange(M, device=dev)[:, None, None]
        rows = tok + torch.arange(n, device=dev) * V  # [M, B, n] member-local
        self.stream = RowLookup(rows + members * nV, M * nV)
        if cfg.attention != "uniform":
            q_local = rows[:, :, n - nq :] - (n - nq) * V  # [M, B, nq]
            pairs = q_local[..., None] * nV + rows[:, :, None, :] + (members * nq * V * nV)[..., None]
            self.scores = RowLookup(pairs, M * nq * V * nV)
            heads = torch.arange(H, device=dev)
            bag = ((rows + members * nV)[:, :, None, :, None] * H + heads).expand(M, B, nq, n, H)
            self.bag = BagLookup(bag.reshape(M * B * nq, n * H), M * nV * H)


def _table_attention(cfg: GeoConfig, P: dict[str, Tensor], A0: Float[Tensor, "M nV D"], lk: _Lookups, B: int,
                     nq: int, keep: dict | None) -> Float[Tensor, "M B nq D"]:
    """Layer 0's attention output at the last nq positions from per-row tables (A0 the attention input of every
    row j * V + t; lk the examples' rows):

        Sc[r, s, h] = (A0[r] W_Q[h]) . (A0[s] W_K[h]) / sqrt(dh)    [M, nq V, n V, H]   score of query row r, key row s
        VO[s, h]    = A0[s] W_V[h] W_O[h]                           [M, n V, H, D]
        out[b, i]   = sum_{j, h} softmax_j(Sc[row_i, row_j, h]) VO[row_j, h]   (an embedding bag over VO)

    Uniform attention: out[b, i] = sum_j w_ij sum_h VO[row_j, h] with the constant pattern w (W_Q, W_K unused)."""
    M, nV, D = A0.shape
    n, V, H, dh = nV // cfg.d_vocab, cfg.d_vocab, cfg.n_heads, cfg.d_head
    VO = torch.matmul(torch.einsum("mrd,mhde->mhre", A0, P["blocks.0.attn.W_V"]), P["blocks.0.attn.W_O"])  # [M, H, nV, D]
    mask = _causal_mask(n, nq, A0.device) if cfg.causal else None
    if cfg.attention == "uniform":
        w = torch.zeros(nq, n, dtype=A0.dtype, device=A0.device)
        w = (w if mask is None else w.masked_fill(mask, float("-inf"))).softmax(-1)  # [nq, n]
        if keep is not None:
            keep["blocks.0.attn.hook_pattern"] = w[-1][None, None, :, None].expand(M, B, n, H)
        rows_v = gather_rows(VO.sum(1).reshape(M * nV, D), lk.stream)  # [M, B, n, D]
        return torch.einsum("ij,mbjd->mbid", w, rows_v)
    q_rows = A0[:, (n - nq) * V :]  # the query positions' rows
    Qt = torch.einsum("mrd,mhde->mhre", q_rows, P["blocks.0.attn.W_Q"])
    Kt = torch.einsum("mrd,mhde->mhre", A0, P["blocks.0.attn.W_K"])
    Sc = (torch.matmul(Qt, Kt.transpose(-1, -2)) * (1.0 / math.sqrt(dh))).permute(0, 2, 3, 1)  # [M, nqV, nV, H]
    scores = gather_rows(Sc.reshape(M * nq * V * nV, H), lk.scores)  # [M, B, nq, n, H]
    if mask is not None:
        scores = scores.masked_fill(mask[:, :, None], float("-inf"))
    pattern = scores.softmax(3)
    if keep is not None:
        keep["blocks.0.attn.hook_pattern"] = pattern[:, :, -1]
    out = bag_rows(VO.transpose(1, 2).reshape(M * nV * H, D), pattern.reshape(-1, n * H), lk.bag)
    return out.view(M, B, nq, D)


def _forward(cfg: GeoConfig, P: dict[str, Tensor], tokens: list[Int[Tensor, "B n"]], tau: float,
             keep: dict | None = None) -> Float[Tensor, "M B C"]:
    """Logits at `=` of the stacked parameters P {name: [M, *shape]}, member m on tokens[m] (module docstring;
    the token-dependent indices built once per token tensors, lookups.cached_plan). keep: a dict that
    receives values at `=` by hook name (blocks.L.mlp.hook_post, hook_resid_post, attn.hook_pattern
    [M, B, n, H] over the keys, and for layers after the first attn.hook_attn_scores [M, B, H, n])."""
    M, (B, n) = len(tokens), tokens[0].shape
    V, D, H, dh, L = cfg.d_vocab, cfg.d_model, cfg.n_heads, cfg.d_head, cfg.n_layers
    nq0 = 1 if L == 1 else n
    lk = cached_plan(tokens, ("deep", V, H, cfg.attention, nq0), lambda: _Lookups(cfg, tokens, nq0))
    kinds, names = cfg.layer_norms, _Names(cfg)
    uniform = cfg.attention == "uniform"
    HD = H * dh

    def norm(name: str | None, kind: str, x: Tensor) -> Tensor:
        return _norm(kind, x, P.get(f"{name}.w"), P.get(f"{name}.b"), _eps(cfg, kind))

    def projections(layer: int, skip_q: bool) -> Tensor:
        """[M, D, k * H * dh]: W_V, or (W_K, W_V), or (W_Q, W_K, W_V) flattened over heads."""
        parts = ("W_V",) if uniform else (("W_K", "W_V") if skip_q else ("W_Q", "W_K", "W_V"))
        return torch.cat([P[f"blocks.{layer}.attn.{w}"].permute(0, 2, 1, 3).reshape(M, D, HD) for w in parts], -1)

    def split(qkv: Tensor) -> tuple[Tensor | None, Tensor | None, Tensor]:
        """(q, k, v) of qkv [M, B, n, k * H * dh] (q None: uniform, or the last layer's, computed at `=` alone)."""
        parts = qkv.view(M, B, n, -1, H, dh).unbind(3)  # (unbind: its backward stacks, no zero-filled buffers)
        if uniform:
            return None, None, parts[0]
        return (None, *parts) if len(parts) == 2 else parts

    # layer 0 from per-(token, position) tables: row j * V + t (member m's rows start at m * n * V)
    X0 = (P["embed.W_E"][:, None] + P["pos_embed.W_pos"][:, :n, None]).reshape(M, n * V, D)
    A0 = norm(names.first, kinds[0], X0)  # layer 0's attention input
    S0 = X0 if names.pre else A0  # the stream rows
    h = gather_rows(S0.reshape(M * n * V, D), lk.stream)  # [M, B, n, D]
    attn0 = _table_attention(cfg, P, A0, lk, B, nq0, keep)  # [M, B, nq0, D]
    for layer in range(L):
        last = layer == L - 1
        nq = 1 if last else n
        if layer == 0:
            attn_out = attn0
        else:
            a_in = norm(names.attn(layer), kinds[layer], h) if names.pre else h
            W = projections(layer, skip_q=last)
            qkv = torch.bmm(a_in.reshape(M, B * n, D), W).view(M, B, n, -1)
            q, k, v = split(qkv)
            if last and not uniform:
                Wq = P[f"blocks.{layer}.attn.W_Q"].permute(0, 2, 1, 3).reshape(M, D, HD)
                q = torch.bmm(a_in[:, :, -1], Wq).view(M, B, 1, H, dh)
            z = _attend(cfg, q, k, v, nq, keep, layer)  # [M, B, nq, H, dh]
            W_O = P[f"blocks.{layer}.attn.W_O"].reshape(M, HD, D)
            attn_out = torch.bmm(z.reshape(M, B * nq, HD), W_O).view(M, B, nq, D)
        h = h[:, :, n - nq :] + attn_out
        if not names.pre:
            h = norm(names.attn(layer), kinds[layer], h)
        x = norm(names.mlp(layer), kinds[layer], h) if names.pre else h
        mlp_out, post = _MLP.apply(x.reshape(M, B * nq, D), *(P[f"blocks.{layer}.mlp.{w}"] for w in MLP_WEIGHTS))
        h = h + mlp_out.view(M, B, nq, D)
        if not names.pre:
            h = norm(names.mlp(layer), kinds[layer], h)
        if keep is not None:
            keep[f"blocks.{layer}.mlp.hook_post"] = post.view(M, B, nq, -1)[:, :, -1]
            keep[f"blocks.{layer}.hook_resid_post"] = h[:, :, -1]
    out = h[:, :, -1]
    if names.pre:
        out = norm(names.final, kinds[-1], out)
    W_U = P["unembed.W_U"]
    Wr = bounded_readout(W_U, tau) if cfg.unembed == "bounded" else W_U
    return torch.bmm(out, Wr)


def _check(cfg: GeoConfig, tokens: list[Tensor]) -> None:
    reason = deep_unsupported_reason(cfg)
    if reason is not None:
        raise GeoError(f"deep engine unsupported: {reason}")
    if any(t.dim() != 2 or t.shape[1] != cfg.n_ctx for t in tokens):
        raise GeoError(f"the deep engine needs tokens of shape [batch, {cfg.n_ctx}], got {[tuple(t.shape) for t in tokens]}")
    if len({t.shape[0] for t in tokens}) != 1:
        raise GeoError(f"stacked members need the same batch size, got {[len(t) for t in tokens]}")


def stacked_deep_logits(cfg: GeoConfig, params: dict[str, Tensor], tokens: list[Int[Tensor, "batch n_ctx"]],
                        tau: float | None = None) -> Float[Tensor, "M batch d_vocab_out"]:
    """Logits [M, B, d_vocab_out] at `=` of M GeoTransformers of config `cfg` with parameters params
    {name: [M, *shape]}, member m on tokens[m] [B, n_ctx]; equal to GeoTransformer(params[:, m])(tokens[m])[:, -1]
    up to float rounding, gradients flowing to `params`. tau: the bounded readout's temperature (default cfg.tau)."""
    _check(cfg, tokens)
    if tokens[0].shape[0] == 0:
        return params["unembed.W_U"].new_zeros(len(tokens), 0, cfg.d_vocab_out)
    return _forward(cfg, params, tokens, cfg.tau if tau is None else tau)


def deep_logits(model, tokens: Int[Tensor, "batch n_ctx"]) -> Float[Tensor, "batch d_vocab_out"]:
    """Logits [B, d_vocab_out] at `=` of `model` (any GeoTransformer), differentiable w.r.t. its parameters."""
    params = {name: p.unsqueeze(0) for name, p in model.named_parameters()}
    return stacked_deep_logits(model.cfg, params, [tokens], model.unembed.tau)[0]


def deep_forward_with_values(model, tokens: Int[Tensor, "batch n_ctx"]) -> tuple[Tensor, dict[str, Tensor]]:
    """(logits [B, C] with autograd, values at `=` by hook name [B, ...] detached): one forward serving the
    training step and the precursor columns."""
    params = {name: p.unsqueeze(0) for name, p in model.named_parameters()}
    _check(model.cfg, [tokens])
    keep: dict[str, Tensor] = {}
    logits = _forward(model.cfg, params, [tokens], model.unembed.tau, keep)[0]
    return logits, {name: value[0].detach() for name, value in keep.items()}


@torch.no_grad()
def deep_eq_values(model, tokens: Int[Tensor, "batch n_ctx"]) -> dict[str, Tensor]:
    """Values at `=` by hook name (blocks.L.mlp.hook_post [B, d_mlp], blocks.L.hook_resid_post [B, D],
    blocks.L.attn.hook_pattern [B, n_ctx, H]: the `=` query's pattern over the keys, blocks.L.attn.hook_attn_scores
    [B, H, n_ctx] for learned attention in layers after the first), and 'logits' [B, C]."""
    logits, values = deep_forward_with_values(model, tokens)
    return {**values, "logits": logits}
