#!/usr/bin/env bash
# Re-render every committed LLC table of docs/landscape.md from its committed records (metrics.csv, llc-calibrate
# tables) with today's llc.stable_word / llc.usable: a verdict recorded before llc.judge read the whole trace cannot
# be judged again here (its traces were not kept): it fails where a check of today's judge reads the record alone
# (not positive; chance loss where the table holds the chains' loss; the drift factor wherever the row holds the
# checkpoint's sharpness), marked '(trace not kept)', and reads 'not judged: trace not kept (old rule: ...)'
# otherwise; such estimates are not usable (llc.usable): the comparisons, landmarks and series figures leave them
# out and say how many. Then refresh the docs' embedded tables.
#     bash analyses/landscape/rejudge_tables.sh
set -euo pipefail
cd "$(dirname "$0")/../.."
PY=${PYTHON:-python}
R=results/landscape
for run in fb_seed1 ln_seed1 llc/fb/seed_1 llc/fb/seed_2 llc/fb/seed_3 llc/ln/seed_1 llc/ln/seed_2 llc/ln/seed_3; do
    $PY analyses/landscape/trajectory_table.py $R/$run/metrics.csv > $R/$run/trajectory.md
done
$PY analyses/landscape/llc_common_table.py $R/llc_common > /dev/null
for sweep in llc_default llc_default_ln llc_old_default; do
    $PY analyses/landscape/llc_default_table.py $R/$sweep > /dev/null
done
$PY analyses/landscape/llc_points.py $R/llc/ln --against $R/llc_common_setting/fb > $R/llc/ln_llc_points.md
$PY analyses/landscape/llc_points.py $R/llc_common_setting/fb > $R/llc_common_setting/fb_llc_points.md
C="--draws 2000 --burnin 4000"
$PY analyses/landscape/llc_points.py $R/llc_components/ln $C --against $R/llc_components/fb > $R/llc_components/ln_components.md
$PY analyses/landscape/llc_points.py $R/llc_components/fb $C > $R/llc_components/fb_components.md
D=$R/llc_dense; A="$C --records $R/records/llc_dense"
$PY analyses/landscape/llc_points.py $D/ln $A --against $D/fb > $D/ln_llc_points.md
$PY analyses/landscape/llc_points.py $D/fb $A > $D/fb_llc_points.md
for preset in ln fb; do
    $PY analyses/landscape/llc_points.py $D/$preset $A --landmarks --figure $D > $D/${preset}_landmarks.md
done
$PY analyses/reproduction/embed_tables.py docs/landscape.md
