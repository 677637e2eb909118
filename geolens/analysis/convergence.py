"""Convergence diagnostics of MCMC traces: rank-normalised split-R-hat and bulk effective sample size.

    split_rhat(trace)  max of the rank-normalised split-R-hat and the rank-normalised folded split-R-hat
    bulk_ess(trace)    the effective sample size of the rank-normalised split chains

`trace` is [chains, draws] (one scalar per draw, e.g. an SGLD chain's training loss). The definitions are those of
Vehtari, Gelman, Simpson, Carpenter & Buerkner (2021), "Rank-normalization, folding, and localization: an improved
R-hat for assessing convergence of MCMC", Bayesian Analysis 16(2), as Stan, posterior and ArviZ compute them:
each chain is split into its two halves (so a trend within a chain, rising or falling, shows as halves that
disagree), the pooled draws are replaced by their normal scores Phi^-1((rank - 3/8) / (S + 1/4)) (so heavy tails
do not hide disagreement), R-hat compares the split chains' between- and within-chain variances, and the
effective sample size sums the chains' autocorrelations by Geyer's initial monotone sequence. Neither ArviZ nor
another implementation is a dependency of geolens (docs/metrics.md#llc says why), so these follow the paper's
equations on numpy and scipy; tests/test_convergence.py checks them on chains with known answers.
"""

from __future__ import annotations

import numpy as np
from scipy.special import ndtri
from scipy.stats import rankdata


def split_chains(trace) -> np.ndarray:
    """[chains, draws] -> [2 chains, draws // 2]: each chain's first and last half (the middle draw of an odd
    length left out)."""
    x = np.asarray(trace, dtype=np.float64)
    half = x.shape[1] // 2
    return np.concatenate([x[:, :half], x[:, x.shape[1] - half:]])


def rank_normalise(x: np.ndarray) -> np.ndarray:
    """The normal scores of the pooled draws' average ranks (ties share a rank), in x's shape."""
    ranks = rankdata(x, axis=None).reshape(x.shape)
    return ndtri((ranks - 0.375) / (x.size + 0.25))


def rhat(chains: np.ndarray) -> float:
    """Gelman-Rubin's potential scale reduction of [chains, draws]: sqrt(((n - 1)/n W + B/n) / W), W the mean
    within-chain variance, B/n the variance of the chains' means (nan when the chains are constant)."""
    n = chains.shape[1]
    within = chains.var(axis=1, ddof=1).mean()
    between = chains.mean(axis=1).var(ddof=1)
    return float(np.sqrt(((n - 1) / n * within + between) / within)) if within > 0 else float("nan")


def split_rhat(trace) -> float:
    """Rank-normalised split-R-hat of [chains, draws] (Vehtari et al. 2021): the larger of R-hat on the normal
    scores of the split chains and on those of their distances to the pooled median (the folded draws, which
    catch chains that differ in spread)."""
    x = split_chains(trace)
    folded = np.abs(x - np.median(x))
    return max(rhat(rank_normalise(x)), rhat(rank_normalise(folded)))


def ess(chains: np.ndarray) -> float:
    """Effective sample size of [chains, draws] (Vehtari et al. 2021, eq. 10-11; Geyer's initial monotone
    sequence): S / tau with tau = -1 + 2 sum_t P_t, P_t = rho_2t + rho_2t+1 summed while positive and made
    non-increasing, rho_t the autocorrelation at lag t combined over chains as 1 - (W - mean autocovariance_t)
    / var+."""
    m, n = chains.shape
    centred = chains - chains.mean(axis=1, keepdims=True)
    spectrum = np.fft.rfft(centred, n=2 * n, axis=1)
    acov = np.fft.irfft(spectrum * np.conj(spectrum), axis=1)[:, :n] / n  # biased autocovariances, lag 0..n-1
    within = acov[:, 0].mean() * n / (n - 1)
    var_plus = within * (n - 1) / n + (chains.mean(axis=1).var(ddof=1) if m > 1 else 0.0)
    if not var_plus > 0:
        return float("nan")
    rho = 1 - (within - acov.mean(axis=0)) / var_plus
    rho[0] = 1.0
    pairs = rho[: 2 * (n // 2)].reshape(-1, 2).sum(axis=1)
    positive = np.flatnonzero(pairs <= 0)
    pairs = pairs[: positive[0] if positive.size else len(pairs)]
    pairs = np.minimum.accumulate(pairs)
    tau = max(-1 + 2 * pairs.sum(), 1 / np.log10(m * n))  # Stan's floor: ess at most S log10(S)
    return float(m * n / tau)


def bulk_ess(trace) -> float:
    """Bulk effective sample size of [chains, draws]: ess of the rank-normalised split chains (Vehtari et al.
    2021), the draws' worth of independent draws for the estimate of a mean."""
    return ess(rank_normalise(split_chains(trace)))
