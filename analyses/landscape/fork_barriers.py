"""Loss barriers between fork arms and their parents (docs/landscape.md), from runs with checkpoints.

    python analyses/landscape/fork_barriers.py RUNS [--out results/landscape/fork_barriers]   # .md and .csv

RUNS is an arm sweep such as `analyses/interventions/run_cpu.sh parents pulses` trains (runs/interventions):
every fork arm whose parent is among the runs is compared with it at their latest shared checkpoint
(outputs.figures.barrier_points, the data of `geolens figures`' fork_barrier panel; 11 points on the line).
One row per arm: the change, fork step, seed, the epoch compared, both runs' test accuracy there (whether
both had generalised), the arm's onset shift (first epoch with test accuracy > 0.95, arm - parent), and the
train and test barriers.
"""

from __future__ import annotations

import argparse
import csv
import sys
from pathlib import Path

from geolens.outputs.figures import barrier_points
from geolens.outputs.tables import Rule
from geolens.runs.runset import found_runs

RULE = Rule()  # test accuracy > 0.95, every evaluated epoch
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


def markdown(rows: list[dict], notes: list[str]) -> str:
    lines = ["| parent | change | fork step | seed | compared at | test acc parent / arm | onset shift | test barrier "
             "| train barrier |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        shift = "no onset" if r["onset_shift"] is None else f"{r['onset_shift']:+,}"
        lines.append(f"| {r['parent']} | {r['change']} | {r['fork_step']:,} | {r['seed']} | {r['at']:,} | "
                     f"{r['parent_test_acc']:.3f} / {r['arm_test_acc']:.3f} | {shift} | {r['barrier_test']:.3g} | "
                     f"{r['barrier_train']:.3g} |")
    text = "\n".join(lines) + "\n"
    if notes:
        text += "\nNotes:\n\n" + "\n".join(f"- {n}" for n in notes) + "\n"
    return text


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("runs", help="folder of runs with checkpoints: parents and their fork arms")
    ap.add_argument("--out", default="results/landscape/fork_barriers", help="folder for fork_barriers.md and .csv")
    args = ap.parse_args(argv)
    rows, notes = rows_of(Path(args.runs))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    text = markdown(rows, notes)
    (out / "fork_barriers.md").write_text(text)
    with open(out / "fork_barriers.csv", "w", newline="") as f:
        w = csv.DictWriter(f, COLUMNS)
        w.writeheader()
        w.writerows(rows)
    print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
