"""A run directory is never destroyed, mixed or silently truncated, and every failure is one line.

Each test reproduces a way a careful user can hurt a run (kill, corrupt, misuse, run twice) and
checks the data survives and the message names the problem and the fix.
"""

import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch
from conftest import TINY, geolens_process, one_line_error

from geolens.analysis.run_analysis import load_run
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.runs.runlock import LOCK_NAME, RunLock
from geolens.runs.storage import RunDir, load_tensors, read_metrics
from geolens.training import train as training

SMALL = dict(p=23, frac_train=0.5, d_model=32, n_heads=4, d_head=8, d_mlp=64, lr=1e-3)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (except the lock record) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != LOCK_NAME}


def trained(tmp_path, name="run", epochs=20, **kw) -> Path:
    cfg = make_config("fb", epochs=epochs, eval_every=5, checkpoints="every:5", seed=1, **{**SMALL, **kw})
    return training.train(cfg, tmp_path / name, progress=False).path


def strip(rows):
    return [{k: v for k, v in r.items() if k != "elapsed_s"} for r in rows]


def same_run(a: Path, b: Path) -> None:
    """Two runs hold the same trajectory: checkpoints, manifest, metrics (but elapsed time), events."""
    ra, rb = load_run(a), load_run(b)
    assert ra.steps == rb.steps and strip(ra.metrics) == strip(rb.metrics) and ra.events == rb.events
    for step in ra.steps:
        sa, sb = ra.model_at(step).state_dict(), rb.model_at(step).state_dict()
        assert all(torch.equal(sa[k], sb[k]) for k in sa)


# ---- never destroy ------------------------------------------------------------------------------
@pytest.mark.parametrize("bad", [["--lr", "-1"], ["--lr", "nan"], ["--wd", "-1"], ["--frac", "0.001"],
                                 ["--set", "n_layers=2", "--set", "engine=fast"], ["--set", "tau=0"]])
def test_force_with_bad_input_keeps_the_old_run(tmp_path, geolens, bad):
    out = trained(tmp_path)
    before = snapshot(out)
    r = geolens("train", "--out", out, "--force", "--quiet", "--epochs", "10", *TINY, *bad)
    assert r.returncode == 2
    one_line_error(r.stderr)
    assert snapshot(out) == before


def test_force_refuses_a_folder_that_is_not_only_a_run(tmp_path, geolens):
    project = tmp_path / "project"
    (project / "src").mkdir(parents=True)
    (project / "src" / "main.py").write_text("print('mine')\n")
    (project / "run.json").write_text("{}")
    before = snapshot(project)
    r = geolens("train", "--out", project, "--force", "--quiet", "--epochs", "5", *TINY)
    assert r.returncode == 2 and "src" in one_line_error(r.stderr) and "--force refused" in r.stderr
    assert snapshot(project) == before


def test_force_keeps_the_old_run_when_the_new_one_fails_before_its_first_checkpoint(tmp_path, monkeypatch):
    out = trained(tmp_path)
    before = snapshot(out)

    def failing(*args, **kwargs):
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried to allocate 99 GB")

    monkeypatch.setattr(training, "_evaluate", failing)
    with pytest.raises(GeoError, match="out of memory"):
        training.train(make_config("ln", epochs=10, seed=2, **SMALL), out, force=True, progress=False)
    assert snapshot(out) == before
    assert [p.name for p in tmp_path.iterdir()] == ["run"]  # no half-built sibling left behind


def test_force_replaces_the_run_once_the_new_one_has_started(tmp_path):
    out = trained(tmp_path)
    training.train(make_config("ln", epochs=10, eval_every=5, seed=2, **SMALL), out, force=True, progress=False)
    run = load_run(out)
    assert run.config.preset == "ln" and run.header["status"] == "finished" and run.steps[-1] == 10
    assert [p.name for p in tmp_path.iterdir()] == ["run"]
    same_run(out, training.train(make_config("ln", epochs=10, eval_every=5, seed=2, **SMALL), tmp_path / "fresh",
                                 progress=False).path)


def test_a_failed_new_run_leaves_no_folder_behind(tmp_path, monkeypatch):
    monkeypatch.setattr(training, "_evaluate", lambda *a, **k: (_ for _ in ()).throw(MemoryError()))
    with pytest.raises(GeoError, match="out of memory"):
        training.train(make_config("fb", epochs=10, **SMALL), tmp_path / "new", progress=False)
    assert not (tmp_path / "new").exists()


# ---- never mix ----------------------------------------------------------------------------------
def wait_for_lock(folder: Path, timeout: float = 120.0) -> dict:
    deadline = time.time() + timeout
    while time.time() < deadline:
        try:
            record = json.loads((folder / LOCK_NAME).read_text())
            if record.get("purpose") and (folder / "resume.safetensors").exists():
                return record
        except (OSError, ValueError):
            pass
        time.sleep(0.2)
    raise AssertionError(f"no writer locked {folder}")


def test_a_second_writer_is_refused_while_the_first_trains_and_sigterm_keeps_the_checkpoints(tmp_path):
    out = tmp_path / "run"
    first = geolens_process("train", "--out", out, "--quiet", "--epochs", "100000", "--eval-every", "5",
                            "--checkpoints", "every:20", *TINY)
    try:
        holder = wait_for_lock(out)
        assert holder["pid"] == first.pid
        second = geolens_process("train", "--out", out, "--quiet", "--epochs", "10", "--set", "seed=2", *TINY)
        _, err = second.communicate(timeout=120)
        assert second.returncode == 2 and f"in use by process {first.pid}" in one_line_error(err)
        resumed = geolens_process("train", "--out", out, "--resume", "--quiet", "--epochs", "200000")
        _, err = resumed.communicate(timeout=120)
        assert resumed.returncode == 2 and f"in use by process {first.pid}" in one_line_error(err)
    finally:
        first.send_signal(signal.SIGTERM)
        _, err = first.communicate(timeout=120)
    assert first.returncode == 143 and "terminated" in err and "--resume" in err and "Traceback" not in err
    run = load_run(out)
    assert run.config.seed == 0 and run.header["status"] == "running"
    epoch = int(load_tensors(out / "resume.safetensors")["epoch"])
    assert epoch == run.steps[-1] and epoch % 20 == 0
    # the terminated run resumes to exactly the run that was never stopped
    r = geolens_process("train", "--out", out, "--resume", "--quiet", "--epochs", str(epoch + 20))
    assert r.wait(timeout=120) == 0
    reference = training.train(make_config("fb", epochs=epoch + 20, eval_every=5, checkpoints="every:20", seed=0,
                                           **{k: v for k, v in SMALL.items() if k != "lr"}),
                               tmp_path / "reference", progress=False).path
    same_run(out, reference)


def test_a_stale_lock_of_a_dead_process_is_taken_over(tmp_path):
    out = trained(tmp_path, epochs=10)
    (out / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "gone", "purpose": "train", "command": "x"}))
    training.resume(out, progress=False, epochs=15)
    assert load_run(out).steps[-1] == 15


def test_resume_and_analysis_wait_their_turn(tmp_path):
    out = trained(tmp_path, epochs=10)
    with RunLock(out, "train"):
        with pytest.raises(GeoError, match=f"in use by process {os.getpid()}"):
            training.resume(out, progress=False, epochs=15)
    (out / "analysis").mkdir()
    with RunLock(out / "analysis", "analyze"):
        with pytest.raises(GeoError, match="in use by process"):
            load_run(out).analyze(["loss"])
    assert load_run(out).analyze(["loss"]).values[10]["loss"]["acc_train"] >= 0


# ---- never truncate silently ----------------------------------------------------------------------
def test_a_deleted_manifest_is_reported_then_rebuilt_exactly_on_resume(tmp_path, geolens):
    full = trained(tmp_path, "full", epochs=30)
    out = trained(tmp_path, "part", epochs=20)
    manifest = (out / "checkpoints" / "manifest.json").read_bytes()
    (out / "checkpoints" / "manifest.json").unlink()
    r = geolens("info", "--run", out)
    assert r.returncode == 1 and "damaged" in r.stdout and "not in the manifest" in r.stdout
    r = geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "")
    assert r.returncode == 2 and "geolens repair" in one_line_error(r.stderr)
    with pytest.warns(UserWarning, match="rebuilt checkpoints/manifest.json from 5 checkpoint files"):
        training.resume(out, progress=False, epochs=30)
    same_run(out, full)
    assert json.loads((out / "checkpoints" / "manifest.json").read_bytes())[:5] == json.loads(manifest)


def test_repair_rebuilds_a_deleted_manifest_byte_for_byte(tmp_path, geolens):
    out = trained(tmp_path, epochs=20)
    manifest = (out / "checkpoints" / "manifest.json").read_bytes()
    (out / "checkpoints" / "manifest.json").unlink()
    r = geolens("repair", "--run", out)
    assert r.returncode == 0 and "rebuilt checkpoints/manifest.json from 5 checkpoint files" in r.stdout
    assert (out / "checkpoints" / "manifest.json").read_bytes() == manifest
    assert geolens("info", "--run", out).returncode == 0


@pytest.mark.parametrize("damage", ["empty", "truncated"])
def test_resume_refuses_a_truncated_metrics_table(tmp_path, geolens, damage):
    out = trained(tmp_path, epochs=20)
    csv = out / "metrics.csv"
    lines = csv.read_text().splitlines(keepends=True)
    csv.write_text("" if damage == "empty" else "".join(lines[:3]))
    before = snapshot(out)
    r = geolens("train", "--out", out, "--resume", "--quiet", "--epochs", "30")
    assert r.returncode == 2
    assert "metrics.csv" in one_line_error(r.stderr) and "cannot be rebuilt" in r.stderr
    assert snapshot(out) == before
    assert geolens("info", "--run", out).returncode == 1


def test_a_corrupt_checkpoint_of_a_finished_run_is_reported_and_its_fix_works(tmp_path, geolens):
    out = trained(tmp_path, epochs=20)
    bad = out / "checkpoints" / "step_0000010.safetensors"
    bad.write_bytes(bad.read_bytes()[:100])
    r = geolens("info", "--run", out)
    assert r.returncode == 1 and "checkpoint 10 is damaged" in r.stdout and "finished" in r.stdout
    r = geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "")
    assert r.returncode == 2 and "geolens repair" in one_line_error(r.stderr)
    r = geolens("repair", "--run", out)
    assert r.returncode == 0 and "moved damaged checkpoint 10" in r.stdout
    assert (out / "checkpoints" / "damaged" / bad.name).exists()  # set aside, not deleted
    assert load_run(out).steps == [0, 5, 15, 20]
    r = geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "")
    assert r.returncode == 0, r.stderr
    assert geolens("info", "--run", out).returncode == 0


def test_a_missing_checkpoint_file_is_dropped_by_repair(tmp_path, geolens):
    out = trained(tmp_path, epochs=20)
    (out / "checkpoints" / "step_0000005.safetensors").unlink()
    r = geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "")
    assert r.returncode == 2 and "listed in the manifest but missing" in one_line_error(r.stderr)
    assert geolens("repair", "--run", out).returncode == 0
    assert load_run(out).steps == [0, 10, 15, 20]
    assert geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "").returncode == 0


def test_a_killed_analysis_takes_its_workers_with_it(tmp_path):
    out = trained(tmp_path, epochs=60)  # 13 checkpoints
    proc = geolens_process("analyze", "--run", out, "--quiet", "--workers", "2", "--static", "")
    try:
        deadline, children = time.time() + 120, []
        while time.time() < deadline and not children:
            children = [int(c) for c in Path(f"/proc/{proc.pid}/task/{proc.pid}/children").read_text().split()]
            time.sleep(0.2)
        assert children, "analyze started no worker"
        time.sleep(1.0)
    finally:
        proc.kill()
        proc.wait()
    # a worker still importing when its parent dies ends as soon as its initializer runs (seconds on a busy box)
    deadline = time.time() + 90
    while time.time() < deadline and any(Path(f"/proc/{c}").exists() and "Z" not in _state(c) for c in children):
        time.sleep(0.2)
    assert not [c for c in children if Path(f"/proc/{c}").exists() and "Z" not in _state(c)]


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "Z"


# ---- one line, always -----------------------------------------------------------------------------
@pytest.mark.parametrize("content,needle", [
    (b"\xff\xfe{}", "not UTF-8"),
    (b"[1, 2]", "expected a JSON object"),
    (b'{"format": "geolens-run", "format_version": 1}', "no 'config' object"),
])
def test_a_damaged_run_json_is_one_line(tmp_path, geolens, content, needle):
    out = trained(tmp_path, epochs=5)
    (out / "run.json").write_bytes(content)
    for args in (["info", "--run", out], ["analyze", "--run", out, "--quiet"], ["train", "--resume", "--out", out]):
        r = geolens(*args)
        assert r.returncode == 2 and needle in one_line_error(r.stderr)


@pytest.mark.parametrize("edit,needle", [
    (lambda c: {**c, "p": "23"}, "config field 'p' = '23' is a str"),
    (lambda c: {**c, "d_mlp": 100_000_000_000}, "needs about"),
    (lambda c: {**c, "lr": -1.0}, "lr = -1.0 must be"),
])
def test_a_crafted_config_is_refused_in_one_line(tmp_path, geolens, edit, needle):
    out = trained(tmp_path, epochs=5)
    header = json.loads((out / "run.json").read_text())
    (out / "run.json").write_text(json.dumps({**header, "config": edit(header["config"])}))
    before = snapshot(out)
    r = geolens("train", "--resume", "--out", out, "--epochs", "10", "--quiet")
    assert r.returncode == 2 and needle in one_line_error(r.stderr)
    assert snapshot(out) == before


def test_a_manifest_step_that_is_not_an_integer_is_one_line(tmp_path, geolens):
    out = trained(tmp_path, epochs=10)
    path = out / "checkpoints" / "manifest.json"
    path.write_text(path.read_text().replace('"step": 5', '"step": "5"'))
    r = geolens("analyze", "--run", out, "--quiet")
    assert r.returncode == 2 and "manifest.json is corrupt" in one_line_error(r.stderr)
    r = geolens("info", "--run", out)
    assert r.returncode == 1 and "manifest.json is corrupt" in r.stdout


def test_a_full_disk_stops_the_run_in_one_line_and_it_resumes(tmp_path, geolens, monkeypatch):
    from geolens.runs import storage

    out = tmp_path / "run"
    real = storage.atomic_write_bytes
    writes = {"n": 0}

    def filling(path, data):
        writes["n"] += 1
        if writes["n"] > 12:
            raise OSError(28, "No space left on device", str(path))
        real(path, data)

    monkeypatch.setattr(storage, "atomic_write_bytes", filling)
    r = geolens("train", "--out", out, "--quiet", "--epochs", "50", "--eval-every", "5", "--checkpoints", "every:5",
                *TINY)
    assert r.returncode == 2 and "No space left on device" in one_line_error(r.stderr)
    monkeypatch.setattr(storage, "atomic_write_bytes", real)
    assert geolens("train", "--out", out, "--resume", "--quiet").returncode == 0
    assert load_run(out).steps[-1] == 50


def test_an_unwritable_folder_is_one_line(tmp_path, geolens, monkeypatch):
    out = trained(tmp_path, epochs=5)
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = geolens("train", "--out", blocker / "run", "--quiet", *TINY)
    assert r.returncode == 2 and "choose a writable --out" in one_line_error(r.stderr)
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).endswith(LOCK_NAME):
            raise PermissionError(13, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(os, "open", read_only)
    r = geolens("train", "--out", out, "--resume", "--epochs", "10", "--quiet")
    assert r.returncode == 2 and "copy the run somewhere writable" in one_line_error(r.stderr)
    r = geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "")
    assert r.returncode == 2 and "--out" in one_line_error(r.stderr)


def test_a_run_that_cannot_fit_in_memory_is_refused_before_anything_is_written(tmp_path, geolens, monkeypatch):
    monkeypatch.setattr("geolens.training.resources.available_bytes", lambda device: 8 << 30)
    r = geolens("train", "--out", tmp_path / "big", "--p", "997", "--quiet")
    assert r.returncode == 2 and "GiB of memory" in one_line_error(r.stderr) and "p = 997" in r.stderr
    assert not (tmp_path / "big").exists()


@pytest.mark.parametrize("out", ["new[/b]", "x[link=https:example.org]y", "[red]z"])
def test_paths_with_rich_markup_are_printed_as_they_are(tmp_path, geolens, out):
    r = geolens("train", "--out", tmp_path / out, "--quiet", "--epochs", "5", *TINY)
    assert r.returncode == 0, r.stderr
    assert out in r.stdout.replace("\n", "")
    r = geolens("train", "--out", tmp_path / "y", "--preset", out, "--quiet", *TINY)
    assert r.returncode == 2 and f"unknown preset '{out.split('+')[0]}'" in one_line_error(r.stderr)


def tiny_except(flag: str) -> list[str]:
    """TINY without `flag` and its value (an option given twice is refused)."""
    i = TINY.index(flag) if flag in TINY and flag != "--set" else None
    return TINY if i is None else TINY[:i] + TINY[i + 2 :]


@pytest.mark.parametrize("args,needle", [
    (["--set", "tau=0"], "tau = 0.0 must be a finite number > 0"),
    (["--p", "2"], "p = 2 is too small"),
    (["--early-stop", "-1"], "early_stop_after = -1 must be >= 0"),
    (["--lr", "nan"], "lr = nan must be"),
])
def test_nonsense_settings_are_refused(tmp_path, geolens, args, needle):
    r = geolens("train", "--out", tmp_path / "x", "--quiet", *tiny_except(args[0]), *args)
    assert r.returncode == 2 and needle in one_line_error(r.stderr)
    assert not (tmp_path / "x").exists()


def test_a_one_example_test_split_trains_with_a_warning(tmp_path, geolens):
    r = geolens("train", "--out", tmp_path / "x", "--quiet", "--epochs", "5", *tiny_except("--frac"), "--frac", "0.999")
    assert r.returncode == 0
    warning = [line for line in r.stderr.splitlines() if line.startswith("warning:")]
    assert len(warning) == 1 and "test split has only 1 example" in warning[0]


# ---- symlinks and sizes -----------------------------------------------------------------------------
def test_an_analysis_folder_symlinked_out_of_the_run_is_refused(tmp_path, geolens):
    out = trained(tmp_path, epochs=5)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "analysis").symlink_to(elsewhere)
    r = geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "")
    assert r.returncode == 2 and "is a symlink" in one_line_error(r.stderr)
    assert list(elsewhere.iterdir()) == []
    r = geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "", "--out", tmp_path / "mine")
    assert r.returncode == 0 and (tmp_path / "mine" / "metrics.csv").exists()


def test_a_checkpoint_is_read_only_up_to_its_declared_size(tmp_path, geolens):
    out = trained(tmp_path, epochs=10)
    ckpt = out / "checkpoints" / "step_0000005.safetensors"
    ckpt.unlink()
    ckpt.symlink_to("/dev/zero")  # endless: reading it whole would never finish
    r = geolens("analyze", "--run", out, "--quiet", "--metrics", "loss", "--static", "")
    assert r.returncode == 2 and "not a regular file" in one_line_error(r.stderr)
    good = out / "checkpoints" / "step_0000010.safetensors"
    good.write_bytes(good.read_bytes() + b"\0" * 4096)
    with pytest.raises(GeoError, match="declared"):
        load_tensors(good)


# ---- usage errors and steps outside the trajectory --------------------------------------------------
@pytest.mark.parametrize("args,needle", [
    ([], "geolens needs a command"),
    (["probe", "--run", "x", "--step", "abc"], "Invalid value for '--step'"),
    (["train"], "Missing option '--out'"),
    (["trian"], "No such command 'trian'"),
])
def test_usage_errors_are_one_line_with_exit_2(geolens, args, needle):
    r = geolens(*args)
    assert r.returncode == 2 and needle in one_line_error(r.stderr) and "--help" in r.stderr


def test_steps_outside_the_trajectory_are_refused(tmp_path, geolens):
    out = trained(tmp_path, epochs=10)
    for args in (["probe", "--run", out, "--step", "99999"], ["analyze", "--run", out, "--steps", "-50", "--quiet"]):
        r = geolens(*args)
        assert r.returncode == 2 and "outside the trajectory" in one_line_error(r.stderr)
    with pytest.raises(GeoError, match="not an integer epoch"):
        load_run(out).probe("400")
    assert RunDir(out).exists() and read_metrics(out / "metrics.csv")[-1]["epoch"] == 10


def test_a_checkpoint_replaced_while_it_is_read_is_read_whole(tmp_path, monkeypatch):
    # a reader of a training run (resume state, a sweep's poll) can meet the writer's atomic replace
    # between the header and the data: it must get one version whole, never a mix
    from safetensors.torch import save_file

    import geolens.runs.storage as storage

    path = tmp_path / "resume.safetensors"
    save_file({"w": torch.zeros(3)}, str(path))
    real = storage._read_header

    def replaced_after_header(f):
        found = real(f)
        save_file({"w": torch.ones(50), "m": torch.ones(50)}, str(tmp_path / "new"))
        os.replace(tmp_path / "new", path)  # what atomic_write does
        return found

    monkeypatch.setattr(storage, "_read_header", replaced_after_header)
    assert load_tensors(path)["w"].tolist() == [0.0, 0.0, 0.0]
