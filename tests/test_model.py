"""GeoTransformer: hook names, geometric invariants, and equality with the paper's equations."""

import itertools
import json
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from transformer_lens.ActivationCache import ActivationCache

from geolens.errors import GeoError
from geolens.model.config import GeoConfig, make_config
from geolens.model.plain_model import PlainTransformer
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64)


def tokens_for(cfg, n=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    ab = torch.randint(0, cfg.n_classes, (n, 2), generator=g)
    return torch.cat([ab, torch.full((n, 1), cfg.n_classes)], dim=1)


# ---- the plain-PyTorch reference of the paper's forward equations (geolens.model.plain_model) ----------
def paper_forward(model, tokens):
    """h = N1(E[x] + P); h = N2(h + Attn(h)); h = N3(h + MLP(h)); logits = f(h) at every position."""
    return PlainTransformer(model.cfg).load_from(model)(tokens)


VARIANTS = list(itertools.product(["none", "layernorm", "rmsnorm", "sphere"], ["raw", "bounded"], ["learned", "uniform"]))


@pytest.mark.parametrize("norm,unembed,attention", VARIANTS)
def test_equals_paper_equations(norm, unembed, attention):
    cfg = GeoConfig(norm=norm, unembed=unembed, attention=attention, seed=3, **SMALL)
    model = GeoTransformer(cfg)
    with torch.no_grad():  # move norm gains/offsets away from 1/0 so they are exercised
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b")):
                p.add_(0.3 * torch.randn_like(p))
    tokens = tokens_for(cfg)
    diff32 = (model(tokens) - paper_forward(model, tokens)).abs().max().item()
    scale = paper_forward(model, tokens).abs().max().item()
    assert diff32 <= 1e-5 * max(1.0, scale)  # float32: equal up to rounding
    model.double()
    assert (model(tokens) - paper_forward(model, tokens)).abs().max().item() <= 1e-5 * 1e-3  # float64: exact


@pytest.mark.parametrize("extra", [dict(causal=True), dict(n_layers=2), dict(init="tl"), dict(task="perm", n_perm=4)])
def test_equals_paper_equations_other_settings(extra):
    cfg = GeoConfig(norm="layernorm", **{**SMALL, **extra})
    model = GeoTransformer(cfg)
    tokens = tokens_for(cfg)
    assert (model(tokens) - paper_forward(model, tokens)).abs().max().item() <= 1e-5


def test_hook_names_complete():
    model = GeoTransformer(make_config("fb", **SMALL))
    block = [
        "hook_resid_pre", "attn.hook_q", "attn.hook_k", "attn.hook_v", "attn.hook_attn_scores",
        "attn.hook_pattern", "attn.hook_z", "attn.hook_result", "hook_attn_out", "attn_norm.hook_scale",
        "attn_norm.hook_normalized", "hook_resid_mid", "mlp.hook_pre", "mlp.hook_post", "hook_mlp_out",
        "mlp_norm.hook_scale", "mlp_norm.hook_normalized", "hook_resid_post",
    ]
    expected = (
        ["hook_embed", "hook_pos_embed", "embed_norm.hook_scale", "embed_norm.hook_normalized"]
        + [f"blocks.0.{h}" for h in block]
        + ["unembed.hook_in", "unembed.hook_scores", "unembed.hook_logits"]
    )
    assert sorted(model.hook_dict) == sorted(expected)
    _, cache = model.run_with_cache(tokens_for(model.cfg, 8))
    assert list(cache.keys()) == [h for h in expected if h != "blocks.0.attn.hook_result"]  # in execution order
    model.set_use_attn_result(True)  # HookedTransformer's per-head writes
    _, cache = model.run_with_cache(tokens_for(model.cfg, 8))
    assert list(cache.keys()) == expected and cache["blocks.0.attn.hook_result"].shape == (8, 3, 4, model.cfg.d_model)
    raw = GeoTransformer(make_config("ln", **SMALL))
    assert "unembed.hook_scores" not in raw.hook_dict and "unembed.hook_logits" in raw.hook_dict


def test_parameter_names_and_shapes_follow_hooked_transformer():
    cfg = make_config("ln", **SMALL)
    shapes = {k: tuple(v.shape) for k, v in GeoTransformer(cfg).state_dict().items()}
    D, H, Dh, M = cfg.d_model, cfg.n_heads, cfg.d_head, cfg.d_mlp
    assert shapes["embed.W_E"] == (cfg.p + 1, D)
    assert shapes["pos_embed.W_pos"] == (3, D)
    for w in ("W_Q", "W_K", "W_V"):
        assert shapes[f"blocks.0.attn.{w}"] == (H, D, Dh)
    assert shapes["blocks.0.attn.W_O"] == (H, Dh, D)
    assert shapes["blocks.0.mlp.W_in"] == (D, M) and shapes["blocks.0.mlp.W_out"] == (M, D)
    assert shapes["unembed.W_U"] == (D, cfg.p)
    assert not any("b_Q" in k or "b_U" in k for k in shapes)  # the paper's model has no such biases


def test_sphere_residual_norm_is_one_at_every_projected_hook():
    model = GeoTransformer(make_config("fb", **SMALL))
    _, cache = model.run_with_cache(tokens_for(model.cfg))
    projected = [k for k in cache.keys() if k.endswith(("hook_normalized", "resid_pre", "resid_mid", "resid_post"))]
    assert len(projected) == 6
    for name in projected:
        norms = cache[name].norm(dim=-1)
        assert torch.allclose(norms, torch.ones_like(norms), atol=1e-6), name
    assert not torch.allclose(cache["hook_embed"].norm(dim=-1), torch.ones(1))  # the input was not unit norm


def test_uniform_attention_pattern_is_exactly_one_over_n_ctx():
    model = GeoTransformer(make_config("ln+uniform", **SMALL))
    _, cache = model.run_with_cache(tokens_for(model.cfg))
    pattern = cache["blocks.0.attn.hook_pattern"]
    assert pattern.shape[1:] == (4, 3, 3)
    assert torch.equal(pattern, torch.full_like(pattern, 1 / 3))
    assert torch.equal(cache["blocks.0.attn.hook_attn_scores"], torch.zeros_like(pattern))


@pytest.mark.parametrize("preset", ["fb", "sphere", "fb+uniform"])
def test_bounded_logits_within_tau(preset):
    model = GeoTransformer(make_config(preset, **SMALL))
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(5.0)  # large weights must not break the bound
    logits, cache = model.run_with_cache(tokens_for(model.cfg, 256))
    assert logits.abs().max() <= model.cfg.tau + 1e-5
    assert torch.allclose(cache["unembed.hook_logits"], model.cfg.tau * cache["unembed.hook_scores"])
    assert cache["unembed.hook_scores"].abs().max() <= 1 + 1e-6


def test_run_with_cache_gives_activation_cache_and_hooks_can_patch():
    model = GeoTransformer(make_config("fb", **SMALL))
    tokens = tokens_for(model.cfg, 16)
    _, cache = model.run_with_cache(tokens)
    assert isinstance(cache, ActivationCache)
    assert cache["blocks.0.mlp.hook_post"].shape == (16, 3, model.cfg.d_mlp)
    zeroed = model.run_with_hooks(tokens, fwd_hooks=[("blocks.0.hook_mlp_out", lambda x, hook: torch.zeros_like(x))])
    assert not torch.allclose(zeroed[:, -1], model(tokens)[:, -1])


def test_fourier_init_writes_cos_sin_columns():
    cfg = make_config("fb+fourier", p=113)
    W_E = GeoTransformer(cfg).embed.W_E
    x = torch.arange(113, dtype=torch.float64)
    for i, k in enumerate(cfg.fourier_init):
        assert torch.allclose(W_E[:113, 2 * i].double(), torch.cos(2 * math.pi * k * x / 113), atol=1e-6)
        assert torch.allclose(W_E[:113, 2 * i + 1].double(), torch.sin(2 * math.pi * k * x / 113), atol=1e-6)
    assert not torch.allclose(W_E[113, :2], torch.tensor([1.0, 0.0]))  # `=` keeps its random row


def test_init_is_seeded_and_follows_the_paper():
    cfg = make_config("ln", seed=5)
    a, b = GeoTransformer(cfg), GeoTransformer(cfg)
    assert all(torch.equal(x, y) for x, y in zip(a.parameters(), b.parameters()))
    c = GeoTransformer(cfg.replace(seed=6))
    assert not torch.equal(a.embed.W_E, c.embed.W_E)
    assert abs(a.embed.W_E.std().item() - 1.0) < 0.05  # nn.Embedding: N(0, 1)
    bound = 1 / math.sqrt(cfg.d_model)  # nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    assert a.blocks[0].attn.W_Q.abs().max() <= bound and a.blocks[0].attn.W_Q.abs().max() > 0.95 * bound
    assert a.blocks[0].mlp.W_out.abs().max() <= 1 / math.sqrt(cfg.d_mlp)


def test_model_runs_on_the_dataset():
    cfg = make_config("rms", **SMALL)
    x, y = make_dataset(cfg).train
    assert GeoTransformer(cfg)(x).shape == (len(y), 3, cfg.p)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_notebook_init_reproduces_the_author_notebooks_tensors(seed):
    # tests/data/notebook_init.json (a copy of ../shared/reference/notebook_init.json): the notebooks'
    # initial tensors for seeds 1-3 (shape, sum, sum of squares, first and last values), in their layout
    ref = json.loads((Path(__file__).parent / "data" / "notebook_init.json").read_text())["seeds"][str(seed)]
    model = GeoTransformer(make_config("fb+notebook", seed=seed))
    attn, mlp, D = model.blocks[0].attn, model.blocks[0].mlp, model.cfg.d_model

    def heads_to_linear(W):  # [H, D, Dh] -> nn.Linear weight [H * Dh, D]
        return W.permute(1, 0, 2).reshape(D, -1).T

    notebook = {"tok_embed.weight": model.embed.W_E, "pos_embed.weight": model.pos_embed.W_pos,
                "W_Q.weight": heads_to_linear(attn.W_Q), "W_K.weight": heads_to_linear(attn.W_K),
                "W_V.weight": heads_to_linear(attn.W_V), "W_O.weight": attn.W_O.reshape(-1, D).T,
                "mlp_in.weight": mlp.W_in.T, "mlp_in.bias": mlp.b_in, "mlp_out.weight": mlp.W_out.T,
                "mlp_out.bias": mlp.b_out, "unembed.weight": model.unembed.W_U.T}
    assert set(notebook) == set(ref)
    for name, want in ref.items():
        t = notebook[name].detach().contiguous()
        assert list(t.shape) == want["shape"], name
        assert t.double().sum().item() == pytest.approx(want["sum"], abs=1e-4), name
        assert t.double().square().sum().item() == pytest.approx(want["sum_sq"], abs=1e-3), name
        flat = t.flatten()
        assert torch.allclose(flat[: len(want["first"])], torch.tensor(want["first"]), atol=1e-6), name
        assert torch.allclose(flat[-len(want["last"]):], torch.tensor(want["last"]), atol=1e-6), name
    before = torch.random.get_rng_state()
    GeoTransformer(make_config("fb+notebook", seed=seed))
    assert torch.equal(torch.random.get_rng_state(), before)  # the caller's global generator is untouched


def test_notebook_init_keeps_fourier_and_norm_defaults():
    model = GeoTransformer(make_config("ln+notebook+fourier", seed=1))
    plain = GeoTransformer(make_config("ln+notebook", seed=1))
    assert torch.equal(model.blocks[0].attn.W_Q, plain.blocks[0].attn.W_Q)
    assert not torch.equal(model.embed.W_E[:, :2], plain.embed.W_E[:, :2])
    assert torch.equal(model.embed.W_E[:, 10:], plain.embed.W_E[:, 10:])
    assert torch.equal(model.embed_norm.w, torch.ones(model.cfg.d_model))


# ---- HookedTransformer habits -------------------------------------------------------------------
def test_weight_views_stack_layers_like_hooked_transformer():
    model = GeoTransformer(make_config("ln", n_layers=2, **SMALL))
    cfg = model.cfg
    L, H, D, Dh, M = 2, cfg.n_heads, cfg.d_model, cfg.d_head, cfg.d_mlp
    shapes = {"W_E": (cfg.d_vocab, D), "W_pos": (3, D), "W_Q": (L, H, D, Dh), "W_K": (L, H, D, Dh),
              "W_V": (L, H, D, Dh), "W_O": (L, H, Dh, D), "W_in": (L, D, M), "b_in": (L, M),
              "W_out": (L, M, D), "b_out": (L, D), "W_U": (D, cfg.d_vocab_out)}
    for name, shape in shapes.items():
        assert tuple(getattr(model, name).shape) == shape, name
    assert torch.equal(model.W_K[1], model.blocks[1].attn.W_K) and torch.equal(model.b_out[0], model.blocks[0].mlp.b_out)
    assert model.W_E is model.embed.W_E and model.W_U is model.unembed.W_U
    OV, QK = model.OV, model.QK
    assert OV.shape == (L, H, D, D) and QK.shape == (L, H, D, D)
    assert torch.allclose(OV.AB[1, 2], model.blocks[1].attn.W_V[2] @ model.blocks[1].attn.W_O[2])
    assert torch.allclose(QK.AB[0, 3], model.blocks[0].attn.W_Q[3] @ model.blocks[0].attn.W_K[3].T)


@pytest.mark.parametrize("preset", ["ln", "fb"])
def test_W_L_is_a_plain_tensor_in_the_readout_scale(preset):
    model = GeoTransformer(make_config(preset, **SMALL))
    W_L = model.W_L
    assert not W_L.requires_grad and W_L.numpy().shape == (64, 23)
    W_U = model.unembed.W_U.detach()
    if model.cfg.unembed == "bounded":  # unit-norm columns: the logits are tau times that
        W_U = W_U / W_U.norm(dim=0)
    assert torch.allclose(W_L, model.blocks[0].mlp.W_out.detach() @ W_U, atol=1e-6)


@pytest.mark.parametrize("task", ["add", "sub", "mul", "perm"])
def test_forward_return_types_and_task_loss(task):
    cfg = make_config("ln", task=task, n_perm=4, **SMALL)
    model = GeoTransformer(cfg)
    ds = make_dataset(cfg)
    tokens, labels = ds.tokens[::7], ds.labels[::7]
    logits = model(tokens)
    assert logits.shape == (len(tokens), 3, cfg.d_vocab_out)
    loss = F.cross_entropy(logits[:, -1], labels)  # the default labels are the task's answers
    assert torch.allclose(model(tokens, return_type="loss"), loss)
    both = model(tokens, return_type="both")
    assert torch.equal(both[0], logits) and torch.allclose(both[1], loss)
    assert model(tokens, return_type=None) is None
    per = model(tokens, return_type="loss", loss_per_token=True)
    assert per.shape == (len(tokens),) and torch.allclose(per.mean(), loss)
    other = (labels + 1) % cfg.d_vocab_out
    assert torch.allclose(model(tokens, return_type="loss", labels=other), F.cross_entropy(logits[:, -1], other))
    with pytest.raises(GeoError, match="return_type"):
        model(tokens, return_type="probs")
    with pytest.raises(GeoError, match="labels="):
        model(tokens[:, [2, 1, 0]], return_type="loss")  # `=` is not an operand


def test_to_tokens_and_to_str_tokens():
    model = GeoTransformer(make_config("ln", **SMALL))
    expected = torch.tensor([[17, 4, 23]])
    for example in ("17 + 4 =", "17 4", "17+4=", (17, 4)):
        assert torch.equal(model.to_tokens(example), expected), example
    assert torch.equal(model.to_tokens(["1 + 2 =", (3, 4)]), torch.tensor([[1, 2, 23], [3, 4, 23]]))
    assert model.to_str_tokens("17 + 4 =") == ["17", "4", "="]
    assert model.to_str_tokens(torch.tensor([[1, 2, 23]])) == [["1", "2", "="]]
    assert model.to_str_tokens([(1, 2), (3, 4)]) == [["1", "2", "="], ["3", "4", "="]]
    assert model.to_single_token("=") == 23 and model.to_single_token("5") == 5
    assert torch.equal(model("17 + 4 ="), model(expected))
    for bad in ("17 + 23 =", "17 =", "a + b =", "= + 4", (1, 2, 3), (1, 99)):
        with pytest.raises(GeoError):
            model.to_tokens(bad)
    perm = GeoTransformer(make_config("ln", task="perm", n_perm=4, **SMALL))
    tokens = perm.to_tokens("1023 o 0132 =")
    assert perm.to_str_tokens(tokens[0]) == ["1023", "0132", "="]
    assert perm(tokens, return_type="loss").ndim == 0
    with pytest.raises(GeoError, match="permutation"):
        perm.to_tokens("1123 o 0132 =")


def test_cfg_has_the_fields_transformer_lens_reads():
    cfg = make_config("ln", **SMALL)
    assert (cfg.act_fn, cfg.positional_embedding_type, cfg.default_prepend_bos) == ("relu", "standard", False)
    assert (cfg.d_vocab, cfg.d_vocab_out, cfg.n_ctx, cfg.device) == (24, 23, 3, "cpu")
    assert cfg.normalization_type == "LN" and cfg.norm_placement == "post"  # post-norm LayerNorm is not norm-free
    assert cfg.attn_only is False and cfg.n_key_value_heads is None and cfg.use_attn_result is False
    assert "act_fn" not in cfg.to_dict() and "normalization_type" not in cfg.to_dict()  # TL's view, not the run's config


@pytest.mark.parametrize("preset", ["ln", "fb"])
def test_training_on_logits_at_eq_keeps_the_last_position_readout_bit_for_bit(preset):
    """Training reads logits[:, -1]; its values and gradients are bit-identical to a readout of
    the last position alone (the float operations runs trained before [batch, pos] logits)."""
    model = GeoTransformer(make_config(preset, n_layers=2, **SMALL))
    x, y = make_dataset(model.cfg).train

    def grads(logits):
        model.zero_grad()
        F.cross_entropy(logits, y).backward()
        return logits.detach(), [p.grad.clone() for p in model.parameters()]

    new, new_grads = grads(model(x)[:, -1])
    h = model.residual_after_embed(x)
    for block in model.blocks:
        h = block(h)
    W = model.unembed.W_U
    if model.cfg.unembed == "bounded":
        ref = model.cfg.tau * (h[:, -1] @ (W / W.norm(dim=0, keepdim=True).clamp_min(1e-12)))
    else:
        ref = h[:, -1] @ W
    old, old_grads = grads(ref)
    assert torch.equal(new, old)
    assert all(torch.equal(a, b) for a, b in zip(new_grads, old_grads))


def test_transformer_lens_activation_patching_runs_and_gives_the_known_answer():
    from transformer_lens import patching

    model = GeoTransformer(make_config("ln", n_layers=2, **SMALL))
    ds = make_dataset(model.cfg)
    clean = ds.tokens[::11]
    corrupted = clean.clone()
    corrupted[:, 0] = (corrupted[:, 0] + 5) % 23  # only token a differs
    answers = ds.labels[::11]

    def metric(logits):
        return logits[:, -1].gather(1, answers[:, None]).mean()

    with torch.no_grad():
        clean_logits, clean_cache = model.run_with_cache(clean)
    with pytest.raises(ValueError, match="eval"):  # TransformerLens 4 refuses modules in training mode
        patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    model.eval()
    result = patching.get_act_patch_resid_pre(model, corrupted, clean_cache, metric)
    assert result.shape == (2, 3)
    with torch.no_grad():
        corrupted_metric = metric(model(corrupted))
    # layer 0: the streams differ at position a only, so patching it there restores the clean run
    assert float(result[0, 0]) == pytest.approx(float(metric(clean_logits)), abs=1e-5)
    assert float(result[0, 1]) == pytest.approx(float(corrupted_metric), abs=1e-5)
    assert float(result[0, 2]) == pytest.approx(float(corrupted_metric), abs=1e-5)
    assert float(result[1, 2]) != pytest.approx(float(corrupted_metric), abs=1e-3)  # `=` has read a by layer 1
    heads = patching.get_act_patch_attn_head_out_all_pos(model, corrupted, clean_cache, metric)
    assert heads.shape == (2, model.cfg.n_heads)


def test_dir_and_help_list_the_public_api():
    import pydoc

    import geolens

    names = dir(geolens)
    for name in ("GeoTransformer", "GeoActivationCache", "make_config", "load_run", "compute_metrics", "residual_parts"):
        assert name in names and name in geolens.__doc__
    assert "GeoActivationCache" in pydoc.render_doc(geolens)


def test_readout_normalisation_is_shared_and_clamped():
    """geolens.model.readout: unit columns over d_model (the second-to-last dim, members stacked in front),
    a zero column divided by 1e-12 instead of 0, and the bounded readout tau times the unit columns."""
    from geolens.model.readout import bounded_readout, unit_columns

    W = torch.randn(2, 8, 5, generator=torch.Generator().manual_seed(0))
    W[1, :, 3] = 0.0
    U = unit_columns(W)
    assert torch.allclose(U[0].norm(dim=0), torch.ones(5)) and torch.equal(U[1, :, 3], torch.zeros(8))
    assert torch.equal(unit_columns(W[0]), U[0])
    assert torch.allclose(bounded_readout(W, 10.0), 10.0 * U, rtol=1e-6, atol=0)
    model = GeoTransformer(make_config("fb", **SMALL))
    assert torch.equal(model.unembed.readout_matrix(), bounded_readout(model.unembed.W_U, model.cfg.tau))
