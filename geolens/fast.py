"""Fast exact training path for the one-layer GeoTransformer (`fast_logits`).

With one layer only the `=` position (2) reaches the logits, and the residual after the
embedding depends only on (token, position). So everything before the MLP is built from small
per-token tables (ordinary autograd, once per call; V = d_vocab, R = 2V+1 rows: [0, V) the token
at position 0, [V, 2V) the token at position 1, 2V the `=` row):

    T    = N1(W_E[tok] + W_pos[pos])                         [R, D]
    S    = T @ (W_K[h] q[h]) / sqrt(dh),  q = T[2V] @ W_Q    [R, H]     scores of the `=` query
    VO   = T @ W_V[h] @ W_O[h]                               [R, H, D]  value-output rows
    Tab  = VO[r, h] - VO[2V, h] for r < 2V, and the row T[2V] + sum_h VO[2V, h]   [2V*H + 1, D]

(the softmax weights sum to 1, so the `=` key's rows fold into one constant row; with uniform
attention the heads are summed and weighted 1/3 in the table). Per example (`_Body`, an
autograd.Function with a hand-written backward; a, b the tokens at positions 0, 1):

    p    = softmax over keys (a, b, =) of S[a], S[V+b], S[2V]        [B, 3, H]
    x    = Tab[const] + sum_h p_a,h Tab[a, h] + p_b,h Tab[V+b, h]    [B, D]   (embedding_bag)
    h    = N2(x);  pre = h @ W_in + b_in = s(x) * (x @ Wt) + k       [B, Dm]
    h3   = N3(h + relu(pre) @ W_out + b_out)                         [B, D]
    out  = h3 @ Wr   (W_U, or tau * W_U / ||W_U col|| when bounded)  [B, C]

where s(x) is N2's row scale (rstd, 1/||x||) and Wt = N2's gain * W_in (row-centred for
LayerNorm), k = N2's offset @ W_in + b_in: so `pre` is a second embedding bag over the rows
Tab @ Wt (weights scaled by s(x)) instead of a [B, D] x [D, Dm] matmul (TABLE_MLP_INPUT).

Backward: dense matmuls for the readout and the MLP (dL/dW_in from [h | 1]^T dL/dpre), then
dL/dx goes back onto the table rows and the attention weights by grouping the (example, key)
pairs per table row into equal-size chunks (two small bmm's and one index_add). Autograd carries
the table gradients on to W_E, W_pos, N1, W_Q, W_K, W_V, W_O. Causal and non-causal models share
this path (the mask never touches the `=` query); in uniform mode W_Q and W_K stay out of the
graph (grad None), as in the hooked model. The hooked GeoTransformer stays the source of truth:
tests/test_fast.py checks logits and every parameter gradient against it.

Exactness: same float32 math in a different order, so logits agree to ~1e-7 relative and the
pre-activations are as close to a float64 reference as the hooked model's are. Gradients agree
to ~1e-6, except that a ReLU unit whose pre-activation lies within rounding error of 0 (|pre| ~
1e-8) can fall on the other side of the kink than in the hooked model; at p = 113 a full batch
has ~2M units and one such unit shifts W_in's gradient by up to ~1e-4 relative. Neither side is
more accurate than the other (the hooked model flips as many units against float64).

For a later stacked (many-seed) version: every per-example op is a gather from a table, a
last-axis reduction or a (b)mm, so a leading member dimension maps onto offset row indices into
flattened tables and bmm.
"""

from __future__ import annotations

import math
import weakref
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor

from geolens.config import ATTENTIONS, NORMS, UNEMBEDS, GeoConfig
from geolens.errors import GeoError

__all__ = ["fast_unsupported_reason", "fast_logits", "fast_flops"]

#: compute the MLP input layer as a second embedding bag over Tab @ Wt (True) or as the dense
#: matmul [h | 1] @ [W_in; b_in] (False); both are exact, the bag does ~16x fewer multiply-adds.
TABLE_MLP_INPUT = True


def fast_unsupported_reason(cfg: GeoConfig) -> str | None:
    """None when `fast_logits` computes this model exactly, else a one-line reason."""
    if cfg.n_layers != 1:
        return f"n_layers = {cfg.n_layers}; the fast path needs n_layers == 1"
    if cfg.n_ctx != 3:
        return f"n_ctx = {cfg.n_ctx}; the fast path needs [a, b, =] inputs (n_ctx == 3)"
    if cfg.norm not in NORMS or cfg.unembed not in UNEMBEDS or cfg.attention not in ATTENTIONS:
        return f"unknown topology (norm={cfg.norm}, unembed={cfg.unembed}, attention={cfg.attention})"
    return None


def fast_flops(cfg: GeoConfig, n_examples: int, backward: bool = True) -> dict[str, int]:
    """FLOPs (2 x multiply-adds) of the matmul-like work of one fast forward (+ backward).

    'dense': per-example matmuls: forward relu(pre) @ W_out and h3 @ Wr (plus [h | 1] @ W_in_aug
    when not TABLE_MLP_INPUT); backward two per forward matmul of the readout and W_out, plus
    [h | 1]^T dL/dpre and dL/dpre @ W_in^T. 'bags': the embedding bags (rows of d_model, and of
    d_mlp for the MLP input). 'attention': the grouped backward onto the table rows and the
    pattern (learned attention only). 'tables': per-token table matmuls (x3 for those with
    gradients when backward). Elementwise work and chunk padding are not counted.
    """
    B, D, Dm, C, H, dh = n_examples, cfg.d_model, cfg.d_mlp, cfg.d_vocab_out, cfg.n_heads, cfg.d_head
    R = 2 * cfg.d_vocab + 1
    uniform = cfg.attention == "uniform"
    mult = 3 if backward else 1
    dense = 2 * B * (Dm * D + D * C) * mult + (0 if TABLE_MLP_INPUT else 2 * B * (D + 1) * Dm)
    if backward:
        dense += 2 * B * 2 * (D + 1) * Dm
    slots = 3 if uniform else 2 * H + 1
    bags = 2 * B * slots * D + (2 * B * (slots + 1) * Dm if TABLE_MLP_INPUT else 0)
    attention = 0 if uniform or not backward else 2 * (2 * B) * H * D * 2
    if uniform:
        grad_tables = R * D * D + H * dh * D * D
        mlp_table = R * D * Dm
    else:
        grad_tables = R * D * H * dh + R * H * dh * D + R * D * H + 2 * D * H * dh
        mlp_table = H * dh * D * Dm + R * H * dh * Dm
    tables = 2 * (mult * grad_tables + (mlp_table + D * Dm if TABLE_MLP_INPUT else 0))
    return {"dense": dense, "bags": bags, "attention": attention, "tables": tables}


@dataclass(frozen=True)
class _Spec:
    """Static facts the per-example Function needs."""

    norm: str
    eps: float
    n_heads: int
    d_vocab: int
    d_mlp: int
    uniform: bool


def _norm_eps(cfg: GeoConfig) -> float:
    return {"layernorm": cfg.ln_eps, "rmsnorm": cfg.rms_eps, "sphere": cfg.sphere_eps}.get(cfg.norm, 0.0)


def _norm_params(mod) -> tuple[Tensor | None, Tensor | None]:
    return getattr(mod, "w", None), getattr(mod, "b", None)


# ---- norms ------------------------------------------------------------------------------------
def _norm_autograd(kind: str, x: Float[Tensor, "... d"], w: Tensor | None, b: Tensor | None, eps: float) -> Tensor:
    """The model's post-norm N(x) with autograd (used on the [R, D] table only)."""
    if kind == "layernorm":
        return F.layer_norm(x, (x.shape[-1],), w, b, eps)
    if kind == "rmsnorm":
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w
    if kind == "sphere":
        return x / torch.linalg.vector_norm(x, dim=-1, keepdim=True).clamp_min(eps)
    return x


def _norm_fwd(kind: str, x: Float[Tensor, "B d"], w: Tensor | None, b: Tensor | None, eps: float):
    """(N(x) [B, d], a [B, 1] or None, saved for _norm_bwd); a is the row scale of the norm
    (rstd for LayerNorm/RMSNorm, 1/max(||x||, eps) for the sphere, None for 'none')."""
    d = x.shape[-1]
    if kind == "layernorm":
        out, mean, rstd = torch.native_layer_norm(x, (d,), w, b, eps)
        return out, rstd, (x, mean, rstd)
    if kind == "rmsnorm":
        rstd = torch.linalg.vector_norm(x, dim=-1, keepdim=True).square_().div_(d).add_(eps).rsqrt_()
        n = x * rstd
        return n * w, rstd, (n, rstd)
    if kind == "sphere":
        norm = torch.linalg.vector_norm(x, dim=-1, keepdim=True)
        a = norm.clamp_min(eps).reciprocal_()
        out = x * a
        return out, a, (out, a, norm >= eps)
    return x, None, ()


def _norm_bwd(kind: str, g: Float[Tensor, "B d"], saved, w, b, need_w: bool, need_b: bool):
    """(dL/dx [B, d], dL/dw or None, dL/db or None) for the norm whose forward saved `saved`."""
    d = g.shape[-1]
    if kind == "layernorm":
        x, mean, rstd = saved
        return torch.ops.aten.native_layer_norm_backward(g, x, [d], mean, rstd, w, b, [True, need_w, need_b])
    if kind == "rmsnorm":
        n, rstd = saved  # out = n * w, n = x * rstd
        gw = (g * n).sum(0) if need_w else None
        gn = g * w
        dot = (gn * n).mean(-1, keepdim=True)
        return gn.sub_(n * dot).mul_(rstd), gw, None
    if kind == "sphere":
        out, a, unclamped = saved  # out = x * a, a = 1 / max(||x||, eps)
        dot = (g * out).sum(-1, keepdim=True).mul_(unclamped)
        return (g - out * dot).mul_(a), None, None
    return g, None, None


# ---- token-dependent indices (cached per tokens tensor) ----------------------------------------
class _Plan:
    """Everything about a batch that depends only on its tokens.

    rows [2B]: table row of every (example, position) entry, r = a for position 0 and V + b for
    position 1. slots [B, n]: the embedding bag's rows (see _Body); slots2 [B, n+1]: the same plus
    the k row of Tab2. The chunk grouping used by the backward is built on first use.
    """

    def __init__(self, tokens: Int[Tensor, "B 3"], V: int, H: int, uniform: bool):
        B, dev = tokens.shape[0], tokens.device
        self.B, self.V, self.H = B, V, H
        self.eq = int(tokens[0, 2])
        self.same_eq = not bool((tokens[:, 2] != self.eq).any())
        t0, t1 = tokens[:, 0].contiguous(), tokens[:, 1] + V
        self.rows = torch.cat((t0, t1))
        if uniform:  # Tab rows r in [0, 2V), then the constant row 2V
            self.slots = torch.stack((t0, t1, torch.full_like(t0, 2 * V)), 1)
        else:  # Tab rows r * H + h, then the constant row 2V * H
            ar = torch.arange(H, device=dev)
            self.slots = torch.cat((t0[:, None] * H + ar, t1[:, None] * H + ar, torch.full_like(t0, 2 * V * H)[:, None]), 1)
        n_tab = int(self.slots[0, -1]) + 1
        self.slots2 = torch.cat((self.slots, torch.full_like(t0, n_tab)[:, None]), 1)  # + the k row of Tab2
        self._chunks = None

    def chunks(self):
        """(members [n_chunks*c] entry ids (padding 2B), ex [n_chunks*c] example ids (padding 0),
        chunk_row [n_chunks], slot [2B], (n_chunks, c)): entries grouped by table row into chunks of
        c, chosen to keep both the padding and the number of chunks small."""
        if self._chunks is None:
            rows, N = self.rows, self.rows.shape[0]
            counts = torch.bincount(rows, minlength=2 * self.V)
            n_max = int(counts.max())
            best = None
            for cand in sorted({n_max, 8, 16, 24, 32, 48, 64, 96}):
                if cand <= n_max:
                    n_ch = int(((counts + (cand - 1)) // cand).sum())
                    cost = n_ch * (cand + 3 * self.H)  # entries gathered + table rows gathered/accumulated
                    if best is None or cost < best[0]:
                        best = (cost, cand)
            c = best[1]
            n_ch = (counts + (c - 1)) // c
            order = torch.argsort(rows, stable=True)
            srows = rows[order]
            rank = torch.arange(N, device=rows.device) - (torch.cumsum(counts, 0) - counts)[srows]
            pos = ((torch.cumsum(n_ch, 0) - n_ch)[srows] + torch.div(rank, c, rounding_mode="floor")) * c + rank % c
            n_chunks = int(n_ch.sum())
            members = torch.full((n_chunks * c,), N, dtype=torch.long, device=rows.device)
            members[pos] = order
            slot = torch.empty_like(pos)
            slot[order] = pos
            ex = torch.where(members < N, members % self.B, 0)
            chunk_row = torch.repeat_interleave(torch.arange(2 * self.V, device=rows.device), n_ch)
            self._chunks = (members, ex, chunk_row, slot, (n_chunks, c))
        return self._chunks


_PLANS: dict[int, tuple] = {}
MAX_PLANS = 32  # a batched sweep holds a train and a test tokens tensor per member: 16 members fit


def _plan(tokens: Tensor, V: int, H: int, uniform: bool) -> _Plan:
    """The _Plan of `tokens`, reused while the same tensor object is passed unmodified."""
    sig = (tokens._version, tuple(tokens.shape), tokens.device, V, H, uniform)
    hit = _PLANS.get(id(tokens))
    if hit is not None and hit[0]() is tokens and hit[1] == sig:
        return hit[2]
    plan = _Plan(tokens, V, H, uniform)
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[id(tokens)] = (weakref.ref(tokens), sig, plan)
    return plan


# ---- the per-example part ---------------------------------------------------------------------
class _Body(torch.autograd.Function):
    """Per-example part of the fast forward (see the module docstring).

    Inputs: plan (_Plan), spec (_Spec); S [R, H] scores of the `=` query (None if uniform);
    Tab [n_tab, D] rows whose weighted sum is x, the residual at `=` after attention (learned:
    row r*H + h = VO[r, h] - VO[2V, h] for r in [0, 2V), then the constant row
    T[2V] + sum_h VO[2V, h]; uniform: row r = sum_h VO[r, h] / 3 for r in [0, 2V), then
    T[2V] + sum_h VO[2V, h] / 3; VO[r, h] = T[r] @ W_V[h] @ W_O[h]);
    Tab2 [n_tab + 1, Dm] or None (no grad): Tab @ Wt plus the row k, for the MLP-input bag;
    W_in_aug [D+1, Dm] = [W_in; b_in]; w2, b2 (N2 params or None); W_out [Dm, D]; b_out [D];
    w3, b3 (N3 params or None); Wr [D, C]. Output: logits [B, C].
    """

    @staticmethod
    def forward(ctx, plan, spec, S, Tab, Tab2, W_in_aug, w2, b2, W_out, b_out, w3, b3, Wr):
        B, H, V = plan.B, spec.n_heads, spec.d_vocab
        p = None
        if spec.uniform:
            x = F.embedding_bag(plan.slots, Tab, mode="sum")
        else:
            # softmax of the `=` query over its keys (a, b, =), per head: p [B, 3, H]
            s = torch.stack((S.index_select(0, plan.rows[:B]), S.index_select(0, plan.rows[B:]), S[2 * V].expand(B, H)), 1)
            p = (s - s.amax(1, keepdim=True)).exp_()
            p /= p.sum(1, keepdim=True)
            w = torch.empty(B, 2 * H + 1, dtype=p.dtype, device=p.device)  # [p0 | p1 | 1]
            w[:, : 2 * H] = p[:, :2].reshape(B, 2 * H)
            w[:, 2 * H] = 1.0
            x = F.embedding_bag(plan.slots, Tab, per_sample_weights=w, mode="sum")
        h, a, st2 = _norm_fwd(spec.norm, x, w2, b2, spec.eps)
        h_aug = torch.empty(B, h.shape[1] + 1, dtype=h.dtype, device=h.device)  # [h | 1]
        h_aug[:, -1] = 1.0
        h_aug[:, :-1] = h
        if Tab2 is None:
            pre = torch.mm(h_aug, W_in_aug)
        elif a is None and spec.uniform:
            pre = F.embedding_bag(plan.slots2, Tab2, mode="sum")
        else:
            # N2(x) @ W_in + b_in = a * (x @ Wt) + k: the same bag over Tab2 = Tab @ Wt, weights * a, plus k
            n = plan.slots.shape[1]
            w2b = torch.empty(B, n + 1, dtype=x.dtype, device=x.device)
            if spec.uniform:
                w2b[:, :n] = a
            elif a is None:
                w2b[:, :n] = w
            else:
                torch.mul(w, a, out=w2b[:, :n])
            w2b[:, n] = 1.0
            pre = F.embedding_bag(plan.slots2, Tab2, per_sample_weights=w2b, mode="sum")
        post = pre.relu_()
        y = torch.addmm(b_out, post, W_out).add_(h)
        h3, _, st3 = _norm_fwd(spec.norm, y, w3, b3, spec.eps)
        logits = h3 @ Wr
        ctx.plan, ctx.spec = plan, spec
        ctx.st2, ctx.st3 = st2, st3
        ctx.save_for_backward(Tab, p, h_aug, post, h3, W_in_aug, W_out, w2, b2, w3, b3, Wr)
        return logits

    @staticmethod
    def backward(ctx, g_logits):
        plan, spec = ctx.plan, ctx.spec
        Tab, p, h_aug, post, h3, W_in_aug, W_out, w2, b2, w3, b3, Wr = ctx.saved_tensors
        need = ctx.needs_input_grad
        B, H, V = plan.B, spec.n_heads, spec.d_vocab
        D = h_aug.shape[1] - 1
        # readout, N3, MLP (dense)
        g_Wr = h3.T @ g_logits if need[12] else None
        g_y, g_w3, g_b3 = _norm_bwd(spec.norm, g_logits @ Wr.T, ctx.st3, w3, b3, need[10], need[11])
        g_b_out = g_y.sum(0)
        g_W_out = post.T @ g_y
        g_pre = g_y @ W_out.T
        torch.ops.aten.threshold_backward.grad_input(g_pre, post, 0.0, grad_input=g_pre)
        g_W_in_aug = h_aug.T @ g_pre  # [D+1, Dm]: dL/dW_in and dL/db_in
        g_h = torch.addmm(g_y, g_pre, W_in_aug[:D].T)
        del g_pre
        g_x, g_w2, g_b2 = _norm_bwd(spec.norm, g_h, ctx.st2, w2, b2, need[6], need[7])
        # x = sum of the bag's weighted Tab rows
        g_Tab = torch.zeros_like(Tab)
        g_S = None
        if spec.uniform:
            g_Tab.index_add_(0, plan.rows[:B], g_x)
            g_Tab.index_add_(0, plan.rows[B:], g_x)
            g_Tab[2 * V] = g_x.sum(0)
        else:
            g_Tab[2 * V * H] = g_x.sum(0)
            members, ex, chunk_row, slot, shape = plan.chunks()
            G = g_x.index_select(0, ex).view(*shape, D)  # [n_chunks, c, D] rows of g_x per table row
            pw = torch.cat((p[:, 0], p[:, 1], p.new_zeros(1, H))).index_select(0, members).view(*shape, H)
            part = torch.bmm(pw.transpose(1, 2), G)  # [n_chunks, H, D]
            g_Tab[: 2 * V * H].view(2 * V, H * D).index_add_(0, chunk_row, part.view(-1, H * D))
            if need[2]:
                # dL/dp for the keys a, b (the `=` key's rows are folded into the constant row, so its
                # dL/dp is 0 up to a shift the softmax Jacobian ignores)
                trow = Tab[: 2 * V * H].view(2 * V, H, D).index_select(0, chunk_row)  # [n_chunks, H, D]
                g_pk = torch.bmm(G, trow.transpose(1, 2)).view(-1, H).index_select(0, slot)  # [2B, H]
                p0, p1, p2 = p.unbind(1)
                g_p0, g_p1 = g_pk[:B], g_pk[B:]
                dot = p0 * g_p0 + p1 * g_p1
                g_S = torch.zeros((2 * V + 1, H), dtype=dot.dtype, device=dot.device)
                g_S.index_add_(0, plan.rows, torch.cat((p0 * (g_p0 - dot), p1 * (g_p1 - dot))))
                g_S[2 * V] = (p2 * dot).sum(0).neg_()
        return (None, None, g_S, g_Tab, None, g_W_in_aug, g_w2, g_b2, g_W_out, g_b_out, g_w3, g_b3, g_Wr)


# ---- tables and the entry point ---------------------------------------------------------------
def _tables(model, eq: int):
    """Per-token tables with autograd (see _Body for the layout): S (None if uniform), Tab, Wr."""
    cfg = model.cfg
    eps = _norm_eps(cfg)
    H, dh, V, D = cfg.n_heads, cfg.d_head, cfg.d_vocab, cfg.d_model
    W_E, W_pos = model.embed.W_E, model.pos_embed.W_pos
    attn = model.blocks[0].attn
    R_in = torch.cat((W_E + W_pos[0], W_E + W_pos[1], (W_E[eq] + W_pos[2]).unsqueeze(0)))
    T = _norm_autograd(cfg.norm, R_in, *_norm_params(model.embed_norm), eps)  # [R, D]
    t2 = T[-1]
    W_Vf = attn.W_V.permute(1, 0, 2).reshape(D, H * dh)  # [D, H*dh]
    W_Of = attn.W_O.reshape(H * dh, D)  # [H*dh, D]
    S = None
    if cfg.attention == "uniform":
        VO = T @ ((W_Vf @ W_Of) * (1.0 / 3.0))  # [R, D]: sum over heads of T @ W_V[h] @ W_O[h], / 3
        Tab = torch.cat((VO[: 2 * V], VO[2 * V :] + t2))
    else:
        # p2 = 1 - p0 - p1: token rows relative to the `=` row, plus one constant row
        Vrel = (T[: 2 * V] - t2) @ W_Vf  # [2V, H*dh]
        VOrel = torch.bmm(Vrel.view(2 * V, H, dh).transpose(0, 1), attn.W_O)  # [H, 2V, D]
        const = t2 + (t2 @ W_Vf) @ W_Of
        Tab = torch.cat((VOrel.transpose(0, 1).reshape(2 * V * H, D), const.unsqueeze(0)))
        q = torch.einsum("d,hde->he", t2, attn.W_Q)
        u = torch.einsum("hde,he->dh", attn.W_K, q) * (1.0 / math.sqrt(dh))
        S = T @ u
    Tab2 = None
    if TABLE_MLP_INPUT:
        with torch.no_grad():
            blk = model.blocks[0]
            mlp = blk.mlp
            w2, b2 = _norm_params(blk.attn_norm)
            Wt = mlp.W_in if w2 is None else w2[:, None] * mlp.W_in
            if cfg.norm == "layernorm":
                Wt = Wt - Wt.mean(0, keepdim=True)
            k = mlp.b_in if b2 is None else b2 @ mlp.W_in + mlp.b_in
            if cfg.attention == "uniform":
                Tab2 = torch.cat((Tab.detach() @ Wt, k.unsqueeze(0)))
            else:
                M = torch.bmm(Vrel.detach().view(2 * V, H, dh).transpose(0, 1), attn.W_O.detach() @ Wt)  # [H, 2V, Dm]
                Tab2 = torch.cat((M.transpose(0, 1).reshape(2 * V * H, -1), (Tab[-1].detach() @ Wt).unsqueeze(0), k.unsqueeze(0)))
    W_U = model.unembed.W_U
    Wr = cfg.tau * W_U / W_U.norm(dim=0, keepdim=True).clamp_min(1e-12) if cfg.unembed == "bounded" else W_U
    return S, Tab, Tab2, Wr


def fast_logits(model, tokens: Int[Tensor, "batch 3"]) -> Float[Tensor, "batch d_vocab_out"]:
    """Logits [B, d_vocab_out] of `model` (a one-layer GeoTransformer) on tokens [B, 3].

    Equal to model(tokens) up to float rounding and differentiable w.r.t. the model's own
    parameters (loss.backward() fills their .grad as the hooked forward would). Every row must
    carry the same token at position 2 (the `=` of every task). Use under torch.no_grad() for
    evaluation. Index work that depends only on `tokens` is cached while the same (unmodified)
    tensor is passed again, e.g. the training set every epoch.
    """
    cfg = model.cfg
    reason = fast_unsupported_reason(cfg)
    if reason is not None:
        raise GeoError(f"fast path unsupported: {reason}")
    if tokens.dim() != 2 or tokens.shape[1] != 3:
        raise GeoError(f"fast path needs tokens of shape [batch, 3], got {tuple(tokens.shape)}")
    if tokens.shape[0] == 0:
        return model(tokens)
    V, uniform = cfg.d_vocab, cfg.attention == "uniform"
    plan = _plan(tokens, V, cfg.n_heads, uniform)
    if not plan.same_eq:
        raise GeoError("fast path needs the same token at position 2 in every row (the '=' token)")
    S, Tab, Tab2, Wr = _tables(model, plan.eq)
    blk = model.blocks[0]
    mlp = blk.mlp
    spec = _Spec(cfg.norm, _norm_eps(cfg), cfg.n_heads, V, cfg.d_mlp, uniform)
    return _Body.apply(
        plan, spec, S, Tab, Tab2, torch.cat((mlp.W_in, mlp.b_in.unsqueeze(0))),
        *_norm_params(blk.attn_norm), mlp.W_out, mlp.b_out, *_norm_params(blk.mlp_norm), Wr,
    )
