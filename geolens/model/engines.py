"""The forward engines behind training and analysis, and the one place that chooses between them.

    fast    geolens.model.fast: one-layer post-norm [a, b, =] models from per-token tables (the fastest)
    deep    geolens.model.deep: every depth, placement, per-layer norm (hybrid) and task
    hooked  the GeoTransformer forward itself (the reference; vmapped over stacked members)

Every caller (training, batched training, forks, the analysis context, the precursor columns, the
benchmarks) asks `choose_engine(cfg)` for an Engine and calls its methods. cfg.engine 'auto' takes the first engine of ENGINES that computes the model; a named engine is
used, or refused in one line with the reason. tests/test_engines.py runs its equivalence cases (logits,
every gradient, training trajectories, resume) over every registered engine.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
from jaxtyping import Int
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.config import GeoConfig
from geolens.model.deep import deep_eq_values, deep_flops, deep_forward_with_values, deep_logits, \
    deep_unsupported_reason, full_flops, stacked_deep_logits
from geolens.model.fast import FastEq, fast_eq_forward, fast_flops, fast_logits, fast_unsupported_reason, \
    stacked_fast_logits

Acts = dict[str, Tensor]  # activation_names(cfg) -> values at `=` (see there)


def activation_names(cfg: GeoConfig) -> list[str]:
    """The activations at `=` the precursor columns read, by hook name: every layer's blocks.L.hook_resid_post
    [N, D] and blocks.L.mlp.hook_post [N, d_mlp]; with learned attention, blocks.L.attn.hook_attn_scores
    [N, H, n_ctx] (the `=` query's scores over the keys) of every layer after the first (layer 0's come from
    per-token tables, geolens.training.precursor_columns.eq_query_scores)."""
    out = [f"blocks.{l}.{name}" for l in range(cfg.n_layers) for name in ("hook_resid_post", "mlp.hook_post")]
    if cfg.attention == "learned":
        out += [f"blocks.{l}.attn.hook_attn_scores" for l in range(1, cfg.n_layers)]
    return out


@dataclass(frozen=True)
class Engine:
    """One way to compute a GeoTransformer's logits at `=` (all methods take the model as it stands).

    unsupported_reason(cfg): None, or why this engine cannot compute the model (one line).
    logits(model, tokens [B, n_ctx]) -> [B, C], differentiable w.r.t. the model's parameters.
    stacked_logits(model, params {name: [M, *shape]}, tokens [M][B, n_ctx]) -> [M, B, C]: M members of
        model's config (model gives the config, the readout temperature and, hooked, the module).
    train_forward(model, tokens, record) -> (logits [B, C], Acts or None): the training step's forward;
        with record, the activations the precursor columns read when the engine has them for free.
    eq_activations(model, tokens) -> Acts (no grad).
    flops(cfg, n_examples, backward) -> the FLOPs of its matmul-like work (training.resources' time estimate).
    eq_forward(model, tokens) -> geolens.model.fast.FastEq, or None: the analysis forward of every value at `=`
        where the engine has one (fast); geolens.analysis.eqforward names its values by hook, and logits(model,
        tokens, reuse=(that, rows)) reuses it for gradients.
    """

    name: str
    unsupported_reason: Callable[[GeoConfig], str | None]
    logits: Callable[..., Tensor]
    stacked_logits: Callable[..., Tensor]
    train_forward: Callable[..., tuple[Tensor, Acts | None]]
    eq_activations: Callable[..., Acts]
    flops: Callable[[GeoConfig, int, bool], int]
    eq_forward: Callable[..., FastEq] | None = None


# ---- fast --------------------------------------------------------------------------------------
def _fast_train_forward(model, tokens: Tensor, record: bool) -> tuple[Tensor, Acts | None]:
    if not record:
        return fast_logits(model, tokens), None
    eq = fast_eq_forward(model, tokens, full=False)  # its forward is reused for the gradient: the same numbers
    return fast_logits(model, tokens, reuse=(eq, None)), _fast_named(eq.values)


def _fast_named(values: dict[str, Tensor]) -> Acts:
    return {"blocks.0.hook_resid_post": values["resid_post"], "blocks.0.mlp.hook_post": values["mlp_post"]}


@torch.no_grad()
def _fast_acts(model, tokens: Tensor) -> Acts:
    return _fast_named(fast_eq_forward(model, tokens, full=False).values)


# ---- deep --------------------------------------------------------------------------------------
def _deep_train_forward(model, tokens: Tensor, record: bool) -> tuple[Tensor, Acts | None]:
    if not record:
        return deep_logits(model, tokens), None
    logits, values = deep_forward_with_values(model, tokens)
    return logits, _named(model.cfg, values)


def _named(cfg: GeoConfig, values: dict[str, Tensor]) -> Acts:
    """The activation_names entries of a deep forward's values."""
    return {name: values[name] for name in activation_names(cfg)}


# ---- hooked ------------------------------------------------------------------------------------
def _hooked_stacked(model, params: dict[str, Tensor], tokens: list[Tensor]) -> Tensor:
    """The hooked forward vmapped over the members (torch.func.vmap + functional_call)."""
    return torch.func.vmap(lambda p, x: torch.func.functional_call(model, p, (x,))[:, -1])(params, torch.stack(tokens))


@torch.no_grad()
def _hooked_acts(model, tokens: Int[Tensor, "N n_ctx"]) -> Acts:
    names = activation_names(model.cfg)
    _, cache = model.run_with_cache(tokens, names_filter=lambda n: n in names)
    return {n: cache[n][:, :, -1] if n.endswith("hook_attn_scores") else cache[n][:, -1] for n in names}


ENGINES: tuple[Engine, ...] = (
    Engine("fast", fast_unsupported_reason, fast_logits,
           lambda model, params, tokens: stacked_fast_logits(model.cfg, params, tokens, model.unembed.tau),
           _fast_train_forward, _fast_acts, lambda cfg, n, backward: sum(fast_flops(cfg, n, backward).values()),
           fast_eq_forward),
    Engine("deep", deep_unsupported_reason, deep_logits,
           lambda model, params, tokens: stacked_deep_logits(model.cfg, params, tokens, model.unembed.tau),
           _deep_train_forward,
           lambda model, tokens: _named(model.cfg, deep_eq_values(model, tokens)), deep_flops),
    Engine("hooked", lambda cfg: None, lambda model, tokens: model(tokens)[:, -1], _hooked_stacked,
           lambda model, tokens, record: (model(tokens)[:, -1], None), _hooked_acts, full_flops),
)
ENGINE_NAMES = tuple(e.name for e in ENGINES)


def engine_named(name: str) -> Engine:
    """The registered engine `name` (a GeoError naming the choices otherwise)."""
    for engine in ENGINES:
        if engine.name == name:
            return engine
    raise GeoError(f"unknown engine '{name}'; choose one of {', '.join(ENGINE_NAMES)} (or auto)")


def choose_engine(cfg: GeoConfig, requested: str | None = None) -> tuple[Engine, str]:
    """(engine, why) for the model: `requested` (default cfg.engine) by name, or for 'auto' the first of
    ENGINES that computes it. A named engine that cannot is a GeoError with its reason."""
    requested = cfg.engine if requested is None else requested
    if requested != "auto":
        engine = engine_named(requested)
        reason = engine.unsupported_reason(cfg)
        if reason is not None:
            raise GeoError(f"engine={requested} cannot run this model: {reason}; use --set engine=auto or engine=hooked")
        return engine, f"engine={requested} requested"
    skipped = []
    for engine in ENGINES:
        reason = engine.unsupported_reason(cfg)
        if reason is None:
            why = f"{engine.name} engine computes this model"
            return engine, why + (f" ({'; '.join(skipped)})" if skipped else "")
        skipped.append(f"{engine.name}: {reason}")
    raise AssertionError("the hooked engine computes every model")
