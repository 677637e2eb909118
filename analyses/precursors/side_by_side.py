"""docs/precursors.md's side-by-side table: per configuration, W_L's offline crossing against the best
online threshold rules, read from the CSVs `geolens precursors --online` wrote (analyses/precursors/tables.sh).

    python analyses/precursors/side_by_side.py OFFLINE_CSV OUT_MD ONLINE_CSV:WARNING [ONLINE_CSV:WARNING ...]

One row per configuration and table: the offline wl_gini crossing (lead, LOO error against the mean
onset's, p (Holm)), then for each online table (its minimum warning) the rule with the lowest held-out
MAE (misses counted: the forecast file's), and the wl_gini and test_loss rules when they are not that one:
MAE against the mean onset's, seeds it beats the mean on, median warning, p (Holm).
"""

from __future__ import annotations

import csv
import sys
from pathlib import Path


SHOWN = ("wl_gini", "test_loss")  # W_L's concentration, and the test loss an observer sees anyway


def read(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def side_by_side(offline: list[dict[str, str]], online: list[tuple[int, list[dict[str, str]]]]) -> str:
    lines = ["| configuration | W_L crossing (offline): lead, LOO error / mean onset's, p (Holm) | min warning | "
             "online rule | MAE / mean onset's | beats mean | warning median | p (Holm) |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for config in dict.fromkeys(r["configuration"] for r in offline):
        cross = next((r for r in offline if r["configuration"] == config and r["precursor"] == "wl_gini"), None)
        crossing = "-" if cross is None else (f"{cross['lead median']}, {cross['LOO error']} / "
                                              f"{cross['LOO mean-onset error']}, {cross['p (Holm)']}")
        for warning, rows in online:
            mine = [r for r in rows if r["configuration"] == config and r["MAE"] != "-"]
            best = mine[:1] + [r for r in mine[1:] if r["column"] in SHOWN]  # rows come sorted by MAE
            for r in best or [None]:
                cells = ["(no column has a rule in every fold)", "-", "-", "-", "-"] if r is None else [
                    r["rule (all seeds)"], f"{r['MAE']} / {r['mean-onset MAE']}", r["beats mean"], r["warning median"],
                    r["p (Holm)"]]
                lines.append(f"| {config} | {crossing} | {warning} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    offline, out = read(Path(argv[0])), Path(argv[1])
    online = [(int(w), read(Path(p))) for p, w in (a.rsplit(":", 1) for a in argv[2:])]
    out.write_text(side_by_side(offline, online))


if __name__ == "__main__":
    main(sys.argv[1:])
