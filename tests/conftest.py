"""Shared fixtures: the command line in-process and as a child process, a tiny real sweep (tables and
figures) and constructed run directories."""

import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from geolens.threads import torch_threads
from geolens.cli import main
from geolens.model.config import make_config
from geolens.runs.storage import RunDir, atomic_write_json, load_tensors, write_metrics

REPO = Path(__file__).resolve().parents[1]
# a tiny model: trains in seconds (p = 23, half of the pairs for training)
TINY = ["--p", "23", "--frac", "0.5", "--set", "d_model=32", "--set", "d_head=8", "--set", "d_mlp=64"]


@pytest.fixture
def geolens(capsys, monkeypatch):
    """Run `geolens ARGS` in-process through main(); returns returncode, stdout, stderr."""
    monkeypatch.setenv("COLUMNS", "200")

    def run(*args):
        monkeypatch.setattr(sys, "argv", ["geolens", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as e:
            code = e.code or 0
        out = capsys.readouterr()
        return SimpleNamespace(returncode=code, stdout=out.out, stderr=out.err)

    return run


def geolens_process(*args, **kwargs) -> subprocess.Popen:
    """`python -m geolens ARGS` as a child process (stdout/stderr piped, text), importing this checkout."""
    env = {**os.environ, "PYTHONPATH": str(REPO), "COLUMNS": "200", **kwargs.pop("env", {})}
    return subprocess.Popen([sys.executable, "-m", "geolens", *map(str, args)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env, **kwargs)


def one_line_error(stderr: str) -> str:
    """The single non-empty stderr line of a failed command (asserts there is exactly one, no traceback)."""
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: ") and "Traceback" not in stderr, stderr
    return lines[0]


TINY_SWEEP = dict(task="add", p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.8, lr=4e-3, epochs=400,
                  eval_every=10, checkpoints="every:100")


@pytest.fixture(scope="session")
def tiny_sweep(tmp_path_factory):
    """A real sweep on Z_23: `sphere` (weight decay 1) and `fb` (weight decay 0), seeds 1-2, 400
    epochs, one batch, laid out as a grid sweep (ROOT/<preset>/lr4e-3/seed_N). With this code
    sphere groks (test acc > 0.95) within the budget and fb does not (the tests do not rely on it)."""
    from geolens.training.batched import train_batched

    root = tmp_path_factory.mktemp("tiny_sweep")
    cfgs = [make_config(preset, seed=s, data_seed=s, **TINY_SWEEP) for preset in ("sphere", "fb") for s in (1, 2)]
    with torch_threads(1):  # tiny matmuls: one thread is fastest, and much faster on busy cores
        train_batched(cfgs, [root / c.preset / "lr4e-3" / f"seed_{c.seed}" for c in cfgs], progress=False)
    return root


def _write_run(path, cfg, test_acc: dict[int, float], status: str = "finished", train_acc: float = 1.0) -> None:
    """A run directory without checkpoints whose metrics.csv has test accuracy test_acc[epoch] at
    each evaluated epoch (so its onsets are known), written with the storage helpers."""
    from geolens.runs.events import onset_events

    run = RunDir(path)
    run.path.mkdir(parents=True, exist_ok=True)
    run.write_header({"config": cfg.to_dict(), "engine": "fast", "n_train": 1, "n_test": 1, "status": status,
                      "stop_reason": "completed"})
    rows = [{"epoch": e, "train_loss": 0.1, "train_acc": train_acc, "test_loss": 0.2, "test_acc": a, "weight_norm": 1.0,
             "grad_norm": 0.1, "max_abs_logit": 5.0, "elapsed_s": 0.0} for e, a in sorted(test_acc.items())]
    write_metrics(run.metrics_csv, rows)
    atomic_write_json(run.events_json, {**onset_events(rows), "stop_reason": "completed", "final_epoch": rows[-1]["epoch"],
                                        "eval_every": cfg.eval_every})


def _step_curve(onset: int, epochs: int, every: int = 10, before: float = 0.5, after: float = 0.97,
               dips: dict[int, float] | None = None) -> dict[int, float]:
    """Test accuracy `before` until epoch `onset`, then `after`; dips overrides single epochs."""
    acc = {e: (after if e >= onset else before) for e in range(0, epochs + 1, every)}
    acc.update(dips or {})
    return acc


@pytest.fixture
def write_run():
    return _write_run


@pytest.fixture
def step_curve():
    return _step_curve


def assert_identical_runs(a: Path, b: Path) -> None:
    """Two run directories hold the same run: the same files, every tensor bit for bit, metrics.csv but
    its elapsed_s column, events, manifest, config and status (timing, engine_reason, which names
    the stack size, and segments, which name each resume, may differ). Hidden files are left out: a
    write interrupted by SIGKILL leaves its temporary file (.NAME.XXXXXXXX) behind."""
    names = _files(a)
    assert names == _files(b), (a, b)
    for name in names:
        if name.endswith(".safetensors"):
            ta, tb = load_tensors(a / name), load_tensors(b / name)
            assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), a / name
        elif name == "metrics.csv":
            rows = [[line.split(",") for line in (p / name).read_text().splitlines()] for p in (a, b)]
            col = rows[0][0].index("elapsed_s")
            assert [r[:col] + r[col + 1 :] for r in rows[0]] == [r[:col] + r[col + 1 :] for r in rows[1]], a / name
        elif name == "run.json":
            ja, jb = ({k: v for k, v in json.loads((p / name).read_text()).items()
                       if k not in ("timing", "engine_reason", "segments")} for p in (a, b))
            assert ja == jb, a / name
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), a / name


def _files(path: Path) -> list[str]:
    return sorted(f.relative_to(path).as_posix() for f in path.rglob("*") if f.is_file() and not f.name.startswith("."))


@pytest.fixture(name="assert_identical_runs")
def _assert_identical_runs_fixture():
    return assert_identical_runs
