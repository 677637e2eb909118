"""analyses/summarize_runs.py (docs/results.md's circuit table) on a tiny run: its rows are the run's metrics."""

import importlib.util
import math
from pathlib import Path

from geolens import load_run
from geolens.model.config import make_config
from geolens.training import train as training

PATH = Path(__file__).resolve().parent.parent / "analyses" / "summarize_runs.py"


def module():
    spec = importlib.util.spec_from_file_location("summarize_runs", PATH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_rows_at_the_onset_and_last_checkpoint_are_the_runs_metrics(tmp_path):
    out = tmp_path / "sphere"
    cfg = make_config("sphere", p=23, frac_train=0.8, d_model=32, n_heads=4, d_head=8, d_mlp=64, lr=4e-3, epochs=1000,
                      eval_every=10, seed=1, checkpoints="every:100")
    training.train(cfg, out, progress=False)
    run = load_run(out)
    onset = run.events["onset_095"]
    # the onset moves with the machine's float order (480 on an AVX512 CPU, below 400 on others; seeds
    # 2-3 at 490-600): 1,000 epochs leave room
    assert onset is not None
    text = module().summary([str(out)])
    rows = [line.split(" | ") for line in text.splitlines() if line.startswith("| ") and line[2].isdigit()]
    steps = sorted({run.nearest_step(onset), run.steps[-1]})
    assert [int(r[0][2:].replace(",", "")) for r in rows] == steps
    values = run.analyze(["loss", "fve_paper", "truncated_logit_acc"], steps=steps).values
    for r, step in zip(rows, steps):
        v = values[step]
        assert r[1] == f"{v['loss']['acc_test']:.4f}"
        assert r[4] == f"{v['fve_paper']['fve_paper_U_max']:.1f} / {v['fve_paper']['fve_paper_V_max']:.1f}"
        assert r[5] == f"{v['truncated_logit_acc']['truncated_logit_acc']:.4f}"
        assert r[6].split(" (")[0] in {"clock", "pizza", "mixed", "unsolved"}
    assert f"onset (test acc > 0.95): epoch {onset};" in text
    assert '"sphere_wd0_U": 62.55' in text  # the paper's numbers, from the package's paper_tables.json


def test_verdict_names_every_code_nan_included():
    verdict = module().verdict
    assert [verdict(c) for c in (1.0, -1.0, 0.0, math.nan)] == ["clock", "pizza", "mixed", "unsolved"]
