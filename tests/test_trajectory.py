"""Trajectory analysis on a small trained run: table completeness, caching, report, probe, bad runs."""

import csv
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace

import pytest

from geolens.analysis import METRICS, default_metrics, trajectory
from geolens.analysis.run_analysis import load_run
from geolens.analysis.trajectory import analyze_run
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.analysis import context as context_mod
from geolens.analysis.eqforward import eq_forward_tables
from geolens.model.transformer import GeoTransformer
from geolens.training import train as training

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.6, lr=3e-3)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    path = tmp_path_factory.mktemp("traj") / "run"
    cfg = make_config("fb", epochs=120, eval_every=10, checkpoints="every:40", seed=1, **SMALL)
    training.train(cfg, path, progress=False)
    return path


def read_table(path):
    with open(path) as f:
        return list(csv.DictReader(f))


def test_table_has_every_metric_at_every_step_and_rerun_uses_cache(run_dir):
    run = load_run(run_dir)
    traj = analyze_run(run, progress=False)
    assert traj.steps == run.steps == [0, 40, 80, 120]
    assert traj.skipped == {} and traj.computed == len(default_metrics()) * 4
    rows = read_table(run_dir / "analysis" / "metrics.csv")
    for step in run.steps:
        assert {r["metric"] for r in rows if int(r["step"]) == step} == set(default_metrics())
    again = analyze_run(load_run(run_dir), progress=False)
    assert again.computed == 0
    assert json.dumps(again.values, sort_keys=True) == json.dumps(traj.values, sort_keys=True)  # NaN-safe


def test_changed_definition_or_checkpoint_invalidates_only_that(run_dir, monkeypatch):
    analyze_run(load_run(run_dir), progress=False)
    monkeypatch.setitem(METRICS, "weight_norm", replace(METRICS["weight_norm"], version="999"))
    traj = analyze_run(load_run(run_dir), progress=False)
    assert traj.computed == 4  # weight_norm at each of the 4 steps, nothing else
    cache = json.loads((run_dir / "analysis" / "cache" / "step_0000040.json").read_text())
    assert cache["metrics"]["weight_norm"]["version"] == "999"


def test_a_cached_skip_is_recomputed_once_the_metric_serves_the_config(run_dir, tmp_path):
    """A cache entry that says a metric was skipped (written when geolens did not serve that config) is stale
    when the metric now applies: the next analyze computes it; a skip whose reason still holds stays cached."""
    run_path = _copy_run(run_dir, tmp_path / "run")
    analyze_run(load_run(run_path), metrics=["dla", "loss"], progress=False)
    path = run_path / "analysis" / "cache" / "step_0000040.json"
    entry = json.loads(path.read_text())
    entry["metrics"]["dla"] = {"version": METRICS["dla"].version, "skipped": "not served for this model (an older geolens)"}
    path.write_text(json.dumps(entry))
    traj = analyze_run(load_run(run_path), metrics=["dla", "loss"], progress=False)
    assert traj.computed == 1 and traj.skipped == {} and "dla_total" in traj.values[40]["dla"]


def test_subset_of_metrics_and_steps(tmp_path, run_dir):
    shutil.copytree(run_dir, tmp_path / "run", ignore=shutil.ignore_patterns("analysis"))
    traj = analyze_run(load_run(tmp_path / "run"), metrics=["loss", "fve_paper"], steps=[35, 119], progress=False)
    assert traj.steps == [40, 120] and traj.computed == 4
    assert set(traj.values[40]) == {"loss", "fve_paper"}
    traj = analyze_run(load_run(tmp_path / "run"), metrics=["weight_norm"], steps=[0], progress=False)
    assert traj.computed == 1 and traj.steps == [0, 40, 120]  # the table keeps what earlier calls computed
    assert set(traj.values[40]) == {"loss", "fve_paper"} and set(traj.values[0]) == {"weight_norm"}
    assert {(r["step"], r["metric"]) for r in read_table(tmp_path / "run" / "analysis" / "metrics.csv")} >= {
        ("0", "weight_norm"), ("40", "loss"), ("120", "fve_paper")}
    with pytest.raises(GeoError, match="unknown metric"):
        analyze_run(load_run(run_dir), metrics=["nope"], progress=False)


def test_pinned_keys_recompute_only_key_metrics_and_are_cached_per_choice(run_dir):
    run = load_run(run_dir)
    final = analyze_run(run, progress=False)  # the default: the final checkpoint's keys over the run
    final_keys = final.values[120]["keyfreq_wl_fft"]
    keys = [int(final_keys[f"keyfreq_wl_fft_{r}"]) for r in range(1, 6)]
    assert final.keys == keys
    each = analyze_run(load_run(run_dir), keys="each", progress=False)
    assert each.keys is None
    key_metrics = {n for n, spec in METRICS.items() if spec.uses_keys}
    assert key_metrics == {"fve_paper", "restricted_loss", "excluded_loss", "embed_circles"}
    assert each.computed == len(key_metrics) * 4
    # the last checkpoint's own keys are the final ones: step 120 is the same either way
    assert each.values[120] == final.values[120]
    assert final.values[0]["fve_paper"] != each.values[0]["fve_paper"]  # step 0 has other keys of its own
    again = analyze_run(load_run(run_dir), progress=False)
    assert again.computed == len(key_metrics) * 4  # the cache holds one choice per metric: back to the final keys
    assert again.values == final.values
    assert json.loads((run_dir / "analysis" / "cache" / "step_0000000.json").read_text())["metrics"]["fve_paper"]["keys"] == keys
    assert analyze_run(load_run(run_dir), keys="final", progress=False).computed == 0
    explicit = analyze_run(load_run(run_dir), keys=[3, 5], metrics=["fve_paper"], progress=False)
    assert explicit.computed == 4 and all(
        v != v for k, v in explicit.values[40]["fve_paper"].items() if k.endswith("_3"))  # only 2 keys: rank 3 is NaN
    for bad in ([0], [12], "latest"):
        with pytest.raises(GeoError, match="key"):
            analyze_run(load_run(run_dir), keys=bad, progress=False)


def test_corrupt_checkpoint_names_the_file_and_keeps_cached_results(tmp_path):
    cfg = make_config("ln", epochs=20, eval_every=10, checkpoints="every:10", **SMALL)
    training.train(cfg, tmp_path / "r", progress=False)
    analyze_run(load_run(tmp_path / "r"), metrics=["loss"], progress=False)
    cached = {p: p.read_bytes() for p in (tmp_path / "r" / "analysis" / "cache").iterdir()}
    (tmp_path / "r" / "checkpoints" / "step_0000010.safetensors").write_bytes(b"\0" * 10)
    with pytest.raises(GeoError, match="step_0000010.safetensors is corrupt"):
        analyze_run(load_run(tmp_path / "r"), progress=False)
    for p, data in cached.items():
        assert p.read_bytes() == data or "step_0000000" in p.name  # step 0 may gain the new metrics


def _copy_run(run_dir, dest):
    shutil.copytree(run_dir, dest, ignore=shutil.ignore_patterns("analysis"))
    return dest


@pytest.mark.parametrize("caller_computes", [True, False], ids=["caller+worker", "worker-only"])
def test_worker_processes_give_the_same_values_and_cache_files(run_dir, tmp_path, monkeypatch, caller_computes):
    if not caller_computes:  # the caller never takes a step: the spawned worker computes them all
        monkeypatch.setattr(trajectory, "_caller_step", lambda queue: None)
    one_dir, two_dir = _copy_run(run_dir, tmp_path / "one"), _copy_run(run_dir, tmp_path / "two")
    one = analyze_run(load_run(one_dir), progress=False, workers=1)
    two = analyze_run(load_run(two_dir), progress=False, workers=2)
    assert two.steps == one.steps and two.computed == one.computed == len(default_metrics()) * 4
    assert json.dumps(two.values, sort_keys=True) == json.dumps(one.values, sort_keys=True)  # exact reprs, NaN-safe
    for name in ("metrics.csv", *(f"cache/step_{s:07d}.json" for s in one.steps)):
        assert (two_dir / "analysis" / name).read_bytes() == (one_dir / "analysis" / name).read_bytes()
    assert analyze_run(load_run(two_dir), progress=False, workers=2).computed == 0


def test_corrupt_checkpoint_in_a_worker_is_the_same_clear_error(run_dir, tmp_path, monkeypatch):
    monkeypatch.setattr(trajectory, "_caller_step", lambda queue: None)  # the error is raised in the worker
    path = _copy_run(run_dir, tmp_path / "r")
    analyze_run(load_run(path), metrics=["loss"], progress=False, workers=1)
    cached = (path / "analysis" / "cache" / "step_0000040.json").read_bytes()
    (path / "checkpoints" / "step_0000040.safetensors").write_bytes(b"\0" * 10)
    with pytest.raises(GeoError, match="step_0000040.safetensors is corrupt") as err:
        analyze_run(load_run(path), progress=False, workers=2)
    assert "\n" not in str(err.value)
    assert (path / "analysis" / "cache" / "step_0000040.json").read_bytes() == cached


def test_run_without_checkpoints_is_a_clear_error(tmp_path):
    cfg = make_config("ln", epochs=20, eval_every=10, **SMALL)
    training.train(cfg, tmp_path / "r", progress=False)
    (tmp_path / "r" / "checkpoints" / "manifest.json").write_text("[]")
    with pytest.raises(GeoError, match="lists none; `geolens repair"):  # the files are there: rebuild the manifest
        analyze_run(load_run(tmp_path / "r"), progress=False)
    for f in (tmp_path / "r" / "checkpoints").glob("step_*"):
        f.unlink()
    with pytest.raises(GeoError, match="no checkpoints"):
        analyze_run(load_run(tmp_path / "r"), progress=False)


def test_perm_task_skips_fourier_metrics_with_reason_and_runs_the_rest(tmp_path):
    cfg = make_config("ln", task="perm", n_perm=4, epochs=10, eval_every=10, p=23, d_model=32, d_head=8, d_mlp=64)
    training.train(cfg, tmp_path / "s4", progress=False)
    traj = analyze_run(load_run(tmp_path / "s4"), progress=False)
    assert "fve_paper" in traj.skipped and "cyclic" in traj.skipped["fve_paper"]
    assert {"loss", "weight_norm", "softmax_collapse", "dla", "effective_rank"} <= set(traj.values[10])


def test_cli_analyze_writes_report_and_figures_and_probe_prints_circuit(run_dir):
    cmd = [sys.executable, "-c", "from geolens.cli import main; main()"]
    r = subprocess.run(cmd + ["analyze", "--run", str(run_dir), "--quiet", "--at", "80"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    html = (run_dir / "analysis" / "report.html").read_text()
    assert html.count("plotly-graph-div") >= 5 and "Plotly" in html
    for name in ("training", "spectrum", "progress", "clock_pizza", "embedding_circles", "attention"):
        assert (run_dir / "analysis" / "figures" / f"{name}.png").stat().st_size > 1000
        assert (run_dir / "analysis" / "figures" / f"{name}.svg").exists()
    env = {**os.environ, "COLUMNS": "250"}  # one table row per line
    r = subprocess.run(cmd + ["probe", "--run", str(run_dir), "--step", "75"], capture_output=True, text=True, env=env)
    assert r.returncode == 0, r.stderr
    assert "@ 80" in r.stdout and "epoch 80" in r.stdout  # the checkpoint used, said in one line on stderr
    assert "no checkpoint at epoch 75; using the nearest, epoch 80" in r.stderr
    assert "key frequencies" in r.stdout and "clock / pizza" in r.stdout and "top neurons" in r.stdout


def test_python_probe(run_dir, monkeypatch):
    forwards, caches = [], []
    monkeypatch.setattr(context_mod, "eq_forward_tables", lambda *a: forwards.append(1) or eq_forward_tables(*a))
    run_with_cache = GeoTransformer.run_with_cache
    monkeypatch.setattr(GeoTransformer, "run_with_cache", lambda *a, **k: caches.append(1) or run_with_cache(*a, **k))
    probe = load_run(run_dir).probe(120)
    assert (len(forwards), len(caches)) == (1, 0)  # metrics and attribution from one forward at `=`
    assert probe.step == 120 and len(probe.key_freqs) == 5
    assert probe.dla.means()["L0H1"] == probe.metrics["dla"]["dla_L0H1"]
    assert probe.cache["blocks.0.mlp.hook_post"].shape[0] == 23 * 23
    assert probe.cache is probe.cache and len(caches) == 1  # the full cache: on first access, once
    assert probe.verdict in ("clock", "pizza", "mixed", "unsolved")
    assert len(probe.top_heads()) == 3 and len(probe.top_neurons()) == 10
    assert probe.layer_rows() == []  # one layer: the rows above are its only layer's
    assert all(type(k) is int for k in probe.key_freqs)
    fve = probe.metrics["fve_paper"]
    assert list(probe.fve) == probe.key_freqs
    assert probe.fve[probe.key_freqs[1]] == (fve["fve_paper_U_2"], fve["fve_paper_V_2"])
    text = repr(probe)
    assert text.startswith("Probe(epoch 120") and str(probe.key_freqs) in text and len(text) < 400
    assert type(probe.cache).__name__ == "GeoActivationCache"


def test_checkpoints_added_by_training_during_an_analysis_are_left_for_the_next(run_dir, tmp_path, monkeypatch):
    """The manifest grows while a run trains: one analysis reads it once (a later entry used to
    raise KeyError)."""
    from geolens.runs.run import Run

    full = load_run(run_dir).steps
    reads = []

    def growing(self):
        reads.append(1)
        return full[: len(reads)]  # one more checkpoint at every reading

    monkeypatch.setattr(Run, "steps", property(growing))
    traj = analyze_run(load_run(run_dir), ["loss"], progress=False, workers=1, out=tmp_path / "a")
    # the steps the analysis chose when it began, computed; the later ones are left for the next call
    assert 2 <= len(traj.steps) < len(full) and traj.steps == full[: len(traj.steps)]


def test_read_table_gives_back_the_scalars_write_table_wrote(run_dir):
    """geolens.analysis.trajectory.read_table (what the landscape scripts read metrics.csv with): {step: {name:
    value}} equal to the trajectory's own scalars, NaN included."""
    from geolens.analysis.trajectory import read_table as read_tidy

    traj = analyze_run(load_run(run_dir), progress=False)
    values = read_tidy(run_dir / "analysis" / "metrics.csv")
    assert sorted(values) == traj.steps
    for step in traj.steps:
        expected = {name: float(v) for scalars in traj.values[step].values() for name, v in scalars.items()}
        assert repr(values[step]) == repr(expected)
