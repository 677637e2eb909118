"""Statistics that turn a handful of seeds into a claim: a permutation test of a rank correlation, the
Holm correction for many such tests, an order-statistic interval of a median with its coverage, a sign test
of shifts, rank tests of two configurations' onsets (one-sided, or two-sided for a comparison asked both ways).

Every test is scipy.stats' (permutation_test, mannwhitneyu, binomtest, binom) where scipy has it; the steps
scipy does not ship are below: the exact null of Spearman's statistic for up to EXACT_PAIRINGS_N pairs (by
counting over subsets: scipy.stats.permutation_test enumerates the n! pairings one by one, 24 s for ten pairs),
a stratified rank test (smaller_within: the exact null by enumeration), and Holm's step-down correction, holm()
(scipy.stats.false_discovery_control controls the false discovery rate, a weaker guarantee than Holm's
family-wise error rate). Resampling, where a null is not enumerated, is seeded and large (RESAMPLES): the same
values always give the same p-value. docs/metrics.md states each definition.
"""

from __future__ import annotations

import functools
import itertools
import math
from collections import Counter
from typing import Sequence

import numpy as np
from scipy import stats

RESAMPLES = 199_999  # random pairings where the null is not enumerated (Monte-Carlo standard error of p = 0.05: 0.0005)
EXACT_PAIRINGS_N = 12  # up to this many pairs, Spearman's null is every one of the n! pairings, counted exactly
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
    permuted y whose |rho| is at least the observed one: all n! pairings for n <= EXACT_PAIRINGS_N
    (spearman_exact_p), else `resamples` random ones and the observed one (scipy.stats.permutation_test,
    'pairings', seeded). (None, None) for fewer than 3 pairs or a constant side."""
    if len(x) != len(y):
        raise ValueError(f"x and y differ in length ({len(x)} and {len(y)})")
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    if len(rx) < 3 or np.ptp(rx) == 0 or np.ptp(ry) == 0:
        return None, None
    rho = float(_rank_pearson(rx, ry[None, :])[0])
    if len(rx) <= EXACT_PAIRINGS_N:
        return rho, spearman_exact_p(rx, ry)
    result = stats.permutation_test((ry,), lambda r, axis=-1: _rank_pearson(rx, r, axis), vectorized=True,
                                    permutation_type="pairings", n_resamples=resamples, alternative="two-sided",
                                    random_state=np.random.default_rng(seed))
    return float(result.statistic), float(min(1.0, result.pvalue))


def spearman_null(n: int, resamples: int = RESAMPLES) -> str:
    """How spearman_test's p-value of n pairs is computed, for a table's note: 'exact (all n! pairings)' or
    'N random pairings'."""
    return f"exact (all {n}! pairings)" if n <= EXACT_PAIRINGS_N else f"{resamples:,} random pairings"


def spearman_exact_p(rx: Sequence[float], ry: Sequence[float]) -> float:
    """The exact two-sided permutation p-value of Spearman's rho of the ranks rx and ry (mean ranks for ties):
    the share of the n! pairings of rx with a permutation of ry whose |rho| is at least the observed one. rho
    is an increasing function of S = sum_i rx_i ry_pi(i) (the rest is the same for every pairing), so the
    pairings are counted by S: over the subsets of ry's entries used by the first k entries of rx (2^n
    states; the counts of every partial S, in integers of twice the ranks) instead of one by one."""
    a, b = (np.rint(2 * np.asarray(r, dtype=np.float64)).astype(np.int64) for r in (rx, ry))
    n = len(a)
    counts = _pairing_sums(tuple(sorted(a.tolist())), tuple(sorted(b.tolist())))
    centre = int(a.sum()) * int(b.sum())  # n * S - centre is proportional to rho: compare |n S - centre| exactly
    observed = abs(n * int(a @ b) - centre)
    sums = np.arange(len(counts), dtype=np.int64)
    extreme = np.abs(n * sums - centre) >= observed
    return float(counts[extreme].sum() / counts.sum())


@functools.lru_cache(maxsize=64)
def _pairing_sums(a: tuple[int, ...], b: tuple[int, ...]) -> np.ndarray:
    """counts[S] = the number of the n! pairings of a with a permutation of b whose sum of products is S
    (integers; dynamic programming over the subsets of b used by a's first entries)."""
    n = len(a)
    size = sum(x * y for x, y in zip(sorted(a), sorted(b))) + 1  # the largest S pairs the sorted sides
    layer = {0: np.zeros(size, dtype=np.int64)}  # {mask of b's entries paired with a[:k]: counts of their S}
    layer[0][0] = 1
    for k in range(n):
        nxt: dict[int, np.ndarray] = {}
        for mask, row in layer.items():
            for j in range(n):
                if not mask >> j & 1:
                    shift = a[k] * b[j]
                    out = nxt.setdefault(mask | 1 << j, np.zeros(size, dtype=np.int64))
                    out[shift:] += row[:size - shift]
        layer = nxt
    return layer[(1 << n) - 1]


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


def median_interval(values: Sequence[float], level: float = LEVEL) -> tuple[float, float, float] | None:
    """(low, high, coverage): the distribution-free interval of the median from order statistics, [x_(k),
    x_(n+1-k)] with the largest k whose coverage, 1 - 2 P(Binomial(n, 1/2) < k) (scipy.stats.binom), is at least
    `level` (scipy.stats.quantile_test's interval); below 6 values no k reaches 0.95 and the interval is the
    sample range, with its smaller coverage stated (1 - 2^(1 - n): 75% for 3 values, 94% for 5). None for fewer
    than 2 values."""
    x = np.sort(np.asarray(values, dtype=np.float64))
    n = x.size
    if n < 2:
        return None
    coverage = [1 - 2 * float(stats.binom.cdf(k - 1, n, 0.5)) for k in range(1, n // 2 + 1)]  # k = 1, 2, ...
    k = max((i + 1 for i, c in enumerate(coverage) if c >= level), default=1)
    return float(x[k - 1]), float(x[n - k]), coverage[k - 1]


def fmt_interval(interval: tuple[float, float, float] | None) -> str:
    """median_interval as table text: 'low to high (coverage%)', '-' for None."""
    if interval is None:
        return "-"
    lo, hi, coverage = interval
    return f"{lo:,.0f} to {hi:,.0f} ({100 * coverage:.0f}%)"


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


def paired_differ(a: Sequence[float], b: Sequence[float]) -> float | None:
    """Two-sided p-value that paired values a and b differ (a change whose direction is read from the data):
    scipy.stats.wilcoxon on a - b, two-sided, exact for small samples; None with fewer than 2 non-zero
    differences. Three pairs all one way give 0.25."""
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    if np.count_nonzero(d) < 2:
        return None
    return float(stats.wilcoxon(d, alternative="two-sided", zero_method="wilcox").pvalue)


def smaller_than(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """One-sided p-value that the values a tend to be smaller than the values b (onset epochs, LLC estimates,
    barrier heights): scipy.stats.mannwhitneyu with the exact null distribution (a few seeds; ties occur only among
    runs without a value, where the asymptotic method scipy would switch to gives p below what the seeds can
    show). None (a run without an onset, censored at its budget) ranks after every value. None with fewer than
    2 runs on either side."""
    return _mann_whitney(a, b, "less")


def onsets_differ(a: Sequence[float | None], b: Sequence[float | None]) -> float | None:
    """Two-sided p-value that the values a and b differ in location (a comparison asked in both directions):
    scipy.stats.mannwhitneyu, exact, two-sided (twice the smaller one-sided p, at most 1); None (no onset) ranks
    after every value, as in smaller_than. None with fewer than 2 runs on either side."""
    return _mann_whitney(a, b, "two-sided")


def _mann_whitney(a: Sequence[float | None], b: Sequence[float | None], alternative: str) -> float | None:
    """scipy.stats.mannwhitneyu's exact p of a against b, None (no value) ranked after every value; None with
    fewer than 2 runs on either side."""
    if len(a) < 2 or len(b) < 2:
        return None
    seen = [v for v in (*a, *b) if v is not None]
    last = (max(seen) + 1) if seen else 1
    x, y = ([last if v is None else v for v in side] for side in (a, b))
    return float(stats.mannwhitneyu(x, y, alternative=alternative, method="exact").pvalue)


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


def differ_within(strata: Sequence[tuple[Sequence[float | None], Sequence[float | None]]]) -> float | None:
    """Two-sided p-value of the stratified rank test (smaller_within) for a comparison asked in both directions:
    twice the smaller of the two one-sided p-values, at most 1. None when no stratum has runs on both sides."""
    less, greater = smaller_within(strata), smaller_within([(b, a) for a, b in strata])
    if less is None or greater is None:
        return None
    return min(1.0, 2 * min(less, greater))


def fmt_p(p: float | None) -> str:
    """A p-value as text: '-' for None, 3 significant digits, '<0.001' below that."""
    if p is None or math.isnan(p):
        return "-"
    return "<0.001" if p < 0.001 else f"{p:.3g}"
