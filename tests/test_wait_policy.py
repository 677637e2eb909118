"""Speed on a shared machine: the OpenMP wait policy chosen from the load before torch starts (it changes no
result), recorded in run.json; a resumed run trains on the thread count it started with (its float order)."""

import os
import subprocess
import sys

import torch

from geolens.model.config import make_config
from geolens.runs.storage import RunDir
from geolens.training import train as training
from geolens.threads import torch_threads
from geolens.training.engine import started_threads
from geolens.training.wait_policy import busy_cores, choose_wait_policy, contended, default_threads, wait_policy

TINY = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5, eval_every=10, checkpoints="every:10")


def test_contended_when_others_keep_busy_the_cores_the_threads_need():
    assert not contended(0.1, cores=2, threads=2)  # a quiet machine: spin
    assert contended(1.0, cores=2, threads=2)  # one busy process beside two threads: sleep at once
    assert not contended(2.0, cores=2, threads=1)  # one thread waits for nobody
    assert not contended(1.0, cores=4, threads=2) and contended(2.6, cores=4, threads=2)


def test_wait_policy_as_recorded_and_the_default_thread_count():
    assert wait_policy({}) == "default"
    assert wait_policy({"OMP_WAIT_POLICY": "PASSIVE"}) == "PASSIVE"
    assert wait_policy({"GOMP_SPINCOUNT": "1000"}) == "GOMP_SPINCOUNT=1000"
    assert default_threads({"OMP_NUM_THREADS": "3"}) == 3
    assert default_threads({}) == len(os.sched_getaffinity(0))
    busy = busy_cores(0.05)
    assert busy is None or 0 <= busy <= len(os.sched_getaffinity(0)) + 0.01


def test_choose_changes_nothing_once_torch_is_loaded_or_when_the_user_chose():
    env = {"OMP_NUM_THREADS": "2"}
    assert "already imported" in choose_wait_policy(env) and env == {"OMP_NUM_THREADS": "2"}
    code = ("import os, sys; from geolens.training.wait_policy import choose_wait_policy as c; "
            "e = {'OMP_NUM_THREADS': '2', 'OMP_WAIT_POLICY': 'ACTIVE'}; print(c(e), e['OMP_WAIT_POLICY']); "
            "e = {'OMP_NUM_THREADS': '1'}; print(c(e), e); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}).stdout.splitlines()
    assert out == ["the wait policy set in the environment ACTIVE", "one thread: nothing waits {'OMP_NUM_THREADS': '1'}",
                   "False"]


def test_resume_trains_on_the_thread_count_the_run_started_with(tmp_path):
    cfg = make_config("fb", epochs=20, **TINY)
    with torch_threads(1):
        training.train(cfg, tmp_path / "r", progress=False)
    with torch_threads(2):
        training.resume(tmp_path / "r", progress=False, epochs=30)
        assert torch.get_num_threads() == 2  # restored after
    header = RunDir(tmp_path / "r").read_header()
    assert started_threads(header) == 1
    assert [s["machine"]["torch_threads"] for s in header["segments"]] == [1, 1]
    assert [s["machine"]["omp_wait_policy"] for s in header["segments"]] == [wait_policy()] * 2
    assert started_threads({"segments": [{"from_epoch": 0, "geolens": "0.1.0", "geolens_commit": None}]}) is None
