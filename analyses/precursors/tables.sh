#!/usr/bin/env bash
# docs/precursors.md's tables from committed records (no training): `geolens precursors` on Table 1's
# lr-6e-4 runs (Z_113 addition, 10 seeds of six configurations) and Table 2's multiplication runs
# (Z_113, 3 seeds of four), into results/precursors/{add,mul}/, then embedded in the doc with the
# addition runs' figure (docs/figures/precursors/add.png).
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
"$py" -m geolens precursors --runs results/table1/table1_lr6e-4 --out results/precursors/add > /dev/null
"$py" -m geolens precursors --runs results/table2_mul --out results/precursors/mul > /dev/null
"$py" analyses/reproduction/embed_tables.py docs/precursors.md
mkdir -p docs/figures/precursors
cp results/precursors/add/precursors.png docs/figures/precursors/add.png
