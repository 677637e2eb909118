"""Mechanistic-interpretability metrics of one checkpoint (definitions: docs/metrics.md).

Modules, one per family: fourier (bases, discrete log, the cyclic frame), keyfreq, fve,
progress_measures (Nanda's progress measures, truncated-logit accuracy), clockpizza, health, circuit,
geometry; registry holds the metric set used by the trajectory layer and compute_metrics.
"""

from geolens.analysis.registry import METRICS, AnalysisContext, MetricSpec, compute_metrics, metric_versions

__all__ = ["METRICS", "AnalysisContext", "MetricSpec", "compute_metrics", "metric_versions"]
