"""Optimizers (geolens.training.optimizers): AdamW, SGD, Muon with AdamW; which parameters each takes,
schedules per parameter group, resume bit for bit in every engine, forks that switch optimizer, bad input."""

from __future__ import annotations

import pytest
import torch

from geolens.model.config import make_config
from geolens.model.transformer import GeoTransformer
from geolens.runs.run import load_run
from geolens.runs.storage import load_tensors
from geolens.training import train as training
from geolens.training.controls import Controls
from geolens.training.fork import fork
from geolens.training.optimizers import Combined, make_optimizer

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5, lr=3e-3)


def test_muon_takes_the_mlp_matrices_and_adamw_the_rest():
    model = GeoTransformer(make_config("ln", optimizer="muon", **SMALL))
    opt = make_optimizer(model)
    assert isinstance(opt, Combined)
    muon, adamw = opt.parts
    names = {id(p): n for n, p in model.named_parameters()}
    assert sorted(names[id(p)] for g in muon.param_groups for p in g["params"]) == ["blocks.0.mlp.W_in", "blocks.0.mlp.W_out"]
    assert isinstance(muon, torch.optim.Muon) and isinstance(adamw, torch.optim.AdamW)
    assert "blocks.0.attn.W_Q" in {names[id(p)] for g in adamw.param_groups for p in g["params"]}  # 3-D: AdamW
    assert [g["lr"] for g in opt.param_groups] == [pytest.approx(0.02 * 2 ** 0.5), pytest.approx(0.02 / 2 ** 0.5), 3e-3]
    assert isinstance(make_optimizer(GeoTransformer(make_config("ln", optimizer="sgd", **SMALL))), torch.optim.SGD)


def test_a_schedule_scales_each_group_as_its_optimizer_defines_it():
    cfg = make_config("ln", optimizer="muon", schedule=["lr=1.5e-3@10:20", "weight_decay=3@10:20"], **SMALL)
    model = GeoTransformer(cfg)
    opt = make_optimizer(model)
    Controls(cfg, model, opt).before(12)
    w_in, w_out, adamw = opt.param_groups
    assert adamw["lr"] == 1.5e-3 and w_in["lr"] == pytest.approx(0.02 * 2 ** 0.5 * 0.5)  # halved, each from its own base
    assert w_out["lr"] == pytest.approx(0.02 / 2 ** 0.5 * 0.5)
    assert adamw["weight_decay"] == 3.0  # Muon's decay per step stays muon_lr * weight_decay on each matrix:
    assert w_in["lr"] * w_in["weight_decay"] == pytest.approx(w_out["lr"] * w_out["weight_decay"]) == 0.01 * 3.0
    Controls(cfg, model, opt).before(25)
    assert (w_in["lr"], w_out["lr"], adamw["lr"]) == (pytest.approx(0.02 * 2 ** 0.5), pytest.approx(0.02 / 2 ** 0.5), 3e-3)


def _tensors(path):
    run = load_run(path)
    return {**run.model_at(run.steps[-1]).state_dict(), **load_tensors(path / "resume.safetensors")}, run.metrics


@pytest.mark.parametrize("optimizer,n_layers", [("muon", 1), ("sgd", 1), ("muon", 2), ("sgd", 2)])
def test_resume_equals_uninterrupted_bit_for_bit(tmp_path, optimizer, n_layers):
    """In the fast (one layer) and the deep engine (two): the optimizer's state is in the resume state."""
    cfg = make_config("ln", optimizer=optimizer, n_layers=n_layers, epochs=40, eval_every=5, checkpoints="every:10",
                      seed=2, **SMALL)
    training.train(cfg, tmp_path / "full", progress=False)
    training.train(cfg.replace(epochs=20), tmp_path / "part", progress=False)
    training.resume(tmp_path / "part", progress=False, epochs=40)
    (a, ma), (b, mb) = _tensors(tmp_path / "full"), _tensors(tmp_path / "part")
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    assert any(k.endswith("mlp.W_in.momentum_buffer") for k in a)
    assert [{k: v for k, v in r.items() if k != "elapsed_s"} for r in ma] == \
        [{k: v for k, v in r.items() if k != "elapsed_s"} for r in mb]


def test_a_fork_that_switches_optimizer_starts_it_fresh(tmp_path):
    cfg = make_config("ln", epochs=20, eval_every=5, checkpoints="every:10", seed=1, **SMALL)
    training.train(cfg, tmp_path / "parent", progress=False)
    fork(tmp_path / "parent", 10, tmp_path / "arm", {"optimizer": "muon"}, progress=False)
    arm = load_run(tmp_path / "arm")
    assert arm.header["fork"]["mapping"]["optimizer"] == {"from": "adamw", "to": "muon", "state": "fresh"}
    at_fork = load_tensors(tmp_path / "arm" / "checkpoints" / "optim_0000010.safetensors")
    assert not any(k.startswith("opt.") for k in at_fork)  # no AdamW moments carried into Muon
    after = load_tensors(tmp_path / "arm" / "resume.safetensors")
    assert "opt.blocks.0.mlp.W_in.momentum_buffer" in after and "opt.blocks.0.mlp.W_in.exp_avg" not in after
    assert "opt.embed.W_E.exp_avg" in after  # the AdamW part of the new optimizer, fresh at the fork


TINY = 1.17549435e-38  # the smallest normal float32


def _subnormals(t: torch.Tensor) -> int:
    return int(((t != 0) & (t.abs() < TINY)).sum())


def test_flush_denormal_turns_muons_decayed_dead_rows_into_zeros(tmp_path):
    """Muon's decoupled weight decay shrinks dead neurons' rows by a factor per step until they reach the smallest
    subnormal, where the product rounds back to itself: without flushing they stay subnormal (slow) for good;
    flush_denormal makes them 0, and leaves the process's default (no flushing) behind."""
    def mlp_after(flush: bool):
        cfg = make_config("ln", optimizer="muon", weight_decay=20.0, epochs=250, eval_every=50, checkpoints="every:250",
                          flush_denormal=flush, **SMALL)
        training.train(cfg, tmp_path / str(flush), progress=False)
        return load_run(tmp_path / str(flush)).model_at(250).blocks[0].mlp.W_in.detach()

    kept, flushed = mlp_after(False), mlp_after(True)
    assert _subnormals(kept) > 0 and _subnormals(flushed) == 0
    assert int((flushed == 0).sum()) >= _subnormals(kept)  # the same dead rows, at 0
    assert _subnormals(torch.tensor([1e-39]) * 1.0) == 1  # restored after training
    assert make_config("ln", flush_denormal=True).sha256() != make_config("ln").sha256()


@pytest.mark.parametrize("caller", [False, True])
def test_denormals_flushed_sets_the_runs_choice_and_restores_the_callers(caller):
    """Inside, subnormals are flushed exactly when the run asks (whatever the caller set); after, the caller's
    setting is back (flushing_denormals reads it: torch has no getter)."""
    from geolens.training.engine import denormals_flushed, flushing_denormals

    torch.set_flush_denormal(caller)
    try:
        assert flushing_denormals() == caller
        for on in (False, True):
            with denormals_flushed(on):
                assert flushing_denormals() == on and _subnormals(torch.tensor([1e-39]) * 1.0) == int(not on)
            assert flushing_denormals() == caller
    finally:
        torch.set_flush_denormal(False)


@pytest.mark.parametrize("args,needle", [
    (["--set", "optimizer=adam"], "optimizer = 'adam' is not valid; choose one of adamw, sgd, muon"),
    (["--set", "optimizer=sgd", "--set", "momentum=1.5"], "momentum = 1.5 must lie in [0, 1)"),
    (["--set", "optimizer=muon", "--set", "muon_lr=0"], "muon_lr = 0.0 must be a finite number > 0"),
])
def test_bad_optimizer_settings_are_one_line(tmp_path, geolens, args, needle):
    r = geolens("train", "--preset", "ln", "--p", "23", "--epochs", "5", *args, "--out", tmp_path / "r")
    assert r.returncode == 2 and needle in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_muons_per_matrix_rate_is_the_reference_sqrt_fan_out_over_fan_in():
    """W_in [d_model, d_mlp] is (in, out): fan_out / fan_in = d_mlp / d_model = 2 here, so x sqrt(2); W_out
    [d_mlp, d_model] is (in, out) with fan_out < fan_in, so x1. torch's 'original' rule reads (out, in) and would
    give the reverse. Checked on the update itself: one step from zero momentum, no weight decay, equal RMS of the
    orthogonalised update for both orientations, so the ratio of update RMS is the ratio of rates."""
    cfg = make_config("ln", optimizer="muon", weight_decay=0.0, **SMALL)  # d_model 32, d_mlp 64
    model = GeoTransformer(cfg)
    opt = make_optimizer(model)
    mlp = model.blocks[0].mlp
    before = mlp.W_in.detach().clone(), mlp.W_out.detach().clone()
    x = torch.randint(0, cfg.p, (64, 3))
    torch.nn.functional.cross_entropy(model(x)[:, -1], torch.randint(0, cfg.p, (64,))).backward()
    opt.step()
    rms = [(w.detach() - b).pow(2).mean().sqrt().item() for w, b in zip((mlp.W_in, mlp.W_out), before)]
    assert rms[0] / rms[1] == pytest.approx(2 ** 0.5, rel=0.15)
    lrs = [g["lr"] for g in opt.parts[0].param_groups]
    assert lrs == [pytest.approx(0.02 * 2 ** 0.5 / 1), pytest.approx(0.02 / 2 ** 0.5)]  # torch then x1 and x sqrt(2)


def test_a_muon_run_from_before_the_rate_fix_is_refused_on_resume(tmp_path):
    import json
    cfg = make_config("ln", optimizer="muon", epochs=20, eval_every=5, checkpoints="every:10", **SMALL)
    training.train(cfg.replace(epochs=10), tmp_path / "run", progress=False)
    header = json.loads((tmp_path / "run" / "run.json").read_text())
    assert header["muon_rate"] == "muon_lr * sqrt(max(1, fan_out / fan_in))"
    del header["muon_rate"]
    (tmp_path / "run" / "run.json").write_text(json.dumps(header))
    with pytest.raises(Exception, match="per-matrix rates swapped"):
        training.resume(tmp_path / "run", progress=False, epochs=20)


def test_a_trimmed_run_forks_into_another_optimizer(tmp_path):
    """A shipped (trimmed) trajectory keeps no optimizer state; a fork that switches the optimizer discards it
    anyway, so it starts from the checkpoint's weights; one that keeps the optimizer replays from epoch 0
    (exact on the machine that trained it: training.replay)."""
    from geolens.runs.export import export_run
    cfg = make_config("ln", epochs=20, eval_every=5, checkpoints="every:10", seed=1, **SMALL)
    training.train(cfg, tmp_path / "parent", progress=False)
    export_run(tmp_path / "parent", tmp_path / "shipped", [0, 10, 20])
    fork(tmp_path / "shipped", 10, tmp_path / "arm", {"optimizer": "sgd"}, progress=False)
    assert load_run(tmp_path / "arm").header["fork"]["mapping"]["optimizer"]["to"] == "sgd"
    assert "replayed_from" not in load_run(tmp_path / "arm").header["fork"]["mapping"]
    fork(tmp_path / "shipped", 10, tmp_path / "arm2", {"weight_decay": 0.5}, progress=False)
    assert load_run(tmp_path / "arm2").header["fork"]["mapping"]["replayed_from"] == 0
