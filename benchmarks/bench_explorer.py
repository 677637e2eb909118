"""The trajectory explorer's budgets on one run (the demo run: `geolens demo --out RUN`, p = 113):

- the folder's size (plotly.js included; budget 15 MB),
- `geolens explore` with the run's analysis cache present (budget 30 s): wall seconds and the process's CPU
  seconds of the median of --reps runs (in this process: the trajectory read from the cache, the per-step
  matrices computed, the folder written),
- a slider move in headless Chromium (Debian's `chromium`, playwright): the milliseconds from the move to every
  panel redrawn and painted (geolensExplorer.setPosition: the step set, one animation frame, every panel's redraw
  resolved; then a task queued after that frame, so the page's style, layout and paint of it count too),
  median and 90th percentile over --moves moves to random checkpoints (budget 100 ms median), and the CPU
  seconds the browser's processes spent per move (user + system of every Chromium process this launch started,
  psutil): on a loaded machine the wall time measures the load, the CPU time what a move costs.

    python benchmarks/bench_explorer.py --run RUN [--reps 3] [--moves 60] [--keep DIR]
    python benchmarks/bench_explorer.py --page DIR [DIR2 ...] [--moves 60] [--rounds 1]   # only the slider
        (several folders: each round times each folder in turn, so a reference page sees the same load)
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path


def explore_once(run: Path, out: Path) -> tuple[float, float]:
    """(wall s, CPU s) of what `geolens explore --run RUN --out OUT` does, the cache present."""
    from geolens.analysis.trajectory import analyze_run
    from geolens.outputs.explorer import write_explorer
    from geolens.runs.run import load_run

    shutil.rmtree(out, ignore_errors=True)
    w0, c0 = time.perf_counter(), time.process_time()
    traj = analyze_run(load_run(run), progress=False)
    write_explorer([traj], out)
    return time.perf_counter() - w0, time.process_time() - c0


def folder_mb(out: Path) -> float:
    return sum(f.stat().st_size for f in out.iterdir()) / 1e6


def browser_cpu_s() -> float:
    """CPU seconds (user + system) of every Chromium process started under this one."""
    import psutil

    total = 0.0
    for proc in psutil.Process().children(recursive=True):
        try:
            if "chrom" in proc.name():
                t = proc.cpu_times()
                total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


MOVE = """async (pos) => { const t0 = performance.now(); await geolensExplorer.setPosition(pos);
    await new Promise((resolve) => setTimeout(resolve, 0)); return performance.now() - t0; }"""


def slider_ms(out: Path, moves: int, seed: int = 0) -> tuple[list[float], float]:
    """(milliseconds of each of `moves` slider moves to random other checkpoints, after 3 warm-up moves; the
    browser's CPU milliseconds per move)."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=shutil.which("chromium"), args=["--no-sandbox"])
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.goto((out / "index.html").resolve().as_uri(), timeout=300_000)
        page.wait_for_function("document.body.dataset.rendered", timeout=300_000)
        n = page.evaluate("geolensExplorer.state.positions.length")
        rng, pos, times = random.Random(seed), n - 1, []
        for i in range(moves + 3):
            if i == 3:
                cpu0 = browser_cpu_s()
            pos = rng.choice([j for j in range(n) if j != pos])
            ms = page.evaluate(MOVE, pos)
            if i >= 3:
                times.append(ms)
        cpu = (browser_cpu_s() - cpu0) / moves * 1000
        browser.close()
    return times, cpu


def print_slider(out: Path, moves: int) -> None:
    load = os.getloadavg()[0]
    times, cpu = slider_ms(out, moves)
    times.sort()
    p90 = times[int(0.9 * (len(times) - 1))]
    print(f"{out}: slider move, every panel redrawn: median {statistics.median(times):.0f} ms wall, 90th percentile "
          f"{p90:.0f} ms ({len(times)} moves); browser CPU {cpu:.0f} ms per move; load average {load:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--run", type=Path)
    ap.add_argument("--page", type=Path, nargs="+", help="explorer folders: time only their sliders (geolens is not imported)")
    ap.add_argument("--rounds", type=int, default=1, help="with --page: time every folder this many times, in turn")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--moves", type=int, default=60)
    ap.add_argument("--keep", type=Path, default=None, help="write the explorer here (default: a temporary folder)")
    args = ap.parse_args(argv)
    if (args.run is None) == (args.page is None):
        ap.error("give --run RUN or --page DIR")
    if args.page is not None:
        print(f"{os.cpu_count()} cores")
        for _ in range(args.rounds):
            for page in args.page:
                print_slider(page, args.moves)
        return
    from geolens.analysis.trajectory import analyze_run
    from geolens.runs.run import load_run

    tmp = Path(tempfile.mkdtemp(prefix="bench_explorer_"))
    out = args.keep or tmp / "explorer"
    try:
        analyze_run(load_run(args.run), progress=False)  # the cache is complete before timing
        runs = [explore_once(args.run, out) for _ in range(args.reps)]
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        steps = len(load_run(args.run).steps)
        print(f"run {args.run}: {steps} checkpoints; load average before the browser {os.getloadavg()[0]:.1f} "
              f"on {os.cpu_count()} cores")
        print(f"folder: {folder_mb(out):.2f} MB (plotly.min.js {(out / 'plotly.min.js').stat().st_size / 1e6:.2f} MB, "
              f"data.js {(out / 'data.js').stat().st_size / 1e6:.2f} MB)")
        print(f"explore with the cache: {wall:.1f} s wall, {cpu:.1f} s CPU (median of {args.reps})")
        if shutil.which("chromium") is None:
            print("slider: skipped (no chromium on PATH)")
            return
        print_slider(out, args.moves)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
