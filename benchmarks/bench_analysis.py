"""Time the full analysis metric set on one p = 113 checkpoint of the paper's model.

For a fully bounded (fb) and a LayerNorm (ln) model with the paper's dimensions (d_model 128,
d_mlp 512, 4 heads), measures in the same process and under the same thread setting:

- reference: one plain no-grad forward model(tokens) over all 113^2 inputs;
- compute_metrics over the whole registry (a fresh AnalysisContext each repetition), with
  num_threads set to the same thread count;

and prints the medians, their ratio, and optionally the per-metric split.

    python benchmarks/bench_analysis.py [--reps 5] [--threads default,1] [--breakdown]
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from geolens.analysis import METRICS, AnalysisContext, compute_metrics
from geolens.analysis.threads import torch_threads
from geolens.config import make_config
from geolens.model import GeoTransformer
from geolens.tasks import make_dataset


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--threads", default="default,1", help="comma list of thread counts; 'default' = torch's own")
    ap.add_argument("--breakdown", action="store_true", help="also print seconds per metric")
    args = ap.parse_args()

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
