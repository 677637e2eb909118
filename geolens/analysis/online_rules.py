"""Online onset forecasts fitted and tested held-out: a threshold on one recorded column, chosen by
leave-one-seed-out on a configuration's runs, scored with its misses and its false alarms.

fit_rule chooses, on a set of runs with onsets, the direction and threshold whose firing epochs (the
first evaluation at or past the threshold: geolens.runs.forecast.ThresholdRule) come after each run's
first evaluation (a rule already true at the start says nothing about the onset), lead every run's
onset by at least `min_warning` epochs and by the most nearly constant amount: it minimises the mean absolute
deviation of the leads, which is the mean absolute error of forecasting each of those runs' onsets as
its firing epoch plus their mean lead. Candidate thresholds: the 0.5%, 1%, ..., 99.5% quantiles of
the runs' values before their onsets.

online_stats tests a column held-out: for each run, the rule fitted on the other runs fires on it (or
never does: a miss) and forecasts its onset; the forecast's absolute error is compared with that of the
other runs' mean onset (the baseline) on every held-out run: the mean of each, on how many runs the rule
is closer, and the one-sided Wilcoxon signed-rank p-value that its errors are smaller
(geolens.analysis.significance). A miss is not dropped: its forecast is taken as if the rule had fired at
the run's last evaluation (last epoch + lead), the earliest forecast an observer who never saw it fire
could still make, so its error is a lower bound on the miss's cost. A fold whose other runs admit no rule
leaves the column untested (no error, no p-value). The warning time of a held-out run is its onset
minus the firing epoch. The folds share all but one fitting run each, so the Wilcoxon p-values treat
dependent folds as independent: they describe, the prospective test on new seeds (check_forecast) confirms.

The column an observer would follow is chosen by the lowest held-out error (choose_column). Chosen on
all runs, its own held-out error is optimistic (the choice saw every held-out run); nested_stats scores
the whole procedure instead: for each held-out run, the column is chosen by leave-one-out on the other
runs alone, its rule fitted on them and scored on the held-out run.

False alarms: a run that did not grok within its budget on which the rule fires (at any evaluation of its
record), and a grokking run on which it fires more than `horizon` epochs before the onset (early).
operating_points sweeps a column's threshold and reports, per threshold, the alarms in time, early and
missed on the grokking runs and those on the runs that did not grok: lead time against false-alarm rate;
run_auroc is the run-level AUROC of the column's most extreme value separating the two kinds of run.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import numpy as np
from scipy import stats

from geolens.analysis.significance import ALPHA, holm, wilcoxon_less
from geolens.runs.forecast import DIRECTIONS, ThresholdRule, column_value
from geolens.runs.run import Run
from geolens.runs.runset import RunGroup

QUANTILES = np.linspace(0.005, 0.995, 199)
SWEEP_QUANTILES = np.linspace(0.1, 0.9, 9)  # operating_points: the thresholds swept besides the fitted one
HORIZON = 2000  # epochs: an alarm more than this before the onset is early (a false alarm)
NOT_COLUMNS = ("epoch", "elapsed_s")  # bookkeeping, not a recorded quantity


@dataclass
class Series:
    """One run's column: evaluated epochs [n] and values [n] (rows without a value dropped), its onset
    (None: the run did not grok within its budget)."""

    epochs: np.ndarray
    values: np.ndarray
    onset: int | None


def column_series(run: Run, column: str, onset_needed: bool = True) -> Series | None:
    """The run's series of `column` with its onset_095; None without a value, or without an onset when
    onset_needed."""
    onset = run.events.get("onset_095")
    pairs = [(int(r["epoch"]), v) for r in run.metrics if (v := column_value(r, column)) is not None]
    if (onset is None and onset_needed) or not pairs:
        return None
    epochs, values = zip(*pairs)
    return Series(np.asarray(epochs), np.asarray(values, dtype=np.float64), None if onset is None else int(onset))


def firing_epochs(s: Series, direction: str, thresholds: np.ndarray) -> np.ndarray:
    """[len(thresholds)] the first epoch at which s reaches each threshold in `direction` (-1: never)."""
    signed = s.values if direction == "above" else -s.values
    t = thresholds if direction == "above" else -thresholds
    running = np.maximum.accumulate(signed)  # non-decreasing: the first index where it reaches t
    idx = np.searchsorted(running, t, side="left")
    return np.where(idx < len(running), s.epochs[np.minimum(idx, len(running) - 1)], -1)


def first_firing(s: Series, rule: ThresholdRule) -> int | None:
    """The epoch at which the rule first fires on s; None if never."""
    fired = int(firing_epochs(s, rule.direction, np.array([rule.threshold]))[0])
    return None if fired < 0 else fired


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
class HeldOut:
    """One held-out run under the rule fitted on the other runs: its onset, when the rule fired (None: a
    miss), the forecast's absolute error (a miss scored as if fired at its last evaluation) and that of the
    other runs' mean onset."""

    onset: int
    fired: int | None
    error: float
    baseline: float

    @property
    def warning(self) -> int | None:
        return None if self.fired is None else self.onset - self.fired


def held_out(held: Series, rule: ThresholdRule, others: list[Series]) -> HeldOut:
    """The held-out run scored under the rule fitted on `others` (module docstring)."""
    fired = first_firing(held, rule)
    forecast = (int(held.epochs[-1]) if fired is None else fired) + rule.lead
    return HeldOut(held.onset, fired, abs(held.onset - forecast),
                   abs(held.onset - statistics.fmean(s.onset for s in others)))


@dataclass
class Scored:
    """What a table shows of held-out runs (HeldOut), misses counted: runs fired on (the rest missed), of
    those late (less than min_warning before the onset, or after it) and early (more than horizon before);
    the MAE of every run's forecast and of the mean onset's, on how many runs the forecast is closer, the
    fired runs' warnings, and the one-sided Wilcoxon p-value that the forecast's errors are smaller."""

    fired: int
    late: int
    early: int
    mae: float | None
    baseline_mae: float | None
    wins: int | None
    warning_median: float | None
    warning_range: tuple[int, int] | None
    p: float | None


def scored(outcomes: list[HeldOut], min_warning: int, horizon: int, tested: bool = True) -> Scored:
    """Scored of these held-out runs; without error, wins and p when not `tested` (a fold had no rule)."""
    warnings = [o.warning for o in outcomes if o.fired is not None]
    errors, base = [o.error for o in outcomes], [o.baseline for o in outcomes]
    tested = tested and bool(outcomes)
    return Scored(len(warnings), sum(w < min_warning for w in warnings), sum(w > horizon for w in warnings),
                  statistics.fmean(errors) if tested else None, statistics.fmean(base) if tested else None,
                  sum(e < b for e, b in zip(errors, base)) if tested else None,
                  statistics.median(warnings) if warnings else None,
                  (min(warnings), max(warnings)) if warnings else None,
                  wilcoxon_less(errors, base) if tested and len(errors) >= 2 else None)


@dataclass
class OnlineStats:
    """One column of one configuration tested held-out (module docstring); None where undefined."""

    column: str
    rule: ThresholdRule | None  # fitted on every run, with error = the held-out MAE
    runs: int  # runs with an onset and the column
    no_rule: int  # held-out runs whose other runs admit no rule: the column is untested (no MAE, no p)
    score: Scored
    negatives: int = 0  # runs of the configuration that did not grok within their budget
    false_alarms: int | None = None  # ... on which `rule` fires
    holm_p: float | None = None

    def __getattr__(self, name):  # the Scored fields: stats.mae, stats.p, ...
        if name in Scored.__dataclass_fields__:
            return getattr(self.score, name)
        raise AttributeError(name)

    @property
    def never(self) -> int:
        """Held-out runs a fitted rule never fired on (misses)."""
        return self.runs - self.no_rule - self.score.fired

    @property
    def survives(self) -> bool:
        return self.holm_p is not None and self.holm_p <= ALPHA


def fires_on(rule: ThresholdRule | None, negatives: list[Series]) -> int | None:
    """How many of the runs the rule fires on (at any evaluation); None without a rule or runs."""
    if rule is None or not negatives:
        return None
    return sum(first_firing(s, rule) is not None for s in negatives)


def loo_outcomes(series: list[Series], column: str, min_warning: int = 0, fit=None) -> tuple[list[HeldOut], int]:
    """Each run held out under the rule fitted on the others (fit(indices) -> rule; default fit_rule), and
    how many folds had no rule."""
    fit = fit or (lambda idx: fit_rule([series[j] for j in idx], column, min_warning))
    outcomes, no_rule = [], 0
    for i, held in enumerate(series):
        others = [j for j in range(len(series)) if j != i]
        rule = fit(tuple(others))
        if rule is None:
            no_rule += 1
        else:
            outcomes.append(held_out(held, rule, [series[j] for j in others]))
    return outcomes, no_rule


def online_stats(column: str, series: list[Series], min_warning: int = 0, negatives: list[Series] = (),
                 horizon: int = HORIZON) -> OnlineStats:
    """The column's rule tested leave-one-seed-out on these runs, and the rule fitted on all of them
    replayed on the runs that did not grok (module docstring)."""
    outcomes, no_rule = loo_outcomes(series, column, min_warning)
    score = scored(outcomes, min_warning, horizon, tested=no_rule == 0)
    full = fit_rule(series, column, min_warning)
    if full is not None:
        full = ThresholdRule(full.column, full.direction, full.threshold, full.lead, score.mae)
    return OnlineStats(column, full, len(series), no_rule, score, len(negatives), fires_on(full, list(negatives)))


def choose_column(series: dict[str, list[Series]], runs: list[int], min_warning: int, fit) -> str | None:
    """Among the columns (each a Series per run, in the same run order), the one whose rule, fitted
    leave-one-out on `runs` (indices; fit(column, indices) -> rule), has the lowest held-out MAE, misses
    counted; only columns with a rule in every fold; ties by column order. None if no column qualifies."""
    best = None
    for column, all_series in series.items():
        sub = [all_series[i] for i in runs]
        outcomes, no_rule = loo_outcomes(sub, column, min_warning, lambda idx: fit(column, tuple(runs[j] for j in idx)))
        if no_rule == 0 and outcomes:
            mae = statistics.fmean(o.error for o in outcomes)
            if best is None or mae < best[0]:
                best = (mae, column)
    return None if best is None else best[1]


@dataclass
class NestedStats:
    """The whole procedure "choose the column by held-out error, fit its rule" tested leave-one-seed-out:
    per held-out run the column chosen on the other runs alone (None: none qualified, the run untested)."""

    runs: int
    chosen: list[str | None]
    score: Scored


def column_fitter(series: dict[str, list[Series]], min_warning: int):
    """fit(column, indices) -> fit_rule on those runs of the column, each subset fitted once."""
    cache: dict[tuple[str, tuple[int, ...]], ThresholdRule | None] = {}

    def fit(column: str, idx: tuple[int, ...]) -> ThresholdRule | None:
        key = (column, tuple(sorted(idx)))
        if key not in cache:
            cache[key] = fit_rule([series[column][i] for i in key[1]], column, min_warning)
        return cache[key]
    return fit


def nested_stats(series: dict[str, list[Series]], min_warning: int = 0, horizon: int = HORIZON) -> NestedStats | None:
    """NestedStats over runs that every column of `series` covers (each column a Series per run, the same run
    order); None with fewer than 3 runs."""
    n = len(next(iter(series.values()), []))
    if n < 3:
        return None
    fit = column_fitter(series, min_warning)
    chosen, outcomes = [], []
    for i in range(n):
        others = [j for j in range(n) if j != i]
        column = choose_column(series, others, min_warning, fit)
        rule = None if column is None else fit(column, tuple(others))
        chosen.append(column if rule is not None else None)
        if rule is not None:
            outcomes.append(held_out(series[column][i], rule, [series[column][j] for j in others]))
    return NestedStats(n, chosen, scored(outcomes, min_warning, horizon, tested=len(outcomes) == n))


def recorded_columns(runs: list[Run]) -> list[str]:
    """The numeric metrics columns the runs recorded (in their order), loss_gap included."""
    columns = dict.fromkeys(c for r in runs for c in (r.metrics[0] if r.metrics else {}) if c not in NOT_COLUMNS)
    columns.setdefault("loss_gap")
    return list(columns)


def group_series(group: RunGroup, columns: list[str] | None = None) -> dict[str, list[Series]]:
    """Per column (every recorded one, or the given ones) the series of the group's runs with an onset and
    the column; columns with fewer than 3 such runs, or constant on every run, are left out."""
    out = {}
    for column in columns or recorded_columns(group.runs):
        series = [s for r in group.runs if (s := column_series(r, column)) is not None]
        if len(series) >= 3 and any(np.ptp(s.values) > 0 for s in series):
            out[column] = series
    return out


def group_online(group: RunGroup, min_warning: int = 0, columns: list[str] | None = None,
                 negatives: list[Run] = (), horizon: int = HORIZON) -> list[OnlineStats]:
    """OnlineStats of every column of group_series; `negatives`: runs of the configuration that did not grok
    within their budget, on which each column's rule (fitted on all the group's runs) is replayed."""
    return [online_stats(column, series, min_warning,
                         [s for r in negatives if (s := column_series(r, column, onset_needed=False)) is not None],
                         horizon)
            for column, series in group_series(group, columns).items()]


def nested_online(group: RunGroup, min_warning: int = 0, columns: list[str] | None = None,
                  horizon: int = HORIZON) -> NestedStats | None:
    """nested_stats over the group's runs with an onset, on the columns of group_series that every one of
    them recorded."""
    by_column = group_series(group, columns)
    n = sum(r.events.get("onset_095") is not None for r in group.runs)
    return nested_stats({c: s for c, s in by_column.items() if len(s) == n}, min_warning, horizon)


def with_holm(rows: list[OnlineStats]) -> list[OnlineStats]:
    """The rows with holm_p set: the Holm correction of their Wilcoxon p-values as one family."""
    for s, p in zip(rows, holm([s.p for s in rows])):
        s.holm_p = p
    return rows


@dataclass
class OperatingPoint:
    """A column's threshold (in its rule's direction) on a configuration's runs: grokking runs it alarms in
    time (at least min_warning and at most horizon epochs before the onset; their leads), early (more than
    horizon before), missed (later, or never); runs that did not grok it alarms (at any evaluation)."""

    threshold: float
    fitted: bool  # the rule's own threshold
    runs: int
    in_time: int
    early: int
    missed: int
    lead_median: float | None
    lead_range: tuple[int, int] | None
    negatives: int
    alarmed: int

    @property
    def false_alarm_rate(self) -> float:
        """False alarms (early ones, and any on a run that did not grok) per run."""
        return (self.early + self.alarmed) / (self.runs + self.negatives)


def operating_points(rule: ThresholdRule, series: list[Series], negatives: list[Series] = (), min_warning: int = 0,
                     horizon: int = HORIZON) -> list[OperatingPoint]:
    """The rule's threshold and the SWEEP_QUANTILES of the grokking runs' values up to min_warning before
    their onsets, each an OperatingPoint, from the earliest-firing threshold to the latest."""
    pooled = np.concatenate([s.values[s.epochs <= s.onset - min_warning] for s in series] + [np.zeros(0)])
    swept = set(np.quantile(pooled, SWEEP_QUANTILES).tolist()) if pooled.size else set()
    points = []
    for t in sorted(swept | {rule.threshold}, reverse=rule.direction == "below"):
        probe = ThresholdRule(rule.column, rule.direction, t, rule.lead)
        warnings = [s.onset - f if (f := first_firing(s, probe)) is not None else None for s in series]
        in_time = [w for w in warnings if w is not None and min_warning <= w <= horizon]
        early = sum(w is not None and w > horizon for w in warnings)
        points.append(OperatingPoint(t, t == rule.threshold, len(series), len(in_time), early,
                                     len(series) - len(in_time) - early,
                                     statistics.median(in_time) if in_time else None,
                                     (min(in_time), max(in_time)) if in_time else None,
                                     len(negatives), fires_on(probe, list(negatives)) or 0))
    return points


def run_auroc(direction: str, series: list[Series], negatives: list[Series], min_warning: int = 0) -> float | None:
    """The run-level AUROC of the column's most extreme value in `direction` (the highest for 'above'),
    grokking runs' up to min_warning before the onset against the whole record of runs that did not grok:
    the probability that a grokking run's exceeds a non-grokking one's (ties half; scipy's Mann-Whitney U
    over the product of the sizes). None without both kinds of run."""
    sign = 1.0 if direction == "above" else -1.0
    pos = [float(np.max(sign * s.values[s.epochs <= s.onset - min_warning])) for s in series
           if (s.epochs <= s.onset - min_warning).any()]
    neg = [float(np.max(sign * s.values)) for s in negatives]
    if not pos or not neg:
        return None
    return float(stats.mannwhitneyu(pos, neg).statistic) / (len(pos) * len(neg))


@dataclass
class Checked:
    """A saved forecast on one new run: when its rule fired, the onset it forecast and the one measured,
    the forecast's absolute error (a miss scored as if fired at the last evaluation: module docstring) and
    that of the fitting runs' mean onset (None where undefined)."""

    seed: int
    onset: int | None
    fired: int | None
    expected: float | None
    error: float | None
    baseline_error: float | None

    @property
    def warning(self) -> int | None:
        return None if self.onset is None or self.fired is None else self.onset - self.fired


def check_forecast(rule: ThresholdRule, mean_onset: float | None, runs: list[Run]) -> list[Checked]:
    """The rule replayed on each run's metrics (as `geolens train --forecast` follows it) against its onset."""
    out = []
    for run in runs:
        onset, fired = run.events.get("onset_095"), rule.first_firing(run.metrics)
        expected = None if fired is None else fired + rule.lead
        scored_at = expected if fired is not None else (int(run.metrics[-1]["epoch"]) + rule.lead if run.metrics else None)
        out.append(Checked(run.config.seed, onset, fired, expected,
                           None if onset is None or scored_at is None else abs(onset - scored_at),
                           None if onset is None or mean_onset is None else abs(onset - mean_onset)))
    return out
