"""geolens: hooked geometric transformers for grokking, dense trajectories, spectral and circuit analysis.

Public API (imported on first use, so `geolens --help` does not pay for importing TransformerLens):

    GeoConfig, make_config     a run's configuration; make_config('fb', p=59) from a preset
    GeoError                   the error raised for bad input (message: the problem and the fix)
    GeoTransformer             the post-norm model, a TransformerLens HookedRootModule with
                               HookedTransformer's names (forward, run_with_cache, to_tokens, W_Q, OV, ...)
    GeoActivationCache         what GeoTransformer.run_with_cache returns: ActivationCache with
                               residual decompositions exact for the post-norm topology
    residual_parts             those decompositions as a function (geolens.model.decompose)
    Dataset, make_dataset      a task's inputs, labels and seeded train/test split
    Run, AnalysisRun, load_run a trained run directory: Run reads it (metrics, checkpoints,
                               model_at, dataset), AnalysisRun adds analyze and probe;
                               load_run(path) opens one as an AnalysisRun
    compute_metrics            every analysis metric of one model (geolens.analysis)
    reference_run              a shipped reference trajectory from checkpoints/ ('fb', 'ln'; geolens.analysis.shipped)
    __version__                the installed version (`geolens --version`)

Subpackages, one per layer (each imports only from the layers below it; docs/architecture.md):
model (config, tasks, the hooked model, the fast path), runs (run directories: storage, safety,
reading), training (the loops), sweeps (grids of runs), analysis (metrics, trajectories, probes),
outputs (figures, reports, the paper's tables); cli is the command line.
"""

from importlib import import_module

_EXPORTS = {
    "GeoConfig": "geolens.model.config",
    "make_config": "geolens.model.config",
    "GeoError": "geolens.errors",
    "GeoTransformer": "geolens.model.transformer",
    "GeoActivationCache": "geolens.model.cache",
    "residual_parts": "geolens.model.decompose",
    "Dataset": "geolens.model.tasks",
    "make_dataset": "geolens.model.tasks",
    "Run": "geolens.runs.run",
    "AnalysisRun": "geolens.analysis.run_analysis",
    "load_run": "geolens.analysis.run_analysis",
    "compute_metrics": "geolens.analysis",
    "reference_run": "geolens.analysis.shipped",
}
__all__ = list(_EXPORTS)


def _version() -> str:
    """The installed distribution's version (pyproject.toml), '0+unknown' where geolens is not installed."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("geolens")
    except PackageNotFoundError:
        return "0+unknown"


def __getattr__(name: str):
    if name == "__version__":
        return _version()
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'geolens' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
