"""Progress when stdout is not a terminal (nohup, a cluster job, CI): plain lines with the count, losses and
accuracies, the time per epoch and the time left, and a summary at the end; training, sweeps and analyze.
Tests run with stdout captured (not a terminal)."""

import io
import re

import pytest

from geolens.model.config import make_config
from geolens.training.progress_bar import LogLines, interactive

LINE = re.compile(r"^\d\d:\d\d:\d\d ")  # every plain line starts with the time of day


@pytest.fixture
def every_update(monkeypatch):
    monkeypatch.setenv("GEOLENS_LOG_SECONDS", "0")


def test_log_lines_print_the_count_stats_speed_and_eta_then_a_summary(every_update):
    out = io.StringIO()
    log = LogLines("fb add p=23", total=40, start=0, stream=out)
    log.update(0, "loss 3.8/3.8 acc 0.05/0.04 (train/test)")
    log.update(10, "loss 3.1/3.4 acc 0.10/0.02 (train/test)")
    log.close()
    lines = out.getvalue().splitlines()
    assert len(lines) == 3 and all(LINE.match(x) for x in lines)
    assert lines[0].endswith("fb add p=23 epoch 0/40 (0%) | loss 3.8/3.8 acc 0.05/0.04 (train/test)")
    assert " fb add p=23 epoch 10/40 (25%) | loss 3.1/3.4 acc 0.10/0.02 (train/test) | " in lines[1]
    assert re.search(r"\| [\d.]+ m?s/epoch \| ETA \d+(m\d\ds|s)$", lines[1])
    assert re.search(r"fb add p=23 done at epoch 10/40: 10 epoch\(s\) in \d+s \([\d.]+ m?s/epoch\) \| loss 3.1/3.4", lines[2])


def test_log_lines_keep_a_steady_interval_and_say_how_a_run_ended(monkeypatch):
    monkeypatch.setenv("GEOLENS_LOG_SECONDS", "3600")
    out = io.StringIO()
    log = LogLines("analyze", total=5, start=2, unit="checkpoint", stream=out)
    for done in range(3, 6):
        log.update(done, f"epoch {done * 10}")
    log.close(KeyboardInterrupt)
    lines = out.getvalue().splitlines()
    assert len(lines) == 2  # the first update, then nothing until an hour has passed, then the summary
    assert re.search(r"analyze checkpoint 3/5 \(60%\) \| epoch 30 \| [\d.]+ m?s/checkpoint \| ETA \d+s$", lines[0])
    assert "analyze interrupted at checkpoint 5/5: 3 checkpoint(s) in " in lines[1] and lines[1].endswith("| epoch 50")


def test_captured_stdout_is_not_a_terminal(capsys):
    assert not interactive()


def test_training_and_analyze_print_plain_lines_to_a_file(tmp_path, capsys, every_update):
    from geolens.analysis.trajectory import analyze_run
    from geolens.runs.run import load_run
    from geolens.training import train as training

    cfg = make_config("fb", p=23, epochs=20, eval_every=10, d_model=32, d_head=8, d_mlp=64, checkpoints="every:10")
    training.train(cfg, tmp_path / "run", progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert all(LINE.match(x) for x in lines) and len(lines) == 4  # epochs 0, 10, 20 and the summary
    assert [re.search(r"epoch (\d+)/20", x).group(1) for x in lines] == ["0", "10", "20", "20"]
    assert re.search(r"fb add p=23 epoch 10/20 \(50%\) \| loss [\d.]+/[\d.]+ acc [\d.]+/[\d.]+ \(train/test\) \| "
                     r"[\d.]+ m?s/epoch \| ETA ", lines[1])
    assert " done at epoch 20/20: 20 epoch(s) in " in lines[3] and "(train/test)" in lines[3]

    analyze_run(load_run(tmp_path / "run"), ["weight_norm"], workers=1, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert [x.split(" ", 1)[1].split(" |")[0] for x in lines[:3]] == [f"analyze checkpoint {i}/3 ({p}%)"
                                                                     for i, p in ((1, 33), (2, 67), (3, 100))]
    assert "analyze done at checkpoint 3/3: 3 checkpoint(s) in " in lines[3] and lines[3].endswith("| epochs 0-20")


def test_analyze_bar_ends_at_the_last_epoch(tmp_path, capsys, monkeypatch):
    """On a terminal the steps finish out of order (the caller computes the last queued step first); the bar's
    last frame names the last epoch."""
    from geolens.analysis import trajectory
    from geolens.analysis.trajectory import analyze_run
    from geolens.runs.run import load_run
    from geolens.training import train as training

    cfg = make_config("fb", p=23, epochs=20, eval_every=10, d_model=32, d_head=8, d_mlp=64, checkpoints="every:10")
    training.train(cfg, tmp_path / "run", progress=False)
    monkeypatch.setattr(trajectory, "interactive", lambda: True)
    monkeypatch.setenv("FORCE_TERMINAL", "1")
    jobs = []
    real = trajectory._results

    def reversed_results(run, todo, *a):  # the last epoch finishes first, as with workers
        jobs.extend(todo)
        return reversed(list(real(run, todo, *a)))

    monkeypatch.setattr(trajectory, "_results", reversed_results)
    analyze_run(load_run(tmp_path / "run"), ["weight_norm"], workers=1, progress=True)
    out = capsys.readouterr().out
    assert jobs == [0, 10, 20]
    assert re.findall(r"epoch (\d+)", out)[-1] == "20"


def test_sweep_monitor_prints_plain_lines(tmp_path, capsys, every_update):
    from geolens.sweeps.grid import Job, Member
    from geolens.sweeps.sweep import SweepMonitor

    cfg = make_config("fb", p=23, epochs=100)
    members = [Member(f"seed_{s}", cfg.replace(seed=s), tmp_path / f"seed_{s}") for s in (1, 2)]
    with SweepMonitor(tmp_path, members, [Job("train", members)], {}, progress=True) as monitor:
        monitor.handle(("start", 0))
        monitor.handle(("eval", 0, 50, [False, False]))
        monitor.handle(("done", 0))
    lines = capsys.readouterr().out.splitlines()
    assert all(LINE.match(x) for x in lines) and len(lines) == 4
    assert "sweep member-epoch 100/200 (50%) | members: 0 done, 2 running, 0 failed, 0 skipped, 0 queued | " in lines[1]
    assert "ETA" in lines[1]
    assert "sweep done at member-epoch 200/200" in lines[3] and lines[3].endswith("members: 2 done, 0 running, "
                                                                               "0 failed, 0 skipped, 0 queued")


def test_replay_log_ends_at_the_epoch_reached(tmp_path, capsys, every_update):
    """A replay (fork, convert, an exact --step) prints its summary at the epoch it stopped at, not the last
    evaluation before it."""
    from geolens.runs.run import load_run
    from geolens.training import train as training
    from geolens.training.replay import state_at

    cfg = make_config("fb", p=23, epochs=30, eval_every=10, d_model=32, d_head=8, d_mlp=64, checkpoints="every:10")
    training.train(cfg, tmp_path / "run", progress=False)
    state_at(load_run(tmp_path / "run"), 25, progress=True)
    lines = capsys.readouterr().out.splitlines()
    assert lines and " done at epoch 25/25: " in lines[-1]
