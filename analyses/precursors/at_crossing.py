"""docs/precursors.md's numbers at W_L's crossing: per configuration of the committed addition records,
the range over seeds of test accuracy and test loss at the `wl_gini` crossing:0.5 event (geolens precursors'
rule), and of the test loss's memorisation peak (its maximum over the run), as a Markdown table.

    python analyses/precursors/at_crossing.py RECORDS OUT_MD
"""

from __future__ import annotations

import sys
from pathlib import Path

from geolens.analysis.precursors import run_events
from geolens.runs.runset import find_runs, group_runs


def span(values: list[float], fmt: str) -> str:
    return f"{format(min(values), fmt)}-{format(max(values), fmt)}"


def at_crossing(records: Path) -> str:
    lines = ["| configuration | seeds | test acc at the wl_gini crossing | test loss there | peak test loss |",
             "| --- | --- | --- | --- | --- |"]
    for group in group_runs(find_runs(records)[0]):
        acc, loss, peak = [], [], []
        for run in group.runs:
            epoch = run_events(run)["wl_gini"]
            if epoch is None:
                continue
            row = next(r for r in run.metrics if r["epoch"] == epoch)
            acc.append(row["test_acc"])
            loss.append(row["test_loss"])
            peak.append(max(r["test_loss"] for r in run.metrics))
        if acc:
            lines.append(f"| {group.full_label} | {len(acc)} | {span(acc, '.2f')} | {span(loss, '.1f')} | "
                         f"{span(peak, '.1f')} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    Path(sys.argv[2]).write_text(at_crossing(Path(sys.argv[1])))
