"""geolens: hooked geometric transformers for grokking, dense trajectories, spectral and circuit analysis.

Public API (imported on first use, so `geolens --help` does not pay for importing TransformerLens):

    GeoConfig, make_config     a run's configuration; make_config('fb', p=59) from a preset
    GeoError                   the error raised for bad input (message: the problem and the fix)
    GeoTransformer             the post-norm model, a TransformerLens HookedRootModule with
                               HookedTransformer's names (forward, run_with_cache, to_tokens, W_Q, OV, ...)
    GeoActivationCache         what GeoTransformer.run_with_cache returns: ActivationCache with
                               residual decompositions exact for the post-norm topology
    residual_parts             those decompositions as a function (geolens.decompose)
    Dataset, make_dataset      a task's inputs, labels and seeded train/test split
    Run, AnalysisRun, load_run a trained run directory: Run reads it (metrics, checkpoints,
                               model_at, dataset), AnalysisRun adds analyze and probe;
                               load_run(path) opens one as an AnalysisRun
    compute_metrics            every analysis metric of one model (geolens.analysis)
    reference_run              a shipped reference trajectory from checkpoints/ ('fb', 'ln'; geolens.shipped)

Modules: config, model, readout (the bounded readout's normalisation), cache, decompose, tasks,
train (the training loop), engine (device, forward engine, optimizer), recording (a run's records),
batched, fast (the exact fast path of one-layer models), plain_model (the plain-PyTorch reference),
run, trajectory, analysis (metrics; definitions in docs/metrics.md), probe, run_analysis, report,
plots, export (trimmed copies of runs), shipped (the reference trajectories in checkpoints/), cli;
docs/architecture.md lists them all and shows how they fit together.
"""

from importlib import import_module

_EXPORTS = {
    "GeoConfig": "geolens.config",
    "make_config": "geolens.config",
    "GeoError": "geolens.errors",
    "GeoTransformer": "geolens.model",
    "GeoActivationCache": "geolens.cache",
    "residual_parts": "geolens.decompose",
    "Dataset": "geolens.tasks",
    "make_dataset": "geolens.tasks",
    "Run": "geolens.run",
    "AnalysisRun": "geolens.run_analysis",
    "load_run": "geolens.run_analysis",
    "compute_metrics": "geolens.analysis",
    "reference_run": "geolens.shipped",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'geolens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
