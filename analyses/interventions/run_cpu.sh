#!/usr/bin/env bash
# docs/interventions.md's experiments on Z_113 addition, lr 6e-4, seeds 1-3, in priority order and
# resumable: a finished run is skipped, an unfinished one continues from its last checkpoint. Parents
# are single runs (so a fork without changes continues exactly as its parent did); each arm is one
# `geolens fork`. One torch thread per run. Records (run.json, metrics.csv, events.json; no
# checkpoints) are copied to results/interventions/ after every run; at the end figures.sh rebuilds
# the tables and the figure of docs/interventions.md from them.
#   bash analyses/interventions/run_cpu.sh [PART ...]
# parts: parents rescue sphere_wd rescue_wd1 pulses uniform reverse chaos (default: all, in this order);
# SEEDS="3 2 1" takes the seeds in another order (two such commands can share the work: a run that
# the other is training is refused by its lock and left to it).
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree   # records for docs/ come from a committed tree (ALLOW_DIRTY=1 overrides)
export OMP_NUM_THREADS=1
py=${PYTHON:-.venv/bin/python}
R=runs/interventions
SEEDS=${SEEDS:-"1 2 3"}
parts=("$@")
[ ${#parts[@]} -gt 0 ] || parts=(parents rescue sphere_wd rescue_wd1 pulses uniform reverse chaos)
status=0

finished() { [ -f "$1/run.json" ] && grep -q '"status": "finished"' "$1/run.json"; }
collect() { "$py" analyses/reproduction/collect.py "$R" results/interventions > /dev/null; }

# run OUT ARGS...: `geolens train ARGS --out OUT` unless OUT is finished; an unfinished OUT is resumed
run() {
    local out=$1; shift
    if finished "$out"; then return; fi
    echo "== $(date -Is) train $out"
    if [ -f "$out/resume.safetensors" ]; then "$py" -m geolens train --resume --out "$out" --quiet > /dev/null || status=1
    else "$py" -m geolens train "$@" --out "$out" --force --quiet > /dev/null || status=1; fi
    collect
}
# arm PARENT STEP OUT ARGS...: `geolens fork --run PARENT --step STEP ARGS --out OUT`, resumed likewise
arm() {
    local parent=$1 step=$2 out=$3; shift 3
    if finished "$out"; then return; fi
    echo "== $(date -Is) fork $out"
    if [ -f "$out/resume.safetensors" ]; then "$py" -m geolens train --resume --out "$out" --quiet > /dev/null || status=1
    else "$py" -m geolens fork --run "$parent" --step "$step" "$@" --out "$out" --force --quiet > /dev/null || status=1; fi
    collect
}

COMMON=(--task add --p 113 --lr 6e-4 --early-stop 300)
FB_TOPOLOGY=(--set norm=sphere --set unembed=bounded --set weight_decay=0.0)
LN_TOPOLOGY=(--set norm=layernorm --set unembed=raw --set weight_decay=1.0)
for part in "${parts[@]}"; do
    for s in $SEEDS; do
        ln=$R/parents/ln/seed_$s fb=$R/parents/fb/seed_$s sphere=$R/parents/sphere/seed_$s
        case $part in
        parents)
            run "$ln" --preset ln --seed "$s" --epochs 12000 --checkpoints every:200 "${COMMON[@]}"
            run "$fb" --preset fb --seed "$s" --epochs 3000 --checkpoints every:100 "${COMMON[@]}"
            run "$sphere" --preset sphere --seed "$s" --epochs 3000 --checkpoints every:100 "${COMMON[@]}" ;;
        rescue)     # LayerNorm plateau -> the bounded sphere (fb's topology)
            for k in 1000 3000 5000; do arm "$ln" $k "$R/rescue/step$k/seed_$s" "${FB_TOPOLOGY[@]}"; done ;;
        rescue_wd1) # LayerNorm plateau -> the bounded sphere keeping weight decay 1 (the `sphere` topology)
            for k in 1000 3000 5000; do arm "$ln" $k "$R/rescue_wd1/step$k/seed_$s" --set norm=sphere --set unembed=bounded; done ;;
        sphere_wd)  # bounded sphere, weight decay 1 -> 0 after 200 epochs (the parent is the wd-1 arm)
            arm "$sphere" 200 "$R/sphere_wd/wd0/seed_$s" --set weight_decay=0.0 ;;
        pulses)     # weight decay 3 or 0.3 for 200 epochs inside the LayerNorm plateau
            for k in 5000 3000 1000; do for wd in 3.0 0.3; do
                arm "$ln" $k "$R/pulses/wd$wd/step$k/seed_$s" --schedule "weight_decay=$wd@$k:$((k + 200))"
            done; done ;;
        uniform)    # uniform attention switched on in the LayerNorm plateau
            for k in 1000 3000; do arm "$ln" $k "$R/uniform/step$k/seed_$s" --set attention=uniform; done ;;
        reverse)    # fb -> LayerNorm topology early in its (short) plateau
            for k in 300 600; do arm "$fb" $k "$R/reverse/step$k/seed_$s" --epochs 12000 "${LN_TOPOLOGY[@]}"; done ;;
        chaos)      # controls: a 1% change, to measure how far a negligible perturbation moves the onset
            arm "$sphere" 200 "$R/chaos/sphere_wd0.99/seed_$s" --set weight_decay=0.99
            arm "$ln" 3000 "$R/chaos/ln_pulse1.01/seed_$s" --schedule "weight_decay=1.01@+0:+200" ;;
        *) echo "unknown part $part (parents rescue sphere_wd rescue_wd1 pulses uniform reverse chaos)"; exit 2 ;;
        esac
    done
done
bash analyses/interventions/figures.sh || status=1   # the doc's tables and figure, from results/
exit $status
