"""TransformerLens-shaped code on GeoTransformer: each habit of analyses/transformerlens/habits.py on each
topology is what the committed table (results/transformerlens/habits.md, embedded in docs/model.md) says;
the TransformerLens 4 bridge; the TL attribute surface without a change to training; the shipped
post-norm trajectories' logit lens."""

import importlib.util
import re
from pathlib import Path

import pytest
import torch

from geolens.analysis.shipped import reference_path
from geolens.errors import GeoError
from geolens.model.config import make_config
from geolens.model.tasks import make_dataset
from geolens.runs.run import Run
from geolens.model.transformer import GeoTransformer

ROOT = Path(__file__).resolve().parent.parent


def _script(path: str):
    spec = importlib.util.spec_from_file_location(Path(path).stem, ROOT / path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


habits = _script("analyses/transformerlens/habits.py")
SMALL = dict(p=7, d_model=16, n_heads=2, d_head=4, d_mlp=16, frac_train=0.5)


@pytest.mark.parametrize("topology", habits.TOPOLOGIES, ids=lambda t: habits.topology_name(t).replace(" ", "-"))
def test_each_habit_on_each_topology_is_what_the_table_says(topology):
    assert habits.row(topology) == habits.committed()[habits.topology_name(topology)]


def test_the_table_covers_every_topology_and_the_doc_shows_it():
    rows = habits.committed()
    assert list(rows) == [habits.topology_name(t) for t in habits.TOPOLOGIES]
    assert all(len(cells) == len(habits.HABITS) for cells in rows.values())
    doc = (ROOT / "docs" / "model.md").read_text()
    assert "<!-- table: results/transformerlens/habits.md -->" in doc
    assert "<!-- table: results/transformerlens/habit_refusals.md -->" in doc
    refreshed, count = _script("analyses/reproduction/embed_tables.py").embed(doc)
    assert refreshed == doc  # rerun analyses/reproduction/embed_tables.py docs/model.md after habits.py


def test_the_logit_lens_of_the_shipped_bounded_trajectory_is_exact():
    """The issue's habit: cache['resid_post', 0][:, -1] @ model.W_U (+ b_U) is the logits (it missed by 8.3
    when model.W_U was the raw parameter); the raw parameter unembed.W_U is unchanged, by name and value."""
    run = Run(reference_path("fb"))
    model = run.model_at(run.steps[-1])
    tokens = make_dataset(model.cfg).tokens[:64]
    logits, cache = model.run_with_cache(tokens)
    lens = cache["resid_post", 0][:, -1] @ model.W_U + model.b_U
    assert (lens - logits[:, -1]).abs().max() < 1e-5
    assert (cache["resid_post", 0][:, -1] @ model.unembed.W_U - logits[:, -1]).abs().max() > 1  # the parameter
    assert "unembed.W_U" in dict(model.named_parameters())


def test_the_attribute_surface_leaves_parameters_checkpoints_and_training_alone():
    model = GeoTransformer(make_config("ln", **SMALL))
    names = [n for n, _ in model.named_parameters()]
    assert not any(n.rsplit(".", 1)[-1] in ("b_Q", "b_K", "b_V", "b_O", "b_U") for n in names)
    assert set(model.state_dict()) == set(names)  # the zero biases are not saved: checkpoints are unchanged
    assert model.blocks[0].attn.b_Q.shape == (2, 4) and model.b_O.shape == (1, 16) and model.b_U.shape == (7,)


def test_model_W_U_is_the_bounded_readout_matrix_and_carries_the_gradient():
    model = GeoTransformer(make_config("fb", **SMALL))
    W = model.unembed.W_U
    assert torch.allclose(model.W_U, model.cfg.tau * W / W.norm(dim=0, keepdim=True))
    model.W_U.sum().backward()
    assert W.grad is not None and W.grad.abs().sum() > 0


def test_norms_of_the_other_placement_are_refused_in_one_line():
    post = GeoTransformer(make_config("ln", **SMALL))
    with pytest.raises(GeoError, match="model.ln_final is a pre-norm module and this GeoTransformer is post-norm") as e:
        post.ln_final  # noqa: B018
    assert "\n" not in str(e.value) and isinstance(e.value, AttributeError)
    assert not hasattr(post, "ln_final") and not hasattr(post.blocks[0], "ln2")
    pre = GeoTransformer(make_config("ln", norm_placement="pre", **SMALL))
    with pytest.raises(GeoError, match="blocks.L.attn_norm is a post-norm module"):
        pre.blocks[0].attn_norm  # noqa: B018
    with pytest.raises(AttributeError, match="no attribute 'nonsense'"):
        pre.nonsense  # noqa: B018


def test_post_norm_apply_ln_to_stack_is_the_identity_on_its_decompositions():
    """What TransformerLens's docstring promises on this model: the parts of the final stream, scaled by
    apply_ln_to_stack, add up to what the readout reads (the stream itself: no norm sits before the readout)."""
    model = GeoTransformer(make_config("ln", **SMALL))
    _, cache = model.run_with_cache(make_dataset(model.cfg).tokens[:4])
    parts = cache.decompose_resid()
    scaled = cache.apply_ln_to_stack(parts)
    assert torch.equal(scaled, parts) and torch.equal(cache.apply_ln_to_stack(parts, recompute_ln=True), parts)
    assert habits.close(scaled.sum(0), cache["blocks.0.hook_resid_post"], 1e-5)


def test_flags_set_on_a_model_do_not_reach_another_model_of_the_same_config():
    cfg = make_config("ln", norm_placement="pre", **SMALL)
    a, b = GeoTransformer(cfg), GeoTransformer(cfg)
    a.set_use_attn_result(True)
    a.fold_layer_norm()
    assert (a.cfg.use_attn_result, a.cfg.normalization_type) == (True, "LNPre")
    assert (b.cfg.use_attn_result, b.cfg.normalization_type, cfg.normalization_type) == (False, "LN", "LN")
    assert a.cfg.sha256() == cfg.sha256()


def test_a_folded_state_dict_holds_the_biases_and_does_not_load_into_an_unfolded_model():
    model = habits.make_model(("pre", "layernorm", "raw", "learned")).fold_layer_norm()
    state = model.state_dict()
    assert {"blocks.0.attn.b_Q", "unembed.b_U"} <= set(state) and state["unembed.b_U"].abs().sum() > 0
    with pytest.raises(RuntimeError, match="Unexpected key"):
        GeoTransformer(model.cfg).double().load_state_dict(state)


def test_a_folded_model_runs_on_the_hooked_engine_and_deep_is_refused():
    """The deep engine ignores the bias buffers folding fills: auto picks the hooked forward, and its logits
    equal the unfolded model's; engine=deep is refused in one line."""
    from geolens.model.engines import choose_engine

    model = habits.make_model(("pre", "layernorm", "raw", "learned"))
    tokens = torch.tensor([[1, 2, model.cfg.p], [3, 4, model.cfg.p]])
    before = model(tokens)[:, -1]
    assert choose_engine(model.cfg)[0].name == "deep"
    model.fold_layer_norm()
    engine, why = choose_engine(model.cfg)
    assert engine.name == "hooked" and "fold_layer_norm" in why
    assert habits.close(engine.logits(model, tokens), before, 1e-5)
    with pytest.raises(GeoError, match="engine=deep cannot run this model: its weights were processed"):
        choose_engine(model.cfg, "deep")


@pytest.mark.parametrize("preset,n_layers,causal", [("ln", 1, False), ("rms", 3, True), ("none", 2, False)])
def test_the_bridge_holds_the_same_model(preset, n_layers, causal):
    model = GeoTransformer(make_config(preset, norm_placement="pre", n_layers=n_layers, causal=causal, **SMALL))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    tokens = make_dataset(model.cfg).tokens
    bridge = model.to_transformer_bridge()
    logits, cache = bridge.run_with_cache(tokens)
    assert type(bridge).__name__ == "TransformerBridge"
    assert habits.close(logits, model(tokens), 1e-5)  # float32 rounding, relative to the largest logit
    mine = GeoTransformer.run_with_cache(model, tokens)[1]
    for L in range(n_layers):
        for name in ("hook_resid_pre", "hook_resid_mid", "hook_resid_post", "attn.hook_z", "mlp.hook_post"):
            key = f"blocks.{L}.{name}"
            assert habits.close(cache[key], mine[key], 1e-5), key


def test_transformer_lens_4_analysis_tools_run_on_the_bridge():
    """transformer_lens.tools.analysis.logit_lens (its last entry is the logits) and activation patching."""
    from transformer_lens import patching
    from transformer_lens.tools.analysis.logit_lens import logit_lens

    model = GeoTransformer(make_config("ln", norm_placement="pre", n_layers=2, **SMALL))
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.3 * torch.randn_like(p))
    bridge = model.to_transformer_bridge()
    clean, corrupted = model.to_tokens([(1, 2)]), model.to_tokens([(1, 5)])
    answer = (1 + 2) % 7
    lens = logit_lens(bridge, clean)
    assert lens.labels == ["0_pre", "1_pre", "final_post"]
    assert habits.close(lens.values[-1, 0], model(clean)[0, -1], 1e-5)
    _, clean_cache = bridge.run_with_cache(clean)
    patched = patching.get_act_patch_resid_pre(bridge, corrupted, clean_cache, lambda lg: lg[0, -1, answer])
    assert patched.shape == (2, 3)
    assert habits.close(patched[0, 1], model(clean)[0, -1, answer], 1e-5)  # the clean b restores the clean logit
    assert not habits.close(patched[0, 0], model(clean)[0, -1, answer], 1e-5)


@pytest.mark.parametrize("preset", ["ln", "fb", "sphere_raw"])
def test_topologies_transformer_lens_lacks_are_refused_in_one_line(preset):
    model = GeoTransformer(make_config(preset, **SMALL))
    with pytest.raises(GeoError, match="TransformerLens cannot represent this GeoTransformer: it is post-norm") as e:
        model.to_transformer_bridge()
    assert "\n" not in str(e.value)


def test_pyproject_bounds_transformer_lens_to_the_tested_major():
    from importlib.metadata import version

    text = (ROOT / "pyproject.toml").read_text()
    assert re.search(r'"transformer-lens>=4\.3,<5"', text)
    assert version("transformer-lens").startswith("4.")  # the installed one is the major the tests ran on
