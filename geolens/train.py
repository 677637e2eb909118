"""Full-batch AdamW training with evaluation, onset events and dense checkpoint trajectories.

Epoch e means "after e optimizer steps". At every evaluated epoch the training forward of that
state gives the train loss/accuracy and the gradient norm, a no-grad forward gives the test
metrics. A checkpoint (weights) is written when the schedule asks; the resume state (weights +
AdamW state) is rewritten at every checkpoint so `resume` continues bit-identically. The files are
written by a BackgroundWriter from snapshots taken at the checkpoint, while training goes on.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from geolens.config import GeoConfig, training_warnings
from geolens.errors import GeoError, warn
from geolens.integrity import resume_point
from geolens.model import GeoTransformer
from geolens.progress_bar import EpochProgress, run_stats
from geolens.resources import check_fits, is_out_of_memory, out_of_memory_error
from geolens.runlock import NewRunClaim, RunLock
from geolens.schedule import parse_schedule
from geolens.storage import (
    BackgroundWriter,
    RunDir,
    atomic_write_json,
    load_tensors,
    package_versions,
    save_tensors,
    write_metrics,
)
from geolens.tasks import make_dataset

ONSET_ACC = 0.95
SUSTAINED_ACC = 0.99
RESUMABLE_FIELDS = ("epochs", "early_stop_after", "device")


# ---- device and engine selection ----------------------------------------------------------
def training_device(cfg: GeoConfig) -> torch.device:
    """cfg.device as a torch.device; a GeoError if it names a GPU torch cannot see here."""
    dev = torch.device(cfg.device)
    if dev.type == "cuda" and (dev.index or 0) >= torch.cuda.device_count():
        raise GeoError(f"device = {cfg.device!r} but torch {torch.__version__} sees {torch.cuda.device_count()} CUDA "
                       f"device(s) here; use --set device=cpu, or install a CUDA build of torch on a GPU machine")
    return dev


def synchronize(dev: torch.device) -> None:
    """Wait for the work queued on a GPU (CUDA runs asynchronously; a no-op on the CPU)."""
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def choose_engine(cfg: GeoConfig) -> tuple[str, str]:
    """('fast' | 'hooked', why). 'auto' takes the fast path when it supports the model."""
    if cfg.engine == "hooked":
        return "hooked", "engine=hooked requested"
    from geolens.fast import fast_unsupported_reason

    reason = fast_unsupported_reason(cfg)
    if reason is None:
        return "fast", "fast path supports this model"
    if cfg.engine == "fast":
        raise GeoError(f"engine=fast cannot run this model: {reason}; use --set engine=auto or engine=hooked")
    return "hooked", f"fast path unsupported ({reason}); using the hooked forward"


def select_forward(model: GeoTransformer) -> tuple[str, Callable[[Tensor], Tensor], str]:
    """(engine name, forward(tokens) -> logits [batch, C] at `=`, why) for `model` (see choose_engine)."""
    engine, why = choose_engine(model.cfg)
    if engine == "hooked":
        return engine, lambda tokens: model(tokens)[:, -1], why
    from geolens.fast import fast_logits

    return engine, lambda tokens: fast_logits(model, tokens), why


# ---- events ----------------------------------------------------------------------------------
def onset_events(rows: list[dict]) -> dict[str, int | None]:
    """onset_095: first evaluated epoch with test acc > 0.95; sustained_099: first epoch after which
    every evaluation has test acc >= 0.99 (None if the last one is below)."""
    onset = next((r["epoch"] for r in rows if r["test_acc"] > ONSET_ACC), None)
    sustained = None
    for r in rows:
        if r["test_acc"] >= SUSTAINED_ACC:
            sustained = r["epoch"] if sustained is None else sustained
        else:
            sustained = None
    return {"onset_095": onset, "sustained_099": sustained}


def early_stop_due(cfg: GeoConfig, epoch: int, events: dict) -> bool:
    """Whether `epoch` is at least cfg.early_stop_after epochs past sustained_099."""
    sustained = events["sustained_099"]
    return cfg.early_stop_after is not None and sustained is not None and epoch - sustained >= cfg.early_stop_after


def run_header(cfg: GeoConfig, engine: str, why: str, n_train: int, n_test: int) -> dict:
    """run.json contents (without format and timing) of a run that is training."""
    return {"config": cfg.to_dict(), "versions": package_versions(), "engine": engine, "engine_reason": why,
            "n_train": n_train, "n_test": n_test, "status": "running"}


# ---- optimizer state (de)serialisation -----------------------------------------------------
def optimizer_tensors(model: GeoTransformer, opt: torch.optim.Optimizer) -> dict[str, Tensor]:
    out = {}
    for name, param in model.named_parameters():
        for key, value in opt.state.get(param, {}).items():
            out[f"opt.{name}.{key}"] = value if isinstance(value, Tensor) else torch.tensor(value)
    return out


def load_optimizer_tensors(model: GeoTransformer, opt: torch.optim.Optimizer, tensors: dict[str, Tensor]) -> None:
    for name, param in model.named_parameters():
        prefix = f"opt.{name}."
        state = {k[len(prefix) :]: v.to(param.device, copy=True) for k, v in tensors.items() if k.startswith(prefix)}
        if state:
            opt.state[param] = state


def from_resume_state(cfg: GeoConfig, state: dict[str, Tensor], dev: torch.device) -> tuple[GeoTransformer, torch.optim.AdamW]:
    """The model (on `dev`) and its AdamW with the weights and optimizer state of a resume state."""
    model = GeoTransformer(cfg)
    model.load_state_dict({k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")})
    model.to(dev)
    opt = make_optimizer(model)
    load_optimizer_tensors(model, opt, state)
    return model, opt


def make_optimizer(model: GeoTransformer, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW with the config's hyperparameters, fused (one kernel for all parameters; deterministic,
    so a resumed run still equals an uninterrupted one bit for bit); capturable: its step can be
    recorded in a CUDA graph."""
    cfg = model.cfg
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             weight_decay=cfg.weight_decay, fused=True, capturable=capturable)


# ---- the loop --------------------------------------------------------------------------------
@dataclass
class TrainResult:
    path: Path
    rows: list[dict]
    events: dict
    engine: str


def preflight(cfg: GeoConfig, dev: torch.device, members: int = 1) -> str:
    """Checks made before anything is written: the engine (choose_engine), and that the run fits in
    memory here (a GeoError if not); warns about settings that are probably not what was meant.
    Returns the engine name."""
    engine, _ = choose_engine(cfg)
    for message in training_warnings(cfg) + check_fits(cfg, engine, dev, members):
        warn(message)
    return engine


@contextmanager
def out_of_memory_as_error(cfg: GeoConfig, engine: str):
    """Turn an allocation failure inside the block into a one-line GeoError."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if is_out_of_memory(e):
            raise out_of_memory_error(cfg, engine) from None
        raise


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
    if "trimmed" in header:
        raise GeoError(f"{run.path} is a trimmed trajectory (`geolens export`: a subset of the checkpoints, no resume "
                       f"state) and cannot be continued; resume its source run, or train anew with the config in its run.json")
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


def mark_started(claim: NewRunClaim, run: RunDir) -> None:
    """Writer job after a new run's first checkpoint: the claim swaps it into place; later writes follow."""
    claim.started()
    run.path = claim.path


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


def finish_run(writer: BackgroundWriter, run: RunDir, header: dict, rows: list, start: int, stop_reason: str,
               eval_every: int, timing: dict) -> dict:
    """Queue the final events.json and the finished run.json on `writer`; returns the events."""
    events = finish_events(rows, stop_reason, eval_every, start)
    timing = {**timing, "ms_per_epoch": 1000 * timing["train_s"] / max(timing["epochs_timed"], 1)}
    writer.submit(_write_finish, writer, run, dict(events), {**header, "status": "finished", "stop_reason": stop_reason,
                                                             "timing": timing})
    return events


def finish_events(rows: list[dict], stop_reason: str, eval_every: int, start: int = 0) -> dict:
    """events.json of a finished run: onset_events of its metrics rows, how and where it ended."""
    return {**onset_events(rows), "stop_reason": stop_reason, "final_epoch": rows[-1]["epoch"] if rows else start,
            "eval_every": eval_every}


def _write_finish(writer: BackgroundWriter, run: RunDir, events: dict, header: dict) -> None:
    atomic_write_json(run.events_json, events)
    _write_header(writer, run, header)


def _write_header(writer: BackgroundWriter, run: RunDir, header: dict) -> None:
    """run.json from a job on `writer`: its timing's write_s (the value when training started) plus the
    writer's time so far."""
    timing = header["timing"]
    run.write_header({**header, "timing": {**timing, "write_s": timing["write_s"] + writer.busy_s}})


def squared_norms(model: GeoTransformer) -> Tensor:
    """[2, n_params] on the model's device: each parameter's and each gradient's squared L2 norm (0 without a grad)."""
    params = list(model.parameters())
    return torch.stack([torch.stack([p.pow(2).sum() for p in params]),
                        torch.stack([p.new_zeros(()) if p.grad is None else p.grad.pow(2).sum() for p in params])])


@torch.no_grad()
def _evaluate(model, forward, epoch, loss, logits, train_y, test_x, test_y, elapsed) -> dict:
    """The metrics row of this epoch (one device-to-host transfer for all of it)."""
    test_logits = forward(test_x)
    stats = torch.stack([loss.detach(), (logits.argmax(-1) == train_y).float().mean(), F.cross_entropy(test_logits, test_y),
                         (test_logits.argmax(-1) == test_y).float().mean(),
                         torch.maximum(logits.abs().max(), test_logits.abs().max())])
    return metrics_row(epoch, stats.tolist(), squared_norms(model).tolist(), elapsed)


def metrics_row(epoch: int, stats: list[float], norms: list[list[float]], elapsed: float) -> dict:
    """A metrics.csv row from stats (train loss, train acc, test loss, test acc, max |logit|) and
    norms (squared_norms: the parameters' and the gradients' squared norms)."""
    train_loss, train_acc, test_loss, test_acc, max_logit = stats
    w_sq, g_sq = norms
    return {
        "epoch": epoch,
        "train_loss": train_loss,
        "train_acc": train_acc,
        "test_loss": test_loss,
        "test_acc": test_acc,
        "weight_norm": math.sqrt(sum(w_sq)),
        "grad_norm": math.sqrt(sum(g_sq)),
        "max_abs_logit": max_logit,
        "elapsed_s": elapsed,
    }


def _checkpoint(writer, run: RunDir, model, opt, epoch, rows, manifest, events, header, timing) -> None:
    write_checkpoint(writer, run, model.state_dict(), optimizer_tensors(model, opt), epoch, rows, manifest, events,
                     header, timing, model.cfg.eval_every)


def snapshot(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """CPU copies of `tensors`: what a queued write may hold while training changes the originals."""
    return {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}


def write_checkpoint(writer: BackgroundWriter, run: RunDir, weights: dict[str, Tensor], opt_state: dict[str, Tensor],
                     epoch: int, rows: list, manifest: list, events: dict, header: dict, timing: dict,
                     eval_every: int) -> None:
    """Checkpoint `epoch`: snapshot the weights (a state_dict), the optimizer state (opt.<param>.<key>),
    rows, events and timing now, add the manifest entry, and queue the writes on `writer`."""
    row = rows[-1]
    manifest.append(run.manifest_entry(epoch, {k: row[k] for k in ("train_loss", "train_acc", "test_loss", "test_acc")}))
    writer.submit(_write_checkpoint, writer, run, snapshot(weights), snapshot(opt_state), epoch, list(rows),
                  list(manifest), {**events, "eval_every": eval_every}, {**header, "timing": dict(timing)})


def _write_checkpoint(writer: BackgroundWriter, run: RunDir, weights: dict[str, Tensor], opt_state: dict[str, Tensor],
                      epoch: int, rows: list, manifest: list, events: dict, header: dict) -> None:
    """Metrics, events, the step's weights, the manifest, then the resume state (weights as model.*, the
    optimizer state) and run.json, in that order, so everything a resume state refers to is on disk before it."""
    write_metrics(run.metrics_csv, rows)
    atomic_write_json(run.events_json, events)
    run.save_checkpoint(epoch, weights, manifest)
    state = {f"model.{k}": v for k, v in weights.items()}
    state.update(opt_state)
    state["epoch"] = torch.tensor(epoch)
    save_tensors(run.resume_file, state)
    _write_header(writer, run, header)
