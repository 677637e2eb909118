"""Training-step benchmark: straightforward PyTorch vs the hooked GeoTransformer vs geolens.model.fast.

    python benchmarks/bench_train.py            # presets ln, rms, fb, fb+uniform at p = 113
    python benchmarks/bench_train.py --reps 7   # fewer repetitions (quicker, noisier)
    python benchmarks/bench_train.py --device cuda   # the same on a GPU (one table)

One epoch = one full-batch step on the training split (p = 113, frac 0.3: 3,830 examples):
forward, cross-entropy, backward, AdamW step (the preset's lr / betas / weight decay; the
straightforward implementation uses torch.optim.AdamW's defaults, the two geolens engines
geolens.training.engine.make_optimizer, the fused AdamW `geolens train` uses). The three
engines run interleaved (one step each per round) in this one process on the same data, and the
median over rounds is reported. Before timing, each engine evaluates the test split once under
no_grad, as the training loop does at epoch 0. Timings on a shared machine are noisy: compare
the ratios printed in one run, not numbers across runs.

(a) The straightforward engine is geolens.model.plain_model.PlainTransformer, the plain PyTorch
implementation of the paper's model the tests check the hooked model against (nn.Embedding,
bias-free Q/K/V/O Linear layers, softmax attention over the 3 positions, MLP, post-norm; here
the readout only at position 2). It is loaded with the hooked model's weights and checked to
give the same logits before anything is timed.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import time

import torch
import torch.nn.functional as F

from geolens.model.config import make_config
from geolens.model.fast import fast_flops, fast_logits
from geolens.model.plain_model import PlainTransformer
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.training.engine import make_optimizer, synchronize


# ---- (a) the straightforward implementation: geolens.model.plain_model.PlainTransformer -----------------
def straightforward_flops(cfg, n: int) -> int:
    """Matmul FLOPs of one step of (a): fwd + 2x bwd, all 3 positions."""
    D, Dm, H, dh, C = cfg.d_model, cfg.d_mlp, cfg.n_heads, cfg.d_head, cfg.d_vocab_out
    per_pos = 4 * D * H * dh + 2 * D * Dm + 2 * 3 * H * dh  # QKVO, MLP, scores + weighted sum
    return 3 * 2 * n * (3 * per_pos + D * C)


# ---- timing ---------------------------------------------------------------------------------------
def make_step(forward, opt, x, y):

    def step():
        loss = F.cross_entropy(forward(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()

    return step


def cuda_graph(step):
    """`step` (static tensors, no host syncs) captured once in a CUDA graph; returns its replay."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: optimizer state, cached index plans, cuBLAS workspaces
        for _ in range(3):
            step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    return graph.replay


def graphed_fast_step(cfg, hooked: GeoTransformer, x, y):
    """'fast, CUDA graph': a fresh copy of the fast engine (same weights) whose whole step (forward,
    backward, capturable fused AdamW) is replayed from one CUDA graph."""
    model = GeoTransformer(cfg).to(x.device)
    model.load_state_dict(hooked.state_dict())
    return cuda_graph(make_step(lambda t: fast_logits(model, t), make_optimizer(model, capturable=True), x, y))


def matmul_gflops(reps: int, device: torch.device) -> tuple[float, float]:
    """Median GFLOP/s of a plain [3830, 128] @ [128, 512] float32 matmul and of a 1024^3 one."""
    sync, out = functools.partial(synchronize, device), []
    for m, k, n in ((3830, 128, 512), (1024, 1024, 1024)):
        a, b = torch.randn(m, k, device=device), torch.randn(k, n, device=device)
        for _ in range(3):
            a @ b
        ts = []
        for _ in range(max(reps, 10)):
            sync()
            t = time.perf_counter()
            a @ b
            sync()
            ts.append(time.perf_counter() - t)
        out.append(2 * m * k * n / statistics.median(ts) / 1e9)
    return out[0], out[1]


def rel(a, b) -> float:
    return float((a - b).norm() / b.norm())


def bench_preset(preset: str, p: int, reps: int, device: torch.device, graphs: bool = False) -> dict:
    cfg = make_config(preset, p=p)
    data = make_dataset(cfg)
    x, y = (t.to(device) for t in data.train)
    test_x = data.test[0].to(device)
    torch.manual_seed(0)
    hooked = GeoTransformer(cfg).to(device)
    fast_model = GeoTransformer(cfg).to(device)
    plain = PlainTransformer(cfg).to(device).load_from(hooked)
    plain_logits = functools.partial(plain, last_only=True)
    with torch.no_grad():  # same function, and the epoch-0 evaluation the training loop does
        ref = hooked(test_x)[:, -1]
        err_plain = rel(plain_logits(test_x), ref)
        err_fast = rel(fast_logits(fast_model, test_x), ref)
    engines = {
        "straightforward": make_step(plain_logits, torch.optim.AdamW(plain.parameters(), lr=cfg.lr, betas=(cfg.beta1, cfg.beta2),
                                                              weight_decay=cfg.weight_decay), x, y),
        "hooked": make_step(lambda t: hooked(t)[:, -1], make_optimizer(hooked), x, y),
        "fast": make_step(lambda t: fast_logits(fast_model, t), make_optimizer(fast_model), x, y),
    }
    sync = functools.partial(synchronize, device)
    for step in engines.values():
        step()
        step()
    if graphs:  # captured after the eager engines warmed up (index plans and cuBLAS handles exist)
        sync()
        engines["fast, CUDA graph"] = graphed_fast_step(cfg, hooked, x, y)
        engines["fast, CUDA graph"]()
    times = {k: [] for k in engines}
    for _ in range(reps):
        for name, step in engines.items():
            sync()
            t = time.perf_counter()
            step()
            sync()
            times[name].append(time.perf_counter() - t)
    med = {k: 1e3 * statistics.median(v) for k, v in times.items()}
    # the spread of the speed-up: straightforward / fast within each round (both stepped back to back)
    ratios = [s / f for s, f in zip(times["straightforward"], times["fast"])]
    quartiles = statistics.quantiles(ratios, n=4) if len(ratios) > 1 else ratios * 3
    flops = fast_flops(cfg, len(y))
    return dict(preset=preset, n=len(y), med=med, err_plain=err_plain, err_fast=err_fast, flops=flops,
                plain_flops=straightforward_flops(cfg, len(y)), ratio_q=(quartiles[0], quartiles[2]))


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--presets", default="ln,rms,fb,fb+uniform")
    ap.add_argument("--p", type=int, default=113)
    ap.add_argument("--reps", type=int, default=15, help="timed rounds per preset (median reported)")
    ap.add_argument("--threads", default="", help="comma-separated torch thread counts, one table each (default: torch's)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (then --threads is ignored)")
    ap.add_argument("--cuda-graphs", action="store_true",
                    help="with --device cuda: also time the fast step replayed from a CUDA graph")
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    t_start = time.perf_counter()
    load0 = os.getloadavg()
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs ({cpu}), load average {load0[0]:.2f}")
    if device.type == "cuda":
        run_table(args, f"{torch.cuda.get_device_name(device)}, CUDA {torch.version.cuda}", device)
    else:
        for threads in [int(t) for t in args.threads.split(",") if t.strip()] or [torch.get_num_threads()]:
            torch.set_num_threads(threads)
            run_table(args, f"{threads} thread(s)", device)
    load1 = os.getloadavg()
    print(f"load average at the end {load1[0]:.2f}; total benchmark time {time.perf_counter() - t_start:.0f} s")
    if max(load0[0], load1[0]) > 0.6:
        print("note: other processes were using the CPUs during this run; multi-threaded timings suffer most")


def run_table(args, label: str, device: torch.device) -> None:
    mm_small, mm_big = matmul_gflops(args.reps, device)
    print(f"\n== {label} ==  plain matmul reference: [3830,128]@[128,512] {mm_small:.1f} GFLOP/s, "
          f"1024^3 {mm_big:.1f} GFLOP/s")
    hdr = (f"{'preset':12s} {'straightfwd':>11s} {'hooked':>9s} {'fast':>8s} {'fast/straight':>13s} {'speedup':>8s} "
           f"{'per-round q1-q3':>15s} {'fast GFLOP/ep':>13s} {'fast GFLOP/s':>12s}  {'straight GFLOP/ep':>17s}  {'max rel err logits':>18s}")
    print("median ms per epoch (full-batch forward + backward + AdamW step); speedup = straightforward / fast "
          "medians, with the quartiles of the per-round ratio")
    print(hdr)
    rows = []
    for preset in args.presets.split(","):
        r = bench_preset(preset, args.p, args.reps, device, graphs=args.cuda_graphs and device.type == "cuda")
        rows.append(r)
        m = r["med"]
        total = sum(r["flops"].values())
        print(f"{preset:12s} {m['straightforward']:11.1f} {m['hooked']:9.1f} {m['fast']:8.1f} "
              f"{m['fast'] / m['straightforward']:13.3f} {m['straightforward'] / m['fast']:7.2f}x "
              f"{r['ratio_q'][0]:7.2f}-{r['ratio_q'][1]:.2f}x {total / 1e9:13.3f} {total / 1e9 / (m['fast'] / 1e3):12.1f}  {r['plain_flops'] / 1e9:17.2f}  "
              f"{max(r['err_plain'], r['err_fast']):18.1e}", flush=True)
    for r in rows:
        for name in [k for k in r["med"] if "graph" in k]:
            print(f"  {r['preset']}: {name} {r['med'][name]:.2f} ms per epoch "
                  f"({r['med']['straightforward'] / r['med'][name]:.2f}x the straightforward step without graphs)")
    for r in rows:
        parts = ", ".join(f"{k} {v / 1e9:.3f}" for k, v in r["flops"].items())
        print(f"  fast path FLOP/epoch, {r['preset']} (n = {r['n']}): {parts} GFLOP")


if __name__ == "__main__":
    sys.exit(main())
