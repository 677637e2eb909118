"""The loss landscape at a checkpoint: sharpness (the top Hessian eigenvalue of the training loss).

    sharpness(model, tokens, labels)  largest eigenvalue of the Hessian of the mean cross-entropy at `=` over
                                      (tokens, labels) w.r.t. every parameter, by Lanczos (scipy.sparse.linalg.eigsh,
                                      which='LA', ARPACK) on Hessian-vector products (torch.func: forward-mode jvp of
                                      the reverse-mode gradient, through the hooked model's functional_call)

The Hessian is never formed: each product costs about two forward-backward passes of the training set.
The starting vector is drawn from a seeded generator, so an estimate is reproducible on one machine.
Tested against the exact Hessian of a tiny model (tests/test_landscape.py).
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
from jaxtyping import Int
from scipy.sparse.linalg import LinearOperator, eigsh
from torch import Tensor

SHARPNESS_TOL = 1e-3  # ARPACK's relative accuracy of the eigenvalue
SHARPNESS_SEED = 0


def hessian_vector_product(model, tokens: Int[Tensor, "N n_ctx"], labels: Int[Tensor, "N"]):
    """(hvp(v) -> H v, n): H the Hessian of the mean cross-entropy at `=` w.r.t. the model's parameters (flattened
    in named_parameters order, n entries), v a float64 numpy vector; the model is not modified."""
    names = [n for n, _ in model.named_parameters()]
    params = {n: p.detach() for n, p in model.named_parameters()}
    shapes = [params[n].shape for n in names]
    sizes = [params[n].numel() for n in names]

    def loss(p: dict[str, Tensor]) -> Tensor:
        return F.cross_entropy(torch.func.functional_call(model, p, (tokens,))[:, -1], labels)

    grad = torch.func.grad(loss)

    def hvp(v: np.ndarray) -> np.ndarray:
        dtype = params[names[0]].dtype
        chunks = torch.from_numpy(np.asarray(v, dtype=np.float64).ravel()).to(dtype).split(sizes)
        tangent = {n: c.view(s) for n, c, s in zip(names, chunks, shapes)}
        _, out = torch.func.jvp(grad, (params,), (tangent,))
        return torch.cat([out[n].reshape(-1) for n in names]).double().numpy()

    return hvp, sum(sizes)


def sharpness(model, tokens: Int[Tensor, "N n_ctx"], labels: Int[Tensor, "N"], tol: float = SHARPNESS_TOL,
              seed: int = SHARPNESS_SEED) -> dict[str, float]:
    """{'sharpness': the largest Hessian eigenvalue, 'sharpness_matvecs': Hessian-vector products used}."""
    hvp, n = hessian_vector_product(model, tokens, labels)
    calls = [0]

    def matvec(v):
        calls[0] += 1
        return hvp(v)

    v0 = np.random.default_rng(seed).standard_normal(n)
    values = eigsh(LinearOperator((n, n), matvec=matvec, dtype=np.float64), k=1, which="LA", tol=tol, v0=v0,
                   return_eigenvectors=False)
    return {"sharpness": float(values[0]), "sharpness_matvecs": float(calls[0])}
