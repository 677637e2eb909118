"""Run directories on disk: atomic writes, safetensors checkpoints, JSON manifests, CSV metrics.

Layout (docs/run-format.md is the reference):
    run.json                 format, versions, resolved config, status, timing
    metrics.csv              one row per evaluation
    events.json              onset events derived from metrics.csv
    checkpoints/manifest.json, checkpoints/step_XXXXXXX.safetensors   model weights per step
    checkpoints/optim_XXXXXXX.safetensors   the optimizer state at that step (where a fork starts)
    resume.safetensors       model + AdamW state at the newest checkpoint (for --resume)
Nothing is pickled: tensors are safetensors, everything else JSON or CSV.
"""

from __future__ import annotations

import csv
import functools
import hashlib
import io
import json
import os
import platform
import queue
import stat
import struct
import subprocess
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
#: metrics columns renamed since runs first recorded them, {old name: present name} (a per-layer column keeps its
#: `_L<l>` suffix): read_metrics, forecast files and `geolens precursors --columns` read the old names as the new
RENAMED_COLUMNS = {"erank_resid": "participation_resid", "erank_mlp": "participation_mlp"}


def current_column(name: str) -> str:
    """The present name of a metrics column (RENAMED_COLUMNS), e.g. 'erank_mlp_L0' -> 'participation_mlp_L0'."""
    stem, suffix, layer = name.rpartition("_L")
    if suffix and layer.isdigit() and stem in RENAMED_COLUMNS:
        return RENAMED_COLUMNS[stem] + suffix + layer
    return RENAMED_COLUMNS.get(name, name)


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


MAX_JSON_BYTES = 256 << 20


def read_limited(path: Path, limit: int = MAX_JSON_BYTES) -> bytes:
    """The bytes of a regular file of at most `limit` bytes (ValueError otherwise: never read a device or
    an endless file whole)."""
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > limit:
            raise ValueError("not a regular file" if not stat.S_ISREG(st.st_mode) else f"{st.st_size} bytes: too large")
        return f.read(limit + 1)


def read_json(path: Path, kind: type | None = None) -> Any:
    """JSON from `path`; kind (dict or list): the top-level type it must have."""
    try:
        obj = json.loads(read_limited(path).decode("utf-8"))
    except FileNotFoundError:
        raise GeoError(f"{path} is missing; is this a geolens run directory? (create one with `geolens train`)") from None
    except IsADirectoryError:
        raise GeoError(f"{path} is a folder, not a file; restore the file or retrain the run") from None
    except UnicodeDecodeError:
        raise GeoError(f"{path} is corrupt (not UTF-8 text); restore it or retrain the run") from None
    except json.JSONDecodeError as e:
        raise GeoError(f"{path} is corrupt ({e.msg} at line {e.lineno}); restore it or retrain the run") from None
    except ValueError as e:
        raise GeoError(f"{path} is corrupt ({e}); restore it or retrain the run") from None
    if kind is not None and not isinstance(obj, kind):
        raise GeoError(f"{path} is corrupt (expected a JSON {'object' if kind is dict else 'list'}, found "
                       f"{type(obj).__name__}); restore it or retrain the run")
    return obj


def save_tensors(path: Path, tensors: dict[str, torch.Tensor], metadata: dict[str, str] | None = None) -> None:
    tensors = {k: v.detach().contiguous().cpu() for k, v in tensors.items()}
    atomic_write_bytes(path, st_save(tensors, metadata=metadata))


MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header


class CorruptTensors(ValueError):
    """A safetensors file whose header or size is not what it declares."""


def tensors_header(path: Path) -> tuple[dict[str, Any], int]:
    """(header, total size in bytes) a safetensors file declares, checked against the file: a regular
    file whose size is exactly 8 + header length + the data its tensors declare. Raises
    FileNotFoundError or CorruptTensors; reads only the header."""
    with open(path, "rb") as f:
        return _read_header(f)


def _read_header(f) -> tuple[dict[str, Any], int]:
    """tensors_header of the open binary file f (read from its start)."""
    st = os.fstat(f.fileno())
    if not stat.S_ISREG(st.st_mode):
        raise CorruptTensors("not a regular file")
    head = f.read(8)
    if len(head) < 8:
        raise CorruptTensors(f"{st.st_size} bytes: too short for a header")
    n = struct.unpack("<Q", head)[0]
    if n > min(MAX_HEADER_BYTES, st.st_size - 8):
        raise CorruptTensors(f"declares a {n}-byte header in a {st.st_size}-byte file")
    try:
        header = json.loads(f.read(n).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CorruptTensors("unreadable header") from None
    if not isinstance(header, dict):
        raise CorruptTensors("unreadable header")
    try:
        ends = [int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"]
    except (TypeError, KeyError, IndexError, ValueError):
        raise CorruptTensors("unreadable tensor table") from None
    size = 8 + n + max(ends, default=0)
    if st.st_size != size:
        raise CorruptTensors(f"{st.st_size} bytes on disk but {size} declared (truncated or overwritten)")
    return header, size


def tensors_bytes(path: Path) -> bytes:
    """The bytes of a safetensors file up to the size its header declares (checked as tensors_header
    does), through one open file: a writer replacing the path meanwhile cannot mix two versions."""
    with open(path, "rb") as f:
        _, size = _read_header(f)
        f.seek(0)
        return f.read(size)


def file_sha256(path: Path) -> str:
    """Hex SHA-256 of a safetensors file's bytes (tensors_bytes: up to the size its header declares)."""
    try:
        return hashlib.sha256(tensors_bytes(path)).hexdigest()
    except FileNotFoundError:
        raise GeoError(f"checkpoint {path} is missing; restore the file") from None
    except (CorruptTensors, OSError) as e:
        raise GeoError(f"checkpoint {path} is corrupt ({e}); restore the file") from None


def load_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of a safetensors file, reading no more than the size its header declares."""
    run = path.parent.parent if path.parent.name == "checkpoints" else path.parent
    try:
        return st_load(tensors_bytes(path))
    except FileNotFoundError:
        raise GeoError(f"checkpoint {path} is missing; `geolens repair --run {run}` drops it from the manifest "
                       "(or restore the file)") from None
    except (CorruptTensors, SafetensorError, ValueError, OSError) as e:
        raise GeoError(f"checkpoint {path} is corrupt ({e}); `geolens repair --run {run}` sets it aside "
                       "(or restore the file)") from None


# ---- metrics table ---------------------------------------------------------------------------
def write_metrics(path: Path, rows: list[dict[str, float]]) -> None:
    """metrics.csv: the METRIC_COLUMNS every row has, then any further column (the precursor columns,
    geolens.training.precursor_columns) in the order rows first name them, empty where a row lacks it
    (a run resumed across versions)."""
    extra = list(dict.fromkeys(k for row in rows for k in row if k not in METRIC_COLUMNS))
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=[*METRIC_COLUMNS, *extra], lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: repr(v) if isinstance(v, float) else v for k, v in row.items()})
    atomic_write_bytes(path, buf.getvalue().encode())


def read_metrics(path: Path) -> list[dict[str, float]]:
    """metrics.csv's rows: every METRIC_COLUMNS value (a GeoError if one is missing or not a number),
    and the further columns a row has a value in (floats; NaN where a config skips one), under their present
    names (a record of an earlier version may carry an old one: RENAMED_COLUMNS)."""
    try:
        reader = csv.DictReader(io.StringIO(read_limited(path).decode("utf-8"), newline=""))
        if reader.fieldnames:
            reader.fieldnames = [current_column(k) for k in reader.fieldnames]
        rows = list(reader)
        out = [{k: (int(r[k]) if k == "epoch" else float(r[k])) for k in METRIC_COLUMNS} for r in rows]
        for row, r in zip(out, rows):
            row.update({k: float(v) for k, v in r.items() if k not in row and v not in ("", None)})
    except FileNotFoundError:
        raise GeoError(f"{path} is missing; the run has not recorded an evaluation yet") from None
    except (KeyError, ValueError, TypeError, UnicodeDecodeError, csv.Error) as e:
        raise GeoError(f"{path} is corrupt ({type(e).__name__}: {e}); restore it or retrain the run") from None
    epochs = [r["epoch"] for r in out]
    if any(b <= a for a, b in zip(epochs, epochs[1:])):
        raise GeoError(f"{path} is corrupt (epochs not in increasing order); restore it or retrain the run")
    return out


# ---- run directory ---------------------------------------------------------------------------
#: what a record's commit covers besides the package's folder, relative to it: the same paths as
#: analyses/clean_tree.sh (the experiment scripts and the build's pins)
SOURCE_SIBLINGS = ("../analyses", "../pyproject.toml")


def source_commit() -> str | None:
    """The git commit of the geolens source this process runs: git_commit of the package's folder, "+dirty" also
    when analyses/ or pyproject.toml differ from it (SOURCE_SIBLINGS)."""
    return git_commit(Path(__file__).resolve().parents[1] / "__init__.py", SOURCE_SIBLINGS)


@functools.cache
def git_commit(file: Path, also: tuple[str, ...] = ()) -> str | None:
    """"<sha>" of the commit `file` is tracked in ("<sha>+dirty" when files of its folder, or the paths `also`
    (relative to that folder), differ from that commit), or None when `file` is not tracked by git (e.g. an
    installed wheel, or a package inside a git checkout's ignored virtual environment) or git is not available."""

    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", "-C", str(file.parent), *args], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    if git("ls-files", "--error-unmatch", file.name) is None:
        return None
    sha, changes = git("rev-parse", "HEAD"), git("status", "--porcelain", "--", ".", *also)
    if sha is None or changes is None:
        return None
    return sha + ("+dirty" if changes else "")


def package_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"python": platform.python_version()}
    for name in ("geolens", "torch", "transformer-lens", "numpy", "safetensors"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = "missing"
    return out


def machine(device: torch.device) -> dict[str, str | int]:
    """What sets a run's float order besides the code and the versions: the CPU (its model name and the
    vector instruction set torch's kernels use), torch's intra-op thread count and, when training on a
    GPU, its name. The same seed on another machine trains in another float order (grokking onsets move
    with it: docs/reproduction.md)."""
    cpu = platform.processor() or platform.machine()
    try:
        names = [line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                 if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    out: dict[str, str | int] = {"cpu": cpu, "cpu_capability": torch.backends.cpu.get_cpu_capability(),
                                 "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        out["gpu"] = torch.cuda.get_device_name(device)
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
        """Whether the folder holds anything (a lock file and write temporaries do not count)."""
        from geolens.runs.runlock import holds_data

        return self.path.is_dir() and holds_data(self.path)

    def read_header(self) -> dict[str, Any]:
        """run.json, checked for format, version and a config object."""
        if not self.path.is_dir():
            raise GeoError(f"run directory {self.path} does not exist; train one with `geolens train --out {self.path}`")
        header = read_json(self.run_json, dict)
        if header.get("format") != FORMAT:
            raise GeoError(f"{self.run_json} is not a geolens run file (format {header.get('format')!r}); "
                           "point --run at a folder written by `geolens train`")
        if header.get("format_version") != FORMAT_VERSION:
            raise GeoError(
                f"{self.path} was written in run format {header.get('format_version')} but this geolens reads format "
                f"{FORMAT_VERSION}; use the geolens version recorded in run.json ({header.get('versions', {}).get('geolens')})"
            )
        if not isinstance(header.get("config"), dict):
            raise GeoError(f"{self.run_json} is corrupt (no 'config' object); restore it or retrain the run")
        return header

    def write_header(self, header: dict[str, Any]) -> None:
        atomic_write_json(self.run_json, {"format": FORMAT, "format_version": FORMAT_VERSION, **header})

    # checkpoints
    def ckpt_path(self, step: int) -> Path:
        return self.ckpt_dir / f"step_{step:07d}.safetensors"

    def optim_path(self, step: int) -> Path:
        """The AdamW state (opt.<param>.<key> tensors) at checkpoint `step`: what a fork at `step` continues with."""
        return self.ckpt_dir / f"optim_{step:07d}.safetensors"

    def read_manifest(self) -> list[dict[str, Any]]:
        """The manifest's entries, checked: objects with an integer `step` (ascending, no repeats) and
        the `file` of that step. Missing manifest: []."""
        if not self.manifest_json.exists():
            return []
        entries = read_json(self.manifest_json, list)
        last = -1
        for e in entries:
            step = e.get("step") if isinstance(e, dict) else None
            if type(step) is not int or step <= last or e.get("file") != f"checkpoints/{self.ckpt_path(step).name}":
                raise GeoError(f"{self.manifest_json} is corrupt (entry {e!r:.80}); `geolens repair --run {self.path}` "
                               "rebuilds it from the checkpoint files")
            last = step
        return entries

    def checkpoint_files(self) -> dict[int, Path]:
        """{step: path} of the step_XXXXXXX.safetensors files on disk, listed or not."""
        if not self.ckpt_dir.is_dir():
            return {}
        out = {}
        for f in self.ckpt_dir.glob("step_*.safetensors"):
            digits = f.name[len("step_") : -len(".safetensors")]
            if digits.isdigit():
                out[int(digits)] = f
        return dict(sorted(out.items()))

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
