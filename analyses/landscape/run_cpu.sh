#!/usr/bin/env bash
# The landscape and optimizer experiments of docs/landscape.md, Z_113 addition, resumable (finished runs are
# skipped, killed ones continue from their last checkpoint; analyses compute only what their cache lacks):
#   lane muon    Muon against AdamW for ln, sphere and fb, seeds 1-5: `--set optimizer=muon` (Muon's lr
#                muon_lr on the MLP matrices, AdamW's lr 6e-4 on the rest) and the AdamW default, Table 1's
#                budgets plus 3,000 epochs, early stop 3,000 epochs after test accuracy holds >= 0.99 (does
#                generalisation hold after the onset?); LayerNorm's runs (both optimizers) and every Muon run with
#                --set flush_denormal=true (Muon's weight decay leaves dead rows subnormal; fb's and the sphere's
#                AdamW runs predate it). OPTIMIZERS="muon" trains only the Muon arms (the AdamW default: both)
#   lane llc     fb and ln, seeds 1-3, checkpoints every 200 epochs, then `geolens analyze` of every checkpoint:
#                fb `--metrics llc,sharpness,loss` (the LLC, its components and the sharpness along the trajectory;
#                `geolens precursors` then reads the LLC as a precursor) at LANE_LLC (the setting its committed tables
#                were made at: DEFAULT_LLC until the default gained a burn-in; today's judge fails it along fb's
#                trajectory, docs/landscape.md), ln `--metrics sharpness,loss` (that step diverges at LayerNorm's
#                sharpness: docs/landscape.md, Calibration)
#   lane llc_dense  ln and fb, seeds 1-3: the llc lane's training anew into $R/llc_dense (its own runs: the llc
#                lane's records name another machine, whose float order they need), then the whole-model LLC at the
#                burn-in setting (BURNIN_LLC, one setting for both) and the losses at every STRIDE-th checkpoint and
#                the last (STRIDE=1, the default: every checkpoint), `geolens analyze --workers 2`
# Records (run.json, metrics.csv, events.json) go to results/landscape/records, the analysis tables to
# results/landscape/<lane>/<run>/metrics.csv. SEEDS="1 2" narrows the seeds, PRESETS="fb sphere" the presets of
# both lanes to those named. DEVICE=cuda (or cpu) trains the muon lane stacked instead: each preset and optimizer's seeds
# as one `geolens sweep` on that device (one torch thread driving it), all of them at once; DEADLINE=SECONDS stops every sweep after
# that long (its killed members resume on the next call). Refuses a dirty tree (analyses/clean_tree.sh).
#   bash analyses/landscape/run_cpu.sh [LANE ...]     (default: llc muon)
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree
py=${PYTHON:-.venv/bin/python}
R=${RUNS:-runs/landscape}
SEEDS=${SEEDS:-"1 2 3 4 5"}
lanes=("$@")
[ ${#lanes[@]} -gt 0 ] || lanes=(llc muon)
status=0

# pick PRESET ...: those PRESETS names (all of them when PRESETS is unset)
pick() { for c in "$@"; do [[ -z "${PRESETS:-}" || " $PRESETS " == *" $c "* ]] && echo "$c"; done; }
finished() { [ -f "$1/run.json" ] && grep -q '"status": "finished"' "$1/run.json"; }
collect() { "$py" analyses/reproduction/collect.py "$R" results/landscape/records > /dev/null; }
epochs() { [ "$1" = ln ] && echo 18000 || echo 8000; }
flush() { if [ "$1" = ln ] || [ "$2" = muon ]; then echo "--set flush_denormal=true"; fi; }
BURNIN_LLC=lr=1e-7,n_beta=1000,burnin=4000,draws=2000,components=none
LANE_LLC=lr=1e-5,n_beta=100,draws=100,burnin=0
# strided RUN: every STRIDE-th checkpointed epoch of RUN and its last, comma-separated
strided() {
    "$py" -c "from geolens.runs.run import load_run; s = load_run('$1').steps
print(','.join(map(str, sorted(set(s[::${STRIDE:-1}] + s[-1:])))))"
}
# muon_args PRESET OPTIMIZER: the training flags of one muon-lane configuration (every seed's)
muon_args() {
    echo --preset "$1" --p 113 --lr 6e-4 --epochs "$(epochs "$1")" --early-stop 3000 --checkpoints every:1000 \
        --set optimizer="$2" $(flush "$1" "$2")
}

# run OUT ARGS...: one `geolens train` on one thread, resumed if it was killed
run() {
    local out=$1; shift
    if finished "$out"; then return; fi
    echo "== $(date -Is) $out"
    if [ -f "$out/resume.safetensors" ]; then OMP_NUM_THREADS=1 "$py" -m geolens train --resume --out "$out" --quiet < /dev/null > /dev/null || status=1
    else OMP_NUM_THREADS=1 "$py" -m geolens train "$@" --out "$out" --force < /dev/null > /dev/null || status=1; fi
    collect
}

if [ -n "${DEVICE:-}" ]; then
    [ "${lanes[*]}" = muon ] || { echo "DEVICE=$DEVICE trains the muon lane only (the llc lane's analyses run on the CPU)" >&2; exit 2; }
    for preset in $(pick fb sphere ln); do
        for opt in ${OPTIMIZERS:-adamw muon}; do
            echo "== $(date -Is) $R/muon/$preset/$opt seeds $SEEDS on $DEVICE"
            # shellcheck disable=SC2046
            timeout "${DEADLINE:-0}" "$py" -m geolens sweep $(muon_args "$preset" "$opt") \
                --seeds "$(echo $SEEDS | tr ' ' ',')" --set device="$DEVICE" --threads 1 --out "$R/muon/$preset/$opt" \
                < /dev/null > /dev/null &
        done
    done
    while true; do wait -n; rc=$?; [ $rc = 127 ] && break; [ $rc = 0 ] || status=1; done
    collect
    exit $status
fi
for lane in "${lanes[@]}"; do
    case $lane in
    muon)
        for s in $SEEDS; do
            for preset in $(pick fb sphere ln); do
                for opt in ${OPTIMIZERS:-adamw muon}; do
                    # shellcheck disable=SC2046
                    run "$R/muon/$preset/$opt/seed_$s" $(muon_args "$preset" "$opt") --seed "$s"
                done
            done
        done ;;
    llc)
        for s in $(echo $SEEDS | cut -d' ' -f1-3); do
            for preset in $(pick fb ln); do
                out="$R/llc/$preset/seed_$s"
                run "$out" --preset "$preset" --p 113 --lr 6e-4 --seed "$s" --epochs "$(epochs "$preset")" \
                    --early-stop 500 --checkpoints every:200
                metrics=llc,sharpness,loss; [ "$preset" = ln ] && metrics=sharpness,loss
                OMP_NUM_THREADS=1 "$py" -m geolens analyze --run "$out" --metrics "$metrics" --llc "$LANE_LLC" \
                    --static '' --quiet --workers 1 > /dev/null || status=1
                mkdir -p "results/landscape/llc/$preset/seed_$s"
                cp "$out/analysis/metrics.csv" "results/landscape/llc/$preset/seed_$s/metrics.csv"
            done
        done ;;
    llc_dense)
        for s in $(echo $SEEDS | cut -d' ' -f1-3); do
            for preset in $(pick ln fb); do
                out="$R/llc_dense/$preset/seed_$s"
                run "$out" --preset "$preset" --p 113 --lr 6e-4 --seed "$s" --epochs "$(epochs "$preset")" \
                    --early-stop 500 --checkpoints every:200
                finished "$out" || continue
                echo "== $(date -Is) $out LLC at $BURNIN_LLC"
                "$py" -m geolens analyze --run "$out" --metrics llc,loss --llc "$BURNIN_LLC" \
                    --steps "$(strided "$out")" --static '' --quiet --workers 2 > /dev/null || status=1
                mkdir -p "results/landscape/llc_dense/$preset/seed_$s"
                cp "$out/analysis/metrics.csv" "results/landscape/llc_dense/$preset/seed_$s/metrics.csv"
            done
        done ;;
    *) echo "unknown lane $lane (muon llc llc_dense)" >&2; exit 2 ;;
    esac
done
exit $status
