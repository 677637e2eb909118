"""Who may write a run directory: an exclusive lock held for the life of a writer, and claiming a
folder for a new run (with `--force`, the new run is built beside the old one and swapped in once
it has started).

The lock is an advisory `fcntl.flock` on DIR/.geolens.lock, which also records the holder (pid,
host, command, start time) for the error a second writer gets. The kernel drops a flock when its
process dies, so the lock of a killed writer is free at once and the next writer takes it over
(its record is overwritten). Where a filesystem has no flock, the record alone decides: a live
process on the same host holds the lock, a dead one's record is taken over.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import errno
import fcntl
import json
import os
import shutil
import socket
import sys
import time
from pathlib import Path

from geolens.errors import GeoError

LOCK_NAME = ".geolens.lock"

# what a geolens run directory may hold (top-level names; `.<name>.<random>` are atomic-write temporaries)
RUN_FILES = {"run.json", "metrics.csv", "events.json", "resume.safetensors", "checkpoints", "analysis", LOCK_NAME}
_STAGING, _RETIRED = "geolens-new", "geolens-old"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class RunLock:
    """Exclusive lock on one directory (`with RunLock(path, purpose):` or acquire()/release()).

    purpose: what the holder does ("train", "resume", "analyze"), shown to a refused writer.
    A refused acquire raises GeoError naming the holding process.
    """

    def __init__(self, folder: str | Path, purpose: str,
                 unwritable_fix: str = "the folder must be writable: copy the run somewhere writable"):
        self.folder = Path(folder)
        self.file = self.folder / LOCK_NAME
        self.purpose = purpose
        self.unwritable_fix = unwritable_fix
        self._fd: int | None = None

    def acquire(self) -> "RunLock":
        try:
            fd = os.open(self.file, os.O_RDWR | os.O_CREAT, 0o666)
        except OSError as e:
            raise GeoError(f"cannot lock {self.folder} for {self.purpose} ({e.strerror}); {self.unwritable_fix}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise GeoError(f"{self.folder} is in use by {self._holder_text()}; wait for it to finish or stop "
                           "that process, then retry") from None
        except OSError as e:
            if e.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                os.close(fd)
                raise
            holder = self._holder()  # no flock here: the record decides
            if holder and holder.get("host") == socket.gethostname() and holder.get("pid") != os.getpid() \
                    and _pid_alive(int(holder.get("pid", 0))):
                os.close(fd)
                raise GeoError(f"{self.folder} is in use by {self._holder_text()}; wait for it to finish or stop "
                               "that process, then retry") from None
        record = {"pid": os.getpid(), "host": socket.gethostname(), "purpose": self.purpose,
                  "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]])[:300],
                  "since": time.strftime("%Y-%m-%d %H:%M:%S")}
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            try:
                os.ftruncate(self._fd, 0)  # an empty record: nobody holds it
            except OSError:
                pass
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def _holder(self) -> dict | None:
        try:
            record = json.loads(self.file.read_text())
        except (OSError, ValueError):
            return None
        return record if isinstance(record, dict) else None

    def _holder_text(self) -> str:
        h = self._holder()
        if not h:
            return "another process"
        return f"process {h.get('pid')} on {h.get('host')} ({h.get('purpose')}: {h.get('command')}, since {h.get('since')})"

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def live_holder(folder: str | Path) -> dict | None:
    """The record of the process that holds `folder`'s lock, if it is alive (on another host: taken as alive);
    None when nobody holds it or its holder died (a killed writer leaves its record). Only reads."""
    record = RunLock(folder, "")._holder()
    if not record or "pid" not in record:
        return None
    if record.get("host") != socket.gethostname():
        return record
    return record if isinstance(record["pid"], int) and _pid_alive(record["pid"]) else None


# ---- claiming a folder for a new run ---------------------------------------------------------
def _is_temporary(name: str) -> bool:
    return name.startswith(".") and name != LOCK_NAME


def foreign_entries(folder: Path) -> list[str]:
    """Top-level names in `folder` that a geolens run directory never holds (temporaries excluded)."""
    return sorted(n for n in os.listdir(folder) if n not in RUN_FILES and not _is_temporary(n))


def holds_data(folder: Path) -> bool:
    """Whether `folder` holds anything but a lock file and write temporaries."""
    return any(not _is_temporary(n) and n != LOCK_NAME for n in os.listdir(folder))


def _exchange(a: Path, b: Path) -> bool:
    """Atomically swap two paths (Linux renameat2 RENAME_EXCHANGE); False where unsupported."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
        renameat2 = libc.renameat2
    except (OSError, AttributeError, TypeError):
        return False
    AT_FDCWD, RENAME_EXCHANGE = -100, 2
    if renameat2(AT_FDCWD, os.fsencode(a), AT_FDCWD, os.fsencode(b), RENAME_EXCHANGE) == 0:
        return True
    if ctypes.get_errno() in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
        return False
    raise OSError(ctypes.get_errno(), os.strerror(ctypes.get_errno()), str(a))


class NewRunClaim:
    """A folder claimed for a new run (a context manager): `path` is where the run is written.

    Without an existing run, `path` is the target folder itself (created if needed, locked). With
    force over an existing run, the old run stays locked and untouched while the new one is
    written to a hidden sibling; started() (called once the new run's first checkpoint is on
    disk) swaps the two and removes the old run. Leaving the block with an error before started()
    removes what the claim wrote (the sibling, or the target folder if the claim created it) and
    leaves any old run as it was.
    """

    def __init__(self, target: str | Path, force: bool, purpose: str = "train"):
        self.target = Path(target)
        self.force = force
        self.purpose = purpose
        self.path = self.target
        self.is_started = False
        self._locks: list[RunLock] = []
        self._old_lock: RunLock | None = None
        self._created = False

    def __enter__(self) -> "NewRunClaim":
        try:
            self._claim()
        except BaseException:
            self.release()
            raise
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and not self.is_started:
            self._abandon()
        self.release()

    @property
    def replacing(self) -> bool:
        return self.path != self.target

    def _claim(self) -> None:
        target = self.target
        if target.exists() and not target.is_dir():
            raise GeoError(f"--out {target} exists and is not a directory; choose another --out")
        self._created = not target.exists()
        try:
            target.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise GeoError(f"cannot create {target} ({e.strerror}); choose a writable --out") from None
        lock = RunLock(target, self.purpose).acquire()
        self._locks.append(lock)
        if not holds_data(target):
            return
        if not self.force:
            how = ("use --force to replace it (a fork in it continues with `geolens train --resume --out "
                   f"{target}`)" if self.purpose == "fork" else "use --resume to continue it, --force to replace it")
            raise GeoError(f"run directory {target} already exists; {how}, or choose another --out")
        foreign = foreign_entries(target)
        if foreign or not (target / "run.json").is_file():
            what = ", ".join(foreign[:5]) + (" ..." if len(foreign) > 5 else "") if foreign else "no run.json"
            raise GeoError(f"--force refused: {target} holds more than a geolens run ({what}); move those files "
                           "or choose another --out")
        self._old_lock = lock
        self._remove_stale_siblings()
        staging = target.parent / f".{target.name}.{_STAGING}-{os.getpid()}"
        staging.mkdir()
        self._locks.append(RunLock(staging, self.purpose).acquire())
        self.path = staging

    def _remove_stale_siblings(self) -> None:
        """Hidden siblings left by a killed replacement whose process is gone (never the target)."""
        for pattern in (_STAGING, _RETIRED):
            for sib in self.target.parent.glob(f".{self.target.name}.{pattern}-*"):
                pid = sib.name.rsplit("-", 1)[-1]
                if pid.isdigit() and not _pid_alive(int(pid)):
                    shutil.rmtree(sib, ignore_errors=True)

    def started(self) -> None:
        """The new run's first checkpoint is on disk: when replacing, swap it into the target
        folder and remove the old run (`path` becomes the target). Idempotent."""
        if self.is_started:
            return
        if not self.replacing:
            self.is_started = True
            return
        staging, target = self.path, self.target
        retired = target.parent / f".{target.name}.{_RETIRED}-{os.getpid()}"
        if _exchange(staging, target):
            os.rename(staging, retired)  # the old run, now at the staging name
        else:
            os.rename(target, retired)
            os.rename(staging, target)
        self.path = target
        self.is_started = True
        self._old_lock.release()
        self._locks.remove(self._old_lock)
        shutil.rmtree(retired, ignore_errors=True)

    def _abandon(self) -> None:
        if self.replacing:
            shutil.rmtree(self.path, ignore_errors=True)
            self.path = self.target
        elif self._created:
            shutil.rmtree(self.target, ignore_errors=True)
        else:  # a folder the user made: remove only what the run wrote
            for name in RUN_FILES - {LOCK_NAME}:
                f = self.target / name
                shutil.rmtree(f, ignore_errors=True) if f.is_dir() else f.unlink(missing_ok=True)

    def release(self) -> None:
        for lock in self._locks:
            lock.release()
        self._locks.clear()
