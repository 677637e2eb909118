"""Depth benchmark: the deep engine against a straightforward PyTorch model and against the limit exact
computation allows, at 1, 2 and 4 layers, post- and pre-norm (p = 113, full batch).

    python benchmarks/bench_depth.py                 # layers 1,2,4 x post,pre; then the 2-layer end-to-end run
    python benchmarks/bench_depth.py --reps 7 --end-to-end 0   # quicker, no end-to-end run

Per configuration, one full-batch training step (forward, cross-entropy, backward, AdamW) of:
- straightforward: geolens.model.plain_model.PlainTransformer (plain nn.Linear / nn.LayerNorm layers, every
  position in every layer, logits at every position: what a researcher writes first), loaded with the
  same weights and checked to give the same logits;
- hooked: the GeoTransformer forward (the reference engine);
- deep: geolens.model.deep (the engine `geolens train` takes for these models);
- fast (one-layer post-norm only): geolens.model.fast.
They run interleaved (one step each per round) in this process; medians are reported.

The ceiling is counted in multiply-adds per example (forward; the backward scales alike): the
straightforward model does L * n * (4 D HD + 2 D Dm + 2 n HD) + n D C; an exact engine needs only the `=`
query, attention output, MLP and readout in the last layer (keys and values at every position), every
position in the layers before it, and can take layer 0's attention from per-(token, position) tables
(exact_macs). speed-up / ceiling is the engine's efficiency per operation against PyTorch's (1.0: no
wasted work and as efficient per operation as the straightforward model). Where the time goes: the
deep step's profile by operator (--profile).

End to end (--end-to-end EPOCHS, default 60): `geolens train` of the 2-layer pre-norm model at p = 113 with
eval every 10 epochs, precursor columns and adaptive checkpoints, engine=hooked against the default
engine, in the same process, alternating.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import sys
import tempfile
import time

import torch
import torch.nn.functional as F

from geolens.model.config import GeoConfig, make_config
from geolens.model.deep import deep_logits
from geolens.model.fast import fast_logits
from geolens.model.plain_model import PlainTransformer
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.training.engine import make_optimizer


# ---- the counts ------------------------------------------------------------------------------------
def layer_macs(cfg: GeoConfig, positions: int) -> int:
    """Multiply-adds of one full layer at `positions` positions (Q, K, V, O, scores and weighted sum, MLP)."""
    D, HD, Dm, n = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp, cfg.n_ctx
    return positions * (4 * D * HD + 2 * D * Dm + 2 * n * HD)


def straightforward_macs(cfg: GeoConfig) -> int:
    """Per example, forward: every position in every layer, logits at every position."""
    n = cfg.n_ctx
    return cfg.n_layers * layer_macs(cfg, n) + n * cfg.d_model * cfg.d_vocab_out


def exact_macs(cfg: GeoConfig) -> int:
    """Per example, forward, what exact computation needs: layer 0's attention from tables (nothing per
    example), its MLP at every position unless it is the last layer; the middle layers in full; the last
    layer's keys and values at every position, its query, output, MLP and readout at `=` only."""
    D, HD, Dm, n, C, L = cfg.d_model, cfg.n_heads * cfg.d_head, cfg.d_mlp, cfg.n_ctx, cfg.d_vocab_out, cfg.n_layers
    mlp_and_readout = 2 * D * Dm + D * C
    if L == 1:
        return mlp_and_readout
    first = n * 2 * D * Dm
    middle = (L - 2) * layer_macs(cfg, n)
    last = n * 2 * D * HD + D * HD + 2 * n * HD + HD * D + mlp_and_readout
    return first + middle + last


def ceiling(cfg: GeoConfig) -> float:
    """Speed-up over the straightforward model that exact computation allows, by the counts above."""
    return straightforward_macs(cfg) / exact_macs(cfg)


# ---- timing ----------------------------------------------------------------------------------------
def _step(forward, opt, x, y):
    def step():
        loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return step


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def bench_config(layers: int, placement: str, p: int, reps: int) -> dict:
    cfg = make_config("ln", p=p, n_layers=layers, norm_placement=placement)
    x, y = make_dataset(cfg).train
    torch.manual_seed(0)
    hooked = GeoTransformer(cfg)
    models = {"hooked": hooked}
    plain = PlainTransformer(cfg).load_from(hooked)
    steps = {"straightforward": _step(lambda t: plain(t)[:, -1], torch.optim.AdamW(
        plain.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2), weight_decay=cfg.weight_decay), x, y),
             "hooked": _step(lambda t: hooked(t)[:, -1], make_optimizer(hooked), x, y)}
    forwards = {"deep": deep_logits}
    if layers == 1 and placement == "post":
        forwards["fast"] = fast_logits
    errors = {}
    with torch.no_grad():
        ref = hooked(x)[:, -1]
        errors["straightforward"] = rel(plain(x)[:, -1], ref)
    for name, forward in forwards.items():
        model = GeoTransformer(cfg)
        model.load_state_dict(hooked.state_dict())
        models[name] = model
        with torch.no_grad():
            errors[name] = rel(forward(model, x), ref)
        steps[name] = _step(functools.partial(forward, model), make_optimizer(model), x, y)
    for step in steps.values():
        step()
        step()
    times = {k: [] for k in steps}
    for _ in range(reps):
        for name, step in steps.items():
            t = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - t)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    per_round = sorted(s / d for s, d in zip(times["straightforward"], times["deep"]))
    return dict(cfg=cfg, med=med, errors=errors, ratio_q=(per_round[len(per_round) // 4], per_round[3 * len(per_round) // 4]))


def profile_deep(layers: int, placement: str, p: int, top: int = 8) -> str:
    """The deep step's self CPU time by operator (torch.profiler), the top rows."""
    from torch.profiler import ProfilerActivity, profile

    cfg = make_config("ln", p=p, n_layers=layers, norm_placement=placement)
    x, y = make_dataset(cfg).train
    model = GeoTransformer(cfg)
    step = _step(functools.partial(deep_logits, model), make_optimizer(model), x, y)
    for _ in range(3):
        step()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(5):
            step()
    return prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=top)


def end_to_end(epochs: int, p: int) -> dict[str, float]:
    """Seconds of `geolens train` (the library call) of the 2-layer pre-norm model, engine hooked vs default."""
    from geolens.training.train import train

    cfg = make_config("ln", p=p, n_layers=2, norm_placement="pre", epochs=epochs, eval_every=10)
    seconds: dict[str, list[float]] = {"hooked": [], "auto": []}
    with tempfile.TemporaryDirectory() as tmp:
        for rnd in range(2):
            for engine, times in seconds.items():
                t = time.perf_counter()
                result = train(cfg.replace(engine=engine), f"{tmp}/{engine}{rnd}", progress=False)
                times.append(time.perf_counter() - t)
                chosen = result.engine
    return {"hooked": min(seconds["hooked"]), "auto": min(seconds["auto"]), "engine": chosen}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", default="1,2,4")
    ap.add_argument("--placements", default="post,pre")
    ap.add_argument("--p", type=int, default=113)
    ap.add_argument("--reps", type=int, default=15, help="timed rounds (median reported)")
    ap.add_argument("--threads", type=int, default=0, help="torch threads (default: torch's)")
    ap.add_argument("--profile", action="store_true", help="print the 2-layer pre-norm deep step's operator profile")
    ap.add_argument("--end-to-end", type=int, default=60, metavar="EPOCHS", help="0: skip the end-to-end run")
    args = ap.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s), {os.cpu_count()} CPUs, load average "
          f"{load0:.2f}; p = {args.p}, ln preset, full batch")
    print("median ms per step; speed-up = straightforward / deep (quartiles of the per-round ratio); ceiling = "
          "straightforward / exact multiply-adds per example; efficiency = speed-up / ceiling")
    print(f"{'layers':>6s} {'norm':>5s} {'straight':>9s} {'hooked':>8s} {'deep':>8s} {'fast':>8s} {'speed-up':>9s} "
          f"{'q1-q3':>11s} {'ceiling':>8s} {'efficiency':>10s} {'kMAC straight/exact':>20s} {'max rel err':>11s}")
    for layers in [int(v) for v in args.layers.split(",")]:
        for placement in args.placements.split(","):
            r = bench_config(layers, placement, args.p, args.reps)
            m, cfg = r["med"], r["cfg"]
            speedup, ceil = m["straightforward"] / m["deep"], ceiling(cfg)
            fast = f"{m['fast']:8.1f}" if "fast" in m else f"{'-':>8s}"
            print(f"{layers:6d} {placement:>5s} {m['straightforward']:9.1f} {m['hooked']:8.1f} {m['deep']:8.1f} {fast} "
                  f"{speedup:8.2f}x {r['ratio_q'][0]:5.2f}-{r['ratio_q'][1]:.2f}x {ceil:7.2f}x {speedup / ceil:10.2f} "
                  f"{straightforward_macs(cfg) / 1e3:10.1f}/{exact_macs(cfg) / 1e3:<9.1f} {max(r['errors'].values()):11.1e}",
                  flush=True)
    if args.profile:
        print("\ndeep engine, 2 layers pre-norm, 5 steps, by operator:\n" + profile_deep(2, "pre", args.p))
    if args.end_to_end:
        e = end_to_end(args.end_to_end, args.p)
        print(f"\nend to end, 2 layers pre-norm, {args.end_to_end} epochs (eval every 10, precursor columns, checkpoints): "
              f"hooked {e['hooked']:.1f} s, {e['engine']} {e['auto']:.1f} s: {e['hooked'] / e['auto']:.2f}x")
    print(f"load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    sys.exit(main())
