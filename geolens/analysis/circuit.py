"""Circuit views at the `=` position: direct logit attribution, attention onto (a, b, =),
embedding circles, and a circuitsvis attention view for notebooks.

Direct logit attribution in a POST-norm model
---------------------------------------------
geolens models normalise after every sublayer and the normalised value replaces the residual
stream, so nothing reaches the logits without passing through the last norm (and, for the
embedding and the heads, through the earlier ones). The attribution here is defined on the
**final normalised residual stream at `=`** (blocks.{L-1}.hook_resid_post[:, -1]): it is split
into direct-path components (normalised embedding+positional vector, each head's z_h W_O^h,
each MLP layer's sum of neuron writes, and one 'bias' component for b_out and LayerNorm offsets),
pushing each component through every later norm with that norm's *actual* scale for the input
(the scale read from hook_scale is frozen, so each norm acts linearly: LayerNorm centres, divides
by the scale and multiplies by w; RMSNorm divides and multiplies by w; the sphere divides by
||x||). The components then add up exactly to the final normalised residual stream. The
embedding path is taken after the first norm (embed_norm is not linearised: the tokens a and b
reach `=` only through attention, so the `=` embedding is constant anyway). The same
linearisation, with embed_norm frozen too and every position, layer, head and neuron, is
geolens.model.decompose (model.run_with_cache's cache.decompose_resid / get_full_resid_decomposition).

Direct logit attribution in a PRE-norm model
--------------------------------------------
With norm_placement = 'pre' the residual stream is a plain sum (HookedTransformer's identity) and only
ln_final stands between it and the readout. The final stream at `=` (blocks.{L-1}.hook_resid_post)
is split into the embedding (blocks.0.hook_resid_pre), each head's z_h W_O^h, each MLP's output less
b_out, and 'bias' (every b_out and ln_final's offset b); ln_final is linearised at its actual scale
(as TransformerLens's cache.apply_ln_to_stack does), so the components add up exactly to the score.

Each component is scored by (score of the correct class) - (mean score of the other classes).
Raw readouts score in logit units. Bounded readouts score in the **normalised space**:
score = h . W_U[:, c] / ||W_U[:, c]|| = logit / tau (a cosine when h is on the sphere).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.analysis.eqforward import EqActivations
from geolens.analysis.fourier import cos_index, fourier_basis, sin_index
from geolens.threads import single_thread
from geolens.model.config import GeoConfig
from geolens.model.decompose import norm_kind, norm_linear, norm_linear_T, norm_offset, pull_back
from geolens.model.readout import unit_columns


# ---- direct logit attribution --------------------------------------------------------------------
def readout_directions(model, cfg: GeoConfig) -> Float[Tensor, "d_model C"]:
    """What the final residual stream is read against: W_U (raw) or unit-norm W_U columns (bounded)."""
    W = model.unembed.W_U.detach()
    return unit_columns(W) if cfg.unembed == "bounded" else W


def logit_diff_directions(W: Float[Tensor, "d_model C"]) -> Float[Tensor, "d_model C"]:
    """Column y: W[:, y] minus the mean of the other columns, so h . D[:, y] = score_y - mean others."""
    C = W.shape[1]
    return W - (W.sum(1, keepdim=True) - W) / (C - 1)


POST_POINT = "final normalised residual stream at `=` (post-norm; norms linearised at their actual scale)"
PRE_POINT = "final residual stream at `=` through ln_final (pre-norm; ln_final linearised at its actual scale)"


@dataclass
class DLAResult:
    """Direct logit attribution at `=` for every input (see the module docstring).

    units:      'logit' or the normalised-space description (bounded readouts)
    components: name -> [N] score per input ('embed_pos', 'L{l}H{h}', 'mlp_L{l}', 'bias')
    neurons:    [d_mlp] mean score of each neuron of the last MLP (they sum to the mean of its
                mlp component)
    total:      [N] sum of the components; actual: [N] the score read off the model's logits
    """

    units: str
    components: dict[str, Tensor]
    neurons: Tensor
    total: Tensor
    actual: Tensor
    neurons_per_input: Tensor | None = None
    attribution_point: str = POST_POINT

    def means(self) -> dict[str, float]:
        return {name: float(v.mean()) for name, v in self.components.items()}

    @property
    def recon_error(self) -> float:
        """Largest |total - actual| (rounding only: the decomposition is exact)."""
        return float((self.total - self.actual).abs().max())


def direct_logit_attribution(
    model, cfg: GeoConfig, eq: EqActivations, labels: Int[Tensor, "N"], per_input_neurons: bool = False
) -> DLAResult:
    """Direct logit attribution of the correct-class score at `=` for every input.

    eq: activations at `=` (eqforward.EqActivations: AnalysisContext.eq, or
    eqforward.eq_from_cache of a run_with_cache); labels: [N] correct classes.

    Instead of pushing every component forward through the norms, the score direction (correct
    column minus mean of the others) is pulled back through each norm (geolens.model.decompose.pull_back,
    shared with the full residual decompositions of geolens.model.decompose) and every component is
    dotted with the direction valid where it enters the residual stream; the two are equal
    because each frozen norm is linear. A frozen norm is a fixed linear map divided by the
    input's scale, so the direction for input n is f[n] * G[:, labels[n]]: one [d_model, C] table
    G pulled back per norm and one per-input factor f [N]. The heads' and the last MLP's neurons'
    scores equal the parts of decompose.residual_parts projected on the same directions; here
    the embedding is one component taken after embed_norm ('embed_pos' = blocks.0.hook_resid_pre,
    embed_norm's offset included) and 'bias' holds the later norms' offsets and every b_out. A pre-norm
    model's parts are read through ln_final alone (_pre_norm_components; its 'bias': every b_out and ln_final's b).
    per_input_neurons=True also returns the [N, d_mlp] per-input neuron scores (memory heavy).
    """
    D = logit_diff_directions(readout_directions(model, cfg))  # [d_model, C]
    if cfg.norm_placement == "pre":
        comps, final_norm, scale_name = _pre_norm_components(model, cfg, eq, labels, D), model.ln_final, "ln_final"
    else:
        L = cfg.n_layers - 1
        comps, final_norm, scale_name = _post_norm_components(model, cfg, eq, labels, D), model.blocks[L].mlp_norm, f"blocks.{L}.mlp_norm"
    order = ["embed_pos"] + [f"L{l}H{h}" for l in range(cfg.n_layers) for h in range(cfg.n_heads)]
    order += [f"mlp_L{l}" for l in range(cfg.n_layers)] + ["bias"]
    comps = {name: comps[name] for name in order}
    total = torch.stack(list(comps.values())).sum(0)
    # the real score, read off the logits: correct minus mean of the others (/ tau when bounded)
    correct = eq.logits.gather(1, labels[:, None])[:, 0]
    actual = (correct - (eq.logits.sum(1) - correct) / (eq.logits.shape[1] - 1)) / (cfg.tau if cfg.unembed == "bounded" else 1.0)

    # neurons of the last MLP: score_n(x) = post_n(x) / scale(x) * M[n, y(x)], M = lin(W_out) @ D, the final norm's
    # linear part at scale 1 (post-norm: the last mlp_norm; pre-norm: ln_final)
    N, L = labels.shape[0], cfg.n_layers - 1
    post = eq[f"blocks.{L}.mlp.hook_post"]  # [N, d_mlp]
    M = norm_linear(cfg, final_norm, model.blocks[L].mlp.W_out.detach()) @ D  # [d_mlp, C]
    inv_scale = None if norm_kind(final_norm) == "none" else eq[f"{scale_name}.hook_scale"][:, 0].reciprocal()
    # per_class[c] = sum over inputs of class c of post / scale: one bag per class over the inputs sorted by class
    by_class = torch.argsort(labels, stable=True)
    counts = torch.bincount(labels, minlength=D.shape[1])
    per_class = torch.nn.functional.embedding_bag(
        by_class, post, torch.cumsum(counts, 0) - counts, mode="sum",
        per_sample_weights=None if inv_scale is None else inv_scale[by_class])  # [C, d_mlp]
    neurons = (per_class.T * M).sum(1) / N
    per_input = None
    if per_input_neurons:
        per_input = (post if inv_scale is None else post * inv_scale[:, None]) * M.T[labels]

    if cfg.unembed == "bounded":
        units = "normalised space: score = logit / tau against unit-norm W_U columns (a cosine when h is on the sphere)"
    else:
        units = "logit"
    point = PRE_POINT if cfg.norm_placement == "pre" else POST_POINT
    return DLAResult(units, comps, neurons, total, actual, per_input, point)


def _post_norm_components(model, cfg: GeoConfig, eq: EqActivations, labels: Tensor, D: Tensor) -> dict[str, Tensor]:
    """The components' [N] scores of a post-norm model, each carried through every later norm (pull_back)."""
    N = labels.shape[0]
    # pulled[j] = (G, f): the score directions at the input of norm j of decompose.norm_chain
    pulled = pull_back(model, D, lambda name: eq[name][:, 0], torch.ones(N, dtype=D.dtype), 2 * cfg.n_layers, stop=1)

    def score(x: Tensor, j: int) -> Tensor:  # x [N, d_model] entering norm j -> [N] along each input's direction
        G, f = pulled[j]
        return (x * G.T[labels]).sum(-1) * f

    def const_score(x: Tensor, j: int) -> Tensor:  # a vector [d_model] shared by every input -> [N]
        G, f = pulled[j]
        return (G.T @ x)[labels] * f

    def offset_score(norm, j: int) -> Tensor | float:  # the norm's offset (LayerNorm b) enters norm j; 0 otherwise
        b = norm_offset(cfg, norm)
        return 0.0 if b is None else const_score(b, j)

    comps: dict[str, Tensor] = {}
    bias = torch.zeros(N, dtype=D.dtype)
    for l in reversed(range(cfg.n_layers)):
        block, j = model.blocks[l], 2 * l + 2  # norm j: mlp_norm of layer l; j - 1: its attn_norm
        # x2 = mlp_norm(x1 + mlp_out): mlp_out (and b_out) enter before mlp_norm
        bias = bias + offset_score(block.mlp_norm, j + 1)
        b_out = const_score(block.mlp.b_out.detach(), j)
        comps[f"mlp_L{l}"] = score(eq[f"blocks.{l}.hook_mlp_out"], j) - b_out
        bias = bias + b_out
        # x1 = attn_norm(resid_pre + heads)
        bias = bias + offset_score(block.attn_norm, j)
        G, f = pulled[j - 1]
        head_dirs = torch.einsum("hed,dc->che", block.attn.W_O.detach(), G)  # [C, H, d_head]
        head_scores = (eq[f"blocks.{l}.attn.hook_z"] * head_dirs[labels]).sum(-1) * f[:, None]  # [N, H]
        for h in range(cfg.n_heads):
            comps[f"L{l}H{h}"] = head_scores[:, h]
    comps["embed_pos"] = score(eq["blocks.0.hook_resid_pre"], 1)
    comps["bias"] = bias
    return comps


def _pre_norm_components(model, cfg: GeoConfig, eq: EqActivations, labels: Tensor, D: Tensor) -> dict[str, Tensor]:
    """The components' [N] scores of a pre-norm model: the final stream is their plain sum, read through ln_final at
    its actual scale s: a component x scores (x . lin^T(D[:, y])) / s; ln_final's offset b scores b . D[:, y]."""
    norm = model.ln_final
    G = norm_linear_T(cfg, norm, D.T).T  # [d_model, C]
    f = eq["ln_final.hook_scale"][:, 0].reciprocal() if norm_kind(norm) != "none" else torch.ones(labels.shape[0], dtype=D.dtype)

    def score(x: Tensor) -> Tensor:  # x [N, d_model] written into the stream -> [N]
        return (x * G.T[labels]).sum(-1) * f

    def const_score(x: Tensor) -> Tensor:  # a vector [d_model] written for every input -> [N]
        return (G.T @ x)[labels] * f

    offset = norm_offset(cfg, norm)
    bias = torch.zeros(labels.shape[0], dtype=D.dtype) if offset is None else (D.T @ offset)[labels]
    comps: dict[str, Tensor] = {"embed_pos": score(eq["blocks.0.hook_resid_pre"])}
    for l, block in enumerate(model.blocks):
        head_dirs = torch.einsum("hed,dc->che", block.attn.W_O.detach(), G)  # [C, H, d_head]
        head_scores = (eq[f"blocks.{l}.attn.hook_z"] * head_dirs[labels]).sum(-1) * f[:, None]  # [N, H]
        for h in range(cfg.n_heads):
            comps[f"L{l}H{h}"] = head_scores[:, h]
        b_out = const_score(block.mlp.b_out.detach())
        comps[f"mlp_L{l}"] = score(eq[f"blocks.{l}.hook_mlp_out"]) - b_out
        bias = bias + b_out
    comps["bias"] = bias
    return comps


# ---- attention at `=` -------------------------------------------------------------------------
def attention_from_eq(eq: EqActivations, layer: int = 0) -> tuple[Float[Tensor, "H n_ctx"], Float[Tensor, "N H n_ctx"]]:
    """Attention of the `=` query onto each position ((a, b, =); add3 (a, b, c, =)) per head: (mean over inputs,
    per input)."""
    pattern = eq[f"blocks.{layer}.attn.hook_pattern"]  # [N, H, key pos]
    return pattern.mean(0), pattern


def attention_view(cache, index: int, tokens: list[str] | None = None, layer: int = 0):
    """circuitsvis view of every head's 3 x 3 attention pattern for input number `index`.

    Returns a circuitsvis RenderedHTML (displays itself in a notebook). tokens: labels of the
    three positions, e.g. ['12', '40', '='] (default ['a', 'b', '=']).
    """
    import circuitsvis.attention as cv_attention

    pattern = cache[f"blocks.{layer}.attn.hook_pattern"][index]  # [H, 3, 3]
    return cv_attention.attention_patterns(tokens=tokens or ["a", "b", "="], attention=pattern)


# ---- embedding circles --------------------------------------------------------------------------
@dataclass
class EmbeddingCircle:
    """Token embeddings projected on the plane of one key frequency.

    coords: [n, 2] coordinates of the n group tokens (group order) in an orthonormal basis of the
    plane spanned by (cos k row of F) @ W_E and (sin k row) @ W_E; share: fraction of the centred
    embedding energy in that plane; roundness: sigma_min / sigma_max of the centred coords
    (1 for a circle, 0 for a line).
    """

    freq: int
    coords: Tensor
    share: float
    roundness: float


def embedding_circles(W_E: Float[Tensor, "n d_model"], freqs: Tensor) -> list[EmbeddingCircle]:
    """One EmbeddingCircle per key frequency; W_E rows are the group tokens in group order."""
    n = W_E.shape[0]
    F = fourier_basis(n, W_E.dtype)
    X = W_E - W_E.mean(0)
    total = X.square().sum()
    out = []
    for k in freqs.tolist():
        rows = [cos_index(k)] + ([sin_index(k)] if 2 * k < n else [])
        plane = (F[rows] @ W_E).T  # [d_model, 1 or 2]
        with single_thread():
            Q, R = torch.linalg.qr(plane)
        Q = Q[:, R.diagonal().abs() > 1e-9 * float(total.sqrt())]  # drop directions with no energy
        coords = X @ Q
        if coords.shape[1] < 2:
            coords = torch.cat([coords, torch.zeros(n, 2 - coords.shape[1], dtype=coords.dtype)], dim=1)
        with single_thread():
            sv = torch.linalg.svdvals(coords - coords.mean(0))
        share = float(coords.square().sum() / total) if total > 0 else float("nan")
        roundness = float(sv[-1] / sv[0]) if sv[0] > 0 else float("nan")
        out.append(EmbeddingCircle(int(k), coords, share, roundness))
    return out
