"""Training on a device (cfg.device): validation and clear refusals everywhere; on a CUDA machine
(these tests are skipped without one) the fast and deep engines equal the hooked model there, stacked members
their single runs at one and two layers, a CUDA run
follows the CPU run and is bit-reproducible, a CPU run resumes on the GPU, and every run stays
readable on the CPU."""

import pytest
import torch
import torch.nn.functional as F
from test_fast import _assert_close, _compare, _config, _trained_looking
from test_train import _strip

from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.model.engines import engine_named
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.runs.run import load_run
from geolens.training import train as training
from geolens.training.batched import StackedForward, member_losses, train_batched

TINY = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5, lr=1e-3)
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _files(path):
    return {p: p.read_bytes() for p in path.rglob("*") if p.is_file()}


def test_device_must_name_a_device():
    with pytest.raises(GeoError, match="'gpu' is not a device; use cpu, cuda or cuda:N"):
        make_config("fb", device="gpu")
    assert make_config("fb", device="cuda:1").device == "cuda:1"


def test_a_gpu_that_is_not_there_is_refused_before_anything_is_written(tmp_path):
    n = torch.cuda.device_count()
    missing = f"cuda:{n}"
    cfg = make_config("fb", epochs=10, eval_every=5, **TINY)
    training.train(cfg, tmp_path / "r", progress=False)
    before = _files(tmp_path)
    with pytest.raises(GeoError, match=f"sees {n} CUDA device"):
        training.train(cfg.replace(device=missing), tmp_path / "r", force=True, progress=False)
    with pytest.raises(GeoError, match="use --set device=cpu"):
        training.resume(tmp_path / "r", progress=False, epochs=20, device=missing)
    with pytest.raises(GeoError, match=f"sees {n} CUDA device"):
        train_batched([cfg.replace(device=missing)], [tmp_path / "r"], force=True, progress=False)
    assert _files(tmp_path) == before


@cuda
@pytest.mark.parametrize("preset", ["ln", "rms", "fb", "fb+uniform", "sphere_raw", "none+uniform"])
def test_fast_path_matches_hooked_on_cuda(preset):
    cfg = _config(preset, "add", seed=3)
    model = GeoTransformer(cfg)
    _trained_looking(model, seed=11)
    model.cuda()
    tokens, labels = (t.cuda() for t in make_dataset(cfg).train)
    _assert_close(_compare(model, tokens, labels))


@cuda
@pytest.mark.parametrize("preset,over", [("ln", {}), ("ln", dict(n_layers=2, norm_placement="pre")),
                                         ("sphere", dict(n_layers=2, norm="sphere,layernorm"))],
                         ids=["ln-1", "ln-pre-2", "hybrid-2"])
def test_deep_engine_matches_hooked_on_cuda(preset, over):
    """The deep engine (any depth, placement, per-layer norms) on the GPU: logits and every gradient within 1e-4 of
    the hooked model on the GPU (trained-looking weights; a wrong formula is off by O(1))."""
    cfg = make_config(preset, seed=3, **TINY, **over)
    model = GeoTransformer(cfg)
    _trained_looking(model, seed=11)
    model.cuda()
    tokens, labels = (t[:400].cuda() for t in make_dataset(cfg).train)
    errors = _compare(model, tokens, labels, forward=engine_named("deep").logits)
    assert max(errors.values()) <= 1e-4, errors


@cuda
@pytest.mark.parametrize("over", [{}, dict(n_layers=2, norm_placement="pre")], ids=["1-layer", "2-layer-pre"])
def test_stacked_members_on_cuda_equal_their_single_runs(over):
    cfgs = [make_config("ln", seed=s, data_seed=s, **TINY, **over) for s in (1, 2, 3)]
    models = [GeoTransformer(c).cuda() for c in cfgs]
    data = [make_dataset(c).train for c in cfgs]
    x, y = [d[0].cuda() for d in data], torch.stack([d[1] for d in data]).cuda()
    losses = member_losses(StackedForward(models)(x), y)
    losses.sum().backward()
    stacked = [{n: p.grad.clone() for n, p in m.named_parameters()} for m in models]
    for m, xi, yi, loss, grads in zip(models, x, y, losses, stacked):
        m.zero_grad(set_to_none=True)
        single = F.cross_entropy(m(xi)[:, -1], yi)
        single.backward()
        assert abs(single.item() - loss.item()) <= 1e-5 * abs(single.item())
        for n, p in m.named_parameters():
            assert float((grads[n] - p.grad).norm()) <= 1e-4 * float(p.grad.norm()) + 1e-7, n


@cuda
def test_a_cuda_run_follows_the_cpu_run_and_reads_back_on_the_cpu(tmp_path):
    cfg = make_config("ln", epochs=60, eval_every=10, checkpoints="every:20", seed=2, **TINY)
    training.train(cfg, tmp_path / "cpu", progress=False)
    gpu = training.train(cfg.replace(device="cuda"), tmp_path / "gpu", progress=False)
    assert gpu.engine == "fast"
    cpu_run, gpu_run = load_run(tmp_path / "cpu"), load_run(tmp_path / "gpu")
    assert cpu_run.steps == gpu_run.steps
    for a, b in zip(cpu_run.metrics, gpu_run.metrics):
        assert a["epoch"] == b["epoch"] and abs(a["train_loss"] - b["train_loss"]) <= 1e-3 * a["train_loss"] + 1e-6
    model = gpu_run.model_at(60)  # analysis loads every run on the CPU
    assert next(model.parameters()).device.type == "cpu"
    for name, w in cpu_run.model_at(60).state_dict().items():
        assert torch.allclose(model.state_dict()[name], w, rtol=1e-3, atol=1e-4), name


@cuda
def test_a_cpu_run_resumes_on_cuda(tmp_path):
    cfg = make_config("fb", epochs=40, eval_every=10, checkpoints="every:20", seed=2, **TINY)
    training.train(cfg.replace(epochs=20), tmp_path / "r", progress=False)
    result = training.resume(tmp_path / "r", progress=False, epochs=40, device="cuda")
    assert result.rows[-1]["epoch"] == 40
    run = load_run(tmp_path / "r")
    assert run.config.device == "cuda" and run.steps[-1] == 40


@cuda
def test_cuda_training_is_bit_reproducible(tmp_path):
    """The fast backward's scatter-adds are segment sums (no atomics), so one seed gives one run."""
    cfg = make_config("fb", p=113, epochs=60, eval_every=10, checkpoints="every:30", seed=1, device="cuda")
    runs = []
    for name in ("a", "b"):
        training.train(cfg, tmp_path / name, progress=False)
        train_batched([cfg.replace(seed=s, data_seed=s) for s in (1, 2)],
                      [tmp_path / f"{name}_s1", tmp_path / f"{name}_s2"], progress=False)
        runs.append([load_run(tmp_path / f"{name}{suffix}") for suffix in ("", "_s1", "_s2")])
    for a, b in zip(*runs):
        assert _strip(a.metrics) == _strip(b.metrics)
        wa, wb = a.model_at(60).state_dict(), b.model_at(60).state_dict()
        assert all(torch.equal(wa[k], wb[k]) for k in wa)
