#!/usr/bin/env bash
# docs/precursors.md's tables and figures from committed records (no training): `geolens precursors --online`
# on the runs of analyses/precursors/run_cpu.sh (results/precursors/records/add: Z_113 addition, 10 seeds of
# LayerNorm, RMSNorm, the bounded sphere and fully bounded; results/precursors/records/mul: Z_113
# multiplication, 3 seeds of LayerNorm and fully bounded), into results/precursors/{add,mul}/: the offline
# table with its statistics, the online threshold rules (minimum warning 100 epochs; for addition also
# 500 epochs, in add/warning500) with the error of choosing the column (precursors_online_selection) and lead
# time against false alarms (precursors_alarms; for addition scored also on runs that never grok, from
# results/depth), and the forecast file of each configuration's best rule (forecast.json, for `geolens train
# --forecast`); the doc shows their precursors.png from there. The prospective seeds scored against add's
# forecast file (results/precursors/prospective/check). Then the side-by-side
# table of W_L's offline crossing and the online rules (side_by_side.py) and the tables embedded in the doc.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
nongrokking=results/depth/records/add/L1  # docs/depth.md's one-layer runs: pre-norm LayerNorm seeds 2-4 and sphere 1, 4 never grok
"$py" -m geolens precursors --runs results/precursors/records/add --out results/precursors/add --online \
    --min-warning 100 --nongrokking "$nongrokking" --save results/precursors/add/forecast.json > /dev/null
"$py" -m geolens precursors --runs results/precursors/records/mul --out results/precursors/mul --online \
    --min-warning 100 --save results/precursors/mul/forecast.json > /dev/null
"$py" -m geolens precursors --runs results/precursors/records/add --out results/precursors/add/warning500 --online \
    --min-warning 500 --nongrokking "$nongrokking" --save results/precursors/add/warning500/forecast.json > /dev/null
rm -f results/precursors/add/warning500/precursors.{md,csv,png}  # the offline table is add/'s
"$py" -m geolens precursors --runs results/precursors/prospective --check results/precursors/add/forecast.json \
    --out results/precursors/prospective/check > /dev/null
"$py" analyses/precursors/side_by_side.py results/precursors/add/precursors.csv results/precursors/add/side_by_side.md \
    results/precursors/add/precursors_online.csv:100 results/precursors/add/warning500/precursors_online.csv:500
"$py" analyses/precursors/at_crossing.py results/precursors/records/add results/precursors/add/at_crossing.md
"$py" analyses/reproduction/embed_tables.py docs/precursors.md
