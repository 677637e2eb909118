"""Full-batch AdamW training with evaluation, onset events and dense checkpoint trajectories.

Epoch e means "after e optimizer steps". At every evaluated epoch the training forward of that
state gives the train loss/accuracy and the gradient norm, a no-grad forward gives the test
metrics. A checkpoint (weights) is written when the schedule asks; the resume state (weights +
AdamW state) is rewritten at every checkpoint so `resume` continues bit-identically. The files are
written by a BackgroundWriter from snapshots taken at the checkpoint, while training goes on.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from geolens.config import GeoConfig
from geolens.engine import make_optimizer, out_of_memory_as_error, preflight, select_forward, synchronize, training_device
from geolens.errors import GeoError, warn
from geolens.integrity import resume_point
from geolens.model import GeoTransformer
from geolens.progress_bar import EpochProgress, run_stats
from geolens.recording import (
    early_stop_due,
    finish_run,
    from_resume_state,
    mark_started,
    metrics_row,
    onset_events,
    optimizer_tensors,
    run_header,
    squared_norms,
    write_checkpoint,
)
from geolens.runlock import NewRunClaim, RunLock
from geolens.schedule import parse_schedule
from geolens.storage import BackgroundWriter, RunDir, atomic_write_json, load_tensors
from geolens.tasks import make_dataset

RESUMABLE_FIELDS = ("epochs", "early_stop_after", "device")


# ---- the loop --------------------------------------------------------------------------------
@dataclass
class TrainResult:
    path: Path
    rows: list[dict]
    events: dict
    engine: str


def train(cfg: GeoConfig, out: str | Path, force: bool = False, progress: bool = True) -> TrainResult:
    """Train a new run into `out` (refused if it exists, unless force: then the new run is built beside
    the old one, which is replaced only once the new run's first checkpoint is written)."""
    dev = training_device(cfg)
    engine = preflight(cfg, dev)
    with NewRunClaim(out, force) as claim, out_of_memory_as_error(cfg, engine):
        model = GeoTransformer(cfg).to(dev)  # initialised on the CPU: the same init on every device
        opt = make_optimizer(model)
        return _loop(RunDir(claim.path), model, opt, start=0, rows=[], manifest=[], progress=progress, claim=claim)


def resume(out: str | Path, progress: bool = True, **changes) -> TrainResult:
    """Continue a run from its resume state; only `epochs`, `early_stop_after` and `device` may change.
    The run directory is locked for the whole run; an inconsistent one is refused, except that a
    manifest that disagrees with the checkpoint files is rebuilt from them (exactly; a warning says so)."""
    run = RunDir(out)
    header = run.read_header()
    bad = sorted(set(changes) - set(RESUMABLE_FIELDS))
    if bad:
        raise GeoError(f"--resume cannot change {bad}; only {list(RESUMABLE_FIELDS)} may change (start a new run instead)")
    cfg = GeoConfig.from_dict({**header["config"], **changes})
    dev = training_device(cfg)
    engine = preflight(cfg, dev)
    with RunLock(run.path, "resume"), out_of_memory_as_error(cfg, engine):
        if not run.resume_file.exists():
            raise GeoError(f"{run.resume_file} is missing: the run has no checkpoint to resume from; retrain with --force")
        state = load_tensors(run.resume_file)
        step = int(state["epoch"].item())
        if step >= cfg.epochs:
            raise GeoError(f"{run.path} is already at epoch {step}; pass --epochs N with N > {step} to extend it")
        rows, manifest, notes = resume_point(run, step)
        for note in notes:
            warn(note)
        if notes:
            atomic_write_json(run.manifest_json, manifest)
        model, opt = from_resume_state(cfg, state, dev)
        return _loop(run, model, opt, start=step, rows=rows, manifest=manifest, progress=progress, resumed=True)


def _loop(run: RunDir, model, opt, start: int, rows: list, manifest: list, progress: bool, resumed: bool = False,
          claim: NewRunClaim | None = None):
    cfg = model.cfg
    torch.manual_seed(cfg.seed)
    data = make_dataset(cfg)
    dev = next(model.parameters()).device
    train_x, train_y, test_x, test_y = (t.to(dev) for t in (*data.train, *data.test))
    engine, forward, why = select_forward(model)
    schedule = parse_schedule(cfg.checkpoints)
    last_ckpt = manifest[-1] if manifest else None
    header = run_header(cfg, engine, why, len(train_y), len(test_y))
    prev_timing = run.read_header().get("timing", {}) if resumed else {}
    timing = {"train_s": prev_timing.get("train_s", 0.0), "eval_s": prev_timing.get("eval_s", 0.0),
              "ckpt_s": prev_timing.get("ckpt_s", 0.0), "write_s": prev_timing.get("write_s", 0.0),
              "epochs_timed": prev_timing.get("epochs_timed", 0)}
    run.write_header({**header, "timing": timing})
    bar = EpochProgress(cfg.epochs, start, enabled=progress, label=f"{cfg.preset or cfg.norm} {cfg.task} p={cfg.p}")
    stop_reason = "completed"
    t_start = time.perf_counter() - (rows[-1]["elapsed_s"] if rows else 0.0)
    epoch = start
    with BackgroundWriter() as writer, bar:
        while True:
            t0 = time.perf_counter()
            logits = forward(train_x)
            loss = F.cross_entropy(logits, train_y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            evaluate = (epoch % cfg.eval_every == 0 or epoch == cfg.epochs) and not (resumed and epoch == start)
            if evaluate:
                synchronize(dev)  # the queued training work counts as training time
            t1 = time.perf_counter()
            timing["train_s"] += t1 - t0
            if evaluate:
                row = _evaluate(model, forward, epoch, loss, logits, train_y, test_x, test_y, t1 - t_start)
                rows.append(row)
                t2 = time.perf_counter()
                timing["eval_s"] += t2 - t1
                events = onset_events(rows)
                done = epoch >= cfg.epochs
                if early_stop_due(cfg, epoch, events):
                    done, stop_reason = True, "early_stop"
                if done or schedule.wants(epoch, last_ckpt, row):
                    _checkpoint(writer, run, model, opt, epoch, rows, manifest, events, header, timing)
                    if claim is not None and last_ckpt is None:
                        writer.submit(mark_started, claim, run)
                    last_ckpt = manifest[-1]
                timing["ckpt_s"] += time.perf_counter() - t2
                bar.update(epoch, run_stats(row))
                if done:
                    break
            t3 = time.perf_counter()
            opt.step()
            timing["train_s"] += time.perf_counter() - t3
            timing["epochs_timed"] += 1
            epoch += 1
        events = finish_run(writer, run, header, rows, start, stop_reason, cfg.eval_every, timing)
    return TrainResult(run.path, rows, events, engine)


@torch.no_grad()
def _evaluate(model, forward, epoch, loss, logits, train_y, test_x, test_y, elapsed) -> dict:
    """The metrics row of this epoch (one device-to-host transfer for all of it)."""
    test_logits = forward(test_x)
    stats = torch.stack([loss.detach(), (logits.argmax(-1) == train_y).float().mean(), F.cross_entropy(test_logits, test_y),
                         (test_logits.argmax(-1) == test_y).float().mean(),
                         torch.maximum(logits.abs().max(), test_logits.abs().max())])
    return metrics_row(epoch, stats.tolist(), squared_norms(model).tolist(), elapsed)


def _checkpoint(writer, run: RunDir, model, opt, epoch, rows, manifest, events, header, timing) -> None:
    write_checkpoint(writer, run, model.state_dict(), optimizer_tensors(model, opt), epoch, rows, manifest, events,
                     header, timing, model.cfg.eval_every)
