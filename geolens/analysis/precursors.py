"""Precursors of the grokking onset: which recorded quantity announces it, how early and how reliably.

The precursors and their event rules are geolens.runs.precursor_events' (one rule per precursor, the
same for every run). lead_stats summarises a configuration's runs: how many have an event, the
fraction whose event precedes the onset, the median and interquartile range of the lead (onset minus
event), the Spearman correlation of event epoch and onset across seeds, and the leave-one-out mean
absolute error of predicting each run's onset from its event epoch (a line fitted to the other runs)
against predicting the other runs' mean onset. docs/metrics.md defines each precursor,
docs/precursors.md measures them.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch

from geolens.runs.precursor_events import PRECURSORS, Precursor, event_epoch
from geolens.runs.run import Run
from geolens.runs.runset import RunGroup

__all__ = ["PRECURSORS", "Precursor", "event_epoch", "LeadStats", "lead_stats", "run_events", "recorded",
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
    spearman: float | None  # needs >= 3 runs with an event
    loo_error: float | None  # leave-one-out MAE of the linear fit (>= 3 runs)
    loo_baseline: float | None  # leave-one-out MAE of the mean onset


def lead_stats(name: str, pairs: list[tuple[int, int | None]]) -> LeadStats:
    """LeadStats of (onset, event) pairs, one per run with an onset."""
    both = [(o, e) for o, e in pairs if e is not None]
    leads = sorted(o - e for o, e in both)
    stats = LeadStats(name, len(pairs), len(both), None, None, None, None, None, None)
    if both:
        stats.precedes = sum(e < o for o, e in both) / len(both)
        stats.lead_median = statistics.median(leads)
        q = torch.quantile(torch.tensor(leads, dtype=torch.float64), torch.tensor([0.25, 0.75], dtype=torch.float64))
        stats.lead_iqr = (float(q[0]), float(q[1]))
    if len(both) >= 3:
        onsets, events = [float(o) for o, _ in both], [float(e) for _, e in both]
        stats.spearman = _spearman(events, onsets)
        stats.loo_error, stats.loo_baseline = _loo(events, onsets)
    return stats


def _ranks(x: list[float]) -> list[float]:
    """Ranks 1..n, ties given their mean rank."""
    order = sorted(range(len(x)), key=lambda i: x[i])
    ranks = [0.0] * len(x)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and x[order[j + 1]] == x[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def _spearman(x: list[float], y: list[float]) -> float | None:
    """Spearman's rank correlation (Pearson's on the ranks); None when either side is constant."""
    rx, ry = _ranks(x), _ranks(y)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5


def _loo(x: list[float], y: list[float]) -> tuple[float | None, float]:
    """(MAE of predicting each y from a least-squares line through the other points, MAE of predicting
    it by the others' mean); the first is None when some left-out fit has constant x."""
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
    return (None if fit_err is None else statistics.fmean(fit_err)), statistics.fmean(mean_err)


def run_events(run: Run) -> dict[str, int | None]:
    """Every precursor's event epoch in one run's metrics.csv (None without an event or a record)."""
    rows = run.metrics
    epochs = [int(r["epoch"]) for r in rows]
    return {p.name: event_epoch(epochs, [p.value(r) for r in rows], p.rule) for p in PRECURSORS}


def recorded(precursor: Precursor, run: Run) -> bool:
    """Whether the run's rows hold this precursor (the precursor columns exist in runs of this version on)."""
    return any(precursor.value(r) is not None for r in run.metrics)


def group_precursors(group: RunGroup) -> list[LeadStats]:
    """LeadStats of every precursor a run of the configuration recorded, over its runs that have an
    onset (onset_095) and the precursor's record."""
    with_onset = [(r, r.events.get("onset_095")) for r in group.runs]
    events = [(r, onset, run_events(r)) for r, onset in with_onset if onset is not None]
    return [lead_stats(p.name, [(onset, ev[p.name]) for r, onset, ev in events if recorded(p, r)])
            for p in PRECURSORS if any(recorded(p, r) for r in group.runs)]
