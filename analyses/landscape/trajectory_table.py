"""The LLC / sharpness trajectory table of docs/landscape.md from a `geolens analyze --metrics llc,sharpness,loss`
table (analysis/metrics.csv: step, metric, name, value).

    python analyses/landscape/trajectory_table.py results/landscape/fb_seed1/metrics.csv
"""

from __future__ import annotations

import sys

from geolens.analysis.llc import stable_word
from geolens.analysis.trajectory import read_table

COLUMNS = [("llc", "LLC"), ("llc_std", "std"), ("llc_stable", "stable"), ("llc_embed", "embed"), ("llc_attn", "attn"),
           ("llc_mlp", "mlp"), ("llc_unembed", "unembed"), ("sharpness", "sharpness"), ("loss_train", "train loss"),
           ("acc_test", "test acc")]


def cell(name: str, v: dict[str, float]) -> str:
    """One cell: '-' where the table has no value (the LLC not estimated there, or before llc_stable existed)."""
    if name not in v:
        return "-"
    return stable_word(v) if name == "llc_stable" else f"{v[name]:.4g}"


def table(path: str) -> str:
    values = read_table(path)
    lines = ["| epoch | " + " | ".join(label for _, label in COLUMNS) + " |", "| --- " * (len(COLUMNS) + 1) + "|"]
    for step in sorted(values):
        v = values[step]
        lines.append(f"| {step:,} | " + " | ".join(cell(name, v) for name, _ in COLUMNS) + " |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(table(sys.argv[1]))
