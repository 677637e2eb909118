"""Summary statistics of a handful of seeds: mean, sample std, range, percentile-bootstrap CI of the mean."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np
from scipy import stats

BOOTSTRAP_RESAMPLES = 10_000
BOOTSTRAP_SEED = 0  # fixed: the same values always give the same interval
CI_LEVEL = 0.95

NAN = float("nan")


@dataclass(frozen=True)
class Summary:
    """n values: mean, sample std (n - 1), min, max, bootstrap CI of the mean. NaN where the values
    do not define it: everything for n = 0, std and CI for n = 1."""

    n: int
    mean: float
    std: float
    min: float
    max: float
    ci_lo: float
    ci_hi: float

    def fields(self, prefix: str) -> dict[str, float]:
        """{prefix_n, prefix_mean, ...} for a CSV row."""
        return {f"{prefix}_{k}": getattr(self, k) for k in ("n", "mean", "std", "min", "max", "ci_lo", "ci_hi")}


def summarize(values: Sequence[float], resamples: int = BOOTSTRAP_RESAMPLES, seed: int = BOOTSTRAP_SEED) -> Summary:
    x = np.asarray(values, dtype=np.float64)
    n = x.size
    if n == 0:
        return Summary(0, NAN, NAN, NAN, NAN, NAN, NAN)
    std = float(x.std(ddof=1)) if n > 1 else NAN
    lo, hi = bootstrap_ci(x, resamples=resamples, seed=seed) if n > 1 else (NAN, NAN)
    return Summary(n, float(x.mean()), std, float(x.min()), float(x.max()), lo, hi)


def onset_cell(runs: Sequence[tuple[int | None, int]]) -> str:
    """A table cell of seeds' onsets, runs = [(onset or None, last epoch)]: 'mean ± std (range min-max; n=k)' over
    the seeds with an onset, and how many had none within their budget (their largest last epoch). The range, not
    a bootstrap interval: at 3-5 seeds a percentile bootstrap interval is about the range and has no 95% coverage."""
    onsets = [o for o, _ in runs if o is not None]
    failed = len(runs) - len(onsets)
    fail = f"; {failed} without onset (budget {max(e for o, e in runs if o is None):,})" if failed else ""
    if not onsets:
        return f"none of {len(runs)}{fail}"
    s = summarize(onsets)
    if s.n == 1:
        return f"{s.mean:,.0f} (n=1{fail})"
    return f"{s.mean:,.0f} ± {s.std:,.0f} (range {s.min:,.0f}-{s.max:,.0f}; n={s.n}{fail})"


def bootstrap_ci(values: Sequence[float], level: float = CI_LEVEL, resamples: int = BOOTSTRAP_RESAMPLES,
                 seed: int = BOOTSTRAP_SEED) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean (scipy.stats.bootstrap, method 'percentile'): `resamples`
    resamples of the n values with replacement (numpy Generator seeded with `seed`), the (1 - level) / 2
    and (1 + level) / 2 quantiles of their means. Equal values give that value twice."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return NAN, NAN
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    res = stats.bootstrap((x,), np.mean, confidence_level=level, n_resamples=resamples, method="percentile",
                          random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def verdict(ours: Summary, paper_mean: float | None, paper_min: float | None = None, paper_max: float | None = None) -> str:
    """'agrees' when the paper's mean lies inside our CI or our mean inside the paper's [min, max];
    'differs' otherwise; 'n/a' when either side has no mean."""
    if ours.n == 0 or paper_mean is None:
        return "n/a"
    in_ci = not math.isnan(ours.ci_lo) and ours.ci_lo <= paper_mean <= ours.ci_hi
    in_range = paper_min is not None and paper_max is not None and paper_min <= ours.mean <= paper_max
    return "agrees" if in_ci or in_range else "differs"
