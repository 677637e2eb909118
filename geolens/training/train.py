"""Full-batch AdamW training with evaluation, onset events and dense checkpoint trajectories.

Epoch e means "after e optimizer steps". At every evaluated epoch the training forward of that
state gives the train loss/accuracy and the gradient norm, a no-grad forward gives the test
metrics. A checkpoint (weights) is written when the schedule asks; the resume state (weights +
AdamW state) is rewritten at every checkpoint so `resume` continues bit-identically. The files are
written by a BackgroundWriter from snapshots taken at the checkpoint, while training goes on.

run_epochs is the per-epoch skeleton of every training loop: a single run (train, resume) is a
stack of one member with SingleStep; geolens.training.batched runs many members with its stacked step.
The engine and device (geolens.training.engine) and the run's records (geolens.training.recording) live apart.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Protocol

import torch
import torch.nn.functional as F

from geolens.errors import GeoError, warn
from geolens.model.config import GeoConfig, config_fields
from geolens.model.engines import Engine
from geolens.model.schedule import parse_schedule
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.runs.events import early_stop_due, onset_events
from geolens.runs.integrity import resume_point
from geolens.runs.forecast import ForecastWatch, ThresholdRule
from geolens.runs.runlock import NewRunClaim, RunLock
from geolens.runs.storage import BackgroundWriter, RunDir, atomic_write_json, load_tensors
from geolens.training.engine import (
    denormals_flushed,
    make_optimizer,
    out_of_memory_as_error,
    preflight,
    select_forward,
    started_threads,
    synchronize,
    training_device,
    training_threads,
)
from geolens.training.controls import Controls
from geolens.training.precursor_columns import PrecursorProbe
from geolens.training.optimizers import check_muon_rate
from geolens.training.progress_bar import EpochProgress, run_stats
from geolens.training.recording import (
    evaluated_row,
    finish_run,
    from_resume_state,
    mark_started,
    optimizer_tensors,
    run_header,
    squared_norms,
    write_checkpoint,
)

RESUMABLE_FIELDS = config_fields(resume=True)


@dataclass
class TrainResult:
    path: Path
    rows: list[dict]
    events: dict
    engine: str


# ---- the per-epoch skeleton shared by the single-run and the batched loops --------------------
class Step(Protocol):
    """The engine-specific part of a loop, over all the models it trains."""

    def backward(self, record: bool) -> None:
        """Training forward at the current weights and backward (fills every parameter's .grad);
        record: this epoch is evaluated (the step may keep what its precursor columns need)."""

    def evaluate(self, epoch: int, elapsed: float) -> list[dict]:
        """The metrics rows of the recorded members it still trains, in order, at this state (from the
        last backward's forward and a test forward); elapsed: seconds since the loop started."""

    def update(self) -> None:
        """The optimizer step of every model."""

    def keep(self, running: list[bool]) -> None:
        """Stop training the recorded members it trains whose running flag is False (some stay True);
        only a step of several members is asked."""


@dataclass
class Member:
    """One recorded run of a loop: its directory, config, model and optimizer, its records so far
    (rows, manifest), run.json's header (recording.run_header), its run.json timing before this
    loop (prev_timing; {} for a new run) and, for a new run, its claim on the run directory."""

    run: RunDir
    cfg: GeoConfig
    model: GeoTransformer
    opt: torch.optim.Optimizer
    rows: list[dict]
    manifest: list[dict]
    header: dict
    prev_timing: dict
    claim: NewRunClaim | None = None
    stop_reason: str | None = None  # set when the member is done: "completed" or "early_stop"
    events: dict | None = None  # its final events, once finished


def run_epochs(members: list[Member], step: Step, start: int, resumed: bool, engine: str, label: str,
               describe: Callable[[list[dict], int], str], progress: bool, timing_extra: dict | None = None,
               on_eval: Callable[[int, list[bool]], None] | None = None) -> list[TrainResult]:
    """Train from epoch `start` until every member is finished; returns each member's TrainResult.

    Every epoch: each member's Controls.before (its lr / weight-decay / tau schedule at this epoch),
    step.backward(evaluated); on the eval schedule (every cfg.eval_every epochs and the last,
    except `start` when resumed: it was evaluated before) the members' metrics rows
    (step.evaluate), and for each member still running its row, onset events, early stop, a
    checkpoint when its schedule asks or it is done (queued on one BackgroundWriter; a new run's
    claim swaps it into place after its first one), its final records once done; then the progress bar
    (label; describe(rows, members running)) and on_eval(epoch, done flags); then step.update() and
    each member's norm clamp (Controls.clamp, also applied to the first state of a loop not resumed). The loop
    runs with subnormals flushed when cfg.flush_denormal (engine.denormals_flushed).
    A finished member is no longer recorded nor trained (step.keep); the loop ends when every member is done.

    Timing: train_s (backward and update; queued GPU work is waited for before each evaluation),
    eval_s, ckpt_s, epochs_timed, plus timing_extra, added to each member's prev_timing.
    An exception (KeyboardInterrupt from Ctrl-C, or SIGTERM through the CLI's handler) leaves the
    loop after the queued writes finish: the last checkpoint written is what a resume continues from.
    """
    cfg = members[0].cfg
    dev = next(members[0].model.parameters()).device
    schedule = parse_schedule(cfg.checkpoints)
    timing = {"train_s": 0.0, "eval_s": 0.0, "ckpt_s": 0.0, "write_s": 0.0, "epochs_timed": 0, **(timing_extra or {})}
    for m in members:
        m.run.write_header({**m.header, "timing": _run_timing(timing, m.prev_timing)})
    elapsed0 = [m.rows[-1]["elapsed_s"] if m.rows else 0.0 for m in members]
    active = list(range(len(members)))  # the members the step trains: step.evaluate's rows, in order
    controls = [Controls(m.cfg, m.model, m.opt) for m in members]
    if not resumed:  # the first recorded state is already held at the clamp's norm
        for c in controls:
            c.clamp()
    bar = EpochProgress(cfg.epochs, start, progress, label)
    t_start = time.perf_counter()
    epoch = start
    with BackgroundWriter() as writer, bar, denormals_flushed(cfg.flush_denormal):
        while True:
            t0 = time.perf_counter()
            for i in active:
                controls[i].before(epoch)
            evaluate = (epoch % cfg.eval_every == 0 or epoch == cfg.epochs) and not (resumed and epoch == start)
            step.backward(evaluate)
            if evaluate:
                synchronize(dev)  # the queued training work counts as training time
            t1 = time.perf_counter()
            timing["train_s"] += t1 - t0
            if evaluate:
                rows = step.evaluate(epoch, t1 - t_start)
                t2 = time.perf_counter()
                timing["eval_s"] += t2 - t1
                for i, row in zip(active, rows):
                    _record(writer, members[i], {**row, "elapsed_s": row["elapsed_s"] + elapsed0[i]}, epoch, schedule,
                            _run_timing(timing, members[i].prev_timing))
                timing["ckpt_s"] += time.perf_counter() - t2
                for m in (members[i] for i in active):
                    if m.stop_reason is not None:
                        m.events = finish_run(writer, m.run, m.header, m.rows, start, m.stop_reason, cfg.eval_every,
                                              _run_timing(timing, m.prev_timing))
                still = [i for i in active if members[i].stop_reason is None]
                if still and len(still) < len(active):
                    step.keep([members[i].stop_reason is None for i in active])
                active = still
                done = [m.stop_reason is not None for m in members]
                bar.update(epoch, describe(rows, done.count(False)))
                if on_eval is not None:
                    on_eval(epoch, done)
                if all(done):
                    break
            t3 = time.perf_counter()
            step.update()
            for i in active:
                controls[i].clamp()
            timing["train_s"] += time.perf_counter() - t3
            timing["epochs_timed"] += 1
            epoch += 1
    # after the writer has finished: a new run's path is final once its claim swapped it into place
    return [TrainResult(m.run.path, m.rows, m.events, engine) for m in members]


def _record(writer: BackgroundWriter, m: Member, row: dict, epoch: int, schedule, timing: dict) -> None:
    """Add member m's metrics row at `epoch`; checkpoint it if the schedule asks or it is done (early
    stop or the last epoch: then m.stop_reason says which)."""
    m.rows.append(row)
    events = onset_events(m.rows)
    done, stop_reason = epoch >= m.cfg.epochs, "completed"
    if early_stop_due(m.cfg, epoch, events):
        done, stop_reason = True, "early_stop"
    last = m.manifest[-1] if m.manifest else None
    if done or schedule.wants(epoch, last, row):
        write_checkpoint(writer, m.run, m.model.state_dict(), optimizer_tensors(m.model, m.opt), epoch, m.rows,
                         m.manifest, events, m.header, timing, m.cfg.eval_every)
        if m.claim is not None and last is None:
            writer.submit(mark_started, m.claim, m.run)
    if done:
        m.stop_reason = stop_reason


def _run_timing(timing: dict, prev: dict) -> dict:
    """A member's run.json timing: its timing before this loop (prev; {} for a new run) plus this loop's."""
    return {k: prev.get(k, 0) + v if k != "members" else v for k, v in timing.items()}


# ---- the single run ----------------------------------------------------------------------------
class SingleStep:
    """Step of one model: its forward (select_forward's engine), mean cross-entropy, its AdamW. On an
    evaluated epoch the engine's train_forward hands the precursor columns the activations its forward
    computed anyway (fast, deep); otherwise they are computed by its eq_activations."""

    def __init__(self, model: GeoTransformer, opt: torch.optim.Optimizer, engine: Engine, forward, train_x, train_y,
                 test_x, test_y):
        self.model, self.opt, self.engine, self.forward = model, opt, engine, forward
        self.train_x, self.train_y, self.test_x, self.test_y = train_x, train_y, test_x, test_y
        self.probe = PrecursorProbe(model, train_x)

    def backward(self, record: bool) -> None:
        self.logits, self.acts = self.engine.train_forward(self.model, self.train_x, record)
        self.loss = F.cross_entropy(self.logits, self.train_y)
        self.opt.zero_grad(set_to_none=True)
        self.loss.backward()

    def evaluate(self, epoch: int, elapsed: float) -> list[dict]:
        acts = self.acts or self.engine.eq_activations(self.model, self.train_x)
        return [_evaluate(self.model, self.probe, self.forward, epoch, self.loss, self.logits, acts, self.train_y,
                          self.test_x, self.test_y, elapsed)]

    def update(self) -> None:
        self.opt.step()


def train(cfg: GeoConfig, out: str | Path, force: bool = False, progress: bool = True,
          forecast: ThresholdRule | None = None) -> TrainResult:
    """Train a new run into `out` (refused if it exists, unless force: then the new run is built beside
    the old one, which is replaced only once the new run's first checkpoint is written). forecast: an
    onset forecast rule (geolens.runs.forecast) followed in the progress line and kept in run.json."""
    dev = training_device(cfg)
    engine = preflight(cfg, dev)
    with NewRunClaim(out, force) as claim, out_of_memory_as_error(cfg, engine):
        model = GeoTransformer(cfg).to(dev)  # initialised on the CPU: the same init on every device
        opt = make_optimizer(model)
        return _loop(RunDir(claim.path), model, opt, start=0, rows=[], manifest=[], progress=progress, claim=claim,
                     forecast=forecast)


def resume(out: str | Path, progress: bool = True, forecast: ThresholdRule | None = None, **changes) -> TrainResult:
    """Continue a run from its resume state; only `epochs`, `early_stop_after` and `device` may change
    (and the forecast rule: a new one replaces the one in run.json). It trains on the torch thread count
    the run started with (run.json), which sets its float order, whatever this process's count.
    The run directory is locked for the whole run; an inconsistent one is refused, except that a
    manifest that disagrees with the checkpoint files is rebuilt from them (exactly; a warning says so)."""
    run = RunDir(out)
    header = run.read_header()
    if "trimmed" in header:
        raise GeoError(f"{run.path} is a trimmed trajectory (`geolens export`: a subset of the checkpoints, no resume "
                       f"state) and cannot be continued; resume its source run, or train anew with the config in its run.json")
    check_muon_rate(header, run.path)
    bad = sorted(set(changes) - set(RESUMABLE_FIELDS))
    if bad:
        raise GeoError(f"--resume cannot change {bad}; only {list(RESUMABLE_FIELDS)} may change (start a new run instead)")
    cfg = GeoConfig.from_dict({**header["config"], **changes})
    dev = training_device(cfg)
    engine = preflight(cfg, dev)
    with RunLock(run.path, "resume"), out_of_memory_as_error(cfg, engine), training_threads(started_threads(header)):
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
        return _loop(run, model, opt, start=step, rows=rows, manifest=manifest, progress=progress, resumed=True,
                     forecast=forecast)


def _loop(run: RunDir, model, opt, start: int, rows: list, manifest: list, progress: bool, resumed: bool = False,
          claim: NewRunClaim | None = None, forecast: ThresholdRule | None = None) -> TrainResult:
    cfg = model.cfg
    torch.manual_seed(cfg.seed)
    data = make_dataset(cfg)
    dev = next(model.parameters()).device
    train_x, train_y, test_x, test_y = (t.to(dev) for t in (*data.train, *data.test))
    engine, forward, why = select_forward(model)
    prev = run.read_header() if resumed else None
    header = run_header(cfg, engine.name, why, len(train_y), len(test_y), start, prev, device=dev)
    if forecast is None and prev and "forecast" in prev:
        forecast = ThresholdRule.from_dict(prev["forecast"])
    if forecast is not None:
        header["forecast"] = asdict(forecast)
    member = Member(run, cfg, model, opt, rows, manifest, header, (prev or {}).get("timing", {}), claim)
    step = SingleStep(model, opt, engine, forward, train_x, train_y, test_x, test_y)
    label = f"{cfg.preset or cfg.norm} {cfg.task_label}"
    watch = ForecastWatch(forecast, rows) if forecast is not None else None  # fed a resumed run's rows so far

    def describe(new_rows: list[dict], active: int) -> str:
        if watch is not None:
            watch.add(new_rows[0])
        return " | ".join(filter(None, [run_stats(new_rows[0]), watch and watch.describe()]))

    return run_epochs([member], step, start, resumed, engine.name, label, describe, progress)[0]


@torch.no_grad()
def _evaluate(model, probe, forward, epoch, loss, logits, acts, train_y, test_x, test_y, elapsed) -> dict:
    """The metrics row of this epoch with its precursor columns (one device-to-host transfer for the
    statistics, one for the norms)."""
    test_logits = forward(test_x)
    stats = torch.stack([loss.detach(), (logits.argmax(-1) == train_y).float().mean(), F.cross_entropy(test_logits, test_y),
                         (test_logits.argmax(-1) == test_y).float().mean(),
                         torch.maximum(logits.abs().max(), test_logits.abs().max())])
    values = torch.cat([stats, probe.values(model, logits, acts)]).tolist()
    return evaluated_row(probe, epoch, values, squared_norms(model).tolist(), elapsed)
