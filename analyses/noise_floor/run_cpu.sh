#!/usr/bin/env bash
# The float-order noise floor of the grokking onset (docs/noise-floor.md): the same seed, data and
# hyperparameters on the same machine, computed four ways that differ only in the order of
# floating-point operations:
#   fast_t1     one fast-engine run, 1 torch thread       (OMP_NUM_THREADS=1 geolens train)
#   fast_t2     one fast-engine run, 2 torch threads
#   batched_t1  a member of a stacked sweep of the seeds, 1 thread (geolens sweep --threads 1)
#   hooked_t1   one hooked-engine run, 1 thread            (--set engine=hooked)
# for LayerNorm (ln), the bounded sphere at weight decay 1 (sphere) and fully bounded (fb), Z_113
# addition, lr 6e-4, seeds 1-3, as Table 1 (early stop 200 epochs after test accuracy holds >= 0.99).
# Resumable: finished runs are skipped, killed ones continue from their last checkpoint. Records
# (run.json, metrics.csv, events.json) are copied to results/noise_floor/records after every run;
# `geolens noise-floor --runs results/noise_floor/records` tabulates them.
#   bash analyses/noise_floor/run_cpu.sh [LANE ...]     lanes: fast hooked (default both, in order);
#   two commands with one lane each use both cores. Refuses a dirty tree (analyses/clean_tree.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree
py=${PYTHON:-.venv/bin/python}
R=${RUNS:-runs/noise_floor}
SEEDS=${SEEDS:-"1 2 3"}
PRESETS=${PRESETS:-"fb sphere ln"}
lanes=("$@")
[ ${#lanes[@]} -gt 0 ] || lanes=(fast hooked)
status=0

epochs() { [ "$1" = ln ] && echo 15000 || echo 5000; }
finished() { [ -f "$1/run.json" ] && grep -q '"status": "finished"' "$1/run.json"; }
collect() { "$py" analyses/reproduction/collect.py "$R" results/noise_floor/records > /dev/null; }
COMMON=(--task add --p 113 --lr 6e-4 --early-stop 200 --checkpoints every:1000 --quiet)

# single THREADS OUT ARGS...: one `geolens train` on THREADS torch threads, resumed if it was killed
single() {
    local threads=$1 out=$2; shift 2
    if finished "$out"; then return; fi
    echo "== $(date -Is) $out"
    if [ -f "$out/resume.safetensors" ]; then OMP_NUM_THREADS=$threads "$py" -m geolens train --resume --out "$out" --quiet > /dev/null || status=1
    else OMP_NUM_THREADS=$threads "$py" -m geolens train "$@" --out "$out" --force > /dev/null || status=1; fi
    collect
}

for lane in "${lanes[@]}"; do
    for preset in $PRESETS; do
        E=$(epochs "$preset")
        case $lane in
        fast)
            for s in $SEEDS; do
                single 1 "$R/$preset/fast_t1/seed_$s" --preset "$preset" --seed "$s" --epochs "$E" "${COMMON[@]}"
                single 2 "$R/$preset/fast_t2/seed_$s" --preset "$preset" --seed "$s" --epochs "$E" "${COMMON[@]}"
            done
            echo "== $(date -Is) $R/$preset/batched_t1"
            "$py" -m geolens sweep --preset "$preset" --seeds "$(echo $SEEDS | tr ' ' ,)" --epochs "$E" --threads 1 --workers 1 \
                "${COMMON[@]}" --out "$R/$preset/batched_t1" > /dev/null || status=1
            collect ;;
        hooked)
            for s in $SEEDS; do
                single 1 "$R/$preset/hooked_t1/seed_$s" --preset "$preset" --seed "$s" --epochs "$E" "${COMMON[@]}" --set engine=hooked
            done ;;
        *) echo "unknown lane $lane (fast hooked)" >&2; exit 2 ;;
        esac
    done
done
exit $status
