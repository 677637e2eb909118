"""How a run's training step is computed, and where: the device, the forward engine, the optimizer.

training_device: cfg.device as a torch.device (refused if this torch cannot see it). choose_engine:
'fast' (geolens.model.fast, one-layer models) or 'hooked' (the GeoTransformer forward), with the reason;
select_forward: the chosen forward as tokens -> logits at `=`. make_optimizer: the fused AdamW every
training path uses. preflight: the checks made before anything is written (engine, memory, warnings);
out_of_memory_as_error: an allocation failure as a one-line GeoError. Used by geolens.training.train,
geolens.training.batched and the benchmarks.
"""

from __future__ import annotations

from contextlib import contextmanager
from typing import TYPE_CHECKING, Callable

import torch
from torch import Tensor

from geolens.errors import GeoError, warn
from geolens.model.config import GeoConfig, training_warnings
from geolens.training.resources import check_fits, is_out_of_memory, out_of_memory_error

if TYPE_CHECKING:
    from geolens.model.transformer import GeoTransformer


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
    from geolens.model.fast import fast_unsupported_reason

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
    from geolens.model.fast import fast_logits

    return engine, lambda tokens: fast_logits(model, tokens), why


def make_optimizer(model: GeoTransformer, capturable: bool = False) -> torch.optim.AdamW:
    """AdamW with the config's hyperparameters, fused (one kernel for all parameters; deterministic,
    so a resumed run still equals an uninterrupted one bit for bit); capturable: its step can be
    recorded in a CUDA graph."""
    cfg = model.cfg
    return torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                             weight_decay=cfg.weight_decay, fused=True, capturable=capturable)


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
