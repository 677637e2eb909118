"""The figure / table scripts in analyses/ on constructed inputs."""

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _load(name):
    spec = importlib.util.spec_from_file_location(name, ROOT / "analyses" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_sweep_onsets_reads_the_paper_grid(tmp_path):
    mod = _load("sweep_onsets")
    csv = tmp_path / "metrics.csv"
    rows = ["epoch,test_acc"] + [f"{e},{a}" for e, a in [(0, 0.01), (190, 0.96), (200, 0.9), (390, 0.97), (400, 0.96)]]
    csv.write_text("\n".join(rows) + "\n")
    assert mod.grid_onset(csv) == 400  # 190 and 390 are above 0.95 but off the 200-epoch grid
    csv.write_text("epoch,test_acc\n0,0.01\n200,0.95\n")
    assert mod.grid_onset(csv) is None  # strictly above 0.95
