#!/usr/bin/env bash
# docs/interventions.md's tables and figure, from the records in results/interventions (no training):
# results/interventions/tables/ (summarize.py), embedded in docs/interventions.md, and
# docs/figures/interventions/fork_dose.png.
set -euo pipefail
cd "$(dirname "$0")/../.."
py=${PYTHON:-.venv/bin/python}
"$py" analyses/interventions/summarize.py results/interventions > /dev/null
"$py" analyses/reproduction/embed_tables.py docs/interventions.md
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
"$py" -m geolens figures --runs results/interventions --out "$tmp" --formats png > /dev/null
mkdir -p docs/figures/interventions
cp "$tmp/fork_dose.png" docs/figures/interventions/
