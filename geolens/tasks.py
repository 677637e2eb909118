"""Algorithmic tasks: Z_p addition / subtraction / multiplication and S_n composition.

Every example is the token sequence [a, b, =] with `=` = n_classes; the label is a o b.
Splits follow the paper: all n_classes^2 pairs (a-major order) shuffled with Python's
random.Random(data_seed), the first int(frac_train * N) are the training set. Each split's indices
are then stored in ascending (a-major) order: full-batch training does not depend on the order of
the examples, and neighbouring examples sharing a token make the fast path's per-token table reads
cache-friendly (docs/performance.md).
"""

from __future__ import annotations

import itertools
import random
from dataclasses import dataclass

import torch
from jaxtyping import Int
from torch import Tensor

from geolens.config import GeoConfig


@dataclass(frozen=True)
class Dataset:
    """All inputs of a task plus its seeded split.

    tokens: [N, 3] every (a, b, =) in a-major order (N = n_classes^2); labels: [N];
    train_idx / test_idx: indices into tokens, each in ascending order.
    """

    tokens: Int[Tensor, "N 3"]
    labels: Int[Tensor, "N"]
    train_idx: Int[Tensor, "n_train"]
    test_idx: Int[Tensor, "n_test"]

    @property
    def train(self) -> tuple[Tensor, Tensor]:
        return self.tokens[self.train_idx], self.labels[self.train_idx]

    @property
    def test(self) -> tuple[Tensor, Tensor]:
        return self.tokens[self.test_idx], self.labels[self.test_idx]


def permutations(n: int) -> list[tuple[int, ...]]:
    """The n! permutations of range(n) in itertools order; the list index is the token id."""
    return list(itertools.permutations(range(n)))


def compose_table(cfg: GeoConfig) -> Int[Tensor, "n_classes n_classes"]:
    """table[a, b] = a o b for the task (for perm: out[i] = a[b[i]], i.e. apply b, then a)."""
    if cfg.task == "perm":
        perms = permutations(cfg.n_perm)
        index = {q: i for i, q in enumerate(perms)}
        return torch.tensor([[index[tuple(pa[i] for i in pb)] for pb in perms] for pa in perms])
    a = torch.arange(cfg.p).unsqueeze(1)
    b = torch.arange(cfg.p).unsqueeze(0)
    if cfg.task == "add":
        return (a + b) % cfg.p
    if cfg.task == "sub":
        return (a - b) % cfg.p
    return (a * b) % cfg.p


def make_dataset(cfg: GeoConfig) -> Dataset:
    """The task's full input grid and its split by cfg.data_seed and cfg.frac_train."""
    n = cfg.n_classes
    table = compose_table(cfg)
    a, b = torch.meshgrid(torch.arange(n), torch.arange(n), indexing="ij")
    tokens = torch.stack([a.flatten(), b.flatten(), torch.full((n * n,), n)], dim=1)
    labels = table.flatten()
    order = list(range(n * n))
    random.Random(cfg.data_seed).shuffle(order)
    n_train = int(len(order) * cfg.frac_train)
    return Dataset(tokens, labels, torch.tensor(sorted(order[:n_train])), torch.tensor(sorted(order[n_train:])))
