"""The optimizer of a run (cfg.optimizer): torch's AdamW, SGD, or Muon with AdamW, behind one factory.

    adamw  torch.optim.AdamW(lr, betas, weight_decay), fused (one kernel for all parameters)
    sgd    torch.optim.SGD(lr, momentum=cfg.momentum, weight_decay): weight decay added to the gradient
           (coupled L2), unlike AdamW's and Muon's decoupled decay
    muon   torch.optim.Muon on the MLP's 2-D matrices (blocks.L.mlp.W_in, W_out: the hidden matrices the
           literature orthogonalises; lr cfg.muon_lr, momentum cfg.muon_momentum, Nesterov, decoupled weight
           decay cfg.weight_decay, each matrix at the reference rate muon_lr * sqrt(max(1, fan_out / fan_in)): see
           muon_lr_scale), AdamW (cfg.lr, betas) on everything else:
           the embeddings and the readout (by convention), biases and norm gains (1-D), and the attention
           weights W_Q, W_K, W_V [n_heads, d_model, d_head] and W_O, which are stored 3-D while torch's Muon
           takes only 2-D parameters (orthogonalising each head's matrix would need Muon's update
           re-implemented; geolens uses torch's).

Every optimizer is a torch.optim.Optimizer or, for Muon, `Combined` (Muon and AdamW as one: param_groups,
state, step, zero_grad), so the loops, the resume state (opt.<param>.<key>) and forks treat them alike.
Each parameter group records the config field its learning rate comes from (`lr_field`), so schedules scale
each group as its optimizer defines it (Controls.before).
"""

from __future__ import annotations

import math
from collections.abc import MutableMapping

import torch
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import GeoConfig

MUON_PARAMS = ("mlp.W_in", "mlp.W_out")  # the 2-D hidden matrices (name suffixes) Muon takes


class _CombinedState(MutableMapping):
    """The state of a Combined optimizer: each parameter's entry lives in the part that owns the parameter."""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        self.parts = parts

    def _owner(self, param: Tensor) -> torch.optim.Optimizer:
        for part in self.parts:
            if any(p is param for g in part.param_groups for p in g["params"]):
                return part
        raise KeyError(param)

    def __getitem__(self, param):
        return self._owner(param).state[param]

    def __setitem__(self, param, value):
        self._owner(param).state[param] = value

    def __delitem__(self, param):
        del self._owner(param).state[param]

    def __iter__(self):
        return (p for part in self.parts for p in part.state)

    def __len__(self):
        return sum(len(part.state) for part in self.parts)


class Combined:
    """Several torch optimizers over disjoint parameters, stepped as one (Muon with AdamW)."""

    def __init__(self, parts: list[torch.optim.Optimizer]):
        self.parts = parts
        self.state = _CombinedState(parts)

    @property
    def param_groups(self) -> list[dict]:
        return [g for part in self.parts for g in part.param_groups]

    def step(self) -> None:
        for part in self.parts:
            part.step()

    def zero_grad(self, set_to_none: bool = True) -> None:
        for part in self.parts:
            part.zero_grad(set_to_none=set_to_none)


def make_optimizer(model, capturable: bool = False):
    """The optimizer cfg.optimizer names for `model`'s parameters (module docstring); capturable (AdamW): its
    step can be recorded in a CUDA graph. AdamW is fused and deterministic, so a resumed run equals an
    uninterrupted one bit for bit; so are SGD and Muon."""
    cfg: GeoConfig = model.cfg
    named = list(model.named_parameters())
    if cfg.optimizer == "sgd":
        return _tagged(torch.optim.SGD([p for _, p in named], lr=cfg.lr, momentum=cfg.momentum,
                                       weight_decay=cfg.weight_decay), "lr")
    adamw = dict(lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay, fused=True, capturable=capturable)
    if cfg.optimizer == "adamw":
        return _tagged(torch.optim.AdamW([p for _, p in named], **adamw), "lr")
    matrices = [{"params": [p], "lr_scale": muon_lr_scale(p.shape)} for n, p in named if n.endswith(MUON_PARAMS)]
    for group in matrices:
        group["lr"] = cfg.muon_lr * group["lr_scale"]
        group["weight_decay"] = group_weight_decay(group, cfg.weight_decay)
    rest = [p for n, p in named if not n.endswith(MUON_PARAMS)]
    muon = torch.optim.Muon(matrices, lr=cfg.muon_lr, momentum=cfg.muon_momentum, weight_decay=cfg.weight_decay,
                            nesterov=True, adjust_lr_fn="original")
    return Combined([_tagged(muon, "muon_lr"), _tagged(torch.optim.AdamW(rest, **adamw), "lr")])


MUON_RATE_RULE = "muon_lr * sqrt(max(1, fan_out / fan_in))"  # run.json's muon_rate of a Muon run


def check_muon_rate(header: dict, path) -> None:
    """Refuse to continue a Muon run trained before its per-matrix rates followed MUON_RATE_RULE (it had W_in's
    and W_out's swapped): continuing it would mix two rules in one trajectory."""
    if header["config"].get("optimizer") == "muon" and header.get("muon_rate") != MUON_RATE_RULE:
        raise GeoError(f"{path} was trained with Muon's per-matrix rates swapped (geolens before the fix: W_in at x1, "
                       f"W_out at x2); it cannot be continued with today's rates: retrain it with --force")


def muon_lr_scale(shape: torch.Size) -> float:
    """The factor on cfg.muon_lr that makes torch's 'original' adjustment give a matrix stored (in, out), as
    geolens stores W_in [d_model, d_mlp] and W_out [d_mlp, d_model], the reference per-matrix rate
    muon_lr * sqrt(max(1, fan_out / fan_in)). torch reads (A, B) = shape[:2] as nn.Linear's (out, in) and
    multiplies by sqrt(max(1, A / B)); this factor divides that out and puts the reference one in. torch decays a
    parameter by lr * weight_decay per step, so the group's weight decay is divided by the same factor
    (group_weight_decay): the decay stays muon_lr * weight_decay, as in the reference."""
    fan_in, fan_out = shape[0], shape[1]
    return math.sqrt(max(1.0, fan_out / fan_in)) / math.sqrt(max(1.0, fan_in / fan_out))


def _tagged(opt: torch.optim.Optimizer, lr_field: str) -> torch.optim.Optimizer:
    for group in opt.param_groups:
        group["lr_field"] = lr_field
    return opt


def group_lr(group: dict, cfg: GeoConfig, lr: float) -> float:
    """The learning rate of `group` when the schedule sets the run's lr to `lr`: `lr` itself for the groups that
    take cfg.lr, the group's own base (times its lr_scale) scaled by lr / cfg.lr for the others (Muon's
    cfg.muon_lr)."""
    field = group.get("lr_field", "lr")
    return lr if field == "lr" else getattr(cfg, field) * group.get("lr_scale", 1.0) * (lr / cfg.lr)


def group_weight_decay(group: dict, weight_decay: float) -> float:
    """The weight decay of `group` when the run's is `weight_decay`: divided by the group's lr_scale, so that
    torch's decoupled decay (group lr times group weight decay) stays the unscaled lr times `weight_decay`."""
    return weight_decay / group.get("lr_scale", 1.0)
