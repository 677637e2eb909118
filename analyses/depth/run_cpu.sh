#!/usr/bin/env bash
# Depth and placement experiments (docs/depth.md): Z_113 addition, lr 6e-4, Table 1's budgets (LayerNorm and
# RMSNorm 15,000 epochs, the sphere and fully bounded 5,000; early stop 200 epochs after test accuracy holds
# >= 0.99), seeds 1-5, one `geolens train` per run on one torch thread:
#   lane one     1 layer:  ln_post ln_pre rms_pre sphere_post fb_post sphere_pre
#   lane two     2 layers: the same six
#   lane hybrid  2 layers, post-norm, the sphere preset's bounded readout and wd 1: norm=sphere,layernorm and
#                norm=layernorm,sphere
#   lane add3    2 layers, ln_post and fb_post on Z_p sums of 3 operands at p = 23 (12,167 inputs, 3,650 to
#                train on: the cost of one Z_113 pair epoch)
#   lane add3_113  the same at p = 113 (1,442,897 inputs, 432,869 to train on; DEVICE only: days per run on a CPU).
#                A 2-layer add3 run peaks at ~21.5 KiB per input on the CPU (p = 31 and 59: 1.41 and 5.01 GiB), ~30 GiB
#                at p = 113: five stacked seeds would not fit one 139 GB GPU, so this lane trains single runs, one
#                configuration per background lane, its seeds one after another.
# Resumable: finished runs are skipped, killed ones continue from their last checkpoint. Records (run.json,
# metrics.csv, events.json) are copied to results/depth/records after every run; `geolens table --runs
# results/depth/records` tabulates them. SEEDS="1 2 3" narrows the seeds, CONFIGS="fb_post sphere_post" the
# configurations of every lane to those named (runs go seed by seed, so early seeds of every configuration come first).
# DEVICE=cuda (or cpu) trains stacked instead: each configuration's seeds as one `geolens sweep` on that device (one
# torch thread driving it), every configuration of the named lanes at once (on a GPU stacks are launch-bound: they share it);
# DEADLINE=SECONDS stops every sweep after that long (its killed members resume on the next call).
#   bash analyses/depth/run_cpu.sh [LANE ...]      (default: one two hybrid add3, in order; two commands
#   with different lanes use two cores). Refuses a dirty tree (analyses/clean_tree.sh).
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree
py=${PYTHON:-.venv/bin/python}
R=${RUNS:-runs/depth}
SEEDS=${SEEDS:-"1 2 3 4 5"}
lanes=("$@")
[ ${#lanes[@]} -gt 0 ] || lanes=(one two hybrid add3)
status=0

finished() { [ -f "$1/run.json" ] && grep -q '"status": "finished"' "$1/run.json"; }
collect() { "$py" analyses/reproduction/collect.py "$R" results/depth/records > /dev/null; }
COMMON=(--lr 6e-4 --early-stop 200 --checkpoints every:1000 --quiet)

# config NAME -> the preset and overrides of that configuration
config() {
    case $1 in
    ln_post) echo "--preset ln" ;;
    ln_pre) echo "--preset ln --set norm_placement=pre" ;;
    rms_pre) echo "--preset rms --set norm_placement=pre" ;;
    sphere_post) echo "--preset sphere" ;;
    fb_post) echo "--preset fb" ;;
    sphere_pre) echo "--preset sphere --set norm_placement=pre" ;;
    sphere_ln_post) echo "--preset sphere --set norm=sphere,layernorm" ;;
    ln_sphere_post) echo "--preset sphere --set norm=layernorm,sphere" ;;
    *) echo "unknown configuration $1" >&2; exit 2 ;;
    esac
}
epochs() { case $1 in ln_*|rms_*|*_ln_*|ln_sphere_*) echo 15000 ;; *) echo 5000 ;; esac; }

# run LAYERS NAME SEED TASK P
run() {
    local layers=$1 name=$2 seed=$3 task=$4 p=$5
    local out="$R/$task/L$layers/$name/seed_$seed"
    if finished "$out"; then return; fi
    echo "== $(date -Is) $out"
    if [ -f "$out/resume.safetensors" ]; then
        OMP_NUM_THREADS=1 timeout "${DEADLINE:-0}" "$py" -m geolens train --resume --out "$out" --quiet < /dev/null > /dev/null || status=1
    else
        # shellcheck disable=SC2046
        OMP_NUM_THREADS=1 timeout "${DEADLINE:-0}" "$py" -m geolens train $(config "$name") --set n_layers="$layers" \
            --task "$task" --p "$p" --seed "$seed" --epochs "$(epochs "$name")" "${COMMON[@]}" ${DEVICE:+--set device="$DEVICE"} \
            --out "$out" --force < /dev/null > /dev/null || status=1
    fi
    collect
}

# sweep LAYERS NAME TASK P: the SEEDS of one configuration as one stacked sweep on DEVICE, in the background
sweep() {
    local layers=$1 name=$2 task=$3 p=$4
    echo "== $(date -Is) $R/$task/L$layers/$name seeds $SEEDS on $DEVICE"
    # shellcheck disable=SC2046
    timeout "${DEADLINE:-0}" "$py" -m geolens sweep $(config "$name") --set n_layers="$layers" --task "$task" --p "$p" \
        --seeds "$(echo $SEEDS | tr ' ' ',')" --epochs "$(epochs "$name")" "${COMMON[@]}" --set device="$DEVICE" \
        --threads 1 --out "$R/$task/L$layers/$name" < /dev/null > /dev/null &
}

# pick CONFIG ...: those of a lane's configurations that CONFIGS names (all of them when CONFIGS is unset)
pick() { for c in "$@"; do [[ -z "${CONFIGS:-}" || " $CONFIGS " == *" $c "* ]] && echo "$c"; done; }
SIX="ln_post ln_pre rms_pre sphere_post fb_post sphere_pre"
# lane_runs LANE: one "LAYERS CONFIG TASK P" line per configuration of the lane
lane_runs() {
    case $1 in
    one) for c in $(pick $SIX); do echo 1 "$c" add 113; done ;;
    two) for c in $(pick $SIX); do echo 2 "$c" add 113; done ;;
    hybrid) for c in $(pick sphere_ln_post ln_sphere_post); do echo 2 "$c" add 113; done ;;
    add3) for c in $(pick ln_post fb_post); do echo 2 "$c" add3 23; done ;;
    add3_113) for c in $(pick ln_post fb_post); do echo 2 "$c" add3 113; done ;;
    *) echo "unknown lane $1 (one two hybrid add3 add3_113)" >&2; exit 2 ;;
    esac
}
for lane in "${lanes[@]}"; do lane_runs "$lane" > /dev/null || exit 2; done
if [[ " ${lanes[*]} " == *" add3_113 "* && "${DEVICE:-}" != cuda ]]; then
    echo "lane add3_113 trains on 432,869 inputs per epoch: run it on a GPU with DEVICE=cuda (days per run on a CPU)" >&2
    exit 2
fi
if [ -n "${DEVICE:-}" ]; then
    for lane in "${lanes[@]}"; do
        while read -r layers c task p; do
            if [ "$lane" = add3_113 ]; then  # singles (memory, above), each configuration's seeds in turn
                (for s in $SEEDS; do run "$layers" "$c" "$s" "$task" "$p"; done; exit $status) &
            else sweep "$layers" "$c" "$task" "$p"; fi
        done < <(lane_runs "$lane")
    done
    while true; do wait -n; rc=$?; [ $rc = 127 ] && break; [ $rc = 0 ] || status=1; done
    collect
    exit $status
fi
for lane in "${lanes[@]}"; do
    for s in $SEEDS; do
        while read -r layers c task p; do run "$layers" "$c" "$s" "$task" "$p"; done < <(lane_runs "$lane")
    done
done
exit $status
