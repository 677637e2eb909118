"""Batched training: many members (seeds, and configs of one shape) as one stacked model in one process.

Every parameter is stacked over the S members ([S, *shape]). `StackedForward` computes the
per-member logits: with the fast path (one-layer models, engine auto/fast) it calls fast_logits
per member on that member's parameter slices, otherwise it vmaps the hooked GeoTransformer
forward over the members (torch.func.vmap + functional_call); either way the math is a single
run's. The per-member mean cross-entropies are summed before backward, so each
member's slice of a stacked gradient is exactly its own gradient. `StackedAdamW` is
torch.optim.AdamW's update (single-tensor path) written elementwise over the stacked tensors
with per-member lr / weight decay / betas.

Each member starts from GeoTransformer(cfg_i)'s initialisation and trains on make_dataset(cfg_i),
as a single run would, and is written as an ordinary run directory (run.json with its own config,
metrics.csv, events.json, checkpoints/, resume.safetensors in the single-run key format), so
`geolens train --resume --out DIR` continues a member with the single-run code. A member that
early-stops is finalised and no longer recorded; the stack keeps stepping it until every member is
done (the batch ends when the last member stops).
"""

from __future__ import annotations

import math
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor

from geolens.config import GeoConfig
from geolens.errors import GeoError
from geolens.model import GeoTransformer
from geolens.progress import EpochProgress, sweep_stats
from geolens.schedule import parse_schedule
from geolens.storage import RunDir
from geolens.tasks import make_dataset
from geolens.train import TrainResult, choose_engine, early_stop_due, finish_run, onset_events, run_header, write_checkpoint

#: config fields members of one batch may differ in; every other field must agree
MEMBER_FIELDS = ("seed", "data_seed", "lr", "weight_decay", "beta1", "beta2", "early_stop_after", "preset")
ADAM_EPS = 1e-8
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


def stack_params(models: list[GeoTransformer]) -> dict[str, Tensor]:
    """{name: [S, *shape]} leaf tensors (requires_grad) stacked from each member's parameters."""
    named = [dict(m.named_parameters()) for m in models]
    return {n: torch.stack([d[n].detach() for d in named]).requires_grad_(True) for n in named[0]}


class StackedForward:
    """forward(params {name: [S, *shape]}, tokens [S][B, n_ctx]) -> per-member logits [S, B, C].

    Engine 'fast' (cfg.engine auto/fast on a model geolens.fast supports): fast_logits per member,
    through functional_call with that member's parameter slices, so each member's math is exactly a
    single fast run's; pass the same per-member token tensors every call (fast.py caches their index
    plans). Engine 'hooked': the hooked forward, vmapped over the members.
    """

    def __init__(self, model: GeoTransformer):
        self.model = model
        self.engine, self.why = choose_engine(model.cfg)
        if self.engine == "hooked":
            self.why += "; members vmapped over the hooked forward"
        else:
            self.why = "fast path per member over stacked parameters"
            self.wrapper = _FastWrapper(model)

    def __call__(self, params: dict[str, Tensor], tokens: list[Tensor]) -> Tensor:
        if self.engine == "hooked":
            return stacked_logits(self.model, params, torch.stack(tokens))
        return torch.stack([
            torch.func.functional_call(self.wrapper, {f"model.{n}": t[i] for n, t in params.items()}, (x,))
            for i, x in enumerate(tokens)
        ])


class _FastWrapper(torch.nn.Module):
    """Module whose forward is fast_logits of the wrapped model (so functional_call can swap its parameters)."""

    def __init__(self, model: GeoTransformer):
        super().__init__()
        self.model = model

    def forward(self, tokens: Tensor) -> Tensor:
        from geolens.fast import fast_logits

        return fast_logits(self.model, tokens)


def stacked_logits(model: GeoTransformer, params: dict[str, Tensor], tokens: Tensor) -> Tensor:
    """Per-member logits [S, B, C] of tokens [S, B, n_ctx] under params {name: [S, *shape]} (hooked forward, vmapped)."""
    return torch.func.vmap(lambda p, x: torch.func.functional_call(model, p, (x,)))(params, tokens)


def member_losses(logits: Tensor, labels: Tensor) -> Tensor:
    """Per-member mean cross-entropy [S] of logits [S, B, C] against labels [S, B]."""
    S, B, C = logits.shape
    return F.cross_entropy(logits.reshape(S * B, C), labels.reshape(S * B), reduction="none").view(S, B).mean(1)


class StackedAdamW:
    """torch.optim.AdamW (amsgrad off, eps 1e-8) over stacked tensors, hyperparameters per member.

    Per step t and member i: p *= 1 - lr_i wd_i; m.lerp_(g, 1 - b1_i); v = b2_i v + (1 - b2_i) g^2;
    p -= lr_i / (1 - b1_i^t) * m / (sqrt(v) / sqrt(1 - b2_i^t) + eps). Scalars are formed in float64
    (as torch does with Python floats) and applied as [S, 1, ...] tensors. A tensor whose grad is
    None is skipped and gets no state (as torch does).
    """

    def __init__(self, cfgs: list[GeoConfig]):
        col = lambda name: torch.tensor([getattr(c, name) for c in cfgs], dtype=torch.float64)  # noqa: E731
        self.lr, self.wd, self.b1, self.b2 = col("lr"), col("weight_decay"), col("beta1"), col("beta2")
        self.t = 0
        self.state: dict[str, tuple[Tensor, Tensor]] = {}

    @torch.no_grad()
    def step(self, params: dict[str, Tensor]) -> None:
        self.t += 1
        decay = 1 - self.lr * self.wd
        step_size = self.lr / (1 - self.b1**self.t)
        bc2_sqrt = (1 - self.b2**self.t).sqrt()
        for name, p in params.items():
            g = p.grad
            if g is None:
                continue
            if name not in self.state:
                self.state[name] = (torch.zeros_like(p), torch.zeros_like(p))
            m, v = self.state[name]
            col = lambda x: x.to(p.dtype).view((-1,) + (1,) * (p.dim() - 1))  # noqa: E731
            p.mul_(col(decay))
            m.lerp_(g, col(1 - self.b1))
            v.mul_(col(self.b2)).add_(col(1 - self.b2) * g * g)
            denom = (v.sqrt() / col(bc2_sqrt)).add_(ADAM_EPS)
            p.add_(col(-step_size) * m / denom)

    def member_tensors(self, i: int) -> dict[str, Tensor]:
        """Member i's state under train.optimizer_tensors' keys (opt.<param>.step|exp_avg|exp_avg_sq)."""
        out = {}
        for name, (m, v) in self.state.items():
            out[f"opt.{name}.step"] = torch.tensor(float(self.t))
            out[f"opt.{name}.exp_avg"] = m[i].clone()
            out[f"opt.{name}.exp_avg_sq"] = v[i].clone()
        return out


def train_batched(cfgs: list[GeoConfig], outs: list[str | Path], force: bool = False,
                  progress: bool = True) -> list[TrainResult]:
    """Train member i = cfgs[i] into run directory outs[i] (existing ones are refused unless force)."""
    check_members(cfgs)
    if len(outs) != len(cfgs):
        raise GeoError(f"{len(cfgs)} member configs but {len(outs)} output directories")
    runs = [RunDir(o) for o in outs]
    taken = [str(r.path) for r in runs if r.exists()]
    if taken and not force:
        raise GeoError(f"run directories {taken} already exist; use --force to replace them or choose another --out")
    for r in runs:
        r.prepare_new(force)
    S, cfg = len(cfgs), cfgs[0]
    models = [GeoTransformer(c) for c in cfgs]
    template = models[0]
    params = stack_params(models)
    opt = StackedAdamW(cfgs)
    data = [make_dataset(c) for c in cfgs]
    train_x, test_x = [d.train[0] for d in data], [d.test[0] for d in data]
    train_y, test_y = torch.stack([d.train[1] for d in data]), torch.stack([d.test[1] for d in data])
    schedule = parse_schedule(cfg.checkpoints)
    forward = StackedForward(template)
    why = f"{S} members stacked; {forward.why}"
    headers = [run_header(c, f"{ENGINE}-{forward.engine}", why, train_y.shape[1], test_y.shape[1]) for c in cfgs]
    timing = {"train_s": 0.0, "eval_s": 0.0, "ckpt_s": 0.0, "epochs_timed": 0, "members": S}
    for r, h in zip(runs, headers):
        r.write_header({**h, "timing": timing})
    rows: list[list[dict]] = [[] for _ in cfgs]
    manifests: list[list[dict]] = [[] for _ in cfgs]
    results: list[TrainResult | None] = [None] * S
    t_start = time.perf_counter()
    epoch = 0
    with EpochProgress(cfg.epochs, 0, progress, f"{S} x {cfg.preset or cfg.norm} {cfg.task} p={cfg.p}") as bar:
        while True:
            t0 = time.perf_counter()
            logits = forward(params, train_x)
            losses = member_losses(logits, train_y)
            for p in params.values():
                p.grad = None
            losses.sum().backward()
            t1 = time.perf_counter()
            timing["train_s"] += t1 - t0
            if epoch % cfg.eval_every == 0 or epoch == cfg.epochs:
                new_rows = _evaluate(forward, params, epoch, losses, logits, train_y, test_x, test_y, t1 - t_start)
                t2 = time.perf_counter()
                timing["eval_s"] += t2 - t1
                for i in (i for i in range(S) if results[i] is None):
                    rows[i].append(new_rows[i])
                    events = onset_events(rows[i])
                    done, stop_reason = epoch >= cfg.epochs, "completed"
                    if early_stop_due(cfgs[i], epoch, events):
                        done, stop_reason = True, "early_stop"
                    last = manifests[i][-1] if manifests[i] else None
                    if done or schedule.wants(epoch, last, new_rows[i]):
                        weights = {n: t[i].detach().clone() for n, t in params.items()}
                        write_checkpoint(runs[i], weights, opt.member_tensors(i), epoch, rows[i], manifests[i],
                                         events, headers[i], timing, cfg.eval_every)
                    if done:
                        ev = finish_run(runs[i], headers[i], rows[i], 0, stop_reason, cfg.eval_every, dict(timing))
                        results[i] = TrainResult(runs[i].path, rows[i], ev, f"{ENGINE}-{forward.engine}")
                timing["ckpt_s"] += time.perf_counter() - t2
                bar.update(epoch, sweep_stats([r["test_acc"] for r in new_rows], sum(r is None for r in results), S))
                if all(r is not None for r in results):
                    break
            t3 = time.perf_counter()
            opt.step(params)
            timing["train_s"] += time.perf_counter() - t3
            timing["epochs_timed"] += 1
            epoch += 1
    return results  # type: ignore[return-value]


@torch.no_grad()
def _evaluate(forward, params, epoch, losses, logits, train_y, test_x, test_y, elapsed) -> list[dict]:
    """One metrics row per member (the single-run columns), from the training forward and a test forward."""
    test_logits = forward(params, test_x)
    test_losses = member_losses(test_logits, test_y)
    weight_sq = [0.0] * len(losses)
    grad_sq = [0.0] * len(losses)
    for p in params.values():
        for i, x in enumerate(p.pow(2).flatten(1).sum(1).tolist()):
            weight_sq[i] += x
        if p.grad is not None:
            for i, x in enumerate(p.grad.pow(2).flatten(1).sum(1).tolist()):
                grad_sq[i] += x
    train_acc = (logits.argmax(-1) == train_y).float().mean(1)
    test_acc = (test_logits.argmax(-1) == test_y).float().mean(1)
    max_logit = torch.maximum(logits.abs().flatten(1).amax(1), test_logits.abs().flatten(1).amax(1))
    return [
        {
            "epoch": epoch,
            "train_loss": losses[i].item(),
            "train_acc": train_acc[i].item(),
            "test_loss": test_losses[i].item(),
            "test_acc": test_acc[i].item(),
            "weight_norm": math.sqrt(weight_sq[i]),
            "grad_norm": math.sqrt(grad_sq[i]),
            "max_abs_logit": max_logit[i].item(),
            "elapsed_s": elapsed,
        }
        for i in range(len(losses))
    ]
