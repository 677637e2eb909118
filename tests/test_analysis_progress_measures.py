"""Restricted / excluded loss, logit cos coefficients, truncated-logit accuracy, weight norm."""

import math

import pytest
import torch
import torch.nn.functional as F

from geolens.analysis import fourier, progress_measures
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer


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
    restricted = progress_measures.restricted_loss(logits, frame, keys, masks)
    excluded = progress_measures.excluded_loss(logits, frame, keys, masks)
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
    restricted = progress_measures.restricted_loss(noisy, frame, torch.tensor([2, 5]), masks)
    assert restricted["test"] < _ce_on_frame(noisy, ds, frame, masks["test"])


def _key_directions64(frame, freqs):
    """Reference: unit vectors in R^{n^2} along cos / sin(w_k s) over the grid (s the label
    position), vanishing waves dropped; [n^2, m] float64."""
    s = frame.label_pos.flatten().to(torch.float64)
    cols = []
    for k in freqs:
        for wave in (torch.cos(2 * math.pi * k * s / frame.n), torch.sin(2 * math.pi * k * s / frame.n)):
            if wave.norm() > 1e-9:
                cols.append(wave / wave.norm())
    return torch.stack(cols, 1) if cols else torch.zeros(frame.n**2, 0, dtype=torch.float64)


def _reference_losses(logits, frame, freqs, masks):
    """Restricted and excluded loss by the definition: [n^2, n] projections in float64."""
    logits = logits.double()
    n = frame.n
    rows, labels = frame.grid_rows.flatten(), frame.label_pos.flatten()
    flat = logits[rows][:, frame.order]  # [n^2, n] group classes
    extra = logits[rows][:, frame.extra_classes]

    def ce(group):
        full = torch.cat([group, extra], 1)
        return torch.logsumexp(full, 1) - group[torch.arange(n * n), labels]

    def means(x):
        return {name: float(x[m[rows]].mean()) for name, m in masks.items()}

    proj = [_key_directions64(frame, [k]) for k in freqs]
    proj = [d @ (d.T @ flat) for d in proj]
    restricted = means(ce(flat.mean(0) + sum(proj, torch.zeros_like(flat))))
    variants = {"all": sum(proj, torch.zeros_like(flat)), **{str(r + 1): P for r, P in enumerate(proj)}}
    excluded = {name: {} for name in masks}
    for key, P in variants.items():
        for name, v in means(ce(flat - P)).items():
            excluded[name][key] = v
    return restricted, excluded


@pytest.mark.parametrize("task,p", [("add", 23), ("sub", 23), ("mul", 23), ("mul", 29)])
def test_key_projections_match_the_projection_on_explicit_directions(task, p):
    cfg, ds, frame, masks = _setup(task, p)
    n = frame.n
    block = torch.randn(n, n, n, generator=torch.Generator().manual_seed(5), dtype=torch.float64)
    freqs = [2, 7, 0, n // 2]  # DC and (for even n) Nyquist keep only their cosine
    projs = progress_measures.key_projections(block, frame, torch.tensor(freqs))
    flat = block.reshape(n * n, n)
    assert torch.allclose(projs.class_mean, flat.mean(0), atol=1e-12)
    s = frame.label_pos.flatten()
    for r, k in enumerate(freqs):
        d = _key_directions64(frame, [k])
        assert torch.allclose(projs.per_key[r][s], d @ (d.T @ flat), atol=1e-10), k


@pytest.mark.parametrize("task,p", [("add", 23), ("sub", 29), ("mul", 23), ("mul", 29)])
@pytest.mark.parametrize("scale", [1.0, 40.0])
def test_restricted_and_excluded_loss_match_the_definition(task, p, scale):
    cfg, ds, frame, masks = _setup(task, p)
    keys = [3, 1, frame.n // 2]
    g = torch.Generator().manual_seed(p)
    logits = _key_logits(frame, keys, amp=scale) + scale * torch.randn(p * p, p, generator=g)
    ref_r, ref_e = _reference_losses(logits, frame, keys, masks)
    got_r = progress_measures.restricted_loss(logits, frame, torch.tensor(keys), masks)
    got_e = progress_measures.excluded_loss(logits, frame, torch.tensor(keys), masks)
    for split in masks:
        assert got_r[split] == pytest.approx(ref_r[split], rel=1e-6, abs=1e-6)
        assert got_e[split].keys() == ref_e[split].keys()
        for key in ref_e[split]:
            assert got_e[split][key] == pytest.approx(ref_e[split][key], rel=1e-6, abs=1e-6), (split, key)


@pytest.mark.parametrize("task", ["add", "mul"])
def test_excluded_loss_survives_logits_whose_exponentials_underflow(task):
    """Huge key terms (and class-0 logits): e^(l - max) and e^(-shift) underflow in float32 for
    the classes that win after the shift; those inputs are recomputed directly."""
    cfg, ds, frame, masks = _setup(task)
    keys = [2, 5]
    logits = _key_logits(frame, keys, amp=300.0, class0=-200.0)
    logits += torch.randn(logits.shape, generator=torch.Generator().manual_seed(3))
    _, ref_e = _reference_losses(logits, frame, keys, masks)
    got_e = progress_measures.excluded_loss(logits, frame, torch.tensor(keys), masks)
    for split in masks:
        for key in ref_e[split]:
            assert math.isfinite(got_e[split][key])
            assert got_e[split][key] == pytest.approx(ref_e[split][key], rel=1e-5, abs=1e-4), (split, key)


def test_losses_of_an_empty_split_are_nan():
    cfg, ds, frame, masks = _setup()
    logits = torch.randn(23 * 23, 23, generator=torch.Generator().manual_seed(0))
    empty = {"none": torch.zeros(23 * 23, dtype=torch.bool)}
    assert math.isnan(progress_measures.restricted_loss(logits, frame, torch.tensor([2]), empty)["none"])
    assert all(math.isnan(v) for v in progress_measures.excluded_loss(logits, frame, torch.tensor([2]), empty)["none"].values())


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
    got = progress_measures.logit_cos_coeff(block, sign)
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
    acc, bins = progress_measures.truncated_logit_accuracy(noisy, labels, k=3)
    assert sorted(bins.tolist()) == keys
    assert acc > 0.97 and full_acc < 0.6  # truncation removes most of the noise
    dc_only, _ = progress_measures.truncated_logit_accuracy(noisy, labels, k=0)
    assert dc_only < 0.2


def test_weight_norm_matches_a_manual_sum():
    cfg = make_config("ln", p=23, d_model=16, d_mlp=32, n_heads=2, d_head=8)
    model = GeoTransformer(cfg)
    res = progress_measures.weight_norm(model)
    manual = sum(float(p.detach().double().square().sum()) for p in model.parameters())
    assert res["total_sq"] == pytest.approx(manual)
    assert res["frobenius"] == pytest.approx(math.sqrt(manual))
    assert res["embed.W_E"] == pytest.approx(float(model.embed.W_E.detach().double().square().sum()))


def _truncated_reference(logits, labels, k):
    """The definition: rfft over classes, keep DC + top-k bins by summed energy, irfft, argmax."""
    n = logits.shape[-1]
    X = torch.fft.rfft(logits.double(), dim=-1)
    energy = X.abs().square().sum(0)
    energy[0] = -1.0
    bins = energy.topk(k).indices
    keep = torch.zeros(energy.numel(), dtype=torch.bool)
    keep[0] = True
    keep[bins] = True
    trunc = torch.fft.irfft(X * keep, n=n, dim=-1)
    return float((trunc.argmax(-1) == labels).double().mean()), bins


@pytest.mark.parametrize("n", [29, 28])
def test_truncated_logit_accuracy_matches_rfft_on_random_logits(n):
    g = torch.Generator().manual_seed(n)
    labels = torch.randint(0, n, (2000,), generator=g)
    waves = torch.cos(2 * math.pi * torch.tensor([3, n // 2, 5])[:, None, None] * (labels[None, :, None] - torch.arange(n)) / n)
    logits = (torch.tensor([1.0, 0.8, 0.6])[:, None, None] * waves).sum(0) + 0.7 * torch.randn(2000, n, generator=g) + 5.0
    masks = {"a": torch.rand(2000, generator=g) < 0.3}
    masks["b"] = ~masks["a"]
    got = progress_measures.truncated_logit_accuracies(logits, labels, masks, k=4)
    for name, m in masks.items():
        acc, bins = _truncated_reference(logits[m], labels[m], 4)
        assert got[name][1].tolist() == bins.tolist()
        assert got[name][0] == pytest.approx(acc, abs=1.5 / m.sum().item())  # at most one argmax flip
    assert progress_measures.truncated_logit_accuracy(logits, labels, 4)[1].tolist() == _truncated_reference(logits, labels, 4)[1].tolist()
    assert math.isnan(progress_measures.truncated_logit_accuracies(logits, labels, {"none": torch.zeros(2000, dtype=torch.bool)})["none"][0])
