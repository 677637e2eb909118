"""Shared test helpers."""

import json
from pathlib import Path

import pytest
import torch

from geolens.storage import load_tensors


def assert_identical_runs(a: Path, b: Path) -> None:
    """Two run directories hold the same run: the same files, every tensor bit for bit, metrics.csv but
    its elapsed_s column, events, manifest, config and status (timing and engine_reason, which names
    the stack size, may differ). Hidden files are left out: a write interrupted by SIGKILL leaves its
    temporary file (.NAME.XXXXXXXX) behind."""
    names = _files(a)
    assert names == _files(b), (a, b)
    for name in names:
        if name.endswith(".safetensors"):
            ta, tb = load_tensors(a / name), load_tensors(b / name)
            assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), a / name
        elif name == "metrics.csv":
            rows = [[line.rsplit(",", 1)[0] for line in (p / name).read_text().splitlines()] for p in (a, b)]
            assert rows[0] == rows[1], a / name
        elif name == "run.json":
            ja, jb = ({k: v for k, v in json.loads((p / name).read_text()).items() if k not in ("timing", "engine_reason")}
                      for p in (a, b))
            assert ja == jb, a / name
        else:
            assert (a / name).read_bytes() == (b / name).read_bytes(), a / name


def _files(path: Path) -> list[str]:
    return sorted(f.relative_to(path).as_posix() for f in path.rglob("*") if f.is_file() and not f.name.startswith("."))


@pytest.fixture(name="assert_identical_runs")
def _assert_identical_runs_fixture():
    return assert_identical_runs
