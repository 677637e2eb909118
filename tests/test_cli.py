"""The `geolens` command line: one-line errors with non-zero exit, train/info/resume round trip."""

import json
import sys

import pytest
import torch
from conftest import TINY, one_line_error


def test_train_info_and_resume(tmp_path, geolens):
    out = tmp_path / "fb_seed3"
    r = geolens("train", "--preset", "fb", "--task", "add", "--seed", "3", "--epochs", "20", "--eval-every", "5",
                "--out", str(out), "--quiet", *TINY)
    assert r.returncode == 0, r.stderr
    assert "fb_seed3" in r.stdout and "last_epoch" in r.stdout
    header = json.loads((out / "run.json").read_text())
    assert header["config"]["seed"] == 3 and header["config"]["d_mlp"] == 64 and header["status"] == "finished"
    assert header["config"]["data_seed"] == 3  # the split follows --seed, as a sweep's seed_3 member's
    r = geolens("info", "--run", str(out))
    assert r.returncode == 0 and "last_epoch" in r.stdout and "20" in r.stdout
    assert "1 layer, post-norm sphere, bounded readout, learned attention" in r.stdout and "adamw" in r.stdout
    r = geolens("train", "--out", str(out), "--resume", "--preset", "ln", "--epochs", "30", "--quiet")
    assert r.returncode == 2 and "drop --preset" in r.stderr  # not silently ignored
    r = geolens("train", "--out", str(out), "--resume", "--epochs", "30", "--quiet")
    assert r.returncode == 0, r.stderr
    assert json.loads((out / "events.json").read_text())["final_epoch"] == 30
    # info says who trained which epochs: this checkout, here, from 0 and from the resume at 20
    r = geolens("info", "--run", str(out))
    lines = [line for line in r.stdout.splitlines() if "from epoch" in line]
    assert [line.split("from epoch ")[1].split(":")[0] for line in lines] == ["0", "20"]
    assert all(f"({torch.backends.cpu.get_cpu_capability()}, " in line and " thread(s))" in line for line in lines)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["train", "--preset", "nope", "--out", "{tmp}/x"], "unknown preset 'nope'"),
        (["train", "--p", "100", "--out", "{tmp}/x"], "p = 100 is not prime"),
        (["train", "--set", "colour=red", "--out", "{tmp}/x"], "unknown config field 'colour'"),
        (["train", "--set", "d_mlp=big", "--out", "{tmp}/x"], "not a valid int"),
        (["train", "--checkpoints", "sometimes", "--out", "{tmp}/x"], "unknown checkpoint schedule"),
        (["info", "--run", "{tmp}/missing"], "does not exist"),
        (["train", "--resume", "--out", "{tmp}/missing"], "does not exist"),
        (["analyze", "--run", "{tmp}/missing", "--static", "png,jpg"], "static format(s) ['jpg'] not supported"),
    ],
)
def test_bad_input_gives_one_line_error(tmp_path, geolens, args, needle):
    r = geolens(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert r.returncode != 0
    lines = [line for line in r.stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1 and needle in lines[0], r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "x").exists()


def test_existing_run_is_not_overwritten(tmp_path, geolens):
    out = tmp_path / "r"
    assert geolens("train", "--epochs", "5", "--eval-every", "5", "--out", str(out), "--quiet", *TINY).returncode == 0
    before = (out / "metrics.csv").read_bytes()
    r = geolens("train", "--epochs", "10", "--eval-every", "5", "--out", str(out), "--quiet", *TINY)
    assert r.returncode != 0 and "already exists" in r.stderr
    assert (out / "metrics.csv").read_bytes() == before
    r = geolens("train", "--epochs", "10", "--eval-every", "5", "--out", str(out), "--quiet", "--force", *TINY)
    assert r.returncode == 0 and (out / "metrics.csv").read_bytes() != before


def test_installed_console_script_fails_cleanly(tmp_path):
    import subprocess
    from pathlib import Path

    script = Path(sys.executable).parent / "geolens"
    r = subprocess.run([str(script), "train", "--preset", "nope", "--out", str(tmp_path / "x")], capture_output=True, text=True)
    assert r.returncode == 2 and r.stderr.strip().count("\n") == 0 and "unknown preset 'nope'" in r.stderr


def test_ctrl_c_exits_130_and_says_what_is_kept(tmp_path, geolens, monkeypatch):
    out = tmp_path / "run"
    assert geolens("train", "--epochs", "5", "--eval-every", "5", "--out", str(out), "--quiet", *TINY).returncode == 0

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("geolens.analysis.trajectory.analyze_run", interrupted)
    r = geolens("analyze", "--run", str(out), "--quiet")
    assert r.returncode == 130 and "interrupted" in r.stderr and "rerun analyze" in r.stderr and "--resume" not in r.stderr
    monkeypatch.setattr("geolens.sweeps.sweep.run_sweep", interrupted)
    r = geolens("sweep", "--seeds", "1", "--out", str(tmp_path / "sw"), "--quiet", *TINY)
    assert r.returncode == 130 and "rerun the same sweep command" in r.stderr


@pytest.mark.parametrize("repeated, combined", [
    (["--preset", "fb", "--preset", "ln"], ["--preset", "fb,ln"]),
    (["--seeds", "1-2", "--seeds", "5"], ["--seeds", "1-2,5"]),
    (["--lr", "1e-3", "--lr", "6e-4"], ["--lr", "1e-3,6e-4"]),
    (["--wd", "1", "--wd", "0.3"], ["--wd", "1,0.3"]),
    (["--task", "add", "--task", "mul"], ["--task", "add,mul"]),
    (["--p", "23", "--p", "29"], ["--p", "23,29"]),
    (["--epochs", "ln=30", "--epochs", "20"], ["--epochs", "ln=30,20"]),
    (["--fork-from", "parent", "--steps", "50", "--steps", "100"], ["--fork-from", "parent", "--steps", "50,100"]),
    (["--fork-from", "parent", "--steps", "50", "--set", "lr=1e-3", "--set", "lr=2e-3"],
     ["--fork-from", "parent", "--steps", "50", "--set", "lr=1e-3,2e-3"]),
])
def test_sweep_list_options_combine_their_repeats(tmp_path, geolens, monkeypatch, repeated, combined):
    """A repeated list option is its comma list: no grid axis is lost (`--preset fb --preset ln` once trained ln alone)."""
    seen = []

    def record(spec, *args, **kwargs):
        seen.append(spec)
        raise KeyboardInterrupt

    monkeypatch.setattr("geolens.sweeps.sweep.run_sweep", record)
    base = ["sweep", "--out", tmp_path / "sw", "--quiet"]
    base += [] if "--fork-from" in repeated else ["--set", "d_model=32", "--set", "d_head=8"]
    base += [] if "--seeds" in repeated or "--fork-from" in repeated else ["--seeds", "1"]
    base += [] if "--preset" in repeated or "--epochs" not in repeated else ["--preset", "ln,fb"]
    for args in (repeated, combined):
        assert geolens(*base, *args).returncode == 130
    assert seen[0] == seen[1]


@pytest.mark.parametrize("args, flag", [
    (["train", "--lr", "1e-3", "--lr", "6e-4"], "--lr"),
    (["train", "--preset", "fb", "--preset=ln"], "--preset"),
    (["train", "--set", "d_mlp=32", "--set", "d_mlp=64"], "--set d_mlp"),
    (["sweep", "--seeds", "1", "--frac", "0.3", "--frac", "0.5"], "--frac"),
    (["sweep", "--seeds", "1", "--set", "tau=5", "--set", "tau=20"], "--set tau"),
    (["fork", "--run", "r", "--step", "10", "--step", "20", "--out", "o"], "--step"),
])
def test_an_option_of_one_value_given_twice_is_refused(tmp_path, geolens, args, flag):
    r = geolens(*args, *(["--out", tmp_path / "x"] if args[0] != "fork" else []))
    assert r.returncode == 2 and f"error: {flag} is given" in one_line_error(r.stderr)
    assert not (tmp_path / "x").exists()
