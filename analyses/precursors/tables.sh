#!/usr/bin/env bash
# docs/precursors.md's tables and figures from committed records (no training): `geolens precursors` on
# the runs of analyses/precursors/run_cpu.sh (results/precursors/records/add: Z_113 addition, 10 seeds of
# LayerNorm, RMSNorm, the bounded sphere and fully bounded; results/precursors/records/mul: Z_113
# multiplication, 3 seeds of LayerNorm and fully bounded), into results/precursors/{add,mul}/ (the doc
# shows their precursors.png from there), then the tables embedded in the doc.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
for grid in add mul; do
    "$py" -m geolens precursors --runs "results/precursors/records/$grid" --out "results/precursors/$grid" > /dev/null
done
"$py" analyses/reproduction/embed_tables.py docs/precursors.md
