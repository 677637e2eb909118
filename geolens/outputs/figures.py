"""`geolens figures`: the paper's figures rebuilt from run directories, and geolens's own.

Each figure is a plots.FigureSpec built by one function from data that tests can check:
    test_accuracy      test accuracy of every run over training, one colour per configuration
                       (all epochs, and the first 5,000)
    uniform_attention  train and test accuracy of every uniform-attention run, one panel per configuration
    wl_spectrum        each configuration's W_L Fourier spectrum as shares of its non-DC energy, one y scale
                       (spectrum_comparison: the same figure for any runs, e.g. LayerNorm vs sphere)
    fve_keys           fve_paper (U and V, percent) per key frequency, one panel per configuration
    onsets             every seed's onset (peak test accuracy for the uniform-attention tables) per
                       configuration, with the paper's mean and range; the same numbers as `geolens table`
    clock_pizza_paths  distance irrelevance vs gradient symmetricity over the checkpoints, one path per configuration
    fork_barrier       forked arms: the test-loss barrier between each arm and its parent (geolens.analysis.barrier)
    fork_dose          forked arms (geolens fork, sweep --fork-from): onset shift against the fork step, one
                       panel per parent configuration, one colour per change, every seed a point
The model-based figures (spectrum, FVE, Clock-vs-Pizza) read one run per configuration: the lowest
seed (RunGroup.representative), or every seed for the paths when asked.
"""

from __future__ import annotations

import html
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import torch

from geolens.analysis.registry import skip_reason
from geolens.errors import GeoError
from geolens.outputs.plots import (
    PALETTE,
    PANEL_WIDTH,
    Bar,
    FigureSpec,
    Line,
    Panel,
    check_formats,
    html_page,
    save_static,
)
from geolens.model.hyperschedule import relative_to
from geolens.outputs.tables import BuiltTable, tables_for
from geolens.runs.run import Run
from geolens.runs.runset import RunGroup, config_name, found_runs, group_runs
from geolens.runs.storage import atomic_write_bytes

ZOOM_EPOCHS = 5000
AT_CHOICES = ("first099", "final")
PATH_METRICS = ["grad_symmetricity", "distance_irrelevance"]


def group_colors(groups: Sequence[RunGroup]) -> dict[int, str]:
    """id(group) -> its colour (the palette in group order)."""
    return {id(g): PALETTE[i % len(PALETTE)] for i, g in enumerate(groups)}


def _tasks(groups: Sequence[RunGroup]) -> list[str]:
    return list(dict.fromkeys(g.config.task_label for g in groups))


# ---- curves from metrics.csv --------------------------------------------------------------------
def fig_test_accuracy(groups: Sequence[RunGroup], zoom: int = ZOOM_EPOCHS) -> FigureSpec:
    """Per task two panels: test accuracy of every run over all its epochs, and up to epoch `zoom`."""
    colors = group_colors(groups)
    panels = []
    for task in _tasks(groups):
        members = [g for g in groups if g.config.task_label == task]
        for title, limit in (("", None), (f", first {zoom:,} epochs", zoom)):
            traces = []
            for g in members:
                for i, run in enumerate(g.runs):
                    rows = [r for r in run.metrics if limit is None or r["epoch"] <= limit]
                    traces.append(Line([r["epoch"] for r in rows], [r["test_acc"] for r in rows], g.label,
                                       color=colors[id(g)], legend=i == 0, text=[f"seed {run.config.seed}"] * len(rows)))
            panels.append(Panel(f"{task}: test accuracy{title}", traces, "epoch", "test accuracy", yrange=(0.0, 1.02)))
    return FigureSpec("test_accuracy", "Test accuracy over training (every seed; colour: configuration)", panels, cols=2)


def fig_uniform_attention(groups: Sequence[RunGroup]) -> FigureSpec | None:
    """One panel per uniform-attention configuration: test (solid) and train (dashed) accuracy per seed."""
    uniform = [g for g in groups if g.config.attention == "uniform"]
    if not uniform:
        return None
    panels = []
    for g in uniform:
        traces = []
        for i, run in enumerate(g.runs):
            rows, color = run.metrics, PALETTE[i % len(PALETTE)]
            e = [r["epoch"] for r in rows]
            traces += [Line(e, [r["test_acc"] for r in rows], f"seed {run.config.seed} test", color=color),
                       Line(e, [r["train_acc"] for r in rows], f"seed {run.config.seed} train", color=color, dash=True)]
        panels.append(Panel(g.full_label, traces, "epoch", "accuracy", yrange=(0.0, 1.02)))
    return FigureSpec("uniform_attention", "Uniform attention: train (dashed) and test (solid) accuracy", panels, cols=2)


# ---- onsets, from the tables --------------------------------------------------------------------
def fig_onsets(tables: Sequence[BuiltTable]) -> FigureSpec | None:
    """One panel per table: each measured configuration at x = 0, 1, ...; every seed's grid onset
    (or grid peak accuracy) a dot (spread sideways by seed rank), the paper's mean a short
    horizontal line and its min-max (or, for peak tables, its max) beside it."""
    panels = []
    for table in tables:
        rows = [r for r in table.rows if r.group is not None]
        if not rows:
            continue
        traces, ticks = [], []
        for i, row in enumerate(rows):
            values = [getattr(m, row.headline) for m in row.measures]
            seeds = [(m.seed, v) for m, v in zip(row.measures, values) if v is not None]
            width = min(0.06, 0.5 / max(len(seeds), 1))
            xs = [i + (k - (len(seeds) - 1) / 2) * width for k in range(len(seeds))]
            traces.append(Line(xs, [v for _, v in seeds], "our seeds", mode="markers", color=PALETTE[0], legend=i == 0,
                               text=[f"seed {s}" for s, _ in seeds]))
            failed = len(values) - len(seeds)
            ticks.append((i, row.group.label + (f" ({failed}/{len(values)} no onset)" if failed else "")))
            traces += paper_markers(row, i, first=not any(t.name == "paper mean" for t in traces))
        what = (f"onset epoch (grid {table.rule.grid})" if table.kind == "onset"
                else f"peak test accuracy (grid {table.rule.grid})")
        panels.append(Panel(table.title, traces, "", what, logy=table.kind == "onset", xticks=ticks,
                            xrange=(-0.6, len(rows) - 0.4)))
    if not panels:
        return None
    widest = max(len(p.xticks) for p in panels)
    return FigureSpec("onsets", "Every seed against the paper's mean (line) and range (bar)", panels, cols=1,
                      panel_width=max(PANEL_WIDTH, 1.3 * widest))


def paper_markers(row, x: float, first: bool) -> list[Line]:
    """The paper's mean (horizontal line at x) and min-max (vertical bar right of x) for an onset
    row; mean and max (dashed) for a peak row. Empty when the row has no published mean."""
    p = row.paper
    if p is None:
        return []
    mean = p.get("mean") if row.kind == "onset" else p.get("mean_peak_acc")
    if mean is None:
        return []
    out = [Line([x - 0.3, x + 0.3], [mean, mean], "paper mean", color="#000000", legend=first)]
    if row.kind == "onset" and p.get("min") is not None:
        out.append(Line([x + 0.35, x + 0.35], [p.get("min"), p.get("max")], "paper min-max", mode="lines+markers",
                        color="#7f7f7f", legend=first))
    elif row.kind == "peak" and p.get("max_peak_acc") is not None:
        out.append(Line([x - 0.3, x + 0.3], [p.get("max_peak_acc")] * 2, "paper max", color="#7f7f7f", dash=True,
                        legend=first))
    return out


# ---- one checkpoint per configuration -------------------------------------------------------------
def analysis_step(run: Run, at: str | int) -> int:
    """'final': the last checkpoint; 'first099': the first checkpoint with test accuracy >= 0.99 (the
    paper's section 4.3 stops its seed there), else the last; an epoch: the nearest checkpoint."""
    if not isinstance(at, str):
        return run.nearest_step(at)
    if at not in AT_CHOICES:
        raise GeoError(f"at = '{at}' is not known; choose one of {', '.join(AT_CHOICES)}")
    manifest = run.manifest
    if not manifest:
        raise GeoError(f"{run.path} has no checkpoints; the spectrum and FVE figures need its weights")
    if at == "first099":
        return next((m["step"] for m in manifest if m["test_acc"] >= 0.99), manifest[-1]["step"])
    return manifest[-1]["step"]


@dataclass
class Snapshot:
    """One configuration's circuit at one checkpoint of its representative run.

    shares: W_L energy share per frequency k = 1..n//2 (keyfreq.wl_energy_shares: sums to 1);
    keys: the paper's key frequencies (keyfreq_wl_fft), strongest first; fve_U, fve_V: fve_paper per key.
    """

    group: RunGroup
    run: Run
    step: int
    test_acc: float
    shares: list[float]
    keys: list[int]
    fve_U: list[float]
    fve_V: list[float]

    @property
    def title(self) -> str:
        return f"{self.group.full_label}, seed {self.run.config.seed}, epoch {self.step} (test acc {self.test_acc:.3f})"


def snapshot(group: RunGroup, at: str | int = "first099") -> Snapshot:
    """The spectrum and FVE of the group's representative run at analysis_step(run, at)."""
    return run_snapshot(group.representative, at, group)


def run_snapshot(run: Run, at: str | int = "first099", group: RunGroup | None = None) -> Snapshot:
    """The spectrum and FVE of `run` at analysis_step(run, at); group: the configuration it stands
    for (default: a group of this run alone)."""
    from geolens.analysis import AnalysisContext, compute_metrics
    from geolens.analysis.context import N_KEYS
    from geolens.analysis.keyfreq import wl_energy_shares

    group = group or RunGroup(run.config, [run])
    step = analysis_step(run, at)
    ctx = AnalysisContext(run.model_at(step), run.config_at(step), run.dataset)  # one forward for the FVE and the loss
    with torch.no_grad():
        shares = wl_energy_shares(ctx.W_L_group)
    rows, _ = compute_metrics(context=ctx, names=["keyfreq_wl_fft", "fve_paper", "loss"])
    keys, fve = rows["keyfreq_wl_fft"], rows["fve_paper"]
    ranks = [r for r in range(1, N_KEYS + 1) if not math.isnan(keys[f"keyfreq_wl_fft_{r}"])]
    return Snapshot(group, run, step, rows["loss"]["acc_test"], shares.tolist(),
                    [int(keys[f"keyfreq_wl_fft_{r}"]) for r in ranks],
                    [fve[f"fve_paper_U_{r}"] for r in ranks], [fve[f"fve_paper_V_{r}"] for r in ranks])


def spectrum_comparison(runs: Sequence[Run], at: str | int = "first099") -> tuple[list[Snapshot], FigureSpec]:
    """The W_L spectra of `runs` side by side, comparable across readouts and norms (e.g. LayerNorm
    with a raw readout against the sphere with a bounded one): each spectrum is the share of its own
    non-DC W_L energy per frequency (keyfreq.wl_energy_shares, sums to 1), drawn on one y scale.
    at: 'first099', 'final' or an epoch (nearest checkpoint), per run. Returns the snapshots (shares,
    key frequencies, FVE per key, step) and the figure (the `wl_spectrum` figure of `geolens figures`)."""
    if not runs:
        raise GeoError("spectrum_comparison needs at least one run")
    snaps = [run_snapshot(run, at) for run in runs]
    colors = {id(s.group): PALETTE[i % len(PALETTE)] for i, s in enumerate(snaps)}
    return snaps, fig_spectrum(snaps, colors, at)


def fig_spectrum(snaps: Sequence[Snapshot], colors: dict[int, str], at: str | int) -> FigureSpec | None:
    """Side by side, one y scale: each configuration's share of W_L's non-DC energy per frequency."""
    if not snaps:
        return None
    top = max(max(s.shares) for s in snaps)
    panels = [Panel(s.title, [Bar(list(range(1, len(s.shares) + 1)), s.shares, "", colors[id(s.group)])],
                    "frequency k (group order)", "share of non-DC W_L energy", yrange=(0.0, 1.05 * top)) for s in snaps]
    return FigureSpec("wl_spectrum", f"W_L Fourier spectrum at {_at_words(at)}: |rfft(W_L)|^2 per frequency (L2 over "
                      "neurons), divided by the total non-DC energy (each spectrum sums to 1)", panels, cols=min(4, len(panels)))


def fig_fve(snaps: Sequence[Snapshot], at: str | int) -> FigureSpec | None:
    """fve_paper U and V per key frequency (strongest first), one panel per configuration, 0-100%."""
    if not snaps:
        return None
    from geolens.outputs.paper import paper_tables

    ref = paper_tables()["spectral_section4_3"]["fve_percent"]
    panels = [Panel(s.title, [Bar([f"k={k}" for k in s.keys], s.fve_U, "U (cos)", PALETTE[0]),
                              Bar([f"k={k}" for k in s.keys], s.fve_V, "V (sin)", PALETTE[1])],
                    "key frequency (strongest first)", "FVE (%)", yrange=(0.0, 100.0)) for s in snaps]
    paper = ", ".join(f"{k} {v}" for k, v in ref.items())
    return FigureSpec("fve_keys", f"FVE of the MLP activations per key frequency at {_at_words(at)} (paper 4.3: {paper})",
                      panels, cols=min(4, len(panels)))


def _at_words(at: str | int) -> str:
    if not isinstance(at, str):
        return f"the checkpoint nearest epoch {at}"
    return "the first checkpoint with test acc >= 0.99 (else the last)" if at == "first099" else "the last checkpoint"


# ---- Clock vs Pizza over the checkpoints ----------------------------------------------------------
def clock_pizza_path(run: Run) -> tuple[list[int], list[float], list[float]]:
    """(steps, distance irrelevance, gradient symmetricity) at every checkpoint of `run`; values
    `geolens analyze` cached are reused, the rest computed (and not cached)."""
    from geolens.analysis import compute_metrics
    from geolens.analysis.trajectory import cached_metrics

    steps, dist, sym = [], [], []
    for step in run.steps:
        vals = cached_metrics(run, step, PATH_METRICS)
        if len(vals) < len(PATH_METRICS):
            vals, _ = compute_metrics(run.model_at(step), run.config_at(step), run.dataset, names=PATH_METRICS)
        steps.append(step)
        dist.append(vals["distance_irrelevance"]["distance_irrelevance"])
        sym.append(vals["grad_symmetricity"]["grad_symmetricity"])
    return steps, dist, sym


def fig_clock_pizza_paths(paths: Sequence[tuple[str, str, list[int], list[float], list[float]]]) -> FigureSpec | None:
    """paths: (name, colour, steps, distance irrelevance, gradient symmetricity); each path's first
    checkpoint is an open circle, its last a star."""
    if not paths:
        return None
    from geolens.outputs.report import clock_pizza_regions

    traces: list = [*clock_pizza_regions([y for p in paths for y in p[4]])]
    for name, color, steps, x, y in paths:
        traces.append(Line(x, y, name, mode="lines+markers", color=color, text=[f"epoch {s}" for s in steps]))
        traces.append(Line(x[:1], y[:1], "", mode="markers", color=color, text=[f"first: epoch {steps[0]}"],
                           marker="start"))
        traces.append(Line(x[-1:], y[-1:], "", mode="markers", color=color, text=[f"last: epoch {steps[-1]}"],
                           marker="end"))
    panel = Panel("gradient symmetricity vs distance irrelevance over the checkpoints (open circle: the first, "
                  "star: the last)", traces,
                  "distance irrelevance", "gradient symmetricity")
    return FigureSpec("clock_pizza_paths", "Clock vs Pizza path of each configuration", [panel], cols=1, panel_width=8.0)


# ---- all figures ----------------------------------------------------------------------------------
# ---- forks: onset shift against the fork step ------------------------------------------------------
#: fork changes that do not change what the arm trains (how long, how often recorded, where)
_NOT_A_CHANGE = ("epochs", "checkpoints", "early_stop_after", "eval_every", "engine", "device", "preset")


@dataclass
class DosePoint:
    """One fork arm: its parents' configuration (panel), what it changed, where it forked, the parent's
    seed, and its onset shift (arm onset_095 minus the parent's, in epochs); censored: the arm has no
    onset within its budget, and shift is the lower bound (its last epoch minus the parent's onset)."""

    panel: str
    change: str
    step: int
    seed: int
    shift: int
    censored: bool = False


def change_label(fork: dict) -> str:
    """What a fork changed, in words: 'norm sphere, unembed bounded', schedule entries relative to the
    fork step ('schedule weight_decay=3.0@+0:+200'); 'no change'."""
    parts = []
    for name, ch in fork["changes"].items():
        if name in _NOT_A_CHANGE:
            continue
        if name == "schedule":
            added = [e for e in ch["to"] if e not in ch["from"]]
            parts.append("schedule " + " ".join(relative_to(added, fork["step"])))
        else:
            parts.append(f"{name} {ch['to']:g}" if isinstance(ch["to"], float) else f"{name} {ch['to']}")
    return ", ".join(parts) or "no change"


def find_parent(fork: dict, runs: Sequence[Run]) -> Run | None:
    """The parent run of a fork: the recorded path when it is still a run, else the run among `runs` with
    the parent's config (run.json `fork.parent_identity.config_sha256`) whose path shares the longest tail
    with the recorded one (records copied to results/ keep their folders' names, not their root)."""
    recorded = Path(fork["parent"])
    if (recorded / "run.json").is_file():
        return next((r for r in runs if r.path.resolve() == recorded), None) or Run(recorded)
    want = fork["parent_identity"]["config_sha256"]

    def tail(run: Run) -> int:
        a, b = run.path.resolve().parts[::-1], recorded.parts[::-1]
        return next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))

    candidates = [r for r in runs if r.config.sha256() == want and r.header.get("fork") is None]
    return max(candidates, key=tail, default=None)


def dose_points(runs: Sequence[Run]) -> tuple[list[DosePoint], list[str]]:
    """A DosePoint per fork among `runs` whose parent (find_parent) and both onsets are known; notes on
    the forks left out."""
    points, missing = [], []
    for run in runs:
        fork = run.header.get("fork")
        if fork is None:
            continue
        parent = find_parent(fork, runs)
        if parent is None:
            missing.append(f"{run.path} (parent {fork['parent']} not found)")
            continue
        arm_onset, parent_onset = (r.events.get("onset_095") for r in (run, parent))
        if parent_onset is None:
            missing.append(f"{run.path} (its parent has no onset within its budget)")
            continue
        cfg = parent.config
        panel = f"parent {config_name(cfg)} lr {cfg.lr:g} wd {cfg.weight_decay:g}, {cfg.task_label}"
        end = arm_onset if arm_onset is not None else run.metrics[-1]["epoch"]
        points.append(DosePoint(panel, change_label(fork), fork["step"], cfg.seed, end - parent_onset,
                                censored=arm_onset is None))
    censored = sum(p.censored for p in points)
    notes = [f"fork_dose: {censored} arm(s) without an onset within their budget, drawn as lower bounds"] if censored else []
    notes += [f"fork_dose: {len(missing)} fork(s) left out: {'; '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"] \
        if missing else []
    return points, notes


def fig_fork_dose(points: Sequence[DosePoint]) -> FigureSpec | None:
    """Onset shift of every fork arm against its fork step: one panel per parent configuration, one colour
    per change, every seed a point (an open circle: no onset within the arm's budget, drawn at its lower
    bound) and the median per step a line (over the steps where every seed has an onset)."""
    if not points:
        return None
    panels = []
    for panel in sorted({p.panel for p in points}):
        mine = [p for p in points if p.panel == panel]
        changes = sorted({p.change for p in mine})
        traces = []
        steps = sorted({p.step for p in mine})
        traces.append(Line([steps[0], steps[-1]], [0, 0], "no shift", color="#999999", dash=True, legend=False))
        for i, change in enumerate(changes):
            color = PALETTE[i % len(PALETTE)]
            arm = sorted((p for p in mine if p.change == change), key=lambda p: (p.step, p.seed))
            for censored in (False, True):
                pts = [p for p in arm if p.censored == censored]
                if pts:
                    traces.append(Line([p.step for p in pts], [p.shift for p in pts],
                                       f"{change}: no onset by the budget (lower bound)" if censored else change,
                                       mode="markers", color=color, marker="start" if censored else "dot",
                                       text=[f"seed {p.seed}: {'>= ' if censored else ''}{p.shift:+,}" for p in pts],
                                       legend=censored))
            at = [k for k in sorted({p.step for p in arm}) if not any(p.censored for p in arm if p.step == k)]
            if at:
                medians = [statistics.median(p.shift for p in arm if p.step == k) for k in at]
                traces.append(Line(at, medians, change, mode="lines+markers", color=color))
        panels.append(Panel(panel, traces, xlabel="fork step (epoch)", ylabel="onset shift (epochs; arm - parent)"))
    return FigureSpec("fork_dose", "Onset shift of forked arms against the fork step (points: seeds; line: median)",
                      panels, cols=1, panel_width=8.0)


# ---- forks: the loss barrier between each arm and its parent ----------------------------------------
@dataclass
class BarrierPoint:
    """One fork arm: panel, change, fork step and seed as DosePoint; `at` the epoch compared (the latest
    checkpoint arm and parent both have); the test and train barriers of the line between them there; the two
    runs."""

    panel: str
    change: str
    step: int
    seed: int
    at: int
    test: float
    train: float
    arm: Run = field(repr=False)
    parent: Run = field(repr=False)


def barrier_points(runs: Sequence[Run], n_alphas: int = 11) -> tuple[list[BarrierPoint], list[str]]:
    """A BarrierPoint per fork arm among `runs` whose parent is found, which is the parent's model (a fork that
    changed the architecture is left out) and which shares a checkpoint after the fork step with it; notes on
    the arms left out."""
    from geolens.analysis.barrier import check_same_surface, loss_barrier

    points, missing = [], []
    for run in runs:
        fork = run.header.get("fork")
        parent = None if fork is None else find_parent(fork, runs)
        if parent is None:
            continue
        try:
            check_same_surface(parent.config, run.config)
        except GeoError:
            missing.append(f"{run.path} (another architecture than its parent)")
            continue
        shared = sorted(set(run.steps) & set(parent.steps))
        if not shared or shared[-1] <= fork["step"]:
            missing.append(f"{run.path} (no checkpoint after the fork step shared with its parent)")
            continue
        at = shared[-1]
        b = loss_barrier(parent.model_at(at), run.model_at(at), n_alphas)
        cfg = parent.config
        panel = f"parent {config_name(cfg)} lr {cfg.lr:g} wd {cfg.weight_decay:g}, {cfg.task_label}"
        points.append(BarrierPoint(panel, change_label(fork), fork["step"], cfg.seed, at, b.barrier_test, b.barrier_train,
                                  run, parent))
    notes = [f"fork_barrier: {len(missing)} arm(s) left out: {'; '.join(missing[:5])}{' ...' if len(missing) > 5 else ''}"] \
        if missing else []
    return points, notes


def fig_fork_barrier(points: Sequence[BarrierPoint]) -> FigureSpec | None:
    """The test-loss barrier between each fork arm and its parent at their latest shared checkpoint, against
    the fork step: one panel per parent configuration, one colour per change, every seed a point."""
    if not points:
        return None
    panels = []
    for panel in sorted({p.panel for p in points}):
        mine = [p for p in points if p.panel == panel]
        traces = []
        for i, change in enumerate(sorted({p.change for p in mine})):
            pts = sorted((p for p in mine if p.change == change), key=lambda p: (p.step, p.seed))
            traces.append(Line([p.step for p in pts], [p.test for p in pts], change, mode="markers",
                               color=PALETTE[i % len(PALETTE)],
                               text=[f"seed {p.seed}, at epoch {p.at}: test {p.test:.3g}, train {p.train:.3g}" for p in pts]))
        panels.append(Panel(panel, traces, xlabel="fork step (epoch)", ylabel="test-loss barrier (arm vs parent)"))
    return FigureSpec("fork_barrier", "Loss barrier between each forked arm and its parent at their latest shared "
                      "checkpoint (points: seeds)", panels, cols=1, panel_width=8.0)


def build_figures(root: str | Path, paper: str | None = None, at: str = "first099", all_seeds: bool = False,
                  log: Callable[[str], None] | None = None) -> tuple[list[FigureSpec], list[str]]:
    """Every figure the runs under `root` support, and notes (runs skipped, figures left out and why).

    paper: restrict the onsets figure to one paper table (as `geolens table --paper`).
    at: the checkpoint of the spectrum and FVE figures (analysis_step). all_seeds: a Clock-vs-Pizza
    path for every run instead of the lowest seed of each configuration.
    """
    if at not in AT_CHOICES:
        raise GeoError(f"--at '{at}' is not known; choose one of {', '.join(AT_CHOICES)}")
    log = log or (lambda msg: None)
    runs, notes = found_runs(root)
    groups = group_runs(runs)
    colors = group_colors(groups)
    tables, table_notes = tables_for(groups, paper, root)
    notes += table_notes
    why = [(g, skip_reason("keyfreq_wl_fft", g.config)) for g in groups]  # no key frequencies: S_n, add3
    cyclic = [g for g, reason in why if reason is None]
    notes += [f"wl_spectrum, fve_keys, clock_pizza_paths: {g.full_label} left out ({reason})" for g, reason in why
              if reason is not None]
    blind = [g for g in cyclic if not g.representative.steps]
    notes += [f"wl_spectrum, fve_keys, clock_pizza_paths: {g.full_label} left out (seed {g.representative.config.seed} "
              "has no checkpoints)" for g in blind]
    cyclic = [g for g in cyclic if g not in blind]
    snaps = []
    for g in cyclic:
        log(f"spectrum and FVE: {g.full_label}, seed {g.representative.config.seed}")
        snaps.append(snapshot(g, at))
    paths = []
    for g in cyclic:
        for run in ([r for r in g.runs if r.steps] if all_seeds else [g.representative]):
            log(f"clock/pizza path: {g.full_label}, seed {run.config.seed} ({len(run.steps)} checkpoints)")
            name = f"{g.full_label}, seed {run.config.seed}"
            paths.append((name, colors[id(g)], *clock_pizza_path(run)))
    points, dose_notes = dose_points(runs)
    notes += dose_notes
    if any(r.header.get("fork") for r in runs):
        log("loss barriers between fork arms and their parents")
    barriers, barrier_notes = barrier_points(runs)
    notes += barrier_notes
    specs = [fig_test_accuracy(groups), fig_uniform_attention(groups), fig_onsets(tables),
             fig_spectrum(snaps, colors, at), fig_fve(snaps, at), fig_clock_pizza_paths(paths), fig_fork_dose(points),
             fig_fork_barrier(barriers)]
    if specs[1] is None:
        notes.append("uniform_attention: no run with uniform attention")
    return [s for s in specs if s is not None], notes


def write_figures(specs: Sequence[FigureSpec], out: Path, formats: Sequence[str] = ("png", "pdf"),
                  notes: Sequence[str] = (), source: str = "") -> list[Path]:
    """OUT/<figure>.<format> for every spec and format (matplotlib) and OUT/figures.html (every
    figure interactive, plotly.js inlined once: works offline)."""
    check_formats(formats)
    paths: list[Path] = []
    for spec in specs:
        paths += save_static(spec, out, formats)
    intro = f"<p>Runs: <code>{html.escape(source)}</code>. Definitions: docs/cli.md (<code>geolens figures</code>).</p>"
    if notes:
        intro += "<p>Notes:</p><ul>" + "".join(f"<li>{html.escape(n)}</li>" for n in notes) + "</ul>"
    page = out / "figures.html"
    atomic_write_bytes(page, html_page(f"geolens figures: {source}", specs, intro).encode())
    return paths + [page]
