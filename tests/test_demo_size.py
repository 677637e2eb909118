"""The README's main job (`geolens demo`) stays under 50 MB with every checkpoint forkable: the demo's schedule
bounds its checkpoints, and its analysis folder holds plotly.js once, shared by the report and the explorer
(docs/run-format.md, "The demo's run directory"; the measured sizes: results/storage/demo_run.md)."""

import json
from pathlib import Path

from conftest import REPO

from geolens import cli
from geolens.model.config import make_config
from geolens.model.schedule import parse_schedule
from geolens.model.transformer import GeoTransformer
from geolens.outputs.plots import plotly_js
from geolens.runs.run import Run
from geolens.runs.storage import save_tensors

MB = 1e6
BANNER = b"* plotly.js v"  # the first lines of plotly.min.js: in any other file it would be a second copy


def kept_epochs(cfg) -> list[int]:
    """The epochs the config's schedule checkpoints on a run that trains all its epochs (no early stop)."""
    schedule, kept = parse_schedule(cfg.checkpoints), []
    for epoch in range(0, cfg.epochs + 1, cfg.eval_every):
        if schedule.wants(epoch, {"step": kept[-1]} if kept else None, {}) or epoch == cfg.epochs:
            kept.append(epoch)
    return kept


def test_the_demo_keeps_at_most_31_checkpoints_at_round_epochs(tmp_path):
    """Every 100 epochs: at most 31 weight files (3,000 epochs, no early stop), at the README's steps."""
    cfg = make_config(**cli.DEMO)
    kept = kept_epochs(cfg)
    assert len(kept) == 31 and kept[:3] == [0, 100, 200]
    assert {400, 800, 2000} <= set(kept)  # round epochs: the README's example steps are checkpoints of the demo
    save_tensors(tmp_path / "w.safetensors", GeoTransformer(cfg).state_dict(), {"step": "0"})
    weights = (tmp_path / "w.safetensors").stat().st_size
    assert 0.9 * MB < weights < 0.92 * MB
    # the worst case's weights, the resume state (weights and both AdamW moments) and one plotly.js leave > 10 MB
    # for metrics.csv and the analysis (8.7 MB measured at 23 checkpoints, with plotly.js: demo_run.md)
    assert len(kept) * weights + 3 * weights + len(plotly_js()) < 40 * MB


def plotly_copies(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file() and BANNER in p.read_bytes()[:200_000])


def test_the_demo_writes_report_and_explorer_with_one_plotly(geolens, monkeypatch, tmp_path):
    """The demo's pipeline on a small model: a checkpoint every 100 epochs, the report and the explorer, one copy
    of plotly.js that both load; rerun, it reuses the run (also one trained with the earlier adaptive schedule)
    and drops an explorer's own copy from before."""
    monkeypatch.setattr(cli, "DEMO", {**cli.DEMO, "p": 23, "d_model": 32, "d_head": 8, "d_mlp": 64,
                                      "frac_train": 0.5, "epochs": 300})
    out = tmp_path / "demo"
    r = geolens("demo", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert Run(out).steps == [0, 100, 200, 300]
    analysis = out / "analysis"
    assert plotly_copies(out) == [analysis / "plotly.min.js"]
    assert (analysis / "plotly.min.js").read_bytes() == plotly_js()
    report = (analysis / "report.html").read_text()
    assert '<script src="plotly.min.js"></script>' in report and report.count("plotly-graph-div") >= 5
    assert '<script src="../plotly.min.js"></script>' in (analysis / "explorer" / "index.html").read_text()
    assert sorted(p.name for p in (analysis / "explorer").iterdir()) == ["data.js", "explorer.js", "index.html"]
    assert (analysis / "report.html").stat().st_size < 0.5 * MB
    assert f"explorer: {analysis / 'explorer' / 'index.html'}" in " ".join(r.stdout.split())

    header = json.loads((out / "run.json").read_text())  # as the demo was trained before its schedule changed
    (out / "run.json").write_text(json.dumps({**header, "config": {**header["config"], "checkpoints": "adaptive"}}))
    (analysis / "explorer" / "plotly.min.js").write_bytes(plotly_js())  # an explorer written before it shared
    r = geolens("demo", "--out", out, "--quiet")
    assert r.returncode == 0, r.stderr
    assert "reusing the finished demo run" in r.stdout
    assert plotly_copies(out) == [analysis / "plotly.min.js"]


def test_the_measured_demo_directory_is_within_the_budget():
    """The record docs/run-format.md embeds (benchmarks/bench_storage.py --run): a demo run trained and analysed
    at a committed geolens, measured with du -sb."""
    sizes = json.loads((REPO / "results" / "storage" / "demo_run.json").read_text())
    assert sizes["du_sb"] <= 50 * MB and sizes["plotly_copies"] == 1 and sizes["checkpoints"] <= 31
    assert "<!-- table: results/storage/demo_run.md -->" in (REPO / "docs" / "run-format.md").read_text()
