#!/usr/bin/env bash
# Every CPU reproduction of docs/reproduction.md, in priority order, resumable: rerunning the same
# command skips finished members and continues killed ones (each grid is an ordinary `geolens
# sweep`). One torch thread per job; set WORKERS=2 to use two cores. Results that outlive the machine
# (run.json, metrics.csv, events.json of finished members; no checkpoints) are copied to results/,
# the tables to results/tables/, the figures docs/reproduction.md shows to docs/figures/reproduction/.
#   bash analyses/reproduction/run_cpu.sh [GRID ...]     (default: all grids below, in this order)
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree   # records for docs/ come from a committed tree (ALLOW_DIRTY=1 overrides)
py=${PYTHON:-.venv/bin/python}
here=analyses/reproduction
grids=("$@")
[ ${#grids[@]} -gt 0 ] || grids=(table1_lr6e-4 notebook_init float_order_hooked spectral table3_uniform table2_mul table4_s5 appendixB_s5_uniform table2_mul_lr1e-4)
status=0
for name in "${grids[@]}"; do
    out=runs/$name
    echo "== $(date -Is) $name"
    if [ -f "$here/$name.sh" ]; then  # not a grid: its own script
        bash "$here/$name.sh" "$out" || status=1
    else
        "$py" -m geolens sweep --grid "$here/$name.toml" --out "$out" --threads 1 --workers "${WORKERS:-1}" --quiet || status=1
    fi
    case $name in table1_*|notebook_init) dest=results/table1/$name ;; *) dest=results/$name ;; esac
    "$py" "$here/collect.py" "$out" "$dest"
    if [ "$name" = spectral ]; then  # section 4.3: the circuit at the last checkpoint (the first logged acc >= 0.99)
        "$py" "$here/spectral.py" "$out" "results/$name" results/tables > /dev/null || status=1
    fi
done
bash "$here/tables.sh" || status=1    # every table and the doc's copies, from results/
bash "$here/figures.sh" || status=1   # the doc's figures, from results/ (and runs/spectral)
exit $status
