"""Loss barriers between fork arms and their parents (docs/landscape.md), from runs with checkpoints.

    python analyses/landscape/fork_barriers.py RUNS [--out results/landscape/fork_barriers] [--control CHANGE]

RUNS is an arm sweep such as `analyses/interventions/run_cpu.sh parents pulses` trains (runs/interventions):
every fork arm whose parent is among the runs is compared with it at their latest shared checkpoint
(outputs.figures.barrier_points, the data of `geolens figures`' fork_barrier panel; 11 points on the line).
One row per arm: the change, fork step, seed, the epoch compared, both runs' test accuracy there (whether
both had generalised), the arm's onset shift (first epoch with test accuracy > 0.95, arm - parent), and the
train and test barriers. With --control (a change label as the table prints it, e.g. the 1% chaos control
"schedule weight_decay=1.01@+0:+200"), each other change's test barriers are set against the control's, among
the pairs where both runs had generalised (test accuracy >= 0.95 at the epoch compared), within seeds (arms of
one seed share their parent): the stratified exact Mann-Whitney test (significance.smaller_within), one-sided,
that the control's barriers are the smaller (the control measures the barrier any negligible perturbation leads
to), for every change pooled and for each change, Holm-corrected over those tests (one family).
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

import numpy as np

from geolens.analysis.significance import fmt_p, holm, smaller_within
from geolens.outputs.figures import barrier_points
from geolens.outputs.tables import Rule
from geolens.runs.runset import found_runs

RULE = Rule()  # test accuracy > 0.95, every evaluated epoch
GENERALISED = 0.95  # both runs' test accuracy at the compared epoch, for the comparison with the control
COLUMNS = ["parent", "change", "fork_step", "seed", "at", "parent_test_acc", "arm_test_acc", "onset_shift",
           "barrier_test", "barrier_train"]


def acc_at(run, epoch: int) -> float:
    """Test accuracy of `run` at its last evaluated epoch <= `epoch`."""
    return [r["test_acc"] for r in run.metrics if r["epoch"] <= epoch][-1]


def rows_of(root: Path) -> tuple[list[dict], list[str]]:
    """One row (COLUMNS) per fork arm under root that barrier_points measures, and notes on those left out."""
    runs, notes = found_runs(root)
    points, missing = barrier_points(runs)
    rows = []
    for p in sorted(points, key=lambda p: (p.panel, p.change, p.step, p.seed)):
        onsets = RULE.onset(p.arm.metrics), RULE.onset(p.parent.metrics)
        shift = None if None in onsets else onsets[0] - onsets[1]
        rows.append(dict(parent=p.panel, change=p.change, fork_step=p.step, seed=p.seed, at=p.at,
                         parent_test_acc=acc_at(p.parent, p.at), arm_test_acc=acc_at(p.arm, p.at), onset_shift=shift,
                         barrier_test=p.test, barrier_train=p.train))
    return rows, notes + missing


def against_control(rows: list[dict], control: str) -> list[str]:
    """One line per change of the control's parent configuration (and one for all of them pooled): its test
    barriers' median and count against the control's, where both runs had generalised, and the within-seed
    one-sided p-value that the control's are smaller, with its Holm correction over the lines' tests."""
    both = [r for r in rows if min(r["parent_test_acc"], r["arm_test_acc"]) >= GENERALISED]
    ctrl = [r for r in both if r["change"] == control]
    if not ctrl:
        return [f"no arm of the control '{control}' with both runs generalised: nothing to compare"]
    others = [r for r in both if r["change"] != control and r["parent"] in {c["parent"] for c in ctrl}]
    seeds = sorted({r["seed"] for r in both})

    def median(group: list[dict]) -> float:
        return float(np.median([r["barrier_test"] for r in group]))

    heads, ps = [], []
    for name, arms in [("every change", others)] + [(c, [r for r in others if r["change"] == c])
                                                     for c in sorted({r["change"] for r in others})]:
        strata = [([r["barrier_test"] for r in ctrl if r["seed"] == s], [r["barrier_test"] for r in arms if r["seed"] == s])
                  for s in seeds]
        heads.append(f"{name}: test barrier median {median(arms):.3g} ({len(arms)} arms) against the control's "
                     f"{median(ctrl):.3g} ({len(ctrl)}); the control's smaller within seeds")
        ps.append(smaller_within(strata))
    tested = sum(p is not None for p in ps)
    return [f"{head}: p = {fmt_p(p)}, Holm {fmt_p(q)} over the {tested} tests here (stratified exact Mann-Whitney, "
            "one-sided)" for head, p, q in zip(heads, ps, holm(ps))]


def markdown(rows: list[dict], notes: list[str], comparison: list[str] | None = None) -> str:
    lines = ["| parent | change | fork step | seed | compared at | test acc parent / arm | onset shift | test barrier "
             "| train barrier |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        shift = "no onset" if r["onset_shift"] is None else f"{r['onset_shift']:+,}"
        lines.append(f"| {r['parent']} | {r['change']} | {r['fork_step']:,} | {r['seed']} | {r['at']:,} | "
                     f"{r['parent_test_acc']:.3f} / {r['arm_test_acc']:.3f} | {shift} | {r['barrier_test']:.3g} | "
                     f"{r['barrier_train']:.3g} |")
    text = "\n".join(lines) + "\n"
    if comparison:
        text += "\nAgainst the control (pairs where both runs had generalised):\n\n" + "\n".join(f"- {c}" for c in comparison) + "\n"
    if notes:
        text += "\nNotes:\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="folder of runs with checkpoints: parents and their fork arms")
    ap.add_argument("--out", default="results/landscape/fork_barriers", help="folder for fork_barriers.md and .csv")
    ap.add_argument("--control", help="change label of the control arms, as the table prints it, to compare with")
    args = ap.parse_args(argv)
    rows, notes = rows_of(Path(args.runs))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, notes, against_control(rows, args.control) if args.control else None)
    (out / "fork_barriers.md").write_text(text)
    with open(out / "fork_barriers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
