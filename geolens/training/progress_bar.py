"""A rich progress bar over epochs with a free-text stats column (losses, accuracies)."""

from __future__ import annotations

from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn


class EpochProgress:
    """Context manager; `update(epoch, stats)` moves the bar to `epoch` and shows `stats`."""

    def __init__(self, total: int, start: int, enabled: bool, label: str):
        self.progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[stats]}"),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            disable=not enabled,
        )
        self.task = self.progress.add_task(escape(label), total=total, completed=start, stats="")

    def __enter__(self) -> "EpochProgress":
        self.progress.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def update(self, epoch: int, stats: str) -> None:
        self.progress.update(self.task, completed=epoch, stats=stats)


def run_stats(row: dict) -> str:
    """One evaluation row as 'loss train/test acc train/test'."""
    return (
        f"loss {row['train_loss']:.3g}/{row['test_loss']:.3g} "
        f"acc {row['train_acc']:.3f}/{row['test_acc']:.3f} (train/test)"
    )


def sweep_stats(test_acc: list[float], active: int, members: int) -> str:
    """Test accuracy over the members of a batched run."""
    return f"test acc mean {sum(test_acc) / len(test_acc):.3f} min {min(test_acc):.3f}, {active}/{members} running"
