"""Numerical health of training (Prieto et al. 2025): softmax collapse, exact-zero losses, and the
naive-loss-minimisation (NLM) direction.

All checks run in the dtype of the logits they are given, which is the precision the training
loss is computed in (geolens trains in the model's dtype, float32 by default).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from jaxtyping import Float, Int
from torch import Tensor


def softmax_collapse(logits: Float[Tensor, "N C"]) -> float:
    """Fraction of examples whose softmax denominator sum_j exp(z_j - max z) is exactly 1.

    That happens when every non-maximal term underflows or is absorbed in the rounding of 1 + x:
    the gradient of the cross-entropy then vanishes for that example ("softmax collapse").
    """
    shifted = logits - logits.max(dim=-1, keepdim=True).values
    return float((shifted.exp().sum(-1) == 1).float().mean())


def zero_loss_fraction(logits: Float[Tensor, "N C"], labels: Int[Tensor, "N"]) -> float:
    """Fraction of examples whose cross-entropy (computed in the logits' dtype) is exactly 0."""
    loss = F.cross_entropy(logits, labels, reduction="none")
    return float((loss == 0).float().mean())


def _cos(a: Tensor, b: Tensor) -> float:
    na, nb = a.norm(), b.norm()
    if na == 0 or nb == 0:
        return float("nan")  # undefined: no gradient (e.g. W_Q under uniform attention) or zero weights
    return float((a @ b) / (na * nb))


def nlm_cosine(
    model: torch.nn.Module, tokens: Int[Tensor, "N 3"], labels: Int[Tensor, "N"], forward=None
) -> dict[str, float]:
    """Cosine between the negative loss gradient and the parameter vector.

    The loss is the mean cross-entropy of `model(tokens)[:, -1]` (pass the training split: it is the
    full-batch training loss, without weight decay). Returns {'total': cosine over all parameters
    concatenated, '<param name>': cosine for that tensor}; NaN where the gradient or the
    parameter is exactly zero. A value near +1 means the loss is lowered mostly by scaling the
    weights up (Prieto's naive loss minimisation). The model's .grad fields are left untouched.
    forward: optional tokens -> logits [N, C] callable computing the same logits (e.g. the
    context's narrowed forward); default model(tokens)[:, -1].
    """
    forward = (lambda t: model(t)[:, -1]) if forward is None else forward
    named = list(model.named_parameters())
    flags = [p.requires_grad for _, p in named]
    try:
        for _, p in named:
            p.requires_grad_(True)
        with torch.enable_grad():
            loss = F.cross_entropy(forward(tokens), labels)
            grads = torch.autograd.grad(loss, [p for _, p in named], allow_unused=True)
    finally:
        for (_, p), flag in zip(named, flags):
            p.requires_grad_(flag)
    out: dict[str, float] = {}
    neg, params = [], []
    for (name, p), g in zip(named, grads):
        g = torch.zeros_like(p) if g is None else g
        out[name] = _cos(-g.flatten().double(), p.detach().flatten().double())
        neg.append(-g.flatten().double())
        params.append(p.detach().flatten().double())
    out = {"total": _cos(torch.cat(neg), torch.cat(params)), **out}
    return out
