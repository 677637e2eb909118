"""Batched training: each member equals its single run, member dirs are ordinary (loadable, resumable) runs."""

import pytest
import torch

from geolens.cli import app
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.runs import events
from geolens.runs.run import load_run
from geolens.runs.storage import load_tensors
from geolens.training import train as training
from geolens.training.batched import check_members, train_batched

TINY = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5, lr=1e-3, epochs=30, eval_every=5,
            checkpoints="every:10")
METRIC_KEYS = ("epoch", "train_loss", "train_acc", "test_loss", "test_acc", "weight_norm", "grad_norm", "max_abs_logit")


def _final_state(path):
    run = load_run(path)
    return run.model_at(run.steps[-1]).state_dict(), run


def _assert_same_run(batched_dir, single_dir, atol):
    wb, rb = _final_state(batched_dir)
    ws, rs = _final_state(single_dir)
    for k in ws:
        torch.testing.assert_close(wb[k], ws[k], rtol=0, atol=atol, msg=k)
    assert rb.steps == rs.steps
    assert len(rb.metrics) == len(rs.metrics)
    for a, b in zip(rb.metrics, rs.metrics):
        for k in METRIC_KEYS:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), (a["epoch"], k)
    assert {k: v for k, v in rb.events.items()} == {k: v for k, v in rs.events.items()}


@pytest.mark.parametrize("preset,engine", [("ln", "auto"), ("fb", "auto"), ("ln", "hooked"), ("fb+uniform", "hooked")])
def test_member_equals_its_single_run(tmp_path, preset, engine):
    # engine auto: fast_logits per member; hooked: the hooked forward vmapped over the members
    cfgs = [make_config(preset, seed=s, data_seed=s, engine=engine, **TINY) for s in (1, 2, 3)]
    results = train_batched(cfgs, [tmp_path / f"b{i}" for i in range(3)], progress=False)
    assert [r.path for r in results] == [tmp_path / f"b{i}" for i in range(3)]
    assert {r.engine for r in results} == {"batched-fast" if engine == "auto" else "batched-hooked"}
    training.train(cfgs[1], tmp_path / "single", progress=False)
    _assert_same_run(tmp_path / "b1", tmp_path / "single", atol=2e-6)
    # members are distinct (own init and split), so this is not a trivial match
    w0, _ = _final_state(tmp_path / "b0")
    w1, _ = _final_state(tmp_path / "b1")
    assert not torch.allclose(w0["embed.W_E"], w1["embed.W_E"])
    assert load_run(tmp_path / "b0").dataset.train[1].tolist() != load_run(tmp_path / "b1").dataset.train[1].tolist()


def test_members_with_their_own_hyperparameters_match(tmp_path):
    base = make_config("ln", **TINY)
    cfgs = [base.replace(seed=4, data_seed=9), base.replace(seed=5, data_seed=5, lr=3e-3, weight_decay=0.1, beta2=0.98),
            base.replace(seed=6, data_seed=6, lr=5e-4, weight_decay=0.0, beta1=0.8)]
    train_batched(cfgs, [tmp_path / f"b{i}" for i in range(3)], progress=False)
    for i, cfg in enumerate(cfgs):
        training.train(cfg, tmp_path / f"s{i}", progress=False)
        _assert_same_run(tmp_path / f"b{i}", tmp_path / f"s{i}", atol=2e-6)
        assert load_run(tmp_path / f"b{i}").config == cfg
    # the hooked engine agrees to float tolerance too
    training.train(cfgs[1].replace(engine="hooked"), tmp_path / "hooked", progress=False)
    _assert_same_run(tmp_path / "b1", tmp_path / "hooked", atol=1e-4)


def test_members_keep_the_single_run_optimizer_state(tmp_path):
    """A member's resume state holds torch AdamW's state (the single run's keys and values)."""
    cfgs = [make_config("ln", seed=s, data_seed=s, **{**TINY, "epochs": 10}) for s in (1, 2)]
    train_batched(cfgs, [tmp_path / "b1", tmp_path / "b2"], progress=False)
    training.train(cfgs[1], tmp_path / "single", progress=False)
    ours, theirs = load_tensors(tmp_path / "b2" / "resume.safetensors"), load_tensors(tmp_path / "single" / "resume.safetensors")
    assert ours.keys() == theirs.keys() and any(k.endswith(".exp_avg_sq") for k in ours)
    for k in theirs:
        torch.testing.assert_close(ours[k], theirs[k], rtol=1e-5, atol=1e-7, msg=k)


def test_member_dirs_load_and_resume(tmp_path):
    cfgs = [make_config("fb", seed=s, data_seed=s, **{**TINY, "epochs": 20}) for s in (1, 2)]
    train_batched(cfgs, [tmp_path / "m1", tmp_path / "m2"], progress=False)
    run = load_run(tmp_path / "m2")
    assert run.config == cfgs[1] and run.header["status"] == "finished" and run.header["engine"] == "batched-fast"
    assert run.steps == [0, 10, 20] and [r["epoch"] for r in run.metrics] == [0, 5, 10, 15, 20]
    training.resume(tmp_path / "m2", progress=False, epochs=40)
    training.train(cfgs[1].replace(epochs=40), tmp_path / "single", progress=False)
    _assert_same_run(tmp_path / "m2", tmp_path / "single", atol=2e-6)
    assert load_run(tmp_path / "m2").events["final_epoch"] == 40


def test_early_stop_is_per_member(tmp_path, monkeypatch):
    # with the "sustained" threshold at 0 every member is sustained from epoch 0, so each stops
    # after its own early_stop_after while the batch runs on for the others
    monkeypatch.setattr(events, "SUSTAINED_ACC", 0.0)
    base = make_config("ln", **{**TINY, "lr": 3e-3, "epochs": 40})
    cfgs = [base.replace(seed=s, data_seed=s, early_stop_after=n) for s, n in ((1, 10), (2, 25), (3, None))]
    results = train_batched(cfgs, [tmp_path / f"m{c.seed}" for c in cfgs], progress=False)
    assert [(r.events["final_epoch"], r.events["stop_reason"]) for r in results] == [
        (10, "early_stop"), (25, "early_stop"), (40, "completed")]
    for cfg, res in zip(cfgs, results):
        training.train(cfg, tmp_path / f"single_{cfg.seed}", progress=False)
        _assert_same_run(res.path, tmp_path / f"single_{cfg.seed}", atol=2e-6)


def test_finished_members_leave_the_stack_and_the_others_do_not_change(tmp_path, monkeypatch, assert_identical_runs):
    # members stop at 10 and 25: the stack trains 3 models, then 2, then the last member with one
    # finished model as passenger; each member's run is bit for bit the one it gets stacked throughout
    # with a copy of itself (min_stack=2), so leaving the stack changes nobody's numbers
    from geolens.training import batched

    monkeypatch.setattr(events, "SUSTAINED_ACC", 0.0)
    base = make_config("fb", **{**TINY, "lr": 3e-3, "epochs": 40})
    cfgs = [base.replace(seed=s, data_seed=s, early_stop_after=n) for s, n in ((1, 10), (2, 25), (3, None))]
    sizes = []
    real = batched.StackedForward.__call__
    monkeypatch.setattr(batched.StackedForward, "__call__", lambda self, tokens: sizes.append(len(tokens)) or real(self, tokens))
    train_batched(cfgs, [tmp_path / "stack" / f"m{c.seed}" for c in cfgs], progress=False)
    # one training forward per epoch 0..40 and a test forward at every evaluation (every 5 epochs)
    assert sizes == [3] * (11 + 3) + [2] * (15 + 3) + [2] * (15 + 3), sizes
    for cfg in cfgs:
        train_batched([cfg], [tmp_path / "alone" / f"m{cfg.seed}"], progress=False, min_stack=2)
        assert_identical_runs(tmp_path / "stack" / f"m{cfg.seed}", tmp_path / "alone" / f"m{cfg.seed}")


@pytest.mark.parametrize("field,value", [("d_mlp", 32), ("norm", "rmsnorm"), ("p", 29), ("epochs", 10),
                                         ("attention", "uniform")])
def test_mixed_shapes_are_refused_naming_the_field(tmp_path, field, value):
    a = make_config("ln", **TINY)
    b = a.replace(**{field: value})
    with pytest.raises(GeoError, match=f"'{field}'"):
        check_members([a, b])
    with pytest.raises(GeoError, match=f"'{field}'"):
        train_batched([a, b], [tmp_path / "x", tmp_path / "y"], progress=False)
    assert not (tmp_path / "x").exists()


def test_sweep_cli_writes_member_runs_skips_finished_and_refuses_changed(tmp_path, capsys):
    args = ["sweep", "--preset", "ln", "--p", "23", "--seeds", "2-3,7", "--epochs", "10", "--eval-every", "5",
            "--frac", "0.5", "--set", "d_model=32", "--set", "d_mlp=64", "--set", "d_head=8", "--quiet",
            "--out", str(tmp_path / "sw")]
    app(args, standalone_mode=False)
    for s in (2, 3, 7):
        run = load_run(tmp_path / "sw" / f"seed_{s}")
        assert run.config.seed == s and run.config.data_seed == s and run.metrics[-1]["epoch"] == 10
    assert "seed_7" in capsys.readouterr().out
    app(args, standalone_mode=False)  # finished members are skipped
    assert capsys.readouterr().out.count("skipped") == 3
    with pytest.raises(GeoError, match="epochs = 10 but the sweep asks for 5"):  # a budget is only ever raised
        app([a if a != "10" else "5" for a in args], standalone_mode=False)
    with pytest.raises(GeoError, match="--seeds"):
        app(args[:6] + ["1,1"] + args[7:], standalone_mode=False)

def _killed_at(monkeypatch, epoch):
    """train_batched/resume_batched raise KeyboardInterrupt (as a killed process would stop) at `epoch`."""
    import geolens.training.batched as batched

    real = batched._evaluate

    def dying(forward, models, probes, e, *args):
        if e == epoch:
            raise KeyboardInterrupt
        return real(forward, models, probes, e, *args)

    monkeypatch.setattr(batched, "_evaluate", dying)
    return lambda: monkeypatch.setattr(batched, "_evaluate", real)


def test_batched_resume_equals_the_uninterrupted_batch_bit_for_bit(tmp_path, monkeypatch, assert_identical_runs):
    from geolens.training.batched import resume_batched

    cfgs = [make_config("ln", seed=s, data_seed=s, **{**TINY, "epochs": 50, "checkpoints": "every:20"}) for s in (1, 2, 3)]
    train_batched(cfgs, [tmp_path / "full" / f"m{i}" for i in range(3)], progress=False)
    restore = _killed_at(monkeypatch, 35)  # between the checkpoints at 20 and 40
    with pytest.raises(KeyboardInterrupt):
        train_batched(cfgs, [tmp_path / "killed" / f"m{i}" for i in range(3)], progress=False)
    restore()
    assert load_run(tmp_path / "killed" / "m1").header["status"] == "running"
    assert int(load_tensors(tmp_path / "killed" / "m1" / "resume.safetensors")["epoch"]) == 20
    seen = []
    resume_batched([tmp_path / "killed" / f"m{i}" for i in range(3)], progress=False,
                   on_eval=lambda epoch, done: seen.append((epoch, sum(done))))
    assert seen[0] == (25, 0) and seen[-1] == (50, 3)  # the resumed epoch itself is not evaluated again
    for i in range(3):
        assert_identical_runs(tmp_path / "full" / f"m{i}", tmp_path / "killed" / f"m{i}")
    with pytest.raises(GeoError, match="already at epoch 50"):
        resume_batched([tmp_path / "killed" / "m0"], progress=False)


def test_a_lone_member_resumes_with_a_copy_as_in_its_stack(tmp_path, monkeypatch, assert_identical_runs):
    # stacked with an unrecorded copy of itself (min_stack=2) a member continues exactly as in its
    # original stack of three; alone it would take the one-member matmul path
    from geolens.training.batched import resume_batched

    cfgs = [make_config("fb", seed=s, data_seed=s, **{**TINY, "epochs": 40, "checkpoints": "every:10"}) for s in (4, 5, 6)]
    train_batched(cfgs, [tmp_path / "full" / f"m{i}" for i in range(3)], progress=False)
    restore = _killed_at(monkeypatch, 25)
    with pytest.raises(KeyboardInterrupt):
        train_batched(cfgs, [tmp_path / "killed" / f"m{i}" for i in range(3)], progress=False)
    restore()
    resume_batched([tmp_path / "killed" / "m1"], progress=False, min_stack=2)
    assert_identical_runs(tmp_path / "full" / "m1", tmp_path / "killed" / "m1")
    assert load_run(tmp_path / "killed" / "m1").header["timing"]["members"] == 2
    with pytest.raises(GeoError, match="one epoch"):  # m1 is at epoch 40 now, m2 still at 20
        resume_batched([tmp_path / "killed" / "m1", tmp_path / "killed" / "m2"], progress=False)
