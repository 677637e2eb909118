"""Key-frequency rules and FVE on constructed embeddings, W_L and activations."""

import math

import pytest
import torch

from geolens.analysis import fourier, fve, keyfreq
from geolens.model.config import make_config

P = 23


def _frame(task="add", p=P):
    return fourier.cyclic_frame(make_config("ln", task=task, p=p))


def test_keyfreq_embed_on_a_pure_fourier_embedding():
    x = torch.arange(P, dtype=torch.float64)
    cols = []
    for k, amp in [(3, 3.0), (7, 2.0), (11, 1.0)]:  # 11 is the top frequency of Z_23
        cols += [amp * torch.cos(2 * math.pi * k * x / P), amp * torch.sin(2 * math.pi * k * x / P)]
    W_E = torch.stack(cols + [torch.zeros(P)] * 2, dim=1).float()  # [p, 8]
    assert keyfreq.keyfreq_embed(W_E).tolist() == [3, 7, 11]
    norms = keyfreq.embed_freq_norms(W_E)
    assert norms[[0, 1, 3, 4, 5, 7]].abs().max() < 1e-4  # nothing at other frequencies


def test_keyfreq_wl_fft_on_a_constructed_W_L():
    g = torch.Generator().manual_seed(0)
    keys = [9, 4, 13, 2, 17]  # decreasing amplitude
    c = torch.arange(59, dtype=torch.float64)
    W_L = torch.zeros(64, 59, dtype=torch.float64)
    for rank, k in enumerate(keys):
        amp = torch.rand(64, 1, generator=g, dtype=torch.float64) + (5 - rank)
        phase = 2 * math.pi * torch.rand(64, 1, generator=g, dtype=torch.float64)
        W_L += amp * torch.cos(2 * math.pi * k * c / 59 + phase)
    W_L += 3.0  # a DC offset must not count
    assert keyfreq.keyfreq_wl_fft(W_L.float(), k=5).tolist() == keys
    assert keyfreq.wl_topk_share(W_L.float(), torch.tensor(keys)) == pytest.approx(1.0, abs=1e-5)
    assert keyfreq.keyfreq_wl_fft(W_L.float(), k=2).tolist() == keys[:2]


def _wave_acts(frame, freqs_per_neuron, seed=0):
    """acts[i, j, n] = a_n cos(w_k s + phi_n) + b_n with s the label position and k = freqs[n]."""
    g = torch.Generator().manual_seed(seed)
    d = len(freqs_per_neuron)
    k = torch.tensor(freqs_per_neuron, dtype=torch.float64)
    s = frame.label_pos.to(torch.float64)[..., None]
    amp = 1 + torch.rand(d, generator=g, dtype=torch.float64)
    phase = 2 * math.pi * torch.rand(d, generator=g, dtype=torch.float64)
    off = torch.randn(d, generator=g, dtype=torch.float64)
    return (amp * torch.cos(2 * math.pi * k * s / frame.n + phase) + off).float()


@pytest.mark.parametrize("task", ["add", "sub", "mul"])
def test_keyfreq_neuron_and_fve_neuron_on_clean_neurons(task):
    frame = _frame(task)
    freqs = [3] * 5 + [7] * 8 + [5] * 3
    acts = _wave_acts(frame, freqs)
    shares, active = keyfreq.neuron_freq_shares(acts)
    assert active.all()
    assert torch.allclose(shares.max(1).values, torch.ones(len(freqs)), atol=1e-4)
    keys, counts = keyfreq.keyfreq_neuron(shares)
    assert keys.tolist() == [7, 3, 5] and counts.tolist() == [8, 5, 3]
    res = fve.fve_neuron(shares, active)
    assert res["frac"] == 1.0 and res["mean"] == pytest.approx(1.0, abs=1e-4)


def test_neuron_block_includes_the_single_operand_terms():
    """A neuron of frequency k may also carry cos(w a) and sin(w b) (const x wave blocks)."""
    s = torch.arange(P, dtype=torch.float64)
    w = 2 * math.pi * 6 / P
    a, b = s[:, None], s[None, :]
    acts = (torch.cos(w * a) + 0.5 * torch.sin(w * b) + torch.cos(w * (a + b)) + 2.0)[..., None]
    acts = torch.cat([acts, torch.cos(2 * math.pi * 3 * a / P)[..., None].expand(P, P, 1)], dim=-1).float()
    shares, active = keyfreq.neuron_freq_shares(acts)
    assert shares[0, 5] == pytest.approx(1.0, abs=1e-5)  # frequency 6 is column 5
    assert shares[1, 2] == pytest.approx(1.0, abs=1e-5)  # a pure cos(w_3 a) neuron
    assert sorted(keyfreq.keyfreq_neuron(shares)[0].tolist()) == [3, 6]


def test_fve_neuron_on_noise_and_dead_neurons():
    g = torch.Generator().manual_seed(3)
    acts = torch.randn(P, P, 20, generator=g).relu()
    acts[..., :4] = 0.0  # dead
    acts[..., 4] = 2.5  # constant
    shares, active = keyfreq.neuron_freq_shares(acts)
    assert active.tolist() == [False] * 5 + [True] * 15
    res = fve.fve_neuron(shares, active)
    assert res["frac"] == 0.0 and res["mean"] < 0.5 and res["active"] == 0.75
    assert keyfreq.keyfreq_neuron(shares)[0].numel() == 0


@pytest.mark.parametrize("task", ["add", "mul"])
def test_fve_paper_is_100_for_activations_made_of_sum_waves(task):
    """Neurons in groups, one key frequency per group; W_L rows of a group oscillate at that
    group's frequency, so u_k and v_k only see the group of k."""
    frame = _frame(task)
    keys = [2, 6, 9]
    groups = [keys[i // 10] for i in range(30)]
    acts = _wave_acts(frame, groups, seed=1)
    g = torch.Generator().manual_seed(2)
    c = torch.arange(frame.n, dtype=torch.float64)
    k = torch.tensor(groups, dtype=torch.float64)[:, None]
    W_L = (torch.cos(2 * math.pi * k * c / frame.n + 2 * math.pi * torch.rand(30, 1, generator=g, dtype=torch.float64))).float()
    U, V = fve.fve_paper(acts, W_L, torch.tensor(keys), frame)
    assert torch.allclose(U, torch.full((3,), 100.0), atol=1e-3)
    assert torch.allclose(V, torch.full((3,), 100.0), atol=1e-3)


def test_fve_paper_is_low_for_noise():
    frame = _frame()
    g = torch.Generator().manual_seed(4)
    acts = torch.randn(P, P, 32, generator=g)
    W_L = torch.randn(32, P, generator=g)
    U, V = fve.fve_paper(acts, W_L, torch.tensor([1, 2, 3]), frame)
    assert (U < 10).all() and (V < 10).all()


def _shares_reference(acts):
    """The definition in float64: block energies of the full 2-D spectrum."""
    E = fourier.channel_freq_energy(acts.double())  # [K1, K1, d]
    K = acts.shape[0] // 2
    block = torch.stack([E[0, k] + E[k, 0] + E[k, k] for k in range(1, K + 1)])
    return (block / (E.sum((0, 1)) - E[0, 0])).T


@pytest.mark.parametrize("n", [23, 22])
@pytest.mark.parametrize("chunk_bytes", [1 << 30, 3000])  # one block of rows / many blocks
def test_neuron_freq_shares_match_the_full_2d_spectrum(n, chunk_bytes, monkeypatch):
    monkeypatch.setattr(keyfreq, "CHUNK_BYTES", chunk_bytes)
    g = torch.Generator().manual_seed(n)
    acts = (torch.randn(n, n, 40, generator=g) + 2.0 * torch.rand(40, generator=g)).relu()
    acts[..., 0] = 0.0  # dead
    acts[..., 1] = 7.5  # constant
    acts[..., 2] = 50.0 + 0.05 * torch.randn(n, n, generator=g)  # small variation on a large mean
    i = torch.arange(n, dtype=torch.float64)
    w = 2 * math.pi * (n // 2) / n  # the Nyquist frequency of even n, sin = 0 there
    acts[..., 3] = (torch.cos(w * (i[:, None] - i[None, :])) + torch.cos(w * i)[:, None]).float()
    shares, active = keyfreq.neuron_freq_shares(acts)
    assert active.tolist() == [False, False] + [True] * 38
    ref = _shares_reference(acts)
    assert torch.allclose(shares[3:].double(), ref[3:], atol=2e-6)
    # neuron 2: float32 sums of values ~50 that vary by ~0.05 keep ~4 digits of the variation
    assert torch.allclose(shares[2].double(), ref[2], atol=1e-4)
    assert (shares[:2] == 0).all()


def _fve_paper_reference(acts, W_L, freqs, frame):
    """The definition in float64: explicit [n^2, 2] regressors per key and lstsq."""
    n = frame.n
    acts, W_L = acts.double(), W_L.double()
    c = torch.arange(n, dtype=torch.float64)
    s = frame.label_pos.flatten().double()
    U, V = [], []
    for k in freqs.tolist():
        X = torch.stack([torch.cos(2 * math.pi * k * s / n), torch.sin(2 * math.pi * k * s / n)], 1)
        X = X - X.mean(0)
        out = []
        for wave in (torch.cos(2 * math.pi * k * c / n), torch.sin(2 * math.pi * k * c / n)):
            y = acts.reshape(n * n, -1) @ (W_L @ wave)
            y = y - y.mean()
            resid = y - X @ (torch.linalg.pinv(X) @ y)
            out.append(100 * (1 - resid.square().sum() / y.square().sum()))
        U.append(out[0])
        V.append(out[1])
    return torch.stack(U), torch.stack(V)


@pytest.mark.parametrize("task", ["add", "sub", "mul"])
def test_fve_paper_matches_the_definition(task):
    frame = _frame(task)
    n = frame.n
    acts = _wave_acts(frame, [2, 5, 5, n // 2] * 4, seed=7) + torch.randn(n, n, 16, generator=torch.Generator().manual_seed(8))
    W_L = torch.randn(16, n, generator=torch.Generator().manual_seed(9))
    freqs = torch.tensor([5, 2, n // 2, 1])
    U, V = fve.fve_paper(acts, W_L, freqs, frame)
    rU, rV = _fve_paper_reference(acts, W_L, freqs, frame)
    assert torch.allclose(U.double(), rU, atol=1e-4)
    assert torch.allclose(V.double(), rV, atol=1e-4, equal_nan=True)
