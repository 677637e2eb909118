"""Grid sweep throughput: seed-epochs per second of `geolens sweep` on each backend, and the projected
wall time of Table 1 at lr 6e-4.

    python benchmarks/bench_grid.py                       # p = 113, fb,ln x seeds 1-2; local 1 and 2 workers, ray
    python benchmarks/bench_grid.py --setups local:2,ray:2x1 --seeds 1-4 --epochs 20,220

Each setup sweeps the same grid (presets x seeds, lr 6e-4, checkpoints 'ends', no early stop) twice into
fresh folders, with E1 and E2 epochs per member; the rate is the extra seed-epochs over the extra wall
time, (members x (E2 - E1)) / (wall2 - wall1), so process start-up (spawning workers, importing torch)
cancels out, and start-up is what remains of wall1. Setups: 'local:N' (N worker processes, each on its
share of the cores with as many torch threads), 'ray:N' (one-thread Ray tasks, the grid split into N
jobs per group, on a local Ray instance started before the timing; its start-up is printed apart);
'local:NxT', 'ray:NxT': T threads each. With --reps R the setups take turns R times and the median rate
is printed, with each repetition's. On a shared machine compare the ratios to the first setup (the
reference) of one run.

Table 1 projection: 6 configurations x 10 seeds, each stack of 10 seeds runs until its last member
stops. ln and rms cost what the grid's ln members cost, the four sphere configurations (fb, sphere,
fb+fourier, sphere+fourier) what its fb members cost (same shapes; the Fourier initialisation and the
weight decay change no arithmetic); the two families' relative cost per seed-epoch comes from the
run.json timing (median over every sweep). Two stack lengths: the budgets (ln/rms 15,000, sphere family 5,000
epochs) and early stopping 200 epochs after the paper's slowest onset per configuration (its Table 1,
lr 6e-4; sustained_099 comes at or after the onset, so this is a lower estimate).
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from pathlib import Path

from geolens.sweeps.grid import make_grid
from geolens.sweeps.sweep import run_sweep

#: Table 1 at lr 6e-4: epoch budget and the paper's slowest onset_095 over 10 seeds, and the preset
#: of this benchmark's grid whose cost per seed-epoch it has
TABLE1 = {"ln": (15000, 9400, "ln"), "rms": (15000, 9200, "ln"), "sphere": (5000, 3000, "fb"),
          "fb": (5000, 1200, "fb"), "sphere+fourier": (5000, 1000, "fb"), "fb+fourier": (5000, 1000, "fb")}
EARLY_STOP = 200


def sweep_wall(setup: str, flags: dict, sets: list[str], out: Path) -> float:
    """Wall seconds of one sweep of the grid into `out` on `setup`: 'BACKEND:N' or 'BACKEND:NxT' (N
    workers, T torch threads each; without T: a local worker's share of the cores, 1 for Ray)."""
    backend, _, spec = setup.partition(":")
    workers, _, threads = spec.partition("x")
    t0 = time.perf_counter()
    result = run_sweep(make_grid(flags=flags, sets=sets), out, backend=backend, workers=int(workers or 1),
                       threads=int(threads) if threads else None, progress=False)
    wall = time.perf_counter() - t0
    if result.failed:
        raise SystemExit(f"{setup}: members failed: {result.errors}")
    return wall


def family_costs(out: Path, presets: list[str]) -> dict[str, float]:
    """Seconds per seed-epoch of each preset's stack (run.json timing: train + eval + checkpoint time
    over epochs x members), from a sweep's folders."""
    costs = {}
    for preset in presets:
        timing = json.loads(next(out.glob(f"**/{preset}/lr*/seed_*/run.json")).read_text())["timing"]
        costs[preset] = (timing["train_s"] + timing["eval_s"] + timing["ckpt_s"]) / (timing["epochs_timed"] * timing["members"])
    return costs


def projected_hours(rate: float, costs: dict[str, float], presets: list[str], early_stop: bool) -> float:
    """Table 1's wall time in hours at `rate` grid seed-epochs per second, the grid being `presets` (one
    member of each per seed) with seconds per seed-epoch `costs` (fb and ln): Table 1's work in fb
    seed-epochs (each configuration's 10-seed stack for its budget, or to its slowest onset + EARLY_STOP)
    over the rate in fb seed-epochs per second."""
    weight = {p: costs[p] / costs["fb"] for p in costs}
    per_grid_seed_epoch = sum(weight[p] for p in presets) / len(presets)
    work = sum(10 * (min(budget, onset + EARLY_STOP) if early_stop else budget) * weight[family]
               for budget, onset, family in TABLE1.values())
    return work / (rate * per_grid_seed_epoch) / 3600


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--presets", default="fb,ln", help="the grid's presets (the projection needs fb and ln)")
    ap.add_argument("--seeds", default="1-2")
    ap.add_argument("--p", type=int, default=113)
    ap.add_argument("--epochs", default="10,110", help="E1,E2: the two sweeps' epochs per member")
    ap.add_argument("--setups", default="local:1,local:1x1,local:2,ray:2",
                    help="BACKEND:N[xT] (N workers, T threads each), comma-separated; the first is the reference")
    ap.add_argument("--reps", type=int, default=1, help="repetitions; the setups take turns, medians are printed")
    ap.add_argument("--set", action="append", default=[], dest="sets", help="config field=value for every member")
    args = ap.parse_args(argv)
    e1, e2 = (int(e) for e in args.epochs.split(","))
    presets = args.presets.split(",")
    flags = dict(presets=args.presets, seeds=args.seeds, lr="6e-4", p=str(args.p), checkpoints="ends")
    grid = make_grid(flags=flags, sets=args.sets)
    n_members = len(grid.presets) * len(grid.seeds)
    setups = args.setups.split(",")
    print(f"grid: {args.presets} x seeds {args.seeds} ({n_members} members), p = {args.p}, epochs {e1} and {e2}")
    if any(s.startswith("ray") for s in setups):
        import ray

        t0 = time.perf_counter()
        ray.init(include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False, logging_level="ERROR")
        print(f"ray: local instance started in {time.perf_counter() - t0:.1f} s "
              f"({int(ray.cluster_resources()['CPU'])} CPUs)")
    print(f"{'setup':<10}{'start-up s':>12}{'seed-epochs/s':>15}{'vs ' + setups[0]:>14}   (median of {args.reps}: range)")
    runs: dict[str, list[tuple[float, float]]] = {s: [] for s in setups}  # setup -> (rate, start-up) per repetition
    costs: dict[str, list[dict[str, float]]] = {s: [] for s in setups}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):  # the setups take turns, so a change of load hits them alike
            for setup in setups:
                outs = [Path(tmp) / f"{setup}-{e}-{rep}" for e in (e1, e2)]
                walls = [sweep_wall(setup, {**flags, "epochs": str(e)}, args.sets, out) for e, out in zip((e1, e2), outs)]
                if walls[1] <= walls[0]:
                    raise SystemExit(f"{setup}: the {e2}-epoch sweep took no longer than the {e1}-epoch one "
                                     f"({walls[1]:.1f} s vs {walls[0]:.1f} s); raise E2")
                rate = n_members * (e2 - e1) / (walls[1] - walls[0])
                runs[setup].append((rate, walls[0] - n_members * e1 / rate))
                costs[setup].append(family_costs(outs[1], presets))
    rates = {s: statistics.median(r for r, _ in runs[s]) for s in setups}
    for setup in setups:
        spread = ", ".join(f"{r:.1f}" for r, _ in runs[setup])
        print(f"{setup:<10}{statistics.median(u for _, u in runs[setup]):>12.1f}{rates[setup]:>15.1f}"
              f"{rates[setup] / rates[setups[0]]:>13.2f}x   ({spread})")
    costs = {p: statistics.median(c[p] for cs in costs.values() for c in cs) for p in presets}
    if {"fb", "ln"} <= set(costs):
        print(f"cost per seed-epoch (run.json timing, median over every sweep): ln = {costs['ln'] / costs['fb']:.2f} x fb")
        for label, early in (("budgets", False), ("early stop", True)):
            print(f"Table 1 (lr 6e-4, 60 members, {label}): projected wall time "
                  + ", ".join(f"{s} {projected_hours(rates[s], costs, presets, early):.1f} h" for s in setups))


if __name__ == "__main__":
    main()
