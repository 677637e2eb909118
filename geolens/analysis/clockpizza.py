"""Clock vs Pizza diagnostics (Zhong et al. 2023) and geolens's verdict built on them.

- grad_symmetricity: how interchangeable the two operand embeddings are for the logits.
- distance_irrelevance: how much the correct logit depends on the difference a - b;
  layer_distance_irrelevance: the same of each layer's direct contribution (its heads and MLP).
- circularity: how circular the top principal components of the token embedding are.
- clock_pizza_verdict: thresholds below, documented in docs/metrics.md.

The thresholds are geolens choices (the anchor paper shows scatter plots, not cut-offs). The
ideal constructions bracket them: an exact pizza (logits a function of e_a + e_b, scaled by
|cos(w(a-b)/2)|) has symmetricity 1 and irrelevance 0; an exact clock (logits from the product
e_a e_b with token-dependent radii) has symmetricity near 0 and irrelevance near 1.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.analysis.fourier import CyclicFrame
from geolens.threads import single_thread

GRAD_SYM_PIZZA_MIN = 0.9  # pizza needs gradient symmetricity >= this; clock needs < this
DIST_IRR_CLOCK_MIN = 0.5  # clock needs distance irrelevance >= this; pizza needs < this
SOLVED_ACC_MIN = 0.9  # no verdict below this test accuracy: an unsolved model has no algorithm yet
N_TRIPLES = 100
TRIPLE_SEED = 0
N_CIRCULARITY_COMPONENTS = 4


def grad_symmetricity(
    model, n_classes: int, n_triples: int = N_TRIPLES, seed: int = TRIPLE_SEED
) -> float:
    """Mean cosine between d logit_c / d e_a and d logit_c / d e_b over fixed random triples.

    Triples (a, b, c) are drawn uniformly from all n_classes^3 with torch.Generator(seed) (c any
    class, not necessarily the correct one). e_a and e_b are the token embedding vectors of the
    input [a, b, =] *before* the positional embedding is added: the activation at `hook_embed`
    is replaced by a leaf tensor and the gradients are taken with respect to it. Works for any
    HookedRootModule with a `hook_embed` hook point, an `embed.W_E` parameter and
    forward(tokens) -> logits [batch, pos, C] whose last position is the prediction.
    """
    g = torch.Generator().manual_seed(seed)
    a, b, c = torch.randint(0, n_classes, (3, n_triples), generator=g)
    tokens = torch.stack([a, b, torch.full_like(a, n_classes)], dim=1)
    emb = model.embed.W_E[tokens].detach().clone().requires_grad_(True)
    with torch.enable_grad():
        logits = model.run_with_hooks(tokens, fwd_hooks=[("hook_embed", lambda act, hook: emb)])[:, -1]
        selected = logits[torch.arange(n_triples), c].sum()  # examples are independent
        (grad,) = torch.autograd.grad(selected, emb)
    cos = torch.nn.functional.cosine_similarity(grad[:, 0], grad[:, 1], dim=-1, eps=1e-30)
    return float(cos.mean())


def distance_irrelevance(correct_logit_grid: Float[Tensor, "n n"], frame: CyclicFrame) -> float:
    """Zhong's distance irrelevance, on the **correct-class** logit.

    correct_logit_grid[i, j]: logit of the correct class for the input at grid cell [i, j] (group
    order). With s the label position (i + j; i - j for subtraction) and d the "distance"
    (i - j; i + j for subtraction), table L[s, d]; q = mean over d of (std over s of L) divided by
    the std of all of L (population stds). Implemented by walking each d-diagonal of the grid:
    for fixed d, i runs over 0..n-1 and j = sign * (i - d) mod n, which visits every s once for
    odd n (for even n, e.g. multiplication with n = p - 1, each reachable s twice).
    """
    n = frame.n
    i = torch.arange(n)
    d = torch.arange(n)
    j = (frame.sign * (i[None, :] - d[:, None])) % n  # [d, i]
    table = correct_logit_grid[i[None, :].expand(n, n), j]  # [d, i]
    total = correct_logit_grid.std(correction=0)
    if total == 0:
        return float("nan")
    return float(table.std(dim=1, correction=0).mean() / total)


def layer_distance_irrelevance(components: dict[str, Tensor], n_layers: int, n_heads: int,
                               frame: CyclicFrame) -> list[float]:
    """Distance irrelevance of each layer's direct contribution to the correct-class score, [n_layers].

    components: circuit.DLAResult.components (name -> [N] score per input, correct class minus the mean of the
    others): layer l's contribution is the sum of its heads 'L{l}H{h}' and its MLP 'mlp_L{l}', put on the
    grid and measured as distance_irrelevance measures the correct logit. A layer that writes what depends on
    a + b alone scores 1 (clock-like), one whose write is scaled by a function of a - b scores lower (pizza-like):
    which layer carries which algorithm when the model's verdict mixes them."""
    out = []
    for layer in range(n_layers):
        write = sum(components[f"L{layer}H{h}"] for h in range(n_heads)) + components[f"mlp_L{layer}"]
        out.append(distance_irrelevance(write[frame.grid_rows], frame))
    return out


def circularity_components(W_E: Float[Tensor, "n d_model"], n_components: int = N_CIRCULARITY_COMPONENTS) -> Float[Tensor, "m"]:
    """Circularity c(v) of each of the first principal components of the token embeddings.

    W_E rows: the n group tokens in group order. PCA of the centred rows; v = scores of the tokens
    on a component, scaled so sum v^2 = 1/n; c(v) = min(1, max over i in 1..n-1 of
    2 |sum_t v[t i mod n] e^{2 pi i t / n}|^2). Substituting u = t i shows the inner sum is the
    DFT of v at frequency i^-1, and i^-1 runs over 1..n-1 with i, so for prime n this is
    min(1, 2 max_k |DFT_k(v)|^2), which is what is computed (and is the natural reading for the
    even period of multiplication). Components with zero variance are skipped (fewer than
    n_components are returned).
    """
    n = W_E.shape[0]
    X = (W_E - W_E.mean(0)).double()
    with single_thread():
        U, S, _ = torch.linalg.svd(X, full_matrices=False)
    m = int(min(n_components, (S > 1e-9 * S[0]).sum())) if S.numel() and S[0] > 0 else 0
    v = U[:, :m] * S[:m]  # [n, m] component scores
    v = v / (v.square().sum(0, keepdim=True) * n).sqrt()  # sum v^2 = 1/n
    power = torch.fft.fft(v, dim=0).abs().square()[1:]  # frequencies 1..n-1
    return (2 * power.max(dim=0).values).clamp(max=1.0).to(W_E.dtype)


def circularity(W_E: Float[Tensor, "n d_model"]) -> float:
    """Mean circularity of the first 4 principal components (1 for a perfect circle of tokens)."""
    c = circularity_components(W_E)
    return float(c.mean()) if c.numel() else float("nan")


def clock_pizza_verdict(grad_sym: float, dist_irr: float, test_acc: float | None = None) -> str:
    """'clock', 'pizza', 'mixed' (the two diagnostics disagree) or 'unsolved'.

    pizza: grad_sym >= GRAD_SYM_PIZZA_MIN and dist_irr < DIST_IRR_CLOCK_MIN
    clock: grad_sym <  GRAD_SYM_PIZZA_MIN and dist_irr >= DIST_IRR_CLOCK_MIN
    unsolved: test_acc given and below SOLVED_ACC_MIN, or a diagnostic is NaN.
    """
    if (test_acc is not None and test_acc < SOLVED_ACC_MIN) or math.isnan(grad_sym) or math.isnan(dist_irr):
        return "unsolved"
    pizza_grad = grad_sym >= GRAD_SYM_PIZZA_MIN
    pizza_dist = dist_irr < DIST_IRR_CLOCK_MIN
    if pizza_grad and pizza_dist:
        return "pizza"
    if not pizza_grad and not pizza_dist:
        return "clock"
    return "mixed"


VERDICT_CODES = {"clock": 1.0, "pizza": -1.0, "mixed": 0.0, "unsolved": float("nan")}


def verdict_code(verdict: str) -> float:
    """Scalar for metrics tables: clock +1, pizza -1, mixed 0, unsolved NaN."""
    return VERDICT_CODES[verdict]


def correct_logit_grid(logits: Float[Tensor, "N C"], labels: Int[Tensor, "N"], frame: CyclicFrame) -> Float[Tensor, "n n"]:
    """Correct-class logit of every grid input, [n, n] in group order."""
    rows = frame.grid_rows
    return logits[rows, labels[rows]]
