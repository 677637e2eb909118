"""Exact residual-stream and logit decompositions of the post-norm GeoTransformer.

Every norm of a GeoTransformer (embed_norm, blocks.L.attn_norm, blocks.L.mlp_norm) *replaces*
the residual stream with its output, so a stream is not the sum of the raw writes of the earlier
components (HookedTransformer's pre-norm identity). With each norm's scale s frozen at its cached
value (hook_scale, per input and position: LayerNorm's standard deviation, RMSNorm's root mean
square, the sphere's L2 norm; s = 1 for 'none'), a norm is linear plus an offset:

    N(x) = lin(x) / s + b,   lin(x) = (x - mean(x)) * w  (LayerNorm: centring frozen too)
                                      x * w              (RMSNorm)
                                      x                  (sphere, none);  b: LayerNorm's offset, else 0

and every stream is an exact sum of per-component parts, each component carried from where it
enters through every later norm up to the stream (direct path only: what later attention
reads from it is part of the later heads' writes, as in HookedTransformer):

- ``embed`` W_E[x] (hook_embed) and ``pos_embed`` W_pos (hook_pos_embed), entering embed_norm;
- head h of layer l, ``L{l}H{h}``: z_h W_O^h (attention has no biases), entering blocks.l.attn_norm;
  or the layer's sum, ``{l}_attn_out`` (hook_attn_out);
- MLP layer l, ``{l}_mlp_out``: hook_mlp_out = relu(h W_in + b_in) W_out + b_out (b_out included),
  entering blocks.l.mlp_norm; or its neurons ``L{l}N{n}``: post_n W_out[n] (b_in acts inside the
  neuron), and b_out then goes to ``bias``;
- ``bias``: every LayerNorm offset b carried through the later norms (zero for the other norms),
  plus every b_out when the MLPs are split into neurons.

The target stream is the input of layer L (blocks.L.hook_resid_pre; L = n_layers: the final
stream blocks.{n_layers-1}.hook_resid_post, which the readout reads without a further norm) or,
with mlp_input, blocks.L.hook_resid_mid. The parts add up to it to float rounding; projected on
the readout (model.tokens_to_residual_directions: W_U, or tau * unit-norm W_U columns for the
bounded readout) they add up to the logits.

Computation: directions P [d_model, k] (the identity for d_model-space parts) are pulled back
from the target through each norm: G_j = lin_j^T(... lin_t^T(P)) is one [d_model, k] table per
norm, the same for every input, and f_j the per-input product of 1 / s; a component x entering
norm j contributes (x @ G_j) * f_j (pull_back; circuit.direct_logit_attribution uses the same).
"""

from __future__ import annotations

from typing import Callable

import torch
from jaxtyping import Float
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import GeoConfig

Acts = Callable[[str], Tensor]  # hook name -> cached activation (leading dims [*lead], e.g. [batch, pos])


# ---- one frozen norm ------------------------------------------------------------------------------
def norm_kind(norm) -> str:
    """The kind of a GeoTransformer norm module ('layernorm', 'rmsnorm', 'sphere', 'none'), read off the module
    itself, so that each layer of a hybrid (per-layer norms) is carried through its own."""
    return {"LayerNorm": "layernorm", "RMSNorm": "rmsnorm", "SphereNorm": "sphere", "NoNorm": "none"}[type(norm).__name__]


def norm_linear(cfg: GeoConfig, norm, x: Tensor) -> Tensor:
    """The linear part of a post-norm at scale 1, applied to x [..., d_model] (at a frozen
    per-input scale s it is this / s)."""
    kind = norm_kind(norm)
    if kind == "layernorm":
        return (x - x.mean(-1, keepdim=True)) * norm.w.detach()
    if kind == "rmsnorm":
        return x * norm.w.detach()
    return x


def norm_linear_T(cfg: GeoConfig, norm, g: Tensor) -> Tensor:
    """Transpose of norm_linear at scale 1: pulls readout directions g [..., d_model] back
    through the norm, so that norm_linear(x) . g == x . norm_linear_T(g) for every x
    (LayerNorm's centring is symmetric); at scale s the pulled-back direction is this / s."""
    kind = norm_kind(norm)
    if kind == "layernorm":
        h = g * norm.w.detach()
        return h - h.mean(-1, keepdim=True)
    if kind == "rmsnorm":
        return g * norm.w.detach()
    return g


def norm_offset(cfg: GeoConfig, norm) -> Tensor | None:
    """The norm's additive offset [d_model] (LayerNorm b), None for the other norms."""
    return norm.b.detach() if norm_kind(norm) == "layernorm" else None


# ---- the chain of norms ---------------------------------------------------------------------------
def norm_chain(model) -> list[tuple[object, str]]:
    """(norm module, its hook_scale name) in forward order: index 0 embed_norm, 2l + 1
    blocks.l.attn_norm, 2l + 2 blocks.l.mlp_norm. Post-norm only (a GeoError for a pre-norm model, whose
    stream is a plain sum: TransformerLens's own decompositions apply to it)."""
    if model.cfg.norm_placement != "post":
        raise GeoError(f"geolens.model.decompose carries parts through post-norms; this model is norm_placement = "
                       f"'{model.cfg.norm_placement}': use its run_with_cache's decompose_resid / "
                       "get_full_resid_decomposition (TransformerLens's, exact for pre-norm)")
    out = [(model.embed_norm, "embed_norm.hook_scale")]
    for l, block in enumerate(model.blocks):
        out += [(block.attn_norm, f"blocks.{l}.attn_norm.hook_scale"), (block.mlp_norm, f"blocks.{l}.mlp_norm.hook_scale")]
    return out


def stream_hook(j: int) -> str:
    """The residual-stream hook holding the output of norm j of norm_chain."""
    if j == 0:
        return "blocks.0.hook_resid_pre"
    return f"blocks.{(j - 1) // 2}.hook_resid_mid" if j % 2 else f"blocks.{j // 2 - 1}.hook_resid_post"


def target_norm(cfg: GeoConfig, layer: int | None, mlp_input: bool = False) -> int:
    """Index in norm_chain of the norm whose output is the input of `layer` (None or -1: n_layers,
    the final stream), or its resid_mid with mlp_input."""
    n = cfg.n_layers
    layer = n if layer is None or layer == -1 else layer
    if not 0 <= layer <= n:
        raise GeoError(f"layer = {layer} is out of range; use 0..{n} (n_layers = {n}: the final stream) or -1/None")
    if mlp_input and layer == n:
        raise GeoError(f"mlp_input=True needs layer < n_layers = {n}: the final stream has no MLP after it")
    return 2 * layer + int(mlp_input)


def pull_back(model, directions: Float[Tensor, "d_model k"], scale: Acts, f0: Tensor, target: int,
              stop: int = 0) -> dict[int, tuple[Tensor, Tensor]]:
    """Directions read at the output of norm `target` pulled back to the input of each earlier norm.

    Returns {j: (G_j [d_model, k], f_j)} for j = stop .. target + 1: x . (G_j[:, c] * f_j) is
    what a component x entering norm j adds to (stream . directions[:, c]), each norm's scale
    frozen. (G_{target+1}, f_{target+1}) = (directions, f0). scale(hook_scale name) -> the
    per-input scales, shaped like f0 (norm 'none' has none: f stays f0).
    """
    cfg = model.cfg
    chain = norm_chain(model)
    G, f = directions, f0
    out = {target + 1: (G, f)}
    for j in range(target, stop - 1, -1):
        norm, name = chain[j]
        G = norm_linear_T(cfg, norm, G.T).T
        if norm_kind(norm) != "none":
            f = f / scale(name)
        out[j] = (G, f)
    return out


# ---- the parts ------------------------------------------------------------------------------------
KINDS = ("embed", "attn", "mlp", "bias")


def residual_parts(
    model,
    act: Acts,
    layer: int | None = None,
    mlp_input: bool = False,
    directions: Float[Tensor, "d_model k"] | None = None,
    split_heads: bool = True,
    split_neurons: bool = False,
    neuron_index: Tensor | None = None,
    kinds: tuple[str, ...] = KINDS,
) -> dict[str, tuple[list[str], Tensor]]:
    """The parts of the stream at the input of `layer` (see the module docstring).

    act(hook name) -> the cached activation with leading dims [*lead] (e.g. [batch, pos]);
    directions: project every part on these columns (None: parts in d_model space).
    Returns {block: (labels, parts [n_parts, *lead, k or d_model])}, blocks in forward order:
    'embed', 'pos_embed', then per layer 'attn{l}' (heads, or the layer with split_heads=False)
    and 'mlp{l}' (the layer, or its neurons neuron_index (default all) with split_neurons), then
    'bias'. kinds selects which of embed / attn / mlp / bias are computed.
    """
    cfg = model.cfg
    t = target_norm(cfg, layer, mlp_input)
    target = act(stream_hook(t))
    P = torch.eye(cfg.d_model, dtype=target.dtype, device=target.device) if directions is None else directions
    pulled = pull_back(model, P, lambda name: act(name)[..., 0], torch.ones(target.shape[:-1], dtype=target.dtype,
                                                                             device=target.device), t)

    def part(x: Tensor, j: int) -> Tensor:  # x [*lead, d_model] entering norm j -> [*lead, k]
        G, f = pulled[j]
        return (x @ G) * f[..., None]

    out: dict[str, tuple[list[str], Tensor]] = {}
    if "embed" in kinds:
        out["embed"] = (["embed"], part(act("hook_embed"), 0)[None])
        out["pos_embed"] = (["pos_embed"], part(act("hook_pos_embed"), 0)[None])
    bias = None
    for j, (norm, _) in enumerate(norm_chain(model)[: t + 1]):
        l = (j - 1) // 2
        if j % 2 and "attn" in kinds:  # attn_norm l: its input is resid_pre + the heads of layer l
            G, f = pulled[j]
            if split_heads:
                W = torch.einsum("hed,dk->hek", model.blocks[l].attn.W_O.detach(), G)
                heads = torch.einsum("...he,hek->h...k", act(f"blocks.{l}.attn.hook_z"), W) * f[..., None]
                out[f"attn{l}"] = ([f"L{l}H{h}" for h in range(cfg.n_heads)], heads)
            else:
                out[f"attn{l}"] = ([f"{l}_attn_out"], part(act(f"blocks.{l}.hook_attn_out"), j)[None])
        if j and not j % 2 and "mlp" in kinds:  # mlp_norm l: its input is resid_mid + the MLP of layer l
            mlp = model.blocks[l].mlp
            if split_neurons:
                G, f = pulled[j]
                idx = (torch.arange(cfg.d_mlp) if neuron_index is None else neuron_index).to(target.device)
                post = act(f"blocks.{l}.mlp.hook_post")[..., idx]
                W = mlp.W_out.detach()[idx] @ G  # [n, k]
                neurons = torch.einsum("...n,nk->n...k", post, W) * f[..., None]
                out[f"mlp{l}"] = ([f"L{l}N{n}" for n in idx.tolist()], neurons)
            else:
                out[f"mlp{l}"] = ([f"{l}_mlp_out"], part(act(f"blocks.{l}.hook_mlp_out"), j)[None])
        if "bias" in kinds:
            offsets = [(norm_offset(cfg, norm), j + 1)]
            if j and not j % 2 and split_neurons:
                offsets.append((model.blocks[l].mlp.b_out.detach(), j))
            for b, entry in offsets:
                if b is not None:
                    G, f = pulled[entry]
                    term = (b @ G) * f[..., None]
                    bias = term if bias is None else bias + term
    if "bias" in kinds:
        if bias is None:  # no offsets: an exact zero part, kept so the labels do not depend on the norm
            bias = torch.zeros(*target.shape[:-1], P.shape[1], dtype=target.dtype, device=target.device)
        out["bias"] = (["bias"], bias[None])
    return out


def stream(model, act: Acts, layer: int | None = None, mlp_input: bool = False,
           directions: Tensor | None = None) -> Tensor:
    """The target stream itself [*lead, d_model] (or projected [*lead, k]): what the parts add up to."""
    x = act(stream_hook(target_norm(model.cfg, layer, mlp_input)))
    return x if directions is None else x @ directions


def stack(blocks: dict[str, tuple[list[str], Tensor]], names: list[str]) -> tuple[Tensor, list[str]]:
    """Concatenate the named blocks of residual_parts into (parts [n, *lead, k], labels)."""
    labels = [label for name in names for label in blocks[name][0]]
    return torch.cat([blocks[name][1] for name in names], dim=0), labels
