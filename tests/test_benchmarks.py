"""The training benchmark runs end to end at a small size and its engines compute the same model
(its timings are not checked: tests never assert wall-clock times)."""

import importlib.util
from pathlib import Path

import pytest
import torch


def _load(name: str):
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize("preset", ["ln", "rms", "fb", "fb+uniform"])
def test_bench_train_engines_agree(preset):
    bench = _load("bench_train")
    r = bench.bench_preset(preset, p=23, reps=2, device=torch.device("cpu"))
    assert set(r["med"]) == {"straightforward", "hooked", "fast"}
    assert r["err_plain"] < 1e-5 and r["err_fast"] < 1e-5  # logits against the hooked model
    assert r["ratio_q"][0] <= r["ratio_q"][1]


def test_bench_train_prints_one_row_per_preset(capsys):
    bench = _load("bench_train")
    threads = torch.get_num_threads()
    try:
        bench.main(["--p", "23", "--reps", "2", "--threads", "1", "--presets", "ln,fb+uniform"])
    finally:
        torch.set_num_threads(threads)
    rows = [line.split() for line in capsys.readouterr().out.splitlines()]
    assert [r[0] for r in rows if r and r[0] in ("ln", "fb+uniform")] == ["ln", "fb+uniform"]


def test_bench_grid_projection_on_constructed_costs():
    bench = _load("bench_grid")
    # ln costs twice fb: a grid of fb and ln members does 1.5 fb seed-epochs per seed-epoch, so 1.5 grid
    # seed-epochs/s are 2.25 fb seed-epochs/s; Table 1 at its budgets is 10 x (2 x 15,000 x 2 + 4 x 5,000)
    # = 800,000 fb seed-epochs
    hours = bench.projected_hours(1.5, {"fb": 1.0, "ln": 2.0}, ["fb", "ln"], early_stop=False)
    assert hours == pytest.approx(800_000 / 2.25 / 3600)
    # early stop: the slowest onsets + 200 (ln 9,600, rms 9,400, sphere 3,200, fb 1,400, the two +fourier 1,200)
    early = bench.projected_hours(1.0, {"fb": 1.0, "ln": 1.0}, ["fb"], early_stop=True)
    assert early == pytest.approx(10 * (9600 + 9400 + 3200 + 1400 + 1200 + 1200) / 3600)


def test_bench_grid_runs_a_small_grid(capsys):
    bench = _load("bench_grid")
    bench.main(["--p", "23", "--seeds", "1-2", "--epochs", "2,2000", "--setups", "local:1x1",
                "--set", "d_model=32",
                "--set", "d_head=8", "--set", "d_mlp=64", "--set", "frac_train=0.5"])
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.startswith("local:1x1"))
    assert float(row[2]) > 0 and row[3] == "1.00x"  # seed-epochs/s, and the reference's own ratio
    assert "ln = " in out and out.count("Table 1 (lr 6e-4, 60 members") == 2


def test_bench_controls_times_the_four_loops_and_applies_the_schedule(capsys):
    bench = _load("bench_controls")
    r = bench.bench_preset("ln", p=23, reps=2)
    assert set(r["med"]) == set(bench.LOOPS) and r["overhead"]["plain"] == 0.0
    assert all(r["calls"][n] >= 0 for n in bench.LOOPS)
    assert r["lr"] == pytest.approx(6e-4 * 5 / 100000) and r["tau"] == 20.0  # epoch 4 of the warmup; the tau window
    bench.main(["--p", "23", "--reps", "2", "--presets", "fb"])
    assert any(line.startswith("fb ") for line in capsys.readouterr().out.splitlines())


def test_bench_precursors_times_both_loops_and_records_the_columns(capsys):
    bench = _load("bench_precursors")
    r = bench.bench_preset("ln", p=23, reps=2)
    assert r["without"] > 0 and r["with"] > 0 and r["eval_every"] == 10
    from geolens.model.config import make_config
    from geolens.training.precursor_columns import column_names

    assert r["columns"] == 9 + len(column_names(make_config("ln", p=23)))  # the metrics row with every column
    bench.main(["--p", "23", "--reps", "2", "--presets", "fb"])
    assert any(line.startswith("fb ") for line in capsys.readouterr().out.splitlines())


def test_depth_ceilings_are_the_counts_of_the_issue():
    """Multiply-adds per example at the paper's sizes (d_model 128, 4 x 32 heads, d_mlp 512, p = 113): the
    straightforward model ~197k per position and layer plus ~14k per position's logits; the exact-computation
    ceilings 4.37x (one layer), 1.83x (two), 1.30x (four)."""
    from geolens.model.config import make_config

    bench = _load("bench_depth")
    cfg = make_config("ln")
    assert bench.layer_macs(cfg, 1) == 4 * 128 * 128 + 2 * 128 * 512 + 2 * 3 * 128 == 197_376
    assert bench.straightforward_macs(cfg) == 3 * 197_376 + 3 * 128 * 113
    assert bench.exact_macs(cfg) == 2 * 128 * 512 + 128 * 113
    got = [round(bench.ceiling(make_config("ln", n_layers=L)), 2) for L in (1, 2, 4)]
    assert got == [4.37, 1.83, 1.30]


def test_bench_depth_runs_and_its_engines_agree(capsys):
    bench = _load("bench_depth")
    r = bench.bench_config(2, "pre", p=23, reps=2)
    assert set(r["med"]) == {"straightforward", "hooked", "deep"} and max(r["errors"].values()) < 1e-5
    bench.main(["--p", "23", "--reps", "2", "--layers", "1", "--placements", "post", "--end-to-end", "20"])
    out = capsys.readouterr().out
    row = next(line.split() for line in out.splitlines() if line.split()[:2] == ["1", "post"])
    assert row[5] != "-" and float(row[8].rstrip("x")) == round(bench.ceiling(bench.make_config("ln", p=23)), 2)
    assert "end to end, 2 layers pre-norm, 20 epochs" in out and "deep" in out


def test_the_deep_engines_count_is_the_exact_count_plus_its_bags():
    """geolens.model.deep.deep_flops (what training's time estimate uses) does the exact-computation count of the
    benchmark plus layer 0's embedding bag (n * nq * H rows of d_model per example), forward x1, with backward x3."""
    from geolens.model.config import make_config
    from geolens.model.deep import deep_flops

    bench = _load("bench_depth")
    for L in (1, 2, 4):
        cfg = make_config("ln", n_layers=L)
        nq = 1 if L == 1 else 3
        assert deep_flops(cfg, 10, backward=False) == 2 * 10 * (bench.exact_macs(cfg) + nq * 3 * 4 * 128)
        assert deep_flops(cfg, 10) == 3 * deep_flops(cfg, 10, backward=False)
        from geolens.model.engines import engine_named

        assert engine_named("hooked").flops(cfg, 10, False) == 2 * 10 * bench.straightforward_macs(cfg)
        assert engine_named("deep").flops(cfg, 10, True) == deep_flops(cfg, 10)


def test_bench_landscape_prints_every_metric_against_an_epoch(capsys, tmp_path):
    from geolens.model.config import make_config
    from geolens.training import train as training

    bench = _load("bench_landscape")
    run = tmp_path / "r"
    training.train(make_config("fb", p=11, d_model=16, n_heads=2, d_head=8, d_mlp=32, frac_train=0.5, epochs=10,
                               eval_every=10, checkpoints="every:10"), run, progress=False)
    bench.main(["--run", str(run), "--reps", "1", "--llc", "draws=20,burnin=0"])
    out = capsys.readouterr().out
    names = [line.split()[0] for line in out.splitlines()[3:]]
    assert names == ["llc", "llc_embed", "llc_attn", "llc_mlp", "llc_unembed", "sharpness", "llc"]
    assert "one training epoch:" in out
    assert ";draws=20" in out.splitlines()[0] and "burnin" not in out.splitlines()[0]  # the --llc settings
