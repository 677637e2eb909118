#!/usr/bin/env bash
# The GPU measurements of docs/performance.md in one command, on a machine with a CUDA build of torch:
#   bash benchmarks/run_gpu.sh [OUT_DIR]        (runs go to OUT_DIR, default runs/gpu)
# CUDA tests (tests/test_device.py), training ms/epoch (straightforward vs hooked vs fast), batched
# seed-epochs/s for 1 to 100 seeds, then the p = 113 runs of docs/results.md (fb and ln, lr 6e-4, seed 1;
# the 10-seed fb sweep) trained on the GPU: their run.json record ms per epoch and the evaluation and
# checkpoint overhead.
# Every step runs even if an earlier one failed; the exit status says whether any did.
set -uo pipefail
cd "$(dirname "$0")/.."
py=${PYTHON:-.venv/bin/python}
out=${1:-runs/gpu}
status=0
step() { echo "== $*"; "$@" || { echo "FAILED (exit $?): $*"; status=1; }; }
"$py" -c 'import torch; assert torch.cuda.is_available(), "no CUDA device"; print(torch.__version__, torch.cuda.get_device_name())' || exit 1
step "$py" -m pytest -q -rs tests/test_device.py
step "$py" benchmarks/bench_train.py --device cuda --reps 30 --cuda-graphs
step "$py" benchmarks/bench_batched.py --device cuda --seeds 1,10,100 --reps 10
for preset in fb ln; do  # the two p = 113 runs of docs/results.md, trained again on the GPU
    epochs=$([ $preset = fb ] && echo 5000 || echo 15000)
    step "$py" -m geolens train --preset $preset --lr 6e-4 --seed 1 --epochs "$epochs" --early-stop 500 --set device=cuda \
        --quiet --force --out "$out/${preset}_lr6e-4_seed1"
done
step "$py" -m geolens sweep --preset fb --seeds 1-10 --lr 6e-4 --epochs 2500 --early-stop 100 --set device=cuda --quiet \
    --force --out "$out/sweep_fb_lr6e-4"
"$py" - "$out" <<'PY'
import json, pathlib, sys
for run in sorted(pathlib.Path(sys.argv[1]).rglob("run.json")):
    h, e = json.loads(run.read_text()), json.loads((run.parent / "events.json").read_text())
    t = h["timing"]
    print(f"{run.parent}: engine {h['engine']}, onset_095 {e['onset_095']}, final epoch {e['final_epoch']}, "
          f"{t['ms_per_epoch']:.2f} ms/epoch, (eval + ckpt) / train = {(t['eval_s'] + t['ckpt_s']) / t['train_s']:.1%}, "
          f"background writes {t.get('write_s', 0):.1f} s")
PY
exit $status
