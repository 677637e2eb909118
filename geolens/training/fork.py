"""Forks: a new run that starts from another run's checkpoint, with some of its settings changed.

prepare_fork(parent, step, out, changes) writes OUT as a run directory paused at epoch `step` (any epoch of
the parent's trajectory: its state there is stored or replayed, training.replay): the parent's metrics rows
before it (copied), the parent's checkpoints before it by reference (their SHA-256 in run.json: Run.parent
reads them, refusing a moved, deleted or retrained parent), the fork's own state at `step` (the parent's
weights and optimizer state mapped onto the new config by
map_state, held at the norm clamp if one is set; a fork that switches optimizer starts it fresh, recorded in
the mapping), its metrics row there (the parent's, or evaluated
anew when the change alters the forward at `step` or the parent did not evaluate it), its preset named for
what it became (fork_preset), that checkpoint, the resume state, and run.json
with the new config and the lineage (`fork`: parent path and identity, step, changes, mapping).
fork() continues it with the ordinary resume, so a fork without changes is bit for bit the parent's
own continuation (same engine, threads and machine); sweeps continue many prepared forks stacked.
The parent is only read.
"""

from __future__ import annotations

from pathlib import Path

from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import FIELD_ROLES, GeoConfig, config_fields
from geolens.model.hyperschedule import parse_hyper_schedule, resolve_relative
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.runs.events import onset_events
from geolens.runs.run import Run
from geolens.runs.runlock import NewRunClaim
from geolens.runs.storage import BackgroundWriter, RunDir, file_sha256, load_tensors, read_metrics
from geolens.training.controls import Controls
from geolens.model.engines import Engine
from geolens.training.engine import make_optimizer, select_forward, training_device
from geolens.training.optimizers import check_muon_rate
from geolens.training.recording import load_optimizer_tensors, optimizer_tensors, run_header, write_checkpoint
from geolens.training.replay import TrainingState, last_epoch, state_at
from geolens.training.train import SingleStep, TrainResult, resume

#: fields a fork cannot change, and why (their declared roles, geolens.model.roles)
REFUSED = {name: roles.fork_refused for name, roles in FIELD_ROLES.items() if roles.fork_refused}
#: fields whose change alters the forward at the fork step (its metrics row is then evaluated anew)
FORWARD_FIELDS = config_fields(forward=True, fork_refused="")


def placement_renames(parent: GeoConfig, cfg: GeoConfig) -> dict[str, str]:
    """{parent norm module: fork norm module} when the fork switches norm_placement, else {}. Each norm is
    matched with the one that normalises the input of the same sublayer: post embed_norm <-> pre blocks.0.ln1
    (layer 0's attention), blocks.L.attn_norm <-> blocks.L.ln2 (layer L's MLP), blocks.L.mlp_norm <->
    blocks.(L+1).ln1 (the next attention), the last mlp_norm <-> ln_final (the readout)."""
    if parent.norm_placement == cfg.norm_placement:
        return {}
    L = cfg.n_layers
    post_to_pre = {"embed_norm": "blocks.0.ln1"}
    for layer in range(L):
        post_to_pre[f"blocks.{layer}.attn_norm"] = f"blocks.{layer}.ln2"
        post_to_pre[f"blocks.{layer}.mlp_norm"] = f"blocks.{layer + 1}.ln1" if layer + 1 < L else "ln_final"
    return post_to_pre if cfg.norm_placement == "pre" else {v: k for k, v in post_to_pre.items()}


def _renamed(name: str, renames: dict[str, str]) -> str:
    """`name` (a parameter 'module.leaf' or an optimizer key 'opt.module.leaf.key') with its module renamed."""
    prefix = "opt." if name.startswith("opt.") else ""
    rest = name[len(prefix):]
    for old, new in renames.items():
        if rest.startswith(old + "."):
            return prefix + new + rest[len(old):]
    return name


def forked_config(parent: GeoConfig, step: int, changes: dict) -> GeoConfig:
    """The parent's config (at `step`: Run.config_at) with `changes` and its preset named for what it became
    (fork_preset); a GeoError for a refused field or an epoch budget not past `step`."""
    for name in changes:
        if name in REFUSED:
            raise GeoError(f"a fork cannot change '{name}': {REFUSED[name]}; train a new run instead")
    cfg = GeoConfig.from_dict({**parent.to_dict(), **changes})
    if cfg.epochs <= step:
        raise GeoError(f"the fork would end at epoch {cfg.epochs}, not after its start {step}; pass --epochs N with N > {step}")
    return cfg if "preset" in changes else cfg.replace(preset=fork_preset(parent, cfg, step))


def map_state(new: GeoTransformer, weights: dict[str, Tensor], opt_state: dict[str, Tensor],
              renames: dict[str, str] | None = None) -> tuple[dict[str, Tensor], dict[str, Tensor], dict]:
    """The parent's weights and optimizer state (opt.<param>.<key>) mapped onto model `new`'s parameters,
    after renaming the parent's norm modules by `renames` (placement_renames): a parameter both have keeps
    the parent's value and AdamW state; one only `new` has keeps new's initial value and no AdamW state
    (moments at zero, as for a fresh optimizer); one only the parent has is dropped. Returns (weights,
    optimizer state, {'added': [...], 'dropped': [...]} plus 'renamed': renames when there are any)."""
    renames = renames or {}
    weights = {_renamed(k, renames): v for k, v in weights.items()}
    opt_state = {_renamed(k, renames): v for k, v in opt_state.items()}
    own = new.state_dict()
    out, added = {}, []
    for name, value in own.items():
        if name in weights:
            if weights[name].shape != value.shape:
                raise GeoError(f"parameter {name} has shape {tuple(weights[name].shape)} in the parent and "
                               f"{tuple(value.shape)} in the fork; a fork cannot change parameter shapes")
            out[name] = weights[name]
        else:
            out[name] = value.detach().clone()
            added.append(name)
    dropped = [name for name in weights if name not in own]
    keep = {f"opt.{name}." for name, _ in new.named_parameters() if name not in added}
    opt = {k: v for k, v in opt_state.items() if any(k.startswith(prefix) for prefix in keep)}
    return out, opt, {"added": added, "dropped": dropped, **({"renamed": renames} if renames else {})}


def with_schedule(changes: dict, base: GeoConfig, step: int, schedule: list[str]) -> dict:
    """`changes` with the schedule entries added (windows relative to `step` made absolute) to the schedule
    the changes set, or else to `base`'s (the parent's at the fork step)."""
    if not schedule:
        return changes
    return {**changes, "schedule": [*changes.get("schedule", base.schedule), *resolve_relative(schedule, step)]}


def prepare_fork(parent: str | Path, step: int, out: str | Path, changes: dict | None = None,
                 force: bool = False, schedule: list[str] = (), progress: bool = False) -> Path:
    """Write OUT as the fork of `parent` at epoch `step` (any epoch of its trajectory: the state stored there,
    or replayed from the nearest earlier full state, training.replay) with config `changes` and the schedule
    entries `schedule` added (with_schedule; module docstring), ready to be continued by resume; returns its
    path. A step outside the trajectory, a refused change or an OUT inside the parent is refused before
    anything is written."""
    prun = Run(parent)
    out = Path(out)
    if out.resolve() == prun.path.resolve() or prun.path.resolve() in out.resolve().parents:
        raise GeoError(f"--out {out} is the parent run or inside it; the parent is never written: choose another --out")
    check_fork_step(prun, step)
    pcfg = prun.config_at(step, scheduled_tau=False)  # a fork's parent config before its own fork step
    cfg = forked_config(pcfg, step, with_schedule(dict(changes or {}), pcfg, step, schedule))
    switched = pcfg.optimizer != cfg.optimizer  # never one optimizer's state in another: the new one starts fresh
    if not switched:
        check_muon_rate(prun.header, prun.path)
    if switched and step in prun.steps:  # the weights are all it takes: no replay (e.g. a trimmed export)
        state = TrainingState(step, pcfg, load_tensors(prun.checkpoint_file(step)), {}, step)
    else:
        state = state_at(prun, step, progress)
    rows = [r for r in read_metrics(prun.dir.metrics_csv) if r["epoch"] <= step]
    if not rows or rows[-1]["epoch"] < step - pcfg.eval_every:
        raise GeoError(f"{prun.dir.metrics_csv} has no row near epoch {step}; `geolens info --run {prun.path}` says "
                       "what is damaged")

    model = GeoTransformer(cfg)  # initial values of the parameters the new config adds
    weights, opt_state, mapping = map_state(model, state.weights, {} if switched else state.opt_state,
                                            placement_renames(pcfg, cfg))
    if switched:
        mapping["optimizer"] = {"from": pcfg.optimizer, "to": cfg.optimizer, "state": "fresh"}
    if state.source != step:
        mapping["replayed_from"] = state.source
    model.load_state_dict(weights)
    opt = make_optimizer(model)
    load_optimizer_tensors(model, opt, opt_state)
    controls = Controls(cfg, model, opt)
    controls.clamp()
    controls.before(step)
    data = make_dataset(cfg)
    engine, forward, why = select_forward(model)
    if rows[-1]["epoch"] != step or _forward_changed(pcfg, cfg, step):  # a row at the fork step, as the fork sees it
        row = _evaluate_at(model, opt, engine, forward, data, step, rows[-1]["elapsed_s"])
        rows = [*rows[:-1], row] if rows[-1]["epoch"] == step else [*rows, row]
    timing = {"train_s": 0.0, "eval_s": 0.0, "ckpt_s": 0.0, "write_s": 0.0, "epochs_timed": 0}
    header = {**run_header(cfg, engine.name, why, len(data.train[1]), len(data.test[1]), step, prun.header,
                           device=training_device(cfg)),
              "fork": lineage(prun, pcfg, cfg, step, mapping), "timing": timing}
    with NewRunClaim(out, force, "fork") as claim:  # run.json first, the resume state last: a fork killed
        run = RunDir(claim.path)                        # in between is a run without resume state (retrained)
        run.write_header(header)
        run.ckpt_dir.mkdir(parents=True, exist_ok=True)
        with BackgroundWriter() as writer:  # the training loop's checkpoint: the same files, in the same order
            write_checkpoint(writer, run, model.state_dict(), optimizer_tensors(model, opt), step, rows, [],
                             onset_events(rows), header, timing, cfg.eval_every, full=True)
        claim.started()
    return Path(out)


def check_fork_step(prun: Run, step: int) -> None:
    """Refuse (GeoError naming the step) an epoch outside the parent's trajectory (0 to its newest state)."""
    end = last_epoch(prun)
    if not 0 <= step <= end:
        raise GeoError(f"--step {step} is outside the trajectory of {prun.path}, which ends at epoch {end}; "
                       f"fork at an epoch from 0 to {end}")


def fork_preset(pcfg: GeoConfig, cfg: GeoConfig, step: int) -> str:
    """The fork's preset string: the parent's, then what the fork changed at `step` ('ln>@3000:norm=sphere,unembed=bounded')."""
    old, new = pcfg.to_dict(), cfg.to_dict()
    changed = [f"{k}={_short(new[k])}" for k in new if new[k] != old[k] and k not in ("epochs", "preset")]
    base = pcfg.preset or pcfg.norm
    return f"{base}>@{step}:{','.join(changed)}" if changed else base


def _short(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, list) else str(value)


def fork(parent: str | Path, step: int, out: str | Path, changes: dict | None = None, force: bool = False,
         progress: bool = True, schedule: list[str] = ()) -> TrainResult:
    """Fork `parent` at checkpoint `step` into `out` with config `changes` and schedule entries `schedule`
    (prepare_fork) and train it to its epochs (training.train.resume); returns the TrainResult."""
    prepare_fork(parent, step, out, changes, force, schedule, progress)
    return resume(out, progress=progress)


def lineage(prun: Run, pcfg: GeoConfig, cfg: GeoConfig, step: int, mapping: dict) -> dict:
    """run.json's `fork` record: the parent (path; identity: its config's GeoConfig.sha256 and the hash of
    the checkpoint forked from; its own `fork` record when it is a fork), the step, the fields changed
    against pcfg (the parent's config at `step`) and the mapping."""
    old, new = pcfg.to_dict(), cfg.to_dict()
    inherited = [s for s in prun.steps if s < step]
    return {
        "parent": str(prun.path.resolve()),
        "parent_identity": {"config_sha256": prun.config.sha256(),
                            "checkpoint_sha256": file_sha256(prun.checkpoint_file(step)) if step in prun.steps else None},
        "step": step,
        "parent_checkpoints": {str(s): file_sha256(prun.checkpoint_file(s)) for s in inherited},
        "changes": {k: {"from": old[k], "to": new[k]} for k in new if new[k] != old[k]},
        "mapping": mapping,
        "parent_fork": prun.header.get("fork"),
    }


def _forward_changed(pcfg: GeoConfig, cfg: GeoConfig, step: int) -> bool:
    """Whether the forward at `step` differs between the parent's config and the fork's."""
    if any(getattr(pcfg, f) != getattr(cfg, f) for f in FORWARD_FIELDS):
        return True
    tau = [parse_hyper_schedule(c.schedule).value("tau", c.tau, step) for c in (pcfg, cfg)]
    return tau[0] != tau[1]


def _evaluate_at(model: GeoTransformer, opt, engine: Engine, forward, data, step: int, elapsed: float) -> dict:
    """The metrics row of `model` at `step` on the task's data (the training loop's evaluation with `forward`)."""
    single = SingleStep(model, opt, engine, forward, *data.train, *data.test)
    single.backward(record=True)
    row = single.evaluate(step, elapsed)[0]
    opt.zero_grad(set_to_none=True)
    return row
