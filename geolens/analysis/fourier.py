"""Fourier bases of cyclic groups, and the frame that places a task's tokens on a cycle.

Conventions (geolens, see docs/metrics.md):

- The real orthonormal basis of Z_n has rows ordered ``const, cos 1, sin 1, cos 2, sin 2, ...``:
  **cos first**. (The TransformerLens grokking demo puts sin first; code ported from it must swap
  the pair.) For even n the last row is the Nyquist vector ``cos n/2`` (alternating +-1), which
  has no sine partner.
- Addition and subtraction mod p live on Z_p with the tokens in their natural order.
- Multiplication mod p lives on the multiplicative group Z_p^*, which is cyclic of order p - 1:
  token g^i (g the smallest primitive root) sits at position i, so a * b becomes
  i + j mod (p - 1). Token 0 is not in the group and is left out of every Fourier metric.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor
from torch.nn.functional import embedding_bag

from geolens.errors import GeoError
from geolens.model.config import GeoConfig
from geolens.model.spectrum import discrete_log_order, primitive_root


# ---- the basis -------------------------------------------------------------------------------
def n_freqs(n: int) -> int:
    """Number of non-constant frequencies of Z_n: K = n // 2 (k = 1..K)."""
    return n // 2


def basis_names(n: int) -> list[str]:
    """Row names of fourier_basis(n): ['const', 'cos 1', 'sin 1', ..., ('cos n/2' if n even)]."""
    names = ["const"]
    for k in range(1, (n - 1) // 2 + 1):
        names += [f"cos {k}", f"sin {k}"]
    if n % 2 == 0:
        names.append(f"cos {n // 2}")
    return names


@functools.lru_cache(maxsize=32)
def _basis(n: int, dtype: torch.dtype) -> Tensor:
    x = torch.arange(n, dtype=torch.float64)
    rows = [torch.ones(n, dtype=torch.float64)]
    for k in range(1, (n - 1) // 2 + 1):
        rows.append(torch.cos(2 * math.pi * k * x / n))
        rows.append(torch.sin(2 * math.pi * k * x / n))
    if n % 2 == 0:
        rows.append(torch.cos(math.pi * x))
    F = torch.stack(rows)
    F = F / F.norm(dim=1, keepdim=True)
    return F.to(dtype)


def fourier_basis(n: int, dtype: torch.dtype = torch.float32) -> Float[Tensor, "n n"]:
    """Orthonormal real Fourier basis of Z_n, one basis vector per row (cos first).

    Row 0 is 1/sqrt(n); row 2k-1 is cos(2 pi k x / n) and row 2k is sin(2 pi k x / n), each scaled
    to unit norm; for even n the last row is cos(pi x) / sqrt(n). F @ F.T = I, so F^-1 = F.T.
    Cached per (n, dtype): treat the returned tensor as read-only.
    """
    return _basis(n, dtype)


def basis_freqs(n: int) -> Int[Tensor, "n"]:
    """Frequency of each basis row: 0 for const, k for 'cos k' and 'sin k'."""
    return torch.tensor([0] + [(i + 1) // 2 for i in range(1, n)])


def cos_index(k: int) -> int:
    """Row of 'cos k' in fourier_basis (k >= 1)."""
    return 2 * k - 1


def sin_index(k: int) -> int:
    """Row of 'sin k' in fourier_basis (1 <= k < n/2)."""
    return 2 * k


def fourier_1d(x: Tensor, dim: int = 0) -> Tensor:
    """Coefficients of x on the orthonormal basis along `dim` (the size of that axis is n)."""
    F = fourier_basis(x.shape[dim], x.dtype)
    return torch.movedim(torch.tensordot(F, torch.movedim(x, dim, 0), dims=1), 0, dim)


def fourier_2d(grid: Float[Tensor, "... n n"]) -> Float[Tensor, "... n n"]:
    """2-D coefficients F @ grid @ F.T over the last two axes (inputs (a, b) as an n x n grid)."""
    F = fourier_basis(grid.shape[-1], grid.dtype)
    return F @ grid @ F.T


def freq_energy_2d(grid: Float[Tensor, "... n n"]) -> Float[Tensor, "... K1 K1"]:
    """Energy of `grid` in each (frequency of a, frequency of b) block, K1 = n // 2 + 1.

    Entry [.., r, c] is the squared norm of the projection of the grid onto
    span{basis rows of frequency r} (x) span{basis rows of frequency c}; e.g. [k, k] is the
    energy in {cos k, sin k}^2 and [0, k] in const (x) {cos k, sin k}. The blocks partition the
    space, so the entries sum to the squared norm of the grid. Computed with a unitary rfft2
    (O(n^2 log n) per grid) instead of the real basis: the complex exponentials of frequency +-k
    span the same plane as cos k and sin k, so the block energies agree.
    """
    n = grid.shape[-1]
    X = torch.fft.rfft2(grid, norm="ortho")  # [..., n, n//2+1]
    power = X.real.square() + X.imag.square()
    # columns 1..ceil(n/2)-1 stand for the two mirror columns kb and n - kb
    weight = torch.full((n // 2 + 1,), 2.0, dtype=power.dtype)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    power = power * weight
    row_freq = torch.minimum(torch.arange(n), n - torch.arange(n))
    out = torch.zeros(*power.shape[:-2], n // 2 + 1, n // 2 + 1, dtype=power.dtype)
    out.index_add_(out.dim() - 2, row_freq, power)
    return out


def channel_freq_energy(grid: Float[Tensor, "n n d"]) -> Float[Tensor, "K1 K1 d"]:
    """freq_energy_2d for a stack of grids with the channel axis last (e.g. one grid per neuron).

    Same blocks as freq_energy_2d ([r, c, channel]), computed with the real basis as two matrix
    products (F over a, then F over b) and a grouping of the squared coefficients by frequency.
    No transposed copy of the activations is needed, and for prime n the matmuls beat the FFT
    (which falls back to Bluestein's algorithm).
    """
    n, _, d = grid.shape
    F = fourier_basis(n, grid.dtype)
    coef = (F @ grid.reshape(n, n * d)).reshape(n, n, d)  # over a
    coef = torch.matmul(F, coef)  # over b, batched over the a-coefficient
    freq = basis_freqs(n)
    K1 = n // 2 + 1
    rows = torch.zeros(K1, n, d, dtype=grid.dtype).index_add_(0, freq, coef.square())
    return torch.zeros(K1, K1, d, dtype=grid.dtype).index_add_(1, freq, rows)


@functools.lru_cache(maxsize=32)
def _diagonal_bags(n: int, sign: int) -> Tensor:
    """[n, n]: [s, i] is the flat cell i * n + j with (i + sign * j) mod n = s."""
    i = torch.arange(n)
    j = (sign * (i[:, None] - i[None, :])) % n
    return i[None, :] * n + j


def diagonal_sums(grid: Float[Tensor, "n n ..."], sign: int = 1) -> Float[Tensor, "n ..."]:
    """Sums of the grid over its wrapped diagonals: out[s] = sum of grid[i, j] over the n cells
    with (i + sign * j) mod n = s (with sign = frame.sign, s is the label position).

    Any inner product of the grid with a function of (i + sign * j) mod n (e.g. a wave
    cos(w_k s)) equals the inner product of these n sums with that function of s. One
    embedding_bag over the flattened grid (float32 sums of n terms, as a matmul would do).
    """
    n = grid.shape[0]
    flat = grid.reshape(n * n, -1)
    return embedding_bag(_diagonal_bags(n, sign), flat, mode="sum").view(n, *grid.shape[2:])


# ---- the frame -------------------------------------------------------------------------------
@dataclass(frozen=True)
class CyclicFrame:
    """How a Z_p task sits on the cycle Z_n that Fourier metrics use.

    n:     period (p for add/sub, p - 1 for mul)
    p:     number of classes (tokens 0..p-1; `=` is token p)
    order: [n] token id at each group position (0..p-1 for add/sub; g^i mod p for mul)
    sign:  +1 if the label sits at position i + j, -1 if at i - j (subtraction)
    note:  one line saying which basis this is (for reports)
    """

    n: int
    p: int
    order: Tensor
    sign: int
    note: str

    @functools.cached_property
    def grid_rows(self) -> Int[Tensor, "n n"]:
        """Dataset row (a-major, a * p + b) of the input (order[i], order[j]) at grid cell [i, j]."""
        return self.order[:, None] * self.p + self.order[None, :]

    @functools.cached_property
    def label_pos(self) -> Int[Tensor, "n n"]:
        """Group position of the label of grid cell [i, j]: (i + sign * j) mod n."""
        i = torch.arange(self.n)
        return (i[:, None] + self.sign * i[None, :]) % self.n

    @functools.cached_property
    def label_rows(self) -> Int[Tensor, "n n"]:
        """Dataset rows grouped by label position: [s, i] is the row of grid cell [i, j] with
        (i + sign * j) mod n = s (each label position has exactly one cell per grid row i)."""
        return self.grid_rows.flatten()[_diagonal_bags(self.n, self.sign)]

    @functools.cached_property
    def in_frame(self) -> Tensor:
        """[p * p] bool: which dataset rows are grid cells (all of them except a = 0 or b = 0 for mul)."""
        mask = torch.zeros(self.p * self.p, dtype=torch.bool)
        mask[self.grid_rows.flatten()] = True
        return mask

    @functools.cached_property
    def identity(self) -> bool:
        """True when the grid is the dataset itself (add/sub): grid cell [i, j] is row i * p + j."""
        return self.n == self.p and bool((self.order == torch.arange(self.p)).all())

    def block(self, x: Float[Tensor, "N C"]) -> Float[Tensor, "n n n"]:
        """Per-input class scores [N, p] (all inputs, a-major) -> [n, n, n] grid, classes in group order.
        For add/sub this is a view of x (do not modify it in place)."""
        if self.identity:
            return x.reshape(self.n, self.n, self.p)
        return x[self.grid_rows][..., self.order]

    def grid(self, x: Tensor) -> Tensor:
        """Per-input values [N, ...] (all inputs, a-major) -> [n, n, ...] grid in group order.
        For add/sub this is a view of x (do not modify it in place)."""
        if self.identity:
            return x.reshape(self.n, self.n, *x.shape[1:])
        return x[self.grid_rows]

    @functools.cached_property
    def extra_classes(self) -> Tensor:
        """Class ids outside the group (tensor([0]) for mul, empty for add/sub)."""
        mask = torch.ones(self.p, dtype=torch.bool)
        mask[self.order] = False
        return mask.nonzero().flatten()


def cyclic_frame(cfg: GeoConfig) -> CyclicFrame:
    """The frame of a Z_p task of two operands; raises GeoError otherwise (S_n has no cyclic Fourier basis; the
    metrics on the frame read the [a, b] grid)."""
    p = cfg.p
    if cfg.task in ("add", "sub"):
        sign = 1 if cfg.task == "add" else -1
        return CyclicFrame(p, p, torch.arange(p), sign, f"Z_{p}, tokens in natural order")
    if cfg.task == "mul":
        g = primitive_root(p)
        return CyclicFrame(
            p - 1, p, discrete_log_order(p, g), 1,
            f"Z_{p}^* ~ Z_{p - 1}: tokens 1..{p - 1} in discrete-log order base {g}, token 0 excluded",
        )
    if cfg.task == "perm":
        raise GeoError(f"Fourier metrics need a cyclic group Z_p; task perm is S_{cfg.n_perm}")
    raise GeoError(f"Fourier metrics read the [a, b] grid of a Z_p task; task {cfg.task} has {cfg.n_operands} operands")
