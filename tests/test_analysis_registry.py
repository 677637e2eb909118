"""The metric registry, the shared context and compute_metrics."""

import math

import pytest
import torch

from geolens.analysis import METRICS, AnalysisContext, compute_metrics, default_metrics, metric_versions
from geolens.analysis.context import last_position_forward
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.analysis import context as context_mod
from geolens.analysis.eqforward import eq_forward_tables
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer

SMALL = dict(d_model=32, d_mlp=64, n_heads=2, d_head=16)


def _run(preset="fb", names=None, key_freqs=None, **kw):
    cfg = make_config(preset, **kw)
    model = GeoTransformer(cfg)
    return compute_metrics(model, cfg, make_dataset(cfg), names=names, key_freqs=key_freqs)


def test_untrained_p59_model_returns_every_metric():
    cfg = make_config("fb", p=59)  # the paper's dimensions
    rows, skipped = compute_metrics(GeoTransformer(cfg), cfg, make_dataset(cfg))
    assert skipped == {}
    assert set(rows) == set(default_metrics())
    for name, row in rows.items():
        assert row, name
        assert all(isinstance(v, float) for v in row.values()), name
    assert {f"keyfreq_wl_fft_{r}" for r in range(1, 6)} <= set(rows["keyfreq_wl_fft"])
    assert all(1 <= rows["keyfreq_wl_fft"][f"keyfreq_wl_fft_{r}"] <= 29 for r in range(1, 6))
    assert {"fve_paper_U_max", "fve_paper_V_max", "fve_paper_U_1"} <= set(rows["fve_paper"])
    assert len(rows["logit_cos_coeff"]) == 29
    assert rows["resid_norm"]["resid_norm_sphere_err"] < 1e-5
    assert rows["dla"]["dla_recon_err"] < 1e-5
    assert rows["dla"]["dla_normalised_space"] == 1.0  # bounded readout: scores are logit / tau
    assert math.isnan(rows["clock_pizza"]["clock_pizza"])  # untrained: no verdict
    assert rows["loss"]["acc_test"] < 0.2
    assert -1.0 <= rows["grad_symmetricity"]["grad_symmetricity"] <= 1.0


def test_permutations_skip_fourier_metrics_with_a_reason_and_run_the_rest():
    rows, skipped = _run("ln", task="perm", n_perm=4, **SMALL)
    fourier_names = {"wl_spectrum", "keyfreq_wl_fft", "keyfreq_neuron", "keyfreq_embed", "fve_paper", "fve_neuron", "restricted_loss",
                     "excluded_loss", "logit_cos_coeff", "truncated_logit_acc", "distance_irrelevance", "circularity",
                     "clock_pizza", "embed_circles", "layer_spectrum", "layer_distance_irrelevance"}
    assert set(skipped) == fourier_names
    assert all(r == "Fourier metrics need a cyclic group Z_p; task perm is S_4" for r in skipped.values())
    assert set(rows) == set(default_metrics()) - fourier_names
    assert rows["loss"]["loss_train"] > 0 and "nlm_cosine" in rows["nlm_cosine"]


def test_multiplication_runs_everything_and_subtraction_skips_the_verdict():
    rows, skipped = _run("sphere", task="mul", p=23, **SMALL)
    assert skipped == {} and set(rows) == set(default_metrics())
    assert all(1 <= rows["keyfreq_wl_fft"][f"keyfreq_wl_fft_{r}"] <= 11 for r in range(1, 6))  # period 22
    rows, skipped = _run("ln", task="sub", p=23, **SMALL)
    assert set(skipped) == {"clock_pizza"} and "commutative" in skipped["clock_pizza"]


def test_names_filter_pinned_keys_and_unknown_names():
    rows, skipped = _run("ln", names=["excluded_loss", "fve_paper"], key_freqs=[3, 5], p=23, **SMALL)
    assert set(rows) == {"excluded_loss", "fve_paper"}
    assert math.isnan(rows["excluded_loss"]["excluded_loss_3"]) and not math.isnan(rows["excluded_loss"]["excluded_loss_2"])
    with pytest.raises(GeoError, match="unknown metric"):
        _run("ln", names=["no_such_metric"], p=23, **SMALL)
    cfg = make_config("ln", p=23, **SMALL)
    with pytest.raises(GeoError, match="CPU"):
        AnalysisContext(GeoTransformer(cfg).to("meta"), cfg, make_dataset(cfg))


def test_versions_and_applies_cover_every_metric():
    versions = metric_versions()
    assert set(versions) == set(METRICS)
    for name, spec in METRICS.items():
        assert spec.name == name and isinstance(spec.version, str) and spec.doc
        assert spec.applies(make_config("ln")) is None


def test_context_forward_is_exact_and_shared():
    cfg = make_config("ln", p=23, **SMALL)
    model = GeoTransformer(cfg)
    ds = make_dataset(cfg)
    ctx = AnalysisContext(model, cfg, ds)
    with torch.no_grad():
        ref = model(ds.tokens)[:, -1]
        assert torch.allclose(ctx.logits, ref, atol=1e-6, rtol=0)
        assert torch.allclose(last_position_forward(model, cfg)(ds.tokens[:7]), model(ds.tokens[:7])[:, -1], atol=1e-6, rtol=0)
    assert ctx.eq is ctx.eq and ctx.acts.shape == (23 * 23, 64)
    assert ctx.eq["blocks.0.attn.hook_pattern"].shape == (23 * 23, 2, 3)  # the `=` query's row
    assert not model.hook_dict["blocks.0.hook_resid_mid"].fwd_hooks  # hooks removed afterwards


def test_compute_metrics_on_a_given_context_reuses_its_forward(monkeypatch):
    """compute_metrics(context=ctx) computes on the caller's context: one forward for every call,
    the same values as a fresh compute_metrics, and either a context or (model, cfg, dataset)."""
    cfg = make_config("fb", p=23, **SMALL)
    model, ds = GeoTransformer(cfg), make_dataset(cfg)
    forwards = []
    monkeypatch.setattr(context_mod, "eq_forward_tables", lambda *a: forwards.append(1) or eq_forward_tables(*a))
    ctx = AnalysisContext(model, cfg, ds)
    first, _ = compute_metrics(context=ctx, names=["loss", "dla"])
    second, _ = compute_metrics(context=ctx, names=["attn_eq", "fve_paper"])
    assert len(forwards) == 1 and ctx.dla is ctx.dla
    fresh, _ = compute_metrics(model, cfg, ds, names=["loss", "dla", "attn_eq", "fve_paper"])
    assert len(forwards) == 2 and {**first, **second} == fresh
    with pytest.raises(GeoError, match="not both"):
        compute_metrics(model, cfg, ds, context=ctx)
    with pytest.raises(GeoError, match="context="):
        compute_metrics(names=["loss"])
