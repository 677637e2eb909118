"""Interventions inside a training loop: hyperparameter schedules and the weight-norm clamp.

Controls(cfg, model, opt) acts on one member: `before(epoch)` sets the lr (each parameter group's as its
optimizer defines it: optimizers.group_lr) and weight decay of the step at `epoch` and the readout temperature of the forward at `epoch` (geolens.model.hyperschedule:
pure functions of the epoch, so resumed and forked runs follow the schedule exactly); `clamp()`
rescales every parameter by one factor so that their total L2 norm is cfg.norm_clamp (called after
every optimizer step, and on the first state a loop records). Without a schedule or a clamp both
are no-ops. Used by geolens.training.train.run_epochs (every loop) and geolens.training.fork.
"""

from __future__ import annotations

import torch

from geolens.model.config import GeoConfig
from geolens.model.hyperschedule import parse_hyper_schedule
from geolens.model.transformer import GeoTransformer
from geolens.training.optimizers import group_lr, group_weight_decay


class Controls:
    """The schedule and the clamp of one member (its cfg, model and AdamW)."""

    def __init__(self, cfg: GeoConfig, model: GeoTransformer, opt: torch.optim.Optimizer):
        self.cfg, self.model, self.opt = cfg, model, opt
        self.schedule = parse_hyper_schedule(cfg.schedule)
        self.scheduled = bool(self.schedule.windows or self.schedule.warmup)

    def before(self, epoch: int) -> None:
        """Set this epoch's lr, weight decay (the step from `epoch`) and tau (the forward at `epoch`)."""
        if not self.scheduled:
            return
        s, cfg = self.schedule, self.cfg
        lr, wd = s.value("lr", cfg.lr, epoch), s.value("weight_decay", cfg.weight_decay, epoch)
        for group in self.opt.param_groups:  # each group's lr as its optimizer defines it (Muon's from muon_lr)
            group["lr"] = group_lr(group, cfg, lr)
            group["weight_decay"] = group_weight_decay(group, wd)
        self.model.unembed.tau = s.value("tau", cfg.tau, epoch)

    def clamp(self) -> None:
        """Rescale the parameters so that their total L2 norm is cfg.norm_clamp (no-op without a clamp)."""
        if self.cfg.norm_clamp is not None:
            clamp_norm(list(self.model.parameters()), self.cfg.norm_clamp)


@torch.no_grad()
def total_norm(params: list[torch.Tensor]) -> torch.Tensor:
    """The L2 norm of all `params` concatenated (a 0-d tensor on their device)."""
    return torch.linalg.vector_norm(torch.stack(torch._foreach_norm(params)))


@torch.no_grad()
def clamp_norm(params: list[torch.Tensor], radius: float) -> None:
    """Multiply every tensor of `params` in place by radius / (their total L2 norm)."""
    torch._foreach_mul_(params, radius / total_norm(params))
