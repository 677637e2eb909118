"""The LLC at the checkpoints of the llc lane's trajectories where it was estimated at one SGLD setting
(docs/landscape.md), beside each run's onset.

    python analyses/landscape/llc_points.py PRESET [--draws 20000] [--root results/landscape] [--tables llc]

Reads ROOT/TABLES/PRESET/seed_N/metrics.csv (`geolens analyze --metrics llc` tables) and the runs' training records
ROOT/records/llc/PRESET/seed_N (their onset: the first evaluated epoch with test accuracy > 0.95). One row per
checkpoint whose LLC was estimated with `--draws` draws per chain: the seed, the onset, the epoch and its distance
to the onset, the LLC with its standard deviation over chains, whether the chains were stable (llc.judge), the
sharpness, and the training loss and test accuracy there.
"""

from __future__ import annotations

import argparse
import csv
import sys
from collections import defaultdict
from pathlib import Path

from geolens.outputs.tables import Rule
from geolens.runs.run import load_run

RULE = Rule()  # test accuracy > 0.95


def checkpoint_values(path: Path) -> dict[int, dict[str, float]]:
    """{epoch: {name: value}} of one tidy analysis table."""
    values: dict[int, dict[str, float]] = defaultdict(dict)
    with open(path) as f:
        for row in csv.DictReader(f):
            values[int(row["step"])][row["name"]] = float(row["value"])
    return values


def table(root: Path, preset: str, draws: int, tables: str = "llc") -> str:
    lines = ["| seed | onset | epoch | epoch - onset | LLC ± std over chains | stable | sharpness | train loss "
             "| test acc |", "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for folder in sorted((root / tables / preset).glob("seed_*"), key=lambda p: int(p.name.split("_")[1])):
        onset = RULE.onset(load_run(root / "records" / "llc" / preset / folder.name).metrics)
        for epoch, v in sorted(checkpoint_values(folder / "metrics.csv").items()):
            if v.get("llc_setting_draws") != draws:
                continue
            stable = {1.0: "yes", 0.0: "no"}.get(v.get("llc_stable"), "-")
            to_onset = "-" if onset is None else f"{epoch - onset:+,}"
            lines.append(f"| {folder.name.split('_')[1]} | {onset if onset is None else f'{onset:,}'} | {epoch:,} | "
                         f"{to_onset} | {v['llc']:.4g} ± {v['llc_std']:.2g} | {stable} | {v.get('sharpness', float('nan')):.4g} | "
                         f"{v['loss_train']:.4g} | {v['acc_test']:.4g} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset")
    ap.add_argument("--draws", type=int, default=20000, help="draws per chain of the estimates to show")
    ap.add_argument("--root", type=Path, default=Path("results/landscape"))
    ap.add_argument("--tables", default="llc", help="folder under ROOT holding PRESET/seed_N/metrics.csv")
    args = ap.parse_args(argv)
    sys.stdout.write(table(args.root, args.preset, args.draws, args.tables))


if __name__ == "__main__":
    main()
