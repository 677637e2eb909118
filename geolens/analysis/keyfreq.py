"""Key frequencies: three named rules (paper W_L FFT, Nanda's per-neuron rule, embedding norms).

Every function takes tensors already in group order (see fourier.CyclicFrame): for
multiplication the class / token axis is the discrete-log order of tokens 1..p-1 (period p - 1)
with token 0 dropped. Frequencies are integers k in 1..n//2.
"""

from __future__ import annotations

import functools

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.nn.functional import embedding_bag, mse_loss

from geolens.analysis.fourier import basis_freqs, fourier_basis
from geolens.model.spectrum import wl_energy, wl_spectrum

NEURON_SHARE_MIN = 0.85  # Nanda: a neuron is "clean" when one frequency holds > 85% of its energy
EMBED_REL_MIN = 0.25  # keyfreq_embed: frequencies whose norm exceeds max / 4


# ---- the paper's rule --------------------------------------------------------------------------
def keyfreq_wl_fft(W_L: Float[Tensor, "d_mlp n"], k: int = 5) -> Int[Tensor, "k"]:
    """The paper's key frequencies: the top-k bins of wl_spectrum with the DC bin dropped.

    W_L = W_out @ W_U (normalised W_U for bounded models), classes in group order.
    Returns the k frequencies, strongest first.
    """
    spec = wl_spectrum(W_L).clone()
    spec[0] = -1.0  # DC never counts
    k = min(k, spec.numel() - 1)
    return spec.topk(k).indices


def wl_energy_shares(W_L: Float[Tensor, "d_mlp n"]) -> Float[Tensor, "K"]:
    """Share of the non-DC energy of W_L in each bin k = 1..n//2 (sums to 1; NaN if W_L has no
    non-DC energy)."""
    energy = wl_energy(W_L)[1:]
    total = energy.sum()
    return energy / total if total > 0 else torch.full_like(energy, float("nan"))


def wl_topk_share(W_L: Float[Tensor, "d_mlp n"], freqs: Tensor) -> float:
    """Share of the non-DC energy of W_L (Parseval-weighted) held by the bins `freqs`."""
    energy = wl_energy(W_L)
    total = energy[1:].sum()
    return float(energy[freqs].sum() / total) if total > 0 else float("nan")


# ---- Nanda's per-neuron rule -----------------------------------------------------------------
CHUNK_BYTES = 2 << 20  # neuron_freq_shares reads the activations in row blocks of about this size


@functools.lru_cache(maxsize=8)
def _line_plan(n: int, rows: int) -> list[tuple[int, int, Tensor, Tensor]]:
    """For each block of grid rows a0 <= a < a0 + r: (a0, r, members, offsets) of the
    embedding_bag whose r + 3n bags are, in the block's own flat cells (k * n + b, a = a0 + k),
    the r rows, then the n columns b, the n diagonals (a + b) mod n = s and the n diagonals
    (a - b) mod n = t, each restricted to the block."""
    plan = []
    for a0 in range(0, n, rows):
        r = min(rows, n - a0)
        k = torch.arange(r)[None, :]  # [1, r]
        line = torch.arange(n)[:, None]  # [n, 1]
        bags = [
            (k.T * n + torch.arange(n)).flatten(),  # rows: k * n + b
            (k * n + line).flatten(),  # columns
            (k * n + (line - a0 - k) % n).flatten(),  # b = s - a
            (k * n + (a0 + k - line) % n).flatten(),  # b = a - t
        ]
        sizes = torch.cat([torch.full((r,), n), torch.full((3 * n,), r)])
        plan.append((a0, r, torch.cat(bags), torch.cumsum(sizes, 0) - sizes))
    return plan


def neuron_freq_shares(acts_grid: Float[Tensor, "n n d_mlp"]) -> tuple[Float[Tensor, "d_mlp K"], Tensor]:
    """Share of each neuron's centred 2-D spectrum energy in the block {const, cos k, sin k}^2.

    acts_grid: post-ReLU activations at the `=` position over all inputs, as an n x n grid in
    group order. Returns (shares [d_mlp, K] for k = 1..K, active [d_mlp] bool): a neuron is
    active when its centred energy is nonzero (dead or constant neurons get share 0).

    The block of k is E[0, k] + E[k, 0] + E[k, k] (E: energy per (frequency of a, frequency of b)
    block of the orthonormal 2-D basis) over the centred energy sum((x - mean)^2). The blocks come
    from sums along lines of the grid, never from a 2-D transform: with F_k the basis rows of
    frequency k, u the sums over b (one per a), v the sums over a, S+ and S- the sums over the
    wrapped diagonals (a + b) mod n and (a - b) mod n,

        E[k, 0] = |F_k u|^2 / n,   E[0, k] = |F_k v|^2 / n,   E[k, k] = (|F_k S+|^2 + |F_k S-|^2) / n

    (for even n the Nyquist row of F_k S- repeats that of S+ and is dropped). One pass over the
    activations in blocks of grid rows (CHUNK_BYTES, cache-sized): per block one embedding_bag
    for its share of the 4n line sums and sum((x - ref)^2) with ref the mean of grid row 0; the
    centred energy is that minus n^2 (mean - ref)^2 (ref is close to the mean, so nothing cancels).
    """
    n, _, d = acts_grid.shape
    flat = acts_grid.reshape(n * n, d)
    ref = acts_grid[0].mean(0)
    sums = torch.zeros(4 * n, d, dtype=flat.dtype)  # [u, v, S+, S-]
    sq = torch.zeros(d, dtype=flat.dtype)
    rows = max(1, CHUNK_BYTES // (n * d * flat.element_size()))
    for a0, r, members, offsets in _line_plan(n, rows):
        block = flat[a0 * n : (a0 + r) * n]
        part = embedding_bag(members, block, offsets, mode="sum")
        sums[a0 : a0 + r] = part[:r]
        sums[n:] += part[r:]
        sq += mse_loss(block, ref.expand_as(block), reduction="none").sum(0)
    mean = sums[:n].sum(0) / (n * n)
    total = sq - n * n * (mean - ref).square()  # centred energy
    raw = total + n * n * mean.square()
    basis = fourier_basis(n, flat.dtype)
    coef_sq = torch.matmul(basis[1:], sums.view(4, n, d)).square_()  # [4, n - 1, d]
    if n % 2 == 0:
        coef_sq[3, -1] = 0.0  # the Nyquist wave is the same on both diagonals
    block_energy = torch.zeros(n // 2, d, dtype=flat.dtype).index_add_(0, basis_freqs(n)[1:] - 1, coef_sq.sum(0)) / n
    active = total > 1e-8 * raw  # a constant neuron keeps ~1e-14 relative energy (rounding of its mean)
    shares = torch.where(active, block_energy / total.clamp_min(torch.finfo(total.dtype).tiny), 0.0)
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
