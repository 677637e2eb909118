"""`geolens precursors`: per configuration and precursor, how often and how early its event precedes the
onset, as one table (rows of geolens.analysis.precursors.LeadStats), written as Markdown and CSV; and
the figure of every precursor against epochs relative to the onset (fig_precursors)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from geolens.analysis.precursors import PRECURSORS, LeadStats, Precursor, group_precursors, run_events
from geolens.outputs.plots import PALETTE, FigureSpec, Line, Panel, VLine
from geolens.runs.runset import RunGroup, find_runs, group_runs
from geolens.runs.storage import atomic_write_bytes

COLUMNS = ["configuration", "precursor", "rule", "runs", "with event", "precedes", "lead median", "lead IQR",
           "spearman", "LOO error", "LOO mean-onset error"]


def precursor_rows(root: str | Path) -> tuple[list[dict[str, str]], list[str], list[RunGroup]]:
    """One row per configuration (runs under root, grouped as `geolens table` does) and precursor, with
    its cells as text; notes (runs skipped, configurations without an onset); the groups."""
    runs, skipped = find_runs(root)
    notes = [f"skipped {path}: {why}" for path, why in skipped.items()]
    rules = {p.name: p.rule for p in PRECURSORS}
    rows = []
    groups = group_runs(runs)
    for group in groups:
        if not _has_onset(group):
            notes.append(f"{group.full_label}: no run has an onset; nothing to lead")
            continue
        rows += [_row(group.full_label, rules[s.precursor], s) for s in group_precursors(group)]
    return rows, notes, groups


def fig_precursors(groups: list[RunGroup]) -> FigureSpec | None:
    """Every recorded precursor of every run with an onset against epochs relative to that onset: one
    panel per precursor (rows) and configuration (columns), every seed a line scaled to [0, 1] over its
    run (min to max), its event (the precursor's rule) a marker, the onset the line x = 0."""
    with_onset = [g for g in groups if _has_onset(g)]
    events = {run.path: run_events(run) for g in with_onset for run in g.runs}
    panels = []
    for p in PRECURSORS:
        row = [_precursor_panel(p, g, PALETTE[i % len(PALETTE)], events) for i, g in enumerate(with_onset)]
        if any(panel.traces for panel in row):
            panels += row
    if not panels:
        return None
    return FigureSpec("precursors", "Precursors against epochs relative to the onset (every seed a line, its event a "
                      "marker)", panels, cols=len(with_onset), panel_width=3.6)


def _has_onset(group: RunGroup) -> bool:
    return any(r.events.get("onset_095") is not None for r in group.runs)


def _precursor_panel(p: Precursor, group: RunGroup, color: str, events: dict) -> Panel:
    """One precursor over one configuration's runs with an onset (fig_precursors; events: run_events
    of each run, by path)."""
    traces = []
    for run in group.runs:
        onset = run.events.get("onset_095")
        if onset is None:
            continue
        points = [(int(r["epoch"]), v) for r in run.metrics if (v := p.value(r)) is not None and not math.isnan(v)]
        if not points:
            continue
        lo, hi = min(v for _, v in points), max(v for _, v in points)
        scaled = {e: (v - lo) / (hi - lo) if hi > lo else 0.0 for e, v in points}
        traces.append(Line([e - onset for e in scaled], list(scaled.values()), "seed", color=color, legend=False))
        event = events[run.path][p.name]
        if event is not None:
            traces.append(Line([event - onset], [scaled[event]], "event", mode="markers", color="black", legend=False))
    if traces:
        traces.append(VLine(0, "onset", "#2ca02c"))
    return Panel(f"{p.name} ({p.rule}): {group.full_label}", traces, xlabel="epochs relative to the onset",
                 ylabel="scaled to [0, 1] per run", yrange=(-0.05, 1.05))


def _row(label: str, rule: str, s: LeadStats) -> dict[str, str]:
    def num(x, fmt):
        return "-" if x is None else format(x, fmt)

    return {"configuration": label, "precursor": s.precursor, "rule": rule, "runs": str(s.runs),
            "with event": str(s.with_event), "precedes": num(s.precedes, ".2f"), "lead median": num(s.lead_median, ",.0f"),
            "lead IQR": "-" if s.lead_iqr is None else f"{s.lead_iqr[0]:,.0f} to {s.lead_iqr[1]:,.0f}",
            "spearman": num(s.spearman, "+.2f"), "LOO error": num(s.loo_error, ",.0f"),
            "LOO mean-onset error": num(s.loo_baseline, ",.0f")}


def write_precursor_table(rows: list[dict[str, str]], notes: list[str], folder: Path) -> list[Path]:
    """folder/precursors.md (the table and its notes) and folder/precursors.csv."""
    folder.mkdir(parents=True, exist_ok=True)
    md = ["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)]
    md += ["| " + " | ".join(r[c] for c in COLUMNS) + " |" for r in rows]
    md += [""] + [f"- {n}" for n in notes]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    paths = [folder / "precursors.md", folder / "precursors.csv"]
    atomic_write_bytes(paths[0], ("\n".join(md) + "\n").encode())
    atomic_write_bytes(paths[1], out.getvalue().encode())
    return paths
