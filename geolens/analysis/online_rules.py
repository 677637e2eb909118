"""Online onset forecasts fitted and tested held-out: a threshold on one recorded column, chosen by
leave-one-seed-out on a configuration's runs.

fit_rule chooses, on a set of runs with onsets, the direction and threshold whose firing epochs (the
first evaluation at or past the threshold: geolens.runs.forecast.ThresholdRule) come after each run's
first evaluation (a rule already true at the start says nothing about the onset), lead every run's
onset by at least `min_warning` epochs and by the most nearly constant amount: it minimises the mean absolute
deviation of the leads, which is the mean absolute error of forecasting each of those runs' onsets as
its firing epoch plus their mean lead. Candidate thresholds: the 0.5%, 1%, ..., 99.5% quantiles of
the runs' values before their onsets.

online_stats tests a column held-out: for each run, the rule fitted on the other runs fires on it (or
never does) and forecasts its onset; the forecast's absolute error is compared with that of the other
runs' mean onset (the baseline) on the same held-out runs: the mean of each, on how many runs the rule
is closer, and the one-sided Wilcoxon signed-rank p-value that its errors are smaller
(geolens.analysis.significance). The warning time of a held-out run is its onset minus the firing epoch.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np

from geolens.analysis.significance import ALPHA, holm, wilcoxon_less
from geolens.runs.forecast import DIRECTIONS, ThresholdRule, column_value
from geolens.runs.run import Run
from geolens.runs.runset import RunGroup

QUANTILES = np.linspace(0.005, 0.995, 199)
NOT_COLUMNS = ("epoch", "elapsed_s")  # bookkeeping, not a recorded quantity


@dataclass
class Series:
    """One run's column: evaluated epochs [n] and values [n] (rows without a value dropped), its onset."""

    epochs: np.ndarray
    values: np.ndarray
    onset: int


def column_series(run: Run, column: str) -> Series | None:
    """The run's series of `column` with its onset_095; None without an onset or a value."""
    onset = run.events.get("onset_095")
    pairs = [(int(r["epoch"]), v) for r in run.metrics if (v := column_value(r, column)) is not None]
    if onset is None or not pairs:
        return None
    epochs, values = zip(*pairs)
    return Series(np.asarray(epochs), np.asarray(values, dtype=np.float64), int(onset))


def firing_epochs(s: Series, direction: str, thresholds: np.ndarray) -> np.ndarray:
    """[len(thresholds)] the first epoch at which s reaches each threshold in `direction` (-1: never)."""
    signed = s.values if direction == "above" else -s.values
    t = thresholds if direction == "above" else -thresholds
    running = np.maximum.accumulate(signed)  # non-decreasing: the first index where it reaches t
    idx = np.searchsorted(running, t, side="left")
    return np.where(idx < len(running), s.epochs[np.minimum(idx, len(running) - 1)], -1)


def fit_rule(series: list[Series], column: str, min_warning: int = 0) -> ThresholdRule | None:
    """The rule of the module docstring on these runs (error unset); None when no threshold fires on
    every run at least min_warning epochs before its onset."""
    if len(series) < 2:
        return None
    pooled = np.concatenate([s.values[s.epochs <= s.onset - min_warning] for s in series])
    if pooled.size == 0:
        return None
    thresholds = np.unique(np.quantile(pooled, QUANTILES))
    onsets = np.array([s.onset for s in series])[:, None]
    first = np.array([s.epochs[0] for s in series])[:, None]  # a rule already true there carries no news
    best = None
    for direction in DIRECTIONS:
        fired = np.stack([firing_epochs(s, direction, thresholds) for s in series])  # [runs, thresholds]
        leads = onsets - fired
        ok = ((fired > first) & (leads >= min_warning)).all(axis=0)
        if not ok.any():
            continue
        mean_lead = leads.mean(axis=0)
        spread = np.abs(leads - mean_lead).mean(axis=0)
        spread[~ok] = np.inf
        # the least spread; among equals, the earliest warning (the largest mean lead)
        i = int(np.lexsort((-mean_lead, spread))[0])
        if best is None or (spread[i], -mean_lead[i]) < best[0]:
            best = ((spread[i], -mean_lead[i]), ThresholdRule(column, direction, float(thresholds[i]), float(mean_lead[i])))
    return None if best is None else best[1]


@dataclass
class OnlineStats:
    """One column of one configuration tested held-out (module docstring); None where undefined."""

    column: str
    rule: ThresholdRule | None  # fitted on every run, with error = the held-out MAE
    runs: int  # runs with an onset and the column
    fired: int  # held-out runs on which the other runs' rule fired
    late: int  # ... of which it fired less than min_warning before the onset (or after it)
    mae: float | None  # mean absolute error of the forecasts of the fired runs
    baseline_mae: float | None  # the mean onset's, on the same runs
    wins: int | None  # fired runs the forecast is closer on than the mean onset
    warning_median: float | None
    warning_range: tuple[float, float] | None
    p: float | None  # one-sided Wilcoxon: the forecast's errors are smaller than the baseline's
    holm_p: float | None = None

    @property
    def never(self) -> int:
        return self.runs - self.fired

    @property
    def survives(self) -> bool:
        return self.holm_p is not None and self.holm_p <= ALPHA


def online_stats(column: str, series: list[Series], min_warning: int = 0) -> OnlineStats:
    """The column's rule tested leave-one-seed-out on these runs (module docstring)."""
    errors, baseline, warnings = [], [], []
    for i, held in enumerate(series):
        others = series[:i] + series[i + 1 :]
        rule = fit_rule(others, column, min_warning)
        if rule is None:
            continue
        fired = firing_epochs(held, rule.direction, np.array([rule.threshold]))[0]
        if fired < 0:
            continue
        errors.append(abs(held.onset - (fired + rule.lead)))
        baseline.append(abs(held.onset - statistics.fmean(s.onset for s in others)))
        warnings.append(held.onset - int(fired))
    full = fit_rule(series, column, min_warning)
    mae = statistics.fmean(errors) if errors else None
    if full is not None:
        full = ThresholdRule(full.column, full.direction, full.threshold, full.lead, mae)
    return OnlineStats(column, full, len(series), len(errors), sum(w < min_warning for w in warnings), mae,
                       statistics.fmean(baseline) if baseline else None,
                       sum(e < b for e, b in zip(errors, baseline)) if errors else None,
                       statistics.median(warnings) if warnings else None,
                       (min(warnings), max(warnings)) if warnings else None,
                       wilcoxon_less(errors, baseline) if len(errors) >= 2 else None)


def recorded_columns(runs: list[Run]) -> list[str]:
    """The numeric metrics columns the runs recorded (in their order), loss_gap included."""
    columns = dict.fromkeys(c for r in runs for c in (r.metrics[0] if r.metrics else {}) if c not in NOT_COLUMNS)
    columns.setdefault("loss_gap")
    return list(columns)


def group_online(group: RunGroup, min_warning: int = 0, columns: list[str] | None = None) -> list[OnlineStats]:
    """OnlineStats of every column (or the given ones) over the group's runs with an onset; columns
    with fewer than 3 such runs, or constant on every run, are left out."""
    out = []
    for column in columns or recorded_columns(group.runs):
        series = [s for r in group.runs if (s := column_series(r, column)) is not None]
        if len(series) >= 3 and any(np.ptp(s.values) > 0 for s in series):
            out.append(online_stats(column, series, min_warning))
    return out


def with_holm(rows: list[OnlineStats]) -> list[OnlineStats]:
    """The rows with holm_p set: the Holm correction of their Wilcoxon p-values as one family."""
    for s, p in zip(rows, holm([s.p for s in rows])):
        s.holm_p = p
    return rows


@dataclass
class Checked:
    """A saved forecast on one new run: when its rule fired, the onset it forecast and the one measured,
    the forecast's absolute error and that of the fitting runs' mean onset (None where undefined)."""

    seed: int
    onset: int | None
    fired: int | None
    expected: float | None
    error: float | None
    baseline_error: float | None


def check_forecast(rule: ThresholdRule, mean_onset: float | None, runs: list[Run]) -> list[Checked]:
    """The rule replayed on each run's metrics (as `geolens train --forecast` follows it) against its onset."""
    out = []
    for run in runs:
        onset, fired = run.events.get("onset_095"), rule.first_firing(run.metrics)
        expected = None if fired is None else fired + rule.lead
        out.append(Checked(run.config.seed, onset, fired, expected,
                           None if onset is None or expected is None else abs(onset - expected),
                           None if onset is None or mean_onset is None else abs(onset - mean_onset)))
    return out
