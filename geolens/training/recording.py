"""A training run's records: what the loop writes into its run directory, and reads back to resume.

Metrics rows (metrics_row, from the evaluation's statistics and squared_norms; evaluated_row adds the
precursor columns), run.json's header
(run_header), checkpoints with the resume state (write_checkpoint: snapshots now, writes queued on
a storage.BackgroundWriter in an order that keeps the run directory consistent), the final records
(finish_run), and the resume state read back into a model and its optimizer (from_resume_state).
docs/run-format.md describes the files; onset events live in geolens.runs.events. Used by both
loops (training.train, training.batched) and by sweeps (finishing members).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from geolens.model.config import GeoConfig
from geolens.model.schedule import parse_keep
from geolens.model.transformer import GeoTransformer
from geolens.runs.events import finish_events
from geolens.runs.runlock import NewRunClaim
from geolens.runs.storage import (
    BackgroundWriter,
    RunDir,
    atomic_write_json,
    machine,
    package_versions,
    save_tensors,
    source_commit,
    write_metrics,
)
from geolens.training.engine import make_optimizer
from geolens.training.optimizers import MUON_RATE_RULE
from geolens.training.precursor_columns import PrecursorProbe, skipped_columns
from geolens.training.wait_policy import wait_policy


# ---- run.json and metrics rows ---------------------------------------------------------------
def run_header(cfg: GeoConfig, engine: str, why: str, n_train: int, n_test: int, start: int = 0,
               prev: dict | None = None, *, device: torch.device) -> dict:
    """run.json contents (without format and timing) of a run that is training from epoch `start`;
    prev: the run's run.json before this (resumed) training, None for a new run. `segments` lists
    who trained which part: the previous segments that began before `start` (a later one trained
    epochs that are trained again now) and one from `start` with this geolens version and commit and
    the machine training on `device` (storage.machine, with its OpenMP wait policy: wait_policy; a run written before segments were recorded
    starts with one of its recorded version); a fork keeps its lineage (`fork`, geolens.training.fork);
    skipped_columns: the precursor columns this config leaves NaN, with why (precursor_columns)."""
    versions = package_versions()
    segments = (prev or {}).get("segments", [])
    if prev and not segments:
        segments = [{"from_epoch": 0, "geolens": prev.get("versions", {}).get("geolens"), "geolens_commit": None}]
    segments = [seg for seg in segments if seg["from_epoch"] < start]
    segments.append({"from_epoch": start, "geolens": versions["geolens"], "geolens_commit": source_commit(),
                     "machine": {**machine(device), "omp_wait_policy": wait_policy()}})
    lineage = {"fork": prev["fork"]} if prev and "fork" in prev else {}
    return {"config": cfg.to_dict(), "versions": versions, "engine": engine, "engine_reason": why,
            "n_train": n_train, "n_test": n_test, "skipped_columns": skipped_columns(cfg), "segments": segments,
            **lineage, **({"muon_rate": MUON_RATE_RULE} if cfg.optimizer == "muon" else {}), "status": "running"}


def squared_norms(model: GeoTransformer) -> Tensor:
    """[2, n_params] on the model's device: each parameter's and each gradient's squared L2 norm (0 without a grad)."""
    params = list(model.parameters())
    return torch.stack([torch.stack([p.pow(2).sum() for p in params]),
                        torch.stack([p.new_zeros(()) if p.grad is None else p.grad.pow(2).sum() for p in params])])


N_STATS = 5  # metrics_row's stats: train loss, train acc, test loss, test acc, max |logit|


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


def evaluated_row(probe: PrecursorProbe, epoch: int, values: list[float], norms: list[list[float]],
                  elapsed: float) -> dict:
    """A whole metrics row: metrics_row of values[:N_STATS] (its stats) and the probe's precursor columns
    from values[N_STATS:] (PrecursorProbe.values), the parameters' squared norms and the losses."""
    row = metrics_row(epoch, values[:N_STATS], norms, elapsed)
    return {**row, **probe.row(values[N_STATS:], norms[0], row["train_loss"], row["test_loss"])}


# ---- optimizer state and the resume state ----------------------------------------------------
def optimizer_tensors(model: GeoTransformer, opt: torch.optim.Optimizer) -> dict[str, Tensor]:
    """The optimizer state of `model`'s parameters as resume-state tensors opt.<param>.<key>."""
    out = {}
    for name, param in model.named_parameters():
        for key, value in opt.state.get(param, {}).items():
            if value is not None:  # SGD without momentum keeps momentum_buffer = None
                out[f"opt.{name}.{key}"] = value if isinstance(value, Tensor) else torch.tensor(value)
    return out


def load_optimizer_tensors(model: GeoTransformer, opt: torch.optim.Optimizer, tensors: dict[str, Tensor]) -> None:
    """Set `opt`'s state from resume-state tensors opt.<param>.<key> (copied onto the parameters' device)."""
    for name, param in model.named_parameters():
        prefix = f"opt.{name}."
        state = {k[len(prefix) :]: v.to(param.device, copy=True) for k, v in tensors.items() if k.startswith(prefix)}
        if state:
            opt.state[param] = state


def from_resume_state(cfg: GeoConfig, state: dict[str, Tensor], dev: torch.device):
    """The model (on `dev`) and its optimizer (cfg.optimizer) with the weights and optimizer state of a resume state."""
    model = GeoTransformer(cfg)
    model.load_state_dict({k[len("model.") :]: v for k, v in state.items() if k.startswith("model.")})
    model.to(dev)
    opt = make_optimizer(model)
    load_optimizer_tensors(model, opt, state)
    return model, opt


# ---- checkpoints and the final records (written on a BackgroundWriter) -----------------------
def snapshot(tensors: dict[str, Tensor]) -> dict[str, Tensor]:
    """CPU copies of `tensors`: what a queued write may hold while training changes the originals."""
    return {k: v.detach().to("cpu", copy=True) for k, v in tensors.items()}


def write_checkpoint(writer: BackgroundWriter, run: RunDir, weights: dict[str, Tensor], opt_state: dict[str, Tensor],
                     epoch: int, rows: list, manifest: list, events: dict, header: dict, timing: dict,
                     eval_every: int, full: bool | None = None) -> None:
    """Checkpoint `epoch`: snapshot the weights (a state_dict), the optimizer state (opt.<param>.<key>),
    rows, events and timing now, add the manifest entry, and queue the writes on `writer`. full: whether the
    checkpoint also keeps its optimizer state in optim_<epoch> (default: as the config's storage policy
    `keep` says, model.schedule.KeepPolicy); the resume state always holds it."""
    row = rows[-1]
    prev = manifest[-1]["step"] if manifest else None
    if full is None:
        full = parse_keep(header["config"]["keep"]).full(epoch, prev)
    manifest.append(run.manifest_entry(epoch, {k: row[k] for k in ("train_loss", "train_acc", "test_loss", "test_acc")}))
    writer.submit(_write_checkpoint, writer, run, snapshot(weights), snapshot(opt_state), epoch, list(rows),
                  list(manifest), {**events, "eval_every": eval_every}, {**header, "timing": dict(timing)}, full)


def _write_checkpoint(writer: BackgroundWriter, run: RunDir, weights: dict[str, Tensor], opt_state: dict[str, Tensor],
                      epoch: int, rows: list, manifest: list, events: dict, header: dict, full: bool) -> None:
    """Metrics, events, the step's optimizer state (if full) and weights, the manifest, then the resume state
    (weights as model.*, the optimizer state) and run.json, in that order, so everything a resume state refers
    to is on disk before it."""
    write_metrics(run.metrics_csv, rows)
    atomic_write_json(run.events_json, events)
    if full:
        save_tensors(run.optim_path(epoch), {**opt_state, "epoch": torch.tensor(epoch)}, metadata={"step": str(epoch)})
    run.save_checkpoint(epoch, weights, manifest)
    state = {f"model.{k}": v for k, v in weights.items()}
    state.update(opt_state)
    state["epoch"] = torch.tensor(epoch)
    save_tensors(run.resume_file, state)
    _write_header(writer, run, header)


def mark_started(claim: NewRunClaim, run: RunDir) -> None:
    """Writer job after a new run's first checkpoint: the claim swaps it into place; later writes follow."""
    claim.started()
    run.path = claim.path


def finish_run(writer: BackgroundWriter, run: RunDir, header: dict, rows: list, start: int, stop_reason: str,
               eval_every: int, timing: dict) -> dict:
    """Queue the final events.json and the finished run.json on `writer`; returns the events."""
    events = finish_events(rows, stop_reason, eval_every, start)
    timing = {**timing, "ms_per_epoch": 1000 * timing["train_s"] / max(timing["epochs_timed"], 1)}
    writer.submit(_write_finish, writer, run, dict(events), {**header, "status": "finished", "stop_reason": stop_reason,
                                                             "timing": timing})
    return events


def _write_finish(writer: BackgroundWriter, run: RunDir, events: dict, header: dict) -> None:
    atomic_write_json(run.events_json, events)
    _write_header(writer, run, header)


def _write_header(writer: BackgroundWriter, run: RunDir, header: dict) -> None:
    """run.json from a job on `writer`: its timing's write_s (the value when training started) plus the
    writer's time so far."""
    timing = header["timing"]
    run.write_header({**header, "timing": {**timing, "write_s": timing["write_s"] + writer.busy_s}})
