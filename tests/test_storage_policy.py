"""The storage policy (config `keep`): the optimizer state only at sparse checkpoints, forks at any epoch
by replay (bit for bit, or refused), forks that read their parent's checkpoints instead of copies (a moved
or changed parent refused), `geolens convert`, one rule for --step, and the rough edges of forks and info."""

import json
import os
import re
import shutil
from pathlib import Path

import pytest
import torch
from conftest import REPO, TINY, one_line_error

from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.runs.run import Run
from geolens.runs.storage import RunDir, load_tensors
from geolens.training.fork import fork
from geolens.training.replay import convert_storage, full_states, state_at
from geolens.training.train import train

SMALL = dict(task="add", p=23, d_model=32, d_head=8, d_mlp=64, frac_train=0.5, eval_every=10, checkpoints="every:50",
             epochs=200, seed=1, data_seed=1)


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """An ln run (p = 23, 200 epochs, checkpoints every 50) keeping the optimizer state every 100 epochs."""
    path = tmp_path_factory.mktemp("keep") / "parent"
    train(make_config("ln", keep="sparse:100", **SMALL), path, progress=False)
    return path


def same(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def optim_steps(path) -> list[int]:
    return sorted(int(f.name[6:13]) for f in (Path(path) / "checkpoints").glob("optim_*.safetensors"))


def test_sparse_policy_keeps_the_optimizer_state_at_the_first_checkpoint_of_every_n_epochs(parent):
    assert optim_steps(parent) == [0, 100, 200]
    assert Run(parent).header["config"]["keep"] == "sparse:100"
    assert full_states(Run(parent)) == [0, 100, 200]
    assert make_config("fb").keep == "sparse:5000"
    with pytest.raises(GeoError, match="unknown storage policy keep='sparse:0'"):
        make_config("fb", keep="sparse:0")


def test_state_at_any_epoch_is_the_trained_state_bit_for_bit(parent, tmp_path):
    """Replayed from epoch 100, the state at 150 is the stored checkpoint's; one stored as a full state is read."""
    run = Run(parent)
    at150 = state_at(run, 150)
    assert at150.source == 100 and same(at150.weights, load_tensors(RunDir(parent).ckpt_path(150)))
    assert state_at(run, 100).source == 100
    with pytest.raises(GeoError, match="epoch 201 is outside the trajectory .* which ends at epoch 200"):
        state_at(run, 201)


def test_a_fork_with_nothing_switched_is_a_replay_of_the_parent(parent, tmp_path):
    """Forked at epoch 130 (no checkpoint, no stored state there), the fork reproduces the parent's later
    checkpoints and metrics bit for bit; it stores only its own epochs and reads the parent's before."""
    fork(parent, 130, tmp_path / "child", progress=False)
    child, par = Run(tmp_path / "child"), Run(parent)
    for step in (150, 200):
        assert same(load_tensors(child.checkpoint_file(step)), load_tensors(par.checkpoint_file(step))), step
    assert sorted(int(f.name[5:12]) for f in (tmp_path / "child" / "checkpoints").glob("step_*")) == [130, 150, 200]
    assert child.steps == [0, 50, 100, 130, 150, 200] and child.checkpoint_file(50) == par.dir.ckpt_path(50)
    assert child.header["fork"]["mapping"]["replayed_from"] == 100 and child.config.preset == "ln"
    drop = lambda rows: [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows if r["epoch"] != 130]
    assert drop(child.metrics) == drop(par.metrics)


def test_a_moved_or_changed_parent_is_refused_never_read(parent, tmp_path, geolens):
    copy = tmp_path / "parent"
    shutil.copytree(parent, copy)
    fork(copy, 100, tmp_path / "child", {"epochs": 150}, progress=False)
    bytes50 = (copy / "checkpoints" / "step_0000050.safetensors").read_bytes()
    shutil.copy(copy / "checkpoints" / "step_0000000.safetensors", copy / "checkpoints" / "step_0000050.safetensors")
    with pytest.raises(GeoError, match="checkpoint 50 of .* is not the one its fork .* was made from"):
        Run(tmp_path / "child").model_at(50)
    (copy / "checkpoints" / "step_0000050.safetensors").write_bytes(bytes50)
    assert Run(tmp_path / "child").model_at(50) is not None
    copy.rename(tmp_path / "moved")
    r = geolens("probe", "--run", tmp_path / "child", "--step", "50")
    assert r.returncode == 2 and "is missing (moved or deleted); restore it at that path" in one_line_error(r.stderr)
    r = geolens("info", "--run", tmp_path / "child")
    assert r.returncode == 1 and "damaged" in r.stdout and "is missing" in r.stdout


def test_convert_changes_the_policy_exactly_and_refuses_what_it_cannot_check(parent, tmp_path, geolens):
    run = tmp_path / "run"
    shutil.copytree(parent, run)
    r = geolens("convert", "--run", run, "--keep", "all", "--quiet")
    assert r.returncode == 0, r.stderr
    assert optim_steps(run) == [0, 50, 100, 150, 200] and Run(run).config.keep == "all"
    all_run = tmp_path / "all"  # what training under keep=all writes
    train(make_config("ln", keep="all", **SMALL), all_run, progress=False)
    for step in (50, 150):
        assert same(load_tensors(RunDir(run).optim_path(step)), load_tensors(RunDir(all_run).optim_path(step)))
    r = geolens("convert", "--run", all_run, "--keep", "sparse:5000", "--quiet")
    assert r.returncode == 0 and "removed 4" in r.stdout
    assert optim_steps(all_run) == [0]  # the final state is in resume.safetensors
    state = load_tensors(RunDir(run).optim_path(150))  # a stored state that training did not produce
    key = next(k for k in state if k.endswith("exp_avg"))
    state[key] = state[key] + 1
    from geolens.runs.storage import save_tensors
    save_tensors(RunDir(run).optim_path(150), state)
    r = geolens("convert", "--run", run, "--keep", "sparse:100", "--quiet")
    assert "did not reproduce its optimizer state at epoch 150" in one_line_error(r.stderr)
    assert optim_steps(run) == [0, 50, 100, 150, 200]  # nothing changed


def test_replay_is_refused_on_another_float_order(parent, tmp_path, geolens):
    copy = tmp_path / "parent"
    shutil.copytree(parent, copy)
    header = json.loads((copy / "run.json").read_text())
    header["segments"][0]["machine"]["cpu_capability"] = "NEON"
    (copy / "run.json").write_text(json.dumps(header))
    r = geolens("fork", "--run", copy, "--step", "130", "--out", tmp_path / "f", "--quiet")
    line = one_line_error(r.stderr)
    assert "needs its float order" in line and "cpu_capability NEON" in line and "(0, 100, 200)" in line
    assert not (tmp_path / "f").exists()
    r = geolens("fork", "--run", copy, "--step", "100", "--out", tmp_path / "g", "--quiet")  # a stored state
    assert r.returncode == 0, r.stderr


# ---- rough edges ------------------------------------------------------------------------------
def test_fork_refusals_name_the_step_and_the_options_fork_has(parent, tmp_path, geolens):
    r = geolens("fork", "--run", parent, "--step", "3000", "--out", tmp_path / "f")
    line = one_line_error(r.stderr)
    assert "--step 3000 is outside the trajectory" in line and "ends at epoch 200" in line and "--epochs" not in line
    (tmp_path / "busy").mkdir()
    (tmp_path / "busy" / "run.json").write_text("{}")
    r = geolens("fork", "--run", parent, "--step", "100", "--out", tmp_path / "busy")
    line = one_line_error(r.stderr)
    assert "--force" in line and "use --resume" not in line


def test_a_forked_runs_preset_says_what_it_became(parent, tmp_path):
    fork(parent, 100, tmp_path / "f", {"norm": "sphere", "unembed": "bounded", "epochs": 150}, progress=False)
    assert Run(tmp_path / "f").config.preset == "ln>@100:norm=sphere,unembed=bounded"
    assert Run(tmp_path / "f").config_at(50).preset == "ln"


def test_info_of_a_killed_run_does_not_say_running(parent, tmp_path, geolens):
    copy = tmp_path / "killed"
    shutil.copytree(parent, copy)
    header = json.loads((copy / "run.json").read_text())
    (copy / "run.json").write_text(json.dumps({**header, "status": "running"}))
    dead = 2 ** 22 + 12345  # above the default pid_max: no such process
    (copy / ".geolens.lock").write_text(json.dumps({"pid": dead, "host": os.uname().nodename, "purpose": "train"}))
    r = geolens("info", "--run", copy)
    assert "stopped at epoch 200 (no process is training it" in " ".join(r.stdout.split())
    assert "│ running" not in r.stdout


def test_info_checkpoints_lists_every_epoch_with_its_accuracy(parent, geolens):
    r = geolens("info", "--run", parent, "--checkpoints")
    assert r.returncode == 0, r.stderr
    rows = {int(m[0]): m for m in re.findall(r"│\s+(\d+)\s+│\s+([\d.]+)\s+│\s+([\d.]+)\s+│\s+([^│]+?)\s*│", r.stdout)}
    assert sorted(rows) == [0, 50, 100, 150, 200]
    acc = {m["step"]: m["test_acc"] for m in Run(parent).manifest}
    assert all(abs(float(rows[s][2]) - acc[s]) < 1e-4 for s in rows)
    assert rows[150][3] == "replayed from epoch 100" and rows[100][3] == "stored"


# ---- one rule for --step: the README's commands, as written, on a default-trained small run -------------
def readme_commands() -> list[list[str]]:
    """The README's Commands block: each line's arguments (comments dropped)."""
    text = (REPO / "README.md").read_text()
    block = text.split("## Commands", 1)[1].split("```", 2)[1]
    return [line.split("#", 1)[0].split() for line in block.strip().splitlines()]


SINGLE_RUN = ("runs/fb_seed3", "runs/ln_seed1")  # the run the README trains, and the run its fork line names


def test_the_readmes_step_commands_work_on_a_default_trained_run(tmp_path, geolens, monkeypatch):
    """train (small p and model, default schedule and policy, epochs past the README's largest step), then every
    README line that reads that run (info, probe, fork, llc-calibrate, barrier), each as written but for where the
    run is and its size: every --step divided by 10 (3000 -> 300, the run trains 310 epochs), llc-calibrate with
    one short SGLD setting. Steps without a checkpoint are used as their nearest, said in one line; the fork
    starts at exactly its step."""
    monkeypatch.chdir(tmp_path)
    lines = readme_commands()
    train_line = next(c for c in lines if c[1] == "train" and "runs/fb_seed3" in c)
    args = list(train_line[1:])
    args[args.index("113")] = "23"  # --p 113 -> --p 23 with the tiny model
    r = geolens(*args, *TINY[2:], "--epochs", "310", "--quiet")
    assert r.returncode == 0, r.stderr
    runs = [c for c in lines if c[1] in ("info", "probe", "fork", "llc-calibrate", "barrier")
            and any(p in c for p in SINGLE_RUN) and "--metrics" not in c]
    assert {c[1] for c in runs} == {"info", "probe", "fork", "llc-calibrate", "barrier"}
    for command in runs:
        args = ["runs/fb_seed3" if a in SINGLE_RUN else a for a in command[1:]]
        args = [str(int(a) // 10) if i and args[i - 1] == "--step" else a for i, a in enumerate(args)]
        extra = {"llc-calibrate": ["--draws", "5", "--lr", "1e-6", "--n-beta", "10"], "fork": ["--quiet"]}.get(args[0], [])
        r = geolens(*args, *extra)
        assert r.returncode == 0, (command, r.stderr)
        if args[0] in ("probe", "barrier", "llc-calibrate"):
            assert all(line.startswith("note: ") for line in r.stderr.splitlines() if line.strip()), r.stderr
    fork_line = next(c for c in runs if c[1] == "fork")
    out = fork_line[fork_line.index("--out") + 1]
    assert Run(out).header["fork"]["step"] == 300 and 300 in Run(out).steps


def test_run_format_embeds_the_measured_sizes():
    import importlib.util

    spec = importlib.util.spec_from_file_location("embed", REPO / "analyses" / "reproduction" / "embed_tables.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    text = (REPO / "docs" / "run-format.md").read_text()
    refreshed, count = embed.embed(text)
    assert count == 2 and refreshed == text  # rerun analyses/reproduction/embed_tables.py docs/run-format.md


def test_analysis_commands_name_the_checkpoint_they_use_or_replay_exactly(parent, tmp_path, geolens):
    r = geolens("probe", "--run", parent, "--step", "130")
    assert r.returncode == 0, r.stderr
    assert "has no checkpoint at epoch 130; using the nearest, epoch 150" in " ".join(r.stderr.split())
    r = geolens("probe", "--run", parent, "--step", "130", "--exact")
    assert r.returncode == 0 and "no checkpoint" not in r.stderr and "epoch 130" in r.stdout
    from geolens.training.replay import model_at_epoch
    exact = model_at_epoch(Run(parent), 130).state_dict()
    assert same(exact, state_at(Run(parent), 130).weights) and not same(exact, load_tensors(RunDir(parent).ckpt_path(150)))
    r = geolens("export", "--run", parent, "--out", tmp_path / "ship", "--steps", "60")
    assert r.returncode == 0 and "using the nearest, epoch 50" in " ".join(r.stderr.split())
    assert Run(tmp_path / "ship").steps == [0, 50, 200]
