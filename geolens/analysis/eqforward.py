"""The analysis forward: every input's activations at the `=` position, the one the readout reads.

Every metric reads the model's logits and activations at `=` only (attention of `=` onto
(a, b, =), the heads' z, the MLP activations, the residual stream there). EqActivations holds
exactly that, keyed by TransformerLens hook name, with the position axis dropped:

    residual-stream hooks (hook_embed, blocks.L.hook_resid_pre / attn_out / resid_mid /
    mlp_out / resid_post)                                    [N, d_model]
    blocks.L.attn.hook_pattern   the `=` query's row         [N, n_heads, n_ctx]
    blocks.L.attn.hook_z                                     [N, n_heads, d_head]
    blocks.L.mlp.hook_post                                   [N, d_mlp]
    blocks.L.{attn,mlp}_norm.hook_scale (not for norm none)  [N, 1]
      (pre-norm: blocks.L.ln1 / ln2.hook_scale and ln_final.hook_scale)

Two routes give the same values up to float32 summation order
(tests/test_analysis_speed_paths.py):
- eq_from_cache: read them off any ActivationCache of the hooked model (the reference route;
  used for models the table route does not cover);
- eq_forward_tables, where the chosen engine has an analysis forward (Engine.eq_forward: the fast engine,
  one-layer post-norm [a, b, =] models): geolens.model.fast.fast_eq_forward computes the whole `=` forward (the residual stream
  before attention depends only on (token, position), so the training fast path's per-token
  tables give the `=` query's attention and, through embedding bags, the residual after attention
  and the MLP pre-activations; only the MLP output and the readout are per-input matmuls); this
  module only puts its values under their hook names.
"""

from __future__ import annotations

from dataclasses import dataclass

from jaxtyping import Float, Int
from torch import Tensor

from geolens.model.config import GeoConfig
from geolens.model.fast import FastEq


@dataclass
class EqActivations:
    """Logits [N, C] and activations at `=` (see the module docstring) of N inputs.

    projected: every sphere-projection output the forward computed, flattened to [rows, d_model]
    (all positions where they were computed; empty unless a norm is the sphere).
    fast: the geolens.model.fast.FastEq behind the values (table route only), which lets gradients
    on a subset of the inputs reuse this forward (fast_logits(reuse=...)).
    """

    logits: Float[Tensor, "N C"]
    values: dict[str, Tensor]
    projected: list[Tensor]
    fast: FastEq | None = None

    def __getitem__(self, name: str) -> Tensor:
        return self.values[name]


def residual_hooks(cfg: GeoConfig) -> list[str]:
    """Hook points of the residual stream and of what is written into it, in forward order."""
    out = ["hook_embed", "hook_pos_embed"]
    for layer in range(cfg.n_layers):
        out += [f"blocks.{layer}.hook_{name}" for name in ("resid_pre", "attn_out", "resid_mid", "mlp_out", "resid_post")]
    return out


def norm_names(cfg: GeoConfig) -> list[str]:
    """Every norm module's name in forward order: embed_norm and blocks.L.attn_norm / mlp_norm
    (post-norm), or blocks.L.ln1 / ln2 and ln_final (pre-norm)."""
    if cfg.norm_placement == "pre":
        return [f"blocks.{layer}.{n}" for layer in range(cfg.n_layers) for n in ("ln1", "ln2")] + ["ln_final"]
    return ["embed_norm"] + [f"blocks.{layer}.{n}_norm" for layer in range(cfg.n_layers) for n in ("attn", "mlp")]


def norm_kinds(cfg: GeoConfig) -> list[str]:
    """The kind of each norm of norm_names (cfg.layer_norms: a hybrid's layers differ)."""
    kinds = cfg.layer_norms
    if cfg.norm_placement == "pre":
        return [kinds[layer] for layer in range(cfg.n_layers) for _ in range(2)] + [kinds[-1]]
    return [kinds[0]] + [kinds[layer] for layer in range(cfg.n_layers) for _ in range(2)]


def projected_hooks(cfg: GeoConfig) -> list[str]:
    """Outputs of the sphere projections (empty unless a norm is the sphere)."""
    return [f"{name}.hook_normalized" for name, kind in zip(norm_names(cfg), norm_kinds(cfg)) if kind == "sphere"]


def eq_hooks(cfg: GeoConfig) -> list[str]:
    """Names EqActivations holds for this config."""
    out = residual_hooks(cfg)
    for layer in range(cfg.n_layers):
        out += [f"blocks.{layer}.attn.hook_pattern", f"blocks.{layer}.attn.hook_z", f"blocks.{layer}.mlp.hook_post"]
    out += [f"{name}.hook_scale" for name, kind in zip(norm_names(cfg), norm_kinds(cfg))
            if kind != "none" and name != "embed_norm"]
    return out


def eq_from_cache(logits: Float[Tensor, "N pos C"], cache, cfg: GeoConfig) -> EqActivations:
    """EqActivations of a run_with_cache of the hooked model (full, or narrowed to `=` after the
    last attention as context.run_with_cache_narrowed does); logits: its output, whose last
    position is the prediction."""
    values = {}
    for name in eq_hooks(cfg):
        act = cache[name]
        values[name] = act[:, :, -1] if name.endswith("hook_pattern") else act[:, -1]
    return EqActivations(logits[:, -1], values, [cache[name].flatten(0, -2) for name in projected_hooks(cfg)])


# fast_eq_forward's names -> hook names (layer 0, the only one the fast path has)
_FAST_HOOKS = {
    "embed": "hook_embed",
    "pos_embed": "hook_pos_embed",
    "resid_pre": "blocks.0.hook_resid_pre",
    "pattern": "blocks.0.attn.hook_pattern",
    "z": "blocks.0.attn.hook_z",
    "attn_out": "blocks.0.hook_attn_out",
    "resid_mid": "blocks.0.hook_resid_mid",
    "mlp_post": "blocks.0.mlp.hook_post",
    "mlp_out": "blocks.0.hook_mlp_out",
    "resid_post": "blocks.0.hook_resid_post",
    "attn_scale": "blocks.0.attn_norm.hook_scale",
    "mlp_scale": "blocks.0.mlp_norm.hook_scale",
}


def eq_forward_tables(fast: FastEq, cfg: GeoConfig) -> EqActivations:
    """EqActivations of a one-layer model from its geolens.model.fast.fast_eq_forward over every input (no
    grad; the training path's tables and embedding bags), its values under their hook names."""
    f = fast.values
    values = {hook: f[name] for name, hook in _FAST_HOOKS.items() if name in f}
    projected = [f["embedded"], f["resid_mid"], f["resid_post"]] if cfg.norm == "sphere" else []
    return EqActivations(f["logits"], values, projected, fast)
