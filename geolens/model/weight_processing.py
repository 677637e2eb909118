"""HookedTransformer's weight processing on a GeoTransformer, in place, where it keeps what it promises.

    fold_layer_norm         pre-norm LayerNorm / RMSNorm (and the parameter-free sphere / none): each norm's
                            gain w moves into the weights that read it (W_Q, W_K, W_V; W_in; W_U), its offset
                            b into their biases (b_Q, b_K, b_V; b_in; b_U), the norm is left as w = 1, b = 0
                            and cfg.normalization_type becomes 'LNPre' / 'RMSPre'. The logits are unchanged.
    center_writing_weights  every norm is a LayerNorm (either placement): what writes into a norm's input
                            (W_E, W_pos, W_O, b_O, W_out, b_out) loses its mean over d_model, which the
                            LayerNorm removes anyway. The logits are unchanged.
    center_unembed          raw readout: W_U and b_U lose their mean over the vocabulary, which shifts every
                            logit of a position by the same amount: the softmax is unchanged.

Everything else is refused in one line saying why (post-norm: the norm's output *is* the stream, read
by attention, the MLP and the readout, so its gain has no single reader to move into; the bounded
readout normalises W_U's columns, undoing any gain or centring moved into them; RMSNorm and the sphere
do not remove the mean). The folded biases live in the zero buffers b_Q, b_K, b_V, b_O, b_U (not
parameters); fold_layer_norm makes them part of the state dict, so a folded state dict does not load
silently into an unfolded model.
"""

from __future__ import annotations

import copy

import torch

from geolens.errors import GeoError


def own_cfg(model) -> None:
    """Give the model its own copy of its config (so that TL-style flags set on model.cfg, e.g.
    use_attn_result or a folded normalization_type, do not reach other models built from the same one)."""
    old = model.cfg
    new = copy.copy(old)
    for module in model.modules():
        if getattr(module, "cfg", None) is old:
            module.cfg = new


def _refuse_post_norm(model, what: str) -> None:
    if not model.pre_norm:
        raise GeoError(f"{what} applies to pre-norm models: in this post-norm GeoTransformer each norm's output is the "
                       "residual stream itself (read by attention, the MLP, the next norm and the readout), so its gain "
                       "and offset cannot move into the weights that read it")


def _keep_biases(module, names: tuple[str, ...]) -> None:
    """Make the (formerly zero) bias buffers `names` part of the module's state dict."""
    for name in names:
        module._non_persistent_buffers_set.discard(name)


@torch.no_grad()
def fold_layer_norm(model, center_weights: bool = True) -> None:
    """Fold every pre-norm's gain and offset into the weights and biases that read it (module docstring)."""
    _refuse_post_norm(model, "fold_layer_norm")
    cfg = model.cfg
    if cfg.unembed == "bounded" and hasattr(model.ln_final, "w"):
        raise GeoError(f"fold_layer_norm cannot fold ln_final ({cfg.layer_norms[-1]}) into the bounded readout: it "
                       "normalises W_U's columns on every forward, which would undo the folded gain; use a raw readout "
                       "or read the unfolded model")
    for block in model.blocks:
        attn = block.attn
        _fold(block.ln1, [(attn.W_Q, attn.b_Q, 1), (attn.W_K, attn.b_K, 1), (attn.W_V, attn.b_V, 1)], center_weights)
        _fold(block.ln2, [(block.mlp.W_in, block.mlp.b_in, 0)], center_weights)
        _keep_biases(attn, ("b_Q", "b_K", "b_V", "b_O"))
    _fold(model.ln_final, [(model.unembed.W_U, model.unembed.b_U, 0)], center_weights)
    _keep_biases(model.unembed, ("b_U",))
    kinds = set(cfg.layer_norms)
    own_cfg(model)
    if kinds == {"layernorm"}:
        model.cfg.normalization_type = "LNPre"
    elif kinds <= {"rmsnorm", "sphere"}:
        model.cfg.normalization_type = "RMSPre"


def _fold(norm, readers, center: bool) -> None:
    """readers: (W, bias, d_model axis of W). W [.., d_model, ..] is read as x @ W + bias."""
    w, b = getattr(norm, "w", None), getattr(norm, "b", None)
    if w is None:  # sphere, none: nothing to fold
        return
    for W, bias, axis in readers:
        shape = [1] * W.dim()
        shape[axis] = -1
        if b is not None:
            bias += torch.tensordot(b, W, dims=([0], [axis]))
        W.mul_(w.reshape(shape))
        if center and b is not None:  # a LayerNorm's output has zero mean: W's mean over d_model is never read
            W.sub_(W.mean(axis, keepdim=True))
    w.fill_(1.0)
    if b is not None:
        b.zero_()


@torch.no_grad()
def center_writing_weights(model) -> None:
    """Remove the d_model mean of everything written into a LayerNorm's input (module docstring)."""
    others = sorted(set(model.cfg.layer_norms) - {"layernorm"})
    if others:
        raise GeoError(f"center_writing_weights needs every norm to be a LayerNorm, which removes the mean it drops; "
                       f"this model's norms include {', '.join(others)}, which do not, so its output would change")
    writers = [model.embed.W_E, model.pos_embed.W_pos]
    for block in model.blocks:
        writers += [block.attn.W_O, block.attn.b_O, block.mlp.W_out, block.mlp.b_out]
    for W in writers:
        W.sub_(W.mean(-1, keepdim=True))


@torch.no_grad()
def center_unembed(model) -> None:
    """Remove the vocabulary mean of W_U's rows and of b_U (module docstring)."""
    if model.cfg.unembed == "bounded":
        raise GeoError("center_unembed would change the bounded readout's logits, not shift them: it normalises each "
                       "W_U column, and centring the columns changes their norms and directions")
    model.unembed.W_U.sub_(model.unembed.W_U.mean(-1, keepdim=True))
    model.unembed.b_U.sub_(model.unembed.b_U.mean())
