"""geolens: hooked geometric transformers for grokking, dense trajectories, spectral and circuit analysis.

Names are imported on first use, so `geolens --help` does not pay for importing TransformerLens.
"""

from importlib import import_module

_EXPORTS = {
    "GeoConfig": "geolens.config",
    "make_config": "geolens.config",
    "GeoError": "geolens.errors",
    "GeoTransformer": "geolens.model",
    "Run": "geolens.run",
    "load_run": "geolens.run",
    "Dataset": "geolens.tasks",
    "make_dataset": "geolens.tasks",
}
__all__ = list(_EXPORTS)


def __getattr__(name: str):
    if name in _EXPORTS:
        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'geolens' has no attribute {name!r}")
