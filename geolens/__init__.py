"""geolens: hooked geometric transformers for grokking, dense trajectories, spectral and circuit analysis."""

from geolens.config import GeoConfig, make_config
from geolens.errors import GeoError
from geolens.model import GeoTransformer
from geolens.run import Run, load_run
from geolens.tasks import Dataset, make_dataset

__all__ = ["GeoConfig", "GeoError", "GeoTransformer", "Run", "Dataset", "load_run", "make_config", "make_dataset"]
