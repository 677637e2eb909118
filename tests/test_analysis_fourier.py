"""Fourier bases, transforms, discrete logs and the cyclic frame."""

import math

import pytest
import torch

from geolens.analysis import fourier
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.model.tasks import compose_table, make_dataset


@pytest.mark.parametrize("n", [23, 24, 59])
def test_basis_is_orthonormal_and_cos_first(n):
    F = fourier.fourier_basis(n, torch.float64)
    assert torch.allclose(F @ F.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    names = fourier.basis_names(n)
    assert len(names) == n and names[:3] == ["const", "cos 1", "sin 1"]
    x = torch.arange(n, dtype=torch.float64)
    cos3 = torch.cos(2 * math.pi * 3 * x / n)
    sin3 = torch.sin(2 * math.pi * 3 * x / n)
    assert torch.allclose(F[fourier.cos_index(3)], cos3 / cos3.norm())
    assert torch.allclose(F[fourier.sin_index(3)], sin3 / sin3.norm())
    if n % 2 == 0:
        assert names[-1] == f"cos {n // 2}"
    assert fourier.basis_freqs(n).tolist() == [0] + [(i + 1) // 2 for i in range(1, n)]


def test_1d_and_2d_transforms_invert():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(13, 5, dtype=torch.float64, generator=g)
    F = fourier.fourier_basis(13, torch.float64)
    assert torch.allclose(fourier.fourier_1d(x, 0), F @ x)
    assert torch.allclose(fourier.fourier_1d(x.T, 1), (F @ x).T)
    grid = torch.randn(2, 13, 13, dtype=torch.float64, generator=g)
    coef = fourier.fourier_2d(grid)
    assert torch.allclose(F.T @ coef @ F, grid)


@pytest.mark.parametrize("n", [13, 12])
def test_freq_energy_blocks_match_the_real_basis(n):
    g = torch.Generator().manual_seed(1)
    grid = torch.randn(3, n, n, dtype=torch.float64, generator=g)
    coef = fourier.fourier_2d(grid).square()  # [3, n, n]
    freq = fourier.basis_freqs(n)
    K1 = n // 2 + 1
    expect = torch.zeros(3, K1, K1, dtype=torch.float64)
    for r in range(n):
        for c in range(n):
            expect[:, freq[r], freq[c]] += coef[:, r, c]
    assert torch.allclose(fourier.freq_energy_2d(grid), expect, atol=1e-10)
    assert torch.allclose(fourier.channel_freq_energy(grid.permute(1, 2, 0)).permute(2, 0, 1), expect, atol=1e-10)
    assert torch.allclose(expect.sum(dim=(1, 2)), grid.square().sum(dim=(1, 2)))


def test_primitive_root_and_discrete_log_order():
    assert fourier.primitive_root(113) == 3  # the paper's g
    assert fourier.primitive_root(23) == 5
    order = fourier.discrete_log_order(23)
    assert sorted(order.tolist()) == list(range(1, 23))
    assert order[1] == 5 and order[2] == 25 % 23
    with pytest.raises(GeoError):
        fourier.discrete_log_order(23, g=2)  # 2 has order 11 mod 23


@pytest.mark.parametrize("task", ["add", "sub", "mul"])
def test_frame_label_positions_match_the_task(task):
    cfg = make_config("ln", task=task, p=23)
    frame = fourier.cyclic_frame(cfg)
    ds = make_dataset(cfg)
    assert frame.n == (22 if task == "mul" else 23)
    labels_grid = ds.labels[frame.grid_rows]
    assert torch.equal(frame.order[frame.label_pos], labels_grid)
    table = compose_table(cfg)
    a, b = frame.order[:, None], frame.order[None, :]
    assert torch.equal(table[a.expand(-1, frame.n), b.expand(frame.n, -1)], labels_grid)
    assert frame.in_frame.sum() == frame.n**2
    logits = torch.randn(23 * 23, 23)
    assert torch.equal(frame.block(logits), logits[frame.grid_rows][..., frame.order])
    assert frame.extra_classes.tolist() == ([0] if task == "mul" else [])


def test_frame_refuses_permutations():
    with pytest.raises(GeoError, match="S_5"):
        fourier.cyclic_frame(make_config("ln", task="perm"))


@pytest.mark.parametrize("task", ["add", "sub", "mul"])
def test_diagonal_sums_and_label_rows_follow_the_label_position(task):
    frame = fourier.cyclic_frame(make_config("ln", task=task, p=23))
    n = frame.n
    grid = torch.randn(n, n, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    expect = torch.zeros(n, 3, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            expect[(i + frame.sign * j) % n] += grid[i, j]
    assert torch.allclose(fourier.diagonal_sums(grid, frame.sign), expect)
    assert torch.allclose(fourier.diagonal_sums(grid[..., 0], frame.sign), expect[:, 0])
    label_of_row = torch.full((frame.p**2,), -1)
    label_of_row[frame.grid_rows.flatten()] = frame.label_pos.flatten()
    assert (label_of_row[frame.label_rows] == torch.arange(n)[:, None]).all()
    assert sorted(frame.label_rows.flatten().tolist()) == sorted(frame.grid_rows.flatten().tolist())
