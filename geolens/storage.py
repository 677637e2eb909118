"""Run directories on disk: atomic writes, safetensors checkpoints, JSON manifests, CSV metrics.

Layout (docs/run-format.md is the reference):
    run.json                 format, versions, resolved config, status, timing
    metrics.csv              one row per evaluation
    events.json              onset events derived from metrics.csv
    checkpoints/manifest.json, checkpoints/step_XXXXXXX.safetensors   model weights per step
    resume.safetensors       model + AdamW state at the newest checkpoint (for --resume)
Nothing is pickled: tensors are safetensors, everything else JSON or CSV.
"""

from __future__ import annotations

import csv
import functools
import io
import json
import os
import platform
import queue
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

import torch
from safetensors import SafetensorError
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from geolens.errors import GeoError

FORMAT = "geolens-run"
FORMAT_VERSION = 1
METRIC_COLUMNS = (
    "epoch",
    "train_loss",
    "train_acc",
    "test_loss",
    "test_acc",
    "weight_norm",
    "grad_norm",
    "max_abs_logit",
    "elapsed_s",
)


_UMASK = os.umask(0)
os.umask(_UMASK)


# ---- atomic primitives ---------------------------------------------------------------------
def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Write to a temporary file in the same folder, fsync, then rename over `path`."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp makes 0600 files; give them the usual mode
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def atomic_write_json(path: Path, obj: Any) -> None:
    atomic_write_bytes(path, (json.dumps(obj, indent=2) + "\n").encode())


def read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        raise GeoError(f"{path} is missing; is this a geolens run directory? (create one with `geolens train`)") from None
    except json.JSONDecodeError as e:
        raise GeoError(f"{path} is corrupt ({e.msg} at line {e.lineno}); restore it or retrain the run") from None


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write_bytes(path, st_save(tensors, metadata=metadata))


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    try:
        return st_load(path.read_bytes())
    except FileNotFoundError:
        raise GeoError(f"checkpoint {path} is missing; list the run's checkpoints with `geolens info --run {path.parent.parent}`") from None
    except (SafetensorError, ValueError, OSError) as e:
        raise GeoError(f"checkpoint {path} is corrupt ({e}); delete it or retrain from an earlier checkpoint") from None


# ---- metrics table ---------------------------------------------------------------------------
def write_metrics(path: Path, rows: list[dict[str, float]]) -> None:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=METRIC_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: repr(row[k]) if isinstance(row[k], float) else row[k] for k in METRIC_COLUMNS})
    atomic_write_bytes(path, buf.getvalue().encode())


def read_metrics(path: Path) -> list[dict[str, float]]:
    try:
        with open(path, newline="") as f:
            rows = list(csv.DictReader(f))
        return [{k: (int(r[k]) if k == "epoch" else float(r[k])) for k in METRIC_COLUMNS} for r in rows]
    except FileNotFoundError:
        raise GeoError(f"{path} is missing; the run has not recorded an evaluation yet") from None
    except (KeyError, ValueError, TypeError) as e:
        raise GeoError(f"{path} is corrupt ({e!r}); restore it or retrain the run") from None


# ---- run directory ---------------------------------------------------------------------------
def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("geolens", "torch", "transformer-lens", "numpy", "safetensors"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


class RunDir:
    """Paths and validated reads/writes of one run directory."""

    def __init__(self, path: str | Path):
        self.path = Path(path)

    run_json = property(lambda self: self.path / "run.json")
    metrics_csv = property(lambda self: self.path / "metrics.csv")
    events_json = property(lambda self: self.path / "events.json")
    ckpt_dir = property(lambda self: self.path / "checkpoints")
    manifest_json = property(lambda self: self.path / "checkpoints" / "manifest.json")
    resume_file = property(lambda self: self.path / "resume.safetensors")

    def exists(self) -> bool:
        return self.path.exists() and any(self.path.iterdir())

    def prepare_new(self, force: bool) -> None:
        """Create an empty run folder; an existing non-empty one is refused unless force."""
        if self.path.exists() and not self.path.is_dir():
            raise GeoError(f"--out {self.path} exists and is not a directory; choose another --out")
        if self.exists():
            if not force:
                raise GeoError(
                    f"run directory {self.path} already exists; use --resume to continue it, --force to replace it, "
                    "or choose another --out"
                )
            if not self.run_json.exists():
                raise GeoError(f"--force refused: {self.path} is not a geolens run (no run.json); choose another --out")
            shutil.rmtree(self.path)
        self.path.mkdir(parents=True, exist_ok=True)

    def read_header(self) -> dict[str, Any]:
        """run.json, checked for format and version."""
        if not self.path.is_dir():
            raise GeoError(f"run directory {self.path} does not exist; train one with `geolens train --out {self.path}`")
        header = read_json(self.run_json)
        if header.get("format") != FORMAT:
            raise GeoError(f"{self.run_json} is not a geolens run file (format {header.get('format')!r})")
        if header.get("format_version") != FORMAT_VERSION:
            raise GeoError(
                f"{self.path} was written in run format {header.get('format_version')} but this geolens reads format "
                f"{FORMAT_VERSION}; use the geolens version recorded in run.json ({header.get('versions', {}).get('geolens')})"
            )
        return header

    def write_header(self, header: dict[str, Any]) -> None:
        atomic_write_json(self.run_json, {"format": FORMAT, "format_version": FORMAT_VERSION, **header})

    # checkpoints
    def ckpt_path(self, step: int) -> Path:
        return self.ckpt_dir / f"step_{step:07d}.safetensors"

    def read_manifest(self) -> list[dict[str, Any]]:
        if not self.manifest_json.exists():
            return []
        entries = read_json(self.manifest_json)
        if not isinstance(entries, list):
            raise GeoError(f"{self.manifest_json} is corrupt (expected a list); restore it or retrain the run")
        return entries

    def manifest_entry(self, step: int, info: dict[str, Any]) -> dict[str, Any]:
        """The manifest entry of checkpoint `step` (info: that step's metrics)."""
        return {"step": step, "file": f"checkpoints/{self.ckpt_path(step).name}", **info}

    def save_checkpoint(self, step: int, state: dict[str, torch.Tensor], manifest: list[dict[str, Any]]) -> None:
        """Weights of `step`, then the manifest (which already holds the step's entry)."""
        save_tensors(self.ckpt_path(step), state, metadata={"step": str(step)})
        atomic_write_json(self.manifest_json, manifest)

    def load_checkpoint(self, step: int) -> dict[str, torch.Tensor]:
        return load_tensors(self.ckpt_path(step))


class BackgroundWriter:
    """Run-directory writes on one background thread, in the order they are submitted, so training
    goes on while checkpoints are serialised and fsync'd.

    Jobs must own their data (CPU copies of tensors, copies of lists and dicts), never live state.
    A failed job stops the queue (later writes, such as a resume state, would refer to what it
    failed to write) and its exception is raised in the caller at the next submit or on leaving the
    `with` block. Leaving the block waits for every queued write, also when the block raised (its
    own exception then wins); the thread is not a daemon, so the interpreter, too, waits for the
    queued writes before it exits. busy_s: seconds spent in jobs so far.
    """

    def __init__(self, max_pending: int = 16):
        self._jobs: queue.SimpleQueue = queue.SimpleQueue()
        self._slots = threading.BoundedSemaphore(max_pending)  # submit waits for one; each finished job frees one
        self._error: BaseException | None = None
        self.busy_s = 0.0
        self._thread = threading.Thread(target=self._work, name="geolens-writer")
        self._thread.start()

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            if self._error is None:
                t0 = time.perf_counter()
                try:
                    job()
                except BaseException as e:  # re-raised in the submitting thread
                    self._error = e
                self.busy_s += time.perf_counter() - t0
            self._slots.release()

    def _raise_failure(self) -> None:
        if self._error is not None:
            raise self._error

    def submit(self, fn: Callable[..., None], *args: Any) -> None:
        """Queue fn(*args) (blocks while max_pending jobs wait); raises an earlier job's failure."""
        self._raise_failure()
        self._slots.acquire()
        self._jobs.put(functools.partial(fn, *args))

    def __enter__(self) -> "BackgroundWriter":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self._jobs.put(None)  # never blocks, so an interrupt cannot keep the thread from ending
        self._thread.join()
        if exc_type is None:
            self._raise_failure()
