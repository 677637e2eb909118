#!/usr/bin/env bash
# A prospective test of the online onset forecast (docs/precursors.md): LayerNorm seeds 11-15 of Table 1's
# configuration (Z_113 addition, lr 6e-4; seeds no forecast was fitted on), each trained with
# `geolens train --forecast results/precursors/add/forecast.json` (the rule fitted on seeds 1-10 with a
# minimum warning of 100 epochs, committed before these runs), so the progress line showed the forecast
# live and run.json keeps the rule. Records to results/precursors/prospective/; then
# `geolens precursors --runs results/precursors/prospective --check results/precursors/add/forecast.json`
# scores each forecast against the mean onset of the fitting seeds. Resumable; refuses a dirty tree.
#   bash analyses/precursors/prospective.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree
py=${PYTHON:-.venv/bin/python}
R=runs/precursors/prospective
status=0
for s in ${SEEDS:-11 12 13 14 15}; do
    out=$R/ln/seed_$s
    if [ -f "$out/run.json" ] && grep -q '"status": "finished"' "$out/run.json"; then continue; fi
    echo "== $(date -Is) $out"
    if [ -f "$out/resume.safetensors" ]; then OMP_NUM_THREADS=1 "$py" -m geolens train --resume --out "$out" --quiet > /dev/null || status=1
    else OMP_NUM_THREADS=1 "$py" -m geolens train --preset ln --seed "$s" --task add --p 113 --lr 6e-4 --epochs 15000 \
        --early-stop 200 --checkpoints every:1000 --forecast results/precursors/add/forecast.json --out "$out" --force \
        --quiet > /dev/null || status=1; fi
    "$py" analyses/reproduction/collect.py "$R" results/precursors/prospective > /dev/null
done
exit $status
