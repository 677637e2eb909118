"""Batched-seeds benchmark: seed-epochs per second of geolens.training.batched vs the single-run fast path.

    python benchmarks/bench_batched.py                    # presets fb and ln, 1 / 4 / 10 seeds, p = 113
    python benchmarks/bench_batched.py --reps 2 --seeds 1,4 --engines fast
    python benchmarks/bench_batched.py --device cuda --seeds 1,10,100 --reps 10

Batched engines: 'fast' (geolens.model.fast.stacked_fast_logits: the fast path with a leading member
dimension, the default for one-layer models) and 'hooked' (the hooked forward vmapped over the
members); every member steps its own torch AdamW, as geolens.training.batched.train_batched does.
One seed-epoch = one member's full-batch training step (forward, cross-entropy, backward, AdamW
step) on its training split (p = 113, frac 0.3: 3,830 examples). The single-run path is the
geolens fast path (fast_logits + engine.make_optimizer, one seed), measured in the same process. All
setups of a preset step in turn (one untimed round, then --reps timed rounds) and the median per
setup is reported, so machine load hits them alike. Timings on a
shared machine are noisy: compare the ratios printed in one run.
"""

from __future__ import annotations

import argparse
import functools
import statistics
import time

import torch
import torch.nn.functional as F

from geolens.model.config import make_config
from geolens.model.fast import fast_logits
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.training.batched import StackedForward, member_losses
from geolens.training.engine import make_optimizer, synchronize


def single_step(preset: str, device: torch.device):
    """One full-batch training step of one seed on the fast path (fast_logits + engine.make_optimizer)."""
    cfg = make_config(preset, seed=1, data_seed=1)
    model = GeoTransformer(cfg).to(device)
    opt = make_optimizer(model)
    x, y = (t.to(device) for t in make_dataset(cfg).train)

    def step():
        loss = F.cross_entropy(fast_logits(model, x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def batched_step(preset: str, engine: str, n_seeds: int, device: torch.device):
    """One step of n_seeds members stacked, with the batched engine 'fast' or 'hooked'."""
    cfgs = [make_config(preset, seed=s, data_seed=s, engine=engine) for s in range(1, n_seeds + 1)]
    models = [GeoTransformer(c).to(device) for c in cfgs]
    forward = StackedForward(models)
    opts = [make_optimizer(m) for m in models]
    data = [make_dataset(c).train for c in cfgs]
    x = [d[0].to(device) for d in data]
    y = torch.stack([d[1] for d in data]).to(device)

    def step():
        losses = member_losses(forward(x), y)
        for opt in opts:
            opt.zero_grad(set_to_none=True)
        losses.sum().backward()
        for opt in opts:
            opt.step()

    return step


def interleaved_medians(steps: dict[str, object], reps: int, device: torch.device) -> dict[str, float]:
    """Median seconds per step of each entry: one untimed round, then `reps` rounds of one step each, interleaved."""
    sync = functools.partial(synchronize, device)
    times: dict[str, list[float]] = {k: [] for k in steps}
    for r in range(reps + 1):
        for key, step in steps.items():
            sync()
            t0 = time.perf_counter()
            step()
            sync()
            if r:
                times[key].append(time.perf_counter() - t0)
    return {k: statistics.median(v) for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="fb,ln")
    ap.add_argument("--seeds", default="1,4,10", help="batch sizes (members) to measure")
    ap.add_argument("--engines", default="fast,hooked", help="batched engines to measure (fast, hooked)")
    ap.add_argument("--reps", type=int, default=3, help="timed steps per measurement")
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    args = ap.parse_args()
    device = torch.device(args.device)
    where = torch.cuda.get_device_name(device) if device.type == "cuda" else f"{torch.get_num_threads()} threads"
    print(f"torch {torch.__version__}, {where}; p = 113, frac 0.3 (3,830 training examples)")
    print(f"{'preset':<8}{'path':<26}{'seed-epochs/s':>15}{'vs single fast':>16}")
    t_all = time.perf_counter()
    sizes = [int(s) for s in args.seeds.split(",")]
    for preset in args.presets.split(","):
        steps = {("single", 1): single_step(preset, device)}
        steps.update({(engine, n): batched_step(preset, engine, n, device)
                      for engine in args.engines.split(",") for n in sizes})
        medians = interleaved_medians(steps, args.reps, device)
        single = 1.0 / medians[("single", 1)]
        for (engine, n), sec in medians.items():
            rate = n / sec
            label = "single, fast path" if engine == "single" else f"batched {engine}, {n} seeds"
            print(f"{preset:<8}{label:<26}{rate:>15.2f}{rate / single:>15.2f}x")
    print(f"total {time.perf_counter() - t_all:.0f} s")


if __name__ == "__main__":
    main()
