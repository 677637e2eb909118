#!/usr/bin/env bash
# docs/precursors.md's tables and figures from committed records (no training): `geolens precursors` on
# the runs of analyses/precursors/run_cpu.sh (results/precursors/runs/add: Z_113 addition, 10 seeds of
# LayerNorm, RMSNorm, the bounded sphere and fully bounded; results/precursors/runs/mul: Z_113
# multiplication, 3 seeds of LayerNorm and fully bounded), into results/precursors/{add,mul}/, then
# embedded in the doc with their figures (docs/figures/precursors/{add,mul}.png).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
mkdir -p docs/figures/precursors
for grid in add mul; do
    "$py" -m geolens precursors --runs "results/precursors/runs/$grid" --out "results/precursors/$grid" > /dev/null
    cp "results/precursors/$grid/precursors.png" "docs/figures/precursors/$grid.png"
done
"$py" analyses/reproduction/embed_tables.py docs/precursors.md
