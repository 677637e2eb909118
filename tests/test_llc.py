"""The local learning coefficient through devinterp: known answers on constructed losses, reproducibility, the
per-component estimate on a GeoTransformer, the calibration sweep and its judgement, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from geolens.analysis.llc import LLCSettings, component_masks, drift_factor, judge, model_llc, sample_llc
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer

BOWL = LLCSettings(lr=1e-4, n_beta=1000.0, localization=1.0, chains=4, draws=1000, batch_size=64, seed=1)


class Bowl(nn.Module):
    """A loss sum_i w_i^power / power with its minimum at w = 0 (power 2: regular, LLC d/2; power 4: degenerate,
    LLC d/4)."""

    def __init__(self, d: int):
        super().__init__()
        self.w = nn.Parameter(torch.zeros(d))


def _loss(power: int):
    def loss_fn(model, input_ids):
        return ((model.w ** power).sum() / power).expand(input_ids.shape[0], input_ids.shape[1] - 1)
    return loss_fn


def test_a_regular_minimum_has_llc_d_over_2_and_a_degenerate_one_less():
    rows = torch.zeros(64, 2, dtype=torch.long)
    regular = sample_llc(Bowl(4), rows, _loss(2), BOWL)
    error = 3 * regular["llc_std"] / math.sqrt(BOWL.chains)
    assert abs(regular["llc"] - 2.0) < error, regular  # d / 2 = 2 within the chains' error
    quartic = sample_llc(Bowl(4), rows, _loss(4), BOWL)
    assert quartic["llc"] + 3 * quartic["llc_std"] / math.sqrt(BOWL.chains) < regular["llc"] - error, quartic
    assert sample_llc(Bowl(4), rows, _loss(2), BOWL) == regular  # the seeds: the same estimate bit for bit


def test_the_drift_factor_says_where_sgld_diverges():
    """On the regular bowl (Hessian = identity, sharpness 1) devinterp's chains stay near the minimum at a drift
    factor of 0.5 and 1.8 and blow up at 2.2 (past the bound 2 of the step's drift along the sharpest direction)."""
    rows = torch.zeros(64, 2, dtype=torch.long)

    def final_loss(drift):
        lr = 2 * drift / (BOWL.n_beta * 1.0 + BOWL.localization)
        settings = LLCSettings(**{**BOWL.__dict__, "lr": lr, "chains": 1, "draws": 100})
        assert drift_factor(settings.lr, settings.n_beta, settings.localization, 1.0) == pytest.approx(drift)
        return sample_llc(Bowl(4), rows, _loss(2), settings)["trace"][0][-1]

    assert final_loss(0.5) < 0.1 and final_loss(1.8) < 0.1  # below the bound: oscillating at 1.8, but bounded
    last = final_loss(2.2)
    assert not math.isfinite(last) or last > 1e6


def test_a_component_estimate_samples_only_its_parameters():
    cfg = make_config("fb", p=11, d_model=16, n_heads=2, d_head=8, d_mlp=32, frac_train=0.5)
    model = GeoTransformer(cfg)
    assert sorted(component_masks(model, "mlp")) == ["blocks.0.mlp.W_in", "blocks.0.mlp.W_out", "blocks.0.mlp.b_in",
                                                     "blocks.0.mlp.b_out"]
    x, y = make_dataset(cfg).train
    before = {n: p.clone() for n, p in model.named_parameters()}
    settings = LLCSettings(lr=1e-6, n_beta=10.0, chains=2, draws=20, batch_size=32)
    whole, mlp = model_llc(model, x, y, settings), model_llc(model, x, y, settings, "mlp")
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the checkpoint is left as it was
    assert whole["init_loss"] == pytest.approx(mlp["init_loss"]) and len(whole["trace"]) == 2
    assert len(whole["trace"][0]) == 20 and whole["llc"] != mlp["llc"]


def test_the_judgement_of_a_calibration_setting():
    flat = {"llc": 2.0, "llc_std": 0.1, "init_loss": 0.04, "trace": [[0.04, 0.05, 0.06, 0.06, 0.06, 0.06, 0.06, 0.06]] * 2}
    assert judge(flat, chance=math.log(113)) == (True, "stable")
    rising = {**flat, "trace": [[0.04 + 0.01 * i for i in range(8)]] * 2}
    assert judge(rising, chance=math.log(113))[1].startswith("the trace still rises")
    chance = {**flat, "trace": [[4.0] * 8] * 2}
    assert judge(chance, chance=math.log(113))[1].startswith("the chains climb towards chance loss")
    assert judge({**flat, "llc": -1.0}, chance=4.7)[1].startswith("the estimate is not positive")
    assert judge({**flat, "llc_std": 1.0}, chance=4.7)[1].startswith("the chains disagree")
    blown = {"llc": 7e10, "llc_std": 1e10, "init_loss": 0.05, "trace": [[0.05, float("nan")] * 4] * 2}
    assert judge(blown, chance=4.7)[1].startswith("the chains diverged")  # NaN compares False with every bound
    assert judge({**flat, "llc": float("nan")}, chance=4.7)[1].startswith("the chains diverged")


def test_the_preconditioned_sampler_is_devinterps_rmsprop_sgld():
    """sampler='rmsprop_sgld' runs devinterp's RMSprop-SGLD: another chain than plain SGLD from the same seeds,
    still near the bowl's minimum, reproducible; the cache key names it only when it is not the default."""
    rows = torch.zeros(64, 2, dtype=torch.long)
    settings = LLCSettings(**{**BOWL.__dict__, "chains": 2, "draws": 200, "sampler": "rmsprop_sgld"})
    pre = sample_llc(Bowl(4), rows, _loss(2), settings)
    plain = sample_llc(Bowl(4), rows, _loss(2), LLCSettings(**{**settings.__dict__, "sampler": "sgld"}))
    assert pre["trace"] != plain["trace"] and max(pre["trace"][0]) < 1.0
    assert sample_llc(Bowl(4), rows, _loss(2), settings) == pre
    assert "sampler" not in BOWL.key() and settings.key().endswith("sampler=rmsprop_sgld")
    assert "components" not in BOWL.key() and LLCSettings(components="unembed+mlp").key().endswith("components=unembed+mlp")
    assert LLCSettings(components="unembed+mlp").component_list == ("mlp", "unembed")
    assert LLCSettings(components="none").component_list == () and len(LLCSettings().component_list) == 4
    with pytest.raises(GeoError, match="LLC sampler 'hmc' is not known"):
        LLCSettings(sampler="hmc")


def test_llc_calibrate_writes_its_table_and_refuses_bad_input(tmp_path, geolens):
    from geolens.training import train as training

    cfg = make_config("fb", p=11, d_model=16, n_heads=2, d_head=8, d_mlp=32, frac_train=0.5, epochs=20, eval_every=10,
                      checkpoints="every:10")
    training.train(cfg, tmp_path / "r", progress=False)
    r = geolens("llc-calibrate", "--run", tmp_path / "r", "--step", 20, "--lr", "1e-6", "--n-beta", "10,30",
                "--out", tmp_path / "cal")
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "cal" / "llc_calibration.csv").read_text().splitlines()
    assert rows[0] == "lr,n_beta,drift,llc,llc_std,init_loss,stable" and [row.split(",")[:2] for row in rows[1:]] == [
        ["1e-06", "10.0"], ["1e-06", "30.0"]]
    drifts = [float(row.split(",")[2]) for row in rows[1:]]
    assert 0 < drifts[0] < drifts[1]  # the same step at a larger n_beta drifts further
    text = (tmp_path / "cal" / "llc_calibration.md").read_text()
    assert "| 1e-06 | 30 |" in text and "Sharpness (top Hessian eigenvalue" in text
    r = geolens("llc-calibrate", "--run", tmp_path / "r", "--step", 20, "--lr", "fast")
    assert r.returncode == 2 and "--lr 'fast' is not a number" in r.stderr
    r = geolens("llc-calibrate", "--run", tmp_path / "r", "--step", 20, "--sampler", "hmc")
    assert r.returncode == 2 and "LLC sampler 'hmc' is not known" in r.stderr
    r = geolens("llc-calibrate", "--run", tmp_path / "r", "--step", 25)  # any epoch of the trajectory is taken
    assert r.returncode == 2 and "epoch 25 is outside the trajectory" in r.stderr


def test_analyze_takes_llc_settings_keys_the_cache_by_them_and_keeps_them_in_the_table(tmp_path, geolens):
    """`geolens analyze --metrics llc --llc ...` estimates with those settings (the llc_setting_* columns say so); the
    same settings again come from the cache, other settings are computed afresh; an analysis that does not ask for
    the llc keeps the cached values, whatever their settings; a bad setting is one line, exit 2."""
    import csv

    from geolens.training import train as training

    cfg = make_config("fb", p=11, d_model=16, n_heads=2, d_head=8, d_mlp=32, frac_train=0.5, epochs=20, eval_every=10,
                      checkpoints="every:10")
    training.train(cfg, tmp_path / "r", progress=False)

    def at_20() -> dict[str, float]:  # the tidy table's values at epoch 20
        rows = csv.DictReader((tmp_path / "r" / "analysis" / "metrics.csv").open())
        return {r["name"]: float(r["value"]) for r in rows if r["step"] == "20"}

    def analyze(*extra):
        r = geolens("analyze", "--run", tmp_path / "r", "--steps", "20", "--static", "", "--quiet", *extra)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "1 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "draws=20,lr=1e-6,components=none")
    first = at_20()
    assert (first["llc_setting_draws"], first["llc_setting_lr"]) == (20, 1e-6) and math.isfinite(first["llc"])
    assert first["llc_stable"] in (0.0, 1.0) and not any(name.startswith("llc_mlp") for name in first)  # whole only
    assert "0 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "lr=1e-6,draws=20,components=none")
    assert "1 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "lr=1e-6,draws=20,components=mlp")
    some = at_20()
    assert some["llc"] == first["llc"] and math.isfinite(some["llc_mlp"]) and "llc_attn" not in some
    assert "1 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "lr=1e-6,draws=20")
    first = at_20()
    assert all(math.isfinite(first[f"llc_{c}"]) for c in ("embed", "attn", "mlp", "unembed"))
    analyze("--metrics", "loss")
    assert at_20()["llc"] == first["llc"] and "loss_train" in " ".join(at_20())  # kept, at its settings
    assert "1 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "draws=20")
    assert (at_20()["llc_setting_lr"], at_20()["llc_setting_draws"]) == (LLCSettings().lr, 20)
    for bad, message in (("draws=1.5", "LLC setting draws='1.5' must be a whole number above 0"),
                         ("steps=3", "LLC setting 'steps' is not known"),
                         ("components=mlp+heads", "LLC components 'mlp+heads' names no component 'heads'")):
        r = geolens("analyze", "--run", tmp_path / "r", "--metrics", "llc", "--llc", bad)
        assert r.returncode == 2 and message in r.stderr and len(r.stderr.strip().splitlines()) == 1, r.stderr


def test_cached_llc_values_are_read_across_settings_and_versions_of_the_same_estimates_only():
    """A cached llc value counts as the current definition at other SGLD settings and when an earlier version in
    LLC_SAME_ESTIMATES estimated it (the precursor table and trajectory tables read it); no other version does, and
    other metrics need their very version."""
    from geolens.analysis.registry import llc_version, same_definition

    now = llc_version(LLCSettings())
    assert same_definition("llc", now, now)
    assert same_definition("llc", llc_version(LLCSettings(lr=1e-7, draws=20000)), now)
    assert same_definition("llc", "1:lr=1e-05;n_beta=100.0;localization=10000.0;chains=2;draws=100", now)
    assert not same_definition("llc", "0:lr=1e-05", now) and not same_definition("llc", None, now)
    assert not same_definition("sharpness", "1", "2") and same_definition("sharpness", "2", "2")


def test_burn_in_steps_are_left_out_of_the_estimate_and_the_trace():
    """Chains start at the minimum and climb to their equilibrium: averaged over 100 draws from the start the
    regular bowl's LLC comes out low; after 300 burn-in steps the same 100 draws give d/2 within the chains' error.
    The burn-in is a setting: in the cache key when not 0, parsed, refused below 0."""
    from dataclasses import replace

    rows = torch.zeros(64, 2, dtype=torch.long)
    short = replace(BOWL, draws=100)
    early = sample_llc(Bowl(4), rows, _loss(2), short)
    settled = sample_llc(Bowl(4), rows, _loss(2), replace(short, burnin=300))
    assert [len(t) for t in settled["trace"]] == [100] * BOWL.chains
    error = 3 * settled["llc_std"] / math.sqrt(BOWL.chains)
    assert abs(settled["llc"] - 2.0) < error, settled
    assert early["llc"] + 3 * early["llc_std"] / math.sqrt(BOWL.chains) < 2.0, early  # low beyond its own error
    assert "burnin" not in short.key() and "burnin=300" in replace(short, burnin=300).key()
    assert LLCSettings.parse("burnin=5000,draws=2000") == replace(LLCSettings(), burnin=5000, draws=2000)
    with pytest.raises(GeoError, match="LLC setting burnin='-1' must be a whole number of at least 0"):
        LLCSettings.parse("burnin=-1")


def test_loss_spikes_are_the_records_rows_that_lost_the_training_set_after_fitting_it():
    """A row is inside a loss spike when its training accuracy is below FITTED after an earlier row reached it:
    rows before the first fit (memorising) are none, rows without the accuracy are skipped, order is by epoch."""
    from geolens.analysis.llc import FITTED, loss_spikes

    rows = [{"epoch": 0, "train_acc": 0.01}, {"epoch": 10, "train_acc": 0.5}, {"epoch": 30, "train_acc": 0.6},
            {"epoch": 20, "train_acc": FITTED}, {"epoch": 40}, {"epoch": 50, "train_acc": 1.0},
            {"epoch": 60, "train_acc": 0.2}, {"epoch": 70, "train_acc": 0.999}]
    assert loss_spikes(rows) == {30, 60}
    assert loss_spikes([{"epoch": 5, "train_acc": 1.0}, {"epoch": 9, "train_acc": 0.9}]) == {9}
    assert loss_spikes(rows[:2]) == set()
