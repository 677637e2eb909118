"""Fraction of variance explained (FVE) of MLP activations by key-frequency waves.

Both functions work on post-ReLU MLP activations at the `=` position over all inputs, arranged as
an n x n grid in group order (fourier.CyclicFrame.grid).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.analysis.fourier import CyclicFrame, diagonal_sums
from geolens.analysis.keyfreq import NEURON_SHARE_MIN
from geolens.threads import single_thread


def class_waves(n: int, freqs: Tensor, dtype: torch.dtype = torch.float32) -> tuple[Tensor, Tensor]:
    """cos(w_k c) and sin(w_k c) over classes c = 0..n-1 (group order), each [len(freqs), n]."""
    c = torch.arange(n, dtype=torch.float64)
    phase = 2 * math.pi * freqs.to(torch.float64)[:, None] * c[None, :] / n
    return torch.cos(phase).to(dtype), torch.sin(phase).to(dtype)


def fve_paper(
    acts_grid: Float[Tensor, "n n d_mlp"],
    W_L: Float[Tensor, "d_mlp n"],
    freqs: Tensor,
    frame: CyclicFrame,
) -> tuple[Float[Tensor, "k"], Float[Tensor, "k"]]:
    """The paper's FVE, in percent, per key frequency: (U [k], V [k]).

    For key k (w_k = 2 pi k / n): u_k = W_L @ cos(w_k c) and v_k = W_L @ sin(w_k c) over classes
    c, two directions in neuron space. The activations are projected on u_k (resp. v_k); the
    centred projection over all n^2 inputs is regressed by least squares on the centred pair
    [cos(w_k s), sin(w_k s)] with s the label position (a + b; a - b for subtraction; log a + log b
    for multiplication); FVE = 100 * (1 - var(residual) / var(projection)). NaN when the
    projection has zero variance.

    The regressors depend on the input only through s and every s covers n inputs, so the normal
    equations need only the diagonal sums of the projections (fourier.diagonal_sums):
    X^T X = n Xs^T Xs and X^T y = Xs^T Y with Xs the centred waves over s ([n, 2]).
    """
    n = frame.n
    cos_c, sin_c = class_waves(n, freqs, W_L.dtype)
    dirs = torch.cat([cos_c @ W_L.T, sin_c @ W_L.T])  # [2k, d_mlp]: u_1..u_k, v_1..v_k
    proj = acts_grid.reshape(n * n, -1) @ dirs.T  # [n^2, 2k] (column-major dirs.T is faster: docs/performance.md)
    proj = proj - proj.mean(0)
    k = freqs.numel()
    cos_s, sin_s = class_waves(n, freqs, torch.float64)  # [k, n] each: waves over label positions
    Xs = torch.stack([cos_s, sin_s], dim=-1)
    Xs = Xs - Xs.mean(1, keepdim=True)  # [k, n, 2]
    Y = diagonal_sums(proj.view(n, n, 2 * k), frame.sign).double()  # [n, 2k]
    Y = torch.stack([Y[:, :k].T, Y[:, k:].T], dim=-1)  # [k, n, 2] (U, V per key)
    with single_thread():
        beta = torch.linalg.pinv(n * Xs.mT @ Xs) @ (Xs.mT @ Y)  # [k, 2, 2]
    fit = (Xs @ beta).to(proj.dtype)[:, frame.label_pos.flatten()]  # [k, n^2, 2]
    y = torch.stack([proj[:, :k].T, proj[:, k:].T], dim=-1)  # [k, n^2, 2]
    var_y = y.square().sum(1)
    fve = 100.0 * (1.0 - (y - fit).square().sum(1) / var_y)
    fve = torch.where(var_y > 0, fve, torch.nan)
    return fve[:, 0], fve[:, 1]


def fve_neuron(shares: Float[Tensor, "d_mlp K"], active: Tensor, threshold: float = NEURON_SHARE_MIN) -> dict[str, float]:
    """Per-neuron FVE by the neuron's best frequency (keyfreq.neuron_freq_shares).

    Returns frac (share of active neurons above `threshold`), mean (mean best share over active
    neurons) and active (fraction of neurons that are not dead/constant).
    """
    best = shares.max(dim=1).values[active]
    if best.numel() == 0:
        return {"frac": float("nan"), "mean": float("nan"), "active": 0.0}
    return {
        "frac": float((best > threshold).float().mean()),
        "mean": float(best.mean()),
        "active": float(active.float().mean()),
    }
