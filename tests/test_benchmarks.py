"""The training benchmark runs end to end at a small size and its engines compute the same model
(its timings are not checked: tests never assert wall-clock times)."""

import importlib.util
from pathlib import Path

import pytest
import torch


def _load(name: str):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("preset", ["ln", "rms", "fb", "fb+uniform"])
def test_bench_train_engines_agree(preset):
    bench = _load("bench_train")
    r = bench.bench_preset(preset, p=23, reps=2, device=torch.device("cpu"))
    assert set(r["med"]) == {"straightforward", "hooked", "fast"}
    assert r["err_plain"] < 1e-5 and r["err_fast"] < 1e-5  # logits against the hooked model
    assert r["ratio_q"][0] <= r["ratio_q"][1]


def test_bench_train_prints_one_row_per_preset(capsys):
    bench = _load("bench_train")
    threads = torch.get_num_threads()
    try:
        bench.main(["--p", "23", "--reps", "2", "--threads", "1", "--presets", "ln,fb+uniform"])
    finally:
        torch.set_num_threads(threads)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows if r and r[0] in ("ln", "fb+uniform")] == ["ln", "fb+uniform"]
