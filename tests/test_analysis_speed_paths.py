"""The fast analysis routes agree with the hooked reference (run_with_cache, hooked gradients)."""

import math

import pytest
import torch

from geolens.analysis import compute_metrics
from geolens.analysis import context as context_mod
from geolens.analysis.eqforward import eq_forward_tables, eq_from_cache, eq_hooks
from geolens.model.engines import engine_named
from geolens.model.fast import fast_eq_forward
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer

CASES = [
    ("fb", {}),
    ("ln", {}),
    ("rms", {"causal": True}),
    ("none", {"task": "mul"}),
    ("sphere_raw", {"attention": "uniform", "task": "sub"}),
]


def _model(preset, kw, p=31):
    cfg = make_config(preset, p=p, **kw)
    return GeoTransformer(cfg), cfg, make_dataset(cfg)


@pytest.mark.parametrize("preset,kw", CASES)
def test_eq_forward_tables_matches_run_with_cache(preset, kw):
    model, cfg, ds = _model(preset, kw)
    with torch.no_grad():
        ref = eq_from_cache(*model.run_with_cache(ds.tokens), cfg)
    eq = eq_forward_tables(fast_eq_forward(model, ds.tokens), cfg)
    assert eq.values.keys() == ref.values.keys() == set(eq_hooks(cfg))
    assert (eq.logits - ref.logits).abs().max() <= 1e-5
    for name, value in ref.values.items():
        assert eq[name].shape == value.shape, name
        assert torch.allclose(eq[name], value, rtol=1e-5, atol=1e-5), name
    assert len(eq.projected) == len(ref.projected) == (3 if cfg.norm == "sphere" else 0)
    for x in eq.projected:
        assert (x.norm(dim=-1) - 1).abs().max() < 1e-5


def _close(a: float, b: float) -> bool:
    """Equal up to float32 rounding; abs_tol 1e-4 covers percent-valued metrics (fve_paper) near 0."""
    return (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)


@pytest.mark.parametrize("preset,kw", CASES)
def test_every_metric_matches_the_reference_route(preset, kw, monkeypatch):
    model, cfg, ds = _model(preset, kw)
    fast_rows, fast_skipped = compute_metrics(model, cfg, ds)
    monkeypatch.setattr(context_mod, "choose_engine", lambda cfg, requested: (engine_named("hooked"), "forced"))
    ref_rows, ref_skipped = compute_metrics(model, cfg, ds)
    assert fast_skipped == ref_skipped and fast_rows.keys() == ref_rows.keys()
    for name, row in ref_rows.items():
        assert fast_rows[name].keys() == row.keys(), name
        for key, value in row.items():
            assert _close(fast_rows[name][key], value), (name, key, fast_rows[name][key], value)
