"""Fixtures shared by the command-line tests."""

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from geolens.cli import main

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
