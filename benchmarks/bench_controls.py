"""What schedules and the norm clamp cost a training epoch (geolens.training.controls).

    python benchmarks/bench_controls.py               # ln and fb at p = 113, one torch thread
    python benchmarks/bench_controls.py --reps 10     # fewer rounds (quicker, noisier)

One epoch is the training loop's step on the fast engine: full-batch forward, cross-entropy,
backward, the fused AdamW step. Four loops run interleaved (one epoch each per round) in this one
process on the same data, each on its own copy of the model: plain; with a schedule (an lr warmup,
a weight-decay window and a tau window, Controls.before every epoch); with the norm clamp
(Controls.clamp after every step); with both. Reported: the median ms per epoch of each, and the
controls' cost as a fraction of the plain epoch, measured two ways: the difference of the
interleaved medians, and the median time of the control calls alone against the plain epoch (the
direct measurement; the difference is noise-limited). Compare ratios within one run.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.training.controls import Controls
from geolens.training.engine import make_optimizer, select_forward

SCHEDULE = ["lr=warmup:100000", "weight_decay=3.0@0:100000", "tau=20@0:100000"]
LOOPS = ("plain", "schedule", "clamp", "both")


def bench_preset(preset: str, p: int = 113, reps: int = 30) -> dict:
    """Interleaved timings of the four loops for one preset: {'med': {loop: ms/epoch}, 'calls': {loop:
    ms of the control calls}, 'overhead': {loop: fraction of the plain epoch}, 'direct': {...}}."""
    base = make_config(preset, p=p, seed=1, data_seed=1)
    data = make_dataset(base)
    x, y = data.train
    loops = {}
    for name in LOOPS:
        cfg = base.replace(schedule=SCHEDULE if name in ("schedule", "both") else [],
                           norm_clamp=40.0 if name in ("clamp", "both") else None)
        model = GeoTransformer(cfg)
        opt = make_optimizer(model)
        _, forward, _ = select_forward(model)
        loops[name] = (Controls(cfg, model, opt), forward, opt)
    times = {n: [] for n in LOOPS}
    calls = {n: [] for n in LOOPS}
    for epoch in range(reps + 3):
        for name, (controls, forward, opt) in loops.items():
            t0 = time.perf_counter()
            controls.before(epoch)
            t1 = time.perf_counter()
            loss = F.cross_entropy(forward(x), y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            t2 = time.perf_counter()
            controls.clamp()
            t3 = time.perf_counter()
            if epoch >= 3:  # warm-up rounds are not timed
                times[name].append(t3 - t0)
                calls[name].append((t1 - t0) + (t3 - t2))
    med = {n: 1000 * statistics.median(t) for n, t in times.items()}
    call = {n: 1000 * statistics.median(t) for n, t in calls.items()}
    return {"med": med, "calls": call,
            "overhead": {n: med[n] / med["plain"] - 1 for n in LOOPS},
            "direct": {n: (call[n] - call["plain"]) / med["plain"] for n in LOOPS},
            "lr": loops["schedule"][2].param_groups[0]["lr"], "tau": loops["schedule"][0].model.unembed.tau}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="ln,fb")
    ap.add_argument("--p", type=int, default=113)
    ap.add_argument("--reps", type=int, default=30, help="timed rounds (median reported)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"p = {args.p}, {args.threads} torch thread(s), {args.reps} interleaved rounds; ms/epoch (median) and the "
          "controls' cost per epoch as a fraction of the plain epoch (direct: the control calls alone)")
    print(f"{'preset':<8} " + " ".join(f"{n:>9}" for n in LOOPS) + "   " +
          " ".join(f"{n + ' %':>12}" for n in LOOPS[1:]) + "   " + " ".join(f"{'direct ' + n + ' %':>17}" for n in LOOPS[1:]))
    for preset in args.presets.split(","):
        r = bench_preset(preset, args.p, args.reps)
        print(f"{preset:<8} " + " ".join(f"{r['med'][n]:>9.2f}" for n in LOOPS) + "   " +
              " ".join(f"{100 * r['overhead'][n]:>+12.2f}" for n in LOOPS[1:]) + "   " +
              " ".join(f"{100 * r['direct'][n]:>17.3f}" for n in LOOPS[1:]))


if __name__ == "__main__":
    main()
