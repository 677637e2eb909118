"""The fast path (geolens.model.fast), and the deep engine on the same one-layer models, against the hooked
GeoTransformer: same logits, same gradients.

Every preset x modifier x task at small p and small widths, on the initial weights and on
"trained-looking" weights (scaled embeddings and projections, non-trivial norm gains/offsets,
biases), with relative error <= 1e-5 on the logits and on every parameter gradient.
"""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch
import torch.nn.functional as F

from geolens.errors import GeoError
from geolens.model import config, fast
from geolens.model.config import GeoConfig, make_config
from geolens.model.fast import fast_eq_forward, fast_flops, fast_logits, fast_unsupported_reason, stacked_fast_logits
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer
from geolens.model.deep import deep_logits
from geolens.model.engines import choose_engine

TOL = 1e-5
SMALL = dict(p=23, n_perm=4, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5)
PRESETS = ["ln", "rms", "none", "sphere", "fb", "sphere_raw"]
MODIFIERS = ["", "+uniform", "+fourier", "+uniform+fourier"]
TASKS = ["add", "sub", "mul", "perm"]


def _config(preset: str, task: str, **overrides):
    fields = {**SMALL, "task": task, **overrides}
    if "fourier" in preset:
        fields["fourier_init"] = [1, 3, 5]  # the paper's frequencies need p = 113
    return make_config(preset, **fields)


@torch.no_grad()
def _trained_looking(model: GeoTransformer, seed: int) -> None:
    """Move the weights away from their initialisation the way training does: larger embeddings
    and projections (sharper attention), norm gains/offsets and biases away from 1/0."""
    g = torch.Generator().manual_seed(seed)
    for name, param in model.named_parameters():
        leaf = name.rsplit(".", 1)[-1]
        noise = torch.randn(param.shape, generator=g)
        if leaf == "w":
            param.copy_(0.5 + noise.abs())
        elif leaf in ("b", "b_in", "b_out"):
            param.copy_(0.3 * noise)
        elif leaf in ("W_Q", "W_K"):
            param.mul_(4.0)
        elif leaf in ("W_E", "W_pos"):
            param.mul_(2.0).add_(0.5 * noise)
        else:
            param.mul_(2.0)


def _grads(model: GeoTransformer, logits: torch.Tensor, labels: torch.Tensor, probe: torch.Tensor):
    loss = F.cross_entropy(logits, labels) + (logits * probe).sum() / len(labels)
    model.zero_grad(set_to_none=True)
    loss.backward()
    return {n: (None if p.grad is None else p.grad.clone()) for n, p in model.named_parameters()}


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _compare(model: GeoTransformer, tokens: torch.Tensor, labels: torch.Tensor, forward=fast_logits) -> dict[str, float]:
    """Relative errors (forward(model, tokens), default fast_logits, vs hooked) of the logits and of
    every parameter gradient; a gradient that is None on one side only counts as an infinite error."""
    probe = torch.randn(len(labels), model.cfg.d_vocab_out, generator=torch.Generator().manual_seed(7)).to(tokens.device)
    ref_logits = model(tokens)[:, -1]
    ref = _grads(model, ref_logits, labels, probe)
    out_logits = forward(model, tokens)
    out = _grads(model, out_logits, labels, probe)
    errors = {"logits": _rel(out_logits.detach(), ref_logits.detach())}
    for name, g_ref in ref.items():
        g_out = out[name]
        if g_ref is None or g_out is None:
            errors[name] = 0.0 if g_ref is None and g_out is None else float("inf")
        elif g_ref.norm() == 0:
            errors[name] = float(g_out.norm())
        else:
            errors[name] = _rel(g_out, g_ref)
    return errors


def _assert_close(errors: dict[str, float]) -> None:
    bad = {k: v for k, v in errors.items() if not v <= TOL}
    assert not bad, f"fast path differs from the hooked model (relative error > {TOL}): {bad}"


CASES = [
    (preset + mod, task)
    for preset in PRESETS
    for mod in MODIFIERS
    for task in TASKS
    if not ("fourier" in mod and task == "perm")
]


#: the engines that serve these one-layer models, each checked by every case below (tests/test_engines.py covers
#: the configurations only the deep engine serves)
ENGINE_FORWARDS = {"fast": fast_logits, "deep": deep_logits}


@pytest.mark.parametrize("engine", ENGINE_FORWARDS)
@pytest.mark.parametrize("trained", [False, True], ids=["init", "trained"])
@pytest.mark.parametrize("preset,task", CASES)
def test_logits_and_every_gradient_match_hooked(preset, task, trained, engine):
    cfg = _config(preset, task, seed=3)
    assert fast_unsupported_reason(cfg) is None
    model = GeoTransformer(cfg)
    if trained:
        _trained_looking(model, seed=11)
    tokens, labels = make_dataset(cfg).train
    _assert_close(_compare(model, tokens, labels, forward=ENGINE_FORWARDS[engine]))


@pytest.mark.parametrize("engine", ENGINE_FORWARDS)
@pytest.mark.parametrize("preset", ["ln", "fb", "rms+uniform"])
def test_causal_models_match(preset, engine):
    cfg = _config(preset, "add", causal=True)
    model = GeoTransformer(cfg)
    _trained_looking(model, seed=5)
    tokens, labels = make_dataset(cfg).train
    _assert_close(_compare(model, tokens, labels, forward=ENGINE_FORWARDS[engine]))


@pytest.mark.parametrize("preset", ["ln", "sphere+uniform"])
def test_uneven_batches_match(preset):
    """Batches whose tokens repeat very unevenly (one token in most rows), a single row, and the
    full input grid exercise the per-token grouping of the backward."""
    cfg = _config(preset, "add")
    model = GeoTransformer(cfg)
    _trained_looking(model, seed=2)
    data = make_dataset(cfg)
    g = torch.Generator().manual_seed(0)
    skewed = data.tokens[torch.randint(0, len(data.tokens), (300,), generator=g)].clone()
    skewed[:250, 0] = 4
    skewed[100:, 1] = 9
    for tokens in (skewed, data.tokens[:1], data.tokens):
        labels = torch.randint(0, cfg.d_vocab_out, (len(tokens),), generator=g)
        _assert_close(_compare(model, tokens, labels))


@pytest.mark.parametrize("preset", ["ln", "rms", "none", "fb", "fb+uniform", "sphere_raw+uniform"])
def test_reused_forward_gives_the_hooked_logits_and_gradients(preset):
    """fast_logits(reuse=(fast_eq_forward over all inputs, rows)) on the training rows: the
    gathered forward gives the same logits and gradients as the hooked model."""
    cfg = _config(preset, "add")
    model = GeoTransformer(cfg)
    _trained_looking(model, seed=4)
    data = make_dataset(cfg)
    eq = fast_eq_forward(model, data.tokens)
    tokens, labels = data.train
    _assert_close(_compare(model, tokens, labels, lambda m, t: fast_logits(m, t, reuse=(eq, data.train_idx))))


def test_reuse_refuses_stale_weights_or_other_rows():
    cfg = _config("fb", "add")
    model = GeoTransformer(cfg)
    data = make_dataset(cfg)
    eq = fast_eq_forward(model, data.tokens)
    tokens = data.tokens[data.train_idx]
    with pytest.raises(GeoError, match="current parameters"):
        fast_logits(model, tokens, reuse=(eq, data.test_idx[: len(tokens)]))
    with torch.no_grad():
        model.blocks[0].mlp.W_out.mul_(1.5)
    with pytest.raises(GeoError, match="current parameters"):
        fast_logits(model, tokens, reuse=(eq, data.train_idx))


@pytest.mark.parametrize("preset", ["ln", "rms+uniform", "fb", "fb+uniform", "sphere_raw", "none+uniform"])
def test_stacked_members_equal_their_single_runs(preset):
    """stacked_fast_logits over 3 members (own weights, own data split): each member's logits and
    every parameter gradient equal that member's fast_logits run alone and the hooked model's."""
    cfgs = [_config(preset, "add", seed=s, data_seed=s) for s in (1, 2, 3)]
    models = [GeoTransformer(c) for c in cfgs]
    for i, m in enumerate(models):
        _trained_looking(m, seed=20 + i)
    data = [make_dataset(c).train for c in cfgs]
    names = [n for n, _ in models[0].named_parameters()]
    params = {n: torch.stack([m.get_parameter(n).detach() for m in models]).requires_grad_(True) for n in names}
    logits = stacked_fast_logits(cfgs[0], params, [x for x, _ in data])
    probe = torch.randn(logits.shape, generator=torch.Generator().manual_seed(7))
    loss = sum(F.cross_entropy(logits[i], y) for i, (_, y) in enumerate(data)) + (logits * probe).sum()
    loss.backward()
    for i, (m, (x, y)) in enumerate(zip(models, data)):
        single = _grads(m, fast_logits(m, x), y, probe[i] * len(y))
        hooked = _grads(m, m(x)[:, -1], y, probe[i] * len(y))
        assert _rel(logits[i].detach(), m(x)[:, -1].detach()) <= TOL
        assert _rel(logits[i].detach(), fast_logits(m, x).detach()) <= 1e-6
        for n in names:
            if hooked[n] is None:
                assert params[n].grad is None or not params[n].grad[i].any(), n
                continue
            assert _rel(params[n].grad[i], single[n]) <= 1e-6, (i, n)
            assert _rel(params[n].grad[i], hooked[n]) <= TOL, (i, n)


def test_stacked_members_need_one_batch_size():
    cfg = _config("ln", "add")
    m = GeoTransformer(cfg)
    params = {n: p.detach()[None].repeat(2, *[1] * p.dim()) for n, p in m.named_parameters()}
    x = make_dataset(cfg).train[0]
    with pytest.raises(GeoError, match="same batch size"):
        stacked_fast_logits(cfg, params, [x, x[:-1]])


def test_no_grad_evaluation_matches():
    cfg = _config("fb", "add")
    model = GeoTransformer(cfg)
    _trained_looking(model, seed=1)
    tokens = make_dataset(cfg).test[0]
    with torch.no_grad():
        ref, out = model(tokens)[:, -1], fast_logits(model, tokens)
    assert not out.requires_grad
    assert _rel(out, ref) <= TOL


def test_uniform_attention_leaves_query_and_key_without_gradient():
    cfg = _config("ln+uniform", "add")
    model = GeoTransformer(cfg)
    tokens, labels = make_dataset(cfg).train
    F.cross_entropy(fast_logits(model, tokens), labels).backward()
    attn = model.blocks[0].attn
    assert attn.W_Q.grad is None and attn.W_K.grad is None
    assert attn.W_V.grad is not None and attn.W_O.grad is not None


def test_cached_token_indices_follow_in_place_changes():
    cfg = _config("ln", "add")
    model = GeoTransformer(cfg)
    data = make_dataset(cfg)
    tokens, labels = data.train[0].clone(), data.train[1]
    fast_logits(model, tokens)  # fills the cache for this tensor
    tokens[:, :2] = tokens[:, :2].flip(0)  # same object, new content
    _assert_close(_compare(model, tokens, labels))


def test_comparison_detects_a_wrong_gradient():
    """The check above can fail: a gradient off by 1e-4 (relative) is reported."""
    cfg = _config("ln", "add")
    model = GeoTransformer(cfg)
    tokens, labels = make_dataset(cfg).train
    errors = _compare(model, tokens, labels)
    _assert_close(errors)
    probe = torch.zeros(len(labels), cfg.d_vocab_out)
    ref = _grads(model, model(tokens)[:, -1], labels, probe)
    wrong = ref["blocks.0.mlp.W_in"] * (1 + 1e-4)
    assert _rel(wrong, ref["blocks.0.mlp.W_in"]) > TOL
    with pytest.raises(AssertionError):
        _assert_close({**errors, "blocks.0.mlp.W_in": _rel(wrong, ref["blocks.0.mlp.W_in"])})


def test_two_layer_models_fall_back_with_a_reason():
    cfg = _config("ln", "add", n_layers=2)
    reason = fast_unsupported_reason(cfg)
    assert isinstance(reason, str) and "n_layers" in reason
    model = GeoTransformer(cfg)
    with pytest.raises(GeoError, match="n_layers"):
        fast_logits(model, make_dataset(cfg).train[0])


def test_every_config_field_is_declared_by_the_fast_path():
    """A new GeoConfig field must be classified in geolens.model.fast before the fast path runs it."""
    declared = {"n_layers", "norm", "unembed", "attention", "norm_placement"} | fast.FAST_VALUE_FIELDS | fast.FAST_IGNORED_FIELDS
    assert declared == {f.name for f in dataclasses.fields(GeoConfig)}
    assert not fast.FAST_VALUE_FIELDS & fast.FAST_IGNORED_FIELDS


@pytest.mark.parametrize("field,options", [("norm", "NORMS"), ("unembed", "UNEMBEDS"), ("attention", "ATTENTIONS")])
def test_an_option_added_to_the_config_is_refused_by_the_fast_path(field, options, monkeypatch):
    """Adding a norm (readout, attention mode) to the config's choices does not enable it on the fast path."""
    old = getattr(config, options)
    for module in [m for name, m in sys.modules.items() if name.startswith("geolens")]:  # as if edited in config.py
        if getattr(module, options, None) is old:
            monkeypatch.setattr(module, options, (*old, "brand_new"))
    declared = GeoConfig.__dataclass_fields__[field]  # and in the field's declared choices
    roles = dataclasses.replace(declared.metadata["roles"], choices=(*old, "brand_new"))
    monkeypatch.setattr(declared, "metadata", {"roles": roles})
    cfg = _config("ln", "add", **{field: "brand_new"})
    reason = fast_unsupported_reason(cfg)
    assert reason is not None and field in reason and "brand_new" in reason
    with pytest.raises(GeoError, match="brand_new"):
        stacked_fast_logits(cfg, {}, [make_dataset(cfg).train[0]])
    assert choose_engine(cfg)[0].name == "hooked"  # the deep engine refuses an undeclared option too


def test_rejects_rows_with_a_different_last_token():
    cfg = _config("ln", "add")
    model = GeoTransformer(cfg)
    tokens = make_dataset(cfg).train[0].clone()
    tokens[3, 2] = 0
    with pytest.raises(GeoError, match="position 2"):
        fast_logits(model, tokens)
    with pytest.raises(GeoError, match="shape"):
        fast_logits(model, tokens[:, :2])


def test_flop_count_is_positive_and_grows_with_the_batch():
    cfg = make_config("ln")
    small, large = fast_flops(cfg, 100), fast_flops(cfg, 200)
    assert all(v > 0 for v in small.values())
    assert large["dense"] == 2 * small["dense"]
    assert sum(fast_flops(cfg, 100, backward=False).values()) < sum(small.values())




def test_empty_batch():
    cfg = _config("fb", "add")
    model = GeoTransformer(cfg)
    tokens = make_dataset(cfg).train[0][:0]
    assert fast_logits(model, tokens).shape == (0, cfg.d_vocab_out)


def _mm_cases():
    g = torch.Generator().manual_seed(0)
    for M in (1, 2):
        x, w = torch.randn(M, 300, 24, generator=g), torch.randn(M, 16, 24, generator=g).transpose(1, 2)
        for c in (None, torch.randn(M, 1, 16, generator=g), torch.randn(M, 300, 16, generator=g)):
            yield x, w, c, torch.bmm(x, w) if c is None else torch.baddbmm(c, x, w)


def test_dense_matmul_helper_equals_bmm(monkeypatch):
    """fast._mm is bmm / baddbmm up to rounding, through oneDNN's linear for one CPU member (only)
    where the build has oneDNN."""
    op, calls = fast._onednn_linear(), []
    if torch.backends.mkldnn.is_available():
        assert op is not None, "oneDNN is built in but its linear op was not picked up"
        monkeypatch.setattr(fast, "_onednn_linear", lambda: lambda *a: calls.append(a) or op(*a))
    for x, w, c, ref in _mm_cases():
        assert _rel(fast._mm(x, w, c), ref) < 1e-6
    assert len(calls) == (3 if op is not None else 0)


def test_without_onednn_the_fast_path_uses_bmm(monkeypatch):
    monkeypatch.setattr(fast, "_onednn_linear", lambda: None)
    for x, w, c, ref in _mm_cases():
        assert torch.equal(fast._mm(x, w, c), ref)
    cfg = _config("ln", "add")
    model = GeoTransformer(cfg)
    _trained_looking(model, seed=4)
    _assert_close(_compare(model, *make_dataset(cfg).train))


def test_the_backward_names_its_inputs_in_the_forwards_order():
    """need.Wr etc. in the backward read ctx.needs_input_grad by the forward's parameter names."""
    import inspect

    params = list(inspect.signature(fast._LogitsFromTables.forward).parameters)[1:]
    assert list(fast._NeedsGrad._fields) == params
