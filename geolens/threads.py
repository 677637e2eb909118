"""The cores this process may use, and torch's thread count for one block, shared by training and analysis.

Training runs a resumed run on the count it started with (the count sets the order of torch's sums:
geolens.training.engine.training_threads). Analysis runs small LAPACK calls (SVD, eigendecompositions,
pinv of tiny matrices) on one thread: with the cores shared, OpenMP contention makes them slow
(measurements in docs/performance.md). cpu_cores imports no torch (training.wait_policy runs before torch loads).
"""

from __future__ import annotations

import contextlib
import os


def cpu_cores() -> list[int]:
    """The cores this process may run on (its affinity where the OS has one)."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run the block with torch.set_num_threads(n) and restore the previous value (None: no change)."""
    if n is None:
        yield
        return
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def single_thread():
    """Context manager for small LAPACK calls: one thread."""
    return torch_threads(1)
