"""Fraction of variance explained (FVE) of MLP activations by key-frequency waves.

Both functions work on post-ReLU MLP activations at the `=` position over all inputs, arranged as
an n x n grid in group order (fourier.CyclicFrame.grid).
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.analysis.fourier import CyclicFrame, sum_waves
from geolens.analysis.keyfreq import NEURON_SHARE_MIN
from geolens.analysis.threads import single_thread


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
    """
    n = frame.n
    cos_c, sin_c = class_waves(n, freqs, W_L.dtype)
    dirs = torch.cat([W_L @ cos_c.T, W_L @ sin_c.T], dim=1)  # [d_mlp, 2k]: u_1..u_k, v_1..v_k
    proj = acts_grid.reshape(n * n, -1) @ dirs  # [n^2, 2k]
    proj = proj - proj.mean(0)
    k = freqs.numel()
    y = torch.stack([proj[:, :k].T, proj[:, k:].T], dim=-1)  # [k, n^2, 2] (U, V per key)
    X = torch.stack(
        [torch.stack([w.flatten() for w in sum_waves(frame, int(f), W_L.dtype)], dim=-1) for f in freqs]
    )  # [k, n^2, 2]
    X = X - X.mean(1, keepdim=True)
    with single_thread():
        beta = torch.linalg.pinv(X) @ y  # [k, 2, 2]
    resid = y - X @ beta
    var_y = y.square().sum(1)
    fve = 100.0 * (1.0 - resid.square().sum(1) / var_y)
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
