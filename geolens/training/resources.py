"""Before training: will the run fit in memory, and roughly how long will it take?

The memory model is fitted to peak resident memory measured on the CPU (fast engine, p = 59, 113,
167; hooked engine, p = 59, 113; docs/run-format.md "Before a run starts"): a fixed part plus, per
input pair of the task (every pair is evaluated: the training split forward and backward, the test
split forward), about 2 d_mlp + 1.5 d_model + 3 n_classes float32 values; the hooked engine keeps
about 2.6x more per pair. It errs on the generous side; it exists to refuse runs that cannot fit
(e.g. p = 997) before anything is written, not to budget memory tightly.
"""

from __future__ import annotations

import torch

from geolens.errors import GeoError
from geolens.model.config import GeoConfig

FIXED_BYTES = 150 << 20
HOOKED_FACTOR = 2.6
CPU_FLOPS_PER_THREAD = 25e9  # matmul-like FLOP/s one core sustains on the fast path (2.16 GFLOP/epoch in ~45 ms on 2)
WARN_HOURS = 24.0


def estimate_bytes(cfg: GeoConfig, engine: str, members: int = 1) -> int:
    """Peak memory of training `members` stacked runs of cfg with `engine` ('fast' or 'hooked')."""
    per_pair = 4 * (2.0 * cfg.d_mlp + 1.5 * cfg.d_model + 3.0 * cfg.n_classes) * cfg.n_layers
    if engine != "fast":
        per_pair *= HOOKED_FACTOR
    params = 4 * 4 * (cfg.d_vocab * cfg.d_model + cfg.n_layers * (4 * cfg.d_model * cfg.n_heads * cfg.d_head
                      + 2 * cfg.d_model * cfg.d_mlp) + cfg.d_model * cfg.n_classes)  # weights, grads, AdamW moments
    return int(FIXED_BYTES + members * (cfg.n_inputs * per_pair + params))


def available_bytes(device: torch.device) -> int | None:
    """Memory this process can still get on `device` (None if unknown)."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    try:
        with open("/proc/meminfo") as f:
            info = dict(line.split(":", 1) for line in f)
        return int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None


def estimate_hours(cfg: GeoConfig, members: int = 1) -> float | None:
    """Rough CPU wall time of the run (None on a GPU): matmul-like FLOPs at CPU_FLOPS_PER_THREAD per thread."""
    if cfg.device != "cpu":
        return None
    from geolens.model.engines import choose_engine

    engine, _ = choose_engine(cfg)  # the engine the run will train on, and its own count
    n_train, n_test = cfg.split_sizes
    per_epoch, per_eval = engine.flops(cfg, n_train, True), engine.flops(cfg, n_test, False)
    total = members * (cfg.epochs * per_epoch + cfg.epochs / cfg.eval_every * per_eval)
    return total / (CPU_FLOPS_PER_THREAD * torch.get_num_threads()) / 3600


def check_fits(cfg: GeoConfig, engine: str, device: torch.device, members: int = 1) -> list[str]:
    """GeoError if the run cannot fit in memory here; returns warnings (tight memory, a very long run)."""
    need, have = estimate_bytes(cfg, engine, members), available_bytes(device)
    what = f"{members} x " if members > 1 else ""
    size = f"{what}p = {cfg.p}" if cfg.task != "perm" else f"{what}S_{cfg.n_perm}"
    warnings = []
    if have is not None and need > have:
        raise GeoError(f"this run needs about {need / 2**30:.1f} GiB of memory ({size}, {cfg.n_inputs} inputs, "
                       f"{engine} engine) but {have / 2**30:.1f} GiB is available on {device}; use a smaller p or "
                       "model, fewer sweep members, or a machine with more memory")
    if have is not None and need > 0.7 * have:
        warnings.append(f"this run needs about {need / 2**30:.1f} GiB of the {have / 2**30:.1f} GiB available; "
                        "other programs may push it out of memory")
    hours = estimate_hours(cfg, members)
    if hours is not None and hours > WARN_HOURS:
        warnings.append(f"this run is estimated at roughly {hours:.0f} hours on {torch.get_num_threads()} CPU "
                        "thread(s); consider fewer --epochs, --early-stop, or a GPU (--set device=cuda)")
    return warnings


def is_out_of_memory(e: BaseException) -> bool:
    """Whether `e` is an allocation failure (torch's CPU/CUDA allocators or Python's)."""
    if isinstance(e, MemoryError) or type(e).__name__ == "OutOfMemoryError":
        return True
    text = str(e)
    return isinstance(e, RuntimeError) and ("can't allocate memory" in text or "out of memory" in text)


def out_of_memory_error(cfg: GeoConfig, engine: str) -> GeoError:
    return GeoError(f"out of memory while training (estimated {estimate_bytes(cfg, engine) / 2**30:.1f} GiB for "
                    f"{cfg.n_inputs} inputs); use a smaller p or model, or a machine with more memory")

