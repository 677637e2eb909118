"""The analysis report of a run: figure specs from a Trajectory, one HTML page (plotly; plotly.js from the
analysis folder's shared copy, which the explorer beside it loads too) and static PNG/SVG copies of every figure."""

from __future__ import annotations

import html
from pathlib import Path

import torch

from geolens.analysis.llc import COMPONENTS
from geolens.analysis.registry import skip_reason
from geolens.analysis.trajectory import Trajectory, keys_settled, keys_words, writing
from geolens.outputs.plots import (
    FigureSpec,
    Heatmap,
    Line,
    Panel,
    Region,
    VLine,
    html_page,
    save_static,
    write_plotly_js,
)
from geolens.runs.storage import atomic_write_bytes


def onset_markers(run) -> list[VLine]:
    ev = run.events
    out = []
    if ev.get("onset_095") is not None:
        out.append(VLine(ev["onset_095"], f"test acc > 0.95 @ {ev['onset_095']}", "#2ca02c"))
    if ev.get("sustained_099") is not None:
        out.append(VLine(ev["sustained_099"], f"stays >= 0.99 from {ev['sustained_099']}", "#9467bd"))
    return out


def fig_training(traj: Trajectory) -> FigureSpec:
    rows = traj.run.metrics
    e = [r["epoch"] for r in rows]
    marks = onset_markers(traj.run)
    loss = Panel("loss", [Line(e, [r["train_loss"] for r in rows], "train"), Line(e, [r["test_loss"] for r in rows], "test"),
                          *marks], "epoch", "cross-entropy", logy=True)
    # the same colours as the loss panel's; named once in the legend (plotly's is one for the page)
    acc = Panel("accuracy", [Line(e, [r["train_acc"] for r in rows], "train", legend=False),
                             Line(e, [r["test_acc"] for r in rows], "test", legend=False), *marks], "epoch", "accuracy")
    return FigureSpec("training", "Loss and accuracy", [loss, acc])


def fig_spectrum(traj: Trajectory) -> FigureSpec | None:
    """Frequency x step heatmap of the W_L spectrum (each step scaled to its maximum)."""
    steps = [s for s in traj.steps if "wl_spectrum" in traj.values[s]]
    if not steps:
        return None
    first = traj.values[steps[0]]["wl_spectrum"]
    freqs = sorted(int(k.rsplit("_", 1)[1]) for k in first)
    z = torch.tensor([[traj.values[s]["wl_spectrum"][f"wl_spectrum_{k}"] for s in steps] for k in freqs])
    z = (z / z.amax(0, keepdim=True).clamp_min(1e-30)).tolist()
    panel = Panel("||FFT(W_L)|| per frequency (column-normalised)", [Heatmap(z, steps, freqs)], "checkpoint epoch", "frequency k")
    return FigureSpec("spectrum", "Key-frequency spectrum over training", [panel], cols=1)


def fig_progress(traj: Trajectory) -> FigureSpec:
    """FVE, restricted / excluded loss (on the trajectory's keys: the titles say which), weight norm and
    numerical health over the checkpoints, with the onsets and the epoch the top-5 key set settles."""
    marks = onset_markers(traj.run)
    settled = keys_settled(traj)
    if settled is not None:
        marks.append(VLine(settled, f"top-5 keys settled @ {settled}", "#8c564b"))
    words = keys_words(traj)

    def line(metric, name=None, label=None, **kw):
        x, y = traj.series(metric, name)
        return Line(x, y, label or name or metric, mode="lines+markers", **kw)

    panels = [
        Panel(f"FVE (paper), best key ({words})", [line("fve_paper", "fve_paper_U_max", "U"), line("fve_paper", "fve_paper_V_max", "V"), *marks],
              "epoch", "percent"),
        Panel(f"restricted / excluded loss ({words})", [line("restricted_loss", "restricted_loss", "restricted (test)"),
                                             line("excluded_loss", "excluded_loss", "excluded (train)"), *marks],
              "epoch", "cross-entropy", logy=True),
        Panel("weight norm", [line("weight_norm"), *marks], "epoch", "||theta||_2"),
        Panel("numerical health", [line("softmax_collapse"), line("zero_loss_fraction"), *marks], "epoch", "fraction of train"),
    ]
    panels = [p for p in panels if any(isinstance(t, Line) and t.x for t in p.traces)]
    return FigureSpec("progress", "Progress measures over training", panels)


def fig_layers(traj: Trajectory) -> FigureSpec | None:
    """One row of panels per layer (models of two or more layers): the top-key share of the layer's MLP
    direct path to the logits and its neuron FVE over training (metric layer_spectrum), and the distance
    irrelevance of the layer's direct write (metric layer_distance_irrelevance: clock-like near 1)."""
    if traj.run.config.n_layers < 2 or not any("layer_spectrum" in traj.values[s] for s in traj.steps):
        return None
    clock = any("layer_distance_irrelevance" in traj.values[s] for s in traj.steps)
    panels = []
    for layer in range(traj.run.config.n_layers):
        pre = f"layer_spectrum_L{layer}"
        share, fve = (Line(*traj.series("layer_spectrum", f"{pre}_{name}"), label, mode="lines+markers")
                      for name, label in (("share", "top-key share"), ("fve_neuron_frac", "neurons > 0.85")))
        panels.append(Panel(f"layer {layer}: MLP direct path W_out W_U, top-key share", [share], "epoch", "share"))
        panels.append(Panel(f"layer {layer}: MLP neurons on one frequency", [fve], "epoch", "fraction"))
        if clock:
            q = Line(*traj.series("layer_distance_irrelevance", f"distance_irrelevance_L{layer}"), "q", mode="lines+markers")
            panels.append(Panel(f"layer {layer}: distance irrelevance of its write (clock ~1, pizza ~0)", [q], "epoch", "q"))
    return FigureSpec("layers", "Per layer: Fourier concentration of each MLP's direct path and neurons, and whether "
                      "the layer's write is clock- or pizza-like", panels, cols=3 if clock else 2)


def fig_landscape(traj: Trajectory) -> FigureSpec | None:
    """The opt-in loss-landscape metrics over training, where computed: the LLC of the whole model with its
    chains' spread (+- one std), its components, and the sharpness, with the onsets marked."""
    marks = onset_markers(traj.run)

    def line(metric, name, label, **kw):
        x, y = traj.series(metric, name)
        return Line(x, y, label, **kw)

    x, llc = traj.series("llc", "llc")
    _, std = traj.series("llc", "llc_std")
    panels = []
    if x:
        spread = [Line(x, [m + sign * s for m, s in zip(llc, std)], "+- chain std" if sign > 0 else "", dash=True,
                       color="#7f7f7f", legend=sign > 0) for sign in (1, -1)]
        panels.append(Panel("LLC, whole model (devinterp SGLD)", [Line(x, llc, "LLC", mode="lines+markers"), *spread, *marks],
                            "epoch", "LLC"))
        parts = [p for p in (line("llc", f"llc_{c}", c, mode="lines+markers") for c in COMPONENTS) if p.x]
        if parts:  # none where the llc was estimated with components=none
            panels.append(Panel("LLC per component (SGLD on that group only)", parts + marks, "epoch", "LLC"))
    sharp = line("sharpness", "sharpness", "top Hessian eigenvalue", mode="lines+markers")
    if sharp.x:
        panels.append(Panel("sharpness (training loss)", [sharp, *marks], "epoch", "eigenvalue", logy=True))
    if not panels:
        return None
    return FigureSpec("landscape", "The loss landscape around each checkpoint", panels, cols=len(panels))


def clock_pizza_regions(y: list[float]) -> list[Region]:
    """The pizza and clock regions of the (distance irrelevance, gradient symmetricity) plane, tall
    enough for the symmetricities y."""
    from geolens.analysis.clockpizza import DIST_IRR_CLOCK_MIN, GRAD_SYM_PIZZA_MIN

    g, d = GRAD_SYM_PIZZA_MIN, DIST_IRR_CLOCK_MIN
    lo, hi = min(-0.1, *y), 1.05
    return [Region([0, d, d, 0], [g, g, hi, hi], f"pizza (sym >= {g}, dist < {d})", "#d62728"),
            Region([d, 1.05, 1.05, d], [lo, lo, g, g], f"clock (sym < {g}, dist >= {d})", "#1f77b4")]


def fig_clock_pizza(traj: Trajectory) -> FigureSpec | None:
    steps = [s for s in traj.steps if "grad_symmetricity" in traj.values[s] and "distance_irrelevance" in traj.values[s]]
    if not steps:
        return None
    x = [traj.values[s]["distance_irrelevance"]["distance_irrelevance"] for s in steps]
    y = [traj.values[s]["grad_symmetricity"]["grad_symmetricity"] for s in steps]
    panel = Panel("gradient symmetricity vs distance irrelevance", [
        *clock_pizza_regions(y),
        Line(x, y, "trajectory", mode="lines+markers", color="#333333", text=[f"epoch {s}" for s in steps]),
        Line(x[-1:], y[-1:], f"final (epoch {steps[-1]})", mode="markers", color="#ff7f0e"),
    ], "distance irrelevance", "gradient symmetricity")
    return FigureSpec("clock_pizza", "Clock vs Pizza over training", [panel], cols=1)


def report_steps(traj: Trajectory, at: list[int] | None) -> list[int]:
    """Steps shown in the per-step figures: `at` (nearest checkpoints), else onset and final."""
    run = traj.run
    if at:
        return sorted({run.nearest_step(s) for s in at})
    onset = run.events.get("onset_095")
    return sorted({run.nearest_step(onset), run.steps[-1]} if onset is not None else {run.steps[-1]})


def step_contexts(traj: Trajectory, steps: list[int]) -> dict:
    """{step: AnalysisContext} of the per-step figures: one forward per checkpoint serves them all."""
    from geolens.analysis import AnalysisContext

    run = traj.run
    return {step: AnalysisContext(run.model_at(step), run.config_at(step), run.dataset, key_freqs=traj.keys)
            for step in steps}


def fig_circles(traj: Trajectory, contexts: dict) -> FigureSpec | None:
    from geolens.analysis.circuit import embedding_circles

    if skip_reason("embed_circles", traj.run.config) is not None:  # S_n has no key frequencies, add3 no [a, b] grid
        return None
    panels = []
    for step, ctx in contexts.items():
        for c in embedding_circles(ctx.W_E_group, ctx.key_freqs):
            xs, ys = c.coords[:, 0].tolist(), c.coords[:, 1].tolist()
            panels.append(Panel(f"epoch {step}: k = {c.freq} (share {c.share:.2f})",
                                [Line(xs, ys, "", mode="markers", text=[f"token {t}" for t in ctx.frame.order.tolist()])],
                                "cos k", "sin k", equal_axes=True))
    return FigureSpec("embedding_circles", "Token embeddings on each key frequency's cos/sin plane", panels, cols=5)


def fig_attention(traj: Trajectory, contexts: dict) -> FigureSpec:
    """Per step and layer a [heads x n_ctx] heatmap: the mean attention of the `=` query onto (a, b, =) (add3:
    (a, b, c, =))."""
    from geolens.analysis.circuit import attention_from_eq

    keys = [*"abc"[: traj.run.config.n_operands], "="]
    panels = []
    for step, ctx in contexts.items():
        for layer in range(traj.run.config.n_layers):
            mean, _ = attention_from_eq(ctx.eq, layer)  # [heads, n_ctx]
            panels.append(Panel(f"epoch {step}, layer {layer}: attention of '='", [
                Heatmap(mean.tolist(), keys, [f"H{h}" for h in range(mean.shape[0])], "Blues")], "key", "head"))
    return FigureSpec("attention", f"Mean attention of the '=' query onto ({', '.join(keys)})", panels,
                      cols=min(3, len(panels)))


def build_figures(traj: Trajectory, at: list[int] | None = None) -> list[FigureSpec]:
    contexts = step_contexts(traj, report_steps(traj, at))
    specs = [fig_training(traj), fig_spectrum(traj), fig_progress(traj), fig_landscape(traj), fig_layers(traj),
             fig_clock_pizza(traj), fig_circles(traj, contexts), fig_attention(traj, contexts)]
    return [s for s in specs if s is not None and s.panels]


def write_report(traj: Trajectory, at: list[int] | None = None, static: tuple[str, ...] = ("png", "svg")) -> Path:
    """Write report.html, figures/<name>.<fmt> and plotly.min.js (the page loads it; the explorer beside it shares it)
    into the trajectory's analysis folder (figure files of an earlier report that this one does not draw are
    removed); returns the HTML path."""
    run = traj.run
    out = traj.out
    specs = build_figures(traj, at)
    with writing(out):
        written = set()
        for spec in specs if static else []:
            written.update(save_static(spec, out / "figures", static))
        for stale in (out / "figures").glob("*.*") if (out / "figures").is_dir() else []:
            if stale not in written and stale.is_file():
                stale.unlink()
    summary = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{html.escape(str(v))}</td></tr>"
                      for k, v in run.summary().items() if v is not None)
    skipped = "".join(f"<li><b>{html.escape(k)}</b>: {html.escape(v)}</li>" for k, v in traj.skipped.items())
    settled = keys_settled(traj)
    keys = (f"<p>Key-frequency metrics (FVE, restricted and excluded loss, embedding circles): {keys_words(traj)}"
            + (f"; the top-5 key set is the final one from epoch {settled} on" if settled is not None else "") + ".</p>"
            if skip_reason("keyfreq_wl_fft", run.config) is None else "")
    intro = f"""<table>{summary}</table>{keys}
<p>{len(traj.steps)} checkpoints analysed; metric table: <code>metrics.csv</code> beside this page (step, metric, name, value);
definitions: docs/metrics.md.</p>
{f"<p>Skipped metrics:</p><ul>{skipped}</ul>" if skipped else ""}"""
    path = out / "report.html"
    with writing(out):
        page = html_page(f"geolens report: {run.path}", specs, intro, plotly_src=write_plotly_js(out).name)
        atomic_write_bytes(path, page.encode())
    return path
