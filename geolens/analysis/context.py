"""AnalysisContext: what the metrics of one checkpoint share, computed lazily and at most once.

The one expensive step is a single no-grad forward over all inputs that keeps the activations at
the `=` position (eqforward.EqActivations): from the engine's analysis forward where it has one (the
fast engine's per-token tables, eqforward.eq_forward_tables), otherwise from a run_with_cache narrowed to `=` after the last
attention (run_with_cache_narrowed: in the last block everything after attention is
position-wise and only `=` reaches the logits, so the MLP rows of positions a and b are never
computed). Both give the logits of model(tokens)[:, -1] up to float32 summation order.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from geolens.analysis import circuit, clockpizza, fourier, keyfreq, progress_measures
from geolens.analysis.eqforward import EqActivations, eq_forward_tables, eq_from_cache
from geolens.errors import GeoError
from geolens.model.config import GeoConfig
from geolens.model.engines import Engine, choose_engine
from geolens.model.tasks import Dataset

N_KEYS = 5


def _keep_last_position(act: Tensor, hook) -> Tensor:
    return act[:, -1:]


def last_position_hooks(cfg: GeoConfig) -> list[tuple[str, object]]:
    """Forward hooks that narrow the last block to the `=` position after its attention."""
    return [(f"blocks.{cfg.n_layers - 1}.hook_resid_mid", _keep_last_position)]


def last_position_forward(model, cfg: GeoConfig):
    """forward(tokens) -> logits [B, C] at `=`, identical to model(tokens)[:, -1] but without the
    last MLP's rows for positions a and b (usable with gradients: those rows get zero gradient anyway)."""
    hooks = last_position_hooks(cfg)
    return lambda tokens: model.run_with_hooks(tokens, fwd_hooks=hooks)[:, -1]


def run_with_cache_narrowed(model, cfg: GeoConfig, tokens: Tensor):
    """(logits [N, 1, C] at `=`, ActivationCache) of one no-grad run_with_cache with last_position_hooks."""
    with torch.no_grad(), model.hooks(fwd_hooks=last_position_hooks(cfg)):
        return model.run_with_cache(tokens)


class AnalysisContext:
    """Shared, lazily computed inputs of all metrics for one checkpoint (model, cfg, dataset).

    key_freqs: pin the key frequencies (group-order frequencies, strongest first) instead of
    taking keyfreq_wl_fft of this checkpoint. n_keys: how many keys the paper rule keeps. llc: the llc
    metric's SGLD settings (an llc.LLCSettings; None: llc.DEFAULT_LLC).
    """

    def __init__(self, model, cfg: GeoConfig, dataset: Dataset, key_freqs=None, n_keys: int = N_KEYS, llc=None):
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise GeoError(f"the analysis runs on CPU but the model is on {device}; pass model.cpu()")
        self.model = model
        self.cfg = cfg
        self.dataset = dataset
        self.n_keys = n_keys
        self.llc = llc
        self._pinned_keys = None if key_freqs is None else torch.as_tensor(key_freqs, dtype=torch.long).flatten()

    # -- one forward over every input --
    @functools.cached_property
    def eq(self) -> EqActivations:
        """Logits and activations at `=` of every input (see the module docstring)."""
        tokens = self.dataset.tokens
        if self.engine.eq_forward is not None:
            return eq_forward_tables(self.engine.eq_forward(self.model, tokens), self.cfg)
        return eq_from_cache(*run_with_cache_narrowed(self.model, self.cfg, tokens), self.cfg)

    @functools.cached_property
    def engine(self) -> Engine:
        """The fastest engine that computes this model (geolens.model.engines, 'auto')."""
        return choose_engine(self.cfg, "auto")[0]

    @property
    def logits(self) -> Tensor:
        """[N, C] logits of every input (a-major)."""
        return self.eq.logits

    @property
    def labels(self) -> Tensor:
        return self.dataset.labels

    @functools.cached_property
    def split_masks(self) -> dict[str, Tensor]:
        """{'train': [N] bool, 'test': [N] bool} over dataset rows."""
        N = self.labels.shape[0]
        out = {}
        for name, idx in (("train", self.dataset.train_idx), ("test", self.dataset.test_idx)):
            m = torch.zeros(N, dtype=torch.bool)
            m[idx] = True
            out[name] = m
        return out

    @functools.cached_property
    def accuracy(self) -> dict[str, float]:
        correct = self.logits.argmax(-1) == self.labels
        return {name: float(correct[m].float().mean()) for name, m in self.split_masks.items()}

    def forward(self, tokens: Tensor) -> Tensor:
        """Logits of `tokens` through the narrowed forward (gradients allowed)."""
        return last_position_forward(self.model, self.cfg)(tokens)

    def grad_forward(self, tokens: Tensor, rows: Tensor | None = None) -> Tensor:
        """Logits [B, C] of tokens [B, n_ctx] for gradients: the engine's (fast, deep: exact up to float
        rounding, ~1e-6 relative; hooked: the narrowed forward). rows [B]: tokens == dataset.tokens[rows],
        so an engine with an analysis forward (fast) reuses the forward of `eq`."""
        if self.engine.name == "hooked":
            return self.forward(tokens)
        if rows is not None and self.engine.eq_forward is not None and self.eq.fast is not None:
            return self.engine.logits(self.model, tokens, reuse=(self.eq.fast, rows))
        return self.engine.logits(self.model, tokens)

    # -- weights and activations --
    @functools.cached_property
    def W_L(self) -> Tensor:
        """[d_mlp, C] neuron-to-logit map (normalised W_U, no tau, for bounded models)."""
        with torch.no_grad():
            return self.model.W_L.detach()

    @functools.cached_property
    def acts(self) -> Tensor:
        """[N, d_mlp] post-ReLU activations of the last MLP at the `=` position."""
        return self.eq[f"blocks.{self.cfg.n_layers - 1}.mlp.hook_post"]

    # -- the cyclic frame and everything in group order --
    @functools.cached_property
    def frame(self) -> fourier.CyclicFrame:
        return fourier.cyclic_frame(self.cfg)

    @functools.cached_property
    def W_L_readout(self) -> Tensor:
        """[d_model, C] the matrix model.W_L multiplies the last W_out by (W_U, or its unit-norm columns
        when bounded): W_out[L] @ this is layer L's direct path to the logits."""
        with torch.no_grad():
            W = self.model.unembed.readout_matrix()
            return (W / self.cfg.tau if self.model.unembed.bounded else W).detach()

    @functools.cached_property
    def W_L_group(self) -> Tensor:
        """[d_mlp, n] W_L with classes in group order."""
        return self.W_L[:, self.frame.order]

    @functools.cached_property
    def W_E_group(self) -> Tensor:
        """[n, d_model] embeddings of the group tokens in group order (no `=`; no 0 for mul)."""
        return self.model.embed.W_E.detach()[self.frame.order]

    @functools.cached_property
    def acts_grid(self) -> Tensor:
        """[n, n, d_mlp] activations at `=` over the input grid in group order."""
        return self.frame.grid(self.acts)

    @functools.cached_property
    def logits_block(self) -> Tensor:
        """[n, n, n] logits over the input grid, classes in group order."""
        return self.frame.block(self.logits)

    @functools.cached_property
    def neuron_shares(self) -> tuple[Tensor, Tensor]:
        """(shares [d_mlp, K], active [d_mlp]) of keyfreq.neuron_freq_shares."""
        return keyfreq.neuron_freq_shares(self.acts_grid)

    @functools.cached_property
    def key_freqs(self) -> Tensor:
        """Key frequencies (strongest first): pinned, or keyfreq_wl_fft of this checkpoint."""
        if self._pinned_keys is not None:
            return self._pinned_keys
        return keyfreq.keyfreq_wl_fft(self.W_L_group, self.n_keys)

    @functools.cached_property
    def key_projections(self) -> progress_measures.KeyProjections:
        """progress_measures.key_projections of logits_block on the key frequencies (class means and the
        per-key projections [m, n, n] by label position and class)."""
        return progress_measures.key_projections(self.logits_block, self.frame, self.key_freqs)

    @functools.cached_property
    def dla(self) -> circuit.DLAResult:
        """circuit.direct_logit_attribution of every input's correct class at `=`, from `eq`."""
        return circuit.direct_logit_attribution(self.model, self.cfg, self.eq, self.labels)

    # -- clock / pizza pieces shared by the diagnostics and the verdict --
    @functools.cached_property
    def grad_symmetricity(self) -> float:
        return clockpizza.grad_symmetricity(self.model, self.cfg.n_classes)

    @functools.cached_property
    def distance_irrelevance(self) -> float:
        grid = clockpizza.correct_logit_grid(self.logits, self.labels, self.frame)
        return clockpizza.distance_irrelevance(grid, self.frame)
