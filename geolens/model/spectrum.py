"""The task's group seen by Fourier metrics: class order on the cycle, and W_L's spectrum over it.

Addition and subtraction mod p sit on Z_p with the classes in natural order; multiplication on
Z_p^* ~ Z_{p-1}, classes 1..p-1 in discrete-log order (token g^i at position i, g the smallest
primitive root; class 0 is outside the group); S_n composition has no cyclic Fourier basis.
Used by the precursor columns recorded while training (geolens.training.precursor_columns) and by
the analysis layer (geolens.analysis.fourier, geolens.analysis.keyfreq), which build on it.
"""

from __future__ import annotations

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import GeoConfig


def _prime_factors(n: int) -> list[int]:
    out, d = [], 2
    while d * d <= n:
        if n % d == 0:
            out.append(d)
            while n % d == 0:
                n //= d
        d += 1
    if n > 1:
        out.append(n)
    return out


def primitive_root(p: int) -> int:
    """Smallest generator g of the multiplicative group Z_p^* (p prime); 3 for p = 113."""
    if p == 2:
        return 1
    factors = _prime_factors(p - 1)
    for g in range(2, p):
        if all(pow(g, (p - 1) // q, p) != 1 for q in factors):
            return g
    raise GeoError(f"no primitive root mod {p}; is p prime?")


def discrete_log_order(p: int, g: int | None = None) -> Int[Tensor, "p_minus_1"]:
    """Tokens 1..p-1 in discrete-log order: entry i is g^i mod p (g = primitive_root(p) by default)."""
    g = primitive_root(p) if g is None else g
    out, x = [], 1
    for _ in range(p - 1):
        out.append(x)
        x = x * g % p
    if len(set(out)) != p - 1:
        raise GeoError(f"{g} is not a primitive root mod {p}")
    return torch.tensor(out)


def class_order(cfg: GeoConfig) -> tuple[Int[Tensor, "n"] | None, str]:
    """(class id at each position of the task's cycle, or None, and one line saying why): arange(p)
    for add/sub, discrete_log_order(p) for mul, None for S_n composition (no cyclic Fourier basis)."""
    if cfg.task in ("add", "sub"):
        return torch.arange(cfg.p), f"Z_{cfg.p}, classes in natural order"
    if cfg.task == "mul":
        return discrete_log_order(cfg.p), f"Z_{cfg.p}^*: classes 1..{cfg.p - 1} in discrete-log order, 0 left out"
    return None, f"S_{cfg.n_perm} composition has no cyclic Fourier basis"


def wl_spectrum(W_L: Float[Tensor, "d_mlp n"]) -> Float[Tensor, "K1"]:
    """|rfft| of W_L along the class axis (classes in group order), L2 norm over neurons: one value per bin 0..n//2."""
    return torch.fft.rfft(W_L, dim=-1).abs().norm(dim=0)


def wl_energy(W_L: Float[Tensor, "d_mlp n"]) -> Float[Tensor, "K1"]:
    """Energy of W_L per bin 0..n//2 (Parseval-weighted: bins with a mirror image count twice, so
    the bins sum to n * ||W_L||^2)."""
    n = W_L.shape[-1]
    power = wl_spectrum(W_L).square()
    weight = torch.full_like(power, 2.0)
    weight[0] = 1.0
    if n % 2 == 0:
        weight[-1] = 1.0
    return power * weight
