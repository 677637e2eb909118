"""Norm placement: the pre-norm GeoTransformer (HookedTransformer's ln1 / ln2 / ln_final) against an
independent plain-PyTorch statement, TransformerLens's residual tools on it, and what refuses it."""

import itertools

import pytest
import torch

from geolens.errors import GeoError
from geolens.model.config import GeoConfig, make_config
from geolens.model.plain_model import PlainTransformer
from geolens.model.tasks import make_dataset
from geolens.model.transformer import GeoTransformer

SMALL = dict(p=23, d_model=32, n_heads=4, d_head=8, d_mlp=64, frac_train=0.5)


def _perturbed(cfg: GeoConfig) -> GeoTransformer:
    """A model whose norm gains and offsets are moved away from 1 and 0, so they are exercised."""
    model = GeoTransformer(cfg)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith((".w", ".b")):
                p.add_(0.3 * torch.randn_like(p))
    return model


def _pre_norm_by_hand(model: GeoTransformer, tokens: torch.Tensor) -> torch.Tensor:
    """The pre-norm equations written out with torch.nn.functional, from the parameters alone."""
    cfg = model.cfg

    def norm(module, x):
        if cfg.norm == "layernorm":
            return torch.nn.functional.layer_norm(x, (cfg.d_model,), module.w, module.b, cfg.ln_eps)
        if cfg.norm == "rmsnorm":
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg.rms_eps) * module.w
        if cfg.norm == "sphere":
            return x / x.norm(dim=-1, keepdim=True).clamp_min(cfg.sphere_eps)
        return x

    h = model.embed.W_E[tokens] + model.pos_embed.W_pos
    for block in model.blocks:
        x = norm(block.ln1, h)
        q, k, v = (torch.einsum("bpd,hde->bhpe", x, W) for W in (block.attn.W_Q, block.attn.W_K, block.attn.W_V))
        scores = q @ k.transpose(-1, -2) / cfg.d_head ** 0.5
        z = (torch.zeros_like(scores) if cfg.attention == "uniform" else scores).softmax(-1) @ v
        h = h + torch.einsum("bhpe,hed->bpd", z, block.attn.W_O)
        x = norm(block.ln2, h)
        h = h + torch.relu(x @ block.mlp.W_in + block.mlp.b_in) @ block.mlp.W_out + block.mlp.b_out
    h = norm(model.ln_final, h)
    W = model.unembed.W_U
    return cfg.tau * h @ (W / W.norm(dim=0)) if cfg.unembed == "bounded" else h @ W


CASES = list(itertools.product(["none", "layernorm", "rmsnorm", "sphere"], ["raw", "bounded"], [1, 2, 3]))


@pytest.mark.parametrize("norm,unembed,n_layers", CASES)
def test_pre_norm_equals_the_equations_and_the_plain_model(norm, unembed, n_layers):
    cfg = GeoConfig(norm=norm, unembed=unembed, n_layers=n_layers, norm_placement="pre", seed=5, **SMALL)
    model = _perturbed(cfg).double()
    tokens = make_dataset(cfg).tokens[::7]
    logits = model(tokens)
    plain = PlainTransformer(cfg).load_from(model)(tokens)
    assert (logits - plain).abs().max().item() <= 1e-10
    assert (logits - _pre_norm_by_hand(model, tokens)).abs().max().item() <= 1e-10
    if norm != "none":  # placement matters: the post-norm model with the same weights computes something else
        post = GeoTransformer(cfg.replace(norm_placement="post")).double()
        post.load_state_dict({k: v for k, v in model.state_dict().items() if "ln" not in k}, strict=False)
        assert (post(tokens) - logits).abs().max().item() > 1e-3


def test_pre_norm_uses_transformer_lens_names():
    model = GeoTransformer(make_config("ln", norm_placement="pre", n_layers=2, **SMALL))
    names = [n for n, _ in model.named_parameters()]
    for layer in (0, 1):
        assert {f"blocks.{layer}.ln1.w", f"blocks.{layer}.ln1.b", f"blocks.{layer}.ln2.w", f"blocks.{layer}.ln2.b"} <= set(names)
    assert {"ln_final.w", "ln_final.b"} <= set(names) and not any("_norm" in n for n in names)
    hooks = set(model.hook_dict)
    assert {"blocks.1.ln1.hook_scale", "blocks.1.ln2.hook_normalized", "ln_final.hook_scale"} <= hooks
    assert not any("attn_norm" in h or "embed_norm" in h for h in hooks)
    assert model.cfg.normalization_type == "LN"
    assert make_config("rms", norm_placement="pre").normalization_type == "RMS"
    assert make_config("fb", norm_placement="pre").normalization_type == "RMS"  # hook_scale = ||x||: divide by it
    assert make_config("ln").normalization_type == "LN"  # the kind; cfg.norm_placement says where it sits
    assert make_config("none", norm_placement="pre").normalization_type is None
    with pytest.raises(GeoError, match="norm_placement = 'middle' is not valid"):
        make_config("ln", norm_placement="middle")


@pytest.mark.parametrize("preset", ["ln", "rms", "fb"])
def test_transformer_lens_residual_tools_are_exact_on_pre_norm(preset):
    """TransformerLens's decompose_resid / get_full_resid_decomposition add up to the final stream, and
    apply_ln_to_stack + logit_attrs add up to the logit at `=` minus ln_final's offset, as on a
    HookedTransformer with folded norms."""
    cfg = make_config(preset, norm_placement="pre", n_layers=2, **SMALL)
    model = _perturbed(cfg).double()
    tokens = make_dataset(cfg).tokens[:16]
    logits, cache = model.run_with_cache(tokens)
    final = cache["blocks.1.hook_resid_post"]
    stack, labels = cache.decompose_resid(return_labels=True)
    assert labels == ["embed", "pos_embed", "0_attn_out", "0_mlp_out", "1_attn_out", "1_mlp_out"]
    assert torch.allclose(stack.sum(0), final, atol=1e-10)
    full, full_labels = cache.get_full_resid_decomposition(return_labels=True, expand_neurons=True)
    assert full_labels[-1] == "bias" and len(full_labels) == 2 * 4 + 2 * 64 + 3
    assert torch.allclose(full.sum(0), final, atol=1e-9)
    answers = logits[:, -1].argmax(-1)
    attrs = cache.logit_attrs(stack[:, :, -1], tokens=answers, pos_slice=-1)  # [parts, batch]
    offset = (model.ln_final.b @ model.unembed.readout_matrix())[answers] if hasattr(model.ln_final, "b") else 0
    assert torch.allclose(attrs.sum(0) + offset, logits[:, -1].gather(1, answers[:, None])[:, 0], atol=1e-9)
    scaled = cache.apply_ln_to_stack(stack, pos_slice=None)  # the final norm's linear part, per part
    normalized = cache["ln_final.hook_normalized"]
    gain = getattr(model.ln_final, "w", torch.ones(cfg.d_model, dtype=torch.float64))
    assert torch.allclose(scaled.sum(0) * gain + (normalized - normalized + getattr(model.ln_final, "b", 0)),
                          normalized, atol=1e-9)


@pytest.mark.parametrize("preset", ["ln", "rms", "fb"])
def test_pre_norm_logit_attribution_equals_transformer_lens(preset):
    """dla of a pre-norm model: each head's and the embedding's score equal TransformerLens's stack_head_results /
    decompose_resid read through apply_ln_to_stack and tokens_to_residual_directions; the parts add up to the score
    read off the logits; the last MLP's neurons add up to its part."""
    from geolens.analysis.circuit import direct_logit_attribution
    from geolens.analysis.eqforward import eq_from_cache

    cfg = make_config(preset, norm_placement="pre", n_layers=2, **SMALL)
    model = _perturbed(cfg).double()
    data = make_dataset(cfg)
    tokens, labels = data.tokens[::5], data.labels[::5]
    logits, cache = model.run_with_cache(tokens)
    dla = direct_logit_attribution(model, cfg, eq_from_cache(logits, cache, cfg), labels)
    assert "pre-norm" in dla.attribution_point
    assert (dla.total - dla.actual).abs().max() < 1e-10

    C = cfg.n_classes
    directions = model.tokens_to_residual_directions(torch.arange(C)) / (cfg.tau if cfg.unembed == "bounded" else 1.0)

    def score(parts):  # [k, N, d_model] through ln_final -> [k, N] correct minus mean of the others
        s = cache.apply_ln_to_stack(parts, pos_slice=-1) @ directions.T  # [k, N, C]
        correct = s.gather(2, labels[None, :, None].expand(len(s), -1, 1))[..., 0]
        return correct - (s.sum(-1) - correct) / (C - 1)

    heads, names = cache.stack_head_results(layer=-1, pos_slice=-1, return_labels=True)
    assert names[:2] == ["L0H0", "L0H1"]
    for name, expected in zip(names, score(heads)):
        assert torch.allclose(dla.components[name], expected, atol=1e-10), name
    stack, names = cache.decompose_resid(pos_slice=-1, return_labels=True)
    expected = dict(zip(names, score(stack)))
    assert torch.allclose(dla.components["embed_pos"], expected["embed"] + expected["pos_embed"], atol=1e-10)
    for layer in (0, 1):  # the MLP's part is its output less b_out (which goes to 'bias')
        b_out = model.blocks[layer].mlp.b_out.detach().expand(len(labels), -1)[None]
        assert torch.allclose(dla.components[f"mlp_L{layer}"], expected[f"{layer}_mlp_out"] - score(b_out)[0], atol=1e-10)
    assert dla.neurons.sum() == pytest.approx(float(dla.components["mlp_L1"].mean()), abs=1e-10)
    assert dla.components["mlp_L1"].abs().max() > 1e-3  # the parts are not trivially zero


def test_what_pre_norm_is_not_yet_served(tmp_path, geolens):
    """The fast engine refuses it in one line; every metric runs on the model's own forward (the logit attribution
    in its pre-norm form); training takes the deep engine and records every precursor column; probe reads it; a
    fork switches it to post-norm with each norm's state mapped."""
    from geolens.analysis.registry import TOPOLOGY_AGNOSTIC, compute_metrics, default_metrics
    from geolens.model.fast import fast_unsupported_reason
    from geolens.model.engines import choose_engine

    cfg = make_config("ln", norm_placement="pre", n_layers=2, epochs=40, eval_every=10, checkpoints="every:20", lr=3e-3,
                      **SMALL)
    one = cfg.replace(n_layers=1)  # the one-layer model the fast engine would otherwise serve
    assert fast_unsupported_reason(one) == "norm_placement = 'pre'; the fast path supports norm_placement post"
    assert choose_engine(one)[0].name == "deep"
    with pytest.raises(GeoError, match="norm_placement = 'pre'; the fast path supports norm_placement post"):
        choose_engine(one.replace(engine="fast"))
    model, data = GeoTransformer(cfg), make_dataset(cfg)
    rows, skipped = compute_metrics(model, cfg, data)
    assert skipped == {} and rows["dla"]["dla_recon_err"] < 1e-5
    assert TOPOLOGY_AGNOSTIC & set(default_metrics()) < set(rows)  # (the opt-in ones are not computed unasked)
    assert {"keyfreq_wl_fft", "restricted_loss", "attn_eq", "layer_spectrum"} < set(rows)
    # what the placement-free metrics read is the pre-norm model's own forward: its logits and patterns
    logits, cache = model.run_with_cache(data.tokens)
    acc = float((logits[:, -1].argmax(-1) == data.labels)[data.test_idx].float().mean())
    assert rows["loss"]["acc_test"] == pytest.approx(acc)
    pattern = cache["blocks.1.attn.hook_pattern"][:, 0, -1].mean(0)  # head 0, the `=` query, mean over inputs
    assert [rows["attn_eq"][f"attn_eq_{k}_L1H0"] for k in ("a", "b", "eq")] == pytest.approx(pattern.tolist(), abs=1e-6)
    args = ["--preset", "ln", "--p", "23", "--frac", "0.5", "--set", "d_model=32", "--set", "d_head=8", "--set", "d_mlp=64",
            "--set", "norm_placement=pre", "--set", "n_layers=2", "--epochs", "40", "--lr", "3e-3", "--checkpoints",
            "every:20", "--quiet"]
    r = geolens("train", *args, "--out", tmp_path / "pre")
    assert r.returncode == 0, r.stderr
    from geolens.runs.run import Run

    run = Run(tmp_path / "pre")
    assert run.header["engine"] == "deep" and run.header["skipped_columns"] == {}
    last = run.metrics[-1]
    not_nan = ("attn_var", "participation_resid", "participation_mlp", "wl_gini", "wn_norm")
    assert all(last[c] == last[c] for c in not_nan)
    r = geolens("probe", "--run", tmp_path / "pre", "--step", 20)
    assert r.returncode == 0 and "L1H" in r.stdout, r.stderr
    assert "(layer 1 MLP)" in r.stdout and "│ layer 0 " in r.stdout and "│ layer 1 " in r.stdout  # a row per layer
    from geolens import load_run

    probe = load_run(tmp_path / "pre").probe(20)
    spectrum = probe.metrics["layer_spectrum"]
    for l, keys, share, irrelevance, mlp in probe.layer_rows():  # each layer's row is its metrics
        assert keys == [int(spectrum[f"layer_spectrum_L{l}_key_{r}"]) for r in range(1, 6)]
        assert share == spectrum[f"layer_spectrum_L{l}_share"] and 0 < share <= 1
        assert irrelevance == probe.metrics["layer_distance_irrelevance"][f"distance_irrelevance_L{l}"]
        assert mlp == pytest.approx(float(probe.dla.components[f"mlp_L{l}"].mean()))
    assert [row[0] for row in probe.layer_rows()] == [0, 1]
    r = geolens("fork", "--run", tmp_path / "pre", "--step", 20, "--set", "norm_placement=post", "--epochs", 30,
                "--out", tmp_path / "f")
    assert r.returncode == 0, r.stderr
    fork = Run(tmp_path / "f")
    renamed = fork.header["fork"]["mapping"]["renamed"]
    assert renamed == {"blocks.0.ln1": "embed_norm", "blocks.0.ln2": "blocks.0.attn_norm",
                       "blocks.1.ln1": "blocks.0.mlp_norm", "blocks.1.ln2": "blocks.1.attn_norm",
                       "ln_final": "blocks.1.mlp_norm"}
    parent, child = run.model_at(20), fork.model_at(20)
    for old, new in renamed.items():  # each norm's gain and offset carried to the norm of the same sublayer input
        assert torch.equal(getattr(parent.get_submodule(old), "w"), getattr(child.get_submodule(new), "w"))
        assert torch.equal(getattr(parent.get_submodule(old), "b"), getattr(child.get_submodule(new), "b"))
    assert fork.header["fork"]["mapping"]["added"] == [] and fork.metrics[-1]["epoch"] == 30


def test_pre_norm_attention_variance_reads_ln1_of_the_embedding():
    """The precursor column's exact score table (eq_query_scores) equals the `=` query's scores the
    hooked pre-norm model computes (blocks.0.attn.hook_attn_scores)."""
    from geolens.training.precursor_columns import eq_query_scores

    cfg = make_config("rms", norm_placement="pre", n_layers=2, **SMALL)
    model = _perturbed(cfg)
    tokens = make_dataset(cfg).tokens[:40]
    _, cache = model.run_with_cache(tokens)
    scores = cache["blocks.0.attn.hook_attn_scores"][:, :, -1]  # [N, H, key]
    table = eq_query_scores(model, int(tokens[0, -1]))  # [V, P, H]
    expected = torch.stack([table[tokens[:, j], j] for j in range(3)], dim=2)  # [N, H, key]
    assert torch.allclose(scores, expected, atol=1e-5)


def test_config_identity_is_stable_for_post_norm_runs_recorded_before_placement():
    """A fork's parent identity (GeoConfig.sha256) recorded before norm_placement existed still names its
    parent: the field is hashed only when it is not the default."""
    import hashlib
    import json

    from geolens.model.config import HASHED_UNLESS_DEFAULT, NOT_HASHED

    cfg = make_config("ln", **SMALL)
    before = {k: v for k, v in cfg.to_dict().items() if k not in HASHED_UNLESS_DEFAULT and k not in NOT_HASHED}
    assert cfg.sha256() == hashlib.sha256(json.dumps(before, sort_keys=True).encode()).hexdigest()
    assert cfg.replace(norm_placement="pre").sha256() != cfg.sha256()
    assert cfg.replace(optimizer="muon").sha256() != cfg.sha256()


def test_the_post_norm_decomposition_refuses_a_pre_norm_model():
    from geolens.model.decompose import residual_parts

    model = GeoTransformer(make_config("ln", norm_placement="pre", **SMALL))
    _, cache = model.run_with_cache(make_dataset(model.cfg).tokens[:4])
    with pytest.raises(GeoError, match="norm_placement = 'pre': use its run_with_cache's decompose_resid"):
        residual_parts(model, lambda name: cache[name])
