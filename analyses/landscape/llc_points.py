"""The LLC at the checkpoints of the llc lane's trajectories where it was estimated at one SGLD setting
(docs/landscape.md), beside each run's onset, and two presets' estimates against each other.

    python analyses/landscape/llc_points.py FOLDER [--against FOLDER_B] [--draws 20000] [--burnin 0] \
        [--records results/landscape/records/llc]   # to stdout

FOLDER holds seed_N/metrics.csv (`geolens analyze --metrics llc` tables) of one preset's runs, whose training
records are RECORDS/PRESET/seed_N (PRESET: FOLDER's name; their onset: the first evaluated
epoch with test accuracy > 0.95). One row per checkpoint whose LLC was estimated with `--draws` draws per chain
after `--burnin` steps (all at one SGLD setting: the llc_setting_* columns must agree, else it stops): the seed,
the onset, the epoch and its distance to the onset, the LLC with its standard deviation over chains, whether the
chains were stable (llc.stable_word: llc.judge's verdict, with the drift factor where the row holds the
sharpness; 'not judged: trace not kept (old rule: yes)' where it was recorded before judge read the whole trace;
only estimates today's judge passed, llc.usable, enter the comparisons, which say how many the old rule alone
passed and they left out: left_out_note), the components' LLCs where estimated, the
sharpness, and the training loss and test accuracy there. When every run has the same number of stable
estimates, successive ones are compared across runs (paired by seed; an unstable estimate's place taken by the
next checkpoint estimated): in how many runs the LLC rose, and the exact two-sided Wilcoxon signed-rank test
(significance.paired_differ; the direction is read from the data, so the test asks both), Holm-corrected over
the steps printed. --against adds, at each run's largest and last stable estimates, the exact one-sided
Mann-Whitney test (scipy.stats, significance.smaller_than) that FOLDER_B's runs have the smaller LLC, for the
whole model and each component estimated there, Holm-corrected over the tests printed (one family).

Along dense series (an estimate at every checkpoint), --landmarks prints one row per run instead: where its series
(stable estimates, those inside a loss spike left out) peaks (the largest estimate, and the causal peak rule of
`geolens precursors`) and falls (from where on it stays below half the largest) against the onset, and its last
estimate; --figure DIR writes DIR/PRESET_llc_series.png and .svg (each run's series with its onset, its training
record's losses, and all runs' series against epoch - onset).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from geolens.analysis.llc import COMPONENTS, loss_spikes, stable_word, usable
from geolens.analysis.significance import fmt_p, holm, paired_differ, smaller_than
from geolens.analysis.trajectory import read_table
from geolens.outputs.plots import PALETTE, FigureSpec, Line, Panel, VLine, save_static
from geolens.outputs.tables import Rule
from geolens.runs.precursor_events import event_epoch
from geolens.runs.run import load_run

RULE = Rule()  # test accuracy > 0.95
RECORDS = Path("results/landscape/records/llc")


Estimates = dict[int, tuple[int | None, dict[int, dict[str, float]]]]  # {seed: (onset, {epoch: values})}


def estimates(folder: Path, draws: int, records: Path = RECORDS, burnin: int = 0) -> Estimates:
    """The checkpoints under folder whose LLC has `draws` draws per chain after `burnin` steps (each marked
    `in_loss_spike` 1.0 where its training record says so: llc.loss_spikes), with each run's onset."""
    out = {}
    for run in sorted(folder.glob("seed_*"), key=lambda p: int(p.name.split("_")[1])):
        record = load_run(records / folder.name / run.name).metrics
        onset, spikes = RULE.onset(record), loss_spikes(record)
        points = {e: {**v, "in_loss_spike": float(e in spikes)} for e, v in read_table(run / "metrics.csv").items()
                  if v.get("llc_setting_draws") == draws and v.get("llc_setting_burnin", 0) == burnin}
        out[int(run.name.split("_")[1])] = (onset, points)
    settings = {tuple(sorted((k, v) for k, v in values.items() if k.startswith("llc_setting_")))
                for _, points in out.values() for values in points.values()}
    if len(settings) > 1:
        raise SystemExit(f"{folder}: the estimates at {draws} draws after {burnin} burn-in steps were made at "
                         f"{len(settings)} SGLD settings (llc_setting_* differ); they are not comparable, so keep one "
                         "setting per folder")
    return out


def components(*ests: Estimates) -> list[str]:
    """The components (llc.COMPONENTS) whose weight-restricted LLC some estimate of `ests` holds."""
    held = {name for est in ests for _, points in est.values() for v in points.values() for name in v}
    return [c for c in COMPONENTS if f"llc_{c}" in held]


def table(est: Estimates) -> str:
    """One row per estimate; a column per component where components were estimated."""
    comps = components(est)
    lines = ["| seed | onset | epoch | epoch - onset | LLC ± std over chains | stable | "
             + "".join(f"{c} | " for c in comps) + "sharpness | train loss | test acc |",
             "| --- " * (9 + len(comps)) + "|"]
    for seed, (onset, points) in est.items():
        for epoch, v in sorted(points.items()):
            to_onset = "-" if onset is None else f"{epoch - onset:+,}"
            parts = "".join((f"{v[f'llc_{c}']:.4g}{'' if v.get(f'llc_{c}_stable', 1.0) == 1.0 else ' (unstable)'} | "
                             if f"llc_{c}" in v else "- | ") for c in comps)
            lines.append(f"| {seed} | {'-' if onset is None else f'{onset:,}'} | {epoch:,} | {to_onset} | "
                         f"{v['llc']:.4g} ± {v['llc_std']:.2g} | {stable_word(v)} | {parts}"
                         f"{v.get('sharpness', float('nan')):.4g} | {v['loss_train']:.4g} | {v['acc_test']:.4g} |")
    return "\n".join(lines) + "\n"


def left_out_note(values: list[dict[str, float]], what: str = "tests") -> str:
    """A line saying how many of the estimates a comparison (`what`: the tests, the landmarks) draws from were passed
    by the old rule alone (recorded before judge read the whole trace: llc_stable 1, no llc_rhat; their traces were
    not kept, so today's judge has not passed them) and so left out (llc.usable), empty when none was."""
    old = sum(v.get("llc_stable") == 1.0 and "llc_rhat" not in v for v in values)
    if not old:
        return ""
    return (f"- {old} of the {len(values)} estimates were passed by the old rule alone (trace not kept): today's judge "
            f"has not passed them, so the {what} leave them out (estimate them again to judge them)\n")


def every_estimate(*ests: Estimates) -> list[dict[str, float]]:
    """The estimates of every run of `ests`."""
    return [v for est in ests for _, points in est.values() for v in points.values()]


def along(est: Estimates) -> str:
    """One line per pair of successive stable estimates (the k-th and k+1-th stable estimate of every run, paired
    by seed; an unstable estimate's place is taken by the next checkpoint estimated): the epochs, in how many runs
    the LLC rose (or fell, if most runs fell), and the exact two-sided Wilcoxon signed-rank p-value
    (significance.paired_differ) with its Holm correction over the lines. Empty unless every run has the same
    number (>= 2) of stable estimates."""
    series = [[(e, points[e]) for e in sorted(points) if usable(points[e])] for _, points in est.values()]
    note = left_out_note(every_estimate(est))
    if len({len(s) for s in series}) != 1 or len(series[0]) < 2:
        return note and note + (f"- successive stable estimates: n/a ({', '.join(str(len(s)) for s in series)} per "
                                "run; the test needs the same number, at least 2, in every run)\n")

    def epochs(k: int) -> str:
        lo, hi = min(s[k][0] for s in series), max(s[k][0] for s in series)
        return f"{lo:,}" if lo == hi else f"{lo:,}-{hi:,}"

    heads, ps = [], []
    for k in range(len(series[0]) - 1):
        pairs = [(s[k][1]["llc"], s[k + 1][1]["llc"]) for s in series]
        rose = sum(b > a for a, b in pairs)
        up = rose * 2 >= len(pairs)
        heads.append(f"- stable estimate {k + 1} -> {k + 2} of each run (epochs {epochs(k)} -> {epochs(k + 1)}): "
                     f"{'rose' if up else 'fell'} in {rose if up else len(pairs) - rose} of {len(pairs)} runs")
        ps.append(paired_differ([a for a, _ in pairs], [b for _, b in pairs]))
    steps = f"{len(ps)} step{'s' * (len(ps) != 1)}"
    return note + "".join(f"{head}; p = {fmt_p(p)}, Holm {fmt_p(q)} over the {steps} (exact Wilcoxon signed-rank, "
                          f"two-sided, paired by seed)\n" for head, p, q in zip(heads, ps, holm(ps)))


def against(a: tuple[str, Estimates], b: tuple[str, Estimates], draws: int) -> str:
    """Two lines per quantity (the whole model's LLC, then each component's estimated in every chosen checkpoint):
    at each run's largest stable whole-model estimate, and at its last stable one, b's runs (name, estimates)
    against a's: medians, and the exact one-sided Mann-Whitney p-value that b's are the smaller, Holm-corrected over
    every test of the list (one family)."""
    runs = {name: [kept for _, points in est.values() if (kept := {e: v for e, v in points.items() if usable(v)})]
            for name, est in (a, b)}
    lines: list[tuple[str, float | None]] = []  # (the line up to its p-value, the p-value); None: no test
    for what, pick in (("largest stable estimate of each run", lambda p: max(p, key=lambda e: p[e]["llc"])),
                       ("last stable estimate of each run", max)):
        chosen = {name: [p[pick(p)] for p in runs[name]] for name, _ in (a, b)}
        if not (chosen[a[0]] and chosen[b[0]]):
            lines.append((f"- {what}: n/a, no stable estimates at {draws} draws for "
                          f"{a[0] if not chosen[a[0]] else b[0]}", None))
            continue
        held = [c for c in components(a[1], b[1]) if all(f"llc_{c}" in v for vs in chosen.values() for v in vs)]
        for quantity, label in [("llc", ""), *((f"llc_{c}", f", {c}") for c in held)]:
            stable = f"{quantity}_stable" if quantity != "llc" else "llc_stable"  # a component's own verdict
            va, vb = ([v[quantity] for v in chosen[name] if v.get(stable, 1.0) == 1.0] for name, _ in (a, b))
            lines.append((f"- {what}{label}: {b[0]} median {np.median(vb):.4g} ({len(vb)} runs) against {a[0]} "
                          f"{np.median(va):.4g} ({len(va)}); {b[0]} smaller: p = {fmt_p(smaller_than(vb, va))}",
                          smaller_than(vb, va)))
    ps = [p for _, p in lines]
    tested = sum(p is not None for p in ps)
    note = left_out_note(every_estimate(a[1], b[1]))
    return note + "".join(f"{head}\n" if p is None else f"{head}, Holm {fmt_p(q)} over the {tested} tests of this list "
                          "(exact Mann-Whitney, one-sided)\n" for (head, p), q in zip(lines, holm(ps)))


def stable_series(points: dict[int, dict[str, float]]) -> tuple[list[int], list[float]]:
    """The epochs and LLCs of a run's stable estimates, in epoch order, without those at checkpoints inside a loss
    spike (`in_loss_spike`, estimates): a spike is no minimum for the LLC to measure."""
    kept = [e for e in sorted(points) if not points[e].get("in_loss_spike") and usable(points[e])]
    return kept, [points[e]["llc"] for e in kept]


def landmarks(est: Estimates) -> str:
    """One row per run: its onset, its series (stable_series) out of all estimates, the largest (epoch,
    epoch - onset, LLC), the causal peak (precursor_events 'peak': the running maximum once the series falls back
    by a fifth of its rise), the fall (the first estimate after the largest from which on every estimate stays
    below half of it) and the last estimate."""

    def at(epoch: int | None, onset: int | None, value: float | None = None) -> str:
        if epoch is None:
            return "-"
        rel = "" if onset is None else f" ({epoch - onset:+,})"
        return f"{epoch:,}{rel}" + ("" if value is None else f": {value:.4g}")

    lines = ["| seed | onset | series (of all estimates) | largest (epoch - onset): LLC | causal peak | "
             "below half the largest from | last: LLC |", "| --- " * 7 + "|"]
    for seed, (onset, points) in est.items():
        epochs, llcs = stable_series(points)
        if not epochs:
            lines.append(f"| {seed} | {'-' if onset is None else f'{onset:,}'} | 0 of {len(points)} | - | - | - | - |")
            continue
        top = int(np.argmax(llcs))
        fall = next((epochs[k] for k in range(top + 1, len(epochs)) if max(llcs[k:]) < llcs[top] / 2), None)
        lines.append(f"| {seed} | {'-' if onset is None else f'{onset:,}'} | {len(epochs)} of {len(points)} | "
                     f"{at(epochs[top], onset, llcs[top])} | {at(event_epoch(epochs, llcs, 'peak'), onset)} | "
                     f"{at(fall, onset)} | {at(epochs[-1], onset, llcs[-1])} |")
    note = left_out_note(every_estimate(est), "landmarks")
    return "\n".join(lines) + "\n" + ("\n" + note if note else "")


def series_figure(est: Estimates, preset: str, curves: dict[int, list[dict[str, float]]] | None = None) -> FigureSpec:
    """A column per run: its LLC series (stable_series, the onset a vertical line) and, from its training record
    (`curves`: seed -> metrics rows), its train and test loss; then one panel of every run against epoch - onset."""
    top, below, together = [], [], []
    for i, (seed, (onset, points)) in enumerate(est.items()):
        epochs, llcs = stable_series(points)
        color = PALETTE[i % len(PALETTE)]
        onset_line = [] if onset is None else [VLine(onset, "onset")]
        top.append(Panel(f"{preset} seed {seed}: LLC", [Line(epochs, llcs, f"seed {seed}", mode="lines+markers",
                                                               color=color), *onset_line], "epoch", "LLC"))
        if curves is not None and seed in curves:
            rows = curves[seed]
            x = [r["epoch"] for r in rows]
            below.append(Panel(f"{preset} seed {seed}: losses", [
                Line(x, [r["train_loss"] for r in rows], "train loss", color=color),
                Line(x, [r["test_loss"] for r in rows], "test loss", color=color, dash=True), *onset_line],
                "epoch", "loss", logy=True))
        if onset is not None:
            together.append(Line([e - onset for e in epochs], llcs, f"seed {seed}", mode="lines+markers", color=color))
    every = Panel(f"{preset}: every seed", [*together, VLine(0, "onset")], "epoch - onset", "LLC")
    return FigureSpec(f"{preset}_llc_series", f"{preset}: the LLC along each trajectory (stable estimates outside "
                      "loss spikes)", [*top, *below, every], cols=max(len(top), 1))


def report(folder: Path, draws: int, other: Path | None = None, records: Path = RECORDS, burnin: int = 0) -> str:
    """What the command prints: the table, the successive estimates' test, and the test against `other`."""
    est = estimates(folder, draws, records, burnin)
    text = table(est)
    steps = along(est)
    if steps:
        text += "\n" + steps
    if other is not None:
        text += "\n" + against((folder.name, est), (other.name, estimates(other, draws, records, burnin)), draws)
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", type=Path, help="folder of seed_N/metrics.csv of one preset's runs")
    ap.add_argument("--against", type=Path, help="another preset's folder: test its LLC against FOLDER's")
    ap.add_argument("--draws", type=int, default=20000, help="draws per chain of the estimates to show")
    ap.add_argument("--burnin", type=int, default=0, help="their burn-in steps per chain (the llc setting burnin)")
    ap.add_argument("--records", type=Path, default=RECORDS, help="folder of PRESET/seed_N training records")
    ap.add_argument("--landmarks", action="store_true", help="one row per run (where the LLC peaks and falls)")
    ap.add_argument("--figure", type=Path, help="write DIR/PRESET_llc_series.png and .svg")
    args = ap.parse_args(argv)
    if args.landmarks or args.figure:
        est = estimates(args.folder, args.draws, args.records, args.burnin)
        if args.figure:
            curves = {seed: load_run(args.records / args.folder.name / f"seed_{seed}").metrics for seed in est}
            save_static(series_figure(est, args.folder.name, curves), args.figure)
        if args.landmarks:
            sys.stdout.write(landmarks(est))
        return
    sys.stdout.write(report(args.folder, args.draws, args.against, args.records, args.burnin))


if __name__ == "__main__":
    main()
