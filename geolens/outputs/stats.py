"""Summary statistics of a handful of seeds: mean, sample std, range, Student-t 95% interval of the mean."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

CI_LEVEL = 0.95

NAN = float("nan")


@dataclass(frozen=True)
class Summary:
    """n values: mean, sample std (n - 1), min, max, Student-t 95% interval of the mean [t95_lo, t95_hi]
    (t_interval). NaN where the values do not define it: everything for n = 0, std and interval for n = 1."""

    n: int
    mean: float
    std: float
    min: float
    max: float
    t95_lo: float
    t95_hi: float

    def fields(self, prefix: str) -> dict[str, float]:
        """{prefix_n, prefix_mean, ...} for a CSV row."""
        return {f"{prefix}_{k}": getattr(self, k) for k in ("n", "mean", "std", "min", "max", "t95_lo", "t95_hi")}


def summarize(values: Sequence[float]) -> Summary:
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0:
        return Summary(0, NAN, NAN, NAN, NAN, NAN, NAN)
    std = float(x.std(ddof=1)) if n > 1 else NAN
    return Summary(n, float(x.mean()), std, float(x.min()), float(x.max()), *t_interval(x))


def onset_cell(runs: Sequence[tuple[int | None, int]]) -> str:
    """A table cell of seeds' onsets, runs = [(onset or None, last epoch)]: 'mean ± std (range min-max; n=k)' over
    the seeds with an onset, and how many had none within their budget (their largest last epoch). The range is
    labelled as one: at 3-5 seeds it is no 95% interval (t_interval says what its coverage is)."""
    onsets = [o for o, _ in runs if o is not None]
    failed = len(runs) - len(onsets)
    fail = f"; {failed} without onset (budget {max(e for o, e in runs if o is None):,})" if failed else ""
    if not onsets:
        return f"none of {len(runs)}{fail}"
    s = summarize(onsets)
    if s.n == 1:
        return f"{s.mean:,.0f} (n=1{fail})"
    return f"{s.mean:,.0f} ± {s.std:,.0f} (range {s.min:,.0f}-{s.max:,.0f}; n={s.n}{fail})"


def t_interval(values: Sequence[float], level: float = CI_LEVEL) -> tuple[float, float]:
    """Student-t interval of the mean (scipy.stats.t.interval): mean -+ t_{(1 + level) / 2, n - 1} * std / sqrt(n).
    Its coverage is `level` at every n >= 2 when the values are draws from one normal distribution (the
    assumption it rests on); at 3 values t = 4.30, so the interval is wide, as it must be for 95%. (A percentile
    bootstrap of 3 values is their range, which covers the mean of a symmetric distribution 75% of the time.)
    Equal values give that value twice; fewer than 2 values (NaN, NaN)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return NAN, NAN
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    lo, hi = stats.t.interval(level, df=x.size - 1, loc=x.mean(), scale=stats.sem(x))
    return float(lo), float(hi)


def verdict(ours: Summary, paper_mean: float | None, paper_min: float | None = None, paper_max: float | None = None) -> str:
    """'agrees' when the paper's mean lies inside our Student-t 95% interval of the mean or our mean inside the
    paper's [min, max] (both compare means); 'differs' otherwise; 'n/a' when either side has no mean."""
    if ours.n == 0 or paper_mean is None:
        return "n/a"
    in_ci = not math.isnan(ours.t95_lo) and ours.t95_lo <= paper_mean <= ours.t95_hi
    in_range = paper_min is not None and paper_max is not None and paper_min <= ours.mean <= paper_max
    return "agrees" if in_ci or in_range else "differs"
