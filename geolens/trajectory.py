"""Metrics across a trajectory: every checkpoint of a run, cached per step, as one tidy table.

Layout inside the run directory:
    analysis/cache/step_XXXXXXX.json   {"checkpoint_sha256", "metrics": {name: {"version", ["keys",] "values" | "skipped"}}}
    analysis/metrics.csv               tidy table: step, metric, name, value (one row per step and scalar)
A rerun computes only what is missing: a metric whose definition version changed, a checkpoint
whose bytes changed, or a key-frequency metric asked for with other keys ("keys": the pinned
frequencies, null for each checkpoint's own) is recomputed; everything else is read back. Each step's cache file is
written atomically as soon as that step is done, so an interrupted analysis keeps its work.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from geolens.errors import GeoError
from geolens.run import Run
from geolens.storage import atomic_write_bytes, atomic_write_json

ANALYSIS_DIR = "analysis"


@dataclass
class Trajectory:
    """Analysis results of a run: values[step][metric] = {scalar: value}; skipped[metric] = reason."""

    run: Run
    steps: list[int]
    values: dict[int, dict[str, dict[str, float]]]
    skipped: dict[str, str]
    computed: int  # how many (step, metric) pairs were computed in this call (the rest came from cache)

    def series(self, metric: str, name: str | None = None) -> tuple[list[int], list[float]]:
        """(steps, values) of one scalar over the trajectory (name defaults to the metric's name)."""
        name = name or metric
        pairs = [(s, self.values[s][metric][name]) for s in self.steps if name in self.values[s].get(metric, {})]
        return [s for s, _ in pairs], [v for _, v in pairs]


def _sha256(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except FileNotFoundError:
        raise GeoError(f"checkpoint {path} is listed in the manifest but missing; retrain or remove it from the manifest") from None


def _read_cache(path: Path) -> dict:
    if not path.exists():
        return {}
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError:
        return {}  # a damaged cache entry is only a cache: it is recomputed


def select_steps(run: Run, steps: list[int] | None) -> list[int]:
    """The run's checkpoints, or the nearest checkpoint of each requested epoch (deduplicated)."""
    if not run.steps:
        raise GeoError(f"{run.path} has no checkpoints yet ({run.dir.manifest_json}); train it first")
    if steps is None:
        return run.steps
    return sorted({run.nearest_step(s) for s in steps})


def resolve_keys(run: Run, keys: str | list[int] | None) -> list[int] | None:
    """The key frequencies to pin over the whole trajectory: None or 'auto' (each checkpoint's
    own keyfreq_wl_fft), 'final' (the last checkpoint's keyfreq_wl_fft, as Nanda et al. fix the
    final model's keys), or explicit frequencies (each in 1..n//2, n the group order)."""
    from geolens.analysis import AnalysisContext
    from geolens.analysis.fourier import cyclic_frame

    if keys is None or keys == "auto":
        return None
    if run.config.task == "perm":
        raise GeoError("key frequencies need a cyclic group Z_p; task perm has none: drop --keys")
    if keys == "final":
        last = select_steps(run, None)[-1]
        return [int(k) for k in AnalysisContext(run.model_at(last), run.config, run.dataset).key_freqs]
    if isinstance(keys, str):
        raise GeoError(f"unknown key choice {keys!r}: use 'auto', 'final' or a list of frequencies")
    n = cyclic_frame(run.config).n
    bad = [k for k in keys if not 1 <= k <= n // 2]
    if bad or not keys:
        raise GeoError(f"key frequencies {bad or keys} are not in 1..{n // 2} (the group has order {n}); pass e.g. --keys 4,32")
    return [int(k) for k in keys]


def analyze_run(
    run: Run, metrics: list[str] | None = None, steps: list[int] | None = None, progress: bool = True,
    keys: str | list[int] | None = None,
) -> Trajectory:
    """Evaluate metrics (all by default) at the chosen checkpoints, reusing the cache.

    keys: resolve_keys choice for the key-frequency metrics (default: each checkpoint's own)."""
    from geolens.analysis import METRICS, compute_metrics, metric_versions

    names = list(METRICS) if metrics is None else metrics
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise GeoError(f"unknown metric(s) {unknown}; known metrics: {', '.join(METRICS)}")
    versions = metric_versions()
    chosen = select_steps(run, steps)
    pinned = resolve_keys(run, keys)

    def fresh(name: str, entry: dict) -> bool:
        return entry.get("version") == versions[name] and (not METRICS[name].uses_keys or entry.get("keys") == pinned)

    cache_dir = run.path / ANALYSIS_DIR / "cache"
    values: dict[int, dict[str, dict[str, float]]] = {}
    skipped: dict[str, str] = {}
    computed = 0
    bar = Progress(TextColumn("[bold]analyze"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[step]}"),
                   TimeRemainingColumn(), disable=not progress)
    with bar:
        task = bar.add_task("analyze", total=len(chosen), step="")
        for step in chosen:
            bar.update(task, step=f"epoch {step}")
            cache_path = cache_dir / f"step_{step:07d}.json"
            sha = _sha256(run.dir.ckpt_path(step))
            cached = _read_cache(cache_path)
            entries = cached.get("metrics", {}) if cached.get("checkpoint_sha256") == sha else {}
            todo = [n for n in names if not fresh(n, entries.get(n, {}))]
            if todo:
                rows, skip = compute_metrics(run.model_at(step), run.config, run.dataset, names=todo,
                                             key_freqs=pinned, num_threads=1)
                for n in todo:
                    entries[n] = {"version": versions[n], **({"keys": pinned} if METRICS[n].uses_keys else {}),
                                  **({"skipped": skip[n]} if n in skip else {"values": rows[n]})}
                computed += len(todo)
                atomic_write_json(cache_path, {"checkpoint_sha256": sha, "metrics": entries})
            values[step] = {n: entries[n]["values"] for n in names if "values" in entries[n]}
            skipped.update({n: entries[n]["skipped"] for n in names if "skipped" in entries[n]})
            bar.advance(task)
    traj = Trajectory(run, chosen, values, skipped, computed)
    write_table(traj, run.path / ANALYSIS_DIR / "metrics.csv")
    return traj


def write_table(traj: Trajectory, path: Path) -> None:
    """The tidy table: one row per (step, metric, scalar name)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(["step", "metric", "name", "value"])
    for step in traj.steps:
        for metric, scalars in traj.values[step].items():
            for name, value in scalars.items():
                w.writerow([step, metric, name, repr(value)])
    atomic_write_bytes(path, buf.getvalue().encode())
