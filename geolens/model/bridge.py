"""A GeoTransformer as a TransformerLens 4 TransformerBridge (TransformerBridge.boot_native), for the
topologies TransformerLens can represent: pre-norm LayerNorm / RMSNorm / none (one kind for every layer),
raw readout, learned attention, any depth, causal or not. The bridge holds the same weights in its
nn.Linear layout (embed.weight [d_vocab, d_model], blocks.L.attn.q.weight [n_heads * d_head, d_model]
with head h in rows h * d_head ..., o.weight [d_model, n_heads * d_head], mlp.in.weight [d_mlp, d_model],
unembed.weight [d_vocab_out, d_model], norms' weight / bias), its biases from b_Q, b_K, b_V, b_O, b_U,
and gives equal logits at every position. TransformerLens is imported here only (seconds).
"""

from __future__ import annotations

from geolens.errors import GeoError

TL_NORMS = {"layernorm": "LN", "rmsnorm": "RMS", "none": None}


def bridge_unsupported_reason(cfg) -> str | None:
    """Why TransformerLens cannot represent a model with this config, or None."""
    if cfg.norm_placement == "post":
        return ("it is post-norm: each norm's output replaces the residual stream, while TransformerLens's blocks are "
                "pre-norm (ln1 / ln2 / ln_final read the sublayer inputs and leave the stream a plain sum)")
    if cfg.hybrid:
        return f"its layers' norms differ (norm = '{cfg.norm}'), while TransformerLens has one normalization_type"
    if cfg.layer_norms[0] not in TL_NORMS:
        return f"its norm '{cfg.layer_norms[0]}' (x over its L2 norm) is none of TransformerLens's norms (LN, RMS, none)"
    if cfg.unembed == "bounded":
        return ("its bounded readout normalises W_U's columns on every forward, while TransformerLens's unembed is "
                "h @ W_U + b_U")
    if cfg.attention == "uniform":
        return "its uniform attention replaces the scores by zeros, while TransformerLens's attention reads QK^T"
    return None


def to_transformer_bridge(model):
    """The TransformerBridge holding `model`'s weights (module docstring); GeoError if it cannot be one."""
    cfg = model.cfg
    reason = bridge_unsupported_reason(cfg)
    if reason:
        raise GeoError(f"TransformerLens cannot represent this GeoTransformer: {reason}; analyse it as it is "
                       "(run_with_cache, run_with_hooks, transformer_lens.patching)")
    from transformer_lens import TransformerBridge, TransformerBridgeConfig

    tl_cfg = TransformerBridgeConfig(
        d_model=cfg.d_model, d_head=cfg.d_head, n_layers=cfg.n_layers, n_ctx=cfg.n_ctx, n_heads=cfg.n_heads,
        d_vocab=cfg.d_vocab, d_vocab_out=cfg.d_vocab_out, act_fn="relu", eps=cfg.eps,
        normalization_type=TL_NORMS[cfg.layer_norms[0]], attention_dir=cfg.attention_dir, seed=cfg.seed)
    tl_cfg.d_mlp = cfg.d_mlp  # not an __init__ argument
    W_E = model.embed.W_E
    bridge = TransformerBridge.boot_native(tl_cfg, device=W_E.device, dtype=W_E.dtype)
    bridge.load_state_dict(state_dict_for_bridge(model), strict=True)
    return bridge.eval()


def state_dict_for_bridge(model) -> dict:
    """model's weights under the bridge's names and nn.Linear layout (module docstring)."""
    cfg = model.cfg
    H, Dh, D = cfg.n_heads, cfg.d_head, cfg.d_model
    sd = {"embed.weight": model.embed.W_E, "pos_embed.weight": model.pos_embed.W_pos}

    def norm(prefix: str, module) -> None:
        if hasattr(module, "w"):
            sd[f"{prefix}.weight"] = module.w
        if hasattr(module, "b"):
            sd[f"{prefix}.bias"] = module.b

    for L, block in enumerate(model.blocks):
        attn, mlp, key = block.attn, block.mlp, f"blocks.{L}"
        norm(f"{key}.ln1", block.ln1)
        for name, W, b in (("q", attn.W_Q, attn.b_Q), ("k", attn.W_K, attn.b_K), ("v", attn.W_V, attn.b_V)):
            sd[f"{key}.attn.{name}.weight"] = W.permute(0, 2, 1).reshape(H * Dh, D)  # [H, D, Dh] -> [H*Dh, D]
            sd[f"{key}.attn.{name}.bias"] = b.reshape(H * Dh)
        sd[f"{key}.attn.o.weight"] = attn.W_O.reshape(H * Dh, D).T
        sd[f"{key}.attn.o.bias"] = attn.b_O
        norm(f"{key}.ln2", block.ln2)
        sd[f"{key}.mlp.in.weight"], sd[f"{key}.mlp.in.bias"] = mlp.W_in.T, mlp.b_in
        sd[f"{key}.mlp.out.weight"], sd[f"{key}.mlp.out.bias"] = mlp.W_out.T, mlp.b_out
    norm("ln_final", model.ln_final)
    sd["unembed.weight"], sd["unembed.bias"] = model.unembed.W_U.T, model.unembed.b_U
    return {k: v.detach().clone() for k, v in sd.items()}
