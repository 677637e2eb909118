"""AnalysisContext: what the metrics of one checkpoint share, computed lazily and at most once.

The one expensive step is a single no-grad run_with_cache over all inputs. It narrows the last
block's residual stream to the `=` position right after attention (a hook on
blocks.{L-1}.hook_resid_mid that keeps [:, -1:]): in the last block everything after attention is
position-wise and only `=` reaches the logits, so the MLP rows of positions a and b cannot change
any metric, and skipping them removes about half of the forward's work. Consequences, all
intended: the logits are bit-identical to model(tokens); cached activations from
blocks.{L-1}.hook_resid_mid onwards (mlp.hook_pre/post, hook_mlp_out, mlp_norm.*,
hook_resid_post) have a position axis of length 1 (the `=` position); everything before, including
attn_norm.hook_normalized, keeps all three positions.
"""

from __future__ import annotations

import functools

import torch
from torch import Tensor

from geolens.analysis import clockpizza, fourier, keyfreq
from geolens.config import GeoConfig
from geolens.errors import GeoError
from geolens.tasks import Dataset

N_KEYS = 5


def _keep_last_position(act: Tensor, hook) -> Tensor:
    return act[:, -1:]


def last_position_hooks(cfg: GeoConfig) -> list[tuple[str, object]]:
    """Forward hooks that narrow the last block to the `=` position after its attention."""
    return [(f"blocks.{cfg.n_layers - 1}.hook_resid_mid", _keep_last_position)]


def last_position_forward(model, cfg: GeoConfig):
    """forward(tokens) -> logits, identical to model(tokens) but without the last MLP's rows for
    positions a and b (usable with gradients: those rows get zero gradient anyway)."""
    hooks = last_position_hooks(cfg)
    return lambda tokens: model.run_with_hooks(tokens, fwd_hooks=hooks)


class AnalysisContext:
    """Shared, lazily computed inputs of all metrics for one checkpoint (model, cfg, dataset).

    key_freqs: pin the key frequencies (group-order frequencies, strongest first) instead of
    taking keyfreq_wl_fft of this checkpoint. n_keys: how many keys the paper rule keeps.
    """

    def __init__(self, model, cfg: GeoConfig, dataset: Dataset, key_freqs=None, n_keys: int = N_KEYS):
        device = next(model.parameters()).device
        if device.type != "cpu":
            raise GeoError(f"the analysis runs on CPU but the model is on {device}; pass model.cpu()")
        self.model = model
        self.cfg = cfg
        self.dataset = dataset
        self.n_keys = n_keys
        self._pinned_keys = None if key_freqs is None else torch.as_tensor(key_freqs, dtype=torch.long).flatten()

    # -- one forward over every input --
    @functools.cached_property
    def _forward(self):
        with torch.no_grad(), self.model.hooks(fwd_hooks=last_position_hooks(self.cfg)):
            return self.model.run_with_cache(self.dataset.tokens)

    @property
    def logits(self) -> Tensor:
        """[N, C] logits of every input (a-major)."""
        return self._forward[0]

    @property
    def cache(self):
        """TransformerLens ActivationCache of the same forward (see the module docstring)."""
        return self._forward[1]

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

    # -- weights and activations --
    @functools.cached_property
    def W_L(self) -> Tensor:
        """[d_mlp, C] neuron-to-logit map (normalised W_U, no tau, for bounded models)."""
        with torch.no_grad():
            return self.model.W_L.detach()

    @functools.cached_property
    def acts(self) -> Tensor:
        """[N, d_mlp] post-ReLU activations of the last MLP at the `=` position."""
        return self.cache[f"blocks.{self.cfg.n_layers - 1}.mlp.hook_post"][:, -1]

    # -- the cyclic frame and everything in group order --
    @functools.cached_property
    def frame(self) -> fourier.CyclicFrame:
        return fourier.cyclic_frame(self.cfg)

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

    # -- clock / pizza pieces shared by the diagnostics and the verdict --
    @functools.cached_property
    def grad_symmetricity(self) -> float:
        return clockpizza.grad_symmetricity(self.model, self.cfg.n_classes)

    @functools.cached_property
    def distance_irrelevance(self) -> float:
        grid = clockpizza.correct_logit_grid(self.logits, self.labels, self.frame)
        return clockpizza.distance_irrelevance(grid, self.frame)
