"""The reference trajectories shipped in the repository's checkpoints/ folder, found from any
working directory (the notebooks in analyses/ open them this way).

    geolens.reference_run("fb")      # AnalysisRun of checkpoints/fb_lr6e-4_seed1 (analyze, probe)
    geolens.analysis.shipped.reference_path("ln")

Where checkpoints/ is: $GEOLENS_CHECKPOINTS if set, else the checkpoints/ folder next to the
geolens package (the repository root, for a clone or an editable install `pip install -e .`). A
non-editable install does not carry them (they are not package data): reference_path raises a
GeoError saying to clone the repository or to set GEOLENS_CHECKPOINTS.
"""

from __future__ import annotations

import os
from pathlib import Path

from geolens.errors import GeoError

ENV = "GEOLENS_CHECKPOINTS"
#: short name -> folder under checkpoints/ (checkpoints/README.md says how each was made)
REFERENCE_RUNS = {"fb": "fb_lr6e-4_seed1", "ln": "ln_lr6e-4_seed1"}


def checkpoints_dir() -> Path:
    """The folder holding the shipped trajectories ($GEOLENS_CHECKPOINTS, else REPO/checkpoints)."""
    if os.environ.get(ENV):
        return Path(os.environ[ENV])
    return Path(__file__).resolve().parents[2] / "checkpoints"


def reference_path(name: str) -> Path:
    """Run directory of a shipped trajectory: a short name of REFERENCE_RUNS or a folder name under
    checkpoints/."""
    folder = checkpoints_dir()
    target = folder / REFERENCE_RUNS.get(name, name)
    if not (target / "run.json").is_file():
        if not folder.is_dir():
            raise GeoError(f"no shipped trajectories at {folder} (this geolens is installed without the repository's "
                           f"checkpoints/ folder); clone the repository and `pip install -e .` it, or set {ENV}=DIR "
                           "to a copy of checkpoints/")
        known = ", ".join(sorted({*REFERENCE_RUNS, *(p.name for p in folder.iterdir() if (p / "run.json").is_file())}))
        raise GeoError(f"no shipped trajectory {name!r} in {folder}; choose one of {known}")
    return target


def reference_run(name: str):
    """The shipped trajectory `name` as a geolens.analysis.run_analysis.AnalysisRun (the run's data plus
    run.analyze and run.probe; analyse it with run.analyze(out=DIR) when its folder is not writable)."""
    from geolens.analysis.run_analysis import AnalysisRun

    return AnalysisRun(reference_path(name))
