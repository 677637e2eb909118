"""Batched training: many members (seeds, and configs of one shape) as one stacked model in one process.

Each member is its own GeoTransformer with its own torch AdamW (engine.make_optimizer, the
single run's optimizer). Every step `StackedForward` stacks the members' parameters over a
leading member dimension ([S, *shape]) and computes the per-member logits with the stacked forward of the
engine geolens.model.engines chooses (fast: one-layer tables; deep: any depth, bmm over the member axis;
hooked: torch.func.vmap of the GeoTransformer forward); either way the math is a single run's. The
per-member mean cross-entropies are summed before backward, so each member's .grad is exactly its
own gradient.

Each member starts from GeoTransformer(cfg_i)'s initialisation and trains on make_dataset(cfg_i),
as a single run would, and is written as an ordinary run directory (run.json with its own config,
metrics.csv, events.json, checkpoints/, resume.safetensors in the single-run key format), so
`geolens train --resume --out DIR` continues a member with the single-run code, and resume_batched
continues members stacked, from their resume states. A member that early-stops is finalised and no
longer recorded nor trained: the stack shrinks to the members still running (with one finished
member kept as an unrecorded passenger while fewer than two are left); the batch ends when the last
member stops.

A member's numbers do not depend on the other members of a stack of two or more (every per-member
computation is sliced the same way; measured bit for bit at p = 23 and 113), so a member continues
bit for bit when resumed in another stack of two or more on as many torch threads; one model alone
takes geolens.model.fast's single-member matmul path, whose float order differs, hence min_stack: an
unrecorded copy of member 0 keeps a lone member company.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor

from geolens.errors import GeoError, warn
from geolens.model.config import GeoConfig, config_fields
from geolens.model.hyperschedule import parse_hyper_schedule
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.runs.integrity import resume_point
from geolens.runs.runlock import NewRunClaim, RunLock
from geolens.runs.storage import RunDir, atomic_write_json, load_tensors
from geolens.model.engines import choose_engine
from geolens.training.engine import make_optimizer, out_of_memory_as_error, preflight, training_device
from geolens.training.precursor_columns import PrecursorProbe, eq_activations
from geolens.training.progress_bar import sweep_stats
from geolens.training.recording import evaluated_row, from_resume_state, run_header, squared_norms
from geolens.training.train import Member, TrainResult, run_epochs

#: config fields members of one batch may differ in (their tau schedules excepted); every other field must agree
MEMBER_FIELDS = config_fields(member=True)
ENGINE = "batched"


def check_members(cfgs: list[GeoConfig]) -> None:
    """Refuse an empty batch or members that differ in a field outside MEMBER_FIELDS."""
    if not cfgs:
        raise GeoError("a batched run needs at least one member config")
    first = cfgs[0].to_dict()
    for i, cfg in enumerate(cfgs[1:], 1):
        for key, value in cfg.to_dict().items():
            if key not in MEMBER_FIELDS and value != first[key]:
                raise GeoError(
                    f"batched members must share '{key}' (member 0 has {first[key]!r}, member {i} has {value!r}); "
                    f"only {', '.join(MEMBER_FIELDS)} may differ; train the others in a separate sweep"
                )
    taus = {tuple(w for w in parse_hyper_schedule(c.schedule).windows if w.name == "tau") for c in cfgs}
    if len(taus) > 1:
        raise GeoError("batched members share one readout temperature: their tau schedules must agree (lr and "
                       "weight_decay schedules may differ); train the others in a separate sweep")


class StackedForward:
    """forward(tokens [S][B, n_ctx]) -> per-member logits [S, B, C] of the member models.

    Each call stacks the members' own parameters ([S, *shape], so backward fills each member's
    .grad), through the stacked forward of the engine geolens.model.engines chooses (fast: pass the same
    per-member token tensors every call, their index plan is cached; deep: bmm over the member axis;
    hooked: the hooked forward vmapped over the members).
    """

    def __init__(self, models: list[GeoTransformer]):
        self.models = models
        self.names = [n for n, _ in models[0].named_parameters()]
        self.engine, why = choose_engine(models[0].cfg)
        self.why = f"{why}; {self.engine.name} engine's stacked forward (Engine.stacked_logits)"

    def __call__(self, tokens: list[Tensor]) -> Tensor:
        params = {n: torch.stack(ts) for n, ts in zip(self.names, zip(*(m.parameters() for m in self.models)))}
        return self.engine.stacked_logits(self.models[0], params, tokens)


def member_losses(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-member mean cross-entropy [S] of logits [S, B, C] against labels [S, B]."""
    S, B, C = logits.shape
    return F.cross_entropy(logits.reshape(S * B, C), labels.reshape(S * B), reduction="none").view(S, B).mean(1)


def train_batched(cfgs: list[GeoConfig], outs: list[str | Path], force: bool = False, progress: bool = True,
                  min_stack: int = 1, on_eval: Callable[[int, list[bool]], None] | None = None) -> list[TrainResult]:
    """Train member i = cfgs[i] into run directory outs[i] (existing ones are refused unless force).

    min_stack: stack at least this many models; the extra ones are unrecorded copies of member 0 (a
    member's numbers are the same in every stack of two or more, while one model alone takes the
    single-member matmul path of geolens.model.fast, whose float order differs). on_eval(epoch, done):
    called after every evaluation with each member's done flag.
    """
    check_members(cfgs)
    if len(outs) != len(cfgs):
        raise GeoError(f"{len(cfgs)} member configs but {len(outs)} output directories")
    dev = training_device(cfgs[0])
    engine = preflight(cfgs[0], dev, members=len(cfgs))
    taken = [str(o) for o in outs if RunDir(o).exists()]
    if taken and not force:
        raise GeoError(f"run directories {taken} already exist; use --force to replace them or choose another --out")
    with ExitStack() as stack, out_of_memory_as_error(cfgs[0], engine):
        claims = [stack.enter_context(NewRunClaim(o, force)) for o in outs]
        runs = [RunDir(c.path) for c in claims]
        models = [GeoTransformer(c).to(dev) for c in _padded(cfgs, min_stack)]
        opts = [make_optimizer(m) for m in models]
        return _train_stack(runs, cfgs, models, opts, 0, [[] for _ in cfgs], [[] for _ in cfgs], [None for _ in cfgs],
                            progress, on_eval, resumed=False, claims=claims)


def resume_batched(outs: list[str | Path], progress: bool = True, min_stack: int = 1,
                   on_eval: Callable[[int, list[bool]], None] | None = None,
                   epochs: int | None = None) -> list[TrainResult]:
    """Continue the member runs in `outs`, stacked, from their resume states (all at the same epoch),
    to their own epoch budget or to `epochs` (which extends a finished run).

    A member continues bit for bit as in the uninterrupted stack it was trained in, provided it is
    again stacked with at least one other model (min_stack=2 if it was) on as many threads.
    min_stack and on_eval as for train_batched.
    """
    runs = [RunDir(o) for o in outs]
    if not runs:
        raise GeoError("a batched resume needs at least one member run directory")
    headers = [r.read_header() for r in runs]
    cfgs = [GeoConfig.from_dict({**h["config"], **({} if epochs is None else {"epochs": epochs})}) for h in headers]
    check_members(cfgs)
    dev = training_device(cfgs[0])
    engine = preflight(cfgs[0], dev, members=len(cfgs))
    with ExitStack() as stack, out_of_memory_as_error(cfgs[0], engine):
        for r in runs:
            stack.enter_context(RunLock(r.path, "resume"))
            if not r.resume_file.exists():
                raise GeoError(f"{r.resume_file} is missing: the run has no checkpoint to resume from; retrain it")
        states = [load_tensors(r.resume_file) for r in runs]
        steps = sorted({int(st["epoch"].item()) for st in states})
        if len(steps) != 1:
            raise GeoError(f"members to resume together must be at one epoch (resume states at {steps}); resume them "
                           "in separate batches")
        step = steps[0]
        if step >= cfgs[0].epochs:
            raise GeoError(f"{runs[0].path} is already at epoch {step}; raise epochs above {step} to extend it")
        rows, manifests = [], []
        for run in runs:
            member_rows, manifest, notes = resume_point(run, step)
            for note in notes:
                warn(f"{run.path}: {note}")
            if notes:
                atomic_write_json(run.manifest_json, manifest)
            rows.append(member_rows)
            manifests.append(manifest)
        models, opts = zip(*(from_resume_state(c, st, dev) for c, st in zip(_padded(cfgs, min_stack),
                                                                          _padded(states, min_stack))))
        return _train_stack(runs, cfgs, list(models), list(opts), step, rows, manifests,
                            headers, progress, on_eval, resumed=True)


def _padded(items: list, n: int) -> list:
    """items, then copies of items[0] up to n entries."""
    return items + [items[0]] * (n - len(items))


def _train_stack(runs: list[RunDir], cfgs: list[GeoConfig], models: list[GeoTransformer], opts: list, start: int,
                 rows: list[list[dict]], manifests: list[list[dict]], prevs: list[dict | None], progress: bool,
                 on_eval: Callable[[int, list[bool]], None] | None, resumed: bool,
                 claims: list[NewRunClaim] | None = None) -> list[TrainResult]:
    """The batched loop from epoch `start` (train.run_epochs with StackedStep): models[i] (with opts[i])
    is member i for i < len(runs), any further model an unrecorded passenger training on member 0's
    data; rows/manifests: each member's so far; prevs: each member's run.json so far (None for a new
    run); resumed: `start` was evaluated (and checkpointed) before; claims: a new run's claims
    (NewRunClaim.started after each member's first checkpoint)."""
    dev = next(models[0].parameters()).device
    S, R, cfg = len(models), len(runs), cfgs[0]
    data = [make_dataset(c) for c in _padded(cfgs, S)]
    train_x, test_x = [d.train[0].to(dev) for d in data], [d.test[0].to(dev) for d in data]
    train_y = torch.stack([d.train[1] for d in data]).to(dev)
    test_y = torch.stack([d.test[1] for d in data]).to(dev)
    forward = StackedForward(models)
    engine, why = f"{ENGINE}-{forward.engine.name}", f"{S} members stacked; {forward.why}"
    members = [Member(runs[i], cfgs[i], models[i], opts[i], rows[i], manifests[i],
                      run_header(cfgs[i], engine, why, train_y.shape[1], test_y.shape[1], start, prevs[i], device=dev),
                      (prevs[i] or {}).get("timing", {}),
                      claims[i] if claims is not None else None) for i in range(R)]
    step = StackedStep(forward, models, opts, R, train_x, train_y, test_x, test_y)
    label = f"{R} x {cfg.preset or cfg.norm} {cfg.task_label}"
    return run_epochs(members, step, start, resumed, engine, label,
                      lambda new_rows, running: sweep_stats([r["test_acc"] for r in new_rows], running, R), progress,
                      timing_extra={"members": S}, on_eval=on_eval)


class StackedStep:
    """train.Step of the stacked models: StackedForward, the per-member mean cross-entropies summed
    before backward (each member's .grad is its own gradient), every member's own AdamW."""

    def __init__(self, forward: StackedForward, models: list[GeoTransformer], opts: list, recorded: int,
                 train_x: list[Tensor], train_y: Tensor, test_x: list[Tensor], test_y: Tensor):
        self.forward, self.models, self.opts, self.recorded = forward, models, opts, recorded
        self.train_x, self.train_y, self.test_x, self.test_y = train_x, train_y, test_x, test_y
        self.probes = [PrecursorProbe(m, x) for m, x in zip(models[:recorded], train_x)]

    def backward(self, record: bool) -> None:
        self.logits = self.forward(self.train_x)
        self.losses = member_losses(self.logits, self.train_y)
        for opt in self.opts:
            opt.zero_grad(set_to_none=True)
        self.losses.sum().backward()

    def evaluate(self, epoch: int, elapsed: float) -> list[dict]:
        return _evaluate(self.forward, self.models, self.probes, epoch, self.losses, self.logits, self.train_x,
                         self.train_y, self.test_x, self.test_y, elapsed)

    def update(self) -> None:
        for opt in self.opts:
            opt.step()

    def keep(self, running: list[bool]) -> None:
        """Train only the recorded members whose flag is True, plus one unrecorded passenger (a finished
        member or the original one) while fewer than two are left: a member's numbers are the same in
        every stack of two or more, so they do not change."""
        keep = [i for i, r in enumerate(running) if r]
        self.probes = [self.probes[i] for i in keep]
        passenger = [next(i for i in range(len(self.models)) if i not in keep)] if len(keep) < 2 else []
        self.recorded = len(keep)
        keep += passenger
        self.models, self.opts = [self.models[i] for i in keep], [self.opts[i] for i in keep]
        self.train_x, self.test_x = [self.train_x[i] for i in keep], [self.test_x[i] for i in keep]
        self.train_y, self.test_y = self.train_y[keep], self.test_y[keep]
        self.forward = StackedForward(self.models)


@torch.no_grad()
def _evaluate(forward, models, probes, epoch, losses, logits, train_x, train_y, test_x, test_y, elapsed) -> list[dict]:
    """One metrics row per recorded member (one probe each: the single-run columns and the precursor
    columns), from the training forward and a test forward (one device-to-host transfer for the
    statistics, one for the norms)."""
    test_logits = forward(test_x)
    R = len(probes)
    stats = torch.stack([losses.detach(), (logits.argmax(-1) == train_y).float().mean(1), member_losses(test_logits, test_y),
                         (test_logits.argmax(-1) == test_y).float().mean(1),
                         torch.maximum(logits.abs().flatten(1).amax(1), test_logits.abs().flatten(1).amax(1))], 1)[:R]
    extra = torch.stack([probe.values(m, member_logits, eq_activations(m, x))
                         for probe, m, member_logits, x in zip(probes, models, logits, train_x)])
    values = torch.cat([stats, extra], 1).tolist()
    norms = torch.stack([squared_norms(m) for m in models[:R]]).tolist()  # [R][2][n_params]
    return [evaluated_row(probe, epoch, member_values, member_norms, elapsed)
            for probe, member_values, member_norms in zip(probes, values, norms)]
