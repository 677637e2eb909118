#!/usr/bin/env bash
# The reproductions too long for a CPU (docs/reproduction.md), on one CUDA GPU, resumable like
# run_cpu.sh: Table 1 at lr 1e-4, then Tables 2-4 and Appendix B at the paper's full seeds and epoch
# budgets, and Table 2 at lr 1e-4, into runs/gpu/ (tables in runs/gpu/tables). Expected wall time on one
# H200: about 4.5-5.5 hours (estimated from the measured 10-seed stacks of docs/performance.md "GPU",
# ~750-850 seed-epochs/s; not yet run there). Needs a CUDA build of torch in .venv (or PYTHON=...).
#   bash analyses/reproduction/run_gpu.sh
set -uo pipefail
cd "$(dirname "$0")/../.."
source analyses/clean_tree.sh
require_clean_tree   # records for docs/ come from a committed tree (ALLOW_DIRTY=1 overrides)
py=${PYTHON:-.venv/bin/python}
here=analyses/reproduction
"$py" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"' || exit 1
status=0
gpu() {  # gpu NAME OUT [sweep options]: one grid on the GPU, 10 seeds unless the options say otherwise
    local name=$1 out=$2; shift 2
    echo "== $(date -Is) $name"
    "$py" -m geolens sweep --grid "$here/$name.toml" --out "$out" --set device=cuda --quiet "$@" || status=1
}
gpu table1_lr1e-4 runs/gpu/table1
gpu table2_mul runs/gpu/table2 --seeds 1-10 --epochs ln=100000,rms=100000,10000
gpu table3_uniform runs/gpu/table3 --seeds 1-10
gpu table4_s5 runs/gpu/table4 --seeds 1-10 --epochs 100000
gpu appendixB_s5_uniform runs/gpu/appendixB --seeds 1-5 --epochs 100000
gpu table2_mul_lr1e-4 runs/gpu/table2_lr1e-4 --seeds 1-10 --epochs ln=100000,rms=100000,10000  # is Table 2 lr 1e-4?
declare -A sources=([table1]=runs/gpu/table1 [table2]=runs/gpu/table2 [table3]=runs/gpu/table3
                    [table4]=runs/gpu/table4 [appendixB]=runs/gpu/appendixB)
for table in table1 table2 table3 table4 appendixB; do  # each from its own folder (one run per seed)
    "$py" -m geolens table --runs "${sources[$table]}" --paper "$table" --out runs/gpu/tables || status=1
done
"$py" -m geolens table --runs runs/gpu/table2_lr1e-4 --paper table2 --out runs/gpu/tables/table2_lr1e-4 || status=1
exit $status
