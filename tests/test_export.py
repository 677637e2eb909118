"""`geolens export` (trimmed trajectories), reading a run without writing into it, and the shipped
reference trajectories in checkpoints/."""

import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import REPO, one_line_error

from geolens.analysis.run_analysis import load_run
from geolens.analysis.shipped import REFERENCE_RUNS, reference_path, reference_run
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.runs.export import export_run
from geolens.runs.integrity import problems
from geolens.runs.storage import RunDir
from geolens.training import train as training

SMALL = dict(p=23, frac_train=0.5, d_model=32, n_heads=4, d_head=8, d_mlp=64, lr=1e-3)
METRICS = "loss,keyfreq_wl_fft,fve_paper,grad_symmetricity,distance_irrelevance,clock_pizza"


def tree(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and folder under `folder` (lock records included) with its bytes and mtime."""
    return {str(p.relative_to(folder)): (p.read_bytes() if p.is_file() else b"", p.stat().st_mtime_ns)
            for p in sorted(folder.rglob("*"))}


@pytest.fixture(scope="module")
def source(tmp_path_factory) -> Path:
    cfg = make_config("fb", epochs=60, eval_every=5, checkpoints="every:10", seed=1, **SMALL)
    return training.train(cfg, tmp_path_factory.mktemp("src") / "run", progress=False).path


def test_export_keeps_the_chosen_checkpoints_and_passes_info(source, tmp_path, geolens):
    r = geolens("export", "--run", source, "--out", tmp_path / "ship", "--steps", "20,30")
    assert r.returncode == 0, r.stderr
    assert "exported 4 checkpoints (epochs 0, 20, 30, 60)" in r.stdout  # epoch 0 and the last are always kept
    src, ship = load_run(source), load_run(tmp_path / "ship")
    assert ship.steps == [0, 20, 30, 60] and len(src.steps) == 7
    assert ship.manifest == [m for m in src.manifest if m["step"] in ship.steps]
    for step in ship.steps:
        assert ship.dir.ckpt_path(step).read_bytes() == src.dir.ckpt_path(step).read_bytes()
    assert sorted(p.name for p in ship.path.iterdir()) == ["checkpoints", "events.json", "metrics.csv", "run.json"]
    assert ship.metrics == src.metrics and ship.events == src.events
    header = json.loads((ship.path / "run.json").read_text())
    assert header["trimmed"]["source_checkpoints"] == 7 and header["trimmed"]["checkpoints"] == 4
    assert header["config"] == src.header["config"] and header["status"] == "finished"
    info = geolens("info", "--run", ship.path)
    assert info.returncode == 0 and "damaged" not in info.stdout and "4 of 7 checkpoints" in info.stdout
    assert not list(tmp_path.glob(".ship*"))  # no staging folder left


def test_a_trimmed_run_is_still_checked(source, tmp_path, geolens):
    ship = export_run(source, tmp_path / "ship", [30])
    extra = RunDir(source).ckpt_path(20)
    shutil.copyfile(extra, RunDir(ship).ckpt_path(20))  # a checkpoint file the manifest does not list
    assert any("not in the manifest" in p for p in problems(RunDir(ship)))
    RunDir(ship).ckpt_path(20).unlink()
    rows = (ship / "metrics.csv").read_text().splitlines()
    (ship / "metrics.csv").write_text("\n".join(r for r in rows if not r.startswith("30,")) + "\n")
    (damage,) = problems(RunDir(ship))
    assert "metrics.csv is incomplete" in damage and "30" in damage
    assert geolens("info", "--run", ship).returncode == 1
    # without the "trimmed" record the missing resume state is damage again
    header = json.loads((ship / "run.json").read_text())
    del header["trimmed"]
    (ship / "run.json").write_text(json.dumps(header))
    assert any("resume.safetensors is missing" in p for p in problems(RunDir(ship)))


@pytest.mark.parametrize("args, needle", [
    (["--steps", "9999"], "epoch 9999 is outside the trajectory"),
    (["--steps", "20", "--out", "EXISTING"], "already exists"),
])
def test_export_refuses_bad_input_in_one_line(source, tmp_path, geolens, args, needle):
    (tmp_path / "EXISTING").mkdir()
    out = ["--out", tmp_path / "new"] if "--out" not in args else []
    args = [tmp_path / a if a == "EXISTING" else a for a in args]
    r = geolens("export", "--run", source, *out, *args)
    assert r.returncode == 2 and needle in one_line_error(r.stderr)
    assert not (tmp_path / "new").exists()


def test_a_trimmed_run_cannot_be_resumed(source, tmp_path):
    ship = export_run(source, tmp_path / "ship", [30])
    with pytest.raises(GeoError, match="trimmed trajectory"):
        training.resume(ship, progress=False, epochs=100)


def test_analyze_out_and_probe_never_write_into_the_run(source, tmp_path, geolens):
    """A shipped trajectory may be read-only (tests run as root, where chmod stops nothing: the
    check is that nothing under the run folder changes)."""
    ship = export_run(source, tmp_path / "ship", [20, 30])
    assert geolens("analyze", "--run", ship, "--metrics", METRICS, "--static", "", "--quiet").returncode == 0
    before = tree(ship)
    r = geolens("analyze", "--run", ship, "--out", tmp_path / "elsewhere", "--static", "png", "--quiet")
    assert r.returncode == 0, r.stderr
    assert tree(ship) == before
    # the run's own cache was read: only the metrics it lacked were computed
    table = (tmp_path / "elsewhere" / "metrics.csv").read_text().splitlines()
    assert table[0] == "step,metric,name,value" and {int(line.split(",")[0]) for line in table[1:]} == {0, 20, 30, 60}
    assert (tmp_path / "elsewhere" / "report.html").is_file() and (tmp_path / "elsewhere" / "figures").is_dir()
    r = geolens("probe", "--run", ship, "--step", "30")
    assert r.returncode == 0 and "epoch 30" in r.stdout
    assert tree(ship) == before


def test_analyze_reuses_the_shipped_cache(source, tmp_path, geolens):
    ship = export_run(source, tmp_path / "ship", [20, 30])
    first = load_run(ship).analyze(metrics=METRICS.split(","), workers=1)
    assert first.computed == 4 * 6
    again = load_run(ship).analyze(metrics=METRICS.split(","), workers=1)
    assert again.computed == 0
    # the same values, NaN included (the unsolved tiny run's clock_pizza verdict is NaN: compare as JSON)
    assert json.dumps(again.values, sort_keys=True) == json.dumps(first.values, sort_keys=True)
    r = geolens("analyze", "--run", ship, "--metrics", METRICS, "--static", "", "--quiet")
    assert r.returncode == 0 and "0 metric evaluations computed" in r.stdout


# ---- finding the shipped trajectories ---------------------------------------------------------------
def test_reference_path_follows_the_environment_and_names_what_exists(tmp_path, monkeypatch, source):
    monkeypatch.setenv("GEOLENS_CHECKPOINTS", str(tmp_path / "nowhere"))
    with pytest.raises(GeoError, match="no shipped trajectories at .*nowhere.*pip install -e"):
        reference_path("fb")
    export_run(source, tmp_path / "ckpts" / "mine", [30])
    monkeypatch.setenv("GEOLENS_CHECKPOINTS", str(tmp_path / "ckpts"))
    assert reference_path("mine") == tmp_path / "ckpts" / "mine"
    assert reference_run("mine").steps == [0, 30, 60]
    with pytest.raises(GeoError, match="no shipped trajectory 'fb' .*choose one of fb, ln, mine"):
        reference_path("fb")


def test_reference_path_defaults_to_the_repository(monkeypatch):
    monkeypatch.delenv("GEOLENS_CHECKPOINTS", raising=False)
    for short, folder in REFERENCE_RUNS.items():
        assert reference_path(short) == REPO / "checkpoints" / folder


# ---- the shipped trajectories themselves ------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(REFERENCE_RUNS))
def test_shipped_trajectories_are_whole_and_analysed(name, monkeypatch, geolens):
    monkeypatch.delenv("GEOLENS_CHECKPOINTS", raising=False)
    run = reference_run(name)
    cfg = run.config
    assert (cfg.task, cfg.p, cfg.lr, cfg.seed, cfg.data_seed) == ("add", 113, 6e-4, 1, 1)
    assert cfg.norm == {"fb": "sphere", "ln": "layernorm"}[name]
    assert problems(run.dir) == [] and not run.dir.resume_file.exists()
    assert run.header["status"] == "finished" and "trimmed" in run.header
    assert run.steps[0] == 0 and run.steps[-1] == run.metrics[-1]["epoch"]
    onset = run.events["onset_095"]
    assert onset is not None and sum(abs(s - onset) <= 500 for s in run.steps) >= len(run.steps) // 2  # dense there
    for path in run.dir.checkpoint_files().values():
        assert path.stat().st_size < 1.2e6  # float32 weights only
    # the shipped cache covers every checkpoint with every metric, the key metrics on the final
    # checkpoint's keys (analyze's default): analysing computes nothing
    from geolens.analysis import METRICS, default_metrics, metric_versions

    final = json.loads((run.path / "analysis" / "cache" / f"step_{run.steps[-1]:07d}.json").read_text())
    ranked = final["metrics"]["keyfreq_wl_fft"]["values"]
    keys = [int(ranked[f"keyfreq_wl_fft_{r}"]) for r in range(1, 6)]
    versions = metric_versions()
    for step in run.steps:
        entries = json.loads((run.path / "analysis" / "cache" / f"step_{step:07d}.json").read_text())["metrics"]
        assert sorted(entries) == sorted(default_metrics()), step
        assert all(entries[n]["version"] == versions[n] for n in default_metrics()), step
        assert all(entries[n]["keys"] == keys for n in METRICS if METRICS[n].uses_keys), step


@pytest.mark.parametrize("name", sorted(REFERENCE_RUNS))
def test_shipped_trajectory_analysed_without_writing_and_in_place_from_cache(name, tmp_path, monkeypatch, geolens):
    monkeypatch.delenv("GEOLENS_CHECKPOINTS", raising=False)
    shipped = reference_path(name)
    before = tree(shipped)
    r = geolens("analyze", "--run", shipped, "--out", tmp_path / "out", "--static", "", "--quiet")
    assert r.returncode == 0 and "0 metric evaluations computed" in r.stdout, r.stdout + r.stderr
    assert (tmp_path / "out" / "metrics.csv").read_bytes() == (shipped / "analysis" / "metrics.csv").read_bytes()
    r = geolens("probe", "--run", shipped, "--step", str(load_run(shipped).events["onset_095"]))
    assert r.returncode == 0 and "key frequencies" in r.stdout
    assert tree(shipped) == before
    # a writable clone: analyse in place, from the shipped cache
    clone = tmp_path / "clone"
    shutil.copytree(shipped, clone)
    r = geolens("analyze", "--run", clone, "--static", "", "--quiet")
    assert r.returncode == 0 and "0 metric evaluations computed" in r.stdout
    assert (clone / "analysis" / "metrics.csv").read_bytes() == (shipped / "analysis" / "metrics.csv").read_bytes()


def test_a_read_only_copy_of_a_shipped_trajectory_is_analysed_elsewhere(tmp_path, monkeypatch, geolens):
    """chmod -R a-w on a copy: analyze --out and probe work and change nothing; without --out the
    analysis is refused with the fix (only checked when not root: root writes through a-w)."""
    monkeypatch.delenv("GEOLENS_CHECKPOINTS", raising=False)
    copy = tmp_path / "ro"
    shutil.copytree(reference_path("ln"), copy)
    for p in [copy, *copy.rglob("*")]:
        p.chmod(p.stat().st_mode & ~0o222)
    try:
        before = tree(copy)
        r = geolens("analyze", "--run", copy, "--out", tmp_path / "out", "--metrics", "loss,clock_pizza", "--static", "",
                    "--quiet")
        assert r.returncode == 0 and "0 metric evaluations computed" in r.stdout, r.stdout + r.stderr
        r = geolens("probe", "--run", copy, "--step", "0")
        assert r.returncode == 0 and "epoch 0" in r.stdout
        assert tree(copy) == before
        if os.geteuid() != 0:
            r = geolens("analyze", "--run", copy, "--static", "", "--quiet")
            assert r.returncode == 2 and "pass --out DIR" in one_line_error(r.stderr)
            assert tree(copy) == before
    finally:
        for p in [copy, *copy.rglob("*")]:
            p.chmod(p.stat().st_mode | 0o200)
