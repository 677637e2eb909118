"""Other geometry: effective rank of weight / activation matrices, residual-stream norms."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.analysis.eqforward import EqActivations, residual_hooks
from geolens.threads import single_thread
from geolens.model.config import GeoConfig


def singular_values(M: Float[Tensor, "m n"]) -> Float[Tensor, "r"]:
    """Singular values of M (float64), descending, with numerical zeros removed.

    Small matrices use an SVD in float64. Large ones (over 2^20 entries, e.g. MLP activations over
    all p^2 inputs) use the eigenvalues of the smaller Gram matrix M^T M (gram_lower), formed and
    decomposed in M's dtype (float32: the Gram's own rounding already dominates the eigvalsh
    error; float64 when float32 LAPACK fails to converge, as it does on some trained checkpoints),
    which is far cheaper than an SVD of the tall matrix. Values below max(m, n) * eps(float32) *
    sigma_max (the default tolerance of torch.linalg.matrix_rank) are treated as zero either way,
    which also hides the float32 rounding noise of the Gram route.
    """
    if M.shape[0] < M.shape[1]:
        M = M.T
    if M.numel() <= 1 << 20:
        with single_thread():
            s = torch.linalg.svdvals(M.double())
    else:
        G = gram_lower(M)  # the big matmul: every thread
        with single_thread():
            try:
                ev = torch.linalg.eigvalsh(G)
            except torch.linalg.LinAlgError:  # float32 LAPACK can fail to converge on an ill-conditioned Gram
                ev = torch.linalg.eigvalsh(G.double())
        s = ev.double().clamp_min(0).sqrt().flip(0)
    if s.numel() == 0 or s[0] == 0:
        return s[:0]
    tol = max(M.shape) * torch.finfo(torch.float32).eps * s[0]
    return s[s > tol]


def gram_lower(M: Float[Tensor, "m n"], block: int = 256) -> Float[Tensor, "n n"]:
    """The lower triangle (and diagonal) of M^T M; the strict upper triangle is 0.

    Column blocks [i:i+block] are multiplied only with the columns from i on, which skips most
    of the upper triangle's work; eigvalsh reads only the lower triangle (UPLO='L', its default).
    """
    n = M.shape[1]
    G = M.new_zeros(n, n)
    for i in range(0, n, block):
        G[i:, i : i + block] = M[:, i:].T @ M[:, i : i + block]
    return G


def effective_rank(M: Float[Tensor, "m n"]) -> float:
    """exp(entropy) of the singular values normalised to sum 1 (Roy & Vetterli): 1 for rank one,
    k for k equal singular values. 0 for the zero matrix."""
    s = singular_values(M)
    if s.numel() == 0:
        return 0.0
    p = s / s.sum()
    return float(torch.exp(-(p * p.log()).sum()))


def resid_norm(eq: EqActivations, cfg: GeoConfig) -> dict[str, float]:
    """Mean L2 norm at the `=` position over all inputs at each residual hook (eqforward
    residual_hooks); for sphere models also 'sphere_err': the largest | ||x|| - 1 | over every
    vector the forward projected (eq.projected: at least every (token, position) after the
    embedding and every projection at `=`), 0 up to rounding when the projection was applied:
    a built-in sanity check."""
    out = {name: float(eq[name].norm(dim=-1).mean()) for name in residual_hooks(cfg)}
    if eq.projected:
        out["sphere_err"] = max(float((x.norm(dim=-1) - 1).abs().max()) for x in eq.projected)
    return out
