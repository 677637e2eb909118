"""Progress over epochs (or checkpoints): a rich bar on a terminal, plain log lines elsewhere.

On a terminal (or in Jupyter) a rich bar shows the count, a free-text stats column (losses, accuracies),
the elapsed and remaining time. When stdout is not a terminal (nohup, a cluster job, CI), LogLines prints
one plain line at once, then one at most every LOG_SECONDS seconds (environment GEOLENS_LOG_SECONDS
overrides it), each with the count, the stats, the time per unit over the last interval and the time
left at that rate, and a summary line at the end. Used by training (train, batched), sweeps and analyze.
"""

from __future__ import annotations

import os
import sys
import time

from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn

LOG_SECONDS = 30.0  # plain log lines: at most one per this many seconds (plus the first and the summary)


def interactive() -> bool:
    """Whether stdout shows a live display (a terminal or Jupyter) rather than going to a file or pipe."""
    console = Console()
    return console.is_terminal or console.is_jupyter


def log_seconds() -> float:
    """The interval of plain progress lines: GEOLENS_LOG_SECONDS if set (a number of seconds), else LOG_SECONDS."""
    raw = os.environ.get("GEOLENS_LOG_SECONDS", "")
    try:
        return max(0.0, float(raw)) if raw.strip() else LOG_SECONDS
    except ValueError:
        return LOG_SECONDS


def duration(seconds: float) -> str:
    """'1h02m', '3m05s' or '42s'."""
    s = int(round(seconds))
    if s >= 3600:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 60}m{s % 60:02d}s" if s >= 60 else f"{s}s"


def per_unit(seconds: float, unit: str) -> str:
    """'38.2 ms/epoch' below a second, '1.3 s/checkpoint' above."""
    return f"{1e3 * seconds:.1f} ms/{unit}" if seconds < 1 else f"{seconds:.1f} s/{unit}"


class LogLines:
    """Plain progress lines for a log file: `update(done, stats)` prints a line when LOG_SECONDS have passed
    since the last one (the first update always prints); `close(exc_type)` prints the summary.
    A line: 'HH:MM:SS LABEL epoch 1200/3000 (40%) | STATS | 38.2 ms/epoch | ETA 1m09s'."""

    def __init__(self, label: str, total: int, start: int, unit: str = "epoch", stream=None):
        self.label, self.total, self.start, self.unit = label, total, start, unit
        self.stream = stream or sys.stdout
        self.interval = log_seconds()
        self.t0 = self.t_line = time.perf_counter()
        self.done_line = self.done = start
        self.stats = ""
        self.printed = False

    def _print(self, text: str) -> None:
        print(f"{time.strftime('%H:%M:%S')} {self.label} {text}", file=self.stream, flush=True)

    def update(self, done: int, stats: str = "") -> None:
        self.done, self.stats = done, stats
        now = time.perf_counter()
        if self.printed and now - self.t_line < self.interval:
            return
        parts = [f"{self.unit} {done}/{self.total} ({100 * done / max(self.total, 1):.0f}%)", stats]
        if done > self.done_line:
            each = (now - self.t_line) / (done - self.done_line)
            parts += [per_unit(each, self.unit), f"ETA {duration(each * max(self.total - done, 0))}"]
        self._print(" | ".join(filter(None, parts)))
        self.t_line, self.done_line, self.printed = now, done, True

    def close(self, exc_type: type | None = None) -> None:
        elapsed = time.perf_counter() - self.t0
        ran = self.done - self.start
        how = ("done" if exc_type is None else "interrupted" if issubclass(exc_type, KeyboardInterrupt)
               else f"stopped by {exc_type.__name__}")
        speed = f" ({per_unit(elapsed / ran, self.unit)})" if ran > 0 else ""
        self._print(" | ".join(filter(None, [f"{how} at {self.unit} {self.done}/{self.total}: {ran} {self.unit}(s) in "
                                             f"{duration(elapsed)}{speed}", self.stats])))


class EpochProgress:
    """Context manager; `update(epoch, stats)` moves the bar to `epoch` and shows `stats` (LogLines when
    stdout is not a terminal; nothing when not enabled)."""

    def __init__(self, total: int, start: int, enabled: bool, label: str):
        live = enabled and interactive()
        self.log = LogLines(label, total, start) if enabled and not live else None
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not live,
        )
        self.task = self.progress.add_task(escape(label), total=total, completed=start, stats="")

    def __enter__(self) -> "EpochProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, exc_type, *exc) -> None:
        self.progress.__exit__(exc_type, *exc)
        if self.log is not None:
            self.log.close(exc_type)

    def update(self, epoch: int, stats: str) -> None:
        self.progress.update(self.task, completed=epoch, stats=stats)
        if self.log is not None:
            self.log.update(epoch, stats)


def run_stats(row: dict) -> str:
    """One evaluation row as 'loss train/test acc train/test'."""
    return (
        f"loss {row['train_loss']:.3g}/{row['test_loss']:.3g} "
        f"acc {row['train_acc']:.3f}/{row['test_acc']:.3f} (train/test)"
    )


def sweep_stats(test_acc: list[float], active: int, members: int) -> str:
    """Test accuracy over the members of a batched run."""
    return f"test acc mean {sum(test_acc) / len(test_acc):.3f} min {min(test_acc):.3f}, {active}/{members} running"
