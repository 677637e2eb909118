"""`geolens.load_run(path)`: a run with its analysis at hand, `run.analyze(...)`, `run.probe(step)` and `run.fork(step, out, ...)`.

The layers, each importing only those before it:
    geolens.runs.run         Run: the run directory's data (config, metrics, checkpoints, models, dataset)
    geolens.analysis.trajectory  analyze_run(run, ...): metrics at every checkpoint, cached
    geolens.analysis.probe       probe_run(run, step): the circuit at one checkpoint
    this module         AnalysisRun: a Run whose analyze and probe call the two above, and fork
                        geolens.training.fork (a layer below)
"""

from __future__ import annotations

from pathlib import Path

from geolens.analysis.probe import Probe, probe_run
from geolens.analysis.trajectory import Trajectory, analyze_run
from geolens.runs.run import Run


class AnalysisRun(Run):
    """A Run (geolens.runs.run) with its analyses, and forking, as methods."""

    def probe(self, step: int) -> Probe:
        """The circuit at the checkpoint nearest `step`: a probe.Probe with model, metrics, DLA and
        (on first access) the full cache."""
        return probe_run(self, step)

    def analyze(self, metrics: list[str] | None = None, steps: list[int] | None = None, progress: bool = False,
                keys: str | list[int] | None = "final", workers: int | None = None,
                out: str | Path | None = None) -> Trajectory:
        """Metrics at every (or the chosen) checkpoint, cached: a trajectory.Trajectory holding these and
        every other cached metric of the run.
        keys: 'final' (default: the last checkpoint's keys over the run), 'each' (every checkpoint's own)
        or frequencies to pin (trajectory.resolve_keys).
        workers: processes computing checkpoints, this one included (None: automatic; 1: only this
        process; see trajectory.analyze_run). out: the analysis folder (default RUN/analysis)."""
        return analyze_run(self, metrics, steps, progress, keys, workers, out)


    def fork(self, step: int, out: str | Path, epochs: int | None = None, schedule: list[str] | None = None,
             force: bool = False, progress: bool = False, **changes) -> "AnalysisRun":
        """Fork this run at epoch `step` (any of its trajectory) into a new run `out` with config `changes` (e.g.
        norm='sphere', weight_decay=0.0, norm_clamp=40.0), trained to `epochs` (default this run's);
        schedule entries are added to this run's schedule at the step, windows may be relative to it
        ('weight_decay=3@+0:+200'). Without changes the fork continues exactly as this run did
        (geolens.training.fork). Returns the fork, opened like this run."""
        from geolens.training.fork import fork

        if epochs is not None:
            changes["epochs"] = epochs
        return AnalysisRun(fork(self.path, step, out, changes, force=force, progress=progress, schedule=schedule or []).path)


def load_run(path: str | Path) -> AnalysisRun:
    """Open a run directory written by `geolens train`, with run.analyze, run.probe and run.fork."""
    return AnalysisRun(path)
