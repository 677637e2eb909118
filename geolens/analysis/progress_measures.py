"""Nanda-style progress measures: restricted / excluded loss, weight norm, logit cos coefficients,
and the paper's truncated-logit accuracy.

Logit "blocks" are [n, n, n] tensors: inputs as a grid (a position, b position) and classes, all
in group order (fourier.CyclicFrame.block). For multiplication the block covers the inputs with
a, b != 0 and the classes 1..p-1 in discrete-log order; the class-0 logit is left unchanged and
inputs containing 0 are not evaluated (they are not in the group).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn as nn
from jaxtyping import Float, Int
from torch import Tensor

from geolens.analysis.fourier import CyclicFrame, basis_freqs, diagonal_sums, fourier_basis


# ---- projections on the cos / sin (w_k s) directions, s the label position ---------------------
def key_projectors(n: int, freqs: Tensor) -> Float[Tensor, "m n n"]:
    """Orthogonal projector on each key's directions, written on label positions (float64).

    The directions of key k are the unit vectors in R^{n^2} (one entry per grid cell) along
    cos(w_k s) and sin(w_k s), s the label position of the cell; a wave that vanishes (the sine
    for k = 0 or for the Nyquist frequency of even n) is left out. For addition these are Nanda's
    u_cos,k = (c_k (x) c_k - s_k (x) s_k) / sqrt 2 and u_sin,k = (s_k (x) c_k + c_k (x) s_k) / sqrt 2.
    Each label position covers n cells, so a wave w(s) has squared norm n |w|^2 over the grid and
    the projection of a grid vector y onto the directions is, at every cell with label s,
    sum_t P[s, t] Y[t] with Y = fourier.diagonal_sums(y) and P[s, t] = sum_w w[s] w[t] / (n |w|^2).
    """
    x = torch.arange(n, dtype=torch.float64)
    out = torch.zeros(len(freqs), n, n, dtype=torch.float64)
    for r, k in enumerate(freqs.tolist()):
        phase = 2 * math.pi * k * x / n
        for wave in (torch.cos(phase), torch.sin(phase)):
            sq = float(wave.square().sum())
            if math.sqrt(n * sq) > 1e-9:
                out[r] += torch.outer(wave, wave) / (n * sq)
    return out


@dataclass(frozen=True)
class KeyProjections:
    """Projections of the class columns of a logit block (over the n^2 inputs) on key directions.

    Key directions are functions of the label position s alone, and so are the projections:
    per_key[r, s, c] is the projection of class column c (group order) on the directions of the
    r-th key (in the order of freqs) at every input with label position s; projections of
    distinct frequencies are orthogonal, so the projection on several is their sum.
    class_mean[c] is the mean of column c over the n^2 inputs.
    """

    class_mean: Float[Tensor, "n"]
    per_key: Float[Tensor, "m n n"]


def key_projections(block: Float[Tensor, "n n n"], frame: CyclicFrame, freqs: Tensor) -> KeyProjections:
    """KeyProjections of a logit block (frame.block(logits)) on the keys `freqs`: one pass over
    the block (its diagonal sums [n, n]), then an [m, n, n] @ [n, n] product."""
    n = frame.n
    sums = diagonal_sums(block, frame.sign)  # [s, c]
    per_key = key_projectors(n, freqs).to(block.dtype) @ sums
    return KeyProjections(sums.sum(0) / (n * n), per_key)


def _split_means(per_input: Float[Tensor, "... n n"], frame: CyclicFrame, split_masks: dict[str, Tensor]) -> dict[str, Tensor]:
    """Mean of per-input values laid out as frame.label_rows ([..., s, i]) over each split (masks
    over dataset rows); NaN for a split without grid inputs."""
    flat = per_input.flatten(-2)
    out = {}
    for name, mask in split_masks.items():
        w = mask[frame.label_rows].flatten().to(flat.dtype)
        out[name] = (flat * w).sum(-1) / w.sum()  # 0 / 0 = NaN for an empty split
    return out


def restricted_loss(
    logits: Float[Tensor, "N p"], frame: CyclicFrame, freqs: Tensor, split_masks: dict[str, Tensor], projs: KeyProjections | None = None
) -> dict[str, float]:
    """Cross-entropy of the restricted logits (key-direction part + per-class mean over inputs)
    on each split; split_masks are [N] bool masks over dataset rows. Returns {split: loss}; the
    paper-standard number is the 'test' one. projs: key_projections(frame.block(logits), frame,
    freqs) if already computed.

    The restricted group logits depend on the input only through its label position s
    (kept[s, c]), so the cross-entropy is one value per s; classes outside the group (class 0
    for mul) keep each input's own logit and still count in the softmax.
    """
    projs = key_projections(frame.block(logits), frame, freqs) if projs is None else projs
    n = frame.n
    kept = projs.class_mean + projs.per_key.sum(0)  # [s, c]
    lse = torch.logsumexp(kept, dim=1)[:, None].expand(n, n)  # [s, i]
    extra = frame.extra_classes
    if extra.numel():
        lse = torch.logsumexp(torch.cat([lse[..., None], logits[frame.label_rows[..., None], extra]], dim=-1), dim=-1)
    per_input = lse - kept.diagonal()[:, None]  # the label of an input at s is group class s
    return {name: float(v) for name, v in _split_means(per_input, frame, split_masks).items()}


def _shifted_cross_entropy(
    logits: Float[Tensor, "N p"], frame: CyclicFrame, shifts: Float[Tensor, "V n n"]
) -> Float[Tensor, "V n n"]:
    """Per-input cross-entropy when shifts[v, s, c] is subtracted from the logit of group class c
    of every input with label position s, for V shifts at once; laid out as frame.label_rows.

    Classes outside the group keep their logits. With m the row max of the logits and q[v, s]
    the max of -shifts[v, s], logsumexp(l - shift) = m + q + log(sum_c e^(l_c - m) e^(-shift_c - q)):
    one exp over the [n^2, p] logits, and the sums are a batched [n, p] @ [p, V] product per
    label position. Where a sum is too small to trust (its largest term may be subnormal), that
    logsumexp is recomputed directly.
    """
    n, p = frame.n, frame.p
    V = shifts.shape[0]
    e = logits.index_select(0, frame.label_rows.flatten())  # [n*n, p] rows (s, i), token order
    label = frame.order[:, None].expand(n, n).reshape(-1, 1)  # the label of an input at s is order[s]
    correct = e.gather(1, label).view(n, 1, n) - shifts.diagonal(dim1=1, dim2=2).T[:, :, None]  # [s, v, i]
    full = shifts.new_zeros(V, n, p)
    full[..., frame.order] = shifts
    m = e.amax(dim=1, keepdim=True)
    e.sub_(m).exp_()  # e^(l - m) <= 1
    q = full.neg().amax(dim=2, keepdim=True)  # [V, n, 1]
    w = torch.exp(full.neg() - q).transpose(0, 1)  # [s, v, c]: e^(-shift - q) <= 1
    sums = torch.bmm(w, e.view(n, n, p).transpose(1, 2))  # [s, v, i]
    lse = torch.log(sums).add_(m.view(n, 1, n)).add_(q[..., 0].T[:, :, None])
    low = sums < p * torch.finfo(sums.dtype).tiny / torch.finfo(sums.dtype).eps
    if low.any():
        s, v, i = low.nonzero(as_tuple=True)
        lse[s, v, i] = torch.logsumexp(logits[frame.label_rows[s, i]] - full[v, s], dim=1)
    return (lse - correct).transpose(0, 1)  # [v, s, i]


def excluded_loss(
    logits: Float[Tensor, "N p"], frame: CyclicFrame, freqs: Tensor, split_masks: dict[str, Tensor], projs: KeyProjections | None = None
) -> dict[str, dict[str, float]]:
    """Cross-entropy of the excluded logits (key-direction part removed): all key frequencies at
    once ('all') and each key frequency alone (keyed by rank '1', '2', ... in the order of freqs).

    Returns {split: {'all': loss, '1': loss, ...}}; the paper-standard number is train/'all'.
    projs: key_projections(frame.block(logits), frame, freqs) if already computed.
    """
    projs = key_projections(frame.block(logits), frame, freqs) if projs is None else projs
    per_key = projs.per_key
    shifts = torch.cat([per_key.sum(0, keepdim=True), per_key])  # [1 + m, n, n]: 'all', then each key
    names = ["all"] + [str(r + 1) for r in range(per_key.shape[0])]
    means = _split_means(_shifted_cross_entropy(logits, frame, shifts), frame, split_masks)
    return {split: dict(zip(names, v.tolist())) for split, v in means.items()}


# ---- weights ---------------------------------------------------------------------------------
def weight_norm(model: nn.Module) -> dict[str, float]:
    """Sum of squared parameters: {'total_sq', 'frobenius' (its square root), '<param name>': sq}."""
    per = {name: float(p.detach().double().square().sum()) for name, p in model.named_parameters()}
    total = sum(per.values())
    return {"total_sq": total, "frobenius": math.sqrt(total), **per}


# ---- logit coefficients on cos(w (a + b - c)) ---------------------------------------------------
def logit_cos_coeff(block: Float[Tensor, "n n n"], sign: int = 1) -> Float[Tensor, "K"]:
    """Least-squares coefficient of the logits on cos(w_k (a + sign*b - c)) for every k = 1..n//2.

    coef_k = <L, cos(w_k(a + sign b - c))> / ||cos(w_k(a + sign b - c))||^2 over the n^3 cube.
    The cube of cosines is never built: the wave depends on (a, b) only through
    s = (a + sign b) mod n, so the inner product is sum_{s,c} D[s, c] cos(w_k (s - c)) with D the
    diagonal sums of the block (fourier.diagonal_sums, [n, n]), and
    cos(w(s - c)) = cos(ws) cos(wc) + sin(ws) sin(wc): O(n^3) time for D, O(n^3) for all k.
    """
    n = block.shape[0]
    K = n // 2
    D = diagonal_sums(block, sign)  # [s, c]
    phase = 2 * math.pi * torch.arange(1, K + 1, dtype=torch.float64)[:, None] * torch.arange(n, dtype=torch.float64) / n
    num = torch.zeros(K, dtype=D.dtype)
    for wave in (torch.cos(phase).to(D.dtype), torch.sin(phase).to(D.dtype)):  # [K, n]
        num += ((wave @ D) * wave).sum(1)
    norm_sq = torch.full((K,), n**3 / 2, dtype=num.dtype)
    if n % 2 == 0:
        norm_sq[-1] = n**3
    return num / norm_sq


# ---- the paper's causal check -------------------------------------------------------------------
def truncated_logit_accuracies(
    logits: Float[Tensor, "M n"], labels: Int[Tensor, "M"], masks: dict[str, Tensor], k: int = 5
) -> dict[str, tuple[float, Int[Tensor, "k"]]]:
    """truncated_logit_accuracy for several subsets of the examples ({name: [M] bool mask}) from
    one transform: {name: (accuracy, kept non-DC bins strongest first)}; NaN for an empty subset.

    Computed on the real orthonormal basis instead of rfft / irfft: with C = logits @ F[1:].T the
    coefficients on the cos f / sin f rows, the rfft energy of bin f is
    |X_f|^2 = (n/2) (C_cos f^2 + C_sin f^2) (n C^2 for the Nyquist bin of even n), and keeping the
    DC bin and the top-k bins then inverting gives mean(x) + C[:, kept] @ F[kept]. The DC term is
    the same for every class, so the argmax is taken without it.
    """
    n = logits.shape[-1]
    waves = fourier_basis(n, logits.dtype)[1:]  # [n - 1, n]: cos 1, sin 1, ..., (cos n/2)
    bin_of = basis_freqs(n)[1:] - 1  # [n - 1]: bin (frequency - 1) of each wave
    weight = torch.where(2 * (bin_of + 1) == n, n, n / 2).to(logits.dtype)
    coef = logits @ waves.T  # [M, n - 1]
    power = coef.square()
    out = {}
    for name, mask in masks.items():
        energy = torch.zeros(n // 2, dtype=power.dtype).index_add_(0, bin_of, (mask.to(power.dtype) @ power) * weight)
        bins = energy.topk(min(k, energy.numel())).indices
        cols = torch.isin(bin_of, bins)
        trunc = coef[:, cols][mask] @ waves[cols]
        acc = float((trunc.argmax(-1) == labels[mask]).float().mean()) if mask.any() else float("nan")
        out[name] = (acc, bins + 1)
    return out


def truncated_logit_accuracy(
    logits: Float[Tensor, "M n"], labels: Int[Tensor, "M"], k: int = 5
) -> tuple[float, Int[Tensor, "k"]]:
    """Accuracy after keeping only the DC bin and the top-k bins of the logits' rfft over classes.

    Bins are ranked by their energy summed over the given examples (DC excluded from the
    ranking). Classes must be in group order and `labels` are group positions.
    Returns (accuracy, kept non-DC bins strongest first). See truncated_logit_accuracies.
    """
    return truncated_logit_accuracies(logits, labels, {"all": torch.ones(len(labels), dtype=torch.bool)}, k)["all"]
