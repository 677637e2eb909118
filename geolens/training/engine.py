"""How a run's training step is computed, and where: the device, the forward engine, the optimizer.

training_device: cfg.device as a torch.device (refused if this torch cannot see it). select_forward: the
engine geolens.model.engines.choose_engine picks (fast, deep or hooked) and its forward as tokens -> logits
at `=`. make_optimizer: the optimizer (geolens.training.optimizers) every
training path uses. started_threads / training_threads: the thread count a run started with, kept on resume. preflight: the checks made before anything is written (engine, memory, warnings);
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
from geolens.model.engines import Engine, choose_engine
from geolens.threads import cpu_cores, torch_threads
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


def flushing_denormals() -> bool:
    """Whether the CPU now flushes float32 subnormals (torch has no getter: half the smallest normal comes out 0)."""
    return bool(torch.tensor(2.0**-126) * 0.5 == 0)


@contextmanager
def denormals_flushed(on: bool):
    """While inside: the CPU treats float32 subnormals (|x| < 1.18e-38) as 0 in and out (x86 FTZ/DAZ,
    torch.set_flush_denormal) when `on`, and computes them when not, whatever the caller had set; the caller's
    setting is restored after. Weights and optimizer states that decay towards 0 (Muon's decoupled weight decay
    shrinks dead neurons' rows by lr * wd per step) otherwise pass through the subnormal range, where each operation
    on them costs many times a normal one. Bits differ from an unflushed run only where a subnormal arises. A
    GeoError where this CPU cannot flush."""
    was = flushing_denormals()
    if on and not torch.set_flush_denormal(True):
        raise GeoError("flush_denormal = true but this CPU cannot flush subnormals (torch.set_flush_denormal); "
                       "unset it (--set flush_denormal=false)")
    torch.set_flush_denormal(on)
    try:
        yield
    finally:
        torch.set_flush_denormal(was)


def started_threads(header: dict) -> int | None:
    """The torch thread count a run started with (its first segment's machine in run.json), None where not recorded."""
    segments = header.get("segments") or [{}]
    machine = segments[0].get("machine") if isinstance(segments[0], dict) else None
    threads = machine.get("torch_threads") if isinstance(machine, dict) else None
    return threads if isinstance(threads, int) and threads > 0 else None


@contextmanager
def training_threads(threads: int | None):
    """geolens.threads.torch_threads(threads), warning when the run's count exceeds the cores here: a resumed
    run keeps the count it started with, since the count sets the order of torch's sums."""
    cores = len(cpu_cores())
    if threads is not None and threads != torch.get_num_threads() and threads > cores:
        warn(f"training on {threads} torch threads, as the run started (the thread count sets its float order), "
             f"on {cores} core(s) here: slower than usual")
    with torch_threads(threads):
        yield


def select_forward(model: GeoTransformer) -> tuple[Engine, Callable[[Tensor], Tensor], str]:
    """(engine, forward(tokens) -> logits [batch, C] at `=`, why) for `model` (engines.choose_engine)."""
    engine, why = choose_engine(model.cfg)
    return engine, lambda tokens: engine.logits(model, tokens), why


def make_optimizer(model: GeoTransformer, capturable: bool = False):
    """The run's optimizer (cfg.optimizer: geolens.training.optimizers.make_optimizer, fused AdamW by default)."""
    from geolens.training.optimizers import make_optimizer as build

    return build(model, capturable)


def preflight(cfg: GeoConfig, dev: torch.device, members: int = 1) -> str:
    """Checks made before anything is written: the engine (choose_engine), and that the run fits in
    memory here (a GeoError if not); warns about settings that are probably not what was meant.
    Returns the engine name."""
    engine, _ = choose_engine(cfg)
    for message in training_warnings(cfg) + check_fits(cfg, engine.name, dev, members):
        warn(message)
    return engine.name


@contextmanager
def out_of_memory_as_error(cfg: GeoConfig, engine: str):
    """Turn an allocation failure inside the block into a one-line GeoError."""
    try:
        yield
    except (RuntimeError, MemoryError) as e:
        if is_out_of_memory(e):
            raise out_of_memory_error(cfg, engine) from None
        raise
