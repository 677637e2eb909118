"""Statistics behind every claim over seeds, on inputs whose answers are known: the permutation test of
a rank correlation (exact: a brute-force count), the Holm correction, the order-statistic interval of a
median, the sign test, one- and two-sided rank tests; online
threshold rules fitted leave-one-seed-out; the forecast file and `geolens train --forecast`."""

import itertools
import json
import math

import numpy as np
import pytest
from conftest import one_line_error

from geolens.analysis.online_rules import (Series, firing_epochs, fit_rule, held_out, nested_stats, online_stats, operating_points,
                                          run_auroc)
from geolens.analysis.precursors import lead_stats, with_holm
from scipy import stats

from geolens.analysis.significance import (differ_within, holm, median_interval, onsets_differ, sign_test, smaller_than,
                                         smaller_within, spearman_null, spearman_test, wilcoxon_less)
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.runs.forecast import ForecastWatch, ThresholdRule, forecast_for, read_forecasts, write_forecasts

ONSETS = [6100, 8600, 7000, 9100, 6500, 7900, 8200, 6800, 7400, 8800]  # ten seeds' onsets, all different


def test_spearman_permutation_p_of_a_perfect_a_random_and_a_constant_precursor():
    perfect = [o - 1300 for o in ONSETS]  # the same lead on every seed
    rho, p = spearman_test(perfect, ONSETS)
    assert rho == pytest.approx(1.0)
    assert p == pytest.approx(2 / math.factorial(10))  # exact: of the 10! pairings only this one and its reverse
    rho, p = spearman_test([o for o in ONSETS[::-1]], ONSETS)  # unrelated order
    assert abs(rho) < 0.5 and p > 0.1
    assert spearman_test([5000] * 10, ONSETS) == (None, None)  # a constant event has no rank correlation
    # three pairs: all 3! = 6 pairings are enumerated; a perfect order and its reverse are as extreme
    assert spearman_test([1, 2, 3], [10, 20, 30]) == (pytest.approx(1.0), pytest.approx(1 / 3))
    # ten seeds are enumerated: the p-value does not depend on the resampling seed
    rng = np.random.default_rng(3)
    x, y = rng.random(10), rng.random(10)
    assert spearman_test(x, y, seed=0) == spearman_test(x, y, seed=1)
    assert spearman_null(10) == "exact (all 10! pairings)" and spearman_null(13) == "199,999 random pairings"


def _brute_force_p(x, y) -> float:
    """The share of all pairings of x with a permutation of y whose |Spearman rho| is at least the observed one."""
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    observed = abs(np.corrcoef(rx, ry)[0, 1])
    perms = [abs(np.corrcoef(rx, ry[list(p)])[0, 1]) for p in itertools.permutations(range(len(ry)))]
    return sum(r >= observed - 1e-12 for r in perms) / len(perms)


@pytest.mark.parametrize("x, y", [([1, 2, 3, 4, 5, 6], [2, 1, 4, 3, 6, 5]),
                                  ([3, 1, 4, 1, 5, 9, 2], [2, 7, 1, 8, 2, 8, 1]),  # ties on both sides
                                  ([10, 20, 30, 40, 50], [50, 40, 10, 30, 20])])
def test_exact_spearman_p_is_the_brute_force_count_of_pairings(x, y):
    assert spearman_test(x, y)[1] == pytest.approx(_brute_force_p(x, y), abs=1e-12)
    assert spearman_test(x, y)[0] == pytest.approx(stats.spearmanr(x, y).statistic)


def test_exact_spearman_p_matches_scipys_enumeration_at_eight_pairs():
    rng = np.random.default_rng(5)
    x = rng.random(8)
    y = x + rng.random(8)
    rx, ry = stats.rankdata(x), stats.rankdata(y)
    scipy_exact = stats.permutation_test((ry,), lambda r: stats.spearmanr(rx, r).statistic, permutation_type="pairings",
                                         n_resamples=math.factorial(8), alternative="two-sided").pvalue
    assert spearman_test(x, y)[1] == pytest.approx(scipy_exact)


def test_holm_adjusts_step_down():
    # sorted 0.01, 0.03, 0.04 of m = 3: 3 x 0.01, max(0.03, 2 x 0.03), max(0.06, 1 x 0.04)
    assert holm([0.04, None, 0.01, 0.03]) == [pytest.approx(0.06), None, pytest.approx(0.03), pytest.approx(0.06)]
    assert holm([0.5, 0.9]) == [1.0, 1.0]  # capped at 1
    assert holm([]) == [] and holm([None]) == [None]


def test_the_correction_keeps_the_perfect_precursor_and_drops_the_others():
    """A family of a perfect, a random and a constant precursor over ten seeds: only the perfect one
    survives Holm at 0.05; a lone p of 0.03 among 40 tests does not."""
    random = np.random.default_rng(0).permutation(ONSETS) - 1000
    rows = with_holm([lead_stats("perfect", [(o, o - 1300) for o in ONSETS]),
                      lead_stats("random", list(zip(ONSETS, random.tolist()))),
                      lead_stats("constant", [(o, 5000) for o in ONSETS])])
    perfect, rand, constant = rows
    assert perfect.survives and perfect.holm_p == pytest.approx(2 * 2 / math.factorial(10))  # two tests: the constant has none
    assert not rand.survives and rand.holm_p >= rand.spearman_p
    assert constant.spearman is None and constant.holm_p is None and not constant.survives
    assert perfect.loo_error == pytest.approx(0.0) and perfect.loo_wins == 10  # the line is exact on every seed
    assert perfect.lead_interval == (1300.0, 1300.0, pytest.approx(1 - 22 / 1024)) and perfect.lead_median == 1300
    assert holm([0.03] + [0.9] * 39)[0] == pytest.approx(1.0)


def test_median_interval_and_sign_test():
    assert median_interval([7.0]) is None and median_interval([3.0, 3.0, 3.0]) == (3.0, 3.0, 0.75)
    assert median_interval([300, 100, 200]) == (100, 300, 0.75)  # three values: the range, which covers 75%
    assert median_interval([5, 1, 4, 2, 3]) == (1, 5, pytest.approx(1 - 2 / 32))  # five: the range, 94%
    lo, hi, coverage = median_interval(range(1, 11))  # ten: x_(2) to x_(9), 1 - 2 * 11 / 1024
    assert (lo, hi) == (2, 9) and coverage == pytest.approx(1 - 22 / 1024)
    for n in (6, 10, 17):  # scipy's own order-statistic interval of the median, where it has one
        x = np.random.default_rng(n).random(n)
        ci = stats.quantile_test(x, q=np.median(x)).confidence_interval(0.95)
        assert median_interval(x)[:2] == (ci.low, ci.high) and median_interval(x)[2] >= 0.95
    assert sign_test([-300, -200, -100]) == (3, 0, 0.25)  # three seeds can never reach 0.05
    assert sign_test([-1] * 9) == (9, 0, pytest.approx(2 / 512))
    assert sign_test([0, 0]) == (0, 0, None) and sign_test([-5, 5])[2] == 1.0
    assert wilcoxon_less([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]) == pytest.approx(1 / 32)  # exact, all smaller
    assert wilcoxon_less([1], [2]) is None


def test_rank_test_of_onsets_with_runs_that_never_grokked():
    """Every onset of a before every onset of b: the exact one-sided p is 1 / C(n_a + n_b, n_a); a run without an
    onset ranks last; reversing the question gives the complement."""
    assert smaller_than([100, 200, 300], [400, 500, 600]) == pytest.approx(1 / 20)
    assert smaller_than([100, 200, 300, 350, 380], [400, 500, 600, 700, 800]) == pytest.approx(1 / 252)
    assert smaller_than([100, 200], [300, None]) == pytest.approx(1 / 6)
    assert smaller_than([None, None, 900], [100, 200, 300]) == pytest.approx(1.0)
    assert smaller_than([400, 500, 600], [100, 200, 300]) == pytest.approx(1.0)
    assert smaller_than([100], [200, 300]) is None


def test_stratified_rank_test_of_onsets():
    """One stratum is the exact Mann-Whitney test; perfectly separated strata multiply their exact p-values (1/20
    for 3 vs 3, 1/3 for 1 vs 2); strata with runs on one side only are left out; a run without an onset ranks last."""
    for a, b in (([100, 200, 300], [400, 500, 600]), ([100, 700], [300, 500, None]), ([100, 200], [300, None])):
        assert smaller_within([(a, b)]) == pytest.approx(smaller_than(a, b))
    assert smaller_within([([1, 2, 3], [4, 5, 6]), ([10], [20, 30]), ([5], [])]) == pytest.approx(1 / 60)
    assert smaller_within([([4, 5, 6], [1, 2, 3]), ([30], [10, 20])]) == pytest.approx(1.0)
    assert smaller_within([([None], [10, 20])]) == pytest.approx(1.0)
    assert smaller_within([([1], [])]) is None


def test_two_sided_rank_tests_for_a_comparison_asked_both_ways():
    """Two-sided = twice the smaller one-sided p (at most 1), whichever side comes first."""
    a, b = [100, 200, 300, 350, 380], [400, 500, 600, 700, 800]
    assert onsets_differ(a, b) == pytest.approx(2 / 252) == onsets_differ(b, a)
    assert onsets_differ([100, 500], [300, None]) == pytest.approx(2 * smaller_than([100, 500], [300, None]))
    assert onsets_differ([1, 4, 5], [2, 3, 6]) == pytest.approx(1.0) and onsets_differ([1], [2, 3]) is None
    strata = [([1, 2, 3], [4, 5, 6]), ([10], [20, 30])]
    assert differ_within(strata) == pytest.approx(2 / 60) == differ_within([(b, a) for a, b in strata])
    assert differ_within([([1], [])]) is None


def _ramp(onset: int, start: int = 0, end: int = 12000, rise: int = 1000, noise: float = 0.0, seed: int = 0) -> Series:
    """A column that rises linearly from 0 to 1 over the `rise` epochs before `onset`, evaluated every 10."""
    epochs = np.arange(start, end + 1, 10)
    values = np.clip((epochs - (onset - rise)) / rise, 0, 1)
    values = values + noise * np.random.default_rng(seed).standard_normal(values.size)
    return Series(epochs, values, onset)


def test_a_perfect_online_precursor_forecasts_every_held_out_seed_exactly():
    series = [_ramp(o) for o in ONSETS]
    rule = fit_rule(series, "x", min_warning=300)
    assert rule.direction == "above" and rule.lead >= 300
    # the ramp crosses t at onset - 1000 + 1000 t: the lead is the same on every run
    fired = [int(firing_epochs(s, "above", np.array([rule.threshold]))[0]) for s in series]
    assert {o - f for o, f in zip(ONSETS, fired)} == {round(rule.lead)}
    stats = online_stats("x", series, min_warning=300)
    assert stats.fired == 10 and stats.never == 0 and stats.late == 0
    assert stats.mae == pytest.approx(0.0) and stats.wins == 10
    assert stats.baseline_mae == pytest.approx(np.mean([abs(o - np.mean(ONSETS[:i] + ONSETS[i + 1:]))
                                                        for i, o in enumerate(ONSETS)]))
    assert stats.p == pytest.approx(1 / 1024)  # exact Wilcoxon: all ten errors smaller
    assert min(stats.warning_range) >= 300
    # the minimum warning is respected: a rule may not fire within 300 epochs of the onset
    assert fit_rule(series, "x", min_warning=2000) is None  # the ramp starts 1,000 epochs before the onset


def test_an_uninformative_column_forecasts_no_better_than_the_mean_onset():
    """A column whose ramp starts at a random epoch unrelated to the onset: its forecasts miss."""
    starts = np.random.default_rng(1).permutation(ONSETS)
    series = [Series(s.epochs, s.values, o) for s, o in zip((_ramp(int(t) - 2000) for t in starts), ONSETS)]
    stats = online_stats("x", series, min_warning=0)
    assert stats.mae > 0.8 * stats.baseline_mae and (stats.p is None or stats.p > 0.05)


def _rise(onset: int | None, lead: int, end: int = 14000) -> Series:
    """A column that rises linearly from 0 to 1 over 1,000 epochs from `lead` epochs before `onset` (from
    epoch `lead` on a run without an onset), evaluated every 10."""
    epochs = np.arange(0, end + 1, 10)
    start = lead if onset is None else onset - lead
    return Series(epochs, np.clip((epochs - start) / 1000, 0, 1), onset)


def test_choosing_the_column_inside_each_fold_scores_the_whole_procedure():
    """'good' leads every onset by 2,000 epochs but seed 0's by 5,000; 'ok' by 2,000 -/+ 850 alternately. On all
    seeds 'good' has the lower held-out MAE (1,000 against 1,020) and is chosen; nested, the folds that keep seed 0
    among their fitting seeds see 'good' worse and choose 'ok': the procedure's error is 1,350, not 1,000."""
    onsets = [6000, 7000, 8000, 9000, 10000, 11000]
    good = [_rise(o, 5000 if i == 0 else 2000) for i, o in enumerate(onsets)]
    ok = [_rise(o, 2000 + (850 if i % 2 else -850)) for i, o in enumerate(onsets)]
    # seed 0 held out: fitted lead 2,000, it fires 3,000 early; the others: mean lead 2,000 + 3,000 / 5, 600 off
    assert online_stats("good", good, 100).mae == pytest.approx((3000 + 5 * 600) / 6)
    assert online_stats("ok", ok, 100).mae == pytest.approx(1.2 * 850)  # each seed's jitter and a fifth of it
    nested = nested_stats({"good": good, "ok": ok}, 100)
    assert nested.chosen == ["good"] + ["ok"] * 5
    assert nested.score.mae == pytest.approx((3000 + 5 * 1.2 * 850) / 6) and nested.score.fired == 6


def test_a_held_out_seed_the_rule_never_fires_on_counts_as_a_miss():
    """Seed 0's column rises only to 0.2; the other seeds' to 1, after a blip to 0.25 at epoch 500 that makes
    thresholds below it fire at random leads. Fitted on the other nine, the rule's threshold is above 0.25: it
    never fires on seed 0. The miss stays in the error (scored as if the rule fired at seed 0's last evaluation,
    epoch 14,000) and in the Wilcoxon test, as a loss against the mean onset."""
    series = []
    for i, o in enumerate(ONSETS):
        s = _rise(o, 2000)
        values = np.minimum(s.values, 0.2) if i == 0 else np.where(s.epochs == 500, 0.25, s.values)
        series.append(Series(s.epochs, values, o))
    rule = fit_rule(series[1:], "x", min_warning=100)
    assert rule.threshold > 0.25 and rule.lead == pytest.approx(2000 - 1000 * rule.threshold, abs=10)
    stats = online_stats("x", series, min_warning=100)
    assert (stats.runs, stats.no_rule, stats.fired, stats.never) == (10, 0, 9, 1)
    missed = held_out(series[0], rule, series[1:])
    assert missed.fired is None and missed.error == pytest.approx(abs(ONSETS[0] - (14000 + rule.lead)))
    # the scores of the nine fired seeds, and what the miss adds: its error counts, and it is the tenth pair tested
    fired = [held_out(series[i], fit_rule(series[:i] + series[i + 1:], "x", 100), series[:i] + series[i + 1:])
             for i in range(1, 10)]
    assert stats.mae == pytest.approx((missed.error + sum(o.error for o in fired)) / 10)
    assert stats.baseline_mae == pytest.approx((missed.baseline + sum(o.baseline for o in fired)) / 10)
    assert stats.p == pytest.approx(wilcoxon_less([missed.error] + [o.error for o in fired],
                                                  [missed.baseline] + [o.baseline for o in fired]))
    assert missed.error > missed.baseline and stats.wins == sum(o.error < o.baseline for o in fired)


def test_a_rule_firing_on_a_run_that_does_not_grok_is_a_false_alarm():
    series = [_rise(o, 2000) for o in ONSETS]
    rises, flat = _rise(None, 3000), Series(np.arange(0, 14001, 10), np.zeros(1401), None)
    stats = online_stats("x", series, min_warning=100, negatives=[rises, flat])
    assert (stats.negatives, stats.false_alarms) == (2, 1)
    assert online_stats("x", series, min_warning=100).false_alarms is None  # no such runs: not measured


def test_lead_time_against_false_alarms_on_a_hand_made_set():
    """Three grokking runs whose column rises 2,000, 3,000 and 6,000 epochs before their onsets (a 1,000-epoch ramp,
    so threshold t fires lead - 1,000 t before), two runs that do not grok (one rises, one stays flat)."""
    series = [_rise(6000, 2000), _rise(7000, 3000), _rise(9000, 6000)]
    negatives = [_rise(None, 3000), Series(np.arange(0, 14001, 10), np.zeros(1401), None)]
    rule = ThresholdRule("x", "above", 0.5, 1500.0)
    points = operating_points(rule, series, negatives, min_warning=100, horizon=3000)
    fitted = next(p for p in points if p.fitted)
    # t = 0.5 fires 1,500, 2,500 and 5,500 epochs before: two in time (<= 3,000), one early; the rising negative alarms
    assert (fitted.in_time, fitted.early, fitted.missed, fitted.runs) == (2, 1, 0, 3)
    assert (fitted.lead_median, fitted.lead_range) == (2000, (1500, 2500))
    assert (fitted.alarmed, fitted.negatives, fitted.false_alarm_rate) == (1, 2, pytest.approx(2 / 5))
    assert [p.threshold for p in points] == sorted(p.threshold for p in points)  # 'above': the earliest alarms first
    assert all(p.runs == 3 and p.negatives == 2 for p in points)
    # most values before the onsets are 0 (the 10%-40% quantiles): every run starts there, so it alarms at epoch 0,
    # 6,000-9,000 epochs early on the grokking runs and on both runs that do not grok: every alarm false
    start = points[0]
    assert (start.threshold, start.in_time, start.early, start.alarmed, start.false_alarm_rate) == (0.0, 0, 3, 2, 1.0)
    # the run-level AUROC: grokking runs reach 1 before onset - 100, the negatives 1 and 0: 3 wins, 3 ties of 6 pairs
    assert run_auroc("above", series, negatives, min_warning=100) == pytest.approx((3 + 0.5 * 3) / 6)
    assert run_auroc("above", series, [], min_warning=100) is None


def test_a_falling_column_gets_a_below_rule():
    series = [Series(s.epochs, 5 - s.values, s.onset) for s in (_ramp(o) for o in ONSETS)]
    rule = fit_rule(series, "loss", min_warning=100)
    assert rule.direction == "below" and rule.threshold < 5
    assert ThresholdRule("loss", "below", 4.5, 500).first_firing(
        [{"epoch": 0, "loss": 5.0}, {"epoch": 10, "loss": 4.6}, {"epoch": 20, "loss": 4.4}]) == 20


def test_forecast_file_round_trip_and_refusals(tmp_path):
    from geolens.runs.forecast import Forecast
    from geolens.runs.runset import group_key

    cfg = make_config("ln", p=23)
    rule = ThresholdRule("wl_gini", "above", 0.4, 1200.0, 150.0)
    path = write_forecasts(tmp_path / "f.json", [Forecast("ln ...", group_key(cfg), [1, 2, 3], rule, 150.0, 700.0, 100)],
                           100)
    (got,) = read_forecasts(path)
    assert got.rule == rule and got.seeds == [1, 2, 3] and forecast_for(path, group_key(cfg)).rule == rule
    with pytest.raises(GeoError, match="has no rule fitted on this run's configuration"):
        forecast_for(path, group_key(make_config("fb", p=23)))
    # a file written before a config field existed (its key lacks the field) still serves the runs whose
    # field has the default, and not the others
    older = json.loads(group_key(cfg))
    older.pop("norm_placement")
    old = Forecast("ln ...", json.dumps(older, sort_keys=True), [1], rule, None, None, 100)
    assert old.matches(group_key(cfg)) and not old.matches(group_key(cfg.replace(norm_placement="pre")))
    with pytest.raises(GeoError, match="does not exist"):
        read_forecasts(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(GeoError, match="not readable JSON"):
        read_forecasts(tmp_path / "bad.json")
    (tmp_path / "other.json").write_text(json.dumps({"format": "geolens-run"}))
    with pytest.raises(GeoError, match="not a geolens forecast file"):
        read_forecasts(tmp_path / "other.json")
    watch = ForecastWatch(rule, [{"epoch": 0, "wl_gini": 0.1}])
    assert watch.describe() == ""
    watch.add({"epoch": 6000, "wl_gini": 0.45})
    watch.add({"epoch": 6010, "wl_gini": 0.5})
    assert watch.fired == 6000 and watch.describe() == "onset expected ~7,200 (±150) (wl_gini >= 0.4 at 6,000)"


def test_a_forecast_rule_on_an_old_column_name_loads_under_the_new(tmp_path):
    """A forecast file or run.json written when the participation ratios were erank_resid, erank_mlp (and
    _L<l>) reads them under their present names, so it fires on the rows read_metrics gives."""
    from dataclasses import asdict

    from geolens.runs.forecast import Forecast
    from geolens.runs.run import Run
    from geolens.runs.runset import group_key
    from geolens.runs.storage import RunDir, write_metrics

    cfg = make_config("ln", p=23)
    rules = [ThresholdRule("erank_mlp", "below", 20.0, 300.0, 40.0), ThresholdRule("erank_resid_L0", "above", 5.0, 9.0)]
    path = write_forecasts(tmp_path / "f.json", [Forecast("ln ...", group_key(cfg), [1], r, 40.0, 90.0, 100)
                                                 for r in rules], 100)
    assert json.loads(path.read_text())["forecasts"][0]["rule"]["column"] == "erank_mlp"  # as an older geolens wrote it
    got = [f.rule for f in read_forecasts(path)]
    assert [r.column for r in got] == ["participation_mlp", "participation_resid_L0"]
    assert got[0].describe() == "participation_mlp <= 20" and forecast_for(path, group_key(cfg)).rule == got[0]
    assert ThresholdRule.from_dict(asdict(rules[1])) == got[1]
    assert ThresholdRule.from_dict({**asdict(got[0]), "column": "wl_gini"}).column == "wl_gini"  # others unchanged
    watch = ForecastWatch(got[0], [{"epoch": 0, "participation_mlp": 30.0}, {"epoch": 10, "participation_mlp": 19.0}])
    assert watch.fired == 10
    # a run that trained with such a rule: `geolens info`'s forecast line reads its run.json
    run = RunDir(tmp_path / "run")
    run.path.mkdir()
    run.write_header({"config": cfg.to_dict(), "engine": "fast", "n_train": 1, "n_test": 1, "status": "finished",
                      "stop_reason": "completed", "forecast": asdict(rules[0])})
    rows = [{"epoch": e, "train_loss": 0.1, "train_acc": 1.0, "test_loss": 1.0, "test_acc": 0.5, "weight_norm": 1.0,
             "grad_norm": 0.1, "max_abs_logit": 1.0, "elapsed_s": 0.0, "erank_mlp": 30.0 - e} for e in (0, 10, 20)]
    write_metrics(run.metrics_csv, rows)
    shown = Run(run.path).summary()["forecast"]
    assert shown == "participation_mlp <= 20 fired at 10: onset expected ~310 (±40); no onset yet"


# the bounded sphere groks on every one of these seeds within 600 epochs (onsets 110-280 with this code)
FORECAST_SWEEP = dict(task="add", p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.8, lr=1e-2, epochs=600,
                      eval_every=10, checkpoints="every:600")


def test_a_forecast_fitted_on_a_small_sweep_shows_on_a_held_out_seed(tmp_path, geolens, monkeypatch):
    """`geolens precursors --online --save` on four seeds of a real Z_23 sweep, then `geolens train
    --forecast` of a fifth seed: its progress line shows the expected onset once the rule fires, and
    `geolens info` the forecast beside the measured onset."""
    from geolens.threads import torch_threads
    from geolens.training import progress_bar
    from geolens.training.batched import train_batched

    cfgs = [make_config("sphere", seed=s, data_seed=s, **FORECAST_SWEEP) for s in (1, 2, 3, 4)]
    with torch_threads(1):
        train_batched(cfgs, [tmp_path / "sweep" / f"seed_{c.seed}" for c in cfgs], progress=False)
    r = geolens("precursors", "--runs", tmp_path / "sweep", "--out", tmp_path / "pre", "--online", "--min-warning", "20",
                "--columns", "test_loss,test_acc", "--save", tmp_path / "forecast.json")
    assert r.returncode == 0, r.stderr
    online = (tmp_path / "pre" / "precursors_online.md").read_text()
    assert "| sphere (frac_train=0.8, d_model=32, d_head=8, d_mlp=64) lr 0.01 wd 1, add p=23 | test_" in online
    (forecast,) = read_forecasts(tmp_path / "forecast.json")
    assert forecast.seeds == [1, 2, 3, 4] and forecast.rule.column in ("test_loss", "test_acc")
    assert forecast.rule.lead >= 20 and forecast.min_warning == 20

    shown = []
    monkeypatch.setattr(progress_bar.EpochProgress, "update", lambda self, epoch, stats: shown.append((epoch, stats)))
    args = ["train", "--preset", "sphere", "--seed", "5", "--task", "add", "--p", "23", "--frac", "0.8", "--lr", "1e-2",
            "--epochs", "600", "--set", "d_model=32", "--set", "d_head=8", "--set", "d_mlp=64",
            "--out", tmp_path / "held_out", "--forecast", tmp_path / "forecast.json"]
    with torch_threads(1):
        r = geolens(*args)
    assert r.returncode == 0, r.stderr
    lines = [s for _, s in shown if "onset expected ~" in s]
    assert lines, shown[-1]
    fired = next(e for e, s in shown if "onset expected ~" in s)
    assert f"{forecast.rule.describe()} at {fired:,})" in lines[0]
    assert f"~{fired + forecast.rule.lead:,.0f} (±{forecast.rule.error:,.0f})" in lines[0]
    assert all("onset expected" not in s for e, s in shown if e < fired)
    header = json.loads((tmp_path / "held_out" / "run.json").read_text())
    assert ThresholdRule(**header["forecast"]) == forecast.rule
    info = geolens("info", "--run", tmp_path / "held_out")
    assert f"{forecast.rule.describe()} fired at {fired:,}" in info.stdout and "measured" in info.stdout
    # scored on the new seed against the fitting seeds' mean onset
    onset = json.loads((tmp_path / "held_out" / "events.json").read_text())["onset_095"]
    fitting = [json.loads((tmp_path / "sweep" / f"seed_{s}" / "events.json").read_text())["onset_095"] for s in (1, 2, 3, 4)]
    assert forecast.mean_onset == pytest.approx(sum(fitting) / 4)
    r = geolens("precursors", "--runs", tmp_path / "held_out", "--out", tmp_path / "check", "--check", tmp_path / "forecast.json")
    assert r.returncode == 0, r.stderr
    check = (tmp_path / "check" / "forecast_check.md").read_text()
    expected = fired + forecast.rule.lead
    assert (f"| 5 | {forecast.rule.describe()} | {fired:,} | {onset - fired:,} | {expected:,.0f} | {onset:,} | "
            f"{abs(onset - expected):,.0f} | {abs(onset - forecast.mean_onset):,.0f} |") in check
    assert f"forecast MAE {abs(onset - expected):,.0f} against the fitting runs' mean onset" in check
    assert f"warnings {onset - fired:,} to {onset - fired:,} epochs, median {onset - fired:,}" in check
    assert f"forecast after the onset on {int(expected > onset)}" in check
    # --online also wrote the error of choosing the column and lead time against false alarms
    selection = (tmp_path / "pre" / "precursors_online_selection.md").read_text()
    assert f"| {forecast.rule.column} | on all seeds (optimistic) | 4 |" in selection and "| nested: inside each fold |" in selection
    alarms = (tmp_path / "pre" / "precursors_alarms.md").read_text()
    assert "(fitted) | " in alarms and "no run of this configuration that did not grok" in alarms

    # a forecast file of another configuration is refused before anything is written
    args[2] = "fb"
    args[args.index(tmp_path / "held_out")] = tmp_path / "other"
    r = geolens(*args)
    assert r.returncode == 2 and "has no rule fitted on this run's configuration" in one_line_error(r.stderr)
    assert not (tmp_path / "other").exists()
    r = geolens("precursors", "--runs", tmp_path / "sweep", "--save", tmp_path / "f2.json")
    assert r.returncode == 2 and "add --online" in one_line_error(r.stderr)
    assert not math.isnan(forecast.loo_mae)


def _replicate(path, preset, seed, onset, engine, threads, cpu="Test CPU", commit="a" * 40, gpu=None):
    """A finished run of `preset` and seed whose test accuracy passes 0.95 at `onset`, computed by `engine`
    on `threads` threads of `cpu` (and on `gpu`, if named), trained at `commit`."""
    from conftest import _step_curve, _write_run

    from geolens.runs.storage import RunDir

    _write_run(path, make_config(preset, p=23, seed=seed, data_seed=seed, epochs=3000), _step_curve(onset, 3000))
    run = RunDir(path)
    header = run.read_header()
    header.update(engine=engine, segments=[{"from_epoch": 0, "geolens": "0.1.0", "geolens_commit": commit,
                                            "machine": {"cpu": cpu, "cpu_capability": "AVX2", "torch_threads": threads,
                                                        **({"gpu": gpu} if gpu else {})}}])
    run.write_header(header)


def test_noise_floor_of_constructed_replicates(tmp_path, geolens):
    """Seed 1 groks at 1,000 / 1,300 / 1,100 in three float orders, seed 2 at 2,000 / 2,050: ranges 300
    and 50, floor 300 on that machine; the same seed on another machine is its own floor; a seed with one run has
    no range; a replicate trained from an uncommitted tree is shown but left out of the range, and a machine whose
    replicates are all uncommitted has no floor (none is borrowed from another machine)."""
    root = tmp_path / "runs"
    for seed, onsets in ((1, (1000, 1300, 1100)), (2, (2000, 2050))):
        for (engine, threads), onset in zip((("fast", 1), ("fast", 2), ("hooked", 1)), onsets):
            _replicate(root / f"{engine}{threads}" / f"seed_{seed}", "ln", seed, onset, engine, threads)
    _replicate(root / "fast1_dirty" / "seed_2", "ln", 2, 2900, "hooked", 2, commit="a" * 40 + "+dirty")
    _replicate(root / "other" / "seed_1", "ln", 1, 1500, "fast", 1, cpu="Other CPU")
    _replicate(root / "other" / "seed_3", "ln", 3, 1500, "fast", 1, cpu="Other CPU")
    _replicate(root / "dirty" / "seed_1", "ln", 1, 1000, "fast", 1, cpu="Dirty CPU", commit="b" * 40 + "+dirty")
    _replicate(root / "dirty2" / "seed_1", "ln", 1, 1800, "fast", 2, cpu="Dirty CPU", commit=None)
    r = geolens("noise-floor", "--runs", root, "--out", tmp_path / "out")
    assert r.returncode == 0, r.stderr
    data = json.loads((tmp_path / "out" / "noise_floor.json").read_text())
    floors = {f["machine"]: f for f in data["floors"]}
    assert set(floors) == {"Test CPU (AVX2)", "Dirty CPU (AVX2)"}  # Other CPU: one run per seed, no range
    test = floors["Test CPU (AVX2)"]
    assert test["floor"] == 300 and test["floor_with_uncommitted"] == 900
    ranges = {s["seed"]: (s["range"], s["range_with_uncommitted"], s["onsets"]) for s in test["seeds"]}
    assert ranges[1] == (300, 300, {"fast, 1 thread": 1000, "fast, 2 threads": 1300, "hooked, 1 thread": 1100})
    assert ranges[2][:2] == (50, 900)  # the uncommitted 2,900 widens only the labelled range
    assert floors["Dirty CPU (AVX2)"]["floor"] is None and floors["Dirty CPU (AVX2)"]["floor_with_uncommitted"] == 800
    md = (tmp_path / "out" / "noise_floor.md").read_text()
    label = "ln lr 0.0006 wd 1, add p=23"
    assert md.splitlines()[0] == ("| configuration | seed | machine | fast, 1 thread | fast, 2 threads | hooked, 1 thread "
                                  "| hooked, 2 threads | range | range with uncommitted runs |")
    assert f"| {label} | 1 | Test CPU (AVX2) | 1,000 | 1,300 | 1,100 |  | 300 | 300 |" in md
    assert f"| {label} | 2 | Test CPU (AVX2) | 2,000 | 2,050 |  | 2,900* | 50 | 900 |" in md
    assert "on Other CPU (AVX2): 2 seeds have one run there" in md
    assert "on Dirty CPU (AVX2): no seed has two replicates trained from a committed tree" in md
    assert "not a half-width" in md
    floors_md = (tmp_path / "out" / "floors.md").read_text()
    assert f"| {label} | Test CPU (AVX2) | 300 | 900 | 2 | 4 | seed 1 |" in floors_md
    assert f"| {label} | Dirty CPU (AVX2) | - | 800 | 1 | 2 | - |" in floors_md
    from geolens.analysis.noise_floor import MachineFloor, read_floors
    from geolens.runs.runset import group_key

    key = group_key(make_config("ln", p=23))
    assert read_floors((tmp_path / "out" / "noise_floor.json").read_text()) == {
        (key, "Dirty CPU (AVX2)"): MachineFloor(None, 800), (key, "Test CPU (AVX2)"): MachineFloor(300, 900)}
    with pytest.raises(GeoError, match="not a geolens noise-floor file"):
        read_floors('{"format": "x"}')
    with pytest.raises(GeoError, match="floors per machine"):
        read_floors('{"format": "geolens-noise-floor", "format_version": 1, "floors": []}')


def test_provenance_notes_name_dirty_and_mixed_commits(tmp_path, geolens):
    root = tmp_path / "runs"
    _replicate(root / "seed_1", "ln", 1, 1000, "fast", 1, commit="a" * 40)
    _replicate(root / "seed_2", "ln", 2, 1100, "fast", 1, commit="b" * 40 + "+dirty")
    _replicate(root / "seed_3", "ln", 3, 1200, "fast", 1, commit="a" * 40)
    for command in (["table"], ["precursors"], ["figures", "--formats", ""]):
        r = geolens(*command, "--runs", root, "--out", tmp_path / command[0])
        assert r.returncode == 0, r.stderr
        text = " ".join(r.stdout.split())
        assert f"1 of 3 runs were trained from an uncommitted tree (+dirty in run.json): {root / 'seed_2'}" in text
        assert "the runs were trained at 2 commits: aaaaaaa (2 runs), bbbbbbb (1 runs)" in text
    from geolens.runs.run import Run
    from geolens.runs.runset import provenance_notes

    assert provenance_notes([Run(root / "seed_1"), Run(root / "seed_3")]) == []  # one clean commit: nothing to say
    _replicate(root / "seed_4", "ln", 4, 1300, "deep", 1, commit="a" * 40, gpu="Test GPU")
    assert provenance_notes([Run(root / f"seed_{s}") for s in (1, 3, 4)]) == [
        "provenance: the runs were trained on 2 kinds of device (a seed trains in another float order on each): "
        "CPU (2 runs), Test GPU (1 runs)"]


def test_experiment_scripts_refuse_a_dirty_tree(tmp_path):
    """analyses/clean_tree.sh: exit 2 with one line when geolens/ differs from HEAD, unless ALLOW_DIRTY=1."""
    import shutil
    import subprocess

    from conftest import REPO

    repo = tmp_path / "repo"
    (repo / "geolens").mkdir(parents=True)
    (repo / "analyses").mkdir()
    shutil.copy(REPO / "analyses" / "clean_tree.sh", repo / "analyses")
    (repo / "geolens" / "x.py").write_text("x = 1\n")
    script = "source analyses/clean_tree.sh; require_clean_tree; echo started"
    git = ["git", "-c", "user.email=t@t", "-c", "user.name=t"]
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    subprocess.run([*git, "add", "."], cwd=repo, check=True)
    subprocess.run([*git, "commit", "-qm", "x"], cwd=repo, check=True)

    def run(env=None):
        import os
        return subprocess.run(["bash", "-c", script], cwd=repo, capture_output=True, text=True, env={**os.environ, **(env or {})})

    assert run().stdout == "started\n"
    (repo / "geolens" / "x.py").write_text("x = 2\n")
    done = run()
    assert done.returncode == 2 and done.stdout == "" and "commit them first" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert run({"ALLOW_DIRTY": "1"}).stdout == "started\n"
    scripts = ["analyses/interventions/run_cpu.sh", "analyses/precursors/run_cpu.sh", "analyses/reproduction/run_cpu.sh",
               "analyses/reproduction/run_gpu.sh", "analyses/reproduction/float_order_hooked.sh",
               "analyses/noise_floor/run_cpu.sh"]
    for name in scripts:  # every script that trains records sources the check before it trains
        text = (REPO / name).read_text()
        assert "require_clean_tree" in text and text.index("require_clean_tree") < text.index("-m geolens")


def test_the_committed_noise_floor_is_what_the_code_computes(tmp_path, monkeypatch):
    """results/noise_floor is `geolens noise-floor` on the committed replicate records (its command in
    docs/noise-floor.md), docs/noise-floor.md shows those tables, and the interventions summary reads it."""
    import importlib.util

    from conftest import REPO

    from geolens.outputs.noise_floor_table import floor_tables, write_floor_tables

    monkeypatch.chdir(REPO)  # the notes name runs by the relative paths of the documented command
    floors, notes = floor_tables(["results/noise_floor/records", "results/interventions/parents",
                                  "results/precursors/records/add"])
    write_floor_tables(floors, notes, tmp_path)
    for name in ("noise_floor.md", "floors.md", "noise_floor.json"):
        assert (tmp_path / name).read_text() == (REPO / "results" / "noise_floor" / name).read_text(), name
    assert {f.configuration.split()[0] for f in floors} == {"fb", "ln", "sphere"}
    assert all(len(f.seeds) >= 3 and f.floor_with_uncommitted > 0 for f in floors)
    spec = importlib.util.spec_from_file_location("embed", REPO / "analyses" / "reproduction" / "embed_tables.py")
    embed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(embed)
    doc = (REPO / "docs" / "noise-floor.md").read_text()
    assert embed.embed(doc) == (doc, 2)
