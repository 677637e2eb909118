"""The bounded readout's column normalisation, shared by the model, the fast path and the analysis.

The bounded unembedding reads the final residual stream h against the columns of W_U scaled to
unit norm: logits = tau * h . (W_U[:, c] / ||W_U[:, c]||). W_U is [..., d_model, C] (a leading
member dimension for stacked models), so the norm runs over d_model (dim -2); a column of norm
below 1e-12 is divided by 1e-12 instead.

Two forms, each with a fixed float operation order that training depends on (runs must stay
reproducible bit for bit):
    unit_columns(W_U)          W_U / ||col||                     hooked forward (then tau * h @ it),
                                                                 DLA's normalised space
    bounded_readout(W_U, tau)  (tau * W_U) / ||col||             fast path, readout_matrix
"""

from __future__ import annotations

from jaxtyping import Float
from torch import Tensor

MIN_COLUMN_NORM = 1e-12


def column_norms(W_U: Float[Tensor, "... d_model C"]) -> Float[Tensor, "... 1 C"]:
    """||W_U[..., :, c]|| per column, clamped below at MIN_COLUMN_NORM."""
    return W_U.norm(dim=-2, keepdim=True).clamp_min(MIN_COLUMN_NORM)


def unit_columns(W_U: Float[Tensor, "... d_model C"]) -> Float[Tensor, "... d_model C"]:
    """W_U with unit-norm columns: the directions the bounded readout measures cosines against."""
    return W_U / column_norms(W_U)


def bounded_readout(W_U: Float[Tensor, "... d_model C"], tau: float) -> Float[Tensor, "... d_model C"]:
    """tau * W_U / ||column||, in that order: the matrix h is multiplied by for the bounded logits."""
    return tau * W_U / column_norms(W_U)
