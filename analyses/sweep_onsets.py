"""Grokking onsets of a seed sweep next to the paper's Table 1 row (used for docs/results.md).

    python analyses/sweep_onsets.py runs/sweep_fb_lr6e-4 --config bounded_sphere

For each member run (OUT/seed_<seed>, as `geolens sweep` writes them): the onset at the run's own
evaluation resolution (events.json onset_095: first evaluation with test accuracy > 0.95), the
onset on the paper's 200-epoch grid (first multiple of 200 with test accuracy > 0.95, read from
metrics.csv), and the epoch from which test accuracy stays >= 0.99. Then mean / std (sample) /
range on the grid next to the Table 1 row with the same lr, weight decay and --config.
Members that never reached 0.95 count as failures and stay out of the statistics.
"""

from __future__ import annotations

import argparse
import csv
import json
import statistics
from pathlib import Path

from geolens.run import load_run

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "paper_tables.json"
GRID = 200
THRESHOLD = 0.95


def grid_onset(metrics_csv: Path) -> int | None:
    """First epoch on the 200-epoch grid whose test accuracy exceeds 0.95."""
    with open(metrics_csv) as f:
        for row in csv.DictReader(f):
            epoch = int(row["epoch"])
            if epoch % GRID == 0 and float(row["test_acc"]) > THRESHOLD:
                return epoch
    return None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("sweep", type=Path, help="the sweep's --out folder")
    ap.add_argument("--config", required=True, help="Table 1 config name, e.g. bounded_sphere or layernorm")
    args = ap.parse_args()

    members = sorted(args.sweep.glob("seed_*"), key=lambda p: int(p.name.split("_")[1]))
    print("| seed | onset (eval every 10) | onset (200-epoch grid) | test acc >= 0.99 from | last epoch |")
    print("| --- | --- | --- | --- | --- |")
    onsets, cfg = [], None
    for path in members:
        run = load_run(path)
        cfg = run.config
        events = json.loads((path / "events.json").read_text())
        grid = grid_onset(path / "metrics.csv")
        if grid is not None:
            onsets.append(grid)
        print(f"| {cfg.seed} | {events.get('onset_095')} | {grid} | {events.get('sustained_099')} | {events.get('final_epoch')} |")
    failures = len(members) - len(onsets)
    if onsets:
        std = statistics.stdev(onsets) if len(onsets) > 1 else float("nan")
        print(f"\ngeolens, {len(members)} seeds: mean {statistics.mean(onsets):.0f}, std {std:.0f}, "
              f"range {min(onsets)}-{max(onsets)}, failures {failures} (no onset within {cfg.epochs} epochs)")
    table = json.loads(REFERENCE.read_text())["table1_zp_addition_p113"]["rows"]
    for row in table:
        if row["config"] == args.config and row["lr"] == cfg.lr and row["wd"] == cfg.weight_decay:
            print(f"paper, {args.config}, lr {row['lr']}, wd {row['wd']}: mean {row['mean']}, std {row['std']}, "
                  f"range {row['min']}-{row['max']}, failures {row['failures']}")


if __name__ == "__main__":
    main()
