"""The precursor columns every evaluation records (geolens.training.precursor_columns): each quantity on
constructed inputs with a known answer, fast == hooked == batched on one state, every column filled at
every evaluation of a fresh run, and metrics.csv read and resumed across the column change."""

import math

import pytest
import torch
import torch.nn.functional as F

from geolens.model.config import make_config
from geolens.model.fast import fast_eq_forward, fast_logits
from geolens.model.spectrum import discrete_log_order
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.runs.storage import METRIC_COLUMNS, RunDir, read_metrics, write_metrics
from geolens.training.batched import train_batched
from geolens.training.engine import make_optimizer, select_forward
from geolens.training.precursor_columns import (
    PrecursorProbe,
    attention_logit_variance,
    column_names,
    eq_query_scores,
    gini,
    group_norms,
    logit_scale,
    param_group,
    participation_ratio,
    skipped_columns,
    wl_concentration,
)
from geolens.training.train import SingleStep, resume, train

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5)


# ---- constructed inputs --------------------------------------------------------------------
@pytest.mark.parametrize("k", [1, 3, 7])
def test_participation_ratio_counts_equal_directions(k):
    # k orthogonal directions with equal variance (a +-1 design over 2^k rows), embedded in 40 dims
    signs = torch.tensor([[(i >> j) & 1 for j in range(k)] for i in range(2 ** k)], dtype=torch.float64) * 2 - 1
    basis = torch.linalg.qr(torch.randn(40, k, dtype=torch.float64, generator=torch.Generator().manual_seed(k)))[0]
    X = signs @ basis.T + 5.0  # the mean does not count
    assert float(participation_ratio(X)) == pytest.approx(k)
    assert float(participation_ratio(X.T.contiguous().T)) == pytest.approx(k)


def test_participation_ratio_of_unequal_variances_and_of_the_wide_side():
    # variances 4 and 1 on two axes: (4 + 1)^2 / (16 + 1)
    X = torch.tensor([[2.0, 1.0], [-2.0, -1.0], [2.0, -1.0], [-2.0, 1.0]], dtype=torch.float64)
    assert float(participation_ratio(X)) == pytest.approx(25 / 17)
    wide = torch.cat([X, torch.zeros(4, 300, dtype=torch.float64)], 1)  # more columns than rows: Xc Xc^T
    assert float(participation_ratio(wide, block=7)) == pytest.approx(25 / 17)


def test_gini_and_wl_concentration_of_known_spectra():
    assert float(gini(torch.ones(10))) == pytest.approx(0.0)
    assert float(gini(torch.tensor([0.0, 0, 0, 5]))) == pytest.approx(3 / 4)
    n, K = 23, 11
    c = torch.arange(n, dtype=torch.float64)
    one = torch.stack([torch.cos(2 * math.pi * 4 * c / n + phase) for phase in (0.0, 1.0, 2.0)])  # only bin 4
    gini_one, top_one = wl_concentration(one).tolist()
    assert gini_one == pytest.approx((K - 1) / K) and top_one == pytest.approx(1.0)
    every = torch.stack([torch.cos(2 * math.pi * k * c / n) for k in range(1, K + 1)])  # equal energy in every bin
    gini_all, top_all = wl_concentration(every).tolist()
    assert gini_all == pytest.approx(0.0, abs=1e-9) and top_all == pytest.approx(5 / K)
    assert wl_concentration(every + 3.0).tolist() == pytest.approx([gini_all, top_all], abs=1e-9)  # DC left out


def test_logit_scale_of_known_logits():
    logits = torch.tensor([[3.0, 1.0, 0.0], [0.0, 0.0, 2.0]])
    rms, margin = logit_scale(logits).tolist()
    assert rms == pytest.approx(math.sqrt((9 + 1 + 4) / 6)) and margin == pytest.approx((2 + 2) / 2)


def test_attention_logit_variance_is_over_examples_and_keys():
    scores = torch.arange(2 * 3 * 2, dtype=torch.float64).view(2, 3, 2)  # [token, position, head]
    tokens = torch.tensor([[0, 1, 1], [1, 0, 1]])
    picked = torch.stack([scores[tokens[i, j], j] for i in range(2) for j in range(3)])  # [6, 2]
    assert attention_logit_variance(scores, tokens).tolist() == pytest.approx(picked.var(0, unbiased=False).tolist())


def test_parameter_groups_partition_the_weight_norm():
    model = GeoTransformer(make_config("ln", **SMALL))
    names = [n for n, _ in model.named_parameters()]
    assert {param_group(n) for n in names} == {"embed", "attn", "mlp", "norm", "unembed"}
    assert param_group("blocks.0.attn_norm.w") == "norm" and param_group("blocks.0.attn.W_Q") == "attn"
    squared = [float(p.detach().pow(2).sum()) for p in model.parameters()]
    norms = group_norms(names, squared)
    assert sum(v * v for v in norms.values()) == pytest.approx(sum(squared))
    assert norms["wn_unembed"] == pytest.approx(float(model.unembed.W_U.detach().norm()))


# ---- the engines agree -------------------------------------------------------------------------
def _state(preset, **over):
    cfg = make_config(preset, seed=3, **{**SMALL, **over})
    model = GeoTransformer(cfg)
    with torch.no_grad():  # a state away from the initialisation: a few hundred steps' worth of change
        for p in model.parameters():
            p.mul_(1.5)
    data = make_dataset(cfg)
    return cfg, model, data


def _row(cfg, model, data, engine):
    m = GeoTransformer(cfg.replace(engine=engine))
    m.load_state_dict(model.state_dict())
    opt = make_optimizer(m)
    chosen, forward, _ = select_forward(m)
    assert chosen.name == engine
    step = SingleStep(m, opt, chosen, forward, *data.train, *data.test)
    step.backward(record=True)
    return step.evaluate(0, 0.0)[0]


@pytest.mark.parametrize("preset, over", [("ln", {}), ("fb", {"task": "mul"}), ("rms", {"attention": "uniform"}),
                                          ("sphere", {"task": "perm", "n_perm": 4})])
def test_fast_and_hooked_record_the_same_columns(preset, over):
    cfg, model, data = _state(preset, **over)
    fast, hooked = _row(cfg, model, data, "fast"), _row(cfg, model, data, "hooked")
    for col in column_names(cfg):
        assert fast[col] == pytest.approx(hooked[col], rel=2e-4, abs=1e-6, nan_ok=True), col
    # each engine's source of a column: the hooked forward's own hook points
    eq_token = int(data.train[0][0, -1])
    _, cache = model.run_with_cache(data.train[0])
    if cfg.attention != "uniform":
        hooked_scores = cache["blocks.0.attn.hook_attn_scores"][:, :, -1]  # [N, H, key]
        picked = torch.stack([eq_query_scores(model, eq_token)[data.train[0][:, j], j] for j in range(3)], 2)
        torch.testing.assert_close(picked, hooked_scores, rtol=1e-4, atol=1e-5)
    eq = fast_eq_forward(model, data.train[0]).values
    torch.testing.assert_close(eq["mlp_post"], cache["blocks.0.mlp.hook_post"][:, -1], rtol=1e-4, atol=1e-5)
    skipped = skipped_columns(cfg)
    for col in column_names(cfg):
        assert math.isnan(fast[col]) == (col in skipped), col


def test_the_recorded_forward_is_the_training_forward_bit_for_bit():
    cfg, model, data = _state("ln")
    x, y = data.train
    plain = fast_logits(model, x)
    F.cross_entropy(plain, y).backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad(set_to_none=True)
    reused = fast_logits(model, x, reuse=(fast_eq_forward(model, x), None))
    F.cross_entropy(reused, y).backward()
    assert torch.equal(plain, reused)
    assert all(torch.equal(a, p.grad) for a, p in zip(grads, model.parameters()))


def test_batched_members_record_the_single_run_columns(tmp_path):
    cfgs = [make_config("fb", seed=s, epochs=40, eval_every=20, **SMALL) for s in (1, 2)]
    batched = train_batched(cfgs, [tmp_path / "b1", tmp_path / "b2"], progress=False)
    single = train(cfgs[0], tmp_path / "s1", progress=False)
    for b, s in zip(read_metrics(batched[0].path / "metrics.csv"), read_metrics(single.path / "metrics.csv")):
        for col in column_names(cfgs[0]):
            assert b[col] == pytest.approx(s[col], rel=1e-3, abs=1e-5), (b["epoch"], col)


# ---- a fresh run, and runs from before the columns ---------------------------------------------
def test_every_evaluation_of_a_fresh_run_fills_the_columns(tmp_path):
    cfg = make_config("ln", epochs=60, eval_every=10, **SMALL)
    res = train(cfg, tmp_path / "run", progress=False)
    rows = read_metrics(res.path / "metrics.csv")
    assert [r["epoch"] for r in rows] == list(range(0, 61, 10))
    for r in rows:
        assert all(math.isfinite(r[c]) for c in column_names(cfg))
        assert r["loss_gap"] == pytest.approx(r["test_loss"] - r["train_loss"])
        assert math.sqrt(sum(r[f"wn_{g}"] ** 2 for g in ("embed", "attn", "mlp", "norm", "unembed"))) == \
            pytest.approx(r["weight_norm"], rel=1e-6)
        assert 1 <= r["participation_resid"] <= cfg.d_model and 1 <= r["participation_mlp"] <= cfg.d_mlp
        assert 0 <= r["wl_gini"] < 1 and 5 / 11 <= r["wl_top5"] <= 1
    # the last row, recomputed from the last checkpoint with the hooked model and plain torch
    model = GeoTransformer(cfg)
    model.load_state_dict(RunDir(res.path).load_checkpoint(60))
    x = make_dataset(cfg).train[0]
    logits, cache = model.run_with_cache(x)
    logits = logits[:, -1].detach()
    top2 = logits.topk(2).values
    assert rows[-1]["logit_rms"] == pytest.approx(float(logits.pow(2).mean().sqrt()), rel=1e-4)
    assert rows[-1]["logit_margin"] == pytest.approx(float((top2[:, 0] - top2[:, 1]).mean()), rel=1e-4)
    acts = cache["blocks.0.mlp.hook_post"][:, -1].double()
    eig = torch.linalg.eigvalsh(torch.cov(acts.T, correction=0))
    assert rows[-1]["participation_mlp"] == pytest.approx(float(eig.sum() ** 2 / eig.pow(2).sum()), rel=1e-3)
    assert RunDir(res.path).read_header()["skipped_columns"] == {}


def test_skipped_columns_say_why(tmp_path):
    cfg = make_config("ln", task="perm", n_perm=4, attention="uniform", epochs=20, eval_every=10,
                      **{k: v for k, v in SMALL.items() if k != "p"})
    res = train(cfg, tmp_path / "run", progress=False)
    skipped = RunDir(res.path).read_header()["skipped_columns"]
    assert skipped["wl_gini"] == "S_4 composition has no cyclic Fourier basis"
    assert skipped["attn_var_h0"] == "uniform attention has no attention logits"
    rows = read_metrics(res.path / "metrics.csv")
    assert all(math.isnan(r["wl_top5"]) and math.isnan(r["attn_var"]) and math.isfinite(r["participation_mlp"])
               for r in rows)


def test_multiplication_reads_w_l_in_discrete_log_order():
    cfg = make_config("fb", task="mul", **SMALL)
    probe = PrecursorProbe(GeoTransformer(cfg), make_dataset(cfg).train[0])
    assert torch.equal(probe.order, discrete_log_order(23))


def test_a_run_recorded_before_the_columns_reads_and_resumes(tmp_path):
    cfg = make_config("sphere", epochs=40, eval_every=10, checkpoints="every:20", **SMALL)
    res = train(cfg, tmp_path / "run", progress=False)
    run = RunDir(res.path)
    old = [{k: r[k] for k in METRIC_COLUMNS} for r in read_metrics(run.metrics_csv)]
    write_metrics(run.metrics_csv, old)  # the columns of an older version
    assert run.metrics_csv.read_text().splitlines()[0] == ",".join(METRIC_COLUMNS)
    assert read_metrics(run.metrics_csv) == old
    resume(res.path, epochs=60, progress=False)
    rows = read_metrics(run.metrics_csv)
    assert [r["epoch"] for r in rows] == [0, 10, 20, 30, 40, 50, 60]
    assert all("participation_mlp" not in r for r in rows[:5]) and all("participation_mlp" in r for r in rows[5:])
    lines = [line.split(",") for line in run.metrics_csv.read_text().splitlines()]
    col = lines[0].index("participation_mlp")
    assert lines[1][col] == "" and float(lines[-1][col]) == rows[-1]["participation_mlp"]  # empty before, filled after


def test_a_run_recorded_under_the_old_column_names_reads_and_resumes_under_the_new(tmp_path):
    """erank_resid, erank_mlp and their per-layer columns (the names before the participation ratios were
    called so) read as participation_resid, participation_mlp, ..._L<l>; resumed, the file takes the new names
    and keeps the old rows' values."""
    cfg = make_config("ln", epochs=40, eval_every=10, checkpoints="every:20", n_layers=2, **SMALL)
    res = train(cfg, tmp_path / "run", progress=False)
    run = RunDir(res.path)
    new = read_metrics(run.metrics_csv)
    header, body = run.metrics_csv.read_text().split("\n", 1)
    assert {"participation_resid", "participation_mlp_L0"} <= set(header.split(",")) and "erank" not in header
    old_header = header.replace("participation_", "erank_")
    run.metrics_csv.write_text(old_header + "\n" + body)
    assert {"erank_resid", "erank_mlp", "erank_resid_L0", "erank_mlp_L0"} <= set(old_header.split(","))
    assert read_metrics(run.metrics_csv) == new  # the same keys, in the same order, and values
    assert list(read_metrics(run.metrics_csv)[0]) == list(new[0])
    resume(res.path, epochs=60, progress=False)
    header = run.metrics_csv.read_text().split("\n", 1)[0]
    assert "erank" not in header and header.split(",") == list(read_metrics(run.metrics_csv)[0])
    assert read_metrics(run.metrics_csv)[:5] == new


def test_committed_records_with_the_old_header_read_under_the_new_names():
    from conftest import REPO

    path = REPO / "results" / "depth" / "records" / "add" / "L2" / "ln_post" / "seed_1" / "metrics.csv"
    lines = path.read_text().splitlines()
    header, last = lines[0].split(","), lines[-1].split(",")
    assert "erank_mlp_L0" in header  # recorded under the old names (committed records are not rewritten)
    row = read_metrics(path)[-1]
    assert not [k for k in row if "erank" in k]
    assert row["participation_mlp_L0"] == float(last[header.index("erank_mlp_L0")])
    assert row["participation_resid"] == float(last[header.index("erank_resid")])
