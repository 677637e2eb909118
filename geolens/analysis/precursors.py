"""Precursors of the grokking onset: which recorded quantity announces it, how early and how reliably.

The precursors and their event rules are geolens.runs.precursor_events' (one rule per precursor, the
same for every run). lead_stats summarises a configuration's runs: how many have an event, the
fraction whose event precedes the onset, the median lead (onset minus event) with its interquartile
range and its order-statistic interval (with its coverage: 95% or more from 6 runs, the range below), the
Spearman correlation of event epoch and onset across seeds with its permutation p-value (exact up to 12 runs), and the leave-one-out absolute errors of predicting each run's onset from its
event epoch (a line fitted to the other runs) against predicting the other runs' mean onset (their
means, and on how many held-out runs the line is closer). with_holm adds the Holm-corrected p-value
over every row compared. The statistics are geolens.analysis.significance's; docs/metrics.md defines
each precursor, docs/precursors.md measures them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from geolens.analysis.significance import ALPHA, holm, median_interval, spearman_test
from geolens.runs.precursor_events import PRECURSORS, Precursor, event_epoch
from geolens.runs.run import Run
from geolens.runs.runset import RunGroup

__all__ = ["PRECURSORS", "Precursor", "event_epoch", "LeadStats", "lead_stats", "with_holm", "run_events", "recorded",
           "group_precursors"]


@dataclass
class LeadStats:
    """One configuration's runs under one precursor (module docstring); None where too few runs."""

    precursor: str
    runs: int  # runs with an onset
    with_event: int
    precedes: float | None  # fraction of runs with an event whose event is before the onset
    lead_median: float | None
    lead_iqr: tuple[float, float] | None
    lead_interval: tuple[float, float, float] | None  # (low, high, coverage) of the median lead (>= 2 runs)
    spearman: float | None  # needs >= 3 runs with an event
    spearman_p: float | None  # two-sided permutation p-value of the Spearman correlation (significance.spearman_test)
    loo_error: float | None  # leave-one-out MAE of the linear fit (>= 3 runs)
    loo_baseline: float | None  # leave-one-out MAE of the mean onset
    loo_wins: int | None  # held-out runs the fit predicts more closely than the mean onset does
    holm_p: float | None = None  # spearman_p after the Holm correction over the rows compared (with_holm)

    @property
    def survives(self) -> bool:
        """Whether the Spearman correlation survives the Holm correction at ALPHA."""
        return self.holm_p is not None and self.holm_p <= ALPHA


def lead_stats(name: str, pairs: list[tuple[int, int | None]]) -> LeadStats:
    """LeadStats of (onset, event) pairs, one per run with an onset."""
    both = [(o, e) for o, e in pairs if e is not None]
    leads = sorted(o - e for o, e in both)
    stats = LeadStats(name, len(pairs), len(both), None, None, None, None, None, None, None, None, None)
    if both:
        stats.precedes = sum(e < o for o, e in both) / len(both)
        stats.lead_median = statistics.median(leads)
        q = torch.quantile(torch.tensor(leads, dtype=torch.float64), torch.tensor([0.25, 0.75], dtype=torch.float64))
        stats.lead_iqr = (float(q[0]), float(q[1]))
        stats.lead_interval = median_interval(leads)
    if len(both) >= 3:
        onsets, events = [float(o) for o, _ in both], [float(e) for _, e in both]
        stats.spearman, stats.spearman_p = spearman_test(events, onsets)
        fit, mean = _loo(events, onsets)
        stats.loo_baseline = statistics.fmean(mean)
        if fit is not None:
            stats.loo_error = statistics.fmean(fit)
            stats.loo_wins = sum(f < m for f, m in zip(fit, mean))
    return stats


def with_holm(rows: list[LeadStats]) -> list[LeadStats]:
    """The rows with holm_p set: the Holm correction of their Spearman p-values as one family."""
    for s, p in zip(rows, holm([s.spearman_p for s in rows])):
        s.holm_p = p
    return rows


def _loo(x: list[float], y: list[float]) -> tuple[list[float] | None, list[float]]:
    """(absolute errors of predicting each y from a least-squares line through the other points,
    absolute errors of predicting it by the others' mean); the first is None when some left-out fit
    has constant x."""
    fit_err, mean_err = [], []
    for i in range(len(x)):
        xs, ys = x[:i] + x[i + 1 :], y[:i] + y[i + 1 :]
        mx, my = statistics.fmean(xs), statistics.fmean(ys)
        mean_err.append(abs(y[i] - my))
        sxx = sum((a - mx) ** 2 for a in xs)
        if fit_err is not None and sxx > 0:
            slope = sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sxx
            fit_err.append(abs(y[i] - (my + slope * (x[i] - mx))))
        else:
            fit_err = None
    return fit_err, mean_err


#: the LLC (`geolens analyze --metrics llc`, a checkpoint-derived precursor) joins a run's rows when at least this
#: many of its checkpoints have a usable estimate (llc_series)
MIN_CHECKPOINTS = 5


def llc_series(run: Run) -> dict[int, float]:
    """{epoch: LLC} at the run's checkpoints from the analysis cache (valid for the checkpoint and the metric's
    version): estimates today's judge passed (llc.usable: not those recorded before it read the whole trace, nor
    unjudged ones), outside the training record's loss spikes (llc.loss_spikes: no minimum to measure), at the one SGLD setting most of them
    share, since estimates at different settings are not comparable."""
    from geolens.analysis.llc import loss_spikes, usable
    from geolens.analysis.trajectory import cached_metrics

    spikes = loss_spikes(run.metrics)
    by_setting: dict[tuple, dict[int, float]] = {}
    for step in run.steps:
        if step in spikes:
            continue
        values = cached_metrics(run, step, ["llc"]).get("llc")
        if values is None or not usable(values):
            continue
        setting = tuple(sorted((k, v) for k, v in values.items() if k.startswith("llc_setting_")))
        by_setting.setdefault(setting, {})[step] = values["llc"]
    return max(by_setting.values(), key=len, default={})


def series_rows(run: Run) -> list[dict[str, float]]:
    """The run's metrics rows, with the LLC (llc_series) at the epochs of its checkpoints when MIN_CHECKPOINTS or
    more have it."""
    found = llc_series(run)
    if len(found) < MIN_CHECKPOINTS:
        return run.metrics
    return [{**r, **({"llc": found[int(r["epoch"])]} if int(r["epoch"]) in found else {})} for r in run.metrics]


def run_events(run: Run, rows: list[dict[str, float]] | None = None) -> dict[str, int | None]:
    """Every precursor's event epoch in one run's rows (series_rows by default; None without an event or a
    record)."""
    rows = series_rows(run) if rows is None else rows
    epochs = [int(r["epoch"]) for r in rows]
    return {p.name: event_epoch(epochs, [p.value(r) for r in rows], p.rule) for p in PRECURSORS}


def recorded(precursor: Precursor, rows: list[dict[str, float]]) -> bool:
    """Whether a run's rows hold this precursor (the precursor columns exist in runs of this version on)."""
    return any(precursor.value(r) is not None for r in rows)


def group_precursors(group: RunGroup) -> list[LeadStats]:
    """LeadStats of every precursor a run of the configuration recorded, over its runs that have an
    onset (onset_095) and the precursor's record."""
    rows = {id(r): series_rows(r) for r in group.runs}
    with_onset = [(r, r.events.get("onset_095")) for r in group.runs]
    events = [(r, onset, run_events(r, rows[id(r)])) for r, onset in with_onset if onset is not None]
    return [lead_stats(p.name, [(onset, ev[p.name]) for r, onset, ev in events if recorded(p, rows[id(r)])])
            for p in PRECURSORS if any(recorded(p, rows[id(r)]) for r in group.runs)]
