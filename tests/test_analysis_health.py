"""Softmax collapse, zero-loss fraction and the NLM cosine."""

import math

import pytest
import torch
import torch.nn.functional as F

from geolens.analysis import health
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_crafted_logits_give_the_expected_fractions(dtype):
    C = 23
    logits = torch.zeros(8, C, dtype=dtype)
    labels = torch.arange(8) % C
    # rows 0-2: the label wins by 1000 -> denominator exactly 1 and loss exactly 0
    for r in range(3):
        logits[r, labels[r]] = 1000.0
    # rows 3-4: a wrong class wins by 1000 -> denominator exactly 1, loss 1000
    for r in (3, 4):
        logits[r, (labels[r] + 1) % C] = 1000.0
    # rows 5-7: margin 5 -> exp(-5) terms survive, no collapse, loss > 0
    for r in (5, 6, 7):
        logits[r, labels[r]] = 5.0
    assert health.softmax_collapse(logits) == pytest.approx(5 / 8)
    assert health.zero_loss_fraction(logits, labels) == pytest.approx(3 / 8)


def test_collapse_depends_on_the_precision():
    # margin 30: exp(-30) * 22 ~ 2e-12 vanishes next to 1 in float32, not in float64
    logits = torch.zeros(1, 23)
    logits[0, 0] = 30.0
    assert health.softmax_collapse(logits) == 1.0
    assert health.softmax_collapse(logits.double()) == 0.0


def _tiny(preset):
    cfg = make_config(preset, p=11, d_model=16, d_mlp=32, n_heads=2, d_head=8)
    return cfg, GeoTransformer(cfg), make_dataset(cfg)


def test_nlm_cosine_matches_a_manual_computation():
    cfg, model, ds = _tiny("ln")
    x, y = ds.train
    res = health.nlm_cosine(model, x, y)
    assert all(p.grad is None for p in model.parameters())
    loss = F.cross_entropy(model(x)[:, -1], y)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    neg = torch.cat([-g.flatten() for g in grads]).double()
    theta = torch.cat([p.detach().flatten() for p in model.parameters()]).double()
    assert res["total"] == pytest.approx(float(neg @ theta / (neg.norm() * theta.norm())), abs=1e-6)
    name, p = next(iter(model.named_parameters()))
    g0 = -grads[0].flatten().double()
    assert res[name] == pytest.approx(float(g0 @ p.detach().flatten().double() / (g0.norm() * p.detach().norm())), abs=1e-6)
    assert math.isnan(res["blocks.0.attn_norm.b"])  # zero parameter vector: undefined


def test_nlm_cosine_of_a_scale_invariant_readout_is_zero():
    # bounded unembedding: logits depend on W_U only through its normalised columns, so the
    # gradient is orthogonal to W_U column by column
    cfg, model, ds = _tiny("fb")
    res = health.nlm_cosine(model, *ds.train)
    assert abs(res["unembed.W_U"]) < 1e-5
    assert -1.0 <= res["total"] <= 1.0
