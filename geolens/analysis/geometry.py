"""Other geometry: effective rank of weight / activation matrices, residual-stream norms."""

from __future__ import annotations

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.analysis.threads import single_thread
from geolens.config import GeoConfig


def singular_values(M: Float[Tensor, "m n"]) -> Float[Tensor, "r"]:
    """Singular values of M (float64), descending, with numerical zeros removed.

    Small matrices use an SVD in float64. Large ones (over 2^20 entries, e.g. MLP activations over
    all p^2 inputs) use the eigenvalues of the smaller Gram matrix M^T M, formed and decomposed in
    M's dtype (float32: the Gram's own rounding already dominates the eigvalsh error), which is
    an order of magnitude faster. Values below max(m, n) * eps(float32) * sigma_max (the
    default tolerance of torch.linalg.matrix_rank) are treated as zero either way, which also
    hides the float32 rounding noise of the Gram route.
    """
    if M.shape[0] < M.shape[1]:
        M = M.T
    if M.numel() <= 1 << 20:
        with single_thread():
            s = torch.linalg.svdvals(M.double())
    else:
        with single_thread():
            s = torch.linalg.eigvalsh(M.T @ M).double().clamp_min(0).sqrt().flip(0)
    if s.numel() == 0 or s[0] == 0:
        return s[:0]
    tol = max(M.shape) * torch.finfo(torch.float32).eps * s[0]
    return s[s > tol]


def effective_rank(M: Float[Tensor, "m n"]) -> float:
    """exp(entropy) of the singular values normalised to sum 1 (Roy & Vetterli): 1 for rank one,
    k for k equal singular values. 0 for the zero matrix."""
    s = singular_values(M)
    if s.numel() == 0:
        return 0.0
    p = s / s.sum()
    return float(torch.exp(-(p * p.log()).sum()))


def residual_hooks(cfg: GeoConfig) -> list[str]:
    """Hook points of the residual stream and of what is written into it, in forward order."""
    out = ["hook_embed", "hook_pos_embed"]
    for layer in range(cfg.n_layers):
        out += [f"blocks.{layer}.hook_{name}" for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")]
    return out


def projected_hooks(cfg: GeoConfig) -> list[str]:
    """Outputs of the sphere projections (empty unless cfg.norm == 'sphere'): every norm's
    hook_normalized. These keep all positions in the analysis cache (see context.py)."""
    if cfg.norm != "sphere":
        return []
    out = ["embed_norm.hook_normalized"]
    for layer in range(cfg.n_layers):
        out += [f"blocks.{layer}.attn_norm.hook_normalized", f"blocks.{layer}.mlp_norm.hook_normalized"]
    return out


def resid_norm(cache, cfg: GeoConfig) -> dict[str, float]:
    """Mean L2 norm over inputs and cached positions at each residual hook; for sphere models also
    'sphere_err': the largest | ||x|| - 1 | over every vector at every projection output (0 up to
    rounding when the projection was applied: a built-in sanity check).

    With the analysis context's narrowed forward, hooks from the last block's hook_resid_mid on
    hold the `=` position only (the others are never computed there)."""
    out = {name: float(cache[name].norm(dim=-1).mean()) for name in residual_hooks(cfg)}
    proj = projected_hooks(cfg)
    if proj:
        out["sphere_err"] = max(float((cache[name].norm(dim=-1) - 1).abs().max()) for name in proj)
    return out
