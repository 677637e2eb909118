#!/usr/bin/env bash
# The non-grokking runs of docs/precursors.md's false-alarm table (analyses/precursors/nogrok.toml: LayerNorm,
# Z_113 addition, lr 6e-4, weight decay 0, seeds 1-3), resumable; their run.json, metrics.csv and events.json
# copied to results/precursors/records/nogrok. tables.sh scores the online rules on them.
#   bash analyses/precursors/nogrok.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree   # records for docs/ come from a committed tree (ALLOW_DIRTY=1 overrides)
py=${PYTHON:-.venv/bin/python}
status=0
"$py" -m geolens sweep --grid analyses/precursors/nogrok.toml --out runs/precursors/nogrok --threads 1 --quiet || status=1
"$py" analyses/reproduction/collect.py runs/precursors/nogrok results/precursors/records/nogrok
exit $status
