#!/usr/bin/env bash
# Rebuild the figures docs/reproduction.md shows (docs/figures/reproduction/*.png) with `geolens figures`
# from the committed records in results/ (no training). The W_L spectrum and FVE figures read the
# checkpoints of runs/spectral (`run_cpu.sh spectral`); where that folder is absent, the committed copies stay.
#   bash analyses/reproduction/figures.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
dest=docs/figures/reproduction
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
status=0

# figure SOURCE PAPER NAME=AS ...: `geolens figures` of SOURCE (restricted to PAPER's table unless ""),
# then its NAME.png becomes $dest/AS.png (written beside and renamed: a killed copy leaves the old one)
figure() {
    local source=$1 paper=$2 pair target
    shift 2
    if [ ! -d "$source" ]; then
        echo "figures.sh: no $source here; $dest keeps its committed copies of: ${*#*=}" >&2
        return
    fi
    rm -rf "$tmp/out"
    "$py" -m geolens figures --runs "$source" ${paper:+--paper "$paper"} --out "$tmp/out" --formats png > /dev/null \
        || { status=1; return; }
    for pair in "$@"; do
        target="$dest/${pair#*=}.png"
        cp "$tmp/out/${pair%%=*}.png" "$target.new" && mv "$target.new" "$target" || status=1
    done
}

figure results/table1 table1 test_accuracy=test_accuracy onsets=onsets
figure results/table2_mul table2 onsets=table2_onsets test_accuracy=table2_test_accuracy
figure results/table2_mul_lr1e-4 "" test_accuracy=table2_lr1e-4_test_accuracy
figure results/table3_uniform table3 uniform_attention=uniform_attention
figure runs/spectral "" wl_spectrum=wl_spectrum fve_keys=fve_keys
exit $status
