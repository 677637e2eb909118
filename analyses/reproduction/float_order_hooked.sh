#!/usr/bin/env bash
# Float order: the fully bounded seeds of table1_lr6e-4.toml (the same init, data and hyperparameters)
# trained through the hooked forward (`--set engine=hooked`), one unstacked run per seed, one torch
# thread: the same math as the fast engine's stacked runs, another order of floating-point operations.
# Resumable: finished seeds are skipped, killed ones continue from their last checkpoint.
#   bash analyses/reproduction/float_order_hooked.sh [OUT]      (default runs/float_order_hooked; seeds 1-5, or e.g. SEEDS="1 2 3")
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree   # records for docs/ come from a committed tree (ALLOW_DIRTY=1 overrides)
py=${PYTHON:-.venv/bin/python}
out=${1:-runs/float_order_hooked}
status=0
for seed in ${SEEDS:-1 2 3 4 5}; do
    run=$out/fb/lr6e-4/seed_$seed
    state=$("$py" -c "import json,sys; print(json.load(open(sys.argv[1])).get('status'))" "$run/run.json" 2>/dev/null || echo new)
    echo "== $(date -Is) hooked fb seed $seed: $state"
    case $state in
        finished) ;;
        new) OMP_NUM_THREADS=1 "$py" -m geolens train --preset fb --seed "$seed" --data-seed "$seed" --lr 6e-4 --epochs 5000 \
                 --early-stop 200 --checkpoints every:500 --set engine=hooked --out "$run" --quiet > /dev/null || status=1 ;;
        *) OMP_NUM_THREADS=1 "$py" -m geolens train --resume --out "$run" --quiet > /dev/null || status=1 ;;
    esac
done
exit $status
