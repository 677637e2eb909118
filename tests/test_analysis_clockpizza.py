"""Clock vs Pizza diagnostics on hand-built clock and pizza models."""

import math

import pytest
import torch
import torch.nn as nn
from transformer_lens.hook_points import HookPoint
from transformer_lens.HookedRootModule import HookedRootModule

from geolens.analysis import clockpizza, fourier
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset

P = 31
K = 4  # the one frequency both toy models use


class ToyModAdd(HookedRootModule):
    """Hand-built one-frequency modular adder with 2-D token embeddings.

    Token x embeds as r_x (cos w x, sin w x), read as the complex number r_x e^{i w x}; the logit of
    class c is Re(z e^{-i w c}) with
      clock: z = e_a e_b                 (complex product: angles add, radii multiply)
      pizza: z = (e_a + e_b)^2           (a function of e_a + e_b only)
    For the clock the correct logit is r_a r_b; for the pizza (r = 1) it is 4 cos^2(w(a-b)/2),
    a function of a - b only. Both classify every input correctly. Like a GeoTransformer it
    returns logits [batch, pos, C] whose last position is the prediction (the others are zero).
    """

    def __init__(self, kind: str, p: int = P, k: int = K, radii: torch.Tensor | None = None):
        super().__init__()
        self.kind, self.p, self.w = kind, p, 2 * math.pi * k / p
        x = torch.arange(p + 1, dtype=torch.float32)
        r = torch.ones(p + 1) if radii is None else radii
        self.embed = nn.Module()
        self.embed.W_E = nn.Parameter(torch.stack([r * torch.cos(self.w * x), r * torch.sin(self.w * x)], dim=1))
        self.hook_embed = HookPoint()
        self.setup()

    def forward(self, tokens):
        e = self.hook_embed(self.embed.W_E[tokens])
        ar, ai, br, bi = e[:, 0, 0], e[:, 0, 1], e[:, 1, 0], e[:, 1, 1]
        if self.kind == "clock":
            zr, zi = ar * br - ai * bi, ar * bi + ai * br
        else:
            sr, si = ar + br, ai + bi
            zr, zi = sr * sr - si * si, 2 * sr * si
        c = torch.arange(self.p, dtype=torch.float32)
        last = zr[:, None] * torch.cos(self.w * c) + zi[:, None] * torch.sin(self.w * c)
        return torch.cat([torch.zeros(len(tokens), tokens.shape[1] - 1, self.p), last[:, None]], dim=1)


def _clock():
    x = torch.arange(P + 1, dtype=torch.float32)
    return ToyModAdd("clock", radii=1.0 + 0.5 * torch.sin(2.399 * x * x))  # irregular radii


def _diagnostics(model):
    cfg = make_config("ln", p=P)
    ds = make_dataset(cfg)
    frame = fourier.cyclic_frame(cfg)
    with torch.no_grad():
        logits = model(ds.tokens)[:, -1]
    acc = float((logits.argmax(-1) == ds.labels).float().mean())
    gs = clockpizza.grad_symmetricity(model, P)
    di = clockpizza.distance_irrelevance(clockpizza.correct_logit_grid(logits, ds.labels, frame), frame)
    return gs, di, acc


def test_hand_built_pizza_is_on_the_pizza_side():
    gs, di, acc = _diagnostics(ToyModAdd("pizza"))
    assert acc == 1.0
    assert gs == pytest.approx(1.0, abs=1e-5)
    assert di == pytest.approx(0.0, abs=1e-4)
    assert gs >= clockpizza.GRAD_SYM_PIZZA_MIN and di < clockpizza.DIST_IRR_CLOCK_MIN
    assert clockpizza.clock_pizza_verdict(gs, di, acc) == "pizza"


def test_hand_built_clock_is_on_the_clock_side():
    gs, di, acc = _diagnostics(_clock())
    assert acc == 1.0
    assert gs < clockpizza.GRAD_SYM_PIZZA_MIN - 0.3
    assert di >= clockpizza.DIST_IRR_CLOCK_MIN + 0.2
    assert clockpizza.clock_pizza_verdict(gs, di, acc) == "clock"


def test_grad_symmetricity_is_deterministic_and_leaves_grads_alone():
    model = _clock()
    assert clockpizza.grad_symmetricity(model, P) == clockpizza.grad_symmetricity(model, P)
    assert model.embed.W_E.grad is None
    assert clockpizza.grad_symmetricity(model, P, seed=1) != clockpizza.grad_symmetricity(model, P)


def test_verdict_rules():
    v = clockpizza.clock_pizza_verdict
    assert v(0.99, 0.1, 1.0) == "pizza"
    assert v(0.3, 0.9, 1.0) == "clock"
    assert v(0.99, 0.9, 1.0) == "mixed" and v(0.3, 0.1, 1.0) == "mixed"
    assert v(0.99, 0.1, 0.2) == "unsolved" and v(float("nan"), 0.1) == "unsolved"
    assert clockpizza.verdict_code("clock") == 1.0 and clockpizza.verdict_code("pizza") == -1.0
    assert math.isnan(clockpizza.verdict_code("unsolved"))


def _literal_circularity(v, p):
    """The spec's formula with the multiplier i, for prime p; v [p] scaled to sum v^2 = 1/p."""
    t = torch.arange(p)
    e = torch.exp(2j * math.pi * t.double() / p)
    best = max(float((v[(t * i) % p].to(torch.complex128) * e).sum().abs() ** 2) for i in range(1, p))
    return min(1.0, 2 * best)


def test_circularity_of_a_circular_embedding_is_one():
    x = torch.arange(P, dtype=torch.float64)
    W_E = torch.stack([torch.cos(2 * math.pi * 3 * x / P), torch.sin(2 * math.pi * 3 * x / P),
                       0.5 * torch.cos(2 * math.pi * 10 * x / P), 0.5 * torch.sin(2 * math.pi * 10 * x / P),
                       torch.zeros(P)], dim=1)
    comps = clockpizza.circularity_components(W_E)
    assert comps.shape == (4,)
    assert torch.allclose(comps, torch.ones(4, dtype=torch.float64), atol=1e-9)
    assert clockpizza.circularity(W_E) == pytest.approx(1.0)


def test_circularity_matches_the_literal_formula_and_is_low_for_noise():
    g = torch.Generator().manual_seed(0)
    W_E = torch.randn(P, 16, generator=g, dtype=torch.float64)
    comps = clockpizza.circularity_components(W_E)
    X = W_E - W_E.mean(0)
    U, S, _ = torch.linalg.svd(X, full_matrices=False)
    for m in range(4):
        v = U[:, m] * S[m]
        v = v / (v.square().sum() * P).sqrt()
        assert comps[m] == pytest.approx(_literal_circularity(v, P), abs=1e-9)
    assert clockpizza.circularity(W_E) < 0.7
