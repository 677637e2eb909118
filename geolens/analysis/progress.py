"""Nanda-style progress measures: restricted / excluded loss, weight norm, logit cos coefficients,
and the paper's truncated-logit accuracy.

Logit "blocks" are [n, n, n] tensors: inputs as a grid (a position, b position) and classes, all
in group order (fourier.CyclicFrame.block). For multiplication the block covers the inputs with
a, b != 0 and the classes 1..p-1 in discrete-log order; the class-0 logit is left unchanged and
inputs containing 0 are not evaluated (they are not in the group).
"""

from __future__ import annotations

import math

import torch
import torch.nn as nn
from jaxtyping import Float, Int
from torch import Tensor

from geolens.analysis.fourier import CyclicFrame, sum_waves


# ---- projections on the cos / sin (w_k (a + b)) directions ------------------------------------
def key_directions(frame: CyclicFrame, freqs: Tensor, dtype: torch.dtype = torch.float32) -> Float[Tensor, "n2 m"]:
    """Unit vectors in R^{n^2} (grid flattened i-major) along cos(w_k s) and sin(w_k s), s the label
    position, for every k in freqs (m = 2 per frequency; 1 for the Nyquist frequency of even n).

    For addition these are Nanda's u_cos,k = (c_k (x) c_k - s_k (x) s_k) / sqrt 2 and
    u_sin,k = (s_k (x) c_k + c_k (x) s_k) / sqrt 2 with c_k, s_k the orthonormal basis rows.
    Directions of distinct frequencies are orthogonal, so the projection is a sum.
    """
    cols = []
    for k in freqs.tolist():
        for wave in sum_waves(frame, int(k), torch.float64):
            norm = wave.norm()
            if norm > 1e-9:
                cols.append((wave / norm).flatten())
    if not cols:
        return torch.zeros(frame.n * frame.n, 0, dtype=dtype)
    return torch.stack(cols, dim=1).to(dtype)


def project_on(block: Float[Tensor, "n n C"], dirs: Float[Tensor, "n2 m"]) -> Float[Tensor, "n n C"]:
    """Projection of every class column of the block onto span(dirs)."""
    n = block.shape[0]
    flat = block.reshape(n * n, -1)
    return (dirs @ (dirs.T @ flat)).reshape(block.shape)


def restricted_block(block: Float[Tensor, "n n C"], dirs: Tensor) -> Float[Tensor, "n n C"]:
    """Keep only the key-direction part of the logits, plus the per-class mean over inputs."""
    return block.mean(dim=(0, 1), keepdim=True) + project_on(block, dirs)


def excluded_block(block: Float[Tensor, "n n C"], dirs: Tensor) -> Float[Tensor, "n n C"]:
    """Remove the key-direction part of the logits."""
    return block - project_on(block, dirs)


def key_projections(block: Float[Tensor, "n n C"], frame: CyclicFrame, freqs: Tensor) -> list[Float[Tensor, "n2 C"]]:
    """Projection of the block's class columns on the directions of each frequency, one
    [n^2, C] tensor per frequency (the projections of distinct frequencies are orthogonal, so the
    projection on several is their sum)."""
    flat = block.reshape(frame.n * frame.n, -1)
    out = []
    for k in freqs.tolist():
        dirs = key_directions(frame, torch.tensor([k]), block.dtype)
        out.append(dirs @ (dirs.T @ flat))
    return out


def group_cross_entropy(
    logits: Float[Tensor, "N p"], frame: CyclicFrame, group_logits: Float[Tensor, "n2 n"]
) -> Float[Tensor, "n2"]:
    """Per-input cross-entropy over the grid's inputs when the group-class logits are replaced by
    group_logits (flattened grid order). Classes outside the group (class 0 for mul) keep their
    original logits and still count in the softmax; every grid input's label is a group class."""
    extra = frame.extra_classes
    full = group_logits
    if extra.numel():
        full = torch.cat([group_logits, logits[frame.grid_rows.flatten()][:, extra]], dim=1)
    correct = group_logits.gather(1, frame.label_pos.flatten()[:, None])[:, 0]
    return torch.logsumexp(full, dim=1) - correct


def _split_means(per_input: Tensor, frame: CyclicFrame, split_masks: dict[str, Tensor]) -> dict[str, float]:
    """Mean of a per-grid-input value over each split (masks over dataset rows)."""
    rows = frame.grid_rows.flatten()
    out = {}
    for name, mask in split_masks.items():
        m = mask[rows]
        out[name] = float(per_input[m].mean()) if m.any() else float("nan")
    return out


def restricted_loss(
    logits: Float[Tensor, "N p"], frame: CyclicFrame, freqs: Tensor, split_masks: dict[str, Tensor], projs=None
) -> dict[str, float]:
    """Cross-entropy of the restricted logits (key-direction part + per-class mean over inputs)
    on each split; split_masks are [N] bool masks over dataset rows. Returns {split: loss}; the
    paper-standard number is the 'test' one. projs: key_projections(frame.block(logits), frame,
    freqs) if already computed."""
    block = frame.block(logits)
    n = frame.n
    projs = key_projections(block, frame, freqs) if projs is None else projs
    kept = block.mean(dim=(0, 1)).expand(n * n, n) + sum(projs)
    return _split_means(group_cross_entropy(logits, frame, kept), frame, split_masks)


def excluded_loss(
    logits: Float[Tensor, "N p"], frame: CyclicFrame, freqs: Tensor, split_masks: dict[str, Tensor], projs=None
) -> dict[str, dict[str, float]]:
    """Cross-entropy of the excluded logits (key-direction part removed): all key frequencies at
    once ('all') and each key frequency alone (keyed by rank '1', '2', ... in the order of freqs).

    Returns {split: {'all': loss, '1': loss, ...}}; the paper-standard number is train/'all'.
    projs: key_projections(frame.block(logits), frame, freqs) if already computed.
    """
    block = frame.block(logits)
    flat = block.reshape(frame.n * frame.n, -1)
    projs = key_projections(block, frame, freqs) if projs is None else projs
    variants = {"all": sum(projs)} if projs else {"all": torch.zeros_like(flat)}
    variants.update({str(r + 1): P for r, P in enumerate(projs)})
    out: dict[str, dict[str, float]] = {name: {} for name in split_masks}
    for key, P in variants.items():
        for name, loss in _split_means(group_cross_entropy(logits, frame, flat - P), frame, split_masks).items():
            out[name][key] = loss
    return out


# ---- weights ---------------------------------------------------------------------------------
def weight_norm(model: nn.Module) -> dict[str, float]:
    """Sum of squared parameters: {'total_sq', 'frobenius' (its square root), '<param name>': sq}."""
    per = {name: float(p.detach().double().square().sum()) for name, p in model.named_parameters()}
    total = sum(per.values())
    return {"total_sq": total, "frobenius": math.sqrt(total), **per}


# ---- logit coefficients on cos(w (a + b - c)) ---------------------------------------------------
def logit_cos_coeff(block: Float[Tensor, "n n n"], sign: int = 1) -> Float[Tensor, "K"]:
    """Least-squares coefficient of the logits on cos(w_k (a + sign*b - c)) for every k = 1..n//2.

    coef_k = <L, cos(w_k(a + b - c))> / ||cos(w_k(a + b - c))||^2 over the n^3 cube. The cube of
    cosines is never built: cos is the real part of e^{-i w a} e^{-i w b} e^{+i w c}, a product of
    one factor per axis, so the inner product is a DFT over a (rfft), then a sum over b with
    e^{-i w b}, then a sum over c with e^{+i w c}: O(n^3 log n) time, O(n^3) memory (the block).
    """
    n = block.shape[0]
    K = n // 2
    Y = torch.fft.rfft(block, dim=0)[1:]  # [K, n(b), n(c)]: sum_a L e^{-i w_k a}
    k = torch.arange(1, K + 1, dtype=torch.float64)[:, None]
    x = torch.arange(n, dtype=torch.float64)[None, :]
    phase = 2 * math.pi * k * x / n  # [K, n]
    e_b = torch.polar(torch.ones_like(phase), -sign * phase).to(Y.dtype)
    e_c = torch.polar(torch.ones_like(phase), phase).to(Y.dtype)
    Z = torch.einsum("kbc,kb->kc", Y, e_b)
    num = (Z * e_c).sum(-1).real
    norm_sq = torch.full((K,), n**3 / 2, dtype=num.dtype)
    if n % 2 == 0:
        norm_sq[-1] = n**3
    return num / norm_sq


# ---- the paper's causal check -------------------------------------------------------------------
def truncated_logit_accuracy(
    logits: Float[Tensor, "M n"], labels: Int[Tensor, "M"], k: int = 5
) -> tuple[float, Int[Tensor, "k"]]:
    """Accuracy after keeping only the DC bin and the top-k bins of the logits' rfft over classes.

    Bins are ranked by their energy summed over the given examples (DC excluded from the
    ranking). Classes must be in group order and `labels` are group positions.
    Returns (accuracy, kept non-DC bins strongest first).
    """
    n = logits.shape[-1]
    X = torch.fft.rfft(logits, dim=-1)
    energy = (X.real.square() + X.imag.square()).sum(0)
    energy[0] = -1.0
    bins = energy.topk(min(k, energy.numel() - 1)).indices
    keep = torch.zeros(energy.numel(), dtype=torch.bool)
    keep[0] = True
    keep[bins] = True
    trunc = torch.fft.irfft(X * keep, n=n, dim=-1)
    return float((trunc.argmax(-1) == labels).float().mean()), bins
