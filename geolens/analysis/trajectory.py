"""Metrics across a trajectory: every checkpoint of a run, cached per step, as one tidy table.

Layout of the analysis folder (RUN/analysis by default, or a folder of the caller's choice, e.g. for
a read-only run; the run's own analysis/cache is then still read):
    cache/step_XXXXXXX.json   {"checkpoint_sha256", "metrics": {name: {"version", ["keys",] "values" | "skipped"}}}
    metrics.csv               tidy table: step, metric, name, value (one row per step and scalar)
A rerun computes only what is missing: a metric whose definition version changed, a checkpoint
whose bytes changed, or a key-frequency metric asked for with other keys ("keys": the pinned
frequencies, null for each checkpoint's own) is recomputed; everything else is read back. Each step's cache file is
written atomically as soon as that step is done, so an interrupted analysis keeps its work. The
trajectory and metrics.csv hold everything known about the run, not only what one call asked for:
every checkpoint's cached metrics (key-frequency metrics for the call's key choice).
The analysis folder is locked while a call writes it (geolens.runs.runlock); the default one must not be
a symlink out of the run directory.
Checkpoints are computed in parallel by the calling process and spawned single-threaded worker
processes when there are enough of them (analyze_run's `workers`); all caching and writing stays in
the calling process.
"""

from __future__ import annotations

import csv
import hashlib
import io
import json
import multiprocessing
import os
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from geolens.errors import GeoError
from geolens.runs.run import Run
from geolens.runs.runlock import RunLock
from geolens.runs.storage import CorruptTensors, atomic_write_bytes, atomic_write_json, read_limited, tensors_header
from geolens.threads import cpu_cores
from geolens.training.progress_bar import LogLines, interactive

ANALYSIS_DIR = "analysis"
# fewer checkpoints to compute: in-process only. The caller computes while spawned workers import, so
# workers pay off only once a run has enough checkpoints to amortise their start-up (docs/performance.md)
AUTO_WORKERS_MIN_STEPS = 16


@dataclass
class Trajectory:
    """Analysis results of a run: values[step][metric] = {scalar: value}; skipped[metric] = reason;
    out: the analysis folder (the report is written there)."""

    run: Run
    steps: list[int]
    values: dict[int, dict[str, dict[str, float]]]
    skipped: dict[str, str]
    computed: int  # how many (step, metric) pairs were computed in this call (the rest came from cache)
    out: Path
    keys: list[int] | None = None  # the key frequencies pinned over the trajectory; None: each checkpoint's own

    def series(self, metric: str, name: str | None = None) -> tuple[list[int], list[float]]:
        """(steps, values) of one scalar over the trajectory (name defaults to the metric's name)."""
        name = name or metric
        pairs = [(s, self.values[s][metric][name]) for s in self.steps if name in self.values[s].get(metric, {})]
        return [s for s, _ in pairs], [v for _, v in pairs]


def _sha256(path: Path) -> str:
    """SHA-256 of a checkpoint's bytes, read no further than the size its header declares."""
    run = path.parent.parent
    try:
        _, size = tensors_header(path)
        with open(path, "rb") as f:
            return hashlib.sha256(f.read(size)).hexdigest()
    except FileNotFoundError:
        raise GeoError(f"checkpoint {path} is listed in the manifest but missing; `geolens repair --run {run}` drops "
                       "it from the manifest (or restore the file)") from None
    except (CorruptTensors, OSError) as e:
        raise GeoError(f"checkpoint {path} is corrupt ({e}); `geolens repair --run {run}` sets it aside "
                       "(or restore the file)") from None


def _read_cache(folders: list[Path], step: int, sha: str) -> dict:
    """The cached metrics of `step` for checkpoint bytes `sha` from the first folder that has them
    ({} if none: a damaged or stale cache entry is only a cache, it is recomputed)."""
    for folder in folders:
        try:
            cached = json.loads(read_limited(folder / "cache" / f"step_{step:07d}.json"))
        except (OSError, ValueError):
            continue
        if isinstance(cached, dict) and cached.get("checkpoint_sha256") == sha and isinstance(cached.get("metrics"), dict):
            return cached["metrics"]
    return {}


def analysis_folder(run: Run, out: str | Path | None) -> Path:
    """Where the analysis of `run` is written: `out`, or RUN/analysis, which must lie inside the run
    directory (a symlinked analysis/ or analysis/cache|figures is refused)."""
    if out is not None:
        return Path(out)
    folder = run.path / ANALYSIS_DIR
    for p in (folder, folder / "cache", folder / "figures"):
        if p.is_symlink():
            raise GeoError(f"{p} is a symlink; geolens writes only inside the run directory: replace it with a folder, "
                           "or pass --out DIR to write the analysis elsewhere")
    return folder


@contextmanager
def writing(folder: Path):
    """Create and lock the analysis folder for one writer (GeoError if it cannot be written)."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GeoError(f"cannot write the analysis to {folder} ({e.strerror}); pass --out DIR to write it elsewhere") from None
    if not os.access(folder, os.W_OK):
        raise GeoError(f"cannot write the analysis to {folder} (read-only); pass --out DIR to write it elsewhere")
    with RunLock(folder, "analyze", "pass --out DIR to write the analysis elsewhere"):
        yield


def select_steps(run: Run, steps: list[int] | None) -> list[int]:
    """The run's checkpoints, or the nearest checkpoint of each requested epoch (deduplicated)."""
    if not run.steps:
        if run.dir.checkpoint_files():
            raise GeoError(f"{run.path} has checkpoint files but {run.dir.manifest_json} lists none; "
                           f"`geolens repair --run {run.path}` rebuilds the manifest from them")
        raise GeoError(f"{run.path} has no checkpoints yet ({run.dir.manifest_json}); train it first")
    if steps is None:
        return run.steps
    return sorted({run.nearest_step(s) for s in steps})


def resolve_keys(run: Run, keys: str | list[int] | None, final_entry: dict | None = None) -> list[int] | None:
    """The key frequencies to pin over the whole trajectory: 'final' (the default: the last
    checkpoint's keyfreq_wl_fft, as Nanda et al. fix the final model's keys; None where keyfreq_wl_fft is not
    computed: S_n has no keys, 3-operand tasks no [a, b] grid), None or 'each' (each checkpoint's own
    keyfreq_wl_fft: a change of keys then moves the key-frequency metrics), or explicit frequencies (each in
    1..n//2, n the group order). final_entry: the last checkpoint's cached keyfreq_wl_fft values, if current
    (saves its forward)."""
    from geolens.analysis import AnalysisContext
    from geolens.analysis.fourier import cyclic_frame
    from geolens.analysis.registry import skip_reason

    why = skip_reason("keyfreq_wl_fft", run.config)
    if keys is None or keys == "each" or (keys == "final" and why is not None):
        return None
    if why is not None:
        raise GeoError(f"--keys: this run has no key frequencies to pin ({why}); drop --keys")
    if keys == "final":
        if final_entry is not None:
            return ranked_keys(final_entry)
        last = select_steps(run, None)[-1]
        return [int(k) for k in AnalysisContext(run.model_at(last), run.config_at(last), run.dataset).key_freqs]
    if isinstance(keys, str):
        raise GeoError(f"unknown key choice {keys!r}: use 'final', 'each' or a list of frequencies")
    n = cyclic_frame(run.config).n
    bad = [k for k in keys if not 1 <= k <= n // 2]
    if bad or not keys:
        raise GeoError(f"key frequencies {bad or keys} are not in 1..{n // 2} (the group has order {n}); pass e.g. --keys 4,32")
    return [int(k) for k in keys]


def _metrics_at(run: Run, step: int, names: list[str], pinned: list[int] | None, llc):
    from geolens.analysis import compute_metrics

    return compute_metrics(run.model_at(step), run.config_at(step), run.dataset, names=names, key_freqs=pinned,
                           num_threads=1, llc=llc)


_WORKER_RUNS: dict[str, Run] = {}  # per worker process: the run, loaded once


def _exit_with_parent(parent: int) -> None:
    """Pool initializer: end this worker as soon as the process that started it is gone (killed
    outright, it cannot shut its pool down)."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="geolens-parent-watch", daemon=True).start()


def _start_worker(path: str) -> None:
    """Load the run in this worker process (once), with one torch thread for all the worker's work
    (the workers and the caller fill the cores)."""
    if path not in _WORKER_RUNS:
        import torch

        torch.set_num_threads(1)
        _WORKER_RUNS[path] = Run(path)


def _worker_metrics(path: str, step: int, names: list[str], pinned: list[int] | None, llc):
    """One step's (rows, skipped) in a worker process."""
    _start_worker(path)
    return _metrics_at(_WORKER_RUNS[path], step, names, pinned, llc)


@contextmanager
def _pool(workers: int):
    """A spawn-context process pool (None for workers < 1). On leaving, steps not started are cancelled
    (after an error) and the workers exit in the background (their interpreter teardown is slow)."""
    if workers < 1:
        yield None
        return
    pool = ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_exit_with_parent,
                               initargs=(os.getpid(),))
    try:
        yield pool
    finally:
        pool.shutdown(wait=False, cancel_futures=True)


def _caller_step(queue: list[int]) -> int | None:
    """The step the calling process computes next while no worker result is waiting: the last queued."""
    return queue.pop() if queue else None


def _results(run: Run, jobs: dict[int, list[str]], pinned, llc, pool, n_workers: int):
    """(step, (rows, skipped)) for every job, in completion order.

    With a pool of n_workers, steps go to the workers only once one has started (imports and run
    loaded), from the front of the queue, at most two per worker at a time; meanwhile and
    whenever no worker result is waiting, the calling process computes the last queued step itself.
    """
    if pool is None:
        yield from ((step, _metrics_at(run, step, todo, pinned, llc)) for step, todo in jobs.items())
        return
    path, queue, running = str(run.path), list(jobs), {}
    started = pool.submit(_start_worker, path)
    while queue or running:
        if started.done():
            started.result()  # a worker that cannot load the run raises here
            while queue and len(running) < 2 * n_workers:
                step = queue.pop(0)
                running[pool.submit(_worker_metrics, path, step, jobs[step], pinned, llc)] = step
        done = [f for f in running if f.done()]
        for f in done:
            yield running.pop(f), f.result()
        if done:
            continue
        step = _caller_step(queue)
        if step is not None:
            yield step, _metrics_at(run, step, jobs[step], pinned, llc)
        else:
            wait(list(running) or [started], return_when=FIRST_COMPLETED)


def cached_metrics(run: Run, step: int, names: list[str]) -> dict[str, dict[str, float]]:
    """The values of `names` at checkpoint `step` that analyze_run has cached and that are still
    valid (same checkpoint bytes and metric definition, the llc metric at whichever SGLD settings; key-frequency
    metrics only as computed with each checkpoint's own keys); reads only, computes nothing."""
    from geolens.analysis import METRICS, metric_versions
    from geolens.analysis.registry import same_definition

    entries = _read_cache([run.path / ANALYSIS_DIR], step, _sha256(run.checkpoint_file(step)))
    versions = metric_versions()
    return {n: entries[n]["values"] for n in names
            if "values" in entries.get(n, {}) and same_definition(n, entries[n].get("version"), versions[n])
            and (not METRICS[n].uses_keys or entries[n].get("keys") is None)}


def analyze_run(
    run: Run, metrics: list[str] | None = None, steps: list[int] | None = None, progress: bool = True,
    keys: str | list[int] | None = "final", workers: int | None = None, out: str | Path | None = None,
    llc=None,
) -> Trajectory:
    """Evaluate metrics (all by default) at the chosen checkpoints, reusing the cache; returns (and
    writes to OUT/metrics.csv) everything known about the run: these and every other cached metric.

    keys: resolve_keys choice for the key-frequency metrics (default: the final checkpoint's).
    workers: processes computing checkpoints, one thread each, the calling process included (it
    computes while the workers-1 spawned ones start); None: one per core this process may use (cpu_cores) when at least
    AUTO_WORKERS_MIN_STEPS checkpoints need computing, else 1 (in-process only). Scripts that use
    workers need the `if __name__ == "__main__":` guard (the spawn start method).
    out: the analysis folder (default RUN/analysis; see analysis_folder).
    llc: the llc metric's SGLD settings (an llc.LLCSettings; None: DEFAULT_LLC). A cached llc value at other
    settings is recomputed when llc is asked for and kept in the table otherwise (its llc_setting_* columns)."""
    from geolens.analysis import METRICS, default_metrics, metric_versions
    from geolens.analysis.llc import DEFAULT_LLC
    from geolens.analysis.registry import same_definition, skip_reason

    names = default_metrics() if metrics is None else metrics
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise GeoError(f"unknown metric(s) {unknown}; known metrics: {', '.join(METRICS)}")
    if workers is not None and workers < 1:
        raise GeoError(f"workers must be at least 1 (got {workers}); leave it unset for automatic")
    folder = analysis_folder(run, out)
    llc = llc or DEFAULT_LLC
    versions = metric_versions(llc)
    chosen = select_steps(run, steps)

    def fresh(name: str, entry: dict, exact: bool = True) -> bool:
        """Whether a cache entry stands: its version (exact: the very one, else the same definition: an llc value
        at other settings), its skip (stale once the metric serves this config), its keys."""
        if not isinstance(entry, dict) or name not in versions:
            return False
        cached = entry.get("version")
        return ((cached == versions[name] if exact else same_definition(name, cached, versions[name]))
                and ("skipped" not in entry or entry["skipped"] == skip_reason(name, run.config))
                and (not METRICS[name].uses_keys or entry.get("keys") == pinned))

    sources = list(dict.fromkeys([folder, run.path / ANALYSIS_DIR]))
    listed = run.steps  # read once: a run still training adds checkpoints meanwhile
    shas = {step: _sha256(run.checkpoint_file(step)) for step in listed}
    entries = {step: _read_cache(sources, step, shas[step]) for step in listed}  # step -> {metric: cache entry}
    final = entries[listed[-1]].get("keyfreq_wl_fft") if listed else None
    pinned = resolve_keys(run, keys, final["values"] if fresh("keyfreq_wl_fft", final) and "values" in final else None)
    jobs = {step: todo for step in chosen if (todo := [n for n in names if not fresh(n, entries[step].get(n))])}
    if workers is None:
        workers = len(cpu_cores()) if len(jobs) >= AUTO_WORKERS_MIN_STEPS else 1
    workers = min(workers, len(jobs))

    live = progress and interactive()
    bar = Progress(TextColumn("[bold]analyze"), BarColumn(), MofNCompleteColumn(), TextColumn("{task.fields[step]}"),
                   TimeRemainingColumn(), disable=not live)
    log = LogLines("analyze", len(chosen), len(chosen) - len(jobs), unit="checkpoint") if progress and not live else None
    with writing(folder), bar, _pool(workers - 1) as pool:
        task = bar.add_task("analyze", total=len(chosen), completed=len(chosen) - len(jobs), step="")
        try:
            for step, (rows, skip) in _results(run, jobs, pinned, llc, pool, workers - 1):
                for n in jobs[step]:
                    entries[step][n] = {"version": versions[n], **({"keys": pinned} if METRICS[n].uses_keys else {}),
                                        **({"skipped": skip[n]} if n in skip else {"values": rows[n]})}
                atomic_write_json(folder / "cache" / f"step_{step:07d}.json",
                                  {"checkpoint_sha256": shas[step], "metrics": entries[step]})
                bar.update(task, advance=1, step=f"epoch {step}")  # steps finish out of order (workers)
                if log is not None:
                    log.update(log.done + 1, f"epoch {step}")
        except BaseException as e:
            if log is not None:
                log.close(type(e))
            raise
        if chosen:  # the bar ends at the last epoch analysed, whichever step finished last
            bar.update(task, step=f"epoch {max(chosen)}")
        if log is not None:
            log.stats = f"epochs {min(chosen)}-{max(chosen)}" if chosen else ""
            log.close()
        known = {s: {n: e for n, e in entries[s].items() if n in METRICS and fresh(n, e, exact=False)} for s in listed}
        steps_known = [s for s in listed if known[s]]
        values = {s: {n: e["values"] for n, e in known[s].items() if "values" in e} for s in steps_known}
        skipped = {n: e["skipped"] for s in steps_known for n, e in known[s].items() if "skipped" in e}
        traj = Trajectory(run, steps_known, values, skipped, sum(map(len, jobs.values())), folder, pinned)
        write_table(traj, folder / "metrics.csv")
    return traj


def ranked_keys(values: dict[str, float]) -> list[int]:
    """The key frequencies of one checkpoint's keyfreq_wl_fft values, strongest first (NaN ranks left out)."""
    return [int(v) for k, v in values.items() if k != "keyfreq_wl_fft_share" and v == v]


def keys_settled(traj: Trajectory) -> int | None:
    """Key-frequency stability: the first analysed checkpoint from which every later checkpoint's top-5
    key set (keyfreq_wl_fft, each checkpoint's own, as a set) is the final one's; None without it."""
    sets = [(s, frozenset(ranked_keys(traj.values[s]["keyfreq_wl_fft"]))) for s in traj.steps
            if "keyfreq_wl_fft" in traj.values[s]]
    if not sets:
        return None
    settled = sets[-1][0]
    for step, keys in reversed(sets):
        if keys != sets[-1][1]:
            break
        settled = step
    return settled


def keys_words(traj: Trajectory) -> str:
    """Which key frequencies the key metrics of a trajectory use, in words (figures and report say it)."""
    if traj.keys is None:
        return "each checkpoint's own top-5 keys"
    return f"keys {', '.join(map(str, traj.keys))} pinned over the run"


def read_table(path: Path) -> dict[int, dict[str, float]]:
    """A tidy table that write_table wrote, as {step: {scalar name: value}}."""
    values: dict[int, dict[str, float]] = {}
    with open(path, newline="") as f:
        for row in csv.DictReader(f):
            values.setdefault(int(row["step"]), {})[row["name"]] = float(row["value"])
    return values


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
