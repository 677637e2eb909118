"""Direct logit attribution, attention at `=`, embedding circles, effective rank, residual norms."""

import math

import pytest
import torch

from geolens.analysis import circuit, eqforward, geometry
from geolens.analysis.context import AnalysisContext
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer


def _ctx(preset, n_layers=1, p=13, **kw):
    cfg = make_config(preset, p=p, d_model=16, d_mlp=32, n_heads=2, d_head=8, n_layers=n_layers, **kw)
    model = GeoTransformer(cfg)
    return AnalysisContext(model, cfg, make_dataset(cfg))


@pytest.mark.parametrize("preset", ["ln", "rms", "none", "fb", "sphere_raw"])
@pytest.mark.parametrize("n_layers", [1, 2])
def test_dla_components_add_up_to_the_real_score(preset, n_layers):
    ctx = _ctx(preset, n_layers)
    cfg = ctx.cfg
    res = circuit.direct_logit_attribution(ctx.model, cfg, ctx.eq, ctx.labels, per_input_neurons=True)
    logits, y = ctx.logits, ctx.labels
    correct = logits.gather(1, y[:, None])[:, 0]
    diff = correct - (logits.sum(1) - correct) / (logits.shape[1] - 1)
    if cfg.unembed == "bounded":
        diff = diff / cfg.tau
        assert "normalised" in res.units
    else:
        assert res.units == "logit"
    assert torch.allclose(res.actual, diff, atol=1e-5)
    assert res.recon_error < 1e-5
    names = set(res.components)
    assert {"embed_pos", "bias", f"mlp_L{n_layers - 1}"} <= names
    assert {f"L{l}H{h}" for l in range(n_layers) for h in range(2)} <= names
    mlp = res.components[f"mlp_L{n_layers - 1}"]
    assert float(res.neurons.sum()) == pytest.approx(float(mlp.mean()), abs=1e-5)
    assert torch.allclose(res.neurons_per_input.sum(1), mlp, atol=1e-5)


def test_attention_from_eq_is_a_distribution_and_uniform_is_a_third():
    ctx = _ctx("ln")
    mean, per_input = circuit.attention_from_eq(ctx.eq)
    assert mean.shape == (2, 3) and per_input.shape == (13 * 13, 2, 3)
    assert torch.allclose(per_input.sum(-1), torch.ones(13 * 13, 2))
    uni = _ctx("ln+uniform")
    assert torch.allclose(circuit.attention_from_eq(uni.eq)[0], torch.full((2, 3), 1 / 3))


def test_attention_view_renders_html():
    ctx = _ctx("ln")
    with torch.no_grad():
        _, cache = ctx.model.run_with_cache(ctx.dataset.tokens)
    view = circuit.attention_view(cache, 5, tokens=["0", "5", "="])
    assert "<" in str(view)


def test_embedding_circles_of_a_fourier_embedding_are_round():
    p = 23
    x = torch.arange(p, dtype=torch.float64)
    W_E = torch.zeros(p, 8, dtype=torch.float64)
    W_E[:, 0], W_E[:, 1] = torch.cos(2 * math.pi * 4 * x / p), torch.sin(2 * math.pi * 4 * x / p)
    W_E[:, 5], W_E[:, 6] = 0.5 * torch.cos(2 * math.pi * 9 * x / p), 0.5 * torch.sin(2 * math.pi * 9 * x / p)
    circles = circuit.embedding_circles(W_E, torch.tensor([4, 9, 2]))
    assert [c.freq for c in circles] == [4, 9, 2]
    assert circles[0].roundness == pytest.approx(1.0, abs=1e-9) and circles[1].roundness == pytest.approx(1.0, abs=1e-9)
    assert circles[0].share == pytest.approx(0.8) and circles[1].share == pytest.approx(0.2)
    radius = circles[0].coords.norm(dim=1)
    assert torch.allclose(radius, radius[0].expand(p))
    assert circles[2].share == pytest.approx(0.0, abs=1e-12)


def test_effective_rank():
    assert geometry.effective_rank(torch.eye(5)) == pytest.approx(5.0)
    assert geometry.effective_rank(torch.ones(6, 4)) == pytest.approx(1.0)
    assert geometry.effective_rank(torch.zeros(3, 3)) == 0.0
    assert geometry.effective_rank(torch.diag(torch.tensor([1.0, 1.0, 0.0]))) == pytest.approx(2.0)
    # the Gram route for large matrices agrees with the SVD route
    g = torch.Generator().manual_seed(0)
    M = torch.randn(3000, 400, generator=g).relu()
    s = torch.linalg.svdvals(M.double())
    p = s / s.sum()
    assert geometry.effective_rank(M) == pytest.approx(float(torch.exp(-(p * p.log()).sum())), rel=1e-4)


def test_effective_rank_survives_a_float32_eigensolver_failure(monkeypatch):
    """float32 LAPACK eigvalsh fails to converge on some trained checkpoints' activation Grams
    (seen at p = 113); the Gram route then decomposes in float64 instead of aborting."""
    g = torch.Generator().manual_seed(1)
    M = torch.randn(3000, 400, generator=g).relu()
    expected = geometry.effective_rank(M)
    eigvalsh = torch.linalg.eigvalsh
    dtypes = []

    def float32_fails(G):
        dtypes.append(G.dtype)
        if G.dtype == torch.float32:
            raise torch.linalg.LinAlgError("linalg.eigh: The algorithm failed to converge")
        return eigvalsh(G)

    monkeypatch.setattr(torch.linalg, "eigvalsh", float32_fails)
    assert geometry.effective_rank(M) == pytest.approx(expected, rel=1e-5)
    assert dtypes == [torch.float32, torch.float64]


def test_resid_norm_is_one_at_every_projected_hook_of_a_sphere_model():
    ctx = _ctx("fb", n_layers=2)
    res = geometry.resid_norm(ctx.eq, ctx.cfg)
    assert res["sphere_err"] < 1e-5
    for name in ("blocks.0.hook_resid_pre", "blocks.0.hook_resid_mid", "blocks.1.hook_resid_mid", "blocks.1.hook_resid_post"):
        assert res[name] == pytest.approx(1.0, abs=1e-5)
    assert abs(res["hook_embed"] - 1.0) > 0.1  # before the projection: not unit norm
    assert eqforward.projected_hooks(ctx.cfg) == ["embed_norm.hook_normalized"] + [
        f"blocks.{l}.{n}_norm.hook_normalized" for l in (0, 1) for n in ("attn", "mlp")]
    # every position of the first block's projections is checked, not only `=`
    assert ctx.eq.projected[1].shape == (13 * 13 * 3, 16)
    ln = _ctx("ln")
    assert "sphere_err" not in geometry.resid_norm(ln.eq, ln.cfg) and eqforward.projected_hooks(ln.cfg) == []


def test_resid_norm_sees_a_broken_projection():
    ctx = _ctx("fb")
    eq = ctx.eq
    eq.projected[0][0] *= 2  # one embedding row off the sphere
    assert geometry.resid_norm(eq, ctx.cfg)["sphere_err"] == pytest.approx(1.0, abs=1e-5)


def test_layer_distance_irrelevance_reads_each_layers_write_on_the_grid():
    """Constructed per-input parts: layer 0 writes a function of a + b alone (clock-like, q = 1), layer 1 one of
    a - b alone (pizza-like, q = 0); the metric on a 2-layer model is those of its own dla parts."""
    from geolens.analysis import clockpizza, compute_metrics

    ctx = _ctx("ln", n_layers=2)
    frame, n = ctx.frame, ctx.cfg.p
    a, b = ctx.dataset.tokens[:, 0], ctx.dataset.tokens[:, 1]
    s, d = ((a + b) % n).double(), ((a - b) % n).double()
    parts = {"L0H0": torch.cos(2 * math.pi * 3 * s / n), "L0H1": torch.zeros_like(s), "mlp_L0": torch.sin(2 * math.pi * s / n),
             "L1H0": torch.cos(2 * math.pi * 2 * d / n), "L1H1": d, "mlp_L1": torch.zeros_like(d)}
    q0, q1 = clockpizza.layer_distance_irrelevance(parts, 2, 2, frame)
    assert q0 == pytest.approx(1.0, abs=1e-12) and q1 == pytest.approx(0.0, abs=1e-12)
    parts["mlp_L1"] = s  # a mixed layer lies between
    assert 0.05 < clockpizza.layer_distance_irrelevance(parts, 2, 2, frame)[1] < 0.95
    rows, _ = compute_metrics(context=ctx, names=["layer_distance_irrelevance"])
    expected = clockpizza.layer_distance_irrelevance(ctx.dla.components, 2, 2, frame)
    assert [rows["layer_distance_irrelevance"][f"distance_irrelevance_L{l}"] for l in (0, 1)] == expected
    assert all(0 <= q <= 1 for q in expected)
