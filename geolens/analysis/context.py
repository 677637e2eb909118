"""AnalysisContext: what the metrics of one checkpoint share, computed lazily and at most once.

The one expensive step is a single no-grad forward over all inputs with an activation cache
(run_with_cache_narrowed, the reference route). It narrows the last
block's residual stream to the `=` position right after attention (a hook on
blocks.{L-1}.hook_resid_mid that keeps [:, -1:]): in the last block everything after attention is
position-wise and only `=` reaches the logits, so the MLP rows of positions a and b cannot change
any metric, and skipping them removes about half of the forward's work. Consequences, all
intended: the logits are bit-identical to model(tokens) (on the reference route); cached activations from
blocks.{L-1}.hook_resid_mid onwards (mlp.hook_pre/post, hook_mlp_out, mlp_norm.*,
hook_resid_post) have a position axis of length 1 (the `=` position); everything before, including
attn_norm.hook_normalized, keeps all three positions.

For one-layer [a, b, =] models (geolens.fast.fast_unsupported_reason(cfg) is None) the same
logits and cache come from token_table_run instead: the residual before attention depends only on
(token, position), so everything up to q, k, v is gathered from a [d_vocab, 3] table run, and
only the attention mixing, W_O, the norms, the `=`-position MLP and the readout run per input.
Same float32 math up to summation order (tests/test_analysis_speed_paths.py checks every cached
tensor and every metric against run_with_cache_narrowed).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F
from torch import Tensor
from transformer_lens import ActivationCache

from geolens.analysis import clockpizza, fourier, keyfreq, progress
from geolens.config import GeoConfig
from geolens.errors import GeoError
from geolens.fast import fast_logits, fast_unsupported_reason
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


def run_with_cache_narrowed(model, cfg: GeoConfig, tokens: Tensor):
    """(logits [N, C], ActivationCache) of one no-grad run_with_cache with last_position_hooks."""
    with torch.no_grad(), model.hooks(fwd_hooks=last_position_hooks(cfg)):
        return model.run_with_cache(tokens)


#: hooks whose value at (input, position) depends only on the token at that position (one layer)
_TOKEN_HOOKS = ("hook_embed", "hook_pos_embed", "embed_norm.", "blocks.0.hook_resid_pre", "blocks.0.attn.hook_q",
                "blocks.0.attn.hook_k", "blocks.0.attn.hook_v")


def token_table_run(model, cfg: GeoConfig, tokens: Tensor):
    """run_with_cache_narrowed for a one-layer model on tokens [N, 3], from per-token tables.

    A run_with_cache over the V = d_vocab rows [v, v, v] gives every _TOKEN_HOOKS activation as a
    table [V, 3, ...]; input n at position i reads row r = 3 tokens[n, i] + i of the flattened
    table. Scores are gathered from the table (q_r . k_s) / sqrt(d_head) [H, 3V, 3V]; z sums the
    pattern-weighted v over the 3 keys (in place); the MLP at `=` is two addmm's on [N, D] and
    [N, d_mlp]; the norms and readout are the model's own modules; every value passes through its
    hook point, narrowed as in last_position_hooks. Returns (logits [N, C], ActivationCache
    with the keys and shapes of run_with_cache_narrowed).
    """
    V, P, H, blk = cfg.d_vocab, cfg.n_ctx, cfg.n_heads, model.blocks[0]
    attn, mlp = blk.attn, blk.mlp
    N = tokens.shape[0]
    rows = (tokens * P + torch.arange(P)).flatten()  # [N * 3] rows of the flattened tables
    store: dict[str, Tensor] = {}

    def save(act: Tensor, hook) -> None:
        store[hook.name] = act

    with torch.no_grad():
        table = torch.arange(V)[:, None].expand(V, P)
        _, tab = model.run_with_cache(table, names_filter=lambda name: name.startswith(_TOKEN_HOOKS))
        gathered: dict[int, Tensor] = {}  # one gather per table tensor (resid_pre is the embed norm's output)
        for name, act in tab.items():
            if id(act) not in gathered:
                gathered[id(act)] = act.flatten(0, 1).index_select(0, rows).unflatten(0, (N, P))
            store[name] = gathered[id(act)]
        q_tab, k_tab = (tab[f"blocks.0.attn.hook_{x}"].flatten(0, 1).transpose(0, 1) for x in "qk")  # [H, 3V, dh]
        v = store["blocks.0.attn.hook_v"]  # [N, 3, H, dh]
        tail = [name for name in model.hook_dict if not name.startswith(_TOKEN_HOOKS)]
        with model.hooks(fwd_hooks=last_position_hooks(cfg) + [(name, save) for name in tail]):
            if cfg.attention == "uniform":
                scores = torch.zeros(N, H, P, P, dtype=v.dtype)
            else:
                R = V * P
                qk = (q_tab @ k_tab.transpose(1, 2) / math.sqrt(cfg.d_head)).flatten()  # [H * R * R]
                heads = torch.arange(H).view(1, H, 1, 1) * (R * R)
                scores = qk[heads + rows.view(N, 1, P, 1) * R + rows.view(N, 1, 1, P)]  # [N, H, 3, 3]
            if cfg.causal:
                scores = scores.masked_fill(torch.ones(P, P, dtype=torch.bool).triu(1), float("-inf"))
            pattern = attn.hook_pattern(attn.hook_attn_scores(scores).softmax(dim=-1))
            w = pattern.permute(0, 2, 3, 1).unsqueeze(-1)  # [N, q, k, H, 1]
            z = w[:, :, 0] * v[:, :1]  # [N, q, H, dh]
            for j in range(1, P):
                z.addcmul_(w[:, :, j], v[:, j : j + 1])
            z = attn.hook_z(z)
            attn_out = blk.hook_attn_out(z.flatten(-2) @ attn.W_O.flatten(0, 1))
            resid = blk.hook_resid_mid(blk.attn_norm(store["blocks.0.hook_resid_pre"] + attn_out))  # [N, 1, D]
            pre = mlp.hook_pre(torch.addmm(mlp.b_in, resid[:, 0], mlp.W_in).unsqueeze(1))
            post = mlp.hook_post(F.relu(pre))
            mlp_out = blk.hook_mlp_out(torch.addmm(mlp.b_out, post[:, 0], mlp.W_out).unsqueeze(1))
            resid = blk.hook_resid_post(blk.mlp_norm(resid + mlp_out))
            logits = model.unembed(resid[:, -1])
    return logits, ActivationCache(store, model)  # keys in forward order, as run_with_cache


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
        if fast_unsupported_reason(self.cfg) is None:
            return token_table_run(self.model, self.cfg, self.dataset.tokens)
        return run_with_cache_narrowed(self.model, self.cfg, self.dataset.tokens)

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

    def grad_forward(self, tokens: Tensor) -> Tensor:
        """Logits [B, C] of tokens [B, 3] for gradients: geolens.fast.fast_logits (exact up to float
        rounding, ~1e-6 relative) when the config supports it, else the narrowed forward."""
        if fast_unsupported_reason(self.cfg) is None:
            return fast_logits(self.model, tokens)
        return self.forward(tokens)

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

    @functools.cached_property
    def key_projections(self) -> list[Tensor]:
        """progress.key_projections of logits_block on each key frequency: [n^2, n] each."""
        return progress.key_projections(self.logits_block, self.frame, self.key_freqs)

    # -- clock / pizza pieces shared by the diagnostics and the verdict --
    @functools.cached_property
    def grad_symmetricity(self) -> float:
        return clockpizza.grad_symmetricity(self.model, self.cfg.n_classes)

    @functools.cached_property
    def distance_irrelevance(self) -> float:
        grid = clockpizza.correct_logit_grid(self.logits, self.labels, self.frame)
        return clockpizza.distance_irrelevance(grid, self.frame)
