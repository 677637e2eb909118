"""geolens.model.lookups: the engines' table lookups equal torch's F.embedding / F.embedding_bag in value and
gradient, and their index plans are reused only for the very token tensors they were built from."""

import torch
import torch.nn.functional as F

from geolens.model.lookups import BagLookup, RowLookup, bag_rows, cached_plan, gather_rows


def _indices(n_rows: int, shape: tuple[int, ...], seed: int) -> torch.Tensor:
    """Random row indices that leave some rows unused (their gradient must stay zero)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, n_rows - 3, shape, generator=g)


def test_gather_rows_equals_embedding_in_value_and_gradient():
    n_rows, k = 40, 5
    idx = _indices(n_rows, (60, 3, 2), 0)
    table = torch.randn(n_rows, k, dtype=torch.float64, requires_grad=True)
    g = torch.randn(60, 3, 2, k, dtype=torch.float64)
    ours = gather_rows(table, RowLookup(idx, n_rows))
    ref = F.embedding(idx, table)
    assert torch.equal(ours, ref)
    (g_ours,), (g_ref,) = torch.autograd.grad(ours, table, g), torch.autograd.grad(ref, table, g)
    torch.testing.assert_close(g_ours, g_ref, rtol=1e-12, atol=1e-12)
    assert g_ours[-3:].abs().max() == 0  # rows never looked up get no gradient


def test_bag_rows_equals_embedding_bag_in_value_and_both_gradients():
    n_rows, s, k = 50, 6, 7
    idx = _indices(n_rows, (80, s), 1)
    table = torch.randn(n_rows, k, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(80, s, dtype=torch.float64, requires_grad=True)
    g = torch.randn(80, k, dtype=torch.float64)
    ours = bag_rows(table, weights, BagLookup(idx, n_rows))
    ref = F.embedding_bag(idx, table, per_sample_weights=weights, mode="sum")
    torch.testing.assert_close(ours, ref, rtol=1e-12, atol=1e-12)
    grads_ref = torch.autograd.grad(ref, (table, weights), g)
    for a, b in zip(torch.autograd.grad(ours, (table, weights), g), grads_ref):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)
    # only the weights need a gradient: the table's is not computed
    (g_w,) = torch.autograd.grad(bag_rows(table.detach(), weights, BagLookup(idx, n_rows)), weights, g)
    torch.testing.assert_close(g_w, grads_ref[1], rtol=1e-12, atol=1e-12)


def test_a_plan_is_reused_only_for_the_same_unmodified_tensors():
    built = []

    def build(tokens):
        built.append(1)
        return object()

    a, b = torch.zeros(4, 3, dtype=torch.long), torch.ones(4, 3, dtype=torch.long)
    first = cached_plan([a, b], ("test",), lambda: build([a, b]))
    assert cached_plan([a, b], ("test",), lambda: build([a, b])) is first and len(built) == 1
    assert cached_plan([a, b], ("other",), lambda: build([a, b])) is not first  # another key
    assert cached_plan([a.clone(), b], ("test",), lambda: build([a, b])) is not first  # another tensor
    a[0, 0] = 5  # modified in place: its version changes
    assert cached_plan([a, b], ("test",), lambda: build([a, b])) is not first
    assert len(built) == 4
