"""The local learning coefficient through devinterp: known answers on constructed losses, reproducibility, the
per-component estimate on a GeoTransformer, the calibration sweep and its judgement, bad input."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from geolens.analysis.llc import STABLE_RHAT, LLCSettings, component_masks, drift_factor, judge, model_llc, sample_llc
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer

BOWL = LLCSettings(lr=1e-4, n_beta=1000.0, localization=1.0, chains=4, draws=1000, batch_size=64, seed=1, burnin=0)


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
    settings = LLCSettings(lr=1e-6, n_beta=10.0, chains=2, draws=20, batch_size=32, burnin=0)
    whole, mlp = model_llc(model, x, y, settings), model_llc(model, x, y, settings, "mlp")
    assert all(torch.equal(p, before[n]) for n, p in model.named_parameters())  # the checkpoint is left as it was
    assert whole["init_loss"] == pytest.approx(mlp["init_loss"]) and len(whole["trace"]) == 2
    assert len(whole["trace"][0]) == 20 and whole["llc"] != mlp["llc"]


def _noisy(levels, draws: int = 400, sd: float = 0.05, seed: int = 0) -> list[list[float]]:
    """Chains [len(levels), draws]: level(draw fraction) plus independent normal noise of sd."""
    import numpy as np

    rng = np.random.default_rng(seed)
    at = np.linspace(0, 1, draws)
    return [(np.asarray([level(a) for a in at]) + sd * rng.standard_normal(draws)).tolist() for level in levels]


def _estimate(trace, init_loss: float = 0.04, n_beta: float = 100.0) -> dict:
    import numpy as np

    per_chain = [n_beta * (float(np.mean(t)) - init_loss) for t in trace]
    return {"llc": float(np.mean(per_chain)), "llc_std": float(np.std(per_chain)), "init_loss": init_loss,
            "trace": trace}


def test_split_rhat_and_bulk_ess_give_their_known_answers():
    """Independent normal draws: R-hat 1 and an ESS of about every draw; an AR(1) chain of coefficient 0.9: an
    ESS of about S (1 - 0.9) / (1 + 0.9); chains at different levels, or one drifting within itself: R-hat well
    above 1."""
    import numpy as np

    from geolens.analysis.convergence import bulk_ess, split_rhat

    rng = np.random.default_rng(0)
    iid = rng.standard_normal((4, 1000))
    assert split_rhat(iid) < 1.01 and 0.9 * 4000 < bulk_ess(iid) < 1.1 * 4000
    ar = np.zeros((4, 4000))
    noise = rng.standard_normal((4, 4000))
    for t in range(1, 4000):
        ar[:, t] = 0.9 * ar[:, t - 1] + noise[:, t]
    expected = 16000 * 0.1 / 1.9
    assert split_rhat(ar) < 1.01 and 0.75 * expected < bulk_ess(ar) < 1.25 * expected
    assert split_rhat(iid + np.array([[0.0], [0.0], [0.0], [1.0]])) > 1.1  # one chain elsewhere
    assert split_rhat(iid + np.linspace(0, 2, 1000)) > 1.1  # every chain drifts alike: its halves disagree


def test_the_judge_reads_the_whole_trace_in_both_directions_and_across_chains():
    """A flat noisy trace passes; one that falls (as LayerNorm's plateau chains did between draws 100 and 500) fails
    as a rising one does; chains that settle at different levels fail; too few effective draws fail; the drift
    factor fails at or above 1 where it is known; and the older rules hold (chance loss, sign, divergence)."""
    chance = math.log(113)
    flat = _estimate(_noisy([lambda a: 0.6] * 2))
    verdict = judge(flat, chance)
    assert verdict.stable and verdict.why == "stable" and verdict.rhat < STABLE_RHAT and verdict.drift is None
    falling = _estimate(_noisy([lambda a: 1.4 - 0.4 * a] * 2))
    rising = _estimate(_noisy([lambda a: 0.5 + 0.4 * a] * 2))
    for trace in (falling, rising):
        assert judge(trace, chance).why.startswith("the chains have not mixed (split-R-hat"), judge(trace, chance)
    apart = _estimate(_noisy([lambda a: 0.6, lambda a: 0.75]))
    assert judge(apart, chance).why.startswith("the chains have not mixed")
    # the shape of LayerNorm's epoch-6,000 chains at lr 1e-7, n_beta 1,000 over 100 draws: the loss jumps from the
    # checkpoint's within a few draws and then scatters widely; the one-direction rule saw no rise and passed it
    jump = _estimate(_noisy([lambda a: 0.05 if a < 0.05 else 1.4] * 2, draws=100, sd=0.6, seed=3), 0.054, 1000.0)
    assert not judge(jump, chance).stable
    short = _estimate(_noisy([lambda a: 0.6] * 2, draws=60))
    assert judge(short, chance).why.startswith("too few effective draws (bulk-ESS")
    assert judge(flat, chance, drift=0.99).stable
    assert judge(flat, chance, drift=1.62).why.startswith("the step overshoots along the sharpest direction")
    assert judge({**flat, "trace": [[4.0] * 8] * 2}, chance).why.startswith("the chains climb towards chance loss")
    assert judge({**flat, "llc": -1.0}, chance).why.startswith("the estimate is not positive")
    blown = {"llc": 7e10, "llc_std": 1e10, "init_loss": 0.05, "trace": [[0.05, float("nan")] * 4] * 2}
    assert judge(blown, chance).why.startswith("the chains diverged")  # NaN compares False with every bound
    assert judge({**flat, "llc": float("nan")}, chance).why.startswith("the chains diverged")


def test_the_drift_factor_bounds_the_bias_of_the_step():
    """On the regular bowl (every direction as sharp as the sharpest) the discretised chain's variance is 2 / (2 - d)
    times the target's: at a drift factor of 1 the estimate is about twice d/2, at 0.05 about d/2."""
    rows = torch.zeros(64, 2, dtype=torch.long)

    def estimate(drift):
        lr = 2 * drift / (BOWL.n_beta * 1.0 + BOWL.localization)
        return sample_llc(Bowl(4), rows, _loss(2), LLCSettings(**{**BOWL.__dict__, "lr": lr}))

    for drift in (0.05, 1.0):
        res = estimate(drift)
        expected = 2.0 * 2 / (2 - drift) * BOWL.n_beta / (BOWL.n_beta + BOWL.localization)
        assert abs(res["llc"] - expected) < 0.1 * expected, (drift, res["llc"], expected)


def test_an_estimate_leaves_no_folder_behind_and_warns_nothing(tmp_path, monkeypatch):
    """devinterp writes its samples to a zarr folder (by default a mkdtemp folder it never removes, with a warning
    when the run is large); sample_llc gives it one inside a TemporaryDirectory and removes it."""
    import tempfile
    import warnings

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    settings = LLCSettings(**{**BOWL.__dict__, "chains": 2, "draws": 100})  # 2 x 100 x 64 draws: devinterp would warn
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        sample_llc(Bowl(4), torch.zeros(64, 2, dtype=torch.long), _loss(2), settings)
    assert list(tmp_path.iterdir()) == [] and [str(w.message) for w in caught] == []


def test_every_training_example_enters_the_sgld_batches():
    """devinterp's batches drop the last partial one; EveryExample repeats the rows so that a pass is a whole number
    of batches: at 10 rows and batch 4 each row is drawn exactly twice in the 5 sampling steps of a pass (the rows
    alone would have left 2 of them out of every step)."""
    from collections import Counter

    from geolens.analysis.llc import EveryExample

    assert len(EveryExample(torch.zeros(3830, 4), 512)) == 980480 and 980480 % 512 == 0
    seen = Counter()

    def loss_fn(model, input_ids):
        if torch.is_grad_enabled():  # the SGLD steps (devinterp computes the checkpoint's loss without gradients)
            seen.update(input_ids[:, 0].tolist())
        return ((model.w ** 2).sum() / 2).expand(input_ids.shape[0], input_ids.shape[1] - 1)

    rows = torch.stack([torch.arange(10), torch.zeros(10, dtype=torch.long)], 1)
    sample_llc(Bowl(4), rows, loss_fn, LLCSettings(**{**BOWL.__dict__, "chains": 1, "draws": 5, "batch_size": 4}))
    assert seen == Counter({i: 2 for i in range(10)})


def test_recommend_picks_one_stable_setting_by_its_rule():
    """Of the stable settings: the n_beta nearest n / ln n, then the smallest drift factor; none stable: none."""
    from geolens.analysis.llc import Calibration, Verdict, recommend, wbic_n_beta

    def row(lr, n_beta, drift, stable=True, ess=500.0):
        return Calibration(lr, n_beta, 10.0, 1.0, 0.04, [[0.1]], Verdict(stable, "stable" if stable else "no", 1.0, ess),
                           drift)

    assert wbic_n_beta(3830) == pytest.approx(3830 / math.log(3830))  # 464
    rows = [row(1e-6, 100, 0.01), row(1e-5, 1000, 0.5), row(1e-6, 1000, 0.05), row(1e-7, 1000, 0.005, stable=False)]
    best, rule = recommend(rows, 3830)
    assert best is rows[2] and "n / ln n = 464" in rule
    assert recommend(rows, 300)[0] is rows[0]  # n / ln n = 53: nearer 100
    best, why = recommend([row(1e-6, 100, 0.01, stable=False)], 3830)
    assert best is None and why.startswith("no setting is stable")


def test_calibrate_judges_the_drift_factor_of_plain_sgld_only(monkeypatch):
    """llc-calibrate's sweep judges each setting with its drift factor where that is the step's (plain SGLD); the
    preconditioned sampler rescales its step per coordinate, so its row shows the factor but is judged without it."""
    import numpy as np

    from geolens.analysis import landscape, llc

    cfg = make_config("fb", p=11, d_model=16, n_heads=2, d_head=8, d_mlp=32, frac_train=0.5)
    x, y = make_dataset(cfg).train
    trace = (0.3 + 0.01 * np.random.default_rng(0).standard_normal((2, 400))).tolist()  # mixed, far from chance
    monkeypatch.setattr(landscape, "sharpness", lambda *a: {"sharpness": 1e4})
    monkeypatch.setattr(llc, "model_llc", lambda *a: {"llc": 26.0, "llc_std": 0.1, "init_loss": 0.04, "trace": trace})
    plain = llc.calibrate(GeoTransformer(cfg), x, y, [1e-5], [100.0], LLCSettings())[0][0]
    pre = llc.calibrate(GeoTransformer(cfg), x, y, [1e-5], [100.0], LLCSettings(sampler="rmsprop_sgld"))[0][0]
    assert plain.drift_factor == pre.drift_factor == pytest.approx(5.05) and plain.verdict.drift == pytest.approx(5.05)
    assert not plain.stable and "overshoots" in plain.verdict.why
    assert pre.stable and pre.verdict.drift is None


def test_the_settings_columns_keep_samplers_and_component_sets_apart(monkeypatch):
    """The sampler and the components are recorded among llc_setting_*; precursors.llc_series reads one series per
    setting (the one most checkpoints share), so estimates by another sampler or component set never join it."""
    from types import SimpleNamespace

    from geolens.analysis import precursors, trajectory

    plain, pre = LLCSettings(lr=1e-7), LLCSettings(lr=1e-7, sampler="rmsprop_sgld")
    assert (plain.numbers()["sampler"], pre.numbers()["sampler"]) == (0.0, 1.0)
    assert [LLCSettings(components=c).numbers()["components"] for c in ("all", "none", "mlp+attn")] == [15.0, 0.0, 6.0]
    values = {e: {"llc": float(e), "llc_stable": 1.0, "llc_rhat": 1.01, **{f"llc_setting_{k}": v for k, v in s.numbers().items()}}
              for e, s in [(10, plain), (20, pre), (30, plain), (40, pre), (50, plain), (60, pre), (70, pre)]}
    monkeypatch.setattr(trajectory, "cached_metrics", lambda r, step, names: {"llc": values[step]})
    run = SimpleNamespace(steps=sorted(values), metrics=[])
    assert precursors.llc_series(run) == {20: 20.0, 40: 40.0, 60: 60.0, 70: 70.0}  # the preconditioned series only
    values[20] = {**values[20], "llc_setting_components": 0.0}
    values[40] = {**values[40], "llc_setting_components": 0.0}
    assert precursors.llc_series(run) == {10: 10.0, 30: 30.0, 50: 50.0}  # 3 plain now outnumber 2 of each other


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
    assert "components" not in BOWL.key() and LLCSettings(components="unembed+mlp", burnin=0).key().endswith("components=unembed+mlp")
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
                "--draws", 40, "--burnin", 10, "--out", tmp_path / "cal")
    assert r.returncode == 0, r.stderr
    rows = (tmp_path / "cal" / "llc_calibration.csv").read_text().splitlines()
    assert rows[0] == "lr,n_beta,drift,llc,llc_std,init_loss,rhat,ess,stable,recommended" and [
        row.split(",")[:2] for row in rows[1:]] == [["1e-06", "10.0"], ["1e-06", "30.0"]]
    drifts = [float(row.split(",")[2]) for row in rows[1:]]
    assert 0 < drifts[0] < drifts[1]  # the same step at a larger n_beta drifts further
    stable, picked = [int(row.split(",")[8]) for row in rows[1:]], [int(row.split(",")[9]) for row in rows[1:]]
    assert sum(picked) == (1 if any(stable) else 0) and all(s for s, p in zip(stable, picked) if p)
    text = (tmp_path / "cal" / "llc_calibration.md").read_text()
    assert "| 1e-06 | 30 |" in text and "Sharpness (top Hessian eigenvalue" in text
    last = text.strip().splitlines()[-1]
    assert last.startswith("Recommended: lr 1e-06, n_beta ") and "n / ln n = " in last if any(stable) else (
        last.startswith("Recommended: none; no setting is stable")), last
    traces = (tmp_path / "cal" / "llc_traces.csv").read_text().splitlines()
    assert traces[0] == "lr,n_beta,chain,draw,loss" and len(traces) == 1 + 2 * LLCSettings().chains * 40  # burn-in left out
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

    assert "1 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "draws=20,lr=1e-6,components=none,burnin=0")
    first = at_20()
    assert (first["llc_setting_draws"], first["llc_setting_lr"]) == (20, 1e-6) and math.isfinite(first["llc"])
    assert first["llc_stable"] in (0.0, 1.0) and not any(name.startswith("llc_mlp") for name in first)  # whole only
    assert first["llc_rhat"] > 0 and first["llc_ess"] > 0 and (first["llc_setting_sampler"], first["llc_setting_components"]) == (0, 0)
    assert "0 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "lr=1e-6,draws=20,components=none,burnin=0")
    assert "1 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "lr=1e-6,draws=20,components=mlp,burnin=0")
    some = at_20()
    assert some["llc"] == first["llc"] and math.isfinite(some["llc_mlp"]) and "llc_attn" not in some
    assert some["llc_mlp_stable"] in (0.0, 1.0) and some["llc_mlp_rhat"] > 0  # each component judged on its own traces
    assert "1 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "lr=1e-6,draws=20,burnin=0")
    first = at_20()
    assert all(math.isfinite(first[f"llc_{c}"]) for c in ("embed", "attn", "mlp", "unembed"))
    analyze("--metrics", "loss")
    assert at_20()["llc"] == first["llc"] and "loss_train" in " ".join(at_20())  # kept, at its settings
    assert "1 metric evaluations computed" in analyze("--metrics", "llc", "--llc", "draws=20,burnin=0")
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


def test_recorded_verdicts_take_the_drift_factor_where_the_row_holds_the_sharpness():
    """A table row with the checkpoint's sharpness beside the llc settings is judged with its drift factor too
    (lr 1e-7, n_beta 1,000: sharpness 31,810 gives 1.59, not usable); a verdict recorded before the judge read the
    whole trace (no llc_rhat, its trace not kept) still fails the checks the record allows (drift factor, a
    non-positive estimate) and is otherwise not judged, the old rule's verdict beside it, and is never usable (nor
    is an estimate without a verdict); the preconditioned sampler's step has no drift factor."""
    from geolens.analysis.llc import recorded_drift, stable_word, usable

    settings = {f"llc_setting_{k}": v for k, v in LLCSettings(lr=1e-7, n_beta=1000.0).numbers().items()}
    new = {"llc": 1485.0, "llc_stable": 1.0, "llc_rhat": 1.01, **settings}
    assert usable(new) and stable_word(new) == "yes" and recorded_drift(new) is None
    sharp = {**new, "sharpness": 31810.0}
    assert recorded_drift(sharp) == pytest.approx(1.591) and not usable(sharp) and stable_word(sharp) == "no: drift 1.59"
    assert usable({**sharp, "sharpness": 230.0}) and stable_word({**sharp, "sharpness": 230.0}) == "yes"
    old = {k: v for k, v in sharp.items() if k not in ("llc_rhat", "llc_setting_sampler", "llc_setting_components")}
    assert stable_word(old) == "no: drift 1.59 (trace not kept)"
    assert stable_word({**old, "sharpness": 230.0}) == "not judged: trace not kept (old rule: yes)"
    assert not usable({**old, "sharpness": 230.0}) and not usable({k: v for k, v in new.items() if k != "llc_rhat"})
    assert not usable({k: v for k, v in new.items() if k != "llc_stable"}) and not usable({"llc": 1.0})
    assert not usable({**new, "llc_stable": 0.0})
    assert stable_word({**old, "sharpness": 230.0, "llc_stable": 0.0}) == "not judged: trace not kept (old rule: no)"
    negative = {**old, "sharpness": 230.0, "llc": -3.0, "llc_stable": 0.0}
    assert stable_word(negative) == "no: not positive (trace not kept)"
    assert recorded_drift({**sharp, "llc_setting_sampler": 1.0}) is None and stable_word({"llc": 1.0}) == "-"
