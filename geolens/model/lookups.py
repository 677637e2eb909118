"""Token-dependent index plans shared by the fast and deep engines.

Both engines read per-(token, position) tables with gathers and embedding bags whose indices depend only on
the tokens. A full-batch run passes the same token tensors at every step, so the engines build those indices
(and their sorted order for the backward) once per token tensors: cached_plan. segments gives the order in
which a scatter-add into table rows becomes an embedding bag over the gradient rows: deterministic on every
device, and parallel over the rows on the CPU, where torch's own dense backward of F.embedding / F.embedding_bag
sorts the indices at every step and adds on one thread.
"""

from __future__ import annotations

import functools
import weakref
from typing import Callable, TypeVar

import torch
from jaxtyping import Float, Int
from torch import Tensor

Plan = TypeVar("Plan")

_PLANS: dict[tuple, tuple] = {}
MAX_PLANS = 16  # a sweep holds one stacked train and one stacked test plan; analysis a few more


def cached_plan(tokens: list[Tensor], key: tuple, build: Callable[[], Plan]) -> Plan:
    """build()'s plan for the members' `tokens`, reused while the same tensor objects are passed unmodified
    (key: whatever else the plan depends on, the engine's name first)."""
    full_key = (tuple(id(t) for t in tokens), *key)
    sig = tuple((t._version, tuple(t.shape), t.device) for t in tokens)
    hit = _PLANS.get(full_key)
    if hit is not None and all(r() is t for r, t in zip(hit[0], tokens)) and hit[1] == sig:
        return hit[2]
    plan = build()
    if len(_PLANS) >= MAX_PLANS:
        _PLANS.pop(next(iter(_PLANS)))
    _PLANS[full_key] = ([weakref.ref(t) for t in tokens], sig, plan)
    return plan


def segments(rows: Int[Tensor, "N"], n_rows: int) -> tuple[Tensor, Tensor]:
    """(order [N], offsets [n_rows]): the entries of `rows` sorted by row (stably), and where each of the n_rows
    rows' entries start, so F.embedding_bag(order, values, offsets, mode='sum') sums values [N, k] per row
    (a deterministic scatter-add, unlike index_add_ on CUDA)."""
    counts = torch.bincount(rows, minlength=n_rows)
    return torch.argsort(rows, stable=True), torch.cumsum(counts, 0) - counts


class RowLookup:
    """Indices `idx` [*] into a table of n_rows rows, for gather_rows; their segments (order, offsets) are built at
    the first backward (an evaluation's lookups never sort)."""

    def __init__(self, idx: Tensor, n_rows: int):
        self.idx, self.n_rows = idx, n_rows

    @functools.cached_property
    def segments(self) -> tuple[Tensor, Tensor]:
        return segments(self.idx.reshape(-1), self.n_rows)


class BagLookup:
    """Bags idx [N, s] (s rows of a table of n_rows rows per bag), for bag_rows. Its backward reads, built at the
    first backward: `by_row`, the entries' flat positions sorted by row with each row's start (segments) and the
    bag of each (src); and for the weights' gradient each bag's start and each entry's bag in the flat idx."""

    def __init__(self, idx: Tensor, n_rows: int):
        self.idx, self.n_rows = idx, n_rows

    @functools.cached_property
    def by_row(self) -> tuple[Tensor, Tensor, Tensor]:
        """(order, offsets, src): segments of the flat idx, and the bag of each entry in that order."""
        order, offsets = segments(self.idx.reshape(-1), self.n_rows)
        return order, offsets, torch.div(order, self.idx.shape[1], rounding_mode="floor")

    @functools.cached_property
    def bags(self) -> tuple[Tensor, Tensor]:
        """(starts [N], entry_bag [N s]): each bag's first entry and each entry's bag."""
        N, s = self.idx.shape
        bags = torch.arange(N, device=self.idx.device)
        return bags * s, bags.repeat_interleave(s)


class _GatherRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, lookup):
        ctx.lookup = lookup
        return torch.nn.functional.embedding(lookup.idx, table)

    @staticmethod
    def backward(ctx, g):
        order, offsets = ctx.lookup.segments
        return torch.nn.functional.embedding_bag(order, g.reshape(order.numel(), -1), offsets, mode="sum"), None


class _BagRows(torch.autograd.Function):
    @staticmethod
    def forward(ctx, table, weights, lookup):
        ctx.lookup = lookup
        ctx.save_for_backward(table, weights)
        return torch.nn.functional.embedding_bag(lookup.idx, table, per_sample_weights=weights, mode="sum")

    @staticmethod
    def backward(ctx, g):
        lk = ctx.lookup
        table, weights = ctx.saved_tensors
        g_table = g_weights = None
        if ctx.needs_input_grad[0]:
            order, offsets, src = lk.by_row
            g_table = torch.nn.functional.embedding_bag(src, g, offsets, mode="sum",
                                                        per_sample_weights=weights.reshape(-1)[order])
        if ctx.needs_input_grad[1]:
            g_weights = slot_dots(g, table, lk)
        return g_table, g_weights, None


def slot_dots(g: Float[Tensor, "N k"], table: Float[Tensor, "n_rows k"], lookup: BagLookup) -> Float[Tensor, "N s"]:
    """<table[lookup.idx[i, j]], g[i]> for every slot j of every bag i: the per-sample-weight gradient of a bag
    over `table` (torch's kernel for it; it has no public name)."""
    return torch.ops.aten._embedding_bag_per_sample_weights_backward(
        g.contiguous(), table, lookup.idx.reshape(-1), *lookup.bags, 0, -1).view(lookup.idx.shape)


def gather_rows(table: Float[Tensor, "n_rows k"], lookup: RowLookup) -> Float[Tensor, "* k"]:
    """table[lookup.idx], as F.embedding, its table gradient summed per row through lookup's segments."""
    return _GatherRows.apply(table, lookup)


def bag_rows(table: Float[Tensor, "n_rows k"], weights: Float[Tensor, "N s"], lookup: BagLookup) -> Float[Tensor, "N k"]:
    """sum_j weights[i, j] table[lookup.idx[i, j]] per bag i, as F.embedding_bag(mode='sum'), its table gradient
    summed per row through lookup's segments."""
    return _BagRows.apply(table, weights, lookup)
