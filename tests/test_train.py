"""Training: generalisation and onset detection, bit-identical resume, schedules, run directories."""

import json
import shutil
import subprocess
import time

import pytest
import torch

from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.model.schedule import parse_schedule
from geolens.runs import storage
from geolens.runs.events import onset_events
from geolens.runs.run import load_run
from geolens.runs.storage import load_tensors, read_metrics
from geolens.training import train as training
from geolens.training.batched import train_batched
from geolens.training.recording import run_header
from geolens.training.wait_policy import wait_policy

TINY = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5, lr=1e-3)


def test_small_fully_bounded_run_groks_and_onset_is_detected(tmp_path):
    # The paper's model, fb, lr 1e-3, p = 47 at fraction 0.7: passes 0.95 near epoch 370, holds >= 0.99
    # from about epoch 920 (seed 1, measured with geolens; the paper's code passes 0.95 near 380).
    cfg = make_config("fb", p=47, frac_train=0.7, lr=1e-3, epochs=1500, eval_every=10, early_stop_after=30, seed=1)
    result = training.train(cfg, tmp_path / "run", progress=False)
    run = load_run(result.path)
    assert run.metrics[-1]["test_acc"] >= 0.99
    ev = run.events
    assert ev["onset_095"] is not None and ev["sustained_099"] is not None
    assert ev["onset_095"] <= ev["sustained_099"] < run.metrics[-1]["epoch"] <= 1500
    assert ev["stop_reason"] == "early_stop"
    first = next(r for r in run.metrics if r["test_acc"] > 0.95)
    assert first["epoch"] == ev["onset_095"]
    assert all(r["test_acc"] >= 0.99 for r in run.metrics if r["epoch"] >= ev["sustained_099"])
    # dense trajectory: checkpoints at start, end and around the transition
    assert run.steps[0] == 0 and run.steps[-1] == run.metrics[-1]["epoch"]
    assert any(ev["onset_095"] - 100 <= s <= ev["onset_095"] + 100 for s in run.steps)
    model = run.model_at(run.steps[-1])
    x, y = run.dataset.test
    assert (model(x)[:, -1].argmax(-1) == y).float().mean() >= 0.99


def _state(path):
    run = load_run(path)
    return run.model_at(run.steps[-1]).state_dict(), run


def _strip(rows):
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]


def test_resume_equals_uninterrupted_bit_for_bit(tmp_path):
    cfg = make_config("ln", epochs=60, eval_every=5, checkpoints="every:20", seed=2, **TINY)
    training.train(cfg, tmp_path / "full", progress=False)
    training.train(cfg.replace(epochs=40), tmp_path / "part", progress=False)
    training.resume(tmp_path / "part", progress=False, epochs=60)
    full, run_full = _state(tmp_path / "full")
    part, run_part = _state(tmp_path / "part")
    assert all(torch.equal(full[k], part[k]) for k in full)
    assert _strip(run_full.metrics) == _strip(run_part.metrics)
    assert run_full.steps == run_part.steps
    # run.json says who trained which part: the new run from 0, the resume from 40, both this checkout
    # on this machine (the CPU, its vector instruction set and the thread count set the float order)
    this, here = storage.source_commit(), {**storage.machine(torch.device("cpu")), "omp_wait_policy": wait_policy()}
    assert run_full.header["segments"] == [{"from_epoch": 0, "geolens": run_full.header["versions"]["geolens"],
                                            "geolens_commit": this, "machine": here}]
    assert [(s["from_epoch"], s["geolens_commit"], s["machine"]) for s in run_part.header["segments"]] == [
        (0, this, here), (40, this, here)]
    assert here["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert here["torch_threads"] == torch.get_num_threads() and here["cpu"] and "gpu" not in here



def test_segments_drop_a_resume_whose_epochs_are_trained_again():
    # a resume from 40 that was killed before its next checkpoint is resumed from 40 again: the second
    # one trains those epochs, so the first one no longer names anyone's work
    cfg = make_config("fb", **TINY)
    prev = {"segments": [{"from_epoch": 0, "geolens": "0.1.0", "geolens_commit": "a"},
                         {"from_epoch": 40, "geolens": "0.1.0", "geolens_commit": "b"}]}
    segments = run_header(cfg, "fast", "", 1, 1, 40, prev, device=torch.device("cpu"))["segments"]
    assert [(s["from_epoch"], s["geolens_commit"]) for s in segments] == [(0, "a"), (40, storage.source_commit())]
    old = run_header(cfg, "fast", "", 1, 1, 40, {"versions": {"geolens": "0.0.9"}},
                     device=torch.device("cpu"))["segments"]  # before segments
    assert [(s["from_epoch"], s["geolens"], s["geolens_commit"]) for s in old][0] == (0, "0.0.9", None)


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_names_the_checkout_a_file_is_tracked_in(tmp_path):
    def git(*args):
        subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                       check=True, capture_output=True)

    repo = tmp_path / "repo"
    (repo / "pkg").mkdir(parents=True)
    (repo / ".gitignore").write_text("venv/\n")
    module = repo / "pkg" / "mod.py"
    module.write_text("x = 1\n")
    assert storage.git_commit(module) is None  # not a git checkout
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    sha = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True).stdout.strip()
    storage.git_commit.cache_clear()
    assert storage.git_commit(module) == sha and len(sha) == 40
    module.write_text("x = 2\n")
    storage.git_commit.cache_clear()
    assert storage.git_commit(module) == sha + "+dirty"
    installed = repo / "venv" / "site-packages" / "pkg" / "mod.py"  # ignored: a wheel installed in a venv
    installed.parent.mkdir(parents=True)
    installed.write_text("x = 1\n")
    assert storage.git_commit(installed) is None
    storage.git_commit.cache_clear()


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_git_commit_is_dirty_when_analyses_or_pyproject_differ(tmp_path):
    """The commit covers what analyses/clean_tree.sh covers: the package, analyses/ and pyproject.toml."""
    def git(*args):
        return subprocess.run(["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@t", *args],
                              check=True, capture_output=True, text=True).stdout.strip()

    repo = tmp_path / "repo"
    for rel in ("pkg/__init__.py", "analyses/table.py", "pyproject.toml", "docs/a.md"):
        (repo / rel).parent.mkdir(parents=True, exist_ok=True)
        (repo / rel).write_text("x = 1\n")
    git("init", "-q")
    git("add", ".")
    git("commit", "-q", "-m", "first")
    sha, module = git("rev-parse", "HEAD"), repo / "pkg" / "__init__.py"

    def commit():
        storage.git_commit.cache_clear()
        return storage.git_commit(module, storage.SOURCE_SIBLINGS)

    assert commit() == sha
    (repo / "docs" / "a.md").write_text("x = 2\n")  # outside what a record's commit covers
    assert commit() == sha
    (repo / "analyses" / "table.py").write_text("x = 2\n")
    assert commit() == sha + "+dirty"
    git("checkout", "--", "analyses")
    (repo / "pyproject.toml").write_text("x = 2\n")
    assert commit() == sha + "+dirty"
    git("checkout", "--", "pyproject.toml")
    (repo / "analyses" / "new.py").write_text("x = 1\n")  # untracked counts, as in clean_tree.sh
    assert commit() == sha + "+dirty"
    storage.git_commit.cache_clear()


def test_killed_run_resumes_bit_identically(tmp_path, monkeypatch):
    cfg = make_config("sphere", epochs=50, eval_every=5, checkpoints="every:10", seed=3, **TINY)
    training.train(cfg, tmp_path / "full", progress=False)

    real_eval = training._evaluate

    def dying_eval(model, probe, forward, epoch, *args):
        if epoch == 35:
            raise KeyboardInterrupt  # killed between checkpoints 30 and 40
        return real_eval(model, probe, forward, epoch, *args)

    monkeypatch.setattr(training, "_evaluate", dying_eval)
    with pytest.raises(KeyboardInterrupt):
        training.train(cfg, tmp_path / "killed", progress=False)
    monkeypatch.setattr(training, "_evaluate", real_eval)
    assert max(r["epoch"] for r in read_metrics(tmp_path / "killed" / "metrics.csv")) == 30
    training.resume(tmp_path / "killed", progress=False)
    full, run_full = _state(tmp_path / "full")
    resumed, run_resumed = _state(tmp_path / "killed")
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert _strip(run_full.metrics) == _strip(run_resumed.metrics)


def _slow_writes(monkeypatch, seconds, fail_at: str | None = None):
    """Every file write waits `seconds` first, so the background writer lags behind training; the
    write of a file whose name starts with `fail_at` fails as on a full disk."""
    real = storage.atomic_write_bytes

    def slow(path, data):
        time.sleep(seconds)
        if fail_at is not None and path.name.startswith(fail_at):
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(storage, "atomic_write_bytes", slow)


def _files(path):
    return {f.relative_to(path).as_posix(): f.read_bytes() for f in sorted(path.rglob("*")) if f.is_file()}


@pytest.mark.parametrize("batched", [False, True], ids=["single", "batched"])
def test_lagging_writer_writes_each_checkpoint_as_it_was(tmp_path, monkeypatch, batched):
    # Checkpoint writes run in the background; with every write slowed down the training runs ahead of
    # them, and each checkpoint and resume state must still hold the weights and optimizer state of its
    # own epoch: the same bytes as a run whose writer keeps up.
    cfg = make_config("ln", epochs=40, eval_every=2, checkpoints="every:4", seed=5, **TINY)

    def run(out):
        if batched:
            train_batched([cfg], [out], progress=False)
        else:
            training.train(cfg, out, progress=False)

    run(tmp_path / "prompt")
    _slow_writes(monkeypatch, 0.02)
    run(tmp_path / "lagging")
    prompt, lagging = _files(tmp_path / "prompt"), _files(tmp_path / "lagging")
    assert prompt.keys() == lagging.keys() and len([k for k in prompt if k.startswith("checkpoints/step_")]) == 11
    for name in prompt:
        if name not in ("run.json", "metrics.csv"):  # they hold wall times
            assert prompt[name] == lagging[name], name
    assert _strip(read_metrics(tmp_path / "prompt" / "metrics.csv")) == _strip(read_metrics(tmp_path / "lagging" / "metrics.csv"))
    assert json.loads(lagging["run.json"])["status"] == "finished"


def test_failed_checkpoint_write_stops_the_run_and_it_resumes(tmp_path, monkeypatch):
    cfg = make_config("fb", epochs=50, eval_every=5, checkpoints="every:10", seed=6, **TINY)
    training.train(cfg, tmp_path / "full", progress=False)
    with monkeypatch.context() as m:  # slow too, so later checkpoints are queued behind the failing one
        _slow_writes(m, 0.05, fail_at="step_0000020")
        with pytest.raises(OSError, match="No space left"):
            training.train(cfg, tmp_path / "failed", progress=False)
    run = tmp_path / "failed"
    assert [m["step"] for m in json.loads((run / "checkpoints" / "manifest.json").read_text())] == [0, 10]
    assert int(load_tensors(run / "resume.safetensors")["epoch"]) == 10  # nothing written after the failure
    training.resume(run, progress=False)
    full, run_full = _state(tmp_path / "full")
    resumed, run_resumed = _state(run)
    assert all(torch.equal(full[k], resumed[k]) for k in full)
    assert _strip(run_full.metrics) == _strip(run_resumed.metrics)


def test_background_writer_runs_jobs_in_order_and_stops_at_a_failure():
    done = []

    def job(i):
        time.sleep(0.01)
        if i == 3:
            raise OSError("disk full")
        done.append(i)

    # an interrupted block still runs every queued job before it leaves, even with the queue full
    with pytest.raises(KeyboardInterrupt):
        with storage.BackgroundWriter(max_pending=1) as writer:
            for i in range(3):
                writer.submit(job, i)
            raise KeyboardInterrupt
    assert done == [0, 1, 2]
    done.clear()
    with pytest.raises(OSError, match="disk full"):
        with storage.BackgroundWriter(max_pending=8) as writer:
            for i in range(6):
                writer.submit(job, i)
    assert done == [0, 1, 2]  # nothing after the failed job


def test_same_seed_same_run(tmp_path):
    cfg = make_config("rms", epochs=20, eval_every=5, seed=4, **TINY)
    training.train(cfg, tmp_path / "a", progress=False)
    training.train(cfg, tmp_path / "b", progress=False)
    a, _ = _state(tmp_path / "a")
    b, _ = _state(tmp_path / "b")
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_run_directory_contents(tmp_path):
    cfg = make_config("fb", epochs=20, eval_every=5, **TINY)
    training.train(cfg, tmp_path / "r", progress=False)
    header = json.loads((tmp_path / "r" / "run.json").read_text())
    assert header["format"] == "geolens-run" and header["config"]["norm"] == "sphere"
    assert {"torch", "transformer-lens", "python", "geolens"} <= set(header["versions"])
    manifest = json.loads((tmp_path / "r" / "checkpoints" / "manifest.json").read_text())
    assert [m["step"] for m in manifest] == load_run(tmp_path / "r").steps
    assert (tmp_path / "r" / manifest[0]["file"]).exists()
    rows = read_metrics(tmp_path / "r" / "metrics.csv")
    assert [r["epoch"] for r in rows] == [0, 5, 10, 15, 20]
    assert all(r["weight_norm"] > 0 and r["grad_norm"] > 0 and r["max_abs_logit"] <= 10 + 1e-5 for r in rows)
    assert not list((tmp_path / "r").rglob("*.pt")) and not list((tmp_path / "r").rglob("*.pkl"))


def test_existing_out_is_refused_and_untouched(tmp_path):
    cfg = make_config("fb", epochs=10, eval_every=5, **TINY)
    training.train(cfg, tmp_path / "r", progress=False)
    before = {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()}
    with pytest.raises(GeoError, match="already exists"):
        training.train(cfg, tmp_path / "r", progress=False)
    assert before == {p: p.read_bytes() for p in (tmp_path / "r").rglob("*") if p.is_file()}
    with pytest.raises(GeoError, match="already at epoch 10"):
        training.resume(tmp_path / "r", progress=False)
    with pytest.raises(GeoError, match="cannot change"):
        training.resume(tmp_path / "r", progress=False, lr=1.0)


def test_corrupt_and_foreign_runs_give_clear_errors(tmp_path):
    cfg = make_config("fb", epochs=10, eval_every=5, checkpoints="every:5", **TINY)
    training.train(cfg, tmp_path / "r", progress=False)
    run = load_run(tmp_path / "r")
    ckpt = tmp_path / "r" / "checkpoints" / "step_0000005.safetensors"
    ckpt.write_bytes(b"garbage")
    with pytest.raises(GeoError, match="step_0000005.safetensors is corrupt"):
        run.model_at(5)
    with pytest.raises(GeoError, match="nearest is 5"):
        run.model_at(6)
    header = json.loads((tmp_path / "r" / "run.json").read_text())
    (tmp_path / "r" / "run.json").write_text(json.dumps({**header, "format_version": 99}))
    with pytest.raises(GeoError, match="run format 99"):
        load_run(tmp_path / "r")
    with pytest.raises(GeoError, match="does not exist"):
        load_run(tmp_path / "nope")


def test_onset_events_definition():
    rows = [{"epoch": e, "test_acc": a} for e, a in [(0, 0.1), (10, 0.96), (20, 0.995), (30, 0.98), (40, 0.99), (50, 1.0)]]
    assert onset_events(rows) == {"onset_095": 10, "sustained_099": 40}
    assert onset_events(rows[:4]) == {"onset_095": 10, "sustained_099": None}


def test_schedules():
    every = parse_schedule("every:100")
    assert every.wants(200, {"step": 100}, {}) and not every.wants(150, {"step": 100}, {})
    log = parse_schedule("log:10")
    kept, last = [], None
    for epoch in range(0, 10001, 10):
        if log.wants(epoch, last, {}):
            kept.append(epoch)
            last = {"step": epoch}
    assert 27 <= len(kept) <= 33  # ~10 per decade over the 3 decades 10..10,000
    ada = parse_schedule("adaptive:500")
    last = {"step": 0, "test_acc": 0.1, "test_loss": 4.0}
    assert not ada.wants(10, last, {"test_acc": 0.11, "test_loss": 3.9})
    assert ada.wants(10, last, {"test_acc": 0.2, "test_loss": 3.9})  # accuracy moved
    assert ada.wants(10, last, {"test_acc": 0.1, "test_loss": 3.0})  # loss moved
    assert ada.wants(500, last, {"test_acc": 0.1, "test_loss": 4.0})  # max gap
    with pytest.raises(GeoError):
        parse_schedule("sometimes")
