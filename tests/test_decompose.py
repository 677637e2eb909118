"""Exact residual / logit decompositions of the post-norm model (geolens.model.decompose, GeoActivationCache)."""

import pytest
import torch
from transformer_lens.ActivationCache import ActivationCache

from geolens.analysis import circuit
from geolens.analysis.eqforward import eq_from_cache
from geolens.errors import GeoError
from geolens.model.cache import GeoActivationCache
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64)
PRESETS = [base + mod for base in ("ln", "rms", "none", "sphere", "fb", "sphere_raw") for mod in ("", "+uniform")]


def _model(preset, n_layers=1, seed=1):
    """A model whose norm gains / offsets are away from 1 / 0, so they are exercised."""
    model = GeoTransformer(make_config(preset, n_layers=n_layers, seed=seed, **SMALL)).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b")):
                p.add_(0.3 * torch.randn(p.shape, generator=g))
    return model


def _run(model, stride=4):
    """(answers, logits, cache) of every stride-th input of the task."""
    ds = make_dataset(model.cfg)
    with torch.no_grad():
        logits, cache = model.run_with_cache(ds.tokens[::stride])
    return ds.labels[::stride], logits, cache


def _close(a, b, tol=2e-5):
    """Equal to float32 rounding, relative to the size of b."""
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max()) <= tol * max(1.0, float(b.abs().max()))


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("n_layers", [1, 2])
def test_parts_add_up_to_the_streams_and_the_logits(preset, n_layers):
    model = _model(preset, n_layers)
    answers, logits, cache = _run(model)
    final = cache[f"blocks.{n_layers - 1}.hook_resid_post"]
    for expand in (True, False):
        parts, labels = cache.get_full_resid_decomposition(expand_neurons=expand, return_labels=True)
        assert parts.shape == (len(labels), *final.shape)
        assert _close(parts.sum(0), final)
        # every part through the readout: the logits of every class at every position
        attrs = parts @ model.tokens_to_residual_directions(torch.arange(model.cfg.d_vocab_out)).T
        assert _close(attrs.sum(0), logits)
    n_parts = n_layers * (model.cfg.n_heads + model.cfg.d_mlp) + 3
    assert len(cache.get_full_resid_decomposition(return_labels=True)[1]) == n_parts
    # logit_attrs: the parts' contributions to the correct class's logit add up to it
    attrs = cache.logit_attrs(parts, tokens=answers)
    assert _close(attrs.sum(0), logits.gather(2, answers[:, None, None].expand(-1, 3, 1))[..., 0])
    # decompose_resid: every stream of every layer, at the attention and the MLP input
    for layer in range(n_layers + 1):
        for mlp_input in (False, True) if layer < n_layers else (False,):
            parts, labels = cache.decompose_resid(layer, mlp_input=mlp_input, return_labels=True)
            name = f"blocks.{layer}.hook_resid_mid" if mlp_input else (
                f"blocks.{layer}.hook_resid_pre" if layer < n_layers else f"blocks.{layer - 1}.hook_resid_post")
            assert _close(parts.sum(0), cache[name]), (layer, mlp_input)
            assert labels[:2] == ["embed", "pos_embed"] and labels[-1] == "bias"
            assert len(labels) == 3 + 2 * layer + int(mlp_input)


@pytest.mark.parametrize("preset", PRESETS)
@pytest.mark.parametrize("n_layers", [1, 2])
def test_head_and_neuron_parts_equal_direct_logit_attribution(preset, n_layers):
    model = _model(preset, n_layers)
    answers, logits, cache = _run(model)
    cfg = model.cfg
    dla = circuit.direct_logit_attribution(model, cfg, eq_from_cache(logits, cache, cfg), answers, per_input_neurons=True)
    D = circuit.logit_diff_directions(circuit.readout_directions(model, cfg))  # the DLA's score directions
    parts, labels = cache.get_full_resid_decomposition(pos_slice=-1, project_output_onto=D, return_labels=True)
    scores = parts.gather(2, answers[None, :, None].expand(len(labels), -1, 1))[..., 0]  # [parts, N]
    score = dict(zip(labels, scores))
    for l in range(n_layers):
        for h in range(cfg.n_heads):
            assert _close(score[f"L{l}H{h}"], dla.components[f"L{l}H{h}"]), f"L{l}H{h}"
    last = torch.stack([score[f"L{n_layers - 1}N{n}"] for n in range(cfg.d_mlp)], dim=1)
    assert _close(last, dla.neurons_per_input)
    # the whole score too: the parts add up to the DLA's total and to the real score
    assert _close(scores.sum(0), dla.actual)


def test_transformer_lens_pre_norm_answers_are_wrong_here_and_ours_are_not():
    """The check above can fail: TransformerLens's own ActivationCache methods (raw sums, a
    pre-norm assumption) miss resid_post of this model by far more than the tolerance."""
    model = _model("ln", 2)
    _, _, cache = _run(model)
    final = cache["blocks.1.hook_resid_post"]
    plain = ActivationCache(cache.cache_dict, model)
    assert not _close(plain.decompose_resid().sum(0), final, tol=1e-2)
    assert _close(cache.decompose_resid().sum(0), final)


def test_sphere_parts_are_the_writes_divided_by_the_later_scales():
    """On a one-layer sphere model each norm only divides by ||x||: the embedding's part of the
    final stream is W_E[x] / (s_embed s_attn s_mlp), a head's z W_O / (s_attn s_mlp)."""
    model = _model("sphere")
    _, _, cache = _run(model)
    s = [cache[f"{n}.hook_scale"] for n in ("embed_norm", "blocks.0.attn_norm", "blocks.0.mlp_norm")]
    parts, labels = cache.get_full_resid_decomposition(return_labels=True)
    part = dict(zip(labels, parts))
    assert _close(part["embed"], cache["hook_embed"] / (s[0] * s[1] * s[2]))
    head = torch.einsum("bpe,ed->bpd", cache["blocks.0.attn.hook_z"][:, :, 2], model.blocks[0].attn.W_O[2].detach())
    assert _close(part["L0H2"], head / (s[1] * s[2]))
    assert _close(part["bias"], model.blocks[0].mlp.b_out.detach() / s[2])  # no norm offsets: b_out only
    neurons, n_labels = cache.stack_neuron_results(1, neuron_slice=5, return_labels=True)
    assert n_labels == ["L0N5"]
    assert _close(neurons[0], cache["blocks.0.mlp.hook_post"][..., 5, None] * model.blocks[0].mlp.W_out[5].detach() / s[2])


def test_without_norms_the_parts_are_the_raw_writes():
    model = _model("none", 2)
    _, _, cache = _run(model)
    parts, labels = cache.decompose_resid(return_labels=True)
    part = dict(zip(labels, parts))
    assert torch.equal(part["embed"], cache["hook_embed"]) and torch.equal(part["1_mlp_out"], cache["blocks.1.hook_mlp_out"])
    assert not part["bias"].any()


def test_b_out_sits_in_the_mlp_part_or_in_bias_when_neurons_are_expanded():
    model = _model("ln", 2)
    _, _, cache = _run(model)
    full, labels = cache.get_full_resid_decomposition(return_labels=True)
    layers, layer_labels = cache.get_full_resid_decomposition(expand_neurons=False, return_labels=True)
    assert layer_labels[-5:] == ["0_mlp_out", "1_mlp_out", "embed", "pos_embed", "bias"]
    by_layer = dict(zip(layer_labels, layers))
    neurons0 = full[[i for i, n in enumerate(labels) if n.startswith("L0N")]].sum(0)
    neurons1 = full[[i for i, n in enumerate(labels) if n.startswith("L1N")]].sum(0)
    b_out_parts = full[labels.index("bias")] - by_layer["bias"]
    assert _close(by_layer["0_mlp_out"] + by_layer["1_mlp_out"], neurons0 + neurons1 + b_out_parts)
    assert not _close(b_out_parts, torch.zeros_like(b_out_parts))


def test_heads_stack_and_remainder_and_projection_shapes():
    model = _model("rms", 2)
    _, _, cache = _run(model)
    N = cache["hook_embed"].shape[0]
    heads, labels = cache.stack_head_results(1, incl_remainder=True, return_labels=True)
    assert labels == ["L0H0", "L0H1", "L0H2", "L0H3", "remainder"]
    assert _close(heads.sum(0), cache["blocks.1.hook_resid_pre"])
    assert cache.stack_head_results(0).shape == (0, N, 3, 32)
    direction = torch.randn(32)
    projected = cache.get_full_resid_decomposition(project_output_onto=direction, pos_slice=-1)
    full = cache.get_full_resid_decomposition(pos_slice=-1)
    assert projected.shape == (2 * (4 + 64) + 3, N)
    assert _close(projected, full @ direction)
    assert torch.equal(cache.decompose_resid(apply_ln=True), cache.decompose_resid())


def test_accumulated_resid_through_the_readout_is_an_exact_logit_lens():
    model = _model("fb", 2)
    _, logits, cache = _run(model)
    stack, labels = cache.accumulated_resid(incl_mid=True, apply_ln=True, return_labels=True)
    assert labels == ["0_pre", "0_mid", "1_pre", "1_mid", "final_post"]
    assert torch.equal(stack[2], cache["blocks.1.hook_resid_pre"])
    assert _close(model.unembed(stack[-1]), logits)


def test_refused_entry_points_name_what_to_use():
    model = _model("ln")
    _, _, cache = _run(model)
    with pytest.raises(GeoError, match="accumulated_resid"):
        cache.logit_lens()
    with pytest.raises(GeoError, match="get_full_resid_decomposition"):
        model.accumulated_bias(1)
    with pytest.raises(GeoError, match="mode"):
        cache.decompose_resid(mode="heads")
    with pytest.raises(GeoError, match="layer = 5"):
        cache.decompose_resid(5)
    _, filtered = model.run_with_cache(make_dataset(model.cfg).tokens[:4], names_filter=lambda n: "resid" in n)
    with pytest.raises(GeoError, match="names_filter"):
        filtered.decompose_resid()


def test_cache_without_batch_dim():
    model = _model("ln", 2)
    tokens = make_dataset(model.cfg).tokens[:1]
    logits, cache = model.run_with_cache(tokens, remove_batch_dim=True)
    assert isinstance(cache, GeoActivationCache) and not cache.has_batch_dim
    parts = cache.get_full_resid_decomposition()
    assert parts.shape[1:] == (3, 32)
    assert _close(parts.sum(0), cache["blocks.1.hook_resid_post"])
    assert _close(cache.logit_attrs(parts, tokens=4, has_batch_dim=False).sum(0), logits[0, :, 4])


def test_batch_slices_keep_the_exact_cache():
    model = _model("fb", 2)
    _, _, cache = _run(model)
    sliced = cache.apply_slice_to_batch_dim([3, 7])
    assert isinstance(sliced, GeoActivationCache)
    assert _close(sliced.get_full_resid_decomposition().sum(0), cache["blocks.1.hook_resid_post"][[3, 7]])
