"""`geolens precursors`: per configuration and precursor, how often and how early its event precedes the
onset, as one table (rows of geolens.analysis.precursors.LeadStats, Holm-corrected over the whole table;
within a configuration the rows that survive the correction first, then by corrected p-value), written
as Markdown and CSV; and the figure of every precursor against epochs relative to the onset
(fig_precursors)."""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path

from geolens.analysis.precursors import (PRECURSORS, LeadStats, Precursor, group_precursors, run_events, series_rows,
                                        with_holm)
from geolens.analysis.online_rules import OnlineStats, check_forecast, group_online
from geolens.analysis.online_rules import with_holm as online_with_holm
from geolens.analysis.significance import fmt_interval, fmt_p, spearman_null, wilcoxon_less
from geolens.outputs.plots import PALETTE, FigureSpec, Line, Panel, VLine
from geolens.runs.forecast import Forecast, read_forecasts
from geolens.runs.runset import RunGroup, found_runs, group_key, group_runs
from geolens.runs.storage import atomic_write_bytes

COLUMNS = ["configuration", "precursor", "rule", "runs", "with event", "precedes", "lead median", "lead IQR",
           "lead interval (coverage)", "spearman", "p", "p (Holm)", "survives", "LOO error", "LOO mean-onset error", "LOO beats mean"]


def load_groups(root: str | Path) -> tuple[list[RunGroup], list[str]]:
    """The finished runs under root grouped as `geolens table` groups them, and the notes on them
    (runset.found_runs): what precursor_rows, online_rows and check_rows read, found once per command."""
    runs, notes = found_runs(root)
    return group_runs(runs), notes


def precursor_rows(groups: list[RunGroup], found: list[str]) -> tuple[list[dict[str, str]], list[str], list[RunGroup]]:
    """One row per configuration (load_groups) and precursor, with its cells as text; notes (found: the
    notes on the runs; configurations without an onset); the groups."""
    notes = list(found)
    rules = {p.name: p.rule for p in PRECURSORS}
    stats = []
    for group in groups:
        if not _has_onset(group):
            notes.append(f"{group.full_label}: no run has an onset; nothing to lead")
            continue
        stats += [(group.full_label, s) for s in group_precursors(group)]
    with_holm([s for _, s in stats])
    tested = sum(s.spearman_p is not None for _, s in stats)
    order = {label: i for i, label in enumerate(dict.fromkeys(label for label, _ in stats))}
    stats.sort(key=lambda ls: (order[ls[0]], not ls[1].survives, ls[1].holm_p is None, ls[1].holm_p or 0.0))
    if tested:
        nulls = "; ".join(f"{n} runs: {spearman_null(n)}" for n in sorted({s.with_event for _, s in stats
                                                                            if s.spearman_p is not None}))
        notes.insert(0, f"p: two-sided permutation p-value of the Spearman correlation ({nulls}); p (Holm): corrected "
                        f"over the {tested} correlations of this table; survives: p (Holm) <= 0.05; lead interval: the "
                        f"order-statistic interval of the median lead with its coverage (95% or more from 6 runs; "
                        f"below, the range of the leads)")
    return [_row(label, rules[s.precursor], s) for label, s in stats], notes, groups


def fig_precursors(groups: list[RunGroup]) -> FigureSpec | None:
    """Every recorded precursor of every run with an onset against epochs relative to that onset: one
    panel per precursor (rows) and configuration (columns), every seed a line scaled to [0, 1] over its
    run (min to max), its event (the precursor's rule) a marker, the onset the line x = 0."""
    with_onset = [g for g in groups if _has_onset(g)]
    rows = {run.path: series_rows(run) for g in with_onset for run in g.runs}
    events = {path: run_events(run, rows[path]) for g in with_onset for run in g.runs for path in [run.path]}
    panels = []
    for p in PRECURSORS:
        row = [_precursor_panel(p, g, PALETTE[i % len(PALETTE)], events, rows) for i, g in enumerate(with_onset)]
        if any(panel.traces for panel in row):
            panels += row
    if not panels:
        return None
    return FigureSpec("precursors", "Precursors against epochs relative to the onset (every seed a line, its event a "
                      "marker)", panels, cols=len(with_onset), panel_width=3.6)


def _has_onset(group: RunGroup) -> bool:
    return any(r.events.get("onset_095") is not None for r in group.runs)


def _precursor_panel(p: Precursor, group: RunGroup, color: str, events: dict, rows: dict) -> Panel:
    """One precursor over one configuration's runs with an onset (fig_precursors; events: run_events
    of each run, rows: its series_rows, both by path)."""
    traces = []
    for run in group.runs:
        onset = run.events.get("onset_095")
        if onset is None:
            continue
        points = [(int(r["epoch"]), v) for r in rows[run.path] if (v := p.value(r)) is not None and not math.isnan(v)]
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
            "lead interval (coverage)": fmt_interval(s.lead_interval),
            "spearman": num(s.spearman, "+.2f"), "p": fmt_p(s.spearman_p), "p (Holm)": fmt_p(s.holm_p),
            "survives": "-" if s.holm_p is None else ("yes" if s.survives else "no"),
            "LOO error": num(s.loo_error, ",.0f"), "LOO mean-onset error": num(s.loo_baseline, ",.0f"),
            "LOO beats mean": "-" if s.loo_wins is None else f"{s.loo_wins}/{s.with_event}"}


def write_precursor_table(rows: list[dict[str, str]], notes: list[str], folder: Path, name: str = "precursors",
                          columns: list[str] = COLUMNS) -> list[Path]:
    """folder/<name>.md (the table and its notes) and folder/<name>.csv."""
    folder.mkdir(parents=True, exist_ok=True)
    md = ["| " + " | ".join(columns) + " |", "|" + " --- |" * len(columns)]
    md += ["| " + " | ".join(r[c] for c in columns) + " |" for r in rows]
    md += [""] + [f"- {n}" for n in notes]
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=columns, lineterminator="\n")
    writer.writeheader()
    writer.writerows(rows)
    paths = [folder / f"{name}.md", folder / f"{name}.csv"]
    atomic_write_bytes(paths[0], ("\n".join(md) + "\n").encode())
    atomic_write_bytes(paths[1], out.getvalue().encode())
    return paths


ONLINE_COLUMNS = ["configuration", "column", "rule (all seeds)", "runs", "fired", "never", "late", "MAE",
                  "mean-onset MAE", "beats mean", "warning median", "warning range", "p", "p (Holm)", "survives"]


def online_rows(groups: list[RunGroup], found: list[str], min_warning: int = 0, columns: list[str] | None = None
                ) -> tuple[list[dict[str, str]], list[str], list[Forecast]]:
    """`geolens precursors --online`: per configuration and recorded column, the threshold rule tested
    leave-one-seed-out (geolens.analysis.online_rules), Holm-corrected over the whole table, each
    configuration's rows by held-out MAE; notes; and per configuration the forecast of its best rule
    (the lowest held-out MAE among rules that fired on every held-out run), fitted on all its runs."""
    notes = list(found)
    stats, forecasts = [], []
    for group in groups:
        if not _has_onset(group):
            notes.append(f"{group.full_label}: no run has an onset; nothing to forecast")
            continue
        rows = group_online(group, min_warning, columns)
        stats += [(group, s) for s in rows]
        usable = [s for s in rows if s.rule is not None and s.never == 0 and s.mae is not None]
        if usable:
            best = min(usable, key=lambda s: s.mae)
            onsets = {r.config.seed: r.events["onset_095"] for r in group.runs if r.events.get("onset_095") is not None}
            forecasts.append(Forecast(group.full_label, group_key(group.config), list(onsets), best.rule, best.mae,
                                      best.baseline_mae, min_warning, sum(onsets.values()) / len(onsets)))
        else:
            notes.append(f"{group.full_label}: no column's rule fires on every held-out run; no forecast")
    online_with_holm([s for _, s in stats])
    tested = sum(s.p is not None for _, s in stats)
    notes.insert(0, f"rules fitted leave-one-seed-out with a minimum warning of {min_warning:,} epochs; fired/never: "
                    f"held-out runs the other runs' rule fired on / never fired on; late: fired less than the minimum "
                    f"warning before the onset; MAE and mean-onset MAE over the fired runs; p: one-sided Wilcoxon "
                    f"signed-rank (forecast errors < mean-onset errors), p (Holm) corrected over the {tested} tests of "
                    f"this table; survives: p (Holm) <= 0.05")
    order = {label: i for i, label in enumerate(dict.fromkeys(g.full_label for g, _ in stats))}
    stats.sort(key=lambda gs: (order[gs[0].full_label], gs[1].mae is None, gs[1].mae or 0.0))
    return [_online_row(g.full_label, s) for g, s in stats], notes, forecasts


def _online_row(label: str, s: OnlineStats) -> dict[str, str]:
    return {"configuration": label, "column": s.column, "rule (all seeds)": "-" if s.rule is None else
            f"{s.rule.describe()}, lead {s.rule.lead:,.0f}", "runs": str(s.runs), "fired": str(s.fired),
            "never": str(s.never), "late": str(s.late), "MAE": _num(s.mae), "mean-onset MAE": _num(s.baseline_mae),
            "beats mean": "-" if s.wins is None else f"{s.wins}/{s.fired}", "warning median": _num(s.warning_median),
            "warning range": "-" if s.warning_range is None else f"{s.warning_range[0]:,} to {s.warning_range[1]:,}",
            "p": fmt_p(s.p), "p (Holm)": fmt_p(s.holm_p),
            "survives": "-" if s.holm_p is None else ("yes" if s.survives else "no")}


CHECK_COLUMNS = ["configuration", "seed", "rule", "fired", "forecast", "onset", "error", "mean-onset error"]


def check_rows(groups: list[RunGroup], found: list[str], path: str | Path) -> tuple[list[dict[str, str]], list[str]]:
    """`geolens precursors --check FILE`: the forecast file's rule for each configuration (load_groups) replayed
    on every run of it (runs the file has no rule for are counted in a note), one row per run, and per
    configuration a summary note: the forecasts' MAE against the fitting runs' mean onset's, on how many
    runs the forecast is closer, the one-sided Wilcoxon p-value that its errors are smaller, runs never fired."""
    forecasts = read_forecasts(path)
    notes = list(found)
    rows = []
    for group in groups:
        f = next((f for f in forecasts if f.matches(group_key(group.config))), None)
        if f is None or group.fork:
            notes.append(f"{group.full_label}: {path} has no rule for this configuration ({len(group.runs)} runs)")
            continue
        checked = check_forecast(f.rule, f.mean_onset, group.runs)
        fitted = set(f.seeds) & {c.seed for c in checked}
        for c in checked:
            rows.append({"configuration": group.full_label, "seed": str(c.seed), "rule": f.rule.describe(),
                         "fired": _num(c.fired), "forecast": _num(c.expected), "onset": _num(c.onset),
                         "error": _num(c.error), "mean-onset error": _num(c.baseline_error)})
        scored = [c for c in checked if c.error is not None and c.baseline_error is not None]
        if scored:
            errors, base = [c.error for c in scored], [c.baseline_error for c in scored]
            notes.append(f"{group.full_label}: forecast MAE {sum(errors) / len(errors):,.0f} against the fitting runs' "
                         f"mean onset ({f.mean_onset:,.0f}) {sum(base) / len(base):,.0f} on {len(scored)} runs, closer on "
                         f"{sum(e < b for e, b in zip(errors, base))}; one-sided Wilcoxon p "
                         f"{fmt_p(wilcoxon_less(errors, base))}; never fired on {sum(c.fired is None for c in checked)}")
        if fitted:
            notes.append(f"{group.full_label}: seeds {sorted(fitted)} are among those the rule was fitted on: "
                         "not a held-out test for them")
    return rows, notes


def _num(x) -> str:
    return "-" if x is None else f"{x:,.0f}"
