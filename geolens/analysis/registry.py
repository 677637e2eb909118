"""The metric set of the trajectory layer: name -> MetricSpec, and compute_metrics.

Every metric reads one shared AnalysisContext per checkpoint (context.py). The context runs the
model once over all inputs (a no-grad run_with_cache, or the fast path's `=` forward for
one-layer models) and computes the shared pieces lazily and at most once: logits, activations at
`=`, W_L, the cyclic frame, key frequencies, key projections, the neuron spectra, the DLA. A caller
that holds a context passes it (compute_metrics(context=ctx)). Each metric returns a
flat dict of float scalars. `version` is bumped whenever a metric's definition changes (the
trajectory layer's cache is keyed on it); `applies(cfg)` returns None or the reason the metric is
skipped for that config.

Key frequencies used by fve_paper, restricted/excluded loss and embed_circles are the paper's
rule (keyfreq_wl_fft, top 5) of the checkpoint itself unless the caller pins them
(AnalysisContext(key_freqs=...), e.g. the final checkpoint's keys over a whole trajectory, as
Nanda et al. do). Per-key scalars are indexed by rank (1 = strongest), not by frequency, so the
columns stay stable while the keys move; keyfreq_wl_fft_<r> says which frequency rank r is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch.nn.functional as F
from torch import Tensor

from geolens.analysis import circuit, clockpizza, fve, geometry, health, keyfreq, landscape, progress_measures
from geolens.analysis.context import AnalysisContext
from geolens.threads import torch_threads
from geolens.analysis.llc import DEFAULT_LLC, LLCSettings
from geolens.errors import GeoError
from geolens.model.config import GeoConfig
from geolens.model.tasks import Dataset


# ---- applicability -----------------------------------------------------------------------------
def _always(cfg: GeoConfig) -> str | None:
    return None


def _cyclic(cfg: GeoConfig) -> str | None:
    if cfg.task == "perm":
        return f"Fourier metrics need a cyclic group Z_p; task perm is S_{cfg.n_perm}"
    return None


def _clock_pizza(cfg: GeoConfig) -> str | None:
    if cfg.task == "sub":
        return ("the Clock/Pizza verdict assumes a commutative a o b (a pizza adds the two operand "
                "embeddings); for subtraction a - b the operands are not interchangeable")
    return _cyclic(cfg)


# ---- metric functions (each: ctx -> flat dict of floats) ----------------------------------------
def _ranked(prefix: str, values, n: int) -> dict[str, float]:
    """{prefix_1: values[0], ..., prefix_n: ...}, NaN where values has fewer entries."""
    vals = [float(v) for v in values]
    return {f"{prefix}_{r + 1}": (vals[r] if r < len(vals) else float("nan")) for r in range(n)}


def m_loss(ctx: AnalysisContext) -> dict[str, float]:
    out = {}
    for name, m in ctx.split_masks.items():
        out[f"loss_{name}"] = float(F.cross_entropy(ctx.logits[m], ctx.labels[m]))
        out[f"acc_{name}"] = ctx.accuracy[name]
    return out


def m_keyfreq_wl_fft(ctx: AnalysisContext) -> dict[str, float]:
    keys = keyfreq.keyfreq_wl_fft(ctx.W_L_group, ctx.n_keys)
    return {**_ranked("keyfreq_wl_fft", keys, ctx.n_keys), "keyfreq_wl_fft_share": keyfreq.wl_topk_share(ctx.W_L_group, keys)}


def m_wl_spectrum(ctx: AnalysisContext) -> dict[str, float]:
    spec = keyfreq.wl_spectrum(ctx.W_L_group)
    return {f"wl_spectrum_{k}": float(v) for k, v in enumerate(spec.tolist()) if k > 0}


def m_keyfreq_neuron(ctx: AnalysisContext) -> dict[str, float]:
    freqs, _ = keyfreq.keyfreq_neuron(ctx.neuron_shares[0])
    return {**_ranked("keyfreq_neuron", freqs, ctx.n_keys), "keyfreq_neuron_count": float(freqs.numel())}


def m_keyfreq_embed(ctx: AnalysisContext) -> dict[str, float]:
    freqs = keyfreq.keyfreq_embed(ctx.W_E_group)
    return {**_ranked("keyfreq_embed", freqs, ctx.n_keys), "keyfreq_embed_count": float(freqs.numel())}


def m_fve_paper(ctx: AnalysisContext) -> dict[str, float]:
    U, V = fve.fve_paper(ctx.acts_grid, ctx.W_L_group, ctx.key_freqs, ctx.frame)
    out = {**_ranked("fve_paper_U", U, ctx.n_keys), **_ranked("fve_paper_V", V, ctx.n_keys)}
    for name, x in (("U", U), ("V", V)):
        out[f"fve_paper_{name}_max"] = float(x.nan_to_num(float("-inf")).max()) if x.numel() else float("nan")
        out[f"fve_paper_{name}_mean"] = float(x.nanmean()) if x.numel() else float("nan")
    return out


def m_fve_neuron(ctx: AnalysisContext) -> dict[str, float]:
    res = fve.fve_neuron(*ctx.neuron_shares)
    return {f"fve_neuron_{k}": v for k, v in res.items()}


def m_layer_spectrum(ctx: AnalysisContext) -> dict[str, float]:
    """Per layer L: the key frequencies and top-k share of its MLP's direct path to the logits (W_out[L] @ W_U,
    as keyfreq_wl_fft reads the last layer's W_L), and its MLP's neuron FVE at `=` (as fve_neuron)."""
    out = {}
    readout = ctx.W_L_readout
    for layer in range(ctx.cfg.n_layers):
        W_L = (ctx.model.blocks[layer].mlp.W_out.detach() @ readout)[:, ctx.frame.order]
        keys = keyfreq.keyfreq_wl_fft(W_L, ctx.n_keys)
        out.update(_ranked(f"layer_spectrum_L{layer}_key", keys, ctx.n_keys))
        out[f"layer_spectrum_L{layer}_share"] = keyfreq.wl_topk_share(W_L, keys)
        acts = ctx.frame.grid(ctx.eq[f"blocks.{layer}.mlp.hook_post"])
        out.update({f"layer_spectrum_L{layer}_fve_neuron_{k}": v
                    for k, v in fve.fve_neuron(*keyfreq.neuron_freq_shares(acts)).items()})
    return out


def m_llc(ctx: AnalysisContext) -> dict[str, float]:
    """The whole model's LLC and each component's (settings.component_list), each judged from its own traces
    (llc.judge without the drift factor: this metric does not measure the sharpness): llc_stable, llc_rhat,
    llc_ess and llc_<component>_stable, _rhat, _ess beside the values."""
    from geolens.analysis import llc

    x, y = ctx.dataset.train
    settings = ctx.llc or llc.DEFAULT_LLC
    chance = math.log(ctx.model.cfg.d_vocab_out)
    out: dict[str, float] = {}
    for component in (None, *settings.component_list):
        res = llc.model_llc(ctx.model, x, y, settings, component)
        verdict = llc.judge(res, chance)
        name = "llc" if component is None else f"llc_{component}"
        out.update({name: res["llc"], f"{name}_std": res["llc_std"], f"{name}_stable": float(verdict.stable),
                    f"{name}_rhat": verdict.rhat, f"{name}_ess": verdict.ess})
        if component is None:
            out["llc_init_loss"] = res["init_loss"]
    out.update({f"llc_setting_{k}": v for k, v in settings.numbers().items()})
    return out


def llc_version(settings: LLCSettings) -> str:
    """The llc metric's version: its definition's, then the SGLD settings its values were estimated with."""
    return "3:" + settings.key()


def m_sharpness(ctx: AnalysisContext) -> dict[str, float]:
    x, y = ctx.dataset.train
    return landscape.sharpness(ctx.model, x, y)


def m_restricted_loss(ctx: AnalysisContext) -> dict[str, float]:
    res = progress_measures.restricted_loss(ctx.logits, ctx.frame, ctx.key_freqs, ctx.split_masks, projs=ctx.key_projections)
    return {"restricted_loss": res["test"], "restricted_loss_train": res["train"]}


def m_excluded_loss(ctx: AnalysisContext) -> dict[str, float]:
    res = progress_measures.excluded_loss(ctx.logits, ctx.frame, ctx.key_freqs, ctx.split_masks, projs=ctx.key_projections)
    out = {"excluded_loss": res["train"]["all"], "excluded_loss_test": res["test"]["all"]}
    for r in range(ctx.n_keys):
        out[f"excluded_loss_{r + 1}"] = res["train"].get(str(r + 1), float("nan"))
        out[f"excluded_loss_test_{r + 1}"] = res["test"].get(str(r + 1), float("nan"))
    return out


def m_weight_norm(ctx: AnalysisContext) -> dict[str, float]:
    res = progress_measures.weight_norm(ctx.model)
    out = {"weight_norm": res.pop("frobenius"), "weight_norm_sq": res.pop("total_sq")}
    out.update({f"weight_norm_sq/{name}": v for name, v in res.items()})
    return out


def m_logit_cos_coeff(ctx: AnalysisContext) -> dict[str, float]:
    coef = progress_measures.logit_cos_coeff(ctx.logits_block, ctx.frame.sign)
    return {f"logit_cos_coeff_{k + 1}": float(c) for k, c in enumerate(coef)}


def m_truncated_logit_acc(ctx: AnalysisContext) -> dict[str, float]:
    frame = ctx.frame
    rows = frame.grid_rows.flatten()
    masks = {name: ctx.split_masks[name][rows] for name in ("test", "train")}
    res = progress_measures.truncated_logit_accuracies(ctx.logits_block.reshape(frame.n * frame.n, frame.n),
                                              frame.label_pos.flatten(), masks, ctx.n_keys)
    return {"truncated_logit_acc": res["test"][0], "truncated_logit_acc_train": res["train"][0]}


def m_grad_symmetricity(ctx: AnalysisContext) -> dict[str, float]:
    return {"grad_symmetricity": ctx.grad_symmetricity}


def m_distance_irrelevance(ctx: AnalysisContext) -> dict[str, float]:
    return {"distance_irrelevance": ctx.distance_irrelevance}


def m_layer_distance_irrelevance(ctx: AnalysisContext) -> dict[str, float]:
    cfg = ctx.cfg
    values = clockpizza.layer_distance_irrelevance(ctx.dla.components, cfg.n_layers, cfg.n_heads, ctx.frame)
    return {f"distance_irrelevance_L{layer}": v for layer, v in enumerate(values)}


def m_circularity(ctx: AnalysisContext) -> dict[str, float]:
    comps = clockpizza.circularity_components(ctx.W_E_group)
    out = {"circularity": float(comps.mean()) if comps.numel() else float("nan")}
    out.update(_ranked("circularity", comps, clockpizza.N_CIRCULARITY_COMPONENTS))
    return out


def m_clock_pizza(ctx: AnalysisContext) -> dict[str, float]:
    verdict = clockpizza.clock_pizza_verdict(ctx.grad_symmetricity, ctx.distance_irrelevance, ctx.accuracy["test"])
    return {"clock_pizza": clockpizza.verdict_code(verdict)}


def m_softmax_collapse(ctx: AnalysisContext) -> dict[str, float]:
    m = ctx.split_masks["train"]
    return {"softmax_collapse": health.softmax_collapse(ctx.logits[m])}


def m_zero_loss_fraction(ctx: AnalysisContext) -> dict[str, float]:
    m = ctx.split_masks["train"]
    return {"zero_loss_fraction": health.zero_loss_fraction(ctx.logits[m], ctx.labels[m])}


def m_nlm_cosine(ctx: AnalysisContext) -> dict[str, float]:
    x, y = ctx.dataset.train
    res = health.nlm_cosine(ctx.model, x, y, forward=lambda t: ctx.grad_forward(t, rows=ctx.dataset.train_idx))
    total = res.pop("total")
    return {"nlm_cosine": total, **{f"nlm_cosine/{name}": v for name, v in res.items()}}


def m_dla(ctx: AnalysisContext) -> dict[str, float]:
    res = ctx.dla
    out = {f"dla_{name}": v for name, v in res.means().items()}
    out["dla_total"] = float(res.total.mean())
    out["dla_recon_err"] = res.recon_error
    out["dla_normalised_space"] = 1.0 if cfg_bounded(ctx.cfg) else 0.0  # 1: scores are logit / tau
    out["dla_neuron_top10_share"] = _top_share(res.neurons, 10)
    return out


def cfg_bounded(cfg: GeoConfig) -> bool:
    """True when the readout is the bounded unembedding (DLA then scores in the normalised space)."""
    return cfg.unembed == "bounded"


def _top_share(x: Tensor, k: int) -> float:
    """Share of sum |x| held by the k largest |x|."""
    a = x.abs()
    return float(a.topk(min(k, a.numel())).values.sum() / a.sum()) if a.sum() > 0 else float("nan")


def m_attn_eq(ctx: AnalysisContext) -> dict[str, float]:
    out = {}
    for layer in range(ctx.cfg.n_layers):
        mean, _ = circuit.attention_from_eq(ctx.eq, layer)
        for h in range(mean.shape[0]):
            for pos, name in enumerate(("a", "b", "eq")):
                out[f"attn_eq_{name}_L{layer}H{h}"] = float(mean[h, pos])
    return out


def m_embed_circles(ctx: AnalysisContext) -> dict[str, float]:
    circles = circuit.embedding_circles(ctx.W_E_group, ctx.key_freqs)
    return {
        **_ranked("embed_circle_share", [c.share for c in circles], ctx.n_keys),
        **_ranked("embed_circle_roundness", [c.roundness for c in circles], ctx.n_keys),
    }


def m_effective_rank(ctx: AnalysisContext) -> dict[str, float]:
    return {
        "effective_rank_W_E": geometry.effective_rank(ctx.model.embed.W_E.detach()),
        "effective_rank_W_L": geometry.effective_rank(ctx.W_L),
        "effective_rank_mlp": geometry.effective_rank(ctx.acts),
    }


def m_resid_norm(ctx: AnalysisContext) -> dict[str, float]:
    res = geometry.resid_norm(ctx.eq, ctx.cfg)
    err = res.pop("sphere_err", None)
    out = {f"resid_norm/{name}": v for name, v in res.items()}
    if err is not None:
        out["resid_norm_sphere_err"] = err
    return out


# ---- the registry ------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSpec:
    """One metric: fn(ctx) -> {scalar name: float}, its definition version, and applies(cfg)."""

    name: str
    fn: Callable[[AnalysisContext], dict[str, float]]
    version: str
    applies: Callable[[GeoConfig], str | None]
    doc: str
    uses_keys: bool = False  # reads the key frequencies (which pinning key_freqs changes)
    opt_in: bool = False  # costly: computed only when named (geolens analyze --metrics NAME)


def _spec(name, fn, applies, doc, version="1", uses_keys=False, opt_in=False) -> MetricSpec:
    return MetricSpec(name, fn, version, applies, doc, uses_keys, opt_in)


METRICS: dict[str, MetricSpec] = {
    s.name: s
    for s in [
        _spec("loss", m_loss, _always, "cross-entropy and accuracy on train and test"),
        _spec("keyfreq_wl_fft", m_keyfreq_wl_fft, _cyclic, "paper's key frequencies: top-k bins of |rfft(W_L)|, L2 over neurons, DC dropped"),
        _spec("wl_spectrum", m_wl_spectrum, _cyclic, "||rfft(W_L)|| over neurons per frequency bin 1..n//2 (the spectrum keyfreq_wl_fft ranks)"),
        _spec("keyfreq_neuron", m_keyfreq_neuron, _cyclic, "Nanda's key set: best frequencies of neurons with > 85% block share"),
        _spec("keyfreq_embed", m_keyfreq_embed, _cyclic, "frequencies whose embedding Fourier norm exceeds max / 4"),
        _spec("fve_paper", m_fve_paper, _cyclic, "paper's FVE (percent) of the U and V projections per key", uses_keys=True),
        _spec("fve_neuron", m_fve_neuron, _cyclic, "per-neuron best-frequency energy share: fraction > 0.85 and mean"),
        _spec("layer_spectrum", m_layer_spectrum, _cyclic, "per layer: key frequencies and top-k share of its MLP's direct path W_out[L] W_U, and its neuron FVE"),
        _spec("restricted_loss", m_restricted_loss, _cyclic, "CE of the logits kept on the key cos/sin(w(a+b)) directions (test; train too)", uses_keys=True),
        _spec("excluded_loss", m_excluded_loss, _cyclic, "CE of the logits with the key directions removed (train; test too; all keys and per key)", uses_keys=True),
        _spec("weight_norm", m_weight_norm, _always, "sum of squared parameters, total and per tensor; Frobenius norm"),
        _spec("logit_cos_coeff", m_logit_cos_coeff, _cyclic, "coefficient of the logits on cos(w_k(a+b-c)) for every k"),
        _spec("truncated_logit_acc", m_truncated_logit_acc, _cyclic, "accuracy with only DC + top-5 rfft bins of the logits over classes"),
        _spec("grad_symmetricity", m_grad_symmetricity, _always, "mean cos(d logit_c/d e_a, d logit_c/d e_b) over 100 seeded triples"),
        _spec("distance_irrelevance", m_distance_irrelevance, _cyclic, "mean_d std_s of the correct logit / its total std"),
        _spec("layer_distance_irrelevance", m_layer_distance_irrelevance, _cyclic,
              "distance irrelevance of each layer's direct contribution (its heads + MLP) to the correct-class score"),
        _spec("circularity", m_circularity, _cyclic, "circularity of the first 4 PCA components of the token embeddings"),
        _spec("clock_pizza", m_clock_pizza, _clock_pizza, "verdict code: clock +1, pizza -1, mixed 0, unsolved NaN"),
        _spec("softmax_collapse", m_softmax_collapse, _always, "fraction of train examples with softmax denominator exactly 1"),
        _spec("zero_loss_fraction", m_zero_loss_fraction, _always, "fraction of train examples with loss exactly 0"),
        _spec("nlm_cosine", m_nlm_cosine, _always, "cos(-grad of train loss, parameters), total and per tensor"),
        _spec("sharpness", m_sharpness, _always, "top eigenvalue of the training loss's Hessian (Lanczos on Hessian-vector products)", opt_in=True),
        _spec("llc", m_llc, _always, "local learning coefficient (devinterp SGLD), whole model and per component",
              version=llc_version(DEFAULT_LLC), opt_in=True),
        _spec("dla", m_dla, _always, "direct logit attribution at `=` (correct minus mean others), mean over inputs"),
        _spec("attn_eq", m_attn_eq, _always, "mean attention of `=` onto a, b, = per head"),
        _spec("embed_circles", m_embed_circles, _cyclic, "energy share and roundness of the embeddings on each key plane", uses_keys=True),
        _spec("effective_rank", m_effective_rank, _always, "effective rank of W_E, W_L and the MLP activations at `=`"),
        _spec("resid_norm", m_resid_norm, _always, "mean residual norm at `=` per hook point (sphere models: max deviation from 1)", version="2"),
    ]
}


#: metrics whose definition and computation read nothing that depends on where the norms sit or how many
#: operands an example has (the logits, the weights, the gradients)
TOPOLOGY_AGNOSTIC = frozenset({"loss", "weight_norm", "softmax_collapse", "zero_loss_fraction", "nlm_cosine",
                               "sharpness", "llc"})


def topology_reason(name: str, cfg: GeoConfig) -> str | None:
    """Why metric `name` is not computed for this model's topology (None: it is). The metrics read the logits,
    the weights and the activations at `=` by hook name, which every depth, placement and hybrid has (the
    direct logit attribution has a post-norm and a pre-norm form); 3-operand tasks run only TOPOLOGY_AGNOSTIC
    (the others are built on the [a, b] grid)."""
    if name in TOPOLOGY_AGNOSTIC or cfg.n_operands == 2:
        return None
    return f"not yet served for task '{cfg.task}' ({cfg.n_operands} operands; written for [a, b, =] grids)"


def skip_reason(name: str, cfg: GeoConfig) -> str | None:
    """Why metric `name` is skipped for this config (its topology or its applies()), None when it is computed."""
    return topology_reason(name, cfg) or METRICS[name].applies(cfg)


def compute_metrics(
    model=None, cfg: GeoConfig | None = None, dataset: Dataset | None = None, names=None, key_freqs=None,
    num_threads: int | None = 1, context: AnalysisContext | None = None, llc: LLCSettings | None = None,
) -> tuple[dict[str, dict[str, float]], dict[str, str]]:
    """Compute the named metrics (default_metrics(): all but the opt-in ones) on one checkpoint.

    Returns (rows, skipped): rows[name] is the metric's flat dict of floats; skipped[name] is the
    reason a metric does not apply to this config. key_freqs pins the key frequencies (see
    AnalysisContext). context: an AnalysisContext to compute on instead of (model, cfg, dataset,
    key_freqs, llc), so a caller that reads activations from it too runs the forward only once
    (compute_metrics(context=ctx, names=...)). llc: the llc metric's SGLD settings (default DEFAULT_LLC).
    num_threads: torch threads for the duration of the call, restored after; None keeps the caller's setting.
    The default is one thread: most analysis ops are small and memory-bound, and on cores shared with other
    processes every 2-thread OpenMP region stalls when the other core is busy, while one thread degrades
    gracefully (docs/performance.md).
    """
    names = default_metrics() if names is None else list(names)
    unknown = [n for n in names if n not in METRICS]
    if unknown:
        raise GeoError(f"unknown metric(s) {unknown}; known metrics: {', '.join(METRICS)}")
    if context is None:
        if model is None or cfg is None or dataset is None:
            raise GeoError("compute_metrics needs model, cfg and dataset, or context=AnalysisContext(...)")
        context = AnalysisContext(model, cfg, dataset, key_freqs=key_freqs, llc=llc)
    elif any(x is not None for x in (model, cfg, dataset, key_freqs, llc)):
        raise GeoError("compute_metrics takes model, cfg, dataset (and key_freqs, llc) or a context, not both; the "
                       "context carries them (AnalysisContext(model, cfg, dataset, key_freqs=..., llc=...))")
    rows: dict[str, dict[str, float]] = {}
    skipped: dict[str, str] = {}
    with torch_threads(num_threads):
        for name in names:
            reason = skip_reason(name, context.cfg)
            if reason is not None:
                skipped[name] = reason
                continue
            rows[name] = {k: float(v) for k, v in METRICS[name].fn(context).items()}
    return rows, skipped


def default_metrics() -> list[str]:
    """The metrics computed when none are named: every registered one but the opt-in (costly) ones."""
    return [name for name, spec in METRICS.items() if not spec.opt_in]


def metric_versions(llc: LLCSettings = DEFAULT_LLC) -> dict[str, str]:
    """{metric name: version} for cache invalidation, the llc metric's for these SGLD settings."""
    return {name: spec.version for name, spec in METRICS.items()} | {"llc": llc_version(llc)}


#: llc versions whose values estimate what the current one does (version 2 added the llc_stable judgement and the
#: components setting to version 1's estimates; version 3 samples every training example, judges the whole trace
#: and every component, and records the sampler and components among the settings): cached values of these are
#: read (tables show their verdicts as not judged by today's rule: llc.stable_word), and recomputed only when the
#: llc metric is asked for
LLC_SAME_ESTIMATES = ("1", "2", "3")


def same_definition(name: str, cached: str | None, current: str) -> bool:
    """Whether a cached value of metric `name` (its version `cached`) is of the current definition (`current`):
    equal versions, except that an llc value estimated with other SGLD settings, or by a version in
    LLC_SAME_ESTIMATES, still is (its llc_setting_* columns say which settings); only a computation asks for the
    very version and settings."""
    if name == "llc" and cached is not None:
        return cached.split(":", 1)[0] in LLC_SAME_ESTIMATES and current.split(":", 1)[0] in LLC_SAME_ESTIMATES
    return cached == current
