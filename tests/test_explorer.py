"""The trajectory explorer's folder and data: the numbers it embeds are geolens's own (no browser needed; the page
itself is driven in tests/test_explorer_browser.py)."""

import base64
import json
from pathlib import Path

import pytest
import torch

from geolens.analysis import AnalysisContext
from geolens.analysis.keyfreq import embed_freq_norms, neuron_freq_shares
from geolens.analysis.trajectory import analyze_run
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.outputs.explorer import FILES, plotly_js, write_explorer
from geolens.outputs.explorer_data import encode_shares
from geolens.runs.run import load_run
from geolens.training import train as training

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.6, lr=3e-3)


def read_data(folder: Path) -> dict:
    text = (folder / "data.js").read_text()
    prefix = "window.GEOLENS_EXPLORER = "
    assert text.startswith(prefix)
    return json.loads(text[len(prefix):].rstrip().rstrip(";"))


def decode(entry: dict) -> torch.Tensor:
    raw = torch.frombuffer(bytearray(base64.b64decode(entry["b64"])), dtype=torch.uint8)
    return raw.reshape(entry["rows"], entry["cols"]).double() / 255 * entry["scale"]


@pytest.fixture(scope="module")
def traj(tmp_path_factory):
    path = tmp_path_factory.mktemp("explorer") / "run"
    training.train(make_config("fb", epochs=120, eval_every=10, checkpoints="every:40", seed=1, **SMALL), path, progress=False)
    return analyze_run(load_run(path), progress=False)


@pytest.fixture(scope="module")
def written(traj, tmp_path_factory):
    out = tmp_path_factory.mktemp("page") / "explorer"
    write_explorer([traj], out)
    return out, read_data(out)


def test_the_folder_is_self_contained(written):
    out, _ = written
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES)
    assert (out / "plotly.min.js").read_bytes() == plotly_js()
    page = (out / "index.html").read_text()
    for name in ("plotly.min.js", "data.js", "explorer.js"):
        assert f'<script src="{name}">' in page
    for text in (page, (out / "explorer.js").read_text()):
        assert "http://" not in text.replace("http://www.w3.org/2000/svg", "") and "https://" not in text
        assert "fetch(" not in text and "XMLHttpRequest" not in text


def test_embedded_numbers_are_the_cache_and_the_training_record(traj, written):
    _, data = written
    run = data["runs"][0]
    assert run["steps"] == traj.steps
    assert run["curves"]["epoch"] == [r["epoch"] for r in traj.run.metrics]
    assert run["curves"]["test_loss"] == [r["test_loss"] for r in traj.run.metrics]
    for k, step in enumerate(traj.steps):
        v = traj.values[step]
        assert run["scalars"]["restricted_loss"][k] == v["restricted_loss"]["restricted_loss"]
        assert run["scalars"]["keyfreq_wl_fft_share"][k] == v["keyfreq_wl_fft"]["keyfreq_wl_fft_share"]
        assert run["wl_spectrum"][k] == [v["wl_spectrum"][f"wl_spectrum_{f}"] for f in range(1, 12)]
        assert run["dla"][k]["mlp_L0"] == v["dla"]["dla_mlp_L0"]
        assert run["attention"][k][0][2] == [v["attn_eq"][f"attn_eq_{p}_L0H2"] for p in ("a", "b", "eq")]
    assert run["pinned_keys"] == traj.keys
    assert run["events"] == {"onset_095": traj.run.events.get("onset_095"), "sustained_099": traj.run.events.get("sustained_099")}


def test_per_step_matrices_are_the_analysis_functions(traj, written):
    _, data = written
    run, step = data["runs"][0], traj.steps[-1]
    ctx = AnalysisContext(traj.run.model_at(step), traj.run.config_at(step), traj.run.dataset, key_freqs=traj.keys)
    assert run["we_spectrum"][-1] == pytest.approx(embed_freq_norms(ctx.W_E_group).tolist(), rel=1e-6)
    shares = neuron_freq_shares(ctx.acts_grid)[0].double()
    entry = run["neurons"][-1][0]
    assert (entry["rows"], entry["cols"]) == (64, 11)
    assert (decode(entry) - shares).abs().max() <= entry["scale"] / 510 + 1e-6
    circles = run["circles"][-1]
    assert [c["freq"] for c in circles] == traj.keys
    assert [c["share"] for c in circles] == pytest.approx(
        [traj.values[step]["embed_circles"][f"embed_circle_share_{r + 1}"] for r in range(len(circles))], rel=1e-5)


def test_shares_encoding_error_is_within_half_a_level():
    x = torch.rand(50, 7, dtype=torch.float64) * 0.8
    e = encode_shares(x)
    assert e["scale"] == pytest.approx(float(x.max()))
    assert (decode(e) - x).abs().max() <= e["scale"] / 510 + 1e-12
    assert decode(encode_shares(torch.zeros(3, 2))).abs().max() == 0


def test_explore_cli_writes_side_by_side_runs_and_refuses_a_foreign_folder(traj, geolens, tmp_path):
    out = tmp_path / "both"
    res = geolens("explore", "--run", str(traj.run.path), "--run", str(traj.run.path), "--out", str(out), "--quiet")
    assert res.returncode == 0, res.stderr
    data = read_data(out)
    assert [r["label"] for r in data["runs"]] == ["run (1)", "run (2)"]  # the same folder twice: numbered
    again = geolens("explore", "--run", str(traj.run.path), "--out", str(out), "--quiet")  # an earlier explorer is replaced
    assert again.returncode == 0, again.stderr
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    res = geolens("explore", "--run", str(traj.run.path), "--out", str(tmp_path / "other"), "--quiet")
    assert res.returncode == 2
    assert "holds other files than an explorer page" in res.stderr
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"


def test_analyze_writes_the_explorer_beside_its_report(traj, geolens, tmp_path):
    res = geolens("analyze", "--run", str(traj.run.path), "--out", str(tmp_path / "a"), "--static", "", "--quiet")
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "a" / "report.html").is_file() and (tmp_path / "a" / "explorer" / "index.html").is_file()
    res = geolens("analyze", "--run", str(traj.run.path), "--out", str(tmp_path / "b"), "--static", "", "--no-explorer", "--quiet")
    assert res.returncode == 0 and not (tmp_path / "b" / "explorer").exists()


def test_a_perm_run_says_which_views_do_not_apply(tmp_path):
    cfg = make_config("ln", task="perm", n_perm=4, epochs=10, eval_every=10, p=23, d_model=32, d_head=8, d_mlp=64)
    training.train(cfg, tmp_path / "perm", progress=False)
    write_explorer([analyze_run(load_run(tmp_path / "perm"), progress=False)], tmp_path / "page")
    run = read_data(tmp_path / "page")["runs"][0]
    assert run["group"] == "S_4" and run["keys_words"] is None
    for panel in ("spectrum", "circles", "neurons", "progress", "clock_pizza"):
        assert "S_4" in run["skipped"][panel]
    assert run["we_spectrum"] == run["circles"] == run["neurons"] == []
    assert run["attention"][-1] is not None and run["dla"][-1] is not None


def test_no_runs_is_an_error(tmp_path):
    with pytest.raises(GeoError, match="at least one run"):
        write_explorer([], tmp_path / "x")
