"""Checkpoint schedules: which evaluated epochs get a saved checkpoint.

Spellings: 'every:N' (every N epochs), 'log:K' (K per decade, log-spaced), 'adaptive' or
'adaptive:MAXGAP' (at every evaluation where test accuracy moved by >= 0.02 or test loss by
>= 10% since the last checkpoint, and at least every MAXGAP epochs, default 500), 'ends' (no
checkpoint in between: for tables that need only the onsets). Epoch 0 and the last epoch are
always saved.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from geolens.errors import GeoError

ADAPTIVE_ACC_STEP = 0.02
ADAPTIVE_LOSS_RATIO = 0.10


@dataclass(frozen=True)
class Schedule:
    kind: str
    n: int

    def wants(self, epoch: int, last: dict | None, now: dict) -> bool:
        """Whether to checkpoint at `epoch`, given the last manifest entry (step + metrics) and metrics now."""
        if last is None or epoch == 0:
            return True
        if self.kind == "ends":
            return False
        if self.kind == "every":
            return epoch % self.n == 0
        if self.kind == "log":
            # the next log-spaced target after the last checkpointed epoch
            prev = max(last["step"], 1)
            target = 10 ** (math.floor(math.log10(prev) * self.n + 1e-9) / self.n + 1 / self.n)
            return epoch >= target
        acc_moved = abs(now["test_acc"] - last["test_acc"]) >= ADAPTIVE_ACC_STEP
        loss_moved = abs(math.log(max(now["test_loss"], 1e-30) / max(last["test_loss"], 1e-30))) >= math.log1p(
            ADAPTIVE_LOSS_RATIO
        )
        return acc_moved or loss_moved or epoch - last["step"] >= self.n


def parse_schedule(text: str) -> Schedule:
    """Parse 'every:N', 'log:K', 'adaptive[:MAXGAP]' or 'ends'."""
    if text == "ends":
        return Schedule("ends", 0)
    kind, _, arg = text.partition(":")
    defaults = {"every": None, "log": None, "adaptive": 500}
    if kind not in defaults:
        raise GeoError(f"unknown checkpoint schedule '{text}'; use every:N, log:K, adaptive[:MAXGAP] or ends")
    try:
        n = int(arg) if arg else defaults[kind]
    except ValueError:
        n = None
    if n is None or n < 1:
        raise GeoError(f"checkpoint schedule '{text}' needs a positive integer, e.g. every:100 or log:20")
    return Schedule(kind, n)


#: the default storage policy: the optimizer state at the first checkpoint of every 5,000 epochs
DEFAULT_KEEP = "sparse:5000"


@dataclass(frozen=True)
class KeepPolicy:
    """Which checkpoints also store the optimizer state (with their weights, a full training state):
    'all' every one; 'sparse:N' epoch 0 and the first checkpoint at or after each multiple of N epochs.
    The newest checkpoint's full state is always in resume.safetensors; a fork or a replay at any other
    epoch trains on from the nearest earlier full state (geolens.training.replay)."""

    every: int  # 0: every checkpoint

    def full(self, epoch: int, prev: int | None) -> bool:
        """Whether the checkpoint at `epoch` stores the optimizer state; prev: the run's previous checkpoint (None: first)."""
        return self.every == 0 or prev is None or epoch // self.every > prev // self.every

    def full_steps(self, steps: list[int]) -> list[int]:
        """The checkpoints of `steps` (ascending, a run's own) that store the optimizer state."""
        return [s for i, s in enumerate(steps) if self.full(s, steps[i - 1] if i else None)]


def parse_keep(text: str) -> KeepPolicy:
    """Parse a storage policy: 'all' or 'sparse:N' (N >= 1 epochs)."""
    if text == "all":
        return KeepPolicy(0)
    kind, _, arg = text.partition(":")
    if kind != "sparse" or not arg.isdigit() or int(arg) < 1:
        raise GeoError(f"unknown storage policy keep='{text}'; use all (optimizer state at every checkpoint) or "
                       f"sparse:N (at the first checkpoint of every N epochs, e.g. {DEFAULT_KEEP})")
    return KeepPolicy(int(arg))
