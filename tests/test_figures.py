"""`geolens figures`: each figure's data checked against the runs it was drawn from."""

import math
import sys

import pytest
import torch

from geolens.analysis import compute_metrics
from geolens.analysis.fourier import cyclic_frame
from geolens.analysis.trajectory import analyze_run
from geolens.cli import main
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.analysis import context as context_mod
from geolens.analysis.eqforward import eq_forward_tables
from geolens.outputs import figures
from geolens.outputs.figures import (
    ZOOM_EPOCHS,
    analysis_step,
    build_figures,
    clock_pizza_path,
    fig_onsets,
    fig_test_accuracy,
    fig_uniform_attention,
    snapshot,
    write_figures,
)
from geolens.outputs.paper import paper_tables
from geolens.outputs.plots import Bar, Line, Region
from geolens.outputs.tables import build_tables
from geolens.runs.run import load_run
from geolens.runs.runset import find_runs, group_runs

ADD = dict(task="add", p=113, eval_every=100)


def _groups(root):
    runs, _ = find_runs(root)
    return group_runs(runs)


@pytest.fixture
def curves(tmp_path, write_run, step_curve):
    """fb (two seeds, 8,000 epochs) and ln (one seed) at lr 6e-4, and ln+uniform at lr 1e-4 (two seeds)."""
    write_run(tmp_path / "fb1", make_config("fb", seed=1, lr=6e-4, epochs=8000, **ADD), step_curve(700, 8000, 100))
    write_run(tmp_path / "fb2", make_config("fb", seed=2, lr=6e-4, epochs=8000, **ADD), step_curve(1150, 8000, 100))
    write_run(tmp_path / "ln1", make_config("ln", seed=1, lr=6e-4, epochs=8000, **ADD), step_curve(7300, 8000, 100))
    for s in (1, 2):
        write_run(tmp_path / f"u{s}", make_config("ln+uniform", seed=s, lr=1e-4, beta2=0.98, epochs=3000, **ADD),
                  step_curve(1000 * s, 3000, 100, after=1.0), train_acc=0.9)
    return tmp_path


def test_test_accuracy_curves_are_the_metrics(curves):
    groups = _groups(curves)
    spec = fig_test_accuracy(groups)
    assert [p.title for p in spec.panels] == ["add p=113: test accuracy", "add p=113: test accuracy, first 5,000 epochs"]
    full, zoom = spec.panels
    lines = [t for t in full.traces if isinstance(t, Line)]
    assert len(lines) == 5  # one line per run
    for line in lines:
        seed = int(line.text[0].split()[1])
        group = next(g for g in groups if g.label == line.name)
        run = next(r for r in group.runs if r.config.seed == seed)
        assert list(line.x) == [r["epoch"] for r in run.metrics] and list(line.y) == [r["test_acc"] for r in run.metrics]
    zlines = [t for t in zoom.traces if isinstance(t, Line)]
    assert all(max(t.x) <= ZOOM_EPOCHS for t in zlines)
    assert [len(t.x) for t in zlines] == [len([e for e in t.x if e <= ZOOM_EPOCHS]) for t in lines]
    # one legend entry and one colour per configuration
    assert sorted(t.name for t in lines if t.legend) == sorted(g.label for g in groups)
    assert len({t.color for t in lines}) == len(groups)
    assert all(len({t.color for t in lines if t.name == g.label}) == 1 for g in groups)


def test_uniform_attention_figure(curves, tmp_path):
    groups = _groups(curves)
    spec = fig_uniform_attention(groups)
    assert [p.title for p in spec.panels] == ["ln+uniform (beta2=0.98) lr 0.0001 wd 1, add p=113"]
    traces = spec.panels[0].traces
    assert [t.name for t in traces] == ["seed 1 test", "seed 1 train", "seed 2 test", "seed 2 train"]
    run2 = load_run(curves / "u2")
    assert list(traces[2].y) == [r["test_acc"] for r in run2.metrics] and set(traces[3].y) == {0.9}
    assert traces[3].dash and not traces[2].dash
    assert fig_uniform_attention([g for g in groups if g.config.attention == "learned"]) is None


def test_onset_dots_are_the_table_onsets_and_the_paper_markers_its_numbers(curves):
    tables, _ = build_tables(curves)
    spec = fig_onsets(tables)
    assert [p.title for p in spec.panels] == [t.title for t in tables] == [
        "Table 1: Z_113 addition, grokking onset", "Table 3: uniform attention, Z_113 addition, peak test accuracy"]
    panel = spec.panels[0]
    table1 = tables[0]
    measured = [r for r in table1.rows if r.group is not None]
    assert [label for _, label in panel.xticks] == [r.group.label for r in measured]
    dots = [t for t in panel.traces if t.name == "our seeds"]
    for i, (row, trace) in enumerate(zip(measured, dots)):
        assert list(trace.y) == row.values("onset_grid")
        assert all(abs(x - i) < 0.5 for x in trace.x)
    fb_dots = dots[[r.group.name for r in measured].index("fb")]
    assert list(fb_dots.y) == [800, 1200]
    ref = {(r["config"], r["lr"], r["wd"]): r for r in paper_tables()["table1_zp_addition_p113"]["rows"]}
    means = [t for t in panel.traces if t.name == "paper mean"]
    ranges = [t for t in panel.traces if t.name == "paper min-max"]
    expected = [ref[(r.paper.config, r.paper.lr, r.paper.wd)] for r in measured]
    assert [t.y[0] for t in means] == [e["mean"] for e in expected] == [7800, 820]
    assert [list(t.y) for t in ranges] == [[e["min"], e["max"]] for e in expected]
    assert sum(t.legend for t in means) == 1
    peak = spec.panels[1]
    assert [list(t.y) for t in peak.traces if t.name == "our seeds"] == [[1.0, 1.0]]
    assert [t.y[0] for t in peak.traces if t.name == "paper mean"] == [1.0]


def test_figures_without_checkpoints_keep_the_metric_figures(curves, tmp_path):
    specs, notes = build_figures(curves)
    assert [s.name for s in specs] == ["test_accuracy", "uniform_attention", "onsets"]
    assert sum("has no checkpoints" in n for n in notes) == 3


# ---- the tiny real sweep ----------------------------------------------------------------------
def _independent_shares(model, cfg):
    """Share of non-DC W_L energy per frequency, computed here from the definition."""
    frame = cyclic_frame(cfg)
    W = model.W_L.detach()[:, frame.order].double()
    F = torch.fft.fft(W, dim=-1).abs().square().sum(0)  # full spectrum: bins 0..n-1
    n = frame.n
    per_freq = torch.tensor([F[k] + F[n - k] if k != n - k else F[k] for k in range(1, n // 2 + 1)])
    return (per_freq / per_freq.sum()).tolist()


def test_spectrum_and_fve_of_each_configuration(tiny_sweep, monkeypatch):
    groups = _groups(tiny_sweep)
    forwards = []
    monkeypatch.setattr(context_mod, "eq_forward_tables", lambda *a: forwards.append(1) or eq_forward_tables(*a))
    snaps = [snapshot(g, "first099") for g in groups]
    assert len(forwards) == len(groups)  # one forward per configuration
    spec = figures.fig_spectrum(snaps, figures.group_colors(groups), "first099")
    assert all(p.title.startswith(g.full_label + ", seed 1, epoch ") for p, g in zip(spec.panels, groups))
    assert len(spec.panels) == len(groups) == 2
    tops = {p.yrange for p in spec.panels}
    assert len(tops) == 1  # one y scale for every configuration
    for snap, panel in zip(snaps, spec.panels):
        run = snap.run
        assert run.config.seed == 1  # the lowest seed
        first = next((m["step"] for m in run.manifest if m["test_acc"] >= 0.99), run.steps[-1])
        assert snap.step == first == analysis_step(run, "first099")
        (bar,) = panel.traces
        assert isinstance(bar, Bar) and list(bar.x) == list(range(1, 12))  # p = 23: frequencies 1..11
        assert sum(bar.y) == pytest.approx(1.0, abs=1e-6)
        assert bar.y == pytest.approx(_independent_shares(run.model_at(snap.step), run.config), abs=1e-5)
        assert max(bar.y) <= panel.yrange[1]
        rows, _ = compute_metrics(run.model_at(snap.step), run.config, run.dataset, names=["keyfreq_wl_fft", "fve_paper"])
        assert snap.keys == [int(rows["keyfreq_wl_fft"][f"keyfreq_wl_fft_{r}"]) for r in range(1, 6)]
        assert snap.fve_U == [rows["fve_paper"][f"fve_paper_U_{r}"] for r in range(1, 6)]
        # the key frequencies are the five largest bars of the spectrum
        assert sorted(snap.keys) == sorted(sorted(range(1, 12), key=lambda k: -bar.y[k - 1])[:5])
    fve = figures.fig_fve(snaps, "first099")
    for snap, panel in zip(snaps, fve.panels):
        u, v = panel.traces
        assert list(u.x) == [f"k={k}" for k in snap.keys] and list(u.y) == snap.fve_U and list(v.y) == snap.fve_V
        assert panel.yrange == (0.0, 100.0) and all(0 <= y <= 100 for y in [*u.y, *v.y] if not math.isnan(y))
    assert analysis_step(snaps[0].run, "final") == snaps[0].run.steps[-1]


def test_spectrum_comparison_of_any_runs_is_the_spectrum_figure(tiny_sweep):
    """Runs of different normalisation and readout side by side, each as shares of its own non-DC
    W_L energy on one y scale: the same data as the `geolens figures` spectrum."""
    sphere, fb = (load_run(tiny_sweep / preset / "lr4e-3" / "seed_2") for preset in ("sphere", "fb"))
    snaps, spec = figures.spectrum_comparison([fb, sphere], at=150)
    assert [s.run for s in snaps] == [fb, sphere] and [s.step for s in snaps] == [100, 100]  # nearest checkpoint
    assert spec.name == "wl_spectrum" and "nearest epoch 150" in spec.title
    assert len({p.yrange for p in spec.panels}) == 1 and len({p.traces[0].color for p in spec.panels}) == 2
    for snap, panel in zip(snaps, spec.panels):
        assert panel.title.startswith(f"{snap.group.full_label}, seed 2, epoch 100")
        assert panel.traces[0].y == snap.shares
        assert snap.shares == pytest.approx(_independent_shares(snap.run.model_at(100), snap.run.config), abs=1e-5)
        assert sum(snap.shares) == pytest.approx(1.0, abs=1e-6)
    final, _ = figures.spectrum_comparison([fb], at="final")
    assert final[0].step == fb.steps[-1]
    with pytest.raises(GeoError, match="at least one run"):
        figures.spectrum_comparison([])


def test_to_matplotlib_draws_every_panel(tiny_sweep, tmp_path):
    from matplotlib.figure import Figure

    from geolens.outputs.plots import to_matplotlib

    specs, _ = build_figures(tiny_sweep)
    for spec in specs:
        fig = to_matplotlib(spec)
        assert isinstance(fig, Figure)
        assert sum(ax.get_visible() for ax in fig.axes) == len(spec.panels)
    spectrum = next(s for s in specs if s.name == "wl_spectrum")
    ax = to_matplotlib(spectrum).axes[0]
    assert [round(p.get_height(), 9) for p in ax.patches] == [round(v, 9) for v in spectrum.panels[0].traces[0].y]


def test_long_legends_never_cover_the_data():
    """Seven configurations over two panels (as in the Table 1 test-accuracy figure): one legend
    below both panels; a panel of its own with seven entries: below that panel; three: inside."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from geolens.outputs.plots import FigureSpec, Panel, to_matplotlib

    def panel(n):
        return Panel("p", [Line([0, 1], [0, 1], f"config {i}") for i in range(n)], "epoch", "acc")

    def overlaps(legend, fig):
        box = legend.get_window_extent(FigureCanvasAgg(fig).get_renderer())
        return [ax for ax in fig.axes if box.overlaps(ax.get_window_extent())]

    shared = to_matplotlib(FigureSpec("shared", "t", [panel(7), panel(7)], cols=2))
    [legend] = shared.legends
    assert [t.get_text() for t in legend.get_texts()] == [f"config {i}" for i in range(7)]
    assert all(ax.get_legend() is None for ax in shared.axes) and not overlaps(legend, shared)
    own = to_matplotlib(FigureSpec("own", "t", [panel(7), panel(3)], cols=2))
    assert not own.legends and not overlaps(own.axes[0].get_legend(), own)
    assert own.axes[1].get_legend().get_window_extent().overlaps(own.axes[1].get_window_extent())


def test_clock_pizza_path_reuses_the_analysis_cache(tiny_sweep, monkeypatch):
    run = load_run(tiny_sweep / "sphere" / "lr4e-3" / "seed_2")
    steps, dist, sym = clock_pizza_path(run)
    assert steps == run.steps
    for i in (0, -1):
        rows, _ = compute_metrics(run.model_at(steps[i]), run.config, run.dataset, names=figures.PATH_METRICS)
        assert dist[i] == rows["distance_irrelevance"]["distance_irrelevance"]
        assert sym[i] == rows["grad_symmetricity"]["grad_symmetricity"]
    analyze_run(run, figures.PATH_METRICS, progress=False, workers=1)

    def refuse(*args, **kwargs):
        raise AssertionError("computed although `geolens analyze` cached the values")

    monkeypatch.setattr("geolens.analysis.compute_metrics", refuse)
    assert clock_pizza_path(run) == (steps, dist, sym)


def test_build_and_write_all_figures(tiny_sweep, tmp_path):
    specs, notes = build_figures(tiny_sweep, all_seeds=True)
    names = [s.name for s in specs]
    assert names == ["test_accuracy", "onsets", "wl_spectrum", "fve_keys", "clock_pizza_paths"]
    assert "uniform_attention: no run with uniform attention" in notes
    paths_panel = specs[-1].panels[0]
    assert sum(isinstance(t, Region) for t in paths_panel.traces) == 2
    paths = [t for t in paths_panel.traces if isinstance(t, Line) and t.name]
    assert len(paths) == 4  # every seed of both configurations
    for path in paths:  # each path's ends are marked where it starts and stops
        i = paths_panel.traces.index(path)
        start, end = paths_panel.traces[i + 1 : i + 3]
        assert (start.marker, end.marker) == ("start", "end")
        assert (start.x, start.y, end.x, end.y) == (path.x[:1], path.y[:1], path.x[-1:], path.y[-1:])
        assert end.text == [path.text[-1].replace("epoch", "last: epoch")]
    spectrum = specs[2]
    assert "divided by the total non-DC energy" in spectrum.title and "share of non-DC W_L energy" == spectrum.panels[0].ylabel

    out = tmp_path / "figs"
    written = write_figures(specs, out, ("png", "pdf"), notes, str(tiny_sweep))
    assert sorted(p.name for p in written) == sorted([f"{n}.{f}" for n in names for f in ("png", "pdf")] + ["figures.html"])
    for n in names:
        assert (out / f"{n}.png").read_bytes()[:4] == b"\x89PNG" and (out / f"{n}.pdf").read_bytes()[:5] == b"%PDF-"
    page = (out / "figures.html").read_text()
    assert page.count("Plotly.newPlot") == len(specs)
    assert page.count("plotly.js v") == 1  # the library, inlined once
    assert "<script src=" not in page  # no CDN (or any other) script link: the page works offline
    assert "no run with uniform attention" in page


def test_cli_figures(tiny_sweep, tmp_path, monkeypatch, capsys):
    out = tmp_path / "cli_figs"
    monkeypatch.setattr(sys, "argv", ["geolens", "figures", "--runs", str(tiny_sweep), "--out", str(out), "--formats", "",
                                      "--at", "final"])
    main()
    printed = capsys.readouterr().out
    assert "5 figures: test_accuracy, onsets, wl_spectrum, fve_keys, clock_pizza_paths" in printed
    assert [p.name for p in out.iterdir()] == ["figures.html"]  # --formats '': no static copies
    assert (out / "figures.html").read_text().count("Plotly.newPlot") == 5
    monkeypatch.setattr(sys, "argv", ["geolens", "figures", "--runs", str(tiny_sweep), "--at", "middle"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and "--at 'middle'" in capsys.readouterr().err
    monkeypatch.setattr(sys, "argv", ["geolens", "figures", "--runs", str(tiny_sweep), "--formats", "png,gif"])
    with pytest.raises(SystemExit) as e:
        main()
    assert e.value.code == 2 and "['gif'] not supported" in capsys.readouterr().err
