"""Key frequencies: three named rules (paper W_L FFT, Nanda's per-neuron rule, embedding norms).

Every function takes tensors already in group order (see fourier.CyclicFrame): for
multiplication the class / token axis is the discrete-log order of tokens 1..p-1 (period p - 1)
with token 0 dropped. Frequencies are integers k in 1..n//2.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.analysis.fourier import basis_freqs, fourier_basis

NEURON_SHARE_MIN = 0.85  # Nanda: a neuron is "clean" when one frequency holds > 85% of its energy
EMBED_REL_MIN = 0.25  # keyfreq_embed: frequencies whose norm exceeds max / 4


# ---- the paper's rule --------------------------------------------------------------------------
def wl_spectrum(W_L: Float[Tensor, "d_mlp n"]) -> Float[Tensor, "K1"]:
    """|rfft| of W_L along the class axis, L2 norm over neurons: one value per bin 0..n//2."""
    return torch.fft.rfft(W_L, dim=-1).abs().norm(dim=0)


def keyfreq_wl_fft(W_L: Float[Tensor, "d_mlp n"], k: int = 5) -> Int[Tensor, "k"]:
    """The paper's key frequencies: the top-k bins of wl_spectrum with the DC bin dropped.

    W_L = W_out @ W_U (normalised W_U for bounded models), classes in group order.
    Returns the k frequencies, strongest first.
    """
    spec = wl_spectrum(W_L).clone()
    spec[0] = -1.0  # DC never counts
    k = min(k, spec.numel() - 1)
    return spec.topk(k).indices


def wl_topk_share(W_L: Float[Tensor, "d_mlp n"], freqs: Tensor) -> float:
    """Share of the non-DC energy of W_L (Parseval-weighted) held by the bins `freqs`."""
    n = W_L.shape[-1]
    power = wl_spectrum(W_L).square()
    weight = torch.full_like(power, 2.0)
    if n % 2 == 0:
        weight[-1] = 1.0
    power = power * weight
    total = power[1:].sum()
    return float(power[freqs].sum() / total) if total > 0 else float("nan")


# ---- Nanda's per-neuron rule -----------------------------------------------------------------
def neuron_freq_shares(acts_grid: Float[Tensor, "n n d_mlp"]) -> tuple[Float[Tensor, "d_mlp K"], Tensor]:
    """Share of each neuron's centred 2-D spectrum energy in the block {const, cos k, sin k}^2.

    acts_grid: post-ReLU activations at the `=` position over all inputs, as an n x n grid in
    group order. Returns (shares [d_mlp, K] for k = 1..K, active [d_mlp] bool): a neuron is
    active when its centred energy is nonzero (dead or constant neurons get share 0).
    With E the block energies of fourier.channel_freq_energy, the block of k is
    E[0, k] + E[k, 0] + E[k, k] and the centred total is sum(E) - E[0, 0]. Only those are
    computed: C = F @ grid over a ([n, n, d], one matmul); the const row (F over b of C[0]), the
    const column (C[1:] summed over b), for each row r > 0 only the (at most two) basis rows of its
    own frequency over b (a [n-1, 2, n] @ [n-1, n, d] bmm), and the total by Parseval over b:
    ||C[1:]||^2 + the non-const part of the const row.
    """
    n, _, d = acts_grid.shape
    F = fourier_basis(n, acts_grid.dtype)
    freq = basis_freqs(n)
    K1 = n // 2 + 1
    C = (F @ acts_grid.reshape(n, n * d)).reshape(n, n, d)  # [a-coef, b, d]
    row0 = (F @ C[0]).square()  # [b-coef, d]: E[0, .] before grouping
    col0 = (C[1:].sum(1) / math.sqrt(n)).square()  # [n-1, d]: E[., 0] before grouping
    pad = torch.cat([F, F.new_zeros(1, n)])  # row n: the missing sin of an even n's Nyquist bin
    own = torch.stack([2 * freq[1:] - 1, torch.where(2 * freq[1:] < n, 2 * freq[1:], n)], dim=1)  # [n-1, 2]
    diag = torch.bmm(pad[own], C[1:]).square().sum(1)  # [n-1, d]: E[k, k] before grouping
    block = torch.zeros(K1, d, dtype=C.dtype)
    block.index_add_(0, freq, row0).index_add_(0, freq[1:], col0 + diag)
    total = C[1:].reshape(-1, d).square().sum(0) + row0[1:].sum(0)  # Parseval over b
    raw = total + row0[0]
    active = total > 1e-8 * raw  # float32 rounding of a constant neuron leaves ~1e-10 relative energy
    shares = torch.where(active, block[1:] / total.clamp_min(torch.finfo(total.dtype).tiny), 0.0)
    return shares.T, active


def keyfreq_neuron(shares: Float[Tensor, "d_mlp K"], threshold: float = NEURON_SHARE_MIN) -> tuple[Int[Tensor, "m"], Int[Tensor, "m"]]:
    """Nanda's key set: distinct best frequencies among neurons whose best share > threshold.

    Returns (frequencies, neuron counts), sorted by count (most neurons first).
    """
    best_share, best = shares.max(dim=1)
    freqs = best[best_share > threshold] + 1
    if freqs.numel() == 0:
        return freqs, freqs
    uniq, counts = freqs.unique(return_counts=True)
    order = torch.argsort(counts, descending=True, stable=True)
    return uniq[order], counts[order]


# ---- embedding norms -------------------------------------------------------------------------
def embed_freq_norms(W_E: Float[Tensor, "n d_model"]) -> Float[Tensor, "K"]:
    """Norm of the Fourier coefficients of the token embeddings per frequency k = 1..K.

    W_E rows are the n group tokens in group order (no `=` row). The value for k is
    sqrt(||cos k . W_E||^2 + ||sin k . W_E||^2) with the orthonormal basis rows.
    """
    n = W_E.shape[0]
    coef = fourier_basis(n, W_E.dtype) @ W_E  # [n, d_model]
    sq = coef.square().sum(dim=1)
    per_freq = torch.zeros(n // 2 + 1, dtype=sq.dtype)
    per_freq.index_add_(0, basis_freqs(n), sq)
    return per_freq[1:].sqrt()


def keyfreq_embed(W_E: Float[Tensor, "n d_model"], rel: float = EMBED_REL_MIN) -> Int[Tensor, "m"]:
    """Frequencies whose embedding norm exceeds rel * max (default max / 4), strongest first."""
    norms = embed_freq_norms(W_E)
    keep = (norms > rel * norms.max()).nonzero().flatten()
    order = torch.argsort(norms[keep], descending=True, stable=True)
    return keep[order] + 1
