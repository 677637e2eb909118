"""`geolens.load_run(path)`: a run with its analysis at hand, `run.analyze(...)` and `run.probe(step)`.

The layers, each importing only those before it:
    geolens.runs.run         Run: the run directory's data (config, metrics, checkpoints, models, dataset)
    geolens.analysis.trajectory  analyze_run(run, ...): metrics at every checkpoint, cached
    geolens.analysis.probe       probe_run(run, step): the circuit at one checkpoint
    this module         AnalysisRun: a Run whose analyze and probe call the two above
"""

from __future__ import annotations

from pathlib import Path

from geolens.analysis.probe import Probe, probe_run
from geolens.analysis.trajectory import Trajectory, analyze_run
from geolens.runs.run import Run


class AnalysisRun(Run):
    """A Run (geolens.runs.run) with its analyses as methods."""

    def probe(self, step: int) -> Probe:
        """The circuit at the checkpoint nearest `step`: a probe.Probe with model, metrics, DLA and
        (on first access) the full cache."""
        return probe_run(self, step)

    def analyze(self, metrics: list[str] | None = None, steps: list[int] | None = None, progress: bool = False,
                keys: str | list[int] | None = None, workers: int | None = None,
                out: str | Path | None = None) -> Trajectory:
        """Metrics at every (or the chosen) checkpoint, cached: a trajectory.Trajectory holding these and
        every other cached metric of the run.
        keys: 'auto' (default), 'final' or frequencies to pin (trajectory.resolve_keys).
        workers: processes computing checkpoints, this one included (None: automatic; 1: only this
        process; see trajectory.analyze_run). out: the analysis folder (default RUN/analysis)."""
        return analyze_run(self, metrics, steps, progress, keys, workers, out)


def load_run(path: str | Path) -> AnalysisRun:
    """Open a run directory written by `geolens train`, with run.analyze and run.probe."""
    return AnalysisRun(path)
