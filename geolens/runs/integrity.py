"""Consistency of a run directory, and the repairs that are exact.

A run's files must agree (docs/run-format.md "Consistency"): every manifest entry's checkpoint
exists and is whole; every checkpoint up to the resume state's epoch E is in the manifest, and E
is its last step; metrics.csv has a row at epoch 0, at E, at every checkpoint, and no gap wider
than eval_every before E; a finished run ends at the same epoch in metrics.csv, the manifest and
events.json.
A trimmed run (run.json has "trimmed": written by `geolens export`, a shipped trajectory) holds a
subset of its source's checkpoints and no resume state: resume.safetensors is not required, and
metrics.csv must be whole up to its last checkpoint instead of the resume epoch.

`problems(run)` lists what disagrees (one line each, with the fix); `geolens info` shows them.
`repair(run)` does what can be done exactly: the manifest is rebuilt from the checkpoint files and
metrics.csv (its entries are copies of metrics rows), damaged checkpoints are moved to
checkpoints/damaged/ (never deleted), events.json is recomputed from metrics.csv. What cannot be
rebuilt exactly (lost metrics rows, a lost resume state) is refused with the fix.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from geolens.errors import GeoError
from geolens.runs.events import finish_events
from geolens.runs.storage import (
    CorruptTensors,
    RunDir,
    atomic_write_json,
    load_tensors,
    read_json,
    read_metrics,
    tensors_header,
)

MANIFEST_METRICS = ("train_loss", "train_acc", "test_loss", "test_acc")


@dataclass
class Survey:
    """What is on disk in a run directory, and what disagrees (see the module docstring)."""

    header: dict
    eval_every: int
    rows: list[dict] | None  # None: metrics.csv missing or unreadable
    manifest: list[dict] | None  # None: manifest unreadable ([] when missing)
    files: dict[int, Path]  # checkpoint files on disk
    damaged: dict[int, str]  # step -> why its file is not a whole checkpoint
    resume_epoch: int | None
    problems: list[str] = field(default_factory=list)
    repairable: bool = True  # every problem is fixed exactly by repair()


def survey(run: RunDir) -> Survey:
    """Read everything a consistency check needs (headers of checkpoints only) and list the problems."""
    header = run.read_header()
    cfg = header["config"]
    fix = f"`geolens repair --run {run.path}`"
    s = Survey(header, int(cfg.get("eval_every", 1)), None, None, run.checkpoint_files(), {}, None)

    def bad(problem: str, remedy: str, repairable: bool = True) -> None:
        s.problems.append(f"{problem}; {remedy}")
        s.repairable &= repairable

    try:
        s.rows = read_metrics(run.metrics_csv)
    except GeoError as e:
        if run.metrics_csv.exists() or run.resume_file.exists():
            bad(str(e).split(";")[0], "restore metrics.csv from a backup (it cannot be rebuilt), or retrain with --force",
                False)
    try:
        s.manifest = run.read_manifest()
    except GeoError:
        bad(f"{run.manifest_json} is corrupt", f"{fix} rebuilds it from the checkpoint files")
    for step, path in s.files.items():
        try:
            meta = tensors_header(path)[0].get("__metadata__", {})
            if meta.get("step", str(step)) != str(step):
                s.damaged[step] = f"its metadata says step {meta.get('step')}"
        except (CorruptTensors, OSError) as e:
            s.damaged[step] = str(e)
    if run.resume_file.exists():
        try:
            s.resume_epoch = int(load_tensors(run.resume_file)["epoch"].item())
        except (GeoError, KeyError, RuntimeError, ValueError):
            bad(f"{run.resume_file} is corrupt", "the run cannot be resumed: retrain with --force (its checkpoints "
                "can still be analysed)", False)
    elif (s.files or s.rows) and "trimmed" not in header:
        bad(f"{run.resume_file} is missing", "the run cannot be resumed: retrain with --force (its checkpoints can "
            "still be analysed)", False)

    fork = header.get("fork")
    if isinstance(fork, dict) and "parent_checkpoints" in fork and not (Path(fork["parent"]) / "run.json").is_file():
        bad(f"its parent {fork['parent']}, whose checkpoints before epoch {fork['step']} this fork reads, is missing "
            "(moved or deleted)", "restore the parent at that path (the fork's own epochs are still readable)", False)
    listed = [m["step"] for m in s.manifest or []]
    for step in listed:
        if step not in s.files:
            bad(f"checkpoint {step} is listed in the manifest but its file is missing",
                f"{fix} drops it from the manifest (or restore the file)")
    for step, why in s.damaged.items():
        bad(f"checkpoint {step} is damaged ({why})", f"{fix} moves it to checkpoints/damaged/ (or restore the file)")
    end = s.resume_epoch if s.resume_epoch is not None else (listed[-1] if listed else -1)
    unlisted = [k for k in s.files if k <= end and k not in listed and k not in s.damaged]
    if s.manifest is not None and unlisted:
        bad(f"{len(unlisted)} checkpoint file(s) up to epoch {end} are not in the manifest (steps "
            f"{_few(unlisted)})", f"{fix} rebuilds the manifest from the checkpoint files")
    if s.resume_epoch is not None and s.resume_epoch not in listed and s.resume_epoch in s.files and not unlisted:
        bad(f"the resume state is at epoch {s.resume_epoch} but the manifest does not list that checkpoint",
            f"{fix} rebuilds the manifest")
    last = s.resume_epoch if "trimmed" not in header else (listed[-1] if listed else None)
    if s.rows is not None and last is not None:
        gap = _metrics_gap(s.rows, last, [k for k in s.files if k <= last], s.eval_every)
        if gap:
            bad(f"metrics.csv is incomplete ({gap})", "restore metrics.csv from a backup (it cannot be rebuilt from "
                "the checkpoints), or retrain with --force", False)
    if header.get("status") == "finished" and s.rows:
        final = s.rows[-1]["epoch"]
        try:
            events = read_json(run.events_json, dict)
            if events.get("final_epoch") != final:
                bad(f"events.json says the run ended at epoch {events.get('final_epoch')} but metrics.csv at {final}",
                    f"{fix} recomputes events.json from metrics.csv")
        except GeoError:
            bad(f"{run.events_json} is missing or corrupt", f"{fix} recomputes it from metrics.csv")
    return s


def _few(steps: list[int]) -> str:
    return ", ".join(map(str, steps[:6])) + (", ..." if len(steps) > 6 else "")


def _metrics_gap(rows: list[dict], epoch: int, steps: list[int], eval_every: int) -> str | None:
    """Why rows up to `epoch` are not a whole evaluation record (None if they are)."""
    epochs = [r["epoch"] for r in rows if r["epoch"] <= epoch]
    if not epochs:
        return f"no rows up to epoch {epoch}, where the resume state is"
    missing = [e for e in {0, epoch, *steps} if e not in set(epochs)]
    if missing:
        return f"no row at epoch(s) {_few(sorted(missing))}, which the checkpoints and resume state need"
    wide = next(((a, b) for a, b in zip(epochs, epochs[1:]) if b - a > eval_every), None)
    if wide:
        return f"rows jump from epoch {wide[0]} to {wide[1]} though the run evaluates every {eval_every} epochs"
    return None


def problems(run: RunDir) -> list[str]:
    """One line per inconsistency of the run directory ('problem; fix'); [] when it is whole."""
    return survey(run).problems


def rebuilt_manifest(run: RunDir, s: Survey) -> list[dict]:
    """The manifest the checkpoint files and metrics.csv imply: every whole checkpoint up to the resume
    epoch that has a metrics row (what the training loop wrote, in step order)."""
    rows = {r["epoch"]: r for r in s.rows or []}
    end = s.resume_epoch if s.resume_epoch is not None else max(s.files, default=-1)
    return [run.manifest_entry(k, {m: rows[k][m] for m in MANIFEST_METRICS})
            for k in s.files if k <= end and k not in s.damaged and k in rows]


def repair(run: RunDir) -> list[str]:
    """Make the run directory consistent where that is exact; returns what was done (one line each).
    Raises GeoError naming what cannot be repaired."""
    s = survey(run)
    if not s.problems:
        return []
    if not s.repairable:
        lost = [p for p in s.problems if "cannot" in p]
        raise GeoError(f"{run.path} cannot be repaired exactly: {lost[0]}")
    done = []
    if s.damaged:
        (run.ckpt_dir / "damaged").mkdir(exist_ok=True)
        for step in s.damaged:
            path = s.files[step]
            path.rename(run.ckpt_dir / "damaged" / path.name)
            done.append(f"moved damaged checkpoint {step} to checkpoints/damaged/{path.name}")
        s = survey(run)
    manifest = rebuilt_manifest(run, s)
    if manifest != s.manifest:
        atomic_write_json(run.manifest_json, manifest)
        done.append(f"rebuilt checkpoints/manifest.json from {len(manifest)} checkpoint files and metrics.csv")
    if s.header.get("status") == "finished" and s.rows:
        events = finish_events(s.rows, s.header.get("stop_reason", "completed"), s.eval_every)
        try:
            current = read_json(run.events_json, dict)
        except GeoError:
            current = None
        if current != events:
            atomic_write_json(run.events_json, events)
            done.append("recomputed events.json from metrics.csv")
    return done


def resume_point(run: RunDir, epoch: int) -> tuple[list[dict], list[dict], list[str]]:
    """(metrics rows, manifest) to continue a run whose resume state is at `epoch`, and notes on what was
    rebuilt. Refuses (GeoError) when the record up to `epoch` is not whole and cannot be rebuilt exactly."""
    s = survey(run)
    if s.rows is None:
        raise GeoError(f"{run.metrics_csv} is missing or corrupt; restore it from a backup (it cannot be rebuilt), or "
                       "retrain with --force")
    gap = _metrics_gap(s.rows, epoch, [k for k in s.files if k <= epoch], s.eval_every)
    if gap:
        raise GeoError(f"{run.metrics_csv} is incomplete ({gap}); restore it from a backup (it cannot be rebuilt "
                       "from the checkpoints), or retrain with --force")
    notes = []
    manifest = [m for m in s.manifest or [] if m["step"] <= epoch]
    rebuilt = rebuilt_manifest(run, s)
    if manifest != rebuilt:
        manifest = rebuilt
        notes.append(f"rebuilt checkpoints/manifest.json from {len(rebuilt)} checkpoint files and metrics.csv "
                     f"(it disagreed with the files on disk)")
    return [r for r in s.rows if r["epoch"] <= epoch], manifest, notes
