"""Time the full analysis metric set on one p = 113 checkpoint of the paper's model.

For a fully bounded (fb) and a LayerNorm (ln) model with the paper's dimensions (d_model 128,
d_mlp 512, 4 heads), measures in the same process and under the same thread setting:

- reference: one plain no-grad forward model(tokens) over all 113^2 inputs;
- compute_metrics over the whole registry (a fresh AnalysisContext each repetition), with
  num_threads set to the same thread count;

and prints the medians, their ratio, and optionally the per-metric split.

With --trajectory K it instead trains a K-checkpoint p = 113 fb run (epochs 0..K-1, one
checkpoint per epoch) into a temporary directory and times analyze_run over all K checkpoints
with workers=1 (in-process) and workers=2 (this process plus one spawned single-thread worker, start-up
included; their exit, which overlaps what follows analyze_run, is not), the cache cleared before
each, alternating for --reps rounds; it prints the median seconds per checkpoint of each and
their ratio.

    python benchmarks/bench_analysis.py [--reps 5] [--threads default,1] [--breakdown]
    python benchmarks/bench_analysis.py --trajectory 24 [--reps 3] [--seed 0]
"""

from __future__ import annotations

import argparse
import multiprocessing
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch

from geolens.analysis import METRICS, AnalysisContext, compute_metrics
from geolens.threads import torch_threads
from geolens.analysis.trajectory import ANALYSIS_DIR, analyze_run
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.runs.run import load_run
from geolens.training.train import train


def _median_time(fn, reps: int) -> float:
    fn()  # warm-up (allocator, lazy imports, cached bases)
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _breakdown(model, cfg, ds) -> dict[str, float]:
    """Seconds per metric in registry order on a fresh context (the forward is timed apart)."""
    ctx = AnalysisContext(model, cfg, ds)
    t0 = time.perf_counter()
    ctx.eq
    out = {"(forward at =)": time.perf_counter() - t0}
    for name, spec in METRICS.items():
        t0 = time.perf_counter()
        spec.fn(ctx)
        out[name] = time.perf_counter() - t0
    return out


def _trajectory(k: int, reps: int, seed: int) -> None:
    """Seconds per checkpoint of analyze_run over a fresh K-checkpoint run, workers=1 against workers=2."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "run"
        train(make_config("fb", p=113, epochs=k - 1, eval_every=1, checkpoints="every:1", seed=seed), path, progress=False)
        run = load_run(path)
        assert len(run.steps) == k, run.steps
        times: dict[int, list[float]] = {1: [], 2: []}
        for _ in range(reps):
            for workers in times:
                shutil.rmtree(path / ANALYSIS_DIR, ignore_errors=True)
                t0 = time.perf_counter()
                analyze_run(run, progress=False, workers=workers)
                times[workers].append((time.perf_counter() - t0) / k)
                while multiprocessing.active_children():  # workers exit after analyze_run returns: not in the next timing
                    time.sleep(0.1)
    one, two = (statistics.median(times[w]) for w in (1, 2))
    for w, ts in times.items():
        print(f"workers={w}: {statistics.median(ts):.3f} s/checkpoint (runs: {', '.join(f'{t:.3f}' for t in ts)})")
    print(f"{k} checkpoints, p = 113 fb: throughput ratio workers=2 / workers=1 = {one / two:.2f}x")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="default,1", help="comma list of thread counts; 'default' = torch's own")
    ap.add_argument("--breakdown", action="store_true", help="also print seconds per metric")
    ap.add_argument("--trajectory", type=int, metavar="K", help="time analyze_run over K checkpoints, workers=1 vs 2")
    ap.add_argument("--seed", type=int, default=0, help="initialisation seed of the --trajectory run")
    args = ap.parse_args()
    if args.trajectory:
        _trajectory(args.trajectory, args.reps, args.seed)
        return

    print(f"torch {torch.__version__}, default threads {torch.get_num_threads()}, reps {args.reps} (medians)")
    for preset in ("fb", "ln"):
        cfg = make_config(preset, p=113)
        model = GeoTransformer(cfg)
        ds = make_dataset(cfg)
        for spec in args.threads.split(","):
            n = None if spec == "default" else int(spec)
            with torch_threads(n):
                threads = torch.get_num_threads()

                def forward():
                    with torch.no_grad():
                        model(ds.tokens)

                ref = _median_time(forward, args.reps)
                full = _median_time(lambda: compute_metrics(model, cfg, ds, num_threads=n), args.reps)
                print(
                    f"{preset:>3} threads={threads}: metrics {full:.3f} s/checkpoint | "
                    f"reference plain forward over {len(ds.tokens)} inputs {ref:.3f} s | ratio {full / ref:.2f}"
                )
                if args.breakdown:
                    for name, sec in _breakdown(model, cfg, ds).items():
                        print(f"      {name:<24} {sec:.3f}")


if __name__ == "__main__":
    main()
