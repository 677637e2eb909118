"""The report's figures show the right data: shapes, ranges and the values they plot."""

import pytest
import torch

from geolens.analysis.trajectory import analyze_run
from geolens.model.config import make_config
from geolens.outputs.plots import Heatmap, Line, Region
from geolens.outputs.report import build_figures, write_report
from geolens.runs.run import load_run
from geolens.training import train as training

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.6, lr=3e-3)


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    path = tmp_path_factory.mktemp("report") / "run"
    cfg = make_config("fb", epochs=120, eval_every=10, checkpoints="every:40", seed=1, **SMALL)
    training.train(cfg, path, progress=False)
    return analyze_run(load_run(path), progress=False)


@pytest.fixture(scope="module")
def figures(traj):
    return {spec.name: spec for spec in build_figures(traj, at=[40, 120])}


def test_the_report_draws_every_figure(figures):
    assert list(figures) == ["training", "spectrum", "progress", "clock_pizza", "embedding_circles", "attention"]


def test_training_curves_are_the_metrics_table(traj, figures):
    rows = traj.run.metrics
    loss, acc = figures["training"].panels
    lines = {t.name: t for t in loss.traces if isinstance(t, Line)}
    assert list(lines["train"].x) == [r["epoch"] for r in rows]
    assert list(lines["test"].y) == [r["test_loss"] for r in rows]
    accs = [y for t in acc.traces if isinstance(t, Line) for y in t.y]
    assert all(0.0 <= a <= 1.0 for a in accs)


def test_spectrum_is_frequency_by_step_scaled_per_step(traj, figures):
    (heat,) = figures["spectrum"].panels[0].traces
    z = torch.tensor(heat.z)
    assert list(heat.y) == list(range(1, 12)) and list(heat.x) == traj.steps  # frequencies 1..(p-1)/2
    assert z.shape == (11, len(traj.steps)) and z.min() >= 0 and torch.allclose(z.amax(0), torch.ones(len(traj.steps)))
    raw = [traj.values[120]["wl_spectrum"][f"wl_spectrum_{k}"] for k in range(1, 12)]
    assert torch.allclose(z[:, -1], torch.tensor(raw) / max(raw))


def test_clock_pizza_path_plots_the_two_diagnostics(traj, figures):
    panel = figures["clock_pizza"].panels[0]
    path = next(t for t in panel.traces if isinstance(t, Line) and t.name == "trajectory")
    assert list(path.x) == [traj.values[s]["distance_irrelevance"]["distance_irrelevance"] for s in traj.steps]
    assert list(path.y) == [traj.values[s]["grad_symmetricity"]["grad_symmetricity"] for s in traj.steps]
    assert sum(isinstance(t, Region) for t in panel.traces) == 2


def test_attention_is_a_heads_by_three_pattern_of_the_equals_query(traj, figures):
    panels = figures["attention"].panels
    assert [p.title.split(",")[0] for p in panels] == ["epoch 40", "epoch 120"]
    model = traj.run.model_at(120)
    with torch.no_grad():
        _, cache = model.run_with_cache(traj.run.dataset.tokens)
    expected = cache["blocks.0.attn.hook_pattern"][:, :, -1, :].mean(0)  # [heads, key]: the `=` query's row
    (heat,) = panels[1].traces
    assert isinstance(heat, Heatmap) and list(heat.x) == ["a", "b", "="] and list(heat.y) == ["H0", "H1", "H2", "H3"]
    z = torch.tensor(heat.z)
    assert z.shape == (4, 3) and torch.allclose(z.sum(1), torch.ones(4), atol=1e-5)
    assert torch.allclose(z, expected, atol=1e-5)


def test_embedding_circles_place_every_token_on_each_key_plane(traj, figures):
    panels = figures["embedding_circles"].panels
    assert len(panels) == 2 * 5  # two steps x five key frequencies
    for panel in panels:
        (line,) = panel.traces
        assert len(line.x) == len(line.y) == 23 and panel.equal_axes


def test_a_narrower_rerun_keeps_earlier_results_and_removes_stale_figures(traj):
    run, out = traj.run, traj.out
    (out / "figures" / "old_figure.png").parent.mkdir(parents=True, exist_ok=True)
    (out / "figures" / "old_figure.png").write_bytes(b"stale")
    write_report(traj, static=("png",))
    assert not (out / "figures" / "old_figure.png").exists()
    assert (out / "figures" / "attention.png").stat().st_size > 1000
    small = analyze_run(load_run(run.path), metrics=["loss"], steps=[40], progress=False)
    assert small.computed == 0 and small.steps == traj.steps
    table = (out / "metrics.csv").read_text()
    assert "fve_paper" in table and "grad_symmetricity" in table  # not only what the narrow call asked for


def test_progress_uses_the_final_keys_and_says_so(traj, figures):
    """Fixed keys by default: the titles name them, the key-set stability epoch is marked, and the embedding
    circles of every step are drawn on the final keys."""
    from geolens.analysis.trajectory import keys_settled
    from geolens.outputs.plots import VLine

    last = traj.values[traj.steps[-1]]["keyfreq_wl_fft"]
    assert traj.keys == [int(last[f"keyfreq_wl_fft_{r}"]) for r in range(1, 6)]
    words = f"keys {', '.join(map(str, traj.keys))} pinned over the run"
    titles = [p.title for p in figures["progress"].panels]
    assert any(t.startswith("restricted / excluded loss") and words in t for t in titles)
    settled = keys_settled(traj)
    assert settled in traj.steps
    marks = [t for t in figures["progress"].panels[0].traces if isinstance(t, VLine)]
    assert any(m.x == settled and "top-5 keys settled" in m.name for m in marks)
    circles = figures["embedding_circles"].panels
    assert {int(p.title.split("k = ")[1].split(" ")[0]) for p in circles} == set(traj.keys)


def test_key_stability_is_the_first_step_of_the_final_key_set(traj):
    from dataclasses import replace

    from geolens.analysis.trajectory import keys_settled

    def ranked(*keys):
        return {"keyfreq_wl_fft": {**{f"keyfreq_wl_fft_{r}": float(k) for r, k in enumerate(keys, 1)},
                                   "keyfreq_wl_fft_share": 0.5}}

    values = {0: ranked(1, 2, 3, 4, 5), 10: ranked(5, 4, 3, 2, 1), 20: ranked(1, 2, 3, 4, 6), 30: ranked(6, 4, 3, 2, 1),
              40: ranked(1, 2, 3, 4, 6)}
    assert keys_settled(replace(traj, steps=sorted(values), values=values)) == 20  # as sets; order does not count
    assert keys_settled(replace(traj, steps=[0], values={0: ranked(1, 2, 3, 4, 5)})) == 0
    assert keys_settled(replace(traj, steps=[0], values={0: {}})) is None


def test_the_landscape_figure_plots_the_llc_its_spread_and_the_sharpness(traj, tmp_path):
    """Drawn only where the opt-in metrics were computed; each line is the metric table's series."""
    import shutil

    from geolens.outputs.report import fig_landscape

    assert fig_landscape(traj) is None  # a bare analyze computes neither
    shutil.copytree(traj.run.path, tmp_path / "run", ignore=shutil.ignore_patterns("analysis"))
    t = analyze_run(load_run(tmp_path / "run"), metrics=["llc", "sharpness"], steps=[40, 120], progress=False)
    spec = fig_landscape(t)
    assert [p.title for p in spec.panels] == ["LLC, whole model (devinterp SGLD)", "LLC per component (SGLD on that group only)",
                                              "sharpness (training loss)"]
    whole, parts, sharp = ([tr for tr in p.traces if isinstance(tr, Line)] for p in spec.panels)
    llc, std = t.series("llc", "llc")[1], t.series("llc", "llc_std")[1]
    assert whole[0].x == [40, 120] and whole[0].y == llc
    assert whole[1].y == pytest.approx([m + s for m, s in zip(llc, std)]) and whole[2].y == pytest.approx([m - s for m, s in zip(llc, std)])
    assert [p.name for p in parts] == ["embed", "attn", "mlp", "unembed"]
    assert parts[2].y == t.series("llc", "llc_mlp")[1]
    assert sharp[0].y == t.series("sharpness", "sharpness")[1] and all(v > 0 for v in sharp[0].y)


def test_a_two_layer_report_has_one_row_of_panels_per_layer(tmp_path):
    cfg = make_config("fb", n_layers=2, epochs=60, eval_every=10, checkpoints="every:20", seed=1, **SMALL)
    training.train(cfg, tmp_path / "run", progress=False)
    traj = analyze_run(load_run(tmp_path / "run"), progress=False)
    spec = {s.name: s for s in build_figures(traj)}["layers"]
    titles = [p.title for p in spec.panels]
    assert titles == [f"layer {l}: {what}" for l in (0, 1) for what in
                      ("MLP direct path W_out W_U, top-key share", "MLP neurons on one frequency",
                       "distance irrelevance of its write (clock ~1, pizza ~0)")]
    for layer in (0, 1):  # each panel plots the metric table's per-layer series
        line = spec.panels[3 * layer].traces[0]
        assert (line.x, line.y) == tuple(map(list, traj.series("layer_spectrum", f"layer_spectrum_L{layer}_share")))
        assert all(0 <= v <= 1 for v in line.y) and line.x == traj.steps
        q = spec.panels[3 * layer + 2].traces[0]
        assert (q.x, q.y) == tuple(map(list, traj.series("layer_distance_irrelevance", f"distance_irrelevance_L{layer}")))
        assert all(0 <= v <= 1 for v in q.y) and q.x == traj.steps
    attention = {s.name: s for s in build_figures(traj)}["attention"]
    assert [p.title.split(": ")[0].split(", ")[1] for p in attention.panels][:2] == ["layer 0", "layer 1"]
