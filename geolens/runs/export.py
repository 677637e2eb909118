"""`geolens export`: a trimmed copy of a finished run, for shipping a trajectory (analysis only).

The copy holds run.json (plus a "trimmed" record: source, checkpoint counts, date), metrics.csv and
events.json whole, and only the chosen checkpoints with their manifest entries (epoch 0 and the
last checkpoint always kept, so the copy spans the whole run). It has no resume.safetensors (it
cannot be continued) and no analysis/ (run `geolens analyze` on it). It passes the consistency
checks of `geolens info` (docs/run-format.md, "Trimmed runs").
"""

from __future__ import annotations

import os
import shutil
from datetime import datetime, timezone
from pathlib import Path
from typing import Sequence

from geolens.errors import GeoError
from geolens.runs.integrity import problems
from geolens.runs.run import Run
from geolens.runs.storage import RunDir, atomic_write_bytes, atomic_write_json, tensors_bytes


def kept_steps(run: Run, steps: Sequence[int]) -> list[int]:
    """`steps` with the run's first and last checkpoint, ascending; every step must be a checkpoint."""
    listed = run.steps
    if not listed:
        raise GeoError(f"{run.path} has no checkpoints to export; train it first")
    missing = [s for s in steps if s not in listed]
    if missing:
        near = ", ".join(f"{s} -> {run.nearest_step(s)}" for s in missing if listed[0] <= s <= listed[-1])
        raise GeoError(f"epoch(s) {missing} are not checkpoints of {run.path}" + (f" (nearest: {near})" if near else "")
                       + "; pass checkpointed epochs (see checkpoints/manifest.json)")
    return sorted({listed[0], *steps, listed[-1]})


def export_run(src: str | Path, out: str | Path, steps: Sequence[int]) -> Path:
    """Write the trimmed copy of the finished, consistent run `src` into the new folder `out`, keeping
    the checkpoints `steps` (plus the first and the last). The copy is built in a hidden sibling and
    renamed into place, so `out` either appears whole or not at all. Returns `out`."""
    run, out = Run(src), Path(out)
    if run.header.get("status") != "finished":
        raise GeoError(f"{run.path} is not finished (status {run.header.get('status')!r}); export a finished run")
    damage = problems(run.dir)
    if damage:
        raise GeoError(f"{run.path} is not consistent: {damage[0]}")
    keep = kept_steps(run, steps)
    if out.exists() or out.is_symlink():
        raise GeoError(f"{out} already exists; export writes a new folder: choose another --out or remove it")
    staging = out.parent / f".{out.name}.geolens-export-{os.getpid()}"
    try:
        dst = RunDir(staging)
        for step in keep:  # exactly the bytes the checkpoint's header declares
            atomic_write_bytes(dst.ckpt_path(step), tensors_bytes(run.checkpoint_file(step)))
        atomic_write_json(dst.manifest_json, [m for m in run.manifest if m["step"] in keep])
        for name in ("metrics.csv", "events.json"):
            atomic_write_bytes(staging / name, (run.path / name).read_bytes())
        header = {k: v for k, v in run.header.items() if k not in ("format", "format_version")}
        if "fork" in header:  # a fork's copy holds its parent's checkpoints itself
            header["fork"] = {k: v for k, v in header["fork"].items() if k != "parent_checkpoints"}
        header["trimmed"] = {"source": str(src), "source_checkpoints": len(run.steps), "checkpoints": len(keep),
                             "date": datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")}
        dst.write_header(header)
        left = problems(dst)
        if left:
            raise GeoError(f"the trimmed copy of {run.path} is not consistent ({left[0]}); report this as a bug")
        os.rename(staging, out)
    except OSError as e:
        raise GeoError(f"cannot write the trimmed copy to {out} ({e.strerror}); choose a writable --out") from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return out

