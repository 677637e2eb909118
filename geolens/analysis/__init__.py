"""Mechanistic-interpretability metrics of one checkpoint and of whole trajectories (definitions:
docs/metrics.md).

Owns one module per metric family (fourier: bases, discrete log, the cyclic frame; keyfreq, fve,
progress_measures: Nanda's progress measures and truncated-logit accuracy; clockpizza, health,
circuit, geometry), the metric set (registry, AnalysisContext), metrics at every checkpoint
(trajectory), the circuit at one step (probe), precursors of the onset and their leads (precursors),
statistics over seeds (significance), online onset forecasts tested held-out (online_rules), the
float-order noise floor of the onset (noise_floor),
a Run with analyze and probe (run_analysis) and the shipped reference trajectories (shipped). May
import geolens.errors, geolens.model, geolens.runs (reading runs), geolens.training.progress_bar (the
progress display) and, for Run.fork alone, geolens.training.fork; never sweeps or outputs.
"""

from geolens.analysis.registry import METRICS, AnalysisContext, MetricSpec, compute_metrics, default_metrics, metric_versions

__all__ = ["METRICS", "AnalysisContext", "MetricSpec", "compute_metrics", "default_metrics", "metric_versions"]
