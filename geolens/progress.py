"""A rich progress bar for training: epoch, train/test loss and accuracy."""

from __future__ import annotations

from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class TrainProgress:
    """Context manager; `update(epoch, row)` moves the bar to `epoch` and shows the row's metrics."""

    def __init__(self, total: int, start: int, enabled: bool, label: str):
        self.enabled = enabled
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not enabled,
        )
        self.task = self.progress.add_task(label, total=total, completed=start, stats="")

    def __enter__(self) -> "TrainProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, epoch: int, row: dict) -> None:
        stats = (
            f"loss {row['train_loss']:.3g}/{row['test_loss']:.3g} "
            f"acc {row['train_acc']:.3f}/{row['test_acc']:.3f} (train/test)"
        )
        self.progress.update(self.task, completed=epoch, stats=stats)
