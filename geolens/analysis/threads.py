"""Thread control for analysis code on small, shared CPU machines.

Small LAPACK calls (SVD, eigendecompositions, pinv of tiny matrices) and many small elementwise
ops suffer badly from OpenMP thread contention when the cores are shared with other processes,
so analysis runs them on one thread (measurements in docs/performance.md).
"""

from __future__ import annotations

import contextlib

import torch


@contextlib.contextmanager
def torch_threads(n: int | None):
    """Run the block with torch.set_num_threads(n) and restore the previous value (None: no change)."""
    if n is None:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def single_thread():
    """Context manager for small LAPACK calls: one thread."""
    return torch_threads(1)
