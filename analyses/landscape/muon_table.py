"""Muon against AdamW (docs/landscape.md), from the records `analyses/landscape/run_cpu.sh muon` trains.

    python analyses/landscape/muon_table.py [RECORDS] [--out results/landscape]   # muon_table.md, muon_tests.md

RECORDS defaults to results/landscape/records/muon (the muon lane's records; the llc lane's lie beside it).

One row per preset and optimizer: the onset (first evaluated epoch with test accuracy > 0.95) mean ± std and
range over the seeds with one (outputs.stats.onset_cell), and whether generalisation held after it: the
runs stop 3,000 epochs after test accuracy last rose to >= 0.99 and stayed there (early stop), so "held" counts
the runs that ended that way, and the lowest test accuracy any seed showed after it first reached 0.99 says how
deep a loss went. Then, per preset, whether Muon's and AdamW's onsets differ: one two-sided exact Mann-Whitney U
test (significance.onsets_differ, a seed without an onset ranked last; the question is asked in both directions),
Holm-corrected over the presets' tests (one family).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path

from geolens.analysis.significance import fmt_p, holm, onsets_differ
from geolens.outputs.stats import onset_cell
from geolens.outputs.tables import Rule
from geolens.runs.runset import found_runs

RULE = Rule()  # test accuracy > 0.95, every evaluated epoch
HELD_ACC = 0.99
PRESETS = ["ln", "sphere", "fb"]
OPTIMIZERS = ["adamw", "muon"]


@dataclass(frozen=True)
class MuonRun:
    """One run: its onset (None: none within the budget), whether it stopped early (held >= 0.99 for the
    early-stop window), the lowest test accuracy after it first reached 0.99 (None: it never did), last epoch."""

    onset: int | None
    held: bool
    worst_after: float | None
    final_epoch: int


def measure(rows: list[dict], stop_reason: str | None) -> MuonRun:
    """MuonRun of one run's metrics rows (epoch, test_acc) and run.json's stop_reason."""
    first = next((i for i, r in enumerate(rows) if r["test_acc"] >= HELD_ACC), None)
    worst = None if first is None else min(r["test_acc"] for r in rows[first:])
    return MuonRun(RULE.onset(rows), stop_reason == "early_stop", worst, rows[-1]["epoch"])


def collect(root: Path) -> tuple[dict[tuple[str, str], list[MuonRun]], list[str]]:
    """{(preset, optimizer): [MuonRun per seed]} of the finished runs under root, and provenance notes."""
    runs, notes = found_runs(root)
    out: dict[tuple[str, str], list[MuonRun]] = {}
    for run in sorted(runs, key=lambda r: (r.config.preset or "", r.config.optimizer, r.config.seed)):
        if run.header.get("status") != "finished" or run.config.preset not in PRESETS:
            continue
        out.setdefault((run.config.preset, run.config.optimizer), []).append(measure(run.metrics, run.header.get("stop_reason")))
    return out, notes


def held_cell(runs: list[MuonRun]) -> str:
    reached = [r for r in runs if r.worst_after is not None]
    worst = f"; lowest test acc after 0.99: {min(r.worst_after for r in reached):.3f}" if reached else ""
    return f"{sum(r.held for r in runs)} of {len(runs)}{worst}"


def build(root: Path) -> tuple[str, str]:
    """(the table with its notes, the table of tests), as Markdown."""
    data, notes = collect(root)
    lines = ["| preset | optimizer | onset mean ± std (range; seeds) | held >= 0.99 for 3,000 epochs |",
             "| --- | --- | --- | --- |"]
    for preset in PRESETS:
        for opt in OPTIMIZERS:
            if (preset, opt) in data:
                runs = data[(preset, opt)]
                lines.append(f"| {preset} | {opt} | {onset_cell([(r.onset, r.final_epoch) for r in runs])} | {held_cell(runs)} |")
    asked: list[tuple[str, str, float | None]] = []
    for preset in PRESETS:
        adamw, muon = data.get((preset, "adamw")), data.get((preset, "muon"))
        if adamw and muon:
            a, m = [r.onset for r in adamw], [r.onset for r in muon]
            asked.append((preset, f"{len(m)} vs {len(a)}", onsets_differ(m, a)))
    tested = sum(p is not None for _, _, p in asked)
    tests = [f"Two-sided exact Mann-Whitney U (a seed without an onset ranks last); p (Holm): corrected over the "
             f"{tested} tests of this table (one family):", "",
             "| preset | question | seeds | p | p (Holm) |", "| --- | --- | --- | --- | --- |"]
    tests += [f"| {preset} | muon and adamw differ | {seeds} | {fmt_p(p)} | {fmt_p(q)} |"
              for (preset, seeds, p), q in zip(asked, holm([p for _, _, p in asked]))]
    table = "\n".join(lines)
    if notes:
        table += "\n\nNotes:\n\n" + "\n".join(f"- {n}" for n in notes)
    return table + "\n", "\n".join(tests) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="?", default="results/landscape/records/muon")
    ap.add_argument("--out", default="results/landscape", help="folder for muon_table.md and muon_tests.md")
    args = ap.parse_args(argv)
    table, tests = build(Path(args.records))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "muon_table.md").write_text(table)
    (out / "muon_tests.md").write_text(tests)
    print(table + "\n" + tests, end="")


if __name__ == "__main__":
    sys.exit(main())
