"""What the precursor columns cost training (geolens.training.precursor_columns).

    python benchmarks/bench_precursors.py               # ln and fb at p = 113, one torch thread
    python benchmarks/bench_precursors.py --reps 10     # fewer rounds (quicker, noisier)

One round is one evaluation interval of the training loop on the fast engine (cfg.eval_every
epochs: the full-batch step every epoch, an evaluation at the last), run twice interleaved in this
one process on the same data, each loop on its own copy of the model: with the precursor columns
(training.train.SingleStep as `geolens train` runs it: the evaluated epoch's training forward is
fast_eq_forward's, then the probe's columns) and without them (the same step and the metrics
row's other columns only: losses, accuracies, norms, max |logit|). Reported: median ms per
interval of each and the columns' cost as a fraction of the interval without them. Compare ratios
within one run.
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
from geolens.training.engine import make_optimizer, select_forward
from geolens.training.recording import metrics_row, squared_norms
from geolens.training.train import SingleStep


@torch.no_grad()
def _row_without_precursors(step: SingleStep, epoch: int) -> dict:
    """The metrics row's columns other than the precursor ones (the evaluation before they existed)."""
    test_logits = step.forward(step.test_x)
    stats = torch.stack([step.loss.detach(), (step.logits.argmax(-1) == step.train_y).float().mean(),
                         F.cross_entropy(test_logits, step.test_y), (test_logits.argmax(-1) == step.test_y).float().mean(),
                         torch.maximum(step.logits.abs().max(), test_logits.abs().max())])
    return metrics_row(epoch, stats.tolist(), squared_norms(step.model).tolist(), 0.0)


def bench_preset(preset: str, p: int = 113, reps: int = 20) -> dict:
    """Interleaved timings for one preset: {'with': ms per interval, 'without': ..., 'overhead': fraction}."""
    cfg = make_config(preset, p=p, seed=1, data_seed=1)
    data = make_dataset(cfg)
    steps = {}
    for name in ("without", "with"):
        model = GeoTransformer(cfg)
        opt = make_optimizer(model)
        engine, forward, _ = select_forward(model)
        steps[name] = SingleStep(model, opt, engine, forward, *data.train, *data.test)
    times = {n: [] for n in steps}
    for rnd in range(reps + 1):
        for name, step in steps.items():
            t0 = time.perf_counter()
            for e in range(cfg.eval_every):
                last = e == cfg.eval_every - 1
                step.backward(record=last and name == "with")
                if last:
                    row = step.evaluate(e, 0.0)[0] if name == "with" else _row_without_precursors(step, e)
                step.update()
            if rnd > 0:  # the first round warms up
                times[name].append(time.perf_counter() - t0)
    med = {n: 1000 * statistics.median(t) for n, t in times.items()}
    return {**med, "overhead": med["with"] / med["without"] - 1, "columns": len(row), "eval_every": cfg.eval_every}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="ln,fb")
    ap.add_argument("--p", type=int, default=113)
    ap.add_argument("--reps", type=int, default=20, help="timed rounds (median reported)")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    print(f"p = {args.p}, {args.threads} torch thread(s), {args.reps} interleaved rounds of one evaluation interval; "
          "ms per interval (median) without and with the precursor columns")
    print(f"{'preset':<8} {'without':>9} {'with':>9} {'cost %':>8}")
    for preset in args.presets.split(","):
        r = bench_preset(preset, args.p, args.reps)
        print(f"{preset:<8} {r['without']:>9.1f} {r['with']:>9.1f} {100 * r['overhead']:>+8.2f}")


if __name__ == "__main__":
    main()
