"""Running a sweep grid (geolens.sweeps.grid) on a backend: local worker processes or Ray tasks.

The driver (run_sweep) only plans, launches, watches and reports: the workers train the jobs and
write the members' ordinary run directories themselves (on a shared filesystem when the workers are
on other machines). Workers report each evaluation to the driver, which shows one progress display
(members done / running / failed / skipped, epochs, ETA) and keeps OUT/sweep.json: the command,
the backend, and every member's status and, for a failed one, its error (members of other sweeps
into OUT keep their entries).

local: `workers` spawned processes, each pinned to its share of this process's cores
(os.sched_setaffinity) with that many torch threads (or `threads`); a worker exits when its driver
dies (a watchdog thread compares os.getppid() with the driver's pid), finishing its queued writes
first. ray: each job is one Ray task with num_cpus = threads (default 1) on the cluster at
`address`, or on a local instance started for the sweep (bound to 127.0.0.1); Ray ends a dead
driver's tasks. Ray is imported only for this backend.

Numbers: a member's results depend only on its config and its torch thread count (the stacked
path's float order does not depend on the other members of its stack: geolens.sweeps.grid), so a grid
gives the same run directories on either backend and with any number of workers at the same
`threads`, and a killed sweep continues bit for bit when rerun with the same `threads`.
"""

from __future__ import annotations

import fcntl
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.text import Text

from geolens.errors import GeoError
from geolens.runs.runlock import RunLock
from geolens.runs.storage import RunDir, atomic_write_json, read_json, read_metrics
from geolens.threads import cpu_cores
from geolens.sweeps.grid import (
    MIN_STACK,
    SWEEP_RECORD,
    Grid,
    Job,
    Member,
    expand,
    inspect_member,
    plan_jobs,
    resolve_layout,
)
from geolens.training.progress_bar import LogLines, interactive

BACKENDS = ("local", "ray")
RECORD_LOCK = ".sweep.lock"  # OUT/.sweep.lock: held while OUT/sweep.json is read and rewritten
EVAL_REPORT_S = 0.5  # a worker reports a job's progress at most this often (and whenever a member finishes)
Send = Callable[[tuple], None]


# ---- what a worker does ------------------------------------------------------------------------
def run_job(job: Job, on_eval: Callable[[int, list[bool]], None] | None = None) -> None:
    """Train one job's members (geolens.sweeps.grid.Job) into their run directories."""
    from geolens.training.batched import resume_batched, train_batched

    paths = [m.path for m in job.members]
    if job.kind == "finish":
        for path in paths:
            finish_member(path)
    elif job.kind == "resume":
        resume_batched(paths, progress=False, min_stack=MIN_STACK, on_eval=on_eval, epochs=job.members[0].cfg.epochs)
    else:  # a "restart" member holds a run that never reached a checkpoint (checked when planning): replaced
        train_batched([m.cfg for m in job.members], paths, force=any(m.state == "restart" for m in job.members),
                      progress=False, min_stack=MIN_STACK, on_eval=on_eval)


def finish_member(path: Path) -> None:
    """Write the final records (events.json, run.json finished) of a run whose resume state is already
    at its last epoch: one killed between its last checkpoint and those records."""
    run = RunDir(path)
    with RunLock(run.path, "finish"):
        _finish(run)


def _finish(run: RunDir) -> None:
    from geolens.model.config import GeoConfig
    from geolens.runs.events import early_stop_due, onset_events
    from geolens.runs.storage import BackgroundWriter, load_tensors, write_metrics
    from geolens.training.recording import finish_run

    header = run.read_header()
    cfg = GeoConfig.from_dict(header["config"])
    step = int(load_tensors(run.resume_file)["epoch"].item())
    all_rows = read_metrics(run.metrics_csv)
    rows = [r for r in all_rows if r["epoch"] <= step]
    stop = "early_stop" if early_stop_due(cfg, step, onset_events(rows)) else "completed"
    with BackgroundWriter() as writer:
        if len(rows) != len(all_rows):
            writer.submit(write_metrics, run.metrics_csv, rows)
        body = {k: v for k, v in header.items() if k not in ("format", "format_version", "timing")}
        finish_run(writer, run, body, rows, step, stop, cfg.eval_every, header["timing"])


def execute(job_id: int, job: Job, send: Send) -> None:
    """run_job, reporting ('start', id), ('eval', id, epoch, done flags) at most every EVAL_REPORT_S
    seconds and when a member finishes, then ('done', id) or ('failed', id, error line, traceback)."""
    send(("start", job_id))
    last = {"t": 0.0, "done": -1}

    def on_eval(epoch: int, done: list[bool]) -> None:
        now = time.monotonic()
        if now - last["t"] >= EVAL_REPORT_S or sum(done) != last["done"]:
            last.update(t=now, done=sum(done))
            send(("eval", job_id, epoch, done))

    try:
        run_job(job, on_eval)
    except Exception as e:  # reported to the driver, which records it; the worker goes on with its next job
        line = str(e) if isinstance(e, GeoError) else f"{type(e).__name__}: {e}"
        send(("failed", job_id, " ".join(line.split()), traceback.format_exc()))
    else:
        send(("done", job_id))


# ---- local backend: spawned worker processes ---------------------------------------------------
def core_shares(cores: list[int], workers: int) -> list[list[int]]:
    """Worker i's cores: near-equal contiguous shares (one core each, reused, if there are more workers)."""
    if workers >= len(cores):
        return [[cores[i % len(cores)]] for i in range(workers)]
    bounds = [len(cores) * i // workers for i in range(workers + 1)]
    return [cores[a:b] for a, b in zip(bounds, bounds[1:])]


def _local_worker(index: int, cores: list[int], threads: int, todo, messages, driver_pid: int) -> None:
    """Spawned worker `index`: pinned to `cores`, `threads` torch threads, jobs from `todo` until None."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the driver, which stops the workers
    signal.signal(signal.SIGTERM, _interrupt)
    threading.Thread(target=_watch_driver, args=(driver_pid,), daemon=True, name="geolens-watchdog").start()
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, cores)
    import torch

    torch.set_num_threads(threads)
    try:
        while (item := todo.get()) is not None:
            messages.put(("worker", index, item[0]))
            execute(*item, messages.put)
    except KeyboardInterrupt:
        pass  # stopped by the driver or the watchdog, after the run directories' queued writes


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _watch_driver(driver_pid: int, poll_s: float = 0.5, grace_s: float = 30.0) -> None:
    """Stop this worker once its driver is gone (its parent changes): SIGTERM to itself (training stops
    after its queued writes), then a hard exit after grace_s."""
    while os.getppid() == driver_pid:
        time.sleep(poll_s)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(grace_s)
    os._exit(1)


class LocalBackend:
    """`workers` spawned processes on this machine (module docstring)."""

    def __init__(self, workers: int | None, threads: int | None):
        self.workers = workers or 1
        self.cores = cpu_cores()
        self.shares = core_shares(self.cores, self.workers)
        self.threads = threads

    def describe(self) -> str:
        threads = self.threads or "/".join(sorted({str(len(s)) for s in self.shares}))
        return f"local: {self.workers} worker process(es) on {len(self.cores)} core(s), {threads} torch thread(s) each"

    def run(self, jobs: list[Job], handle: Send) -> None:
        import multiprocessing
        import queue

        ctx = multiprocessing.get_context("spawn")
        todo, messages = ctx.Queue(), ctx.Queue()
        for item in enumerate(jobs):
            todo.put(item)
        n = min(self.workers, len(jobs))
        for _ in range(n):
            todo.put(None)
        procs = [ctx.Process(target=_local_worker, name=f"geolens-sweep-{i}", daemon=True,
                             args=(i, self.shares[i], self.threads or len(self.shares[i]), todo, messages, os.getpid()))
                 for i in range(n)]
        held: dict[int, int] = {}  # worker index -> the job it took last
        open_jobs = set(range(len(jobs)))
        try:
            for p in procs:
                p.start()
            while open_jobs:
                try:
                    msg = messages.get(timeout=0.5)
                except queue.Empty:
                    msg = None
                if msg is not None and msg[0] == "worker":
                    held[msg[1]] = msg[2]
                elif msg is not None:
                    if msg[0] in ("done", "failed"):
                        open_jobs.discard(msg[1])
                    handle(msg)
                else:  # nothing to read: every message of a dead worker has arrived
                    for i, p in enumerate(procs):
                        if not p.is_alive() and held.get(i) in open_jobs:
                            open_jobs.discard(held[i])
                            handle(("failed", held[i], f"its worker process died (exit code {p.exitcode})", ""))
                    if not any(p.is_alive() for p in procs):
                        codes = sorted({p.exitcode for p in procs})
                        for job_id in sorted(open_jobs):
                            handle(("failed", job_id, f"not run: the worker processes exited (exit codes {codes}; a "
                                    "script that runs a sweep needs the `if __name__ == '__main__':` guard)", ""))
                        open_jobs.clear()
            for p in procs:
                p.join(timeout=30)
        finally:
            started = [p for p in procs if p.pid is not None]
            for p in started:
                if p.is_alive():
                    p.terminate()  # SIGTERM: the worker finishes its queued writes, then exits
            for p in started:
                p.join(timeout=60)
            todo.cancel_join_thread()
            messages.cancel_join_thread()


# ---- Ray backend ---------------------------------------------------------------------------------
def _ray_task(job_id: int, job: Job, threads: int, messages) -> None:
    import torch

    torch.set_num_threads(threads)
    execute(job_id, job, messages.put)


class RayBackend:
    """One Ray task per job (module docstring); `workers` only sets how many jobs a group is split into:
    Ray runs as many at once as the cluster's CPUs allow."""

    def __init__(self, workers: int | None, threads: int | None, address: str | None):
        try:
            import ray
        except ModuleNotFoundError:
            raise GeoError("--backend ray needs Ray; pip install 'geolens[cluster]' (or ray>=2.9)") from None
        self.ray = ray
        self.owned = not ray.is_initialized()
        if self.owned:
            options: dict[str, Any] = dict(include_dashboard=False, log_to_driver=False, logging_level="ERROR")
            if address is None:
                options["_node_ip_address"] = "127.0.0.1"  # a local instance listens on loopback only
            ray.init(address=address, **options)
        self.threads = threads or 1
        self.cpus = int(ray.cluster_resources().get("CPU", 1))
        self.workers = workers or max(1, self.cpus // self.threads)

    def describe(self) -> str:
        return (f"ray: {self.cpus} CPU(s) in the cluster, groups split into up to {self.workers} job(s), "
                f"{self.threads} torch thread(s) each")

    def run(self, jobs: list[Job], handle: Send) -> None:
        from ray.util.queue import Queue

        gpu = sorted({m.name for j in jobs for m in j.members if m.cfg.device != "cpu"})
        if gpu:
            raise GeoError(f"the Ray backend trains on CPUs, but {gpu[0]} has device = cuda; use --backend local "
                           "on the GPU machine")

        ray = self.ray
        messages = Queue(actor_options={"num_cpus": 0})
        task = ray.remote(num_cpus=self.threads, max_retries=0)(_ray_task)
        futures = {task.remote(i, job, self.threads, messages): i for i, job in enumerate(jobs)}
        ended: set[int] = set()

        def drain() -> None:
            while not messages.empty():
                msg = messages.get_nowait()
                if msg[0] in ("done", "failed"):
                    ended.add(msg[1])
                handle(msg)

        while futures:
            ready, _ = ray.wait(list(futures), num_returns=len(futures), timeout=0.5)
            drain()
            for ref in ready:
                job_id = futures.pop(ref)
                try:
                    ray.get(ref)
                except Exception as e:  # the task died (its worker crashed, or the job was cancelled)
                    drain()
                    if job_id not in ended:
                        handle(("failed", job_id, " ".join(f"Ray task failed: {e}".split())[:500], str(e)))
                        ended.add(job_id)
        drain()

    def close(self) -> None:
        if self.owned:
            self.ray.shutdown()


def make_backend(backend: str, workers: int | None, threads: int | None, address: str | None):
    if workers is not None and workers < 1 or threads is not None and threads < 1:
        raise GeoError("--workers and --threads must be at least 1")
    if backend == "local":
        if address is not None:
            raise GeoError("--address joins a Ray cluster; use it with --backend ray")
        return LocalBackend(workers, threads)
    if backend == "ray":
        return RayBackend(workers, threads, address)
    raise GeoError(f"--backend '{backend}' is not valid; choose one of {', '.join(BACKENDS)}")


# ---- the driver ------------------------------------------------------------------------------------
@dataclass
class SweepResult:
    out: Path
    members: list[Member]
    status: dict[str, str]  # member name -> skipped | finished | failed
    errors: dict[str, str] = field(default_factory=dict)  # member name -> error line

    @property
    def failed(self) -> list[str]:
        return [name for name, s in self.status.items() if s == "failed"]


class SweepMonitor:
    """The driver's view: job messages -> member statuses, the progress display and OUT/sweep.json."""

    def __init__(self, out: Path, members: list[Member], jobs: list[Job], info: dict, progress: bool):
        self.out, self.members, self.jobs, self.info = out, members, jobs, info
        self.status = {m.name: ("skipped" if m.state == "done" else "queued") for m in members}
        self.epoch = {m.name: (m.cfg.epochs if m.state == "done" else m.start) for m in members}
        self.errors: dict[str, str] = {}
        self.tracebacks: dict[str, str] = {}
        self.started = _now()
        self.show = progress
        live = progress and interactive()
        total, completed = sum(m.cfg.epochs for m in members), sum(self.epoch.values())
        self.progress = Progress(TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                                 TextColumn("epochs"), TimeElapsedColumn(), TimeRemainingColumn(), disable=not live)
        self.task = self.progress.add_task(self._describe(), total=total, completed=completed)
        self.log = LogLines("sweep", total, completed, unit="member-epoch") if progress and not live else None
        self.write_record(finished=False)

    def __enter__(self) -> "SweepMonitor":
        self.progress.__enter__()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.progress.__exit__(exc_type, *exc)
        if self.log is not None:
            self.log.stats = self._describe()
            self.log.close(exc_type)

    def handle(self, msg: tuple) -> None:
        kind, job_id = msg[0], msg[1]
        members = self.jobs[job_id].members
        if kind == "start":
            for m in members:
                self.status[m.name] = "running"
        elif kind == "eval":
            epoch, done = msg[2], msg[3]
            for m, d in zip(members, done):
                self.epoch[m.name] = m.cfg.epochs if d else epoch
                if d:
                    self.status[m.name] = "finished"
        elif kind == "done":
            for m in members:
                self.status[m.name], self.epoch[m.name] = "finished", m.cfg.epochs
        elif kind == "failed":
            # a stacked job fails as one: each member's error says so (a lock error names one member's folder)
            error = msg[2] if len(members) == 1 else f"its stack of {len(members)} failed: {msg[2]}"
            for m in members:
                if self.status[m.name] != "finished":  # members that finished before the job failed stay finished
                    self.status[m.name] = "failed"
                    self.errors[m.name], self.tracebacks[m.name] = error, msg[3]
            if self.show:
                self.progress.console.print(Text.assemble(("failed", "red"), f" {', '.join(m.name for m in members)}: "
                                                          f"{msg[2]}"), highlight=False, soft_wrap=True)
        self.progress.update(self.task, description=self._describe(), completed=sum(self.epoch.values()))
        if self.log is not None:
            self.log.update(sum(self.epoch.values()), self._describe())
        if kind in ("done", "failed"):
            self.write_record(finished=False)

    def _describe(self) -> str:
        counts = {s: list(self.status.values()).count(s) for s in ("finished", "running", "failed", "skipped", "queued")}
        return ("members: {finished} done, {running} running, {failed} failed, {skipped} skipped, {queued} queued"
                .format(**counts))

    def write_record(self, finished: bool) -> None:
        """OUT/sweep.json: this sweep's command and members, then the last recorded entry of every member
        of other sweeps into OUT (another --preset or --seeds, another node's share), under a lock so
        that sweeps running at once keep each other's members."""
        members = [{"name": m.name, "seed": m.cfg.seed, "found": "fork" if m.prepared else m.state, "start_epoch": m.start,
                    "status": self.status[m.name], **({"error": self.errors[m.name],
                                                         "traceback": self.tracebacks[m.name]}
                                                        if m.name in self.errors else {})}
                   for m in self.members]
        path = self.out / SWEEP_RECORD
        with open(self.out / RECORD_LOCK, "a") as lock:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
            except OSError:  # a filesystem without flock: merge unlocked (a sweep at once may lose an update)
                pass
            try:
                previous = read_json(path, dict).get("members") if path.exists() else []
            except (GeoError, OSError):  # unreadable: nothing to keep
                previous = []
            ours = {m["name"] for m in members}
            others = [m for m in previous if isinstance(m, dict) and m.get("name") not in ours] \
                if isinstance(previous, list) else []
            atomic_write_json(path, {"format": "geolens-sweep", **self.info, "started": self.started,
                                     "finished": _now() if finished else None, "members": members + others})


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def run_sweep(grid: Grid, out: str | Path, backend: str = "local", workers: int | None = None,
              threads: int | None = None, address: str | None = None, force: bool = False, progress: bool = True,
              command: list[str] | None = None) -> SweepResult:
    """Train every member of `grid` under `out` that is not finished yet (module docstring). Bad input
    and member folders that hold something else raise a GeoError before anything runs; a job that
    fails marks its members failed (SweepResult.errors) and the other jobs go on."""
    out = Path(out)
    layout = resolve_layout(grid, out)
    members = expand(grid, out, layout)
    for m in members:
        inspect_member(m, force)
    check_engines(members)
    prepare_arms(members)
    runner = make_backend(backend, workers, threads, address)
    try:
        jobs = plan_jobs(members, runner.workers)
        info = {"command": command, "backend": runner.describe(), "layout": layout, "workers": runner.workers,
                "threads": threads, "jobs": len(jobs)}
        out.mkdir(parents=True, exist_ok=True)
        with SweepMonitor(out, members, jobs, info, progress) as monitor:
            try:
                if jobs:
                    runner.run(jobs, monitor.handle)
            except BaseException:  # e.g. Ctrl-C: the record keeps what is known so far
                monitor.write_record(finished=False)
                raise
            for name, s in monitor.status.items():
                if s in ("queued", "running"):  # a job that ended without reporting them (cannot happen normally)
                    monitor.status[name], monitor.errors[name] = "failed", "the job ended without finishing it"
                    monitor.tracebacks[name] = ""
            monitor.write_record(finished=True)
    finally:
        if hasattr(runner, "close"):
            runner.close()
    return SweepResult(out, members, dict(monitor.status), dict(monitor.errors))


def check_engines(members: list[Member]) -> None:
    """Refuse in one line, before anything is written or trained, a grid whose named engine (--set engine=...)
    cannot compute a member's model (one failure per member otherwise)."""
    from geolens.model.engines import choose_engine

    for m in members:
        if m.state != "done":
            try:
                choose_engine(m.cfg)
            except GeoError as e:
                raise GeoError(f"member {m.name}: {e}") from None


def prepare_arms(members: list[Member]) -> None:
    """Write each new (or restarted) arm of a fork sweep as its parent's fork, paused at its step
    (training.fork.prepare_fork), so that it is resumed, stacked with the arms of its shape and step."""
    from geolens.training.fork import prepare_fork

    for m in members:
        if m.fork is not None and m.state in ("new", "restart"):
            parent, step, changes = m.fork
            prepare_fork(parent, step, m.path, changes, force=m.state == "restart")
            m.state, m.start, m.prepared = "resume", step, True


def member_summary(member: Member, status: str) -> dict[str, Any]:
    """A member's row of the final table: name, seed, final epoch, test acc, onsets, stop reason, status."""
    row: dict[str, Any] = {"name": member.name, "seed": member.cfg.seed, "status": status}
    run = RunDir(member.path)
    if status in ("finished", "skipped") and run.events_json.exists():
        events = read_json(run.events_json)
        rows = read_metrics(run.metrics_csv)
        row.update(final_epoch=events.get("final_epoch"), test_acc=rows[-1]["test_acc"] if rows else None,
                   onset_095=events.get("onset_095"), sustained_099=events.get("sustained_099"),
                   stop_reason=events.get("stop_reason"))
    return row
