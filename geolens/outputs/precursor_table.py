"""`geolens precursors`: per configuration and precursor, how often and how early its event precedes the
onset, as one table (rows of geolens.analysis.precursors.LeadStats, Holm-corrected over the whole table;
within a configuration the rows that survive the correction first, then by corrected p-value), written
as Markdown and CSV; and the figure of every precursor against epochs relative to the onset
(fig_precursors)."""

from __future__ import annotations

import csv
import io
import math
import statistics
from collections import Counter
from pathlib import Path

from geolens.analysis.precursors import (PRECURSORS, LeadStats, Precursor, group_precursors, run_events, series_rows,
                                        with_holm)
from geolens.analysis.online_rules import (HORIZON, OnlineStats, Scored, check_forecast, column_series, group_online,
                                          group_series, loo_outcomes, nested_online, operating_points,
                                          recorded_columns, run_auroc, scored)
from geolens.analysis.online_rules import with_holm as online_with_holm
from geolens.analysis.significance import fmt_interval, fmt_p, spearman_null, wilcoxon_less
from geolens.errors import GeoError
from geolens.outputs.plots import PALETTE, FigureSpec, Line, Panel, VLine
from geolens.runs.forecast import Forecast, read_forecasts
from geolens.runs.run import Run
from geolens.runs.runset import RunGroup, found_runs, group_key, group_runs
from geolens.runs.storage import atomic_write_bytes

COLUMNS = ["configuration", "precursor", "rule", "runs", "with event", "precedes", "lead median", "lead IQR",
           "lead interval (coverage)", "spearman", "p", "p (Holm)", "survives", "LOO error", "LOO mean-onset error", "LOO beats mean"]


def load_groups(root: str | Path) -> tuple[list[RunGroup], list[str]]:
    """The finished runs under root grouped as `geolens table` groups them, and the notes on them
    (runset.found_runs): what precursor_rows, online_rows and check_rows read, found once per command."""
    runs, notes = found_runs(root)
    return group_runs(runs), notes


def check_columns(groups: list[RunGroup], columns: list[str] | None) -> None:
    """Refuse (GeoError, one line) online-rule columns that no run under the folder recorded."""
    recorded = recorded_columns([r for g in groups for r in g.runs])
    unknown = [c for c in columns or [] if c not in recorded]
    if unknown:
        raise GeoError(f"--columns {','.join(unknown)}: not recorded by these runs; their columns are "
                       f"{', '.join(recorded)}")


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


ONLINE_COLUMNS = ["configuration", "column", "rule (all seeds)", "runs", "no rule", "fired", "never", "late", "early",
                  "MAE", "mean-onset MAE", "beats mean", "warning median", "warning range", "false alarms", "p",
                  "p (Holm)", "survives"]


#: a run that did not grok is scored against a configuration equal to it in every other field: the same model, data
#: and optimizer with weight decay or the norm's placement changed (e.g. LayerNorm at weight decay 0, or pre-norm)
NONGROKKING_MAY_DIFFER = ("weight_decay", "norm_placement")


def nongrokking_runs(groups: list[RunGroup], more: list[RunGroup] = ()) -> dict[str, list[Run]]:
    """Per configuration with an onset (RunGroup.full_label; forks left out), the runs that did not grok within
    their budget and are scored for its rule's false alarms: runs without an onset, of its groups and of `more`
    (`geolens precursors --nongrokking`), equal to it in every field but NONGROKKING_MAY_DIFFER."""
    targets = {}
    for g in groups:
        if _has_onset(g) and not g.fork:
            targets.setdefault(group_key(g.config, NONGROKKING_MAY_DIFFER), []).append(g.full_label)
    out: dict[str, list[Run]] = {label: [] for labels in targets.values() for label in labels}
    seen = set()
    for g in [*groups, *more]:
        for run in g.runs:
            if g.fork or run.events.get("onset_095") is not None or str(run.path) in seen:
                continue
            seen.add(str(run.path))
            for label in targets.get(group_key(g.config, NONGROKKING_MAY_DIFFER), []):
                out[label].append(run)
    return out


def online_rows(groups: list[RunGroup], found: list[str], min_warning: int = 0, columns: list[str] | None = None,
                negatives: dict[str, list[Run]] | None = None, horizon: int = HORIZON
                ) -> tuple[list[dict[str, str]], list[str], list[Forecast]]:
    """`geolens precursors --online`: per configuration and recorded column, the threshold rule tested
    leave-one-seed-out with its misses (geolens.analysis.online_rules), its rule replayed on the configuration's
    runs that did not grok (negatives: nongrokking_runs), Holm-corrected over the whole table, each
    configuration's rows by held-out MAE; notes; and per configuration the forecast of its best rule (the
    lowest held-out MAE among columns with a rule in every fold), fitted on all its runs."""
    negatives = negatives or {}
    notes = list(found)
    stats, forecasts = [], []
    for group in groups:
        if not _has_onset(group):
            notes.append(f"{group.full_label}: no run has an onset; nothing to forecast")
            continue
        mine = negatives.get(group.full_label, [])
        rows = group_online(group, min_warning, columns, mine, horizon)
        stats += [(group, s) for s in rows]
        usable = [s for s in rows if s.rule is not None and s.mae is not None]
        if usable:
            best = min(usable, key=lambda s: s.mae)
            onsets = {r.config.seed: r.events["onset_095"] for r in group.runs if r.events.get("onset_095") is not None}
            forecasts.append(Forecast(group.full_label, group_key(group.config), list(onsets), best.rule, best.mae,
                                      best.baseline_mae, min_warning, sum(onsets.values()) / len(onsets)))
        else:
            notes.append(f"{group.full_label}: no column has a rule in every fold; no forecast")
        notes.append(f"{group.full_label}: " + (f"false alarms: the all-seeds rule replayed on {len(mine)} runs of this "
                     f"configuration but weight decay or norm placement that did not grok within their budget "
                     f"({_budgets(mine)})" if mine
                     else "no run of this configuration that did not grok: false alarms on such runs not measured"))
    online_with_holm([s for _, s in stats])
    tested = sum(s.p is not None for _, s in stats)
    notes.insert(0, f"rules fitted leave-one-seed-out with a minimum warning of {min_warning:,} epochs; no rule: held-out "
                    f"runs whose other runs admit no rule (the column is then untested); fired/never: held-out runs the "
                    f"other runs' rule fired on / never fired on (a miss); late: fired less than the minimum warning before "
                    f"the onset; early: more than {horizon:,} epochs before it; MAE and mean-onset MAE over every held-out "
                    f"run, a miss scored as if its rule fired at the run's last evaluation (a lower bound on its error); "
                    f"false alarms: runs that did not grok on which the all-seeds rule fires; p: one-sided Wilcoxon "
                    f"signed-rank (forecast errors < mean-onset errors) over the held-out runs, misses included; p (Holm) "
                    f"corrected over the {tested} tests of this table; survives: p (Holm) <= 0.05")
    notes.insert(1, "the Wilcoxon p-values treat the leave-one-out folds as independent, but any two folds share all "
                    "fitting seeds but one (8 of 9 with ten seeds): they describe these seeds, they do not test the "
                    "forecast; the confirmatory test is the prospective one (`--check` on seeds the rule was not fitted on)")
    order = {label: i for i, label in enumerate(dict.fromkeys(g.full_label for g, _ in stats))}
    stats.sort(key=lambda gs: (order[gs[0].full_label], gs[1].mae is None, gs[1].mae or 0.0))
    return [_online_row(g.full_label, s) for g, s in stats], notes, forecasts


def _budgets(runs: list[Run]) -> str:
    epochs = sorted({int(r.metrics[-1]["epoch"]) for r in runs if r.metrics})
    wds = sorted({r.config.weight_decay for r in runs})
    placements = sorted({str(r.config.norm_placement) for r in runs})
    return (f"weight decay {', '.join(f'{w:g}' for w in wds)}, norm placement {', '.join(placements)}, seeds {', '.join(str(r.config.seed) for r in runs)}, "
            f"{' to '.join(f'{e:,}' for e in dict.fromkeys([epochs[0], epochs[-1]]))} epochs" if epochs else "no rows")


def _online_row(label: str, s: OnlineStats) -> dict[str, str]:
    return {"configuration": label, "column": s.column, "rule (all seeds)": "-" if s.rule is None else
            f"{s.rule.describe()}, lead {s.rule.lead:,.0f}", "runs": str(s.runs), "no rule": str(s.no_rule),
            "fired": str(s.fired), "never": str(s.never), "late": str(s.late), "early": str(s.early),
            "MAE": _num(s.mae), "mean-onset MAE": _num(s.baseline_mae),
            "beats mean": "-" if s.wins is None else f"{s.wins}/{s.runs}", "warning median": _num(s.warning_median),
            "warning range": _range(s.warning_range),
            "false alarms": "-" if s.false_alarms is None else f"{s.false_alarms}/{s.negatives}",
            "p": fmt_p(s.p), "p (Holm)": fmt_p(s.holm_p),
            "survives": "-" if s.holm_p is None else ("yes" if s.survives else "no")}


def _range(r: tuple[int, int] | None) -> str:
    return "-" if r is None else f"{r[0]:,} to {r[1]:,}"


SELECTION_COLUMNS = ["configuration", "column chosen", "selection", "runs", "fired", "never", "MAE", "mean-onset MAE",
                     "beats mean", "warning median", "warning range", "p"]


def selection_rows(groups: list[RunGroup], forecasts: list[Forecast], min_warning: int = 0,
                   columns: list[str] | None = None, horizon: int = HORIZON) -> tuple[list[dict[str, str]], list[str]]:
    """Per configuration with a forecast (online_rows), the held-out error of choosing the column: the forecast's
    column chosen on all runs (optimistic: the choice saw every held-out run), and the whole procedure nested
    (the column chosen inside each fold on its fitting runs: geolens.analysis.online_rules.nested_stats)."""
    rows, notes = [], []
    for group in groups:
        f = next((f for f in forecasts if f.configuration == group.full_label), None)
        if f is None:
            continue
        series = group_series(group, columns)[f.rule.column]
        outcomes, _ = loo_outcomes(series, f.rule.column, min_warning)
        rows.append(_selection_row(group.full_label, f.rule.column, "on all seeds (optimistic)", len(series),
                                   scored(outcomes, min_warning, horizon)))
        nested = nested_online(group, min_warning, columns, horizon)
        if nested is not None:
            chosen = Counter(c or "none" for c in nested.chosen)
            untested = chosen.pop("none", 0)
            rows.append(_selection_row(group.full_label, ", ".join(f"{c} x{k}" for c, k in chosen.most_common()) or "-",
                                       "nested: inside each fold", nested.runs - untested, nested.score))
            if untested:
                notes.append(f"{group.full_label}: nested, {untested} of {nested.runs} folds chose no column (none had a "
                             "rule in every fold of their fitting seeds; a rule needs two seeds): the procedure is "
                             "untested there")
    notes.insert(0, f"the column an observer follows is the one with the lowest held-out MAE (misses counted; minimum "
                 f"warning {min_warning:,}); 'on all seeds': that choice made once on every seed and its held-out error, "
                 "optimistic because the choice saw the held-out seeds; 'nested': for each held-out seed the choice made "
                 "by leave-one-out on the other seeds alone (columns every seed recorded), that column's rule fitted on "
                 "them and scored on the held-out seed: the error of the whole procedure; column chosen: how many folds "
                 "chose each column; p: one-sided Wilcoxon over the folds (not independent: they share all fitting seeds "
                 "but one), uncorrected")
    return rows, notes


def _selection_row(label: str, column: str, selection: str, runs: int, s: Scored) -> dict[str, str]:
    return {"configuration": label, "column chosen": column, "selection": selection, "runs": str(runs),
            "fired": str(s.fired), "never": str(runs - s.fired), "MAE": _num(s.mae),
            "mean-onset MAE": _num(s.baseline_mae), "beats mean": "-" if s.wins is None else f"{s.wins}/{runs}",
            "warning median": _num(s.warning_median), "warning range": _range(s.warning_range), "p": fmt_p(s.p)}


ALARM_COLUMNS = ["configuration", "threshold", "in time", "lead median", "lead range", "early", "missed",
                 "non-grokking alarmed", "false-alarm rate"]


def alarm_rows(groups: list[RunGroup], forecasts: list[Forecast], negatives: dict[str, list[Run]] | None = None,
               min_warning: int = 0, horizon: int = HORIZON) -> tuple[list[dict[str, str]], list[str]]:
    """Lead time against false alarms: per configuration with a forecast, its rule's column at its fitted
    threshold and at swept ones (geolens.analysis.online_rules.operating_points) on the configuration's runs
    and those that did not grok (negatives: nongrokking_runs); notes with each configuration's run-level AUROC."""
    negatives = negatives or {}
    rows, notes = [], []
    for group in groups:
        f = next((f for f in forecasts if f.configuration == group.full_label), None)
        if f is None:
            continue
        series = [s for r in group.runs if (s := column_series(r, f.rule.column)) is not None]
        neg = [s for r in negatives.get(group.full_label, []) if (s := column_series(r, f.rule.column, False)) is not None]
        for pt in operating_points(f.rule, series, neg, min_warning, horizon):
            sign = ">=" if f.rule.direction == "above" else "<="
            rows.append({"configuration": group.full_label,
                         "threshold": f"{f.rule.column} {sign} {pt.threshold:.4g}" + (" (fitted)" if pt.fitted else ""),
                         "in time": f"{pt.in_time}/{pt.runs}", "lead median": _num(pt.lead_median),
                         "lead range": _range(pt.lead_range), "early": f"{pt.early}/{pt.runs}",
                         "missed": f"{pt.missed}/{pt.runs}",
                         "non-grokking alarmed": f"{pt.alarmed}/{pt.negatives}" if pt.negatives else "-",
                         "false-alarm rate": f"{pt.false_alarm_rate:.2f}"})
        auroc = run_auroc(f.rule.direction, series, neg, min_warning)
        notes.append(f"{group.full_label}: {f.rule.column}'s run-level AUROC (grokking against non-grokking runs) "
                     + ("not measured: no run of this configuration that did not grok" if auroc is None else
                        f"{auroc:.2f} over {len(series)} grokking and {len(neg)} non-grokking runs"))
    notes.insert(0, f"each configuration's forecast rule (its column and direction) at its fitted threshold and at the "
                    f"10%, 20%, ..., 90% quantiles of the grokking runs' values up to the minimum warning "
                    f"({min_warning:,} epochs) before their onsets; in time: grokking runs it first fires on between "
                    f"{min_warning:,} and {horizon:,} epochs before the onset (their lead median and range); early: more "
                    f"than {horizon:,} before (a false alarm); missed: later, or never; non-grokking alarmed: runs of the "
                    f"configuration but weight decay or norm placement that did not grok within their budget on which it fires; false-alarm "
                    f"rate: (early + non-grokking alarmed) / all runs; thresholds swept on the runs they are scored on "
                    f"(in-sample for the grokking runs); AUROC: the probability that a grokking run's most extreme value "
                    f"(up to the minimum warning before its onset) is beyond a non-grokking run's (over its record)")
    return rows, notes


CHECK_COLUMNS = ["configuration", "seed", "rule", "fired", "warning", "forecast", "onset", "error", "mean-onset error"]


def check_rows(groups: list[RunGroup], found: list[str], path: str | Path) -> tuple[list[dict[str, str]], list[str]]:
    """`geolens precursors --check FILE`: the forecast file's rule for each configuration (load_groups) replayed
    on every run of it (runs the file has no rule for are counted in a note), one row per run, and per
    configuration a summary note: the forecasts' MAE against the fitting runs' mean onset's (a run the rule
    never fired on scored as a miss: geolens.analysis.online_rules), on how many runs the forecast is closer,
    the one-sided Wilcoxon p-value that its errors are smaller, the warnings seen, the forecasts that came
    after the onset, misses, and alarms on runs without an onset."""
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
                         "fired": _num(c.fired), "warning": _num(c.warning), "forecast": _num(c.expected),
                         "onset": _num(c.onset), "error": _num(c.error), "mean-onset error": _num(c.baseline_error)})
        scored = [c for c in checked if c.error is not None and c.baseline_error is not None]
        if scored:
            errors, base = [c.error for c in scored], [c.baseline_error for c in scored]
            warnings = [c.warning for c in scored if c.warning is not None]
            after = [c.seed for c in scored if c.expected is not None and c.expected > c.onset]
            notes.append(f"{group.full_label}: forecast MAE {sum(errors) / len(errors):,.0f} against the fitting runs' "
                         f"mean onset ({f.mean_onset:,.0f}) {sum(base) / len(base):,.0f} on {len(scored)} runs, closer on "
                         f"{sum(e < b for e, b in zip(errors, base))}; one-sided Wilcoxon p "
                         f"{fmt_p(wilcoxon_less(errors, base))}; never fired on {sum(c.fired is None for c in scored)} "
                         f"(scored as misses)" + (f"; warnings {min(warnings):,} to {max(warnings):,} epochs, median "
                                                  f"{statistics.median(warnings):,.0f}" if warnings else "") +
                         f"; forecast after the onset on {len(after)}" + (f" (seeds {', '.join(map(str, after))})"
                                                                          if after else ""))
        silent = [c for c in checked if c.onset is None]
        if silent:
            notes.append(f"{group.full_label}: {len(silent)} runs without an onset; the rule fired on "
                         f"{sum(c.fired is not None for c in silent)} of them (false alarms)")
        if fitted:
            notes.append(f"{group.full_label}: seeds {sorted(fitted)} are among those the rule was fitted on: "
                         "not a held-out test for them")
    return rows, notes


def _num(x) -> str:
    return "-" if x is None else f"{x:,.0f}"
