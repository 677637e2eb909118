"""Statistics that turn a handful of seeds into a claim: a permutation test of a rank correlation, the
Holm correction for many such tests, a bootstrap interval of a median, a sign test of shifts, a rank test
of two configurations' onsets.

Every test is scipy.stats' (permutation_test, bootstrap, binomtest); the steps scipy does not
ship are below: a stratified rank test (smaller_within: the exact null by enumeration), and Holm's step-down
correction, holm() (scipy.stats.false_discovery_control controls the
false discovery rate, a weaker guarantee than Holm's family-wise error rate). Resampling is seeded:
the same values always give the same p-value and interval. docs/metrics.md states each definition.
"""

from __future__ import annotations

import itertools
import math
from collections import Counter
from typing import Sequence

import numpy as np
from scipy import stats

RESAMPLES = 9_999  # permutations / bootstrap resamples; fewer distinct ones than this are enumerated exactly
SEED = 0
ALPHA = 0.05  # the family-wise error rate the Holm-corrected p-values are compared with
LEVEL = 0.95


def _rank_pearson(rx: np.ndarray, ry: np.ndarray, axis: int = -1) -> np.ndarray:
    """Pearson correlation of rx (fixed, [n]) with ry ([..., n]) along the last axis."""
    ry = np.moveaxis(ry, axis, -1)
    cx, cy = rx - rx.mean(), ry - ry.mean(axis=-1, keepdims=True)
    return (cy @ cx) / np.sqrt((cx @ cx) * (cy * cy).sum(axis=-1))


def spearman_test(x: Sequence[float], y: Sequence[float], resamples: int = RESAMPLES,
                  seed: int = SEED) -> tuple[float | None, float | None]:
    """(Spearman's rho of x and y, its two-sided permutation p-value): rho is Pearson's correlation of
    the ranks (ties get their mean rank); the p-value is the share of the pairings of x with a
    permuted y whose |rho| is at least the observed one (scipy.stats.permutation_test, 'pairings':
    all n! pairings when there are at most `resamples`, else `resamples` random ones and the observed
    one). (None, None) for fewer than 3 pairs or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} and {len(y)})")
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    if len(rx) < 3 or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return None, None
    result = stats.permutation_test((ry,), lambda r, axis=-1: _rank_pearson(rx, r, axis), vectorized=True,
                                    permutation_type="pairings", n_resamples=resamples, alternative="two-sided",
                                    random_state=np.random.default_rng(seed))
    return float(result.statistic), float(min(1.0, result.pvalue))


def holm(pvalues: Sequence[float | None]) -> list[float | None]:
    """Holm-adjusted p-values of a family of tests (None entries are not tests and stay None): sort the
    m p-values ascending, multiply the i-th (from 0) by m - i, take the running maximum, cap at 1. A
    test survives at family-wise error rate a when its adjusted p-value is <= a."""
    tested = sorted((p, i) for i, p in enumerate(pvalues) if p is not None)
    m, out, running = len(tested), [None] * len(pvalues), 0.0
    for rank, (p, i) in enumerate(tested):
        running = max(running, min(1.0, (m - rank) * p))
        out[i] = running
    return out


def median_ci(values: Sequence[float], level: float = LEVEL, resamples: int = RESAMPLES,
              seed: int = SEED) -> tuple[float, float] | None:
    """Percentile bootstrap interval of the median (scipy.stats.bootstrap, `resamples` resamples of the
    values with replacement, seeded); None for fewer than 2 values."""
    x = np.asarray(values, dtype=np.float64)
    if x.size < 2:
        return None
    if np.ptp(x) == 0:
        return float(x[0]), float(x[0])
    res = stats.bootstrap((x,), np.median, confidence_level=level, n_resamples=resamples, method="percentile",
                          random_state=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def sign_test(shifts: Sequence[float]) -> tuple[int, int, float | None]:
    """(negative shifts, positive shifts, two-sided sign-test p-value): the binomial test of the number
    of negative shifts among the non-zero ones against 1/2 (scipy.stats.binomtest); None when every
    shift is zero or there is none. Three seeds can give no p-value below 0.25."""
    neg = sum(1 for s in shifts if s < 0)
    pos = sum(1 for s in shifts if s > 0)
    if neg + pos == 0:
        return neg, pos, None
    return neg, pos, float(stats.binomtest(neg, neg + pos, 0.5).pvalue)


def wilcoxon_less(a: Sequence[float], b: Sequence[float]) -> float | None:
    """One-sided p-value that the paired values a tend to be smaller than b (scipy.stats.wilcoxon on
    a - b, exact for small samples); None with fewer than 2 non-zero differences."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if np.count_nonzero(d) < 2:
        return None
    return float(stats.wilcoxon(d, alternative="less", zero_method="wilcox").pvalue)


def smaller_than(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """One-sided p-value that the values a tend to be smaller than the values b (onset epochs, LLC estimates,
    barrier heights): scipy.stats.mannwhitneyu with the exact null distribution (a few seeds; ties occur only among
    runs without a value, where the asymptotic method scipy would switch to gives p below what the seeds can
    show). None (a run without an onset, censored at its budget) ranks after every value. None with fewer than
    2 runs on either side."""
    if len(a) < 2 or len(b) < 2:
        return None
    seen = [v for v in (*a, *b) if v is not None]
    last = (max(seen) + 1) if seen else 1
    x, y = ([last if v is None else v for v in side] for side in (a, b))
    return float(stats.mannwhitneyu(x, y, alternative="less", method="exact").pvalue)


def smaller_within(strata: Sequence[tuple[Sequence[float | None], Sequence[float | None]]]) -> float | None:
    """One-sided p-value that the values a tend to be smaller than the values b within strata (e.g. one stratum per
    configuration, a and b its runs' onsets on two devices; one per seed, fork arms' barriers): the stratified
    Mann-Whitney statistic, the sum over strata of U = the (a, b) pairs with a's value smaller (ties half), against
    its exact null distribution: every split of each stratum's runs into groups of a's and b's sizes, equally
    likely, independently across strata (enumerated; scipy.stats has no stratified rank test). None (a run without
    an onset) ranks after every value of its stratum. Strata without runs on both sides are left out; None when
    none is left."""
    def twice_u(a: list[float], b: list[float]) -> int:
        return sum(2 * (x < y) + (x == y) for x in a for y in b)

    observed, null, used = 0, Counter({0: 1}), False  # 2U summed over strata; its null as {2U: number of splits}
    for a, b in strata:
        if not a or not b:
            continue
        used = True
        pooled = [math.inf if v is None else float(v) for v in (*a, *b)]
        observed += twice_u(pooled[:len(a)], pooled[len(a):])
        splits = Counter(twice_u([pooled[i] for i in chosen], [pooled[i] for i in range(len(pooled)) if i not in chosen])
                         for chosen in itertools.combinations(range(len(pooled)), len(a)))
        convolved = Counter()
        for u, n in null.items():
            for v, m in splits.items():
                convolved[u + v] += n * m
        null = convolved
    if not used:
        return None
    return sum(n for u, n in null.items() if u >= observed) / sum(null.values())


def fmt_p(p: float | None) -> str:
    """A p-value as text: '-' for None, 3 significant digits, '<0.001' below that."""
    if p is None or math.isnan(p):
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3g}"
