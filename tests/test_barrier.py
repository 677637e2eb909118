"""`geolens barrier`: losses along the line between two checkpoints, the barrier height, bad input."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from geolens.analysis.barrier import height, loss_barrier
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.runs.run import load_run
from geolens.training import train as training

ROOT = Path(__file__).resolve().parent.parent
SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5, lr=3e-3)


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    path = tmp_path_factory.mktemp("barrier") / "a"
    training.train(make_config("fb", epochs=100, eval_every=10, checkpoints="every:50", seed=1, **SMALL), path,
                   progress=False)
    return load_run(path)


def test_height_is_the_largest_rise_over_the_chord():
    alphas = [0.0, 0.25, 0.5, 0.75, 1.0]
    assert height([1.0, 2.0, 3.5, 2.0, 1.0], alphas) == (2.5, 0.5)  # chord at 1.0 everywhere
    assert height([4.0, 3.0, 2.0, 1.0, 0.0], alphas) == (0.0, 0.0)  # on the chord: no barrier
    assert height([4.0, 2.0, 1.0, 0.5, 0.0], alphas)[0] == 0.0  # below the chord: none either


def test_a_checkpoint_with_itself_has_no_barrier(run):
    m = run.model_at(50)
    b = loss_barrier(m, run.model_at(50), n_alphas=5)
    assert b.barrier_train == b.barrier_test == 0.0
    assert len(set(b.train_loss)) == 1 and len(set(b.test_loss)) == 1


def test_the_line_is_the_models_own_loss_at_the_interpolated_weights(run):
    a, b = run.model_at(0), run.model_at(100)
    line = loss_barrier(a, b, n_alphas=5)
    x, y = make_dataset(a.cfg).train
    mid = run.model_at(0)
    with torch.no_grad():
        for (name, p), q in zip(mid.named_parameters(), b.parameters()):
            p.copy_(0.5 * p + 0.5 * q)
        expected = float(F.cross_entropy(mid(x)[:, -1], y))
    assert line.alphas == [0.0, 0.25, 0.5, 0.75, 1.0]
    assert line.train_loss[2] == pytest.approx(expected, rel=1e-5)
    assert line.train_loss[0] == pytest.approx(run.metrics[0]["train_loss"], rel=1e-5)
    assert line.train_acc[-1] == pytest.approx(run.metrics[-1]["train_acc"])


def test_the_command_writes_the_curve_and_refuses_other_models(run, tmp_path, geolens):
    r = geolens("barrier", "--run", run.path, "--step", 0, "--run", run.path, "--step", 100, "--points", 3,
                "--out", tmp_path / "b")
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "b" / "barrier_0_a_100.json").read_text())
    rows = (tmp_path / "b" / "barrier_0_a_100.csv").read_text().splitlines()
    assert rows[0] == "alpha,train_loss,test_loss,train_acc,test_acc" and len(rows) == 4
    assert [float(v) for v in rows[2].split(",")[:2]] == [record["alphas"][1], record["train_loss"][1]]
    assert (tmp_path / "b" / "barrier_0_a_100.png").stat().st_size > 1000
    other = tmp_path / "other"
    training.train(make_config("ln", epochs=10, eval_every=10, checkpoints="every:10", seed=1, **SMALL), other,
                   progress=False)
    r = geolens("barrier", "--run", run.path, "--step", 0, "--run", other, "--step", 10, "--out", tmp_path / "c")
    assert r.returncode == 2 and "different models or splits (norm: 'sphere' vs 'layernorm'" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and not (tmp_path / "c").exists()
    r = geolens("barrier", "--run", run.path, "--step", 0, "--out", tmp_path / "d")
    assert r.returncode == 2 and "barrier takes two checkpoints" in r.stderr


def test_geolens_figures_draws_each_arms_barrier_to_its_parent(run, tmp_path):
    """An arm sweep's figures: the test-loss barrier of every arm against its parent at their latest shared
    checkpoint, the value loss_barrier gives; an arm with another architecture is left out with a note."""
    import shutil

    from geolens.outputs.figures import build_figures
    from geolens.training.fork import fork

    root = tmp_path / "sweep"
    shutil.copytree(run.path, root / "parent")
    fork(root / "parent", 50, root / "wd3", {"weight_decay": 3.0}, progress=False)
    fork(root / "parent", 50, root / "to_ln", {"norm": "layernorm", "unembed": "raw"}, progress=False)
    specs, notes = build_figures(root)
    spec = {s.name: s for s in specs}["fork_barrier"]
    (line,) = spec.panels[0].traces
    expected = loss_barrier(load_run(root / "parent").model_at(100), load_run(root / "wd3").model_at(100), 11)
    assert (line.name, line.x, line.y) == ("weight_decay 3", [50], [expected.barrier_test])
    assert any("fork_barrier: 1 arm(s) left out" in n and "another architecture" in n for n in notes)

    # analyses/landscape/fork_barriers.py tabulates the same points with both runs' test accuracy there
    spec = importlib.util.spec_from_file_location("fork_barriers", ROOT / "analyses" / "landscape" / "fork_barriers.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)
    table.main([str(root), "--out", str(tmp_path / "table")])
    (row,) = list(csv.DictReader(open(tmp_path / "table" / "fork_barriers.csv")))
    parent, arm = load_run(root / "parent"), load_run(root / "wd3")
    assert (row["change"], row["fork_step"], row["at"]) == ("weight_decay 3", "50", "100")
    assert float(row["barrier_test"]) == pytest.approx(expected.barrier_test)
    assert float(row["parent_test_acc"]) == parent.metrics[-1]["test_acc"] and float(row["arm_test_acc"]) == arm.metrics[-1]["test_acc"]
    md = (tmp_path / "table" / "fork_barriers.md").read_text()
    assert "| weight_decay 3 | 50 | 1 | 100 |" in md and "another architecture" in md


def test_fork_barriers_sets_each_change_against_the_control_within_seeds():
    """Three seeds, each with a control arm and two pulse arms whose barriers lie above it: within each seed the
    control's is the smallest of three (chance 1/3), so the stratified exact test gives (1/3)^3; a pair where a run
    had not generalised is left out of the comparison."""
    spec = importlib.util.spec_from_file_location("fork_barriers", ROOT / "analyses" / "landscape" / "fork_barriers.py")
    table = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(table)

    def row(change, seed, barrier, acc=1.0, parent="ln"):
        return dict(parent=parent, change=change, seed=seed, barrier_test=barrier, parent_test_acc=acc, arm_test_acc=1.0)

    rows = [r for s in (1, 2, 3) for r in (row("control", s, 1.0), row("wd 3", s, 2.0 + s), row("wd 0.3", s, 3.0 + s))]
    rows.append(row("wd 3", 1, 0.1, acc=0.4))  # the parent still on its plateau: not compared
    rows.append(row("wd 0.99", 1, 0.0, parent="sphere"))  # another parent configuration: not compared
    pooled, *each = table.against_control(rows, "control")
    assert pooled.startswith("every change: test barrier median 4.5 (6 arms) against the control's 1 (3)")
    # Holm over the three tests: 3 x 1/27, then max(that, 2 x 0.125), max(that, 1 x 0.125)
    assert pooled.endswith(f"p = {1 / 27:.3g}, Holm {3 / 27:.3g} over the 3 tests here (stratified exact Mann-Whitney, "
                           "one-sided)")
    assert [line.split(":")[0] for line in each] == ["wd 0.3", "wd 3"]
    assert all("p = 0.125, Holm 0.25 over the 3 tests here" in line for line in each)
    assert table.against_control(rows, "none")[0].startswith("no arm of the control 'none'")
