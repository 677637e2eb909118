#!/usr/bin/env bash
# docs/precursors.md's runs, resumable (rerunning skips finished members and continues killed ones):
# the addition grid (4 configurations x 10 seeds) and the multiplication grid (2 x 3), with the
# precursor columns every run records; then their run.json, metrics.csv and events.json (no
# checkpoints) copied to results/precursors/records/{add,mul} and the tables and figures rebuilt
# (tables.sh). One torch thread per job; WORKERS=2 uses two cores.
#   bash analyses/precursors/run_cpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree   # records for docs/ come from a committed tree (ALLOW_DIRTY=1 overrides)
py=${PYTHON:-.venv/bin/python}
status=0
for grid in add mul; do
    echo "== $(date -Is) $grid"
    "$py" -m geolens sweep --grid "analyses/precursors/$grid.toml" --out "runs/precursors/$grid" --threads 1 \
        --workers "${WORKERS:-1}" --quiet || status=1
    "$py" analyses/reproduction/collect.py "runs/precursors/$grid" "results/precursors/records/$grid"
done
bash analyses/precursors/tables.sh || status=1
exit $status
