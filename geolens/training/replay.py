"""Replay: a run's exact training state at any epoch, retrained from the nearest earlier full state.

A run keeps its weights at every checkpoint but the optimizer state only at some (its storage policy,
config `keep`: model.schedule.KeepPolicy) and in its resume state. `full_states(run)` lists the
epochs whose whole training state is on disk; `state_at(run, epoch)` returns the state at any epoch
of the trajectory: stored, or trained on from the nearest earlier full state with the run's own loop
(each epoch: the schedule, the training forward and backward, the optimizer step, the norm clamp:
training.train.run_epochs without the records; a sweep member's in a stack of two, as it trained), on
the thread count the run was trained with.
A replay is exact only in the run's float order: it refuses in one line where the recorded machine
(the CPU's vector instruction set, the GPU) differs, and it checks the replayed weights bit for bit
against the first stored checkpoint after the state it started from (training on to it when the epoch
asked for comes first), refusing where they differ. `replay(run, start, stop, visit)` is the loop;
geolens.training.fork forks at any epoch through it and `geolens convert` changes a run's policy with it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import GeoConfig
from geolens.model.schedule import parse_keep
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.runs.run import Run
from geolens.runs.runlock import RunLock
from geolens.runs.storage import RunDir, load_tensors, machine, save_tensors
from geolens.training.batched import StackedForward, StackedStep
from geolens.training.controls import Controls
from geolens.training.engine import denormals_flushed, select_forward, training_device, training_threads
from geolens.training.progress_bar import EpochProgress
from geolens.training.recording import from_resume_state, optimizer_tensors
from geolens.training.train import SingleStep


@dataclass
class TrainingState:
    """A run's whole training state at `epoch`: the config that held (Run.config_at, tau unscheduled), the
    weights (a state_dict) and the optimizer state (opt.<param>.<key>); source: the stored full state it
    was replayed from (== epoch when stored)."""

    epoch: int
    cfg: GeoConfig
    weights: dict[str, Tensor]
    opt_state: dict[str, Tensor]
    source: int


def owner(run: Run, epoch: int) -> Run:
    """The run whose own files hold `epoch`: a fork's parent (generation by generation) before the fork step."""
    while run.fork_start is not None and epoch < run.fork_start:
        run = run.parent
    return run


def full_states(run: Run) -> list[int]:
    """The epochs of `run`'s own history whose whole training state is on disk: epoch 0 of a run trained from
    scratch (no optimizer state yet), every checkpoint with an optim_* file, the resume state's epoch."""
    steps = own_steps(run)
    out = {s for s in steps if run.dir.optim_path(s).exists()}
    if not run.forks and 0 in steps:
        out.add(0)
    resume = resume_epoch(run.dir)
    if resume is not None:
        out.add(resume)
    return sorted(out)


def own_steps(run: Run) -> list[int]:
    """The checkpoints in the run's own manifest (a fork's from its step on)."""
    return [m["step"] for m in run.dir.read_manifest()]


def resume_epoch(run: RunDir) -> int | None:
    """The epoch of the run's resume state (None without one)."""
    if not run.resume_file.exists():
        return None
    return int(load_tensors(run.resume_file)["epoch"].item())


def stored_state(run: Run, epoch: int) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(weights, optimizer state) of a full state of `run`'s own history (full_states)."""
    if epoch == resume_epoch(run.dir):
        state = load_tensors(run.dir.resume_file)
        return ({k[len("model."):]: v for k, v in state.items() if k.startswith("model.")},
                {k: v for k, v in state.items() if k.startswith("opt.")})
    opt = {} if epoch == 0 and not run.dir.optim_path(0).exists() else load_tensors(run.dir.optim_path(epoch))
    return load_tensors(run.dir.ckpt_path(epoch)), {k: v for k, v in opt.items() if k.startswith("opt.")}


def last_epoch(run: Run) -> int:
    """The newest epoch of the trajectory whose state can be had: the resume state's, else the last checkpoint's."""
    resume = resume_epoch(run.dir)
    if resume is not None:
        return resume
    if not run.steps:
        raise GeoError(f"{run.path} has no checkpoints yet")
    return run.steps[-1]


def state_at(run: Run, epoch: int, progress: bool = False) -> TrainingState:
    """The exact training state of `run` at `epoch` (module docstring); a GeoError where it cannot be exact."""
    end = last_epoch(run)
    if not 0 <= epoch <= end:
        raise GeoError(f"epoch {epoch} is outside the trajectory of {run.path}, which ends at epoch {end}; "
                       f"choose an epoch from 0 to {end}")
    home = owner(run, epoch)
    full = [s for s in full_states(home) if s <= epoch]
    if not full:
        raise GeoError(f"{home.path} keeps no full training state at or before epoch {epoch} (a trimmed export, or "
                       "written before geolens kept optimizer states); choose one of its full states: "
                       f"{', '.join(map(str, full_states(home))) or 'none'}")
    source = full[-1]
    cfg = home.config_at(source, scheduled_tau=False)
    if source == epoch:
        return TrainingState(epoch, cfg, *stored_state(home, source), source)
    after = [s for s in own_steps(home) if s > source]
    check = after[0] if after else None
    caught: dict = {}

    def visit(e: int, model, opt) -> None:
        if e == epoch:
            caught["state"] = ({k: v.detach().clone() for k, v in model.state_dict().items()},
                               {k: v.detach().clone() for k, v in optimizer_tensors(model, opt).items()})
        if e == check:
            _check_weights(home, e, model, source)

    replay(home, source, max(epoch, check if check is not None else epoch), visit, progress)
    return TrainingState(epoch, cfg, *caught["state"], source)


def replay(run: Run, start: int, stop: int, visit: Callable[[int, torch.nn.Module, torch.optim.Optimizer], None],
           progress: bool = False) -> None:
    """Train `run` (its own history) from its full state at `start` to epoch `stop` as its loop did, calling
    visit(epoch, model, optimizer) at every epoch from start to stop with the state there."""
    cfg = run.config_at(start, scheduled_tau=False)
    threads = replay_threads(run, start, stop)
    weights, opt_state = stored_state(run, start)
    dev = training_device(cfg)
    model, opt = from_resume_state(cfg, {**{f"model.{k}": v for k, v in weights.items()}, **opt_state}, dev)
    with training_threads(threads):
        torch.manual_seed(cfg.seed)
        data = make_dataset(cfg)
        train_x, train_y, test_x, test_y = (t.to(dev) for t in (*data.train, *data.test))
        if str(run.header.get("engine", "")).startswith("batched"):  # a sweep member: its float order is a stack's
            twin = from_resume_state(cfg, {**{f"model.{k}": v for k, v in weights.items()}, **opt_state}, dev)
            models, opts = [model, twin[0]], [opt, twin[1]]  # any stack of two or more gives a member the same bits
            single = StackedStep(StackedForward(models), models, opts, 1, [train_x] * 2, torch.stack([train_y] * 2),
                                 [test_x] * 2, torch.stack([test_y] * 2))
        else:
            engine, forward, _ = select_forward(model)
            single = SingleStep(model, opt, engine, forward, train_x, train_y, test_x, test_y)
        controls = Controls(cfg, model, opt)  # as in run_epochs: the recorded member's schedule and clamp only
        with denormals_flushed(cfg.flush_denormal), EpochProgress(stop, start, progress, f"replay {run.path.name}") as bar:
            for epoch in range(start, stop + 1):
                visit(epoch, model, opt)
                if epoch == stop:
                    bar.update(stop, "")  # the bar (and a log file's summary) ends at the epoch reached
                    break
                controls.before(epoch)
                single.backward(False)
                single.update()
                controls.clamp()
                if epoch % cfg.eval_every == 0:
                    bar.update(epoch, "")


def replay_threads(run: Run, start: int, stop: int) -> int:
    """The torch thread count the epochs start..stop of `run` were trained with; a GeoError where the float
    order of those epochs cannot be had on this machine (another vector instruction set or GPU, or a
    segment trained without a recorded machine is fine: the replay's check decides)."""
    here = machine(training_device(run.config))
    segments = run.header.get("segments", [])
    used = [seg for i, seg in enumerate(segments)
            if seg["from_epoch"] <= stop and (i + 1 == len(segments) or segments[i + 1]["from_epoch"] > start)]
    threads = {seg["machine"]["torch_threads"] for seg in used if isinstance(seg.get("machine"), dict)}
    for seg in used:
        then = seg.get("machine")
        if not isinstance(then, dict):
            continue
        for key in ("cpu_capability", "gpu"):
            if then.get(key) != here.get(key):
                raise GeoError(f"replaying {run.path} from epoch {start} needs its float order, but it was trained with "
                               f"{key} {then.get(key)} and this machine has {here.get(key)}; use an epoch with a stored "
                               f"full state ({', '.join(map(str, full_states(run)))}) or replay on that machine")
    if len(threads) > 1:
        raise GeoError(f"epochs {start}..{stop} of {run.path} were trained on {sorted(threads)} threads in different "
                       "segments; a replay across them cannot be exact: use an epoch with a stored full state "
                       f"({', '.join(map(str, full_states(run)))})")
    return threads.pop() if threads else torch.get_num_threads()


def _check_weights(run: Run, epoch: int, model, source: int) -> None:
    """Refuse (GeoError) unless the replayed weights at `epoch` equal the stored checkpoint bit for bit."""
    stored = load_tensors(run.dir.ckpt_path(epoch))
    if stored.keys() != model.state_dict().keys() or not all(
            torch.equal(stored[k], v.detach().cpu()) for k, v in model.state_dict().items()):
        raise GeoError(f"replaying {run.path} from epoch {source} did not reproduce its checkpoint {epoch} bit for bit "
                       "(another float order: engine, threads, library versions or machine); use an epoch with a "
                       f"stored full state ({', '.join(map(str, full_states(run)))})")


def model_at_epoch(run: Run, epoch: int, progress: bool = False) -> GeoTransformer:
    """The model (eval mode) at any epoch of `run`'s trajectory: its checkpoint, or replayed there (state_at)."""
    if epoch in run.steps:
        return run.model_at(epoch)
    model = GeoTransformer(run.config_at(epoch))
    model.load_state_dict(state_at(run, epoch, progress).weights)
    return model.eval()


def convert_storage(path: str | Path, keep: str, progress: bool = False) -> list[str]:
    """Store the run in `path` under the policy `keep` (config `keep`, model.schedule.parse_keep) without
    losing exactness: one replay of its own history from its first full state checks every checkpoint's
    weights and every optimizer state it drops bit for bit, and computes the ones it adds; only then are
    optim_* files written and removed and run.json's `keep` changed (later training follows it). Returns
    what was done (one line each); a GeoError, with nothing changed, where the replay is not exact."""
    policy = parse_keep(keep)
    with RunLock(path, "convert"):
        run = Run(path)
        if "trimmed" in run.header:
            raise GeoError(f"{run.path} is a trimmed export (no optimizer states, no resume state): there is nothing to "
                           "convert; convert its source run")
        start = run.forks[0]["step"] if run.forks else 0
        steps = [s for s in own_steps(run) if s >= start]
        resume = resume_epoch(run.dir)
        if not steps or resume is None:
            raise GeoError(f"{run.path} has no checkpoints or no resume state; `geolens info --run {run.path}` says why")
        have = {s for s in steps if run.dir.optim_path(s).exists()}
        want = set(policy.full_steps(steps)) | {start}
        drop, add = sorted(have - want), sorted(want - have - {resume})
        if start == 0 and 0 in add:
            add.remove(0)  # epoch 0 of a run from scratch is full without a file (no optimizer state yet)
        first = min({s for s in have if s in want} | ({0} if start == 0 else set()) | {resume})
        if (drop or add) and first > min(drop + add):
            raise GeoError(f"{run.path} keeps no full state before epoch {min(drop + add)}; it cannot be converted exactly")
        computed: dict[int, dict] = {}
        checkpoints = set(steps)

        def visit(epoch: int, model, opt) -> None:
            if epoch in checkpoints and epoch != first:
                _check_weights(run, epoch, model, first)
            if epoch in drop or epoch in add:
                state = {k: v.detach().cpu().clone() for k, v in optimizer_tensors(model, opt).items()}
                if epoch in drop:
                    stored = {k: v for k, v in load_tensors(run.dir.optim_path(epoch)).items() if k.startswith("opt.")}
                    if stored.keys() != state.keys() or not all(torch.equal(stored[k], state[k]) for k in state):
                        raise GeoError(f"replaying {run.path} from epoch {first} did not reproduce its optimizer state at "
                                       f"epoch {epoch} bit for bit; it is left as it was")
                else:
                    computed[epoch] = state

        if drop or add:
            replay(run, first, max(drop + add), visit, progress)
        if resume in want - have:  # the newest full state is in resume.safetensors already
            computed[resume] = stored_state(run, resume)[1]
        for epoch, state in computed.items():
            save_tensors(run.dir.optim_path(epoch), {**state, "epoch": torch.tensor(epoch)}, metadata={"step": str(epoch)})
        for epoch in drop:
            run.dir.optim_path(epoch).unlink()
        header = {k: v for k, v in run.header.items() if k not in ("format", "format_version")}
        header["config"] = {**header["config"], "keep": keep}
        run.dir.write_header(header)
        done = [f"checked {len(drop)} optimizer state(s) and the checkpoints up to epoch {max(drop + add)} by replay "
                f"from epoch {first}; removed {len(drop)}, added {len(add)}"] if drop or add else []
        return done + [f"{run.path} now keeps the optimizer state at epochs "
                       f"{', '.join(map(str, sorted(want | {resume})))} (keep = {keep}); the rest replay from them"]
