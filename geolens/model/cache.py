"""GeoActivationCache: TransformerLens's ActivationCache with residual tools that are exact for
the post-norm GeoTransformer (what GeoTransformer.run_with_cache returns). A pre-norm GeoTransformer
(cfg.norm_placement 'pre') has HookedTransformer's topology and names (ln1, ln2, ln_final with
hook_scale), so its cache keeps TransformerLens's own methods unchanged (apply_ln_to_stack rescales
by the cached hook_scale, as on a HookedTransformer with folded norms; logit_attrs reads
model.tokens_to_residual_directions, which includes ln_final's gain). The rest of this docstring is
the post-norm model's.

TransformerLens's decompose_resid / stack_head_results / stack_neuron_results /
get_full_resid_decomposition assume a pre-norm model, where a stream is the plain sum of the
earlier components' writes and a final LayerNorm is applied before the readout. In a
GeoTransformer each norm's output replaces the stream, so those raw sums miss it. Here the same
methods, with the same arguments and labels, return geolens.model.decompose.residual_parts: every
component carried through the later norms with each norm's scale frozen at its cached value, so
the parts add up to the target stream (and, through logit_attrs, to the logits) to float rounding.

There is no norm between a stream and what reads it (attention, MLP and the readout read the
normalised stream directly), so the parts are already what the next layer or the readout sees:
apply_ln is accepted everywhere and changes nothing. accumulated_resid returns the cached streams.
What stays raw, as the hooks hold it: compute_head_results / hook_result (z_h W_O^h) and
get_neuron_results (post_n W_out[n]) are what a head or neuron writes into its norm's *input*.
"""

from __future__ import annotations

import torch
from torch import Tensor
from transformer_lens.ActivationCache import ActivationCache
from transformer_lens.utilities import Slice

from geolens.errors import GeoError
from geolens.model.decompose import residual_parts, stack, stream

MODES = ("all", "mlp", "attn")


def _slice(s) -> Slice:
    return s if isinstance(s, Slice) else Slice(s)


def _directions(project_output_onto: Tensor | None) -> tuple[Tensor | None, bool]:
    """(directions [d_model, k] or None, whether to squeeze the last dim: a [d_model] projection)."""
    if project_output_onto is None or project_output_onto.dim() == 2:
        return project_output_onto, False
    return project_output_onto[:, None], True


class GeoActivationCache(ActivationCache):
    """ActivationCache of a GeoTransformer run; the residual decompositions are exact for its
    post-norm topology (see the module docstring and geolens.model.decompose)."""

    @property
    def pre_norm(self) -> bool:
        """A pre-norm model: TransformerLens's own residual tools apply (module docstring)."""
        return self.model.cfg.norm_placement == "pre"

    # ---- plumbing ----
    def _acts(self, pos_slice: Slice):
        def act(name: str) -> Tensor:
            if name not in self.cache_dict:
                raise GeoError(f"the cache has no '{name}', which the residual decomposition needs; run run_with_cache "
                               f"without a names_filter (or keep hook_embed, hook_pos_embed, every hook_scale, "
                               f"attn.hook_z, hook_attn_out, mlp.hook_post, hook_mlp_out and the resid hooks)")
            return pos_slice.apply(self.cache_dict[name], dim=-3 if name.endswith("hook_z") else -2)
        return act

    def _parts(self, names_of, layer, mlp_input, pos_slice, project_output_onto, incl_remainder, return_labels, **kw):
        """Stack the residual_parts blocks chosen by names_of(blocks) (+ the remainder)."""
        pos_slice = _slice(pos_slice)
        act = self._acts(pos_slice)
        directions, squeeze = _directions(project_output_onto)
        blocks = residual_parts(self.model, act, layer, mlp_input, directions, **kw)
        names = names_of(blocks)
        target = stream(self.model, act, layer, mlp_input, directions)
        if names:
            parts, labels = stack(blocks, names)
        else:
            parts, labels = target.new_zeros(0, *target.shape), []
        if incl_remainder:
            parts = torch.cat([parts, (target - parts.sum(0))[None]], dim=0)
            labels.append("remainder")
        if squeeze:
            parts = parts.squeeze(-1)
        return (parts, labels) if return_labels else parts

    def apply_slice_to_batch_dim(self, batch_slice) -> GeoActivationCache:
        """The cache with batch_slice applied to the batch dimension (still a GeoActivationCache)."""
        sliced = super().apply_slice_to_batch_dim(batch_slice)
        return GeoActivationCache(sliced.cache_dict, self.model, has_batch_dim=sliced.has_batch_dim)

    # ---- TransformerLens's residual tools, exact for the post-norm model ----
    def decompose_resid(self, layer: int | None = None, mlp_input: bool = False, mode: str = "all",
                        apply_ln: bool = False, pos_slice=None, incl_embeds: bool = True, return_labels: bool = False):
        """The stream at the input of `layer` (None / -1 / n_layers: the final stream the readout
        reads; mlp_input: that layer's resid_mid) as an exact sum of parts [n_parts, *lead, d_model]:
        'embed', 'pos_embed' (incl_embeds), '{l}_attn_out' (mode 'all'/'attn'), '{l}_mlp_out'
        (b_out included; mode 'all'/'mlp') for the layers before it (and the layer's attention
        with mlp_input), and 'bias' (mode 'all': the LayerNorm offsets; zero for other norms),
        each carried through the later norms at their cached scales (geolens.model.decompose).
        apply_ln changes nothing (the stream is read without a further norm)."""
        if self.pre_norm:
            return super().decompose_resid(layer=layer, mlp_input=mlp_input, mode=mode, apply_ln=apply_ln,
                                           pos_slice=pos_slice, incl_embeds=incl_embeds, return_labels=return_labels)
        if mode not in MODES:
            raise GeoError(f"mode = {mode!r} is not valid; use one of {', '.join(MODES)}")
        kinds = (("embed",) if incl_embeds else ()) + {"all": ("attn", "mlp", "bias"), "attn": ("attn",), "mlp": ("mlp",)}[mode]
        return self._parts(list, layer, mlp_input, pos_slice, None, False, return_labels, split_heads=False, kinds=kinds)

    def stack_head_results(self, layer: int = -1, return_labels: bool = False, incl_remainder: bool = False,
                           pos_slice=None, apply_ln: bool = False):
        """Every head of the layers before `layer` as its part 'L{l}H{h}' of the stream at the
        input of `layer` [n_heads * layer, *lead, d_model] (z_h W_O^h carried through the later
        norms); incl_remainder adds 'remainder' = that stream minus the heads. apply_ln changes
        nothing."""
        if self.pre_norm:
            return super().stack_head_results(layer=layer, return_labels=return_labels,
                                              incl_remainder=incl_remainder, pos_slice=pos_slice, apply_ln=apply_ln)
        return self._parts(list, layer, False, pos_slice, None, incl_remainder, return_labels, kinds=("attn",))

    def stack_neuron_results(self, layer: int, pos_slice=None, neuron_slice=None, return_labels: bool = False,
                             incl_remainder: bool = False, apply_ln: bool = False,
                             project_output_onto: Tensor | None = None, mlp_input: bool = False):
        """Every neuron (neuron_slice of each layer) of the MLPs before `layer` as its part
        'L{l}N{n}' of the stream at the input of `layer` (its resid_mid with mlp_input):
        post_n W_out[n] carried through the later norms, [n_neurons, *lead, d_model], or projected
        on project_output_onto ([d_model] or [d_model, k]). b_out is not in any neuron (it is in
        the 'bias' part of get_full_resid_decomposition). apply_ln changes nothing."""
        if self.pre_norm:
            return super().stack_neuron_results(layer=layer, pos_slice=pos_slice, neuron_slice=neuron_slice,
                                                return_labels=return_labels, incl_remainder=incl_remainder,
                                                apply_ln=apply_ln, project_output_onto=project_output_onto,
                                                mlp_input=mlp_input)
        index = _slice([neuron_slice] if isinstance(neuron_slice, int) else neuron_slice).apply(
            torch.arange(self.model.cfg.d_mlp))
        return self._parts(list, layer, mlp_input, pos_slice, project_output_onto, incl_remainder, return_labels,
                           split_neurons=True, neuron_index=index.reshape(-1), kinds=("mlp",))

    def get_full_resid_decomposition(self, layer: int | None = None, mlp_input: bool = False,
                                     expand_neurons: bool = True, apply_ln: bool = False, pos_slice=None,
                                     return_labels: bool = False, project_output_onto: Tensor | None = None):
        """The stream at the input of `layer` as an exact sum of parts, in TransformerLens's order:
        every head 'L{l}H{h}', every neuron 'L{l}N{n}' (or, expand_neurons=False, each MLP
        '{l}_mlp_out' with its b_out), 'embed', 'pos_embed', 'bias' (the LayerNorm offsets, plus
        every b_out when the neurons are expanded), each carried through the later norms at their
        cached scales. [n_parts, *lead, d_model], or projected on project_output_onto ([d_model]
        or [d_model, k]; the readout directions model.tokens_to_residual_directions give logits).
        apply_ln changes nothing."""
        if self.pre_norm:
            return super().get_full_resid_decomposition(layer=layer, mlp_input=mlp_input,
                                                        expand_neurons=expand_neurons, apply_ln=apply_ln,
                                                        pos_slice=pos_slice, return_labels=return_labels,
                                                        project_output_onto=project_output_onto)
        def order(blocks):
            return ([n for n in blocks if n.startswith("attn")] + [n for n in blocks if n.startswith("mlp")]
                    + ["embed", "pos_embed", "bias"])
        return self._parts(order, layer, mlp_input, pos_slice, project_output_onto, False, return_labels,
                           split_neurons=expand_neurons)

    def accumulated_resid(self, layer: int | None = None, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice=None, mlp_input: bool = False, return_labels: bool = False):
        """The cached streams resid_pre of each layer up to `layer` (and resid_mid with incl_mid /
        mlp_input; 'final_post' for layer n_layers), [n, *lead, d_model]. Each is a norm's output
        and the readout reads it directly, so model.unembed(stack) is an exact logit lens; apply_ln
        changes nothing. Differences between consecutive entries are not layer outputs here
        (each norm rescales the whole stream): use decompose_resid for those."""
        return super().accumulated_resid(layer, incl_mid, apply_ln, pos_slice, mlp_input, return_labels)

    def apply_ln_to_stack(self, residual_stack: Tensor, layer: int | None = None, mlp_input: bool = False,
                          pos_slice=None, batch_slice=None, has_batch_dim: bool = True, recompute_ln: bool = False) -> Tensor:
        """Pre-norm: TransformerLens's (centre for a LayerNorm, divide by the cached hook_scale of the norm
        that reads the stream at `layer`; refused for a hybrid, whose norms differ by layer). Post-norm:
        the identity (after batch_slice), which is what the TransformerLens docstring promises for this
        model: no norm sits between a stream and what reads it (the stream *is* a norm's output), and the
        parts of this cache's decompositions (decompose_resid, stack_head_results, ...) have already been
        carried through every norm they pass, so they add up to the stream the readout reads and
        logit_attrs of them adds up to the logits. A stack of raw writes (compute_head_results,
        get_neuron_results, hook_attn_out: what enters a norm's input) is not a decomposition of any
        stream; decompose it with this cache's methods instead. recompute_ln changes nothing post-norm
        either (accumulated_resid(apply_ln=True) passes it: each cached stream is already a norm's output)."""
        if self.pre_norm and self.model.cfg.hybrid:
            raise GeoError(f"apply_ln_to_stack rescales with one kind of norm (TransformerLens's cfg.normalization_type), "
                           f"but this model's layers differ (norm = '{self.model.cfg.norm}'); divide the stack by the "
                           "hook_scale of the norm that reads it (and centre it for a LayerNorm) by hand")
        if self.pre_norm:
            return super().apply_ln_to_stack(residual_stack=residual_stack, layer=layer, mlp_input=mlp_input,
                                             pos_slice=pos_slice, batch_slice=batch_slice,
                                             has_batch_dim=has_batch_dim, recompute_ln=recompute_ln)
        if has_batch_dim:
            residual_stack = _slice(batch_slice).apply(residual_stack, dim=1)
        return residual_stack

    def logit_attrs(self, residual_stack: Tensor, tokens, incorrect_tokens=None, pos_slice=None, batch_slice=None,
                    has_batch_dim: bool = True) -> Tensor:
        """Each part's contribution to the logit of `tokens` (minus that of incorrect_tokens):
        residual_stack . model.tokens_to_residual_directions(tokens). Exact logits for the parts
        of this cache's decompositions of the final stream (layer None / n_layers): they add up
        to logits[..., tokens] (bounded readout: tau * unit-norm W_U columns, so the sum is the
        logit itself)."""
        return super().logit_attrs(residual_stack, tokens, incorrect_tokens, pos_slice, batch_slice, has_batch_dim)

    def logit_lens(self, **kwargs):
        """Refused: TransformerLens 4's logit_lens (transformer_lens.tools.analysis) reads a TransformerBridge's
        ln_final -> unembed. Here: model.unembed(stack) for a post-norm model (each stream is a norm output the
        readout reads directly), model.unembed(model.ln_final(stack)) for a pre-norm one, or TL's own on
        model.to_transformer_bridge() where TransformerLens can represent the model."""
        raise GeoError("TransformerLens's logit_lens reads a TransformerBridge's ln_final -> unembed; for a post-norm "
                       "GeoTransformer use model.unembed(cache.accumulated_resid()) (exact: every stream is a norm output "
                       "the readout reads directly), for a pre-norm one model.unembed(model.ln_final(cache.accumulated_resid())) "
                       "or model.to_transformer_bridge() and TransformerLens's own")
