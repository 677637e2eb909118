"""`geolens barrier`'s records: barrier.json, barrier.csv and the figure of the losses along the line."""

from __future__ import annotations

import json
from pathlib import Path

from geolens.analysis.barrier import Barrier
from geolens.analysis.trajectory import writing
from geolens.outputs.plots import FigureSpec, Line, Panel, save_static
from geolens.runs.storage import atomic_write_bytes


def barrier_figure(b: Barrier, name: str = "barrier") -> FigureSpec:
    """Two panels over alpha: train and test loss with the chord between the end points; train and test accuracy."""
    chord = lambda ys: [(1 - t) * ys[0] + t * ys[-1] for t in b.alphas]  # noqa: E731
    loss = Panel(f"loss from {b.a} (alpha 0) to {b.b} (alpha 1); barrier train {b.barrier_train:.3g}, test {b.barrier_test:.3g}", [
        Line(b.alphas, b.train_loss, "train", mode="lines+markers", color="#1f77b4"),
        Line(b.alphas, chord(b.train_loss), "train chord", color="#1f77b4", dash=True),
        Line(b.alphas, b.test_loss, "test", mode="lines+markers", color="#d62728"),
        Line(b.alphas, chord(b.test_loss), "test chord", color="#d62728", dash=True)], "alpha", "cross-entropy")
    acc = Panel("accuracy along the line", [Line(b.alphas, b.train_acc, "train", mode="lines+markers", color="#1f77b4"),
                                            Line(b.alphas, b.test_acc, "test", mode="lines+markers", color="#d62728")],
                "alpha", "accuracy")
    return FigureSpec(name, "Loss along the straight line between two checkpoints", [loss, acc])


def write_barrier(b: Barrier, out: Path, stem: str = "barrier") -> list[Path]:
    """OUT/<stem>.json, .csv (alpha, losses, accuracies) and .png, .svg; returns the paths."""
    with writing(out):
        atomic_write_bytes(out / f"{stem}.json", json.dumps(b.to_dict(), indent=2).encode())
        rows = ["alpha,train_loss,test_loss,train_acc,test_acc"] + [
            ",".join(repr(v) for v in row) for row in zip(b.alphas, b.train_loss, b.test_loss, b.train_acc, b.test_acc)]
        atomic_write_bytes(out / f"{stem}.csv", ("\n".join(rows) + "\n").encode())
        figures = save_static(barrier_figure(b, stem), out)
    return [out / f"{stem}.json", out / f"{stem}.csv", *figures]
