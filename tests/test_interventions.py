"""Interventions: forks at a checkpoint (bit-identical without changes, the documented parameter
mapping for switches, lineage, refusals that leave the parent untouched), hyperparameter schedules
and the norm clamp, in the single and the batched loop."""

import hashlib
import json

import pytest
import torch
from conftest import one_line_error

from geolens.analysis.run_analysis import load_run
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.model.hyperschedule import parse_hyper_schedule
from geolens.model.transformer import GeoTransformer
from geolens.runs.storage import RunDir, load_tensors, read_metrics
from geolens.training.batched import train_batched
from geolens.training.controls import Controls, total_norm
from geolens.training.engine import make_optimizer
from geolens.training.fork import fork, prepare_fork
from geolens.training.train import resume, train

SMALL = dict(task="add", p=23, d_model=32, d_head=8, d_mlp=64, frac_train=0.5, eval_every=10, checkpoints="every:50",
             epochs=200, seed=1, data_seed=1, keep="all")  # forks at stored states (replays: test_storage_policy.py)
LN_PARAMS = {"embed_norm.w", "embed_norm.b", "blocks.0.attn_norm.w", "blocks.0.attn_norm.b", "blocks.0.mlp_norm.w",
             "blocks.0.mlp_norm.b"}


@pytest.fixture(scope="module")
def parent(tmp_path_factory):
    """A LayerNorm run (p = 23, 200 epochs, checkpoints every 50)."""
    path = tmp_path_factory.mktemp("fork") / "parent"
    train(make_config("ln", **SMALL), path, progress=False)
    return path


def digest(path) -> dict[str, str]:
    return {f.relative_to(path).as_posix(): hashlib.sha256(f.read_bytes()).hexdigest()
            for f in sorted(path.rglob("*")) if f.is_file() and not f.name.startswith(".")}


def rows_without_time(path) -> list[dict]:
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in read_metrics(RunDir(path).metrics_csv)]


def test_every_checkpoint_keeps_its_optimizer_state(parent):
    run = RunDir(parent)
    final = load_tensors(run.resume_file)
    for step in (0, 50, 100, 150, 200):
        state = load_tensors(run.optim_path(step))
        assert int(state["epoch"]) == step
        assert (len(state) == 1) == (step == 0)  # a fresh AdamW holds nothing before its first step
    last = load_tensors(run.optim_path(200))
    assert all(torch.equal(last[k], final[k]) for k in last if k.startswith("opt."))


def test_plain_fork_equals_the_parent_bit_for_bit(parent, tmp_path):
    before = digest(parent)
    fork(parent, 100, tmp_path / "child", progress=False)
    run, child = RunDir(parent), RunDir(tmp_path / "child")
    for step in (0, 50, 100, 150, 200):
        a, b = load_tensors(load_run(parent).checkpoint_file(step)), load_tensors(load_run(child.path).checkpoint_file(step))
        assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a), step
    assert rows_without_time(parent) == rows_without_time(tmp_path / "child")
    header = child.read_header()
    assert header["status"] == "finished" and header["fork"]["step"] == 100 and header["fork"]["changes"] == {}
    assert header["fork"]["parent"] == str(parent.resolve())
    assert header["fork"]["parent_identity"]["checkpoint_sha256"] == before["checkpoints/step_0000100.safetensors"]
    assert json.loads((tmp_path / "child" / "events.json").read_text()) == json.loads((parent / "events.json").read_text())
    assert digest(parent) == before  # the parent is only read


def test_fork_of_a_fork_and_its_lineage(parent, tmp_path, geolens):
    fork(parent, 100, tmp_path / "a", {"lr": 2e-3}, progress=False)
    r = geolens("fork", "--run", tmp_path / "a", "--step", 150, "--out", tmp_path / "b", "--set", "weight_decay=0.5",
                "--quiet")
    assert r.returncode == 0, r.stderr
    b = load_run(tmp_path / "b")
    assert (b.config.lr, b.config.weight_decay) == (2e-3, 0.5)
    fork_record = b.header["fork"]
    assert fork_record["changes"] == {"weight_decay": {"from": 1.0, "to": 0.5},  # the preset names what it became
                                      "preset": {"from": "ln>@100:lr=0.002", "to": "ln>@100:lr=0.002>@150:weight_decay=0.5"}}
    assert fork_record["parent_fork"]["changes"] == {"lr": {"from": 6e-4, "to": 2e-3},
                                                     "preset": {"from": "ln", "to": "ln>@100:lr=0.002"}}
    assert b.config_at(120).lr == 2e-3 and b.config_at(120).weight_decay == 1.0 and b.config_at(50).lr == 6e-4
    # before the first fork it is the grandparent's trajectory
    assert torch.equal(RunDir(parent).load_checkpoint(50)["embed.W_E"], load_tensors(b.checkpoint_file(50))["embed.W_E"])
    info = geolens("info", "--run", tmp_path / "b")
    assert "at epoch 150 (weight_decay 1.0 -> 0.5)" in info.stdout and "at epoch 100 (lr 0.0006 -> 0.002)" in info.stdout


@pytest.mark.parametrize("args, needle", [
    (["--step", "250"], "--step 250 is outside the trajectory of"),
    (["--step", "100", "--set", "d_mlp=128"], "cannot change 'd_mlp': it changes parameter shapes"),
    (["--step", "100", "--set", "p=29"], "cannot change 'p'"),
    (["--step", "100", "--set", "task=mul"], "cannot change 'task'"),
    (["--step", "100", "--set", "n_heads=2"], "cannot change 'n_heads'"),
    (["--step", "100", "--epochs", "100"], "not after its start 100"),
    (["--step", "100", "--set", "norm=batchnorm"], "norm = 'batchnorm' is not valid"),
    (["--step", "100", "--schedule", "weight_decay=3@20"], "is not NAME=VALUE@START:END"),
])
def test_refusals_are_one_line_and_leave_the_parent_untouched(parent, tmp_path, geolens, args, needle):
    before = digest(parent)
    r = geolens("fork", "--run", parent, "--out", tmp_path / "x", *args, "--quiet")
    assert r.returncode == 2 and needle in one_line_error(r.stderr)
    assert digest(parent) == before and not (tmp_path / "x").exists()


def test_fork_into_the_parent_is_refused(parent, geolens):
    before = digest(parent)
    for out in (parent, parent / "inner"):
        r = geolens("fork", "--run", parent, "--step", 100, "--out", out)
        assert r.returncode == 2 and "the parent is never written" in one_line_error(r.stderr)
    assert digest(parent) == before


def test_a_run_without_optimizer_states_forks_by_replay_from_epoch_0(parent, tmp_path):
    """A run written before geolens kept optimizer states (only the resume state's) forks at any epoch:
    replayed from epoch 0, bit for bit (the fork's state at 100 is the parent's, AdamW moments included)."""
    old = tmp_path / "old"
    old.mkdir()
    for f in parent.rglob("*"):
        if f.is_file() and not f.name.startswith((".", "optim_")):
            (old / f.relative_to(parent)).parent.mkdir(parents=True, exist_ok=True)
            (old / f.relative_to(parent)).write_bytes(f.read_bytes())
    prepare_fork(old, 100, tmp_path / "x")
    assert RunDir(tmp_path / "x").read_header()["fork"]["mapping"]["replayed_from"] == 0
    a, b = load_tensors(RunDir(parent).optim_path(100)), load_tensors(RunDir(tmp_path / "x").optim_path(100))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_norm_switch_mapping(parent, tmp_path):
    """LayerNorm -> sphere drops every norm parameter; sphere -> RMSNorm adds the gains at their initial
    value 1 without AdamW state; RMSNorm -> LayerNorm keeps the gains and adds the biases at 0."""
    fork(parent, 100, tmp_path / "sphere", {"norm": "sphere", "unembed": "bounded", "weight_decay": 0.0}, progress=False)
    rec = RunDir(tmp_path / "sphere").read_header()["fork"]
    assert set(rec["mapping"]["dropped"]) == LN_PARAMS and rec["mapping"]["added"] == []
    parent_100 = RunDir(parent).load_checkpoint(100)
    at_100 = RunDir(tmp_path / "sphere").load_checkpoint(100)
    assert set(at_100) == set(parent_100) - LN_PARAMS and all(torch.equal(at_100[k], parent_100[k]) for k in at_100)
    parent_row = [r for r in read_metrics(RunDir(parent).metrics_csv) if r["epoch"] == 100][0]
    row = [r for r in read_metrics(RunDir(tmp_path / "sphere").metrics_csv) if r["epoch"] == 100][0]
    assert row["max_abs_logit"] <= 10.0 + 1e-4 and row["test_loss"] != parent_row["test_loss"]  # evaluated anew

    prepare_fork(tmp_path / "sphere", 150, tmp_path / "rms", {"norm": "rmsnorm", "epochs": 170})
    rms = RunDir(tmp_path / "rms")
    gains = {k for k in LN_PARAMS if k.endswith(".w")}
    assert set(rms.read_header()["fork"]["mapping"]["added"]) == gains
    at_150 = rms.load_checkpoint(150)
    assert all(torch.equal(at_150[k], torch.ones(32)) for k in gains)
    optim = load_tensors(rms.optim_path(150))
    assert not any(k.startswith(f"opt.{g}.") for k in optim for g in gains) and "opt.embed.W_E.exp_avg" in optim

    fork(tmp_path / "rms", 150, tmp_path / "ln", {"norm": "layernorm"}, progress=False)
    ln = RunDir(tmp_path / "ln")
    assert set(ln.read_header()["fork"]["mapping"]["added"]) == {k for k in LN_PARAMS if k.endswith(".b")}
    assert all(torch.equal(ln.load_checkpoint(150)[k.replace(".w", ".b")], torch.zeros(32)) for k in gains)
    run = load_run(tmp_path / "ln")
    kinds = {s: type(run.model_at(s).embed_norm).__name__ for s in (50, 100, 150, 170)}  # each step its own topology
    assert kinds == {50: "LayerNorm", 100: "SphereNorm", 150: "LayerNorm", 170: "LayerNorm"}


@pytest.mark.parametrize("changes", [{"attention": "uniform"}, {"unembed": "bounded", "tau": 5.0}])
def test_attention_and_readout_switches_keep_every_parameter(parent, tmp_path, changes):
    fork(parent, 150, tmp_path / "arm", changes, progress=False)
    run = load_run(tmp_path / "arm")
    assert run.header["fork"]["mapping"] == {"added": [], "dropped": []}
    assert run.header["status"] == "finished" and getattr(run.model_at(200).cfg, next(iter(changes))) == next(iter(changes.values()))
    parent_row = [r for r in read_metrics(RunDir(parent).metrics_csv) if r["epoch"] == 150][0]
    assert run.metrics[15]["epoch"] == 150 and run.metrics[15]["test_loss"] != parent_row["test_loss"]


def test_schedule_values():
    s = parse_hyper_schedule(["weight_decay=3.0@20:40", "lr=warmup:10", "tau=20@5:6", "lr=1e-2@30:31"])
    assert [s.value("weight_decay", 1.0, e) for e in (19, 20, 39, 40)] == [1.0, 3.0, 3.0, 1.0]
    assert [s.value("lr", 1e-3, e) for e in (0, 4, 9, 30)] == [1e-4, 5e-4, 1e-3, 1e-2]
    assert [s.value("tau", 10.0, e) for e in (4, 5, 6)] == [10.0, 20.0, 10.0]
    for bad, needle in [("weight_decay=1@5:10 ", None), ("momentum=1@0:5", "cannot be scheduled"),
                        ("lr=1@5:5", "is empty"), ("lr=-1@0:5", "must be a finite number > 0"),
                        ("lr=warmup:0", "N >= 1")]:
        if needle is None:
            with pytest.raises(GeoError, match="overlaps"):
                parse_hyper_schedule(["weight_decay=2@0:6", bad])
        else:
            with pytest.raises(GeoError, match=needle):
                parse_hyper_schedule([bad])


def test_controls_set_the_optimizer_and_tau_per_epoch():
    cfg = make_config("fb", **{**SMALL, "schedule": ["lr=warmup:4", "weight_decay=2@3:5", "tau=4@1:2"]})
    model = GeoTransformer(cfg)
    opt = make_optimizer(model)
    c = Controls(cfg, model, opt)
    seen = []
    for e in range(6):
        c.before(e)
        seen.append((opt.param_groups[0]["lr"], opt.param_groups[0]["weight_decay"], model.unembed.tau))
    assert seen == [(1.5e-4, 0.0, 10.0), (3e-4, 0.0, 4.0), (4.5e-4, 0.0, 10.0), (6e-4, 2.0, 10.0), (6e-4, 2.0, 10.0),
                    (6e-4, 0.0, 10.0)]


def test_a_pulse_changes_the_run_only_inside_and_after_its_window(parent, tmp_path):
    train(make_config("ln", **{**SMALL, "schedule": ["weight_decay=20@100:120"]}), tmp_path / "pulse", progress=False)
    train(make_config("ln", **{**SMALL, "schedule": ["weight_decay=20@0:200"]}), tmp_path / "always", progress=False)
    train(make_config("ln", **{**SMALL, "weight_decay": 20.0}), tmp_path / "wd20", progress=False)
    p, q = rows_without_time(parent), rows_without_time(tmp_path / "pulse")
    assert q[:11] == p[:11] and q[11] != p[11]  # the same through epoch 100, the pulse's step moves epoch 110
    assert rows_without_time(tmp_path / "always") == rows_without_time(tmp_path / "wd20")
    assert p[-1]["weight_norm"] > q[-1]["weight_norm"]


def test_a_resumed_scheduled_run_equals_the_uninterrupted_one(tmp_path, assert_identical_runs):
    sched = {"schedule": ["weight_decay=5@60:90", "lr=warmup:30", "tau=6@80:130"]}
    train(make_config("fb", **{**SMALL, **sched}), tmp_path / "whole", progress=False)
    train(make_config("fb", **{**SMALL, **sched, "epochs": 100}), tmp_path / "parts", progress=False)
    resume(tmp_path / "parts", progress=False, epochs=200)
    assert_identical_runs(tmp_path / "whole", tmp_path / "parts")
    train(make_config("fb", **{**SMALL, "schedule": sched["schedule"][:2]}), tmp_path / "no_tau", progress=False)
    a, b = rows_without_time(tmp_path / "whole"), rows_without_time(tmp_path / "no_tau")
    assert a[:8] == b[:8] and a[8]["test_loss"] != b[8]["test_loss"]  # tau 6 from the forward at epoch 80 on
    run = load_run(tmp_path / "whole")
    assert [run.config_at(e).tau for e in (70, 80, 120, 130)] == [10.0, 6.0, 6.0, 10.0]
    assert run.model_at(100).unembed.tau == 6.0


def test_the_clamp_holds_the_weight_norm(parent, tmp_path):
    train(make_config("ln", **{**SMALL, "norm_clamp": 15.0, "weight_decay": 0.0}), tmp_path / "new", progress=False)
    fork(parent, 50, tmp_path / "held", {"norm_clamp": 30.0}, progress=False)
    for path, radius, start in ((tmp_path / "new", 15.0, 0), (tmp_path / "held", 30.0, 50)):
        run = RunDir(path)
        assert all(r["weight_norm"] == pytest.approx(radius, rel=1e-5) for r in read_metrics(run.metrics_csv)
                   if r["epoch"] >= start)
        for step in [e["step"] for e in run.read_manifest() if e["step"] >= start]:
            assert total_norm(list(run.load_checkpoint(step).values())).item() == pytest.approx(radius, rel=1e-5)


def test_batched_members_follow_their_own_schedule(tmp_path):
    base = make_config("ln", **SMALL)
    pulse = base.replace(schedule=["weight_decay=20@0:200"])
    flat = base.replace(weight_decay=20.0)
    train_batched([pulse, base.replace(seed=2)], [tmp_path / "a0", tmp_path / "a1"], progress=False)
    train_batched([flat, base.replace(seed=2)], [tmp_path / "b0", tmp_path / "b1"], progress=False)
    assert rows_without_time(tmp_path / "a0") == rows_without_time(tmp_path / "b0")
    assert rows_without_time(tmp_path / "a1") == rows_without_time(tmp_path / "b1")
    with pytest.raises(GeoError, match="tau"):
        train_batched([base.replace(schedule=["tau=3@0:5"]), base], [tmp_path / "c0", tmp_path / "c1"], progress=False)


# ---- fork sweeps: arms -----------------------------------------------------------------------------
TINY_FLAGS = ["--preset", "ln", "--p", "23", "--frac", "0.5", "--set", "d_model=32", "--set", "d_head=8",
              "--set", "d_mlp=64", "--checkpoints", "every:50", "--eval-every", "10", "--quiet", "--threads", "1"]


@pytest.fixture(scope="module")
def parent_sweep(tmp_path_factory):
    """Two LayerNorm members (seeds 1, 2; 200 epochs, checkpoints every 50), trained by `geolens sweep`."""
    from conftest import geolens_process

    out = tmp_path_factory.mktemp("arms") / "parents"
    proc = geolens_process("sweep", "--seeds", "1-2", "--epochs", "200", *TINY_FLAGS, "--out", out)
    assert proc.wait() == 0, proc.stderr.read()
    return out


def test_fork_sweep_arms(parent_sweep, tmp_path, geolens, assert_identical_runs):
    out = tmp_path / "arms"
    r = geolens("sweep", "--fork-from", parent_sweep, "--steps", "50,100", "--set", "weight_decay=0.3,3", "--out", out,
                "--quiet", "--threads", "1")
    assert r.returncode == 0, r.stderr
    names = sorted(str(p.parent.relative_to(out)) for p in out.rglob("run.json"))
    assert names == [f"seed_{s}/step{k}/weight_decay-{wd}" for s in (1, 2) for k in (100, 50) for wd in ("0.3", "3")]
    for s in (1, 2):
        for k in (50, 100):
            for wd in (0.3, 3.0):
                arm = load_run(out / f"seed_{s}" / f"step{k}" / f"weight_decay-{wd:g}")
                assert arm.config.weight_decay == wd and arm.config.seed == s and arm.header["status"] == "finished"
                assert arm.header["fork"]["step"] == k and arm.header["fork"]["parent"] == str((parent_sweep / f"seed_{s}").resolve())
                assert arm.header["engine"] == "batched-fast" and arm.header["timing"]["members"] >= 2  # stacked
    assert {m["found"] for m in json.loads((out / "sweep.json").read_text())["members"]} == {"fork"}
    again = geolens("sweep", "--fork-from", parent_sweep, "--steps", "50,100", "--set", "weight_decay=0.3,3", "--out",
                    out, "--quiet", "--threads", "1")
    assert again.returncode == 0 and {m["found"] for m in json.loads((out / "sweep.json").read_text())["members"]} == {"done"}
    # an arm without changes continues exactly as its (stacked) parent did
    same = tmp_path / "same"
    r = geolens("sweep", "--fork-from", parent_sweep, "--steps", "100", "--out", same, "--quiet", "--threads", "1")
    assert r.returncode == 0, r.stderr
    for s in (1, 2):
        child = same / f"seed_{s}" / "step100" / "same"
        header = json.loads((child / "run.json").read_text())
        assert header.pop("fork")["changes"] == {}
        (tmp_path / "plain").mkdir(exist_ok=True)
        plain = tmp_path / "plain" / f"seed_{s}"
        import shutil

        shutil.copytree(child, plain)
        (plain / "run.json").write_text(json.dumps(header))
        parent_dir = parent_sweep / f"seed_{s}"  # the fork stores its own epochs; the parent's before 100 are read
        for f in (parent_dir / "checkpoints").glob("*.safetensors"):
            if int(f.name[-19:-12]) < 100:
                shutil.copy(f, plain / "checkpoints" / f.name)
        if not (parent_dir / "checkpoints" / "optim_0000100.safetensors").exists():  # its start is a full state
            (plain / "checkpoints" / "optim_0000100.safetensors").unlink()
        (plain / "checkpoints" / "manifest.json").write_text(json.dumps(load_run(child).manifest, indent=2) + "\n")
        assert_identical_runs(parent_dir, plain)


@pytest.mark.parametrize("args, needle", [
    (["--steps", "50", "--preset", "fb"], "drop --preset "),
    (["--steps", "9999"], "--step 9999 is outside the trajectory of"),
    (["--steps", "50", "--set", "d_mlp=32"], "cannot change 'd_mlp'"),
    (["--steps", "50", "--set", "lr=1e-3,1e-3"], "names 0.001 twice"),
    (["--steps", "200"], "not after its start 200"),
    (["--steps", "50", "--seeds", "7"], "selects none of the runs"),
    (["--steps", "50", "--grid", "g.toml"], "--grid and --fork-from do not combine"),
    (["--steps", "50", "--lr", "1e-3"], "drop --lr"),
])
def test_fork_sweep_refusals(parent_sweep, tmp_path, geolens, args, needle):
    before = digest(parent_sweep)
    r = geolens("sweep", "--fork-from", parent_sweep, *args, "--out", tmp_path / "arms", "--quiet")
    assert r.returncode == 2 and needle in one_line_error(r.stderr)
    assert digest(parent_sweep) == before and not (tmp_path / "arms").exists()


def test_a_fork_sweep_into_its_parents_folder_is_refused(parent_sweep, geolens):
    before = digest(parent_sweep)
    r = geolens("sweep", "--fork-from", parent_sweep, "--steps", "50", "--out", parent_sweep / "arms", "--quiet")
    assert r.returncode == 2 and "is inside --fork-from" in one_line_error(r.stderr)
    assert digest(parent_sweep) == before


def test_a_killed_fork_sweep_resumes(parent_sweep, tmp_path, assert_identical_runs):
    """SIGKILL the arm sweep once an arm has trained past its fork step; the rerun finishes every arm as the
    uninterrupted sweep does, bit for bit."""
    import signal
    import time

    from conftest import geolens_process

    args = ["sweep", "--fork-from", parent_sweep, "--steps", "100", "--set", "weight_decay=0.3,3", "--schedule",
            "lr=1e-3@+0:+50", "--epochs", "800", "--quiet", "--threads", "1"]
    assert geolens_process(*args, "--out", tmp_path / "whole").wait() == 0
    out = tmp_path / "killed"
    driver = geolens_process(*args, "--out", out)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and driver.poll() is None:
        states = [f for f in out.rglob("resume.safetensors") if f.exists()]
        try:
            if any(int(load_tensors(f)["epoch"]) >= 300 for f in states):
                break
        except Exception:  # a resume state replaced while read
            pass
        time.sleep(0.05)
    assert driver.poll() is None, "the arm sweep ended before it was killed"
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert any(json.loads(f.read_text())["status"] != "finished" for f in out.rglob("run.json"))
    assert geolens_process(*args, "--out", out).wait() == 0
    for f in (tmp_path / "whole").rglob("run.json"):
        name = f.parent.relative_to(tmp_path / "whole")
        assert name.parts[-1] == "weight_decay-0.3_lr1e-3@+0-+50" or name.parts[-1] == "weight_decay-3_lr1e-3@+0-+50"
        assert_identical_runs(f.parent, out / name)
        assert load_run(f.parent).config.schedule == ["lr=1e-3@100:150"]


# ---- the dose figure --------------------------------------------------------------------------------
PULSE_SHIFTS = {("wd3", 1000): {1: -500, 2: 300}, ("wd3", 3000): {1: -2000, 2: -1000}, ("wd0.3", 3000): {1: 400, 2: 600}}


def constructed_interventions(root, write_run, step_curve):
    """Records as results/interventions holds them (no checkpoints): LayerNorm parents with onsets 8,000
    (seed 1) and 7,000 (seed 2); weight-decay pulses forked at 1,000 and 3,000 with the shifts of
    PULSE_SHIFTS, whose recorded parent path is gone; a sphere arm forked at 5,000 that never groks
    (its test accuracy peaks at 0.5) and whose parent path exists."""
    for seed, onset in {1: 8000, 2: 7000}.items():
        cfg = make_config("ln", seed=seed, data_seed=seed, epochs=12000)
        write_run(root / "parents" / "ln" / f"seed_{seed}", cfg, step_curve(onset, 12000, every=100))
        sha = cfg.sha256()
        for (dose, step), by_seed in PULSE_SHIFTS.items():
            wd = 3.0 if dose == "wd3" else 0.3
            entry = f"weight_decay={wd}@{step}:{step + 200}"
            path = root / "pulses" / dose / f"step{step}" / f"seed_{seed}"
            write_run(path, cfg.replace(schedule=[entry]), step_curve(onset + by_seed[seed], 12000, every=100))
            header = json.loads((path / "run.json").read_text())
            header["fork"] = {"parent": f"/gone/runs/interventions/parents/ln/seed_{seed}", "step": step,
                              "parent_identity": {"config_sha256": sha, "checkpoint_sha256": "x"},
                              "changes": {"schedule": {"from": [], "to": [entry]}}, "mapping": {"added": [], "dropped": []},
                              "parent_fork": None}
            (path / "run.json").write_text(json.dumps(header))
    cfg = make_config("ln", seed=1, data_seed=1, epochs=12000)
    never = root / "rescue" / "step5000" / "seed_1"
    write_run(never, cfg.replace(norm="sphere", unembed="bounded", weight_decay=0.0), step_curve(20000, 12000, every=100))
    header = json.loads((never / "run.json").read_text())
    header["fork"] = {"parent": str(root / "parents" / "ln" / "seed_1"), "step": 5000,
                      "parent_identity": {"config_sha256": "not-needed: the recorded path exists", "checkpoint_sha256": "x"},
                      "changes": {"norm": {"from": "layernorm", "to": "sphere"}, "unembed": {"from": "raw", "to": "bounded"},
                                  "weight_decay": {"from": 1.0, "to": 0.0}},
                      "mapping": {"added": [], "dropped": []}, "parent_fork": None}
    (never / "run.json").write_text(json.dumps(header))
    return root


def test_dose_figure_from_constructed_forks(tmp_path, write_run, step_curve, geolens):
    """Every arm's shift, each change's median line, a lower bound for the arm without an onset, the parent
    found by config and folder name although its recorded path is gone (as in results/), and the tables
    keep forks out of paper rows."""
    from geolens.outputs.figures import build_figures, dose_points, fig_fork_dose
    from geolens.runs.runset import find_runs, group_runs

    root = constructed_interventions(tmp_path / "interventions", write_run, step_curve)
    shifts = PULSE_SHIFTS
    runs, _ = find_runs(root)
    points, notes = dose_points(runs)
    assert notes == ["fork_dose: 1 arm(s) without an onset within their budget, drawn as lower bounds"]
    (rescued,) = [p for p in points if p.censored]
    assert (rescued.change, rescued.step, rescued.shift) == ("norm sphere, unembed bounded, weight_decay 0", 5000, 4000)
    got = {(p.change, p.step, p.seed): p.shift for p in points if not p.censored}
    assert got == {(f"schedule weight_decay={3.0 if d == 'wd3' else 0.3}@+0:+200", k, s): v
                   for (d, k), by_seed in shifts.items() for s, v in by_seed.items()}
    assert {p.panel for p in points} == {"parent ln lr 0.0006 wd 1, add p=113"}
    spec = fig_fork_dose(points)
    (panel,) = spec.panels
    medians = {t.name: dict(zip(t.x, t.y)) for t in panel.traces if t.mode == "lines+markers"}
    assert medians == {"schedule weight_decay=3.0@+0:+200": {1000: -100, 3000: -1500},
                       "schedule weight_decay=0.3@+0:+200": {3000: 500}}  # none for the censored arm
    assert sum(len(t.x) for t in panel.traces if t.mode == "markers") == 7  # every seed a point
    (bound,) = [t for t in panel.traces if t.marker == "start"]
    assert (list(bound.x), list(bound.y)) == ([5000], [4000]) and "lower bound" in bound.name
    specs, _ = build_figures(root)
    assert "fork_dose" in [s.name for s in specs]
    groups = group_runs(runs)  # forks group apart from their parents and from each other, by step
    assert len(groups) == 5 and sum(1 for g in groups if g.fork) == 4
    assert any("forked from ln at 3000" in g.label for g in groups)
    r = geolens("table", "--runs", root, "--out", tmp_path / "tables")
    assert r.returncode == 0 and r.stdout.count("a fork is no experiment of the paper") == 4


def test_load_run_fork(parent, tmp_path):
    import geolens

    child = geolens.load_run(parent).fork(100, tmp_path / "api", epochs=150, schedule=["weight_decay=4@+0:+20"],
                                          attention="uniform")
    assert isinstance(child, geolens.AnalysisRun) and child.steps[-1] == 150
    assert child.config.schedule == ["weight_decay=4@100:120"] and child.config.attention == "uniform"
    assert child.header["fork"]["changes"]["epochs"] == {"from": 200, "to": 150}


def test_the_hooked_engine_follows_a_tau_schedule(tmp_path):
    """A tau window over the whole run equals tau itself, bit for bit, on the hooked forward too."""
    small = {**SMALL, "engine": "hooked", "epochs": 60}
    train(make_config("fb", **{**small, "schedule": ["tau=6@0:100"]}), tmp_path / "window", progress=False)
    train(make_config("fb", **{**small, "tau": 6.0}), tmp_path / "tau6", progress=False)
    assert RunDir(tmp_path / "window").read_header()["engine"] == "hooked"
    assert rows_without_time(tmp_path / "window") == rows_without_time(tmp_path / "tau6")


def test_a_fork_before_its_parents_fork_step_starts_from_what_held_there(parent, tmp_path):
    """A fork's checkpoints before its own fork step are its parent's: forking there continues that
    topology (LayerNorm at 50 of an LN -> sphere fork at 100), and the changes are counted from it."""
    fork(parent, 100, tmp_path / "sphere", {"norm": "sphere", "unembed": "bounded"}, progress=False)
    prepare_fork(tmp_path / "sphere", 50, tmp_path / "again")
    again = load_run(tmp_path / "again")
    assert again.config.norm == "layernorm" and again.header["fork"]["changes"] == {}
    assert again.header["fork"]["parent_fork"]["step"] == 100
    prepare_fork(tmp_path / "sphere", 50, tmp_path / "rms", {"norm": "rmsnorm"})
    rms = load_run(tmp_path / "rms")
    assert rms.header["fork"]["changes"] == {"norm": {"from": "layernorm", "to": "rmsnorm"},
                                             "preset": {"from": "ln", "to": "ln>@50:norm=rmsnorm"}}
    assert set(rms.header["fork"]["mapping"]["dropped"]) == {k for k in LN_PARAMS if k.endswith(".b")}


def test_a_resumed_scheduled_stack_equals_the_uninterrupted_one(tmp_path, assert_identical_runs):
    """Stacked members with their own lr / weight-decay windows and a common tau window across the resume point."""
    from geolens.training.batched import resume_batched

    base = make_config("fb", **SMALL)
    cfgs = [base.replace(schedule=["weight_decay=4@80:130", "tau=6@90:120"]),
            base.replace(seed=2, data_seed=2, schedule=["lr=3e-3@95:110", "tau=6@90:120"], norm_clamp=25.0)]
    train_batched(cfgs, [tmp_path / "whole" / str(i) for i in range(2)], progress=False)
    train_batched([c.replace(epochs=100) for c in cfgs], [tmp_path / "parts" / str(i) for i in range(2)], progress=False)
    resume_batched([tmp_path / "parts" / str(i) for i in range(2)], progress=False, min_stack=2, epochs=200)
    for i in range(2):
        assert_identical_runs(tmp_path / "whole" / str(i), tmp_path / "parts" / str(i))


def test_a_switched_fork_is_analysed_with_the_topology_of_each_step(parent, tmp_path):
    """Before the switch the analysis reads the parent's LayerNorm model, after it the bounded sphere (tau 2):
    its losses equal those recorded while training at every checkpoint, and probe uses each step's config."""
    fork(parent, 100, tmp_path / "sw", {"norm": "sphere", "unembed": "bounded", "tau": 2.0}, progress=False)
    run = load_run(tmp_path / "sw")
    traj = run.analyze(metrics=["loss"])
    recorded = {r["epoch"]: r["test_loss"] for r in run.metrics}
    for step in run.steps:
        assert traj.values[step]["loss"]["loss_test"] == pytest.approx(recorded[step], rel=1e-4, abs=1e-5), step
    for step, norm in ((50, "layernorm"), (150, "sphere")):
        probe = run.probe(step)
        assert probe.model.cfg.norm == norm and probe.context.cfg.norm == norm


def test_the_interventions_tables(tmp_path, write_run, step_curve):
    """analyses/interventions/summarize.py on constructed records: every cell from the known onsets, and
    docs/interventions.md shows the tables that results/interventions holds."""
    import importlib.util

    from conftest import REPO

    spec = importlib.util.spec_from_file_location("summarize", REPO / "analyses" / "interventions" / "summarize.py")
    summarize = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(summarize)
    from geolens.runs.runset import group_key

    from geolens.analysis.noise_floor import MachineFloor

    # the constructed records name no machine ('?'): a float-order floor of 450 epochs there for the LayerNorm
    # parents; a floor on another machine is never used for them
    floors = {(group_key(make_config("ln")), "?"): MachineFloor(450, 600),
              (group_key(make_config("ln")), "Other CPU (AVX2)"): MachineFloor(10, 10)}
    tables = summarize.summarize(constructed_interventions(tmp_path / "interventions", write_run, step_curve), floors)
    assert list(tables) == ["parents", "pulses", "rescue", "pairs"]
    assert "| ln wd 1 | 1 | 8,000 |" in tables["parents"] and "| ln wd 1 | 2 | 7,000 |" in tables["parents"]
    pulses = tables["pulses"].splitlines()
    # four sign tests in the tables (three rows of pulses, one pooled): Holm over them
    assert pulses[2] == ("| ln | schedule weight_decay=0.3@+0:+200 | 3,000 | 8,400 / 5,400 / +400 (8,000) | "
                         "7,600 / 4,600 / +600 (7,000) | +500 | 2/2 | 0-/2+ (p 0.5, Holm 1) | 1/2 beyond 450 (?) |")
    assert pulses[3] == ("| ln | schedule weight_decay=3.0@+0:+200 | 1,000 | 7,500 / 6,500 / -500 (8,000) | "
                         "7,300 / 6,300 / +300 (7,000) | -100 | 2/2 | 1-/1+ (p 1, Holm 1) | 1/2 beyond 450 (?) |")
    # the pulse of 3 at two steps pooled: seed 1 shifts -500 and -2,000 (mean -1,250), seed 2 +300 and -1,000
    # (mean -350): two negative seeds (binomial 2 of 2: p 0.5); 3 of the 4 seed-step shifts beyond 450
    assert pulses[5] == ("| ln | schedule weight_decay=3.0@+0:+200 | all steps, mean per seed | -1,250 | -350 | -750 | | "
                         "2-/0+ (p 0.5, Holm 1) | 3/4 beyond 450 (?) |")
    assert len(pulses) == 10 and pulses[7] == "Notes:"  # the pulse of 0.3 at one step has no pooled row
    assert pulses[9].startswith("- provenance: 6 of 6 arms were trained after their fork from an uncommitted tree or "
                                "name no commit")  # the constructed records name no commit
    assert tables["rescue"].splitlines()[2] == ("| ln | norm sphere, unembed bounded, weight_decay 0 | 5,000 | none by "
                                                "12,000, peak test acc 0.50 (8,000) | - | 0/1 | - | - |")
    # the two pulses forked at 3,000, seed by seed: 0.3's onsets 8,400 and 7,600 minus 3.0's 6,000 and 6,000
    assert tables["pairs"].splitlines()[2] == (
        "| pulses | ln | schedule weight_decay=0.3@+0:+200 minus schedule weight_decay=3.0@+0:+200 | 3,000 | +2,400 | "
        "+1,600 | +2,000 | 0-/2+ (p 0.5, Holm 1) | 2/2 beyond 450 (?) |")
    assert "against_fresh" not in tables  # no experiment of the constructed records is in FRESH
    # the pulses against the LayerNorm runs from scratch (their parents here, so the differences are the shifts);
    # one-sided exact Mann-Whitney of arms against 8,000 and 7,000: 7,500 and 7,300 beat 7,000 only (U = 2 of 4:
    # p = 4/6), 6,000 and 6,000 beat neither (p = 1/6); Holm over the three: 1/6 x 3 = 0.5
    fresh = summarize.summarize(tmp_path / "interventions", floors, fresh={"pulses": "ln"})["against_fresh"].splitlines()
    assert fresh[3] == ("| pulses | ln: schedule weight_decay=3.0@+0:+200 | ln from scratch | 1,000 | -500 | +300 | -100 | "
                        "1-/1+ (p 1, Holm 1) | 1/2 beyond 450 (?) | 0.667 (1) |")
    assert fresh[4].endswith("| -2,000 | -1,000 | -1,500 | 2-/0+ (p 0.5, Holm 1) | 2/2 beyond 450 (?) | 0.167 (0.5) |")
    # no floor from committed replicates on the arms' machine: said, with the labelled range; none: said
    shifts = [(500, "?"), (-100, "?")]
    assert summarize.beyond_cell(shifts, "k", {("k", "?"): MachineFloor(None, 300)}) == (
        "no floor of committed runs on ?; 1/2 beyond its range with uncommitted runs, 300")
    assert summarize.beyond_cell(shifts, "k", {("k", "AMD"): MachineFloor(50, 50)}) == "no floor measured on ?"
    assert summarize.beyond_cell([(500, "A"), (90, "B")], "k", {("k", "A"): MachineFloor(400, 400),
                                                                ("k", "B"): MachineFloor(100, 100)}) == (
        "1/1 beyond 400 (A); 0/1 beyond 100 (B)")
    embed_spec = importlib.util.spec_from_file_location("embed", REPO / "analyses" / "reproduction" / "embed_tables.py")
    embed = importlib.util.module_from_spec(embed_spec)
    embed_spec.loader.exec_module(embed)
    doc = (REPO / "docs" / "interventions.md").read_text()
    refreshed, count = embed.embed(doc)
    assert count == 10 and refreshed == doc  # the doc's tables are those of results/interventions/tables


def test_a_run_written_before_schedules_existed_can_be_forked_with_one(parent, tmp_path, geolens):
    """An older run.json's config has no schedule or norm_clamp field: the fork fills the defaults, and its
    parent identity hashes the config as GeoConfig gives it (as the dose figure looks parents up)."""
    import hashlib
    import shutil

    from geolens.model.config import HASHED_UNLESS_DEFAULT, NOT_HASHED, GeoConfig

    old = tmp_path / "old"
    shutil.copytree(parent, old)
    header = json.loads((old / "run.json").read_text())
    for key in ("schedule", "norm_clamp"):
        header["config"].pop(key)
    (old / "run.json").write_text(json.dumps(header))
    r = geolens("fork", "--run", old, "--step", 100, "--out", tmp_path / "arm", "--epochs", 120,
                "--schedule", "weight_decay=2@+0:+10", "--quiet")
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "arm" / "run.json").read_text())["fork"]
    full = GeoConfig.from_dict(header["config"]).to_dict()
    for key in (*HASHED_UNLESS_DEFAULT, *NOT_HASHED):  # hashed only off their defaults; the storage policy never
        full.pop(key)
    assert record["parent_identity"]["config_sha256"] == hashlib.sha256(json.dumps(full, sort_keys=True).encode()).hexdigest()
    assert record["changes"]["schedule"] == {"from": [], "to": ["weight_decay=2@100:110"]}
