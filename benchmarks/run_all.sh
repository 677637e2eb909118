#!/usr/bin/env bash
# Every benchmark in one command, each measuring its own reference in the same run:
#   bash benchmarks/run_all.sh
# training ms/epoch (straightforward vs hooked vs fast), batched seed-epochs/s, grid sweeps per backend,
# analysis s/checkpoint, what schedules and the norm clamp cost an epoch, what the precursor columns cost,
# the deep engine at 1-4 layers against the straightforward model and the exact-computation ceiling, and
# what the landscape metrics (LLC, sharpness) cost a checkpoint, and training speed quiet and beside a busy process
# by thread count and OpenMP wait policy.
set -euo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
"$py" benchmarks/bench_train.py "$@"
"$py" benchmarks/bench_batched.py
"$py" benchmarks/bench_grid.py
"$py" benchmarks/bench_analysis.py
"$py" benchmarks/bench_controls.py
"$py" benchmarks/bench_precursors.py
"$py" benchmarks/bench_depth.py
"$py" benchmarks/bench_landscape.py
"$py" benchmarks/bench_threads.py
