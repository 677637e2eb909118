"""Cost of the landscape metrics per checkpoint, against one training epoch measured in the same run.

    python benchmarks/bench_landscape.py                 # the shipped fb checkpoint (p = 113), 1 thread
    python benchmarks/bench_landscape.py --reps 1        # quicker
    python benchmarks/bench_landscape.py --llc draws=100,burnin=0   # other SGLD settings (LLCSettings.parse)

Times, on one checkpoint of a p = 113 run (default: checkpoints/fb_lr6e-4_seed1 at its last epoch): the `llc`
metric's whole-model estimate and the four per-component ones at geolens.analysis.llc.DEFAULT_LLC (or --llc), the
`sharpness` metric, and one full-batch training epoch of the same model with its engine (forward, backward,
optimizer step); prints seconds and the ratio to an epoch (machines here are shared: compare ratios).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from geolens.analysis.landscape import sharpness
from geolens.analysis.llc import COMPONENTS, LLCSettings, model_llc
from geolens.analysis.shipped import reference_path
from geolens.model.engines import choose_engine
from geolens.runs.run import load_run
from geolens.training.engine import make_optimizer


def epoch_seconds(run, step: int, reps: int) -> float:
    """Median seconds of one full-batch training step of the checkpoint's model with its engine."""
    model = run.model_at(step)
    engine, _ = choose_engine(model.cfg, "auto")
    opt = make_optimizer(model)
    x, y = run.dataset.train
    times = []
    for _ in range(reps + 2):
        t = time.perf_counter()
        loss = F.cross_entropy(engine.logits(model, x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        times.append(time.perf_counter() - t)
    return statistics.median(times[2:])


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run", default=None, help="run directory (default: the shipped fb trajectory)")
    ap.add_argument("--step", type=int, default=None, help="checkpoint (default: the last)")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--llc", default="", help="SGLD settings, e.g. draws=100,burnin=0 (the rest DEFAULT_LLC's)")
    args = ap.parse_args(argv)
    settings = LLCSettings.parse(args.llc)
    torch.set_num_threads(args.threads)
    run = load_run(args.run or reference_path("fb"))
    step = run.steps[-1] if args.step is None else args.step
    x, y = run.dataset.train
    epoch = epoch_seconds(run, step, args.reps)
    rows = []
    for name, fn in [("llc (whole model)", lambda m: model_llc(m, x, y, settings)),
                     *[(f"llc_{c}", lambda m, c=c: model_llc(m, x, y, settings, c)) for c in COMPONENTS],
                     ("sharpness", lambda m: sharpness(m, x, y))]:
        model = run.model_at(step)
        t = time.perf_counter()
        fn(model)
        rows.append((name, time.perf_counter() - t))
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), load average {os.getloadavg()[0]:.2f}; "
          f"{run.path} at epoch {step} ({len(y)} training examples); LLC settings {settings.key()}")
    print(f"one training epoch: {epoch * 1e3:.1f} ms")
    print(f"{'metric':22s} {'seconds':>8s} {'epochs':>8s}")
    for name, seconds in rows:
        print(f"{name:22s} {seconds:8.2f} {seconds / epoch:8.0f}")
    total = sum(s for n, s in rows if n.startswith("llc"))
    print(f"{'llc metric (5 estimates)':22s} {total:8.2f} {total / epoch:8.0f}")


if __name__ == "__main__":
    sys.exit(main())
