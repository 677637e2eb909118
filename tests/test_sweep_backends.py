"""Sweeps on real backends: local worker processes (1 and 2 workers) and Ray on a local instance bound
to 127.0.0.1 give the same run directories; a sweep whose driver is killed (SIGKILL) leaves no worker
training and, rerun, ends with the same run directories as an uninterrupted one; a failed job is
recorded and the sweep exits non-zero."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from geolens.cli import app
from geolens.runs.storage import load_tensors
from geolens.sweeps.grid import make_grid
from geolens.sweeps.sweep import run_sweep

ROOT = Path(__file__).resolve().parents[1]
# two stacks (fb and ln, 3 seeds each: a member alone would be stacked with a copy), ln longer; every
# job uses one torch thread: LayerNorm gains' gradients are reduced over the batch in a float order
# that depends on the thread count (docs/cli.md), so equal results need equal --threads
GRID = ["--preset", "fb,ln", "--lr", "3e-3", "--seeds", "1-3", "--p", "23", "--frac", "0.5", "--epochs", "ln=300,200",
        "--eval-every", "10", "--checkpoints", "every:20", "--set", "d_model=32", "--set", "d_head=8", "--set",
        "d_mlp=64", "--threads", "1", "--quiet"]
RAY_TASK = "ray::_ray_task"  # the process title of a Ray worker running a sweep job
MEMBERS = [f"p23/{preset}/lr3e-3/seed_{s}" for preset in ("fb", "ln") for s in (1, 2, 3)]


def _sweep(out, *extra):
    app(["sweep", *GRID, *extra, "--out", str(out)], standalone_mode=False)


def _assert_same_sweep(a, b, check):
    for name in MEMBERS:
        check(a / name, b / name)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The grid swept with one local worker."""
    out = tmp_path_factory.mktemp("reference") / "sw"
    _sweep(out, "--workers", "1")
    return out


@pytest.fixture(scope="module")
def ray_address():
    """One local Ray instance for the module, bound to 127.0.0.1 (its workers inherit PYTHONPATH)."""
    import ray

    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False,
             logging_level="ERROR")
    try:
        yield ray.get_runtime_context().gcs_address
    finally:
        ray.shutdown()


def test_reference_sweep(reference, capsys):
    record = json.loads((reference / "sweep.json").read_text())
    assert record["layout"] == "nested" and record["jobs"] == 2 and record["finished"]
    assert [(m["name"], m["status"]) for m in record["members"]] == [(n, "finished") for n in MEMBERS]
    from geolens.runs.run import load_run

    for name in MEMBERS:
        run = load_run(reference / name)
        assert run.header["status"] == "finished" and run.header["timing"]["members"] == 3
        assert run.events["final_epoch"] == (300 if "/ln/" in name else 200)
        assert run.steps == list(range(0, run.events["final_epoch"] + 1, 20))


def test_two_workers_give_the_same_run_directories(reference, tmp_path, assert_identical_runs):
    _sweep(tmp_path / "sw", "--workers", "2")
    _assert_same_sweep(reference, tmp_path / "sw", assert_identical_runs)


def test_ray_backend_gives_the_same_run_directories(reference, ray_address, tmp_path, assert_identical_runs):
    _sweep(tmp_path / "sw", "--backend", "ray", "--address", ray_address, "--workers", "2")
    record = json.loads((tmp_path / "sw" / "sweep.json").read_text())
    assert record["backend"].startswith("ray") and record["jobs"] == 2
    _assert_same_sweep(reference, tmp_path / "sw", assert_identical_runs)


def _children(pid):
    """Processes whose parent is `pid`."""
    out = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid:
            out.append(int(stat.parent.name))
    return out


def _running(pid):
    """Whether `pid` is a live process (not gone, not a zombie)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _tasks_running(title):
    """Pids of processes whose command line contains `title` (Ray names a worker after its task)."""
    out = []
    for cmd in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            if title in cmd.read_bytes().decode(errors="replace") and _running(int(cmd.parent.name)):
                out.append(int(cmd.parent.name))
        except OSError:
            continue
    return out


def _kill_mid_run(out, *extra):
    """Start the sweep as a `python -m geolens` driver, SIGKILL it once a member has a checkpoint past
    epoch 0; returns the driver's child processes and the running Ray tasks just before the kill."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    driver = subprocess.Popen([sys.executable, "-m", "geolens", "sweep", *GRID, *extra, "--out", str(out)], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline and driver.poll() is None:
            states = list(out.glob("p23/*/*/seed_*/resume.safetensors"))
            if any(int(load_tensors(f)["epoch"]) >= 20 for f in _readable(states)):
                break
            time.sleep(0.05)
        assert driver.poll() is None, f"the sweep ended before it was killed: {driver.stderr.read().decode()}"
        children, tasks = _children(driver.pid), _tasks_running(RAY_TASK)
        driver.send_signal(signal.SIGKILL)
        driver.wait()
        return children, tasks
    finally:
        if driver.poll() is None:
            driver.kill()
            driver.wait()


def _readable(files):
    """The files that exist (a resume state may be replaced while it is read: atomic renames)."""
    return [f for f in files if f.exists()]


def _wait_until(condition, seconds=60):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline and not condition():
        time.sleep(0.2)
    return condition()


def _assert_resumed(out):
    """The members a killed sweep left started and unfinished (at least one)."""
    headers = [json.loads((out / n / "run.json").read_text()) for n in MEMBERS if (out / n / "run.json").exists()]
    unfinished = [h for h in headers if h["status"] != "finished"]
    assert unfinished, "no member was left unfinished by the kill: nothing to resume"
    return unfinished


def test_killed_local_driver_leaves_no_workers_and_resumes(reference, tmp_path, assert_identical_runs):
    out = tmp_path / "sw"
    children, _ = _kill_mid_run(out, "--workers", "2")
    assert len(children) >= 2  # the two workers (and multiprocessing's resource tracker)
    assert _wait_until(lambda: not any(_running(pid) for pid in children)), "orphan worker processes"
    _assert_resumed(out)
    _sweep(out, "--workers", "2")
    record = json.loads((out / "sweep.json").read_text())
    assert "resume" in {m["found"] for m in record["members"]}
    _assert_same_sweep(reference, out, assert_identical_runs)


def test_killed_ray_driver_leaves_no_tasks_and_resumes(reference, ray_address, tmp_path, assert_identical_runs):
    out = tmp_path / "sw"
    _, tasks = _kill_mid_run(out, "--backend", "ray", "--address", ray_address, "--workers", "2")
    assert tasks  # the Ray worker processes running the sweep's jobs
    assert _wait_until(lambda: not any(_running(pid) and pid in _tasks_running(RAY_TASK) for pid in tasks)), \
        "Ray tasks of the killed driver still run"
    _assert_resumed(out)
    _sweep(out, "--backend", "ray", "--address", ray_address, "--workers", "2")
    _assert_same_sweep(reference, out, assert_identical_runs)


def _ln_jobs_fail_in_process(monkeypatch):
    """Jobs run in this process (sweep.LocalBackend.run) and every ln job raises 'disk on fire';
    returns the real sweep.run_job."""
    import geolens.sweeps.sweep as sweep

    real = sweep.run_job

    def broken(job, on_eval=None):
        if job.members[0].cfg.preset == "ln":
            raise RuntimeError("disk on fire")
        return real(job, on_eval)

    monkeypatch.setattr(sweep, "run_job", broken)
    monkeypatch.setattr(sweep.LocalBackend, "run", _in_process_run)
    return real


def test_a_failed_job_is_recorded_and_the_sweep_exits_non_zero(tmp_path, monkeypatch, capsys):
    from geolens.cli import main

    out = tmp_path / "sw"
    # the ln job raises: its members are failed with the error (kept in sweep.json), the fb job trains
    grid = make_grid(flags=dict(presets="fb,ln", seeds="1-2", p="23", frac=0.5, epochs="20", eval_every=10),
                     sets=["d_model=32", "d_head=8", "d_mlp=64"])
    _ln_jobs_fail_in_process(monkeypatch)
    result = run_sweep(grid, out, progress=False)
    assert result.failed == ["p23/ln/lr6e-4/seed_1", "p23/ln/lr6e-4/seed_2"]
    assert result.errors["p23/ln/lr6e-4/seed_1"] == "its stack of 2 failed: RuntimeError: disk on fire"
    record = json.loads((out / "sweep.json").read_text())
    assert [m["status"] for m in record["members"]] == ["finished", "finished", "failed", "failed"]
    assert "disk on fire" in record["members"][2]["traceback"]
    # through the CLI: the table, the errors and a one-line summary, exit 1
    monkeypatch.setenv("COLUMNS", "200")
    monkeypatch.setattr(sys, "argv", ["geolens", "sweep", "--preset", "fb,ln", "--seeds", "1-2", "--p", "23",
                                      "--frac", "0.5", "--epochs", "20", "--eval-every", "10", "--set", "d_model=32",
                                      "--set", "d_head=8", "--set", "d_mlp=64", "--quiet", "--out", str(out)])
    with pytest.raises(SystemExit) as exit_info:
        main()
    assert exit_info.value.code == 1
    captured = capsys.readouterr()
    assert captured.out.count("│ skipped") == 2 and captured.out.count("│ failed") == 2
    assert "error: 2 of 4 members failed" in captured.err and "disk on fire" in captured.err


def _in_process_run(self, jobs, handle):
    """LocalBackend.run without worker processes (so the test can patch run_job)."""
    from geolens.sweeps.sweep import execute

    for job_id, job in enumerate(jobs):
        execute(job_id, job, handle)


def test_sweeps_into_one_folder_keep_each_others_members_in_the_record(tmp_path, monkeypatch):
    # two sweeps share OUT (e.g. one per preset, or one per node): sweep.json keeps the members of both,
    # a failed member's error included, and the later sweep's own entries replace the earlier ones
    import geolens.sweeps.sweep as sweep

    out = tmp_path / "sw"
    small = dict(seeds="1", p="23", frac=0.5, epochs="20", eval_every=10)
    sets = ["d_model=32", "d_head=8", "d_mlp=64"]
    real = _ln_jobs_fail_in_process(monkeypatch)
    run_sweep(make_grid(flags=dict(presets="ln", layout="nested", **small), sets=sets), out, progress=False)
    run_sweep(make_grid(flags=dict(presets="fb", **small), sets=sets), out, progress=False)
    record = json.loads((out / "sweep.json").read_text())
    by_name = {m["name"]: m for m in record["members"]}
    assert sorted(by_name) == ["p23/fb/lr6e-4/seed_1", "p23/ln/lr6e-4/seed_1"]
    assert by_name["p23/fb/lr6e-4/seed_1"]["status"] == "finished"
    assert by_name["p23/ln/lr6e-4/seed_1"]["status"] == "failed"
    assert "disk on fire" in by_name["p23/ln/lr6e-4/seed_1"]["traceback"]
    monkeypatch.setattr(sweep, "run_job", real)  # the ln member retried: its entry is replaced
    run_sweep(make_grid(flags=dict(presets="ln", **small), sets=sets), out, progress=False)
    record = json.loads((out / "sweep.json").read_text())
    assert [(m["name"], m["status"], "error" in m) for m in record["members"]] == [
        ("p23/ln/lr6e-4/seed_1", "finished", False), ("p23/fb/lr6e-4/seed_1", "finished", False)]
