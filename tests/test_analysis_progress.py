"""Restricted / excluded loss, logit cos coefficients, truncated-logit accuracy, weight norm."""

import math

import pytest
import torch
import torch.nn.functional as F

from geolens.analysis import fourier, progress
from geolens.config import make_config
from geolens.model import GeoTransformer
from geolens.tasks import make_dataset


def _setup(task="add", p=23):
    cfg = make_config("ln", task=task, p=p)
    ds = make_dataset(cfg)
    masks = {}
    for name, idx in (("train", ds.train_idx), ("test", ds.test_idx)):
        m = torch.zeros(p * p, dtype=torch.bool)
        m[idx] = True
        masks[name] = m
    return cfg, ds, fourier.cyclic_frame(cfg), masks


def _key_logits(frame, keys, amp=4.0, class0=-3.0):
    """Logits [p*p, p] with group block sum_k amp cos(w_k(s - c)) (s label position, c class
    position); rows outside the frame and the class-0 column (mul) get constants."""
    n, p = frame.n, frame.p
    s = frame.label_pos.to(torch.float64)[..., None]
    c = torch.arange(n, dtype=torch.float64)
    block = sum(amp * torch.cos(2 * math.pi * k * (s - c) / n) for k in keys)  # [n, n, n]
    logits = torch.full((p * p, p), class0, dtype=torch.float64)
    rows = frame.grid_rows.flatten()
    sub = logits[rows]
    sub[:, frame.order] = block.reshape(n * n, n)
    logits[rows] = sub
    return logits.float()


def _ce_on_frame(logits, ds, frame, mask):
    m = mask & frame.in_frame
    return float(F.cross_entropy(logits[m], ds.labels[m]))


@pytest.mark.parametrize("task", ["add", "sub", "mul"])
def test_key_only_logits_restricted_equals_full_and_excluded_is_maximal(task):
    cfg, ds, frame, masks = _setup(task)
    keys = torch.tensor([2, 5, 9])
    logits = _key_logits(frame, keys.tolist())
    restricted = progress.restricted_loss(logits, frame, keys, masks)
    excluded = progress.excluded_loss(logits, frame, keys, masks)
    for split in ("train", "test"):
        full = _ce_on_frame(logits, ds, frame, masks[split])
        assert restricted[split] == pytest.approx(full, abs=1e-4)
        assert full < 0.1  # the constructed logits solve the task
        # with every key removed the group logits are constant per class: uniform over the group
        if task == "mul":
            expect = math.log((frame.n) + math.exp(-3.0 - 0.0))  # n equal logits (0) plus class 0 at -3
        else:
            expect = math.log(frame.p)
        assert excluded[split]["all"] == pytest.approx(expect, abs=1e-4)
        for r in ("1", "2", "3"):
            assert full + 0.1 < excluded[split][r] < expect  # one key alone still helps


def test_restricted_loss_drops_non_key_parts():
    cfg, ds, frame, masks = _setup()
    logits = _key_logits(frame, [2, 5])
    noisy = logits + 3 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(0))
    restricted = progress.restricted_loss(noisy, frame, torch.tensor([2, 5]), masks)
    assert restricted["test"] < _ce_on_frame(noisy, ds, frame, masks["test"])


def test_block_helpers_split_the_logits_into_key_part_and_rest():
    cfg, ds, frame, masks = _setup()
    block = torch.randn(23, 23, 23, generator=torch.Generator().manual_seed(5))
    dirs = progress.key_directions(frame, torch.tensor([2, 7]))
    assert dirs.shape == (23 * 23, 4)
    assert torch.allclose(dirs.T @ dirs, torch.eye(4), atol=1e-5)
    kept, rest = progress.restricted_block(block, dirs), progress.excluded_block(block, dirs)
    assert torch.allclose(kept + rest, block + block.mean(dim=(0, 1), keepdim=True), atol=1e-5)
    assert torch.allclose(progress.project_on(rest, dirs), torch.zeros_like(block), atol=1e-5)


def _brute_cos_coeff(block, sign):
    n = block.shape[0]
    a = torch.arange(n, dtype=torch.float64)
    cube_idx = a[:, None, None] + sign * a[None, :, None] - a[None, None, :]
    out = []
    for k in range(1, n // 2 + 1):
        wave = torch.cos(2 * math.pi * k * cube_idx / n)
        out.append(float((block.double() * wave).sum() / wave.square().sum()))
    return torch.tensor(out, dtype=torch.float64)


@pytest.mark.parametrize("n,sign", [(11, 1), (11, -1), (10, 1)])
def test_logit_cos_coeff_matches_the_brute_force_cube(n, sign):
    block = torch.randn(n, n, n, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    block = block + 2.0 * torch.cos(2 * math.pi * 3 * (torch.arange(n)[:, None, None] + sign * torch.arange(n)[None, :, None] - torch.arange(n)[None, None, :]) / n)
    got = progress.logit_cos_coeff(block, sign)
    assert torch.allclose(got, _brute_cos_coeff(block, sign), atol=1e-10)
    assert got[2] == pytest.approx(2.0, abs=0.3)


def test_truncated_logit_accuracy_keeps_the_key_bins():
    cfg, ds, frame, masks = _setup(p=29)
    keys = [3, 8, 11]
    logits = _key_logits(frame, keys, amp=1.0).reshape(29 * 29, 29)
    noise = 1.0 * torch.randn(logits.shape, generator=torch.Generator().manual_seed(1))
    noisy = logits + noise
    labels = frame.label_pos.flatten()
    full_acc = float((noisy.argmax(-1) == labels).float().mean())
    acc, bins = progress.truncated_logit_accuracy(noisy, labels, k=3)
    assert sorted(bins.tolist()) == keys
    assert acc > 0.97 and full_acc < 0.6  # truncation removes most of the noise
    dc_only, _ = progress.truncated_logit_accuracy(noisy, labels, k=0)
    assert dc_only < 0.2


def test_weight_norm_matches_a_manual_sum():
    cfg = make_config("ln", p=23, d_model=16, d_mlp=32, n_heads=2, d_head=8)
    model = GeoTransformer(cfg)
    res = progress.weight_norm(model)
    manual = sum(float(p.detach().double().square().sum()) for p in model.parameters())
    assert res["total_sq"] == pytest.approx(manual)
    assert res["frobenius"] == pytest.approx(math.sqrt(manual))
    assert res["embed.W_E"] == pytest.approx(float(model.embed.W_E.detach().double().square().sum()))
