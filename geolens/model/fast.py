"""Fast exact training path for the one-layer GeoTransformer (`fast_logits`, `stacked_fast_logits`).

With one layer only the `=` position (2) reaches the logits, and the residual after the
embedding depends only on (token, position). So everything before the MLP is built from small
per-token tables (ordinary autograd, once per call; V = d_vocab, R = 2V+1 rows: [0, V) the token
at position 0, [V, 2V) the token at position 1, 2V the `=` row):

    T    = N1(W_E[tok] + W_pos[pos])                         [R, D]
    Sc   = T @ (W_K[h] q[h]) / sqrt(dh),  q = T[2V] @ W_Q    [R, H]     scores of the `=` query
    VO   = T @ W_V[h] @ W_O[h]                               [R, H, D]  value-output rows
    Tab  = VO[r, h] - VO[2V, h] at row h*2V + r (r < 2V), then T[2V] + sum_h VO[2V, h]   [2V*H + 1, D]

(the softmax weights sum to 1, so the `=` key's rows fold into one constant row; with uniform
attention the heads are summed and weighted 1/3 in the table). Per example (`_Body`, an
autograd.Function with a hand-written backward; a, b the tokens at positions 0, 1):

    p    = softmax over keys (a, b, =) of Sc[a], Sc[V+b], Sc[2V]       [B, 3, H]
    x    = Tab[const] + sum_h p_a,h Tab[a, h] + p_b,h Tab[V+b, h]       [B, D]   (embedding_bag)
    h    = N2(x);  pre = h @ W_in + b_in = s(x) * (x @ Wt) + k          [B, Dm]
    h3   = N3(h + relu(pre) @ W_out + b_out)                            [B, D]
    out  = h3 @ Wr   (W_U, or tau * W_U / ||W_U col|| when bounded)     [B, C]

where s(x) is N2's row scale (rstd, 1/||x||) and Wt = N2's gain * W_in (row-centred for
LayerNorm), k = N2's offset @ W_in + b_in: so `pre` is a second embedding bag over the rows
Tab2 = Tab @ Wt (weights scaled by s(x)) instead of a [B, D] x [D, Dm] matmul. With learned
attention Tab's token rows are Vh[h] @ W_O[h] (Vh[h] = (T[r] - T[2V]) @ W_V[h], [2V, dh]), so
their Tab2 rows are Vh[h] @ (W_O[h] @ Wt), and the backward's Tab^T Q and Q @ Wt^T go through the
same per-head factors (dh = D / H: 2.5x fewer FLOPs at the paper's sizes).

Backward: dense matmuls for the readout and the MLP (dL/dpre, dL/dW_out). dL/dW_in =
sum_e N2(x_e) (x) dL/dpre_e comes from the table rows instead of a [Dm, B] x [B, D] matmul:
sum_e s(x_e) x_e (x) dL/dpre_e = Tab^T Q, Q [n_tab, Dm] the transposed MLP-input bag (per table
row, the bag-weighted sum of dL/dpre over the examples reading it), then N2's gain, centring and
offset. dL/dx = A + s(x) dL/dpre @ Wt^T is never formed, so there is no [B, Dm] x [Dm, D] matmul:
A = N2's backward of dL/dy minus s(x) c n (n N2's normalised input, c = <dL/dpre, pre - k> / D for
LayerNorm/RMSNorm, <dL/dpre, pre - k> for the sphere, from the dots <Tab2 row, dL/dpre> that are
the MLP-input bag's per-sample-weight gradient). The table rows get dL/dTab = bag^T(A) + Q @ Wt^T
(bag^T the x bag transposed, with its weights), the attention weights of the x bag get
<Tab row, A> + s(x) <Tab2 row, dL/dpre> (then the softmax backward, and segment sums onto the
score rows: no atomics, so deterministic on CUDA too), and N2's gain and offset get
sum_j W_in[d, j] (Tab^T Q)[d, j] and W_in @ dL/db_in on top. Autograd
carries the table gradients on to W_E, W_pos, N1, W_Q, W_K, W_V, W_O. Causal and non-causal models
share this path (the mask never touches the `=` query); in uniform mode W_Q and W_K stay out of the
graph (grad None), as in the hooked model. The hooked GeoTransformer stays the source of truth:
tests/test_fast.py checks logits and every parameter gradient against it.

Members: every tensor carries a leading member dimension M. `stacked_fast_logits` runs M models
of one shape (parameters stacked [M, *shape], one token tensor [B, 3] per member) as one
computation: bmm for the matmuls, and bags over the members' tables flattened to one
[M * rows, width] table with member-offset row indices. `fast_logits` is M = 1. The dense
per-example matmuls shaped [B, K] x [K, N] (forward, dL/dh3, dL/dpre) go through `_mm`:
oneDNN's linear for one float32 CPU member where torch has oneDNN, else bmm.

Analysis: `fast_eq_forward` runs the same forward without gradients over every input and returns
every value of the `=` position the analysis reads (embedding, attention pattern, z, the residual
stream, the MLP, the norms' scales, the logits; geolens.analysis.eqforward only names them by
hook); passing it to `fast_logits(..., reuse=(eq, rows))` gathers a subset's forward from it, so
a gradient on the training rows costs only the tables and the backward.

Scope: exactly the configurations declared below (FAST_NORMS, FAST_READOUTS, FAST_ATTENTIONS, one
layer, [a, b, =] inputs; every other GeoConfig field classified as a plain value or as no part of
the forward); fast_unsupported_reason refuses anything else, and the engines then use the hooked
model.

Exactness: same float32 math in a different order, so logits agree to ~1e-7 relative and the
pre-activations are as close to a float64 reference as the hooked model's are. Gradients agree
to ~1e-6, except that a ReLU unit whose pre-activation lies within rounding error of 0 (|pre| ~
1e-8) can fall on the other side of the kink than in the hooked model; at p = 113 a full batch
has ~2M units and one such unit shifts W_in's gradient by up to ~1e-4 relative. Neither side is
more accurate than the other (the hooked model flips as many units against float64).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import GeoConfig
from geolens.model.lookups import BagLookup, cached_plan, segments, slot_dots
from geolens.model.readout import bounded_readout

__all__ = ["fast_unsupported_reason", "fast_logits", "stacked_fast_logits", "fast_eq_forward", "FastEq", "fast_flops",
           "FAST_NORMS", "FAST_READOUTS", "FAST_ATTENTIONS"]

# ---- what the fast path computes: every GeoConfig field is classified here -----------------------
# (tests/test_fast.py checks that these cover GeoConfig's fields, so a new field, or a new value of
# norm / unembed / attention, is refused until it is implemented and tested here)
FAST_NORMS = frozenset({"none", "layernorm", "rmsnorm", "sphere"})
FAST_READOUTS = frozenset({"raw", "bounded"})  # cfg.unembed
FAST_ATTENTIONS = frozenset({"learned", "uniform"})
FAST_PLACEMENTS = frozenset({"post"})  # cfg.norm_placement: the per-token tables assume post-norm
FAST_N_LAYERS = 1
FAST_N_CTX = 3  # [a, b, =]: the `=` query at the last position
# read as values, any valid value computes exactly (causal: the mask never hides a key from the
# last position, the only one that reaches the logits)
FAST_VALUE_FIELDS = frozenset({"d_model", "n_heads", "d_head", "d_mlp", "tau", "ln_eps", "rms_eps", "sphere_eps",
                               "causal"})
# no part of the forward (the task and the split give the tokens; init and training settings the weights)
FAST_IGNORED_FIELDS = frozenset({"task", "p", "n_perm", "frac_train", "data_seed", "fourier_init", "init", "seed",
                                 "lr", "beta1", "beta2", "weight_decay", "optimizer", "momentum", "muon_lr",
                                 "muon_momentum", "epochs", "eval_every", "checkpoints",
                                 "early_stop_after", "engine", "device", "preset", "schedule",
                                 "norm_clamp", "flush_denormal", "keep"})
_CHOICES = (("norm", FAST_NORMS), ("unembed", FAST_READOUTS), ("attention", FAST_ATTENTIONS),
            ("norm_placement", FAST_PLACEMENTS))


def fast_unsupported_reason(cfg: GeoConfig) -> str | None:
    """None when `fast_logits` computes this model exactly, else a one-line reason. Only what is
    declared above is supported; anything else (a new norm, readout or attention mode) is refused."""
    if cfg.n_layers != FAST_N_LAYERS:
        return f"n_layers = {cfg.n_layers}; the fast path needs n_layers == {FAST_N_LAYERS}"
    if cfg.n_ctx != FAST_N_CTX:
        return f"n_ctx = {cfg.n_ctx}; the fast path needs [a, b, =] inputs (n_ctx == {FAST_N_CTX})"
    for field, supported in _CHOICES:
        value = getattr(cfg, field)
        if value not in supported:
            return f"{field} = '{value}'; the fast path supports {field} {', '.join(sorted(supported))}"
    return None


def fast_flops(cfg: GeoConfig, n_examples: int, backward: bool = True) -> dict[str, int]:
    """FLOPs (2 x multiply-adds) of the matmul-like work of one member's fast forward (+ backward).

    'dense': per-example matmuls: forward relu(pre) @ W_out and h3 @ Wr, backward two per forward
    matmul. 'bags': the embedding bags (forward: rows of d_model into x, rows of d_mlp into pre;
    backward: the transposed bags into Q and dL/dTab, the dots <Tab2 row, dL/dpre> per slot (unless
    norm 'none' with uniform attention) and, learned attention, <Tab row, A> per slot). 'tables':
    per-token table matmuls (x3 for those with gradients when backward), Tab2 and, when backward,
    Tab^T Q and Q @ Wt^T (learned attention: per head through Vh and W_O @ Wt). Elementwise work is
    not counted.
    """
    B, D, Dm, C, H, dh = n_examples, cfg.d_model, cfg.d_mlp, cfg.d_vocab_out, cfg.n_heads, cfg.d_head
    V2, R = 2 * cfg.d_vocab, 2 * cfg.d_vocab + 1
    uniform = cfg.attention == "uniform"
    mult = 3 if backward else 1
    dense = 2 * B * (Dm * D + D * C) * mult
    slots = 3 if uniform else 2 * H + 1
    bags = 2 * B * slots * D + 2 * B * (slots + 1) * Dm
    if backward:
        bags += 2 * B * slots * (Dm + D)
        bags += 2 * B * slots * Dm if (cfg.norm != "none" or not uniform) else 0
        bags += 2 * B * slots * D if not uniform else 0
    if uniform:
        grad_tables = R * D * D + H * dh * D * D
        mlp_table = R * D * Dm  # Tab @ Wt
        mlp_backward = 2 * R * D * Dm  # Tab^T Q, Q @ Wt^T
    else:
        grad_tables = R * D * H * dh + R * H * dh * D + R * D * H + 2 * D * H * dh
        mlp_table = H * dh * D * Dm + V2 * H * dh * Dm + D * Dm  # W_O @ Wt, Vh @ (W_O @ Wt), constant row
        mlp_backward = 2 * V2 * H * dh * Dm + 2 * H * dh * D * Dm + 2 * D * Dm  # Vh^T Q, Q (W_O Wt)^T; W_O^T, Wt^T
    tables = 2 * (mult * grad_tables + mlp_table + D * Dm) + (2 * mlp_backward if backward else 0)
    return {"dense": dense, "bags": bags, "tables": tables}


@dataclass(frozen=True)
class _Spec:
    """Static facts the per-example Function needs."""

    norm: str
    eps: float
    n_heads: int
    d_vocab: int
    uniform: bool


def _norm_eps(cfg: GeoConfig) -> float:
    return {"layernorm": cfg.ln_eps, "rmsnorm": cfg.rms_eps, "sphere": cfg.sphere_eps}.get(cfg.norm, 0.0)


# ---- norms (x [M, n, d], per-member gain w and offset b [M, d] or None) -------------------------
def _stack(ts: list[Tensor]) -> Tensor:
    return ts[0].unsqueeze(0) if len(ts) == 1 else torch.stack(ts)


def _norm_autograd(kind: str, x: Float[Tensor, "M n d"], w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    """The model's post-norm N(x) with autograd (used on the [M, R, D] tables only)."""
    if kind == "layernorm":
        return _stack([F.layer_norm(x[m], (x.shape[-1],), w[m], b[m], eps) for m in range(x.shape[0])])
    if kind == "rmsnorm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w[:, None]
    if kind == "sphere":
        return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)
    return x


def _norm_fwd(kind: str, x: Float[Tensor, "M B d"], w: Tensor | None, b: Tensor | None, eps: float):
    """(N(x) [M, B, d], a [M, B, 1] or None, saved for _norm_bwd); a is the row scale of the norm
    (rstd for LayerNorm/RMSNorm, 1/max(||x||, eps) for the sphere, None for 'none')."""
    d = x.shape[-1]
    if kind == "layernorm":  # per member: the fused kernel takes one gain and offset
        outs, means, rstds = zip(*(torch.native_layer_norm(x[m], (d,), w[m], b[m], eps) for m in range(x.shape[0])))
        mean, rstd = _stack(means), _stack(rstds)
        return _stack(outs), rstd, (x, mean, rstd)
    if kind == "rmsnorm":
        rstd = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(d).add_(eps).rsqrt_()
        n = x * rstd
        return n * w[:, None], rstd, (n, rstd)
    if kind == "sphere":
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        a = norm.clamp_min(eps).reciprocal_()
        out = x * a
        return out, a, (out, a, norm >= eps)
    return x, None, ()


def _norm_bwd(kind: str, g: Float[Tensor, "M B d"], saved, w: Tensor | None, b: Tensor | None, need_w: bool,
              need_b: bool):
    """(dL/dx [M, B, d], dL/dw [M, d] or None, dL/db [M, d] or None) for the norm whose forward saved `saved`."""
    d = g.shape[-1]
    if kind == "layernorm":
        x, mean, rstd = saved
        gx, gw, gb = zip(*(torch.ops.aten.native_layer_norm_backward(g[m], x[m], [d], mean[m], rstd[m], w[m], b[m],
                                                                      [True, need_w, need_b])
                           for m in range(g.shape[0])))
        return _stack(gx), _stack(gw) if need_w else None, _stack(gb) if need_b else None
    if kind == "rmsnorm":
        n, rstd = saved  # out = n * w, n = x * rstd
        gw = (g * n).sum(1) if need_w else None
        gn = g * w[:, None]
        dot = (gn * n).mean(-1, keepdim=True)
        return gn.sub_(n * dot).mul_(rstd), gw, None
    if kind == "sphere":
        out, a, unclamped = saved  # out = x * a, a = 1 / max(||x||, eps)
        dot = (g * out).sum(-1, keepdim=True).mul_(unclamped)
        return (g - out * dot).mul_(a), None, None
    return g, None, None


# ---- token-dependent indices (cached per list of tokens tensors: lookups.cached_plan) ---------------
class _Plan:
    """Everything about the members' token tensors (each [B, 3]) that depends only on the tokens.

    Example i = m * B + e is row e of member m; a, b its tokens at positions 0, 1. Table rows are
    rows of the members' tables flattened along the member axis (member m's Tab rows start at
    m * n_tab, its score rows at m * R; Tab2 holds the M * n_tab rows of Tab @ Wt, then one k row
    per member):

    idx [M*B, n]: the x bag's slots. Learned: h*2V + a for h < H, then h*2V + V + b, then the
    constant row 2V*H (n = 2H + 1); uniform: a, V + b, 2V (n = 3).
    idx2 [M*B, n + 1]: idx, then member m's k row M*n_tab + m (the MLP-input bag over Tab2).
    Transposed bags (dL/dW_in, dL/dTab): t_src [M*B*n] the example of each idx entry, sorted by
    table row; t_offsets [M*n_tab] where each table row's entries start; t_w, t_w2 the entries'
    flat positions in a [M*B, n] and a [M*B, n + 1] weight tensor.
    Learned only: sc_rows [3MB] the score-table rows of each example's keys (a, V + b, 2V; member
    offset m*(2V + 1)); sc_order, sc_offsets group them per row (lookups.segments).
    """

    def __init__(self, tokens: list[Tensor], V: int, H: int, uniform: bool):
        tok = torch.stack(tokens)  # [M, B, 3]
        M, B, dev = tok.shape[0], tok.shape[1], tok.device
        self.M, self.B = M, B
        self.eq = int(tok[0, 0, 2])
        self.same_eq = not bool((tok[..., 2] != self.eq).any())
        a, b = tok[..., 0], tok[..., 1] + V  # [M, B]
        members = torch.arange(M, device=dev)[:, None]
        if uniform:
            self.n_tab = 2 * V + 1
            local = torch.stack((a, b, torch.full_like(a, 2 * V)), -1)  # [M, B, 3]
        else:
            self.n_tab = 2 * V * H + 1
            heads = torch.arange(H, device=dev)
            local = torch.cat((heads * (2 * V) + a[..., None], heads * (2 * V) + b[..., None],
                               torch.full_like(a, 2 * V * H)[..., None]), -1)
            keys = torch.stack((a, b, torch.full_like(a, 2 * V)), -1)  # [M, B, 3] score rows of (a, V + b, =)
            self.sc_rows = (keys + (members * (2 * V + 1))[..., None]).view(-1)
            self.sc_order, self.sc_offsets = segments(self.sc_rows, M * (2 * V + 1))
        n = local.shape[-1]
        self.idx = (local + (members * self.n_tab)[..., None]).view(M * B, n)
        k_rows = (M * self.n_tab + members).expand(M, B)[..., None]
        self.idx2 = torch.cat((self.idx.view(M, B, n), k_rows), -1).view(M * B, n + 1)
        self.bag = BagLookup(self.idx, M * self.n_tab)
        self.t_w, self.t_offsets, self.t_src = self.bag.by_row
        self.t_w2 = self.t_src * (n + 1) + self.t_w % n

    def slot_dots(self, g: Float[Tensor, "MB k"], table: Float[Tensor, "rows k"]) -> Float[Tensor, "MB n"]:
        """<table[idx[i, j]], g[i]> for every slot j of every example i: the per-sample-weight
        gradient of a bag over `table` with slots idx."""
        return slot_dots(g, table, self.bag)


def _plan(tokens: list[Tensor], V: int, H: int, uniform: bool) -> _Plan:
    """The _Plan of `tokens`, reused while the same tensor objects are passed unmodified."""
    return cached_plan(tokens, ("fast", V, H, uniform), lambda: _Plan(tokens, V, H, uniform))


# ---- dense per-example matmuls ----------------------------------------------------------------
@functools.cache
def _onednn_linear():
    """torch.ops.mkldnn._linear_pointwise when this build has oneDNN and the op works, else None."""
    try:
        op = torch.ops.mkldnn._linear_pointwise
        ok = torch.backends.mkldnn.is_available() and torch.equal(
            op(torch.ones(2, 3), torch.ones(4, 3), None, "none", [], ""), torch.full((2, 4), 3.0))
    except (AttributeError, RuntimeError):
        return None
    return op if ok else None


def _mm(x: Float[Tensor, "M B K"], w: Float[Tensor, "M K N"], c: Tensor | None = None) -> Float[Tensor, "M B N"]:
    """x @ w, plus c ([M, 1, N] a bias, or [M, B, N]) if given: torch.bmm / torch.baddbmm(c, x, w).

    One float32 CPU member goes through oneDNN's linear (w as the [N, K] view w[0]^T, the bias
    fused): for these [B, K] x [K, N] shapes with B in the thousands it is on par with the MKL
    sgemm behind bmm on idle cores and faster while other work shares them. (Not for the weight
    gradients x^T @ g, reducing over B, where oneDNN is slower, so those stay on bmm; measurements
    in docs/performance.md.) Same float32 math, different summation order.
    """
    op = _onednn_linear() if x.shape[0] == 1 and x.device.type == "cpu" and x.dtype == torch.float32 else None
    if op is None:
        return torch.bmm(x, w) if c is None else torch.baddbmm(c, x, w)
    if c is not None and c.shape[1] > 1:  # an addend: a plain add_ beats oneDNN's binary post-op
        return op(x[0], w[0].t(), None, "none", [], "").add_(c[0])[None]
    return op(x[0], w[0].t(), None if c is None else c[0, 0], "none", [], "")[None]


# ---- the per-example part ---------------------------------------------------------------------
@dataclass
class _Forward:
    """Per-example values of the fast forward (M members x B examples; shapes in _forward_body)."""

    p: Tensor | None
    wx: Tensor | None
    x: Tensor
    h: Tensor
    a2: Tensor | None
    st2: tuple
    w_pre: Tensor | None
    post: Tensor
    mlp_out: Tensor | None
    h3: Tensor
    a3: Tensor | None
    st3: tuple
    logits: Tensor

    def rows(self, idx: Tensor) -> "_Forward":
        """The same values for examples idx [k] of a one-member forward (every per-example tensor
        gathered: [1, B, ...] along dim 1, p, wx and w_pre [B, ...] along dim 0)."""

        def take(t, dim):
            if t is None:
                return None
            if isinstance(t, tuple):
                return tuple(take(u, dim) for u in t)
            return t.index_select(dim, idx)

        return _Forward(*(take(getattr(self, f.name), 0 if f.name in ("p", "wx", "w_pre") else 1)
                          for f in dataclasses.fields(self)))


def _forward_body(plan, spec, Sc, Tab, Tab2, w2, b2, W_out, b_out, w3, b3, Wr, keep_mlp_out=False) -> _Forward:
    """The per-example forward (module docstring; inputs as in _Body) from the tables.

    Returns p [MB, 3, H] the `=` query's softmax over (a, b, =) and wx [MB, 2H + 1] the x bag's
    weights (both None if uniform), x [M, B, D] the
    residual at `=` after attention (before N2), h = N2(x), a2 N2's row scale [M, B, 1] (None for
    norm 'none') and st2 its saved state, w_pre the MLP-input bag weights, post [M, B, Dm] =
    relu(pre), mlp_out [M, B, D] (only with keep_mlp_out), h3 = N3(h + mlp_out), a3 and st3 (N3's
    row scale and state), logits [M, B, C].
    """
    M, B, H = plan.M, plan.B, spec.n_heads
    D, Dm = Tab.shape[-1], Tab2.shape[-1]
    MB = M * B
    p = wx = None
    if not spec.uniform:
        # softmax of the `=` query over its keys (a, b, =), per head: p [MB, 3, H]
        p = torch.softmax(Sc.reshape(-1, H).index_select(0, plan.sc_rows).view(MB, 3, H), 1)
        wx = torch.ones(MB, 2 * H + 1, dtype=p.dtype, device=p.device)  # x bag weights [p0 | p1 | 1]
        wx[:, : 2 * H] = p[:, :2].reshape(MB, 2 * H)
    x = F.embedding_bag(plan.idx, Tab.view(-1, D), per_sample_weights=wx, mode="sum").view(M, B, D)
    h, a, st2 = _norm_fwd(spec.norm, x, w2, b2, spec.eps)
    # N2(x) @ W_in + b_in = a * (x @ Wt) + k: the x bag over Tab2 = Tab @ Wt with weights * a, plus k
    n = plan.idx.shape[1]
    w_pre = None
    if a is not None or wx is not None:
        w_pre = torch.ones(MB, n + 1, dtype=x.dtype, device=x.device)
        if wx is None:
            w_pre[:, :n] = a.view(MB, 1)
        elif a is None:
            w_pre[:, :n] = wx
        else:
            torch.mul(wx, a.view(MB, 1), out=w_pre[:, :n])
    pre = F.embedding_bag(plan.idx2, Tab2, per_sample_weights=w_pre, mode="sum").view(M, B, Dm)
    post = pre.relu_()
    mlp_out = _mm(post, W_out, b_out[:, None])
    y = mlp_out + h if keep_mlp_out else mlp_out.add_(h)
    h3, a3, st3 = _norm_fwd(spec.norm, y, w3, b3, spec.eps)
    logits = _mm(h3, Wr)
    return _Forward(p, wx, x, h, a, st2, w_pre, post, mlp_out if keep_mlp_out else None, h3, a3, st3, logits)


class _Body(torch.autograd.Function):
    """Per-example part of the fast forward (see the module docstring), M members at once.

    Inputs: plan (_Plan), spec (_Spec); Sc [M, R, H] scores of the `=` query (None if uniform);
    Tab [M, n_tab, D] rows whose weighted sum is x, the residual at `=` after attention (learned:
    row h*2V + r = VO[r, h] - VO[2V, h] for r in [0, 2V), then the constant row
    T[2V] + sum_h VO[2V, h]; uniform: row r = sum_h VO[r, h] / 3 for r in [0, 2V), then
    T[2V] + sum_h VO[2V, h] / 3; VO[r, h] = T[r] @ W_V[h] @ W_O[h]);
    Tab2 [M*n_tab + M, Dm] (no grad): the members' Tab @ Wt rows, then their k rows;
    W_in [M, D, Dm], b_in [M, Dm]; w2, b2 (N2 params [M, D] or None); W_out [M, Dm, D];
    b_out [M, D]; w3, b3 (N3 params or None); Wr [M, D, C]; Wt [M, D, Dm] (no grad); learned
    attention only (else None): Vh [M*H, 2V, dh] and W_O [M, H, dh, D] (Tab's token rows are
    Vh[h] @ W_O[h]: the backward sends the Q @ Wt^T part of their gradient straight to these) and
    WOt [M*H, dh, Dm] = W_O[h] @ Wt (no grad); given: None, or the _Forward of exactly these inputs
    and parameter values, used instead of recomputing it. Output: logits [M, B, C].
    """

    @staticmethod
    def forward(ctx, plan, spec, Sc, Tab, Tab2, W_in, b_in, w2, b2, W_out, b_out, w3, b3, Wr, Wt, Vh, W_O, WOt,
                given=None):
        f = given if given is not None else _forward_body(plan, spec, Sc, Tab, Tab2, w2, b2, W_out, b_out, w3, b3, Wr)
        ctx.plan, ctx.spec = plan, spec
        ctx.st2, ctx.st3, ctx.a2 = f.st2, f.st3, f.a2
        ctx.save_for_backward(Tab, Tab2, Wt, f.p, f.wx, f.w_pre, f.post, f.h3, W_in, W_out, w2, b2, w3, b3, Wr, Vh,
                              W_O, WOt)
        return f.logits

    @staticmethod
    def backward(ctx, g_logits):
        plan, spec = ctx.plan, ctx.spec
        Tab, Tab2, Wt, p, wx, w_pre, post, h3, W_in, W_out, w2, b2, w3, b3, Wr, Vh, W_O, WOt = ctx.saved_tensors
        need = ctx.needs_input_grad
        M, B, H, V = plan.M, plan.B, spec.n_heads, spec.d_vocab
        D, Dm, n_tab = Tab.shape[-1], post.shape[-1], plan.n_tab
        MB = M * B
        # readout, N3, MLP output (dense)
        g_Wr = torch.bmm(h3.transpose(1, 2), g_logits) if need[13] else None
        g_y, g_w3, g_b3 = _norm_bwd(spec.norm, _mm(g_logits, Wr.transpose(1, 2)), ctx.st3, w3, b3, need[11],
                                    need[12])
        g_b_out = g_y.sum(1)
        g_W_out = torch.bmm(post.transpose(1, 2), g_y)
        g_pre = _mm(g_y, W_out.transpose(1, 2))
        torch.ops.aten.threshold_backward.grad_input(g_pre, post, 0.0, grad_input=g_pre)
        g_b_in = g_pre.sum(1)
        # dL/dW_in = sum_e N2(x_e) (x) g_pre_e from sum_e a_e x_e (x) g_pre_e = Tab^T Q, Q the transposed
        # MLP-input bag: per table row, the sum of a_e * weight * g_pre_e over the entries reading it
        q_w = None if w_pre is None else w_pre.view(-1).index_select(0, plan.t_w2)
        Q = F.embedding_bag(plan.t_src, g_pre.view(MB, Dm), plan.t_offsets, mode="sum", per_sample_weights=q_w)
        Q = Q.view(M, n_tab, Dm)
        g_Vh = g_W_O = None
        if Vh is None:
            g_W_in_n = torch.bmm(Tab.transpose(1, 2), Q)  # Tab^T Q [M, D, Dm]
        else:  # per head: VOrel[h]^T Q[h] = W_O[h]^T (Vh[h]^T Q[h]), plus the constant row's part
            Qt, Qc = Q[:, :-1].reshape(M * H, 2 * V, Dm), Q[:, -1:]
            VQ = torch.bmm(Vh.transpose(1, 2), Qt).view(M, -1, Dm)  # [M, H*dh, Dm]
            const_part = torch.bmm(Tab[:, -1:].transpose(1, 2), Qc)
            g_W_in_n = torch.baddbmm(const_part, W_O.reshape(M, -1, D).transpose(1, 2), VQ)
            # and the Q @ Wt^T part of dL/dTab's token rows goes straight to Vh and W_O
            g_Vh = torch.bmm(Qt, WOt.transpose(1, 2)) if need[15] else None
            g_W_O = torch.bmm(VQ, Wt.transpose(1, 2)).view(W_O.shape) if need[16] else None
        if spec.norm == "layernorm":  # N2(x) = rstd * (x - mean) * w2 + b2: centre the rows (sum_e n_e (x) g_pre_e)
            g_W_in_n = g_W_in_n - g_W_in_n.mean(1, keepdim=True)
            g_W_in = torch.addcmul(b2[:, :, None] * g_b_in[:, None], w2[:, :, None], g_W_in_n)
        else:
            g_W_in = g_W_in_n if w2 is None else g_W_in_n * w2[:, :, None]
        # dL/dx = A + a * g_pre @ Wt^T is never formed per example: A = N2's backward of g_y, plus N2's own
        # term along its normalised input n, of size <g_pre, pre - k> = a <g_pre, x @ Wt> (sphere: a dot;
        # LayerNorm/RMSNorm: a mean). The table rows get bag^T(A) + Q @ Wt^T, and the x bag's weights
        # <Tab row, dL/dx> = <Tab row, A> + a <Tab2 row, g_pre>
        A, g_w2, g_b2 = _norm_bwd(spec.norm, g_y, ctx.st2, w2, b2, need[7], need[8])
        a2, n = ctx.a2, plan.idx.shape[1]
        dots = None
        if a2 is not None or (not spec.uniform and need[2]):
            dots = plan.slot_dots(g_pre.view(MB, Dm), Tab2)  # <Tab2[r], g_pre_e> per slot
        if a2 is not None:
            dpk = torch.linalg.vecdot(w_pre[:, :n], dots).view(M, B, 1)
            if spec.norm == "sphere":
                nvec, unclamped = ctx.st2[0], ctx.st2[2]
                coef = dpk.mul_(a2).mul_(unclamped)
            elif spec.norm == "layernorm":
                x_, mean, rstd = ctx.st2
                nvec, coef = (x_ - mean).mul_(rstd), dpk.mul_(a2).mul_(1.0 / D)
            else:
                nvec, coef = ctx.st2[0], dpk.mul_(a2).mul_(1.0 / D)
            A = A.addcmul_(nvec, coef, value=-1.0)
        if g_w2 is not None:  # N2's gain also sees g_pre @ W_in^T: sum_e (g_pre_e @ W_in^T) * n_e
            g_w2 = g_w2 + (g_W_in_n * W_in).sum(-1)
        if g_b2 is not None:
            g_b2 = g_b2 + torch.bmm(W_in, g_b_in[:, :, None])[..., 0]
        A = A.reshape(MB, D)
        t_w = None if wx is None else wx.view(-1).index_select(0, plan.t_w)
        g_Tab = F.embedding_bag(plan.t_src, A, plan.t_offsets, mode="sum", per_sample_weights=t_w).view(M, n_tab, D)
        if Vh is None:
            g_Tab = torch.baddbmm(g_Tab, Q, Wt.transpose(1, 2))
        else:
            g_Tab[:, -1:] += torch.bmm(Qc, Wt.transpose(1, 2))
        g_Sc = None
        if not spec.uniform and need[2]:
            # dL/dp for the keys a, b (the `=` key's rows are folded into the constant row, so its dL/dp
            # is 0 up to a shift the softmax Jacobian ignores)
            g_wx = plan.slot_dots(A, Tab.view(-1, D))[:, : 2 * H]
            g_p = torch.zeros_like(p)  # [MB, 3, H]
            g_p[:, :2] = g_wx.view(MB, 2, H)
            if a2 is None:
                g_p[:, :2] += dots[:, : 2 * H].view(MB, 2, H)
            else:
                g_p[:, :2].addcmul_(dots[:, : 2 * H].view(MB, 2, H), a2.view(MB, 1, 1))
            g_s = torch._softmax_backward_data(g_p, p, 1, p.dtype).view(3 * MB, H)  # rows sc_rows of g_Sc
            g_Sc = F.embedding_bag(plan.sc_order, g_s, plan.sc_offsets, mode="sum").view(M, 2 * V + 1, H)
        return (None, None, g_Sc, g_Tab, None, g_W_in, g_b_in, g_w2, g_b2, g_W_out, g_b_out, g_w3, g_b3, g_Wr, None,
                g_Vh, g_W_O, None, None)


# ---- tables and the entry points --------------------------------------------------------------
@dataclass
class _Tables:
    """Per-token tables (layout in _Body). With autograd: Sc [M, R, H] (None if uniform), Tab
    [M, n_tab, D], Wr [M, D, C] and (learned attention, else None) Vh [M*H, 2V, dh], the value rows
    T[r] @ W_V[h] relative to the `=` row (Tab's token rows are Vh[h] @ W_O[h]). Without: Tab2
    [M*n_tab + M, Dm], Wt [M, D, Dm] and (learned) WOt [M*H, dh, Dm] = W_O[h] @ Wt."""

    Sc: Tensor | None
    Tab: Tensor
    Tab2: Tensor
    Wr: Tensor
    Wt: Tensor
    Vh: Tensor | None
    WOt: Tensor | None


def _tables(cfg: GeoConfig, P: dict[str, Tensor], eq: int, tau: float) -> _Tables:
    """The per-token tables of stacked parameters P {name: [M, *shape]} (tau: the bounded readout's temperature)."""
    eps = _norm_eps(cfg)
    H, dh, V, D = cfg.n_heads, cfg.d_head, cfg.d_vocab, cfg.d_model
    W_E, W_pos = P["embed.W_E"], P["pos_embed.W_pos"]
    M = W_E.shape[0]
    W_Q, W_K, W_V, W_O = (P[f"blocks.0.attn.{n}"] for n in ("W_Q", "W_K", "W_V", "W_O"))
    R_in = torch.cat((W_E + W_pos[:, 0:1], W_E + W_pos[:, 1:2], W_E[:, eq : eq + 1] + W_pos[:, 2:3]), 1)
    T = _norm_autograd(cfg.norm, R_in, P.get("embed_norm.w"), P.get("embed_norm.b"), eps)  # [M, R, D]
    t2 = T[:, -1:]  # [M, 1, D]
    W_Vf = W_V.permute(0, 2, 1, 3).reshape(M, D, H * dh)
    W_Of = W_O.reshape(M, H * dh, D)
    Sc = Vh = WOt = None
    if cfg.attention == "uniform":
        VO = torch.bmm(T, torch.bmm(W_Vf, W_Of) * (1.0 / 3.0))  # [M, R, D]: sum_h T @ W_V[h] @ W_O[h] / 3
        Tab = torch.cat((VO[:, : 2 * V], VO[:, 2 * V :] + t2), 1)
    else:
        # p2 = 1 - p0 - p1: token rows relative to the `=` row, plus one constant row
        Vh = torch.bmm(T[:, : 2 * V] - t2, W_Vf).view(M, 2 * V, H, dh).transpose(1, 2).reshape(M * H, 2 * V, dh)
        VOrel = torch.bmm(Vh, W_O.reshape(M * H, dh, D))  # [M*H, 2V, D]
        const = t2 + torch.bmm(torch.bmm(t2, W_Vf), W_Of)
        Tab = torch.cat((VOrel.reshape(M, H * 2 * V, D), const), 1)
        q = torch.einsum("md,mhde->mhe", t2[:, 0], W_Q)
        u = torch.einsum("mhde,mhe->mdh", W_K, q) * (1.0 / math.sqrt(dh))
        Sc = torch.bmm(T, u)
    with torch.no_grad():
        W_in, b_in = P["blocks.0.mlp.W_in"], P["blocks.0.mlp.b_in"]
        w2, b2 = P.get("blocks.0.attn_norm.w"), P.get("blocks.0.attn_norm.b")
        Wt = W_in if w2 is None else w2[:, :, None] * W_in  # [M, D, Dm]
        if cfg.norm == "layernorm":
            Wt = Wt - Wt.mean(1, keepdim=True)
        n_tab, Dm = Tab.shape[1], W_in.shape[-1]
        Tab2 = torch.empty(M * (n_tab + 1), Dm, dtype=Tab.dtype, device=Tab.device)
        if Vh is None:
            torch.bmm(Tab.detach(), Wt, out=Tab2[: M * n_tab].view(M, n_tab, Dm))
        else:  # token rows VOrel[h] @ Wt = Vh[h] @ (W_O[h] @ Wt): 2.5x fewer FLOPs (dh < D)
            WOt = torch.bmm(W_O.detach().reshape(M, H * dh, D), Wt).view(M * H, dh, Dm)
            tab2 = Tab2[: M * n_tab].view(M, n_tab, Dm)
            torch.matmul(Vh.detach().view(M, H, 2 * V, dh), WOt.view(M, H, dh, Dm),
                         out=tab2[:, :-1].view(M, H, 2 * V, Dm))
            torch.bmm(const.detach(), Wt, out=tab2[:, -1:])
        Tab2[M * n_tab :] = b_in if b2 is None else torch.baddbmm(b_in[:, None], b2[:, None], W_in)[:, 0]
    W_U = P["unembed.W_U"]
    Wr = bounded_readout(W_U, tau) if cfg.unembed == "bounded" else W_U
    return _Tables(Sc, Tab, Tab2, Wr, Wt, Vh, WOt)


def _check(cfg: GeoConfig, tokens: list[Tensor]) -> None:
    """A GeoError unless the fast path computes this config on these [B, 3] token tensors."""
    reason = fast_unsupported_reason(cfg)
    if reason is not None:
        raise GeoError(f"fast path unsupported: {reason}")
    if any(t.dim() != 2 or t.shape[1] != 3 for t in tokens):
        raise GeoError(f"fast path needs tokens of shape [batch, 3], got {[tuple(t.shape) for t in tokens]}")
    if len({t.shape[0] for t in tokens}) != 1:
        raise GeoError(f"stacked fast path needs the same batch size for every member, got {[len(t) for t in tokens]}")


def _prepare(cfg: GeoConfig, params: dict[str, Tensor], tokens: list[Tensor], tau: float):
    """(plan, spec, tables) for stacked parameters and the members' (checked, non-empty) tokens."""
    V, uniform = cfg.d_vocab, cfg.attention == "uniform"
    plan = _plan(tokens, V, cfg.n_heads, uniform)
    if not plan.same_eq:
        raise GeoError("fast path needs the same token at position 2 in every row (the '=' token)")
    spec = _Spec(cfg.norm, _norm_eps(cfg), cfg.n_heads, V, uniform)
    return plan, spec, _tables(cfg, params, plan.eq, tau)


def _apply(cfg: GeoConfig, params: dict[str, Tensor], tokens: list[Tensor], tau: float,
           given: _Forward | None = None) -> Tensor:
    """_Body on the tables of params (with autograd) for the members' checked, non-empty tokens."""
    plan, spec, t = _prepare(cfg, params, tokens, tau)
    return _Body.apply(
        plan, spec, t.Sc, t.Tab, t.Tab2, params["blocks.0.mlp.W_in"], params["blocks.0.mlp.b_in"],
        params.get("blocks.0.attn_norm.w"), params.get("blocks.0.attn_norm.b"), params["blocks.0.mlp.W_out"],
        params["blocks.0.mlp.b_out"], params.get("blocks.0.mlp_norm.w"), params.get("blocks.0.mlp_norm.b"), t.Wr, t.Wt,
        t.Vh, None if t.Vh is None else params["blocks.0.attn.W_O"], t.WOt, given,
    )


def stacked_fast_logits(cfg: GeoConfig, params: dict[str, Tensor],
                        tokens: list[Int[Tensor, "batch 3"]], tau: float | None = None) -> Float[Tensor, "M batch d_vocab_out"]:
    """Logits [M, B, d_vocab_out] of M one-layer GeoTransformers of config `cfg` (up to the member
    fields of geolens.training.batched) with parameters params {name: [M, *shape]} (GeoTransformer's
    parameter names), member m on tokens[m] [B, 3] (the same B for all).

    Member m's logits equal GeoTransformer(params[:, m])(tokens[m])[:, -1] up to float rounding, and
    gradients flow to `params`. tau: the bounded readout's temperature (default cfg.tau; a tau
    schedule's value at the epoch during training). Every row must carry the same `=` token at position 2. Index work
    that depends only on the tokens is cached while the same (unmodified) tensors are passed again.
    """
    _check(cfg, tokens)
    if tokens[0].shape[0] == 0:
        return params["unembed.W_U"].new_zeros(len(tokens), 0, cfg.d_vocab_out)
    return _apply(cfg, params, tokens, cfg.tau if tau is None else tau)


@dataclass
class FastEq:
    """fast_eq_forward's result: values (name -> tensor, see there) of the inputs `tokens` [N, 3];
    fast_logits(model, tokens[rows], reuse=(this, rows)) reuses its forward for gradients."""

    values: dict[str, Tensor]
    tokens: Tensor
    forward: _Forward
    versions: tuple[int, ...]


def _param_versions(model) -> tuple[int, ...]:
    return tuple(p._version for p in model.parameters())


def fast_eq_forward(model, tokens: Int[Tensor, "N 3"], full: bool = True) -> FastEq:
    """No-grad values at `=` of a one-layer GeoTransformer on tokens [N, 3] (N >= 1), for analysis:
    the whole forward of the `=` position, each value equal to the hooked forward's (the hook in
    brackets, at `=`) up to float32 summation order (and ReLU units within rounding of 0).

    values: 'embed' [N, D] W_E of the `=` token (hook_embed), 'pos_embed' [N, D] (hook_pos_embed),
    'resid_pre' [N, D]; 'pattern' [N, H, 3] the `=` query's attention onto (a, b, =)
    (attn.hook_pattern), 'z' [N, H, d_head] (attn.hook_z), 'attn_out' [N, D]; 'resid_mid' [N, D],
    'mlp_post' [N, d_mlp], 'mlp_out' [N, D], 'resid_post' [N, D], 'logits' [N, C]; norms other
    than 'none': 'attn_scale', 'mlp_scale' [N, 1] (the norms' hook_scale: sqrt(var + eps),
    sqrt(mean(x^2) + eps) or max(||x||, eps)); and 'embedded' [V * 3, D], embed_norm's output for
    every token at every position (row 3 * token + position: all that embed_norm ever computes).

    The attention, the residual after it (x = resid_pre + attn_out) and everything after come
    from the training path's tables and embedding bags (no per-input W_O or W_in matmul). The
    embedding rows are the model's own embed_norm output (_attention_at_eq); z = sum_j pattern_j
    v[token_j, j] comes from a per-(token, position) v table.

    full=False: only what the training forward computes anyway ('resid_mid', 'mlp_post',
    'resid_post', 'logits' and the scales), for the precursor columns recorded while training.
    """
    cfg = model.cfg
    _check(cfg, [tokens])
    params = {name: p.detach().unsqueeze(0) for name, p in model.named_parameters()}
    with torch.no_grad():
        plan, spec, t = _prepare(cfg, params, [tokens], model.unembed.tau)
        f = _forward_body(plan, spec, t.Sc, t.Tab, t.Tab2, params.get("blocks.0.attn_norm.w"),
                          params.get("blocks.0.attn_norm.b"), params["blocks.0.mlp.W_out"],
                          params["blocks.0.mlp.b_out"], params.get("blocks.0.mlp_norm.w"),
                          params.get("blocks.0.mlp_norm.b"), t.Wr, keep_mlp_out=full)
        out = {"resid_mid": f.h[0], "mlp_post": f.post[0], "resid_post": f.h3[0], "logits": f.logits[0]}
        if full:
            embedded, resid_pre, pattern, z = _attention_at_eq(model, tokens, f.p)
            last, P = tokens[:, -1], cfg.n_ctx
            out.update({"embed": model.embed.W_E.detach().index_select(0, last),
                        "pos_embed": model.pos_embed.W_pos.detach()[P - 1].expand(len(tokens), -1),
                        "resid_pre": resid_pre, "pattern": pattern, "z": z, "attn_out": f.x[0] - resid_pre,
                        "mlp_out": f.mlp_out[0], "embedded": embedded})
    if f.a2 is not None:
        out["attn_scale"], out["mlp_scale"] = f.a2[0].reciprocal(), f.a3[0].reciprocal()
    return FastEq(out, tokens, f, _param_versions(model))


def _attention_at_eq(model, tokens: Int[Tensor, "N P"], p: Float[Tensor, "N P H"] | None):
    """(embedded [V * P, D], resid_pre [N, D], pattern [N, H, P], z [N, H, d_head]) of the `=`
    query over tokens [N, P], from p (the fast forward's softmax; None: uniform attention).

    embedded[P * v + j] is embed_norm(W_E[v] + W_pos[j]) computed by the model's own modules, so
    resid_pre is bit for bit the hooked model's; v = embedded @ W_V per head is one table row per
    (token, position) and z = sum_j pattern[:, :, j] v[token_j, j].
    """
    V, P, H = model.cfg.d_vocab, model.cfg.n_ctx, model.cfg.n_heads
    R = model.residual_after_embed(torch.arange(V, device=tokens.device)[:, None].expand(V, P))  # [V, P, D]
    v_flat = torch.einsum("vpd,hde->vphe", R, model.blocks[0].attn.W_V).flatten(0, 1)  # [V * P, H, d_head]
    if p is None:
        pattern = torch.full((tokens.shape[0], H, P), 1.0 / P, dtype=R.dtype, device=R.device)
    else:
        pattern = p.transpose(1, 2)
    z = pattern[:, :, 0, None] * v_flat.index_select(0, tokens[:, 0] * P)
    for j in range(1, P):
        z.addcmul_(pattern[:, :, j, None], v_flat.index_select(0, tokens[:, j] * P + j))
    return R.flatten(0, 1), R[:, -1].index_select(0, tokens[:, -1]), pattern, z


def fast_logits(model, tokens: Int[Tensor, "batch 3"],
                reuse: tuple[FastEq, Int[Tensor, "batch"]] | None = None) -> Float[Tensor, "batch d_vocab_out"]:
    """Logits [B, d_vocab_out] of `model` (a one-layer GeoTransformer) on tokens [B, 3].

    Equal to model(tokens)[:, -1] up to float rounding and differentiable w.r.t. the model's own
    parameters (loss.backward() fills their .grad as the hooked forward would). Every row must
    carry the same token at position 2 (the `=` of every task). Use under torch.no_grad() for
    evaluation. Index work that depends only on `tokens` is cached while the same (unmodified)
    tensor is passed again, e.g. the training set every epoch.

    reuse=(eq, rows): eq = fast_eq_forward(model, all_tokens) with the current parameters and
    tokens == all_tokens[rows]: the per-example forward is gathered from eq instead of recomputed
    (the tables are rebuilt with autograd; the backward is unchanged). rows None: tokens ==
    all_tokens, and eq's own tensors are the forward (the backward reads them: leave eq's values
    unmodified until it has run; it does not modify 'resid_post' nor 'mlp_post').
    """
    reason = fast_unsupported_reason(model.cfg)
    if reason is not None:
        raise GeoError(f"fast path unsupported: {reason}")
    if tokens.dim() == 2 and tokens.shape[0] == 0:
        return model(tokens)[:, -1]
    params = {name: p.unsqueeze(0) for name, p in model.named_parameters()}
    if reuse is None:
        return stacked_fast_logits(model.cfg, params, [tokens], model.unembed.tau)[0]
    eq, rows = reuse
    if eq.versions != _param_versions(model) or not torch.equal(eq.tokens if rows is None else eq.tokens[rows], tokens):
        raise GeoError("fast_logits(reuse=...) needs a fast_eq_forward of this model's current parameters and "
                       "tokens == its tokens[rows]")
    _check(model.cfg, [tokens])
    return _apply(model.cfg, params, [tokens], model.unembed.tau, eq.forward if rows is None else eq.forward.rows(rows))[0]
