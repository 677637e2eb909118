"""Precursor columns: what every evaluation records into metrics.csv besides the losses, so that
`geolens precursors` can ask which quantity announces the onset (docs/metrics.md defines each).

At the evaluated state (the weights the epoch's training forward used), over the training set:

    wn_embed, wn_attn, wn_mlp, wn_norm, wn_unembed   L2 norm of each parameter group (param_group)
    logit_rms      RMS of the train logits [N, C]
    logit_margin   mean over the train examples of the largest minus the second-largest logit
    attn_var_h{h}  variance of the first layer's attention logits of the `=` query (pre-softmax
                   scores onto a, b and `=`) over every (train example, key) pair, head h; attn_var
                   their mean over heads. NaN with uniform attention (it has no scores).
    attn_var_L{l}  (n_layers > 1) the same mean for layer l >= 1; participation_resid_L{l},
                   participation_mlp_L{l}, wl_gini_L{l}, wl_top5_L{l} the columns below for layer
                   l < n_layers - 1 (W_L of layer l: the direct path of its neurons to the logits)
    participation_resid   participation ratio (sum_i l_i)^2 / sum_i l_i^2 of the eigenvalues l_i of the
                   covariance of the residual stream at `=` after the last block, over the train
                   examples (1 for one direction, k for k equal ones; from the Gram matrix, no
                   eigendecomposition); participation_mlp the same for the last MLP's activations at `=`.
                   Recorded as erank_resid, erank_mlp before (storage.RENAMED_COLUMNS); not the
                   analysis metric effective_rank (exp(entropy) of singular values)
    wl_gini        Gini coefficient of W_L's (neuron_logit_map) energy over the non-DC Fourier bins of the
                   task's cycle (model.spectrum.class_order: discrete-log order for mul), 0 for equal
                   bins, (K-1)/K for one; wl_top5 the share of its 5 strongest bins. NaN for S_n.
    loss_gap       test loss minus train loss

`skipped_columns(cfg)` names the columns a config leaves NaN and why (run.json records it). The
activations come from the engine (geolens.model.engines: Engine.eq_activations, the fast or deep forward
or the hooked forward's hook_resid_post / mlp.hook_post at `=`); a single fast or deep run reuses the epoch's
own training forward (Engine.train_forward). The columns are tested equal between the engines.
"""

from __future__ import annotations

import math

import torch
from jaxtyping import Float, Int
from torch import Tensor

from geolens.model.config import GeoConfig
from geolens.model.engines import choose_engine
from geolens.model.readout import unit_columns
from geolens.model.spectrum import class_order, wl_energy
from geolens.model.transformer import GeoTransformer, param_group

GROUPS = ("embed", "attn", "mlp", "norm", "unembed")
WL_TOP = 5


def group_norms(names: list[str], squared: list[float]) -> dict[str, float]:
    """{'wn_<group>': L2 norm of the group's parameters} from each parameter's squared norm (0 for a
    group the model does not have, e.g. wn_norm of the sphere)."""
    sums = dict.fromkeys(GROUPS, 0.0)
    for name, sq in zip(names, squared):
        sums[param_group(name)] += sq
    return {f"wn_{g}": math.sqrt(s) for g, s in sums.items()}


def column_names(cfg: GeoConfig) -> list[str]:
    """The precursor columns of a config's metrics rows, in metrics.csv order (per-layer columns only for
    n_layers > 1: attn_var_L{l} of the layers after the first, the last layer's quantities for the others)."""
    heads = [f"attn_var_h{h}" for h in range(cfg.n_heads)]
    L = cfg.n_layers
    layers = [f"attn_var_L{l}" for l in range(1, L)]
    layers += [f"{c}_L{l}" for l in range(L - 1)
               for c in ("participation_resid", "participation_mlp", "wl_gini", "wl_top5")]
    return [f"wn_{g}" for g in GROUPS] + ["logit_rms", "logit_margin", "attn_var", *heads, "participation_resid",
                                          "participation_mlp", "wl_gini", "wl_top5", *layers, "loss_gap"]


def skipped_columns(cfg: GeoConfig) -> dict[str, str]:
    """{column: why it is NaN} for this config."""
    out = {}
    if cfg.attention == "uniform":
        out.update({c: "uniform attention has no attention logits" for c in column_names(cfg) if c.startswith("attn_var")})
    order, why = class_order(cfg)
    if order is None:
        out.update({c: why for c in column_names(cfg) if c.startswith(("wl_gini", "wl_top5"))})
    return out


# ---- the quantities, each on plain tensors ---------------------------------------------------
def logit_scale(logits: Float[Tensor, "N C"]) -> Float[Tensor, "2"]:
    """[RMS of the logits, mean over rows of the top-1 minus top-2 logit]."""
    top2 = logits.topk(2, dim=-1).values
    return torch.stack([logits.square().mean().sqrt(), (top2[:, 0] - top2[:, 1]).mean()])


def participation_ratio(X: Float[Tensor, "N d"], block: int = 128) -> Tensor:
    """(sum l)^2 / sum l^2 of the eigenvalues l of the covariance of X's rows (0-d tensor): tr(G)^2 /
    ||G||_F^2 with G = Xc^T Xc (Xc centred; Xc Xc^T when that is smaller), from G's blocks on and
    above the diagonal (G is symmetric: about half a Gram's FLOPs). NaN for constant rows."""
    Xc = X - X.mean(0)
    if Xc.shape[1] > Xc.shape[0]:
        Xc = Xc.T
    trace = Xc.square().sum()
    frob = Xc.new_zeros(())
    for i in range(0, Xc.shape[1], block):
        Gi = Xc[:, i : i + block].T @ Xc[:, i:]  # block row i of G from its diagonal block on
        diag = Gi[:, :block].square().sum()
        frob = frob + diag + 2 * (Gi.square().sum() - diag)
    return trace.square() / frob


def eq_query_scores(model: GeoTransformer, eq_token: int) -> Float[Tensor, "V P H"]:
    """First-layer attention logits of the `=` query (eq_token at the last position) onto every
    token v at every position j: [v, j, h] = q_h . k_h(v, j) / sqrt(d_head), from what the first layer's
    attention reads: embed_norm's output (post-norm) or blocks.0.ln1 of the embedding (pre-norm). It
    depends only on (token, position), so these are all its scores."""
    cfg = model.cfg
    V, P = cfg.d_vocab, cfg.n_ctx
    R = model.residual_after_embed(torch.arange(V, device=model.embed.W_E.device)[:, None].expand(V, P))  # [V, P, D]
    if model.pre_norm:
        R = model.blocks[0].ln1(R)
    attn = model.blocks[0].attn
    q = torch.einsum("d,hde->he", R[eq_token, P - 1], attn.W_Q)
    k = torch.einsum("vpd,hde->vphe", R, attn.W_K)
    return torch.einsum("vphe,he->vph", k, q) / math.sqrt(cfg.d_head)


def attention_logit_variance(scores: Float[Tensor, "V P H"], tokens: Int[Tensor, "N P"]) -> Float[Tensor, "H"]:
    """Per head, the variance (1/n) of scores[tokens[i, j], j] over every example i and key position j."""
    P = tokens.shape[1]
    per_key = torch.stack([scores[tokens[:, j], j] for j in range(P)], 1)  # [N, P, H]
    return per_key.flatten(0, 1).var(0, correction=0)


def gini(x: Float[Tensor, "K"]) -> Tensor:
    """Gini coefficient of non-negative values: sum_i (2i - K - 1) x_(i) / (K sum x), x_(i) ascending."""
    K = x.numel()
    i = torch.arange(1, K + 1, dtype=x.dtype, device=x.device)
    return ((2 * i - K - 1) * x.sort().values).sum() / (K * x.sum())


def wl_concentration(W_L: Float[Tensor, "d_mlp n"]) -> Float[Tensor, "2"]:
    """[Gini of the non-DC bin energies, share of the WL_TOP strongest] of W_L (classes in group order)."""
    energy = wl_energy(W_L)[1:]
    return torch.stack([gini(energy), energy.topk(min(WL_TOP, energy.numel())).values.sum() / energy.sum()])


def neuron_logit_map(model: GeoTransformer, layer: int = -1) -> Float[Tensor, "d_mlp C"]:
    """W_L = W_out @ W_U of block `layer` (default the last; unit-norm W_U columns for the bounded readout): the
    direct path of its neurons to the logits, model.W_L without its division by the config's tau, so a tau
    schedule does not change its rounding."""
    W_U = model.unembed.W_U.detach()
    return model.blocks[layer].mlp.W_out.detach() @ (unit_columns(W_U) if model.unembed.bounded else W_U)


# ---- a model's columns at one state ------------------------------------------------------------
def eq_activations(model: GeoTransformer, tokens: Int[Tensor, "N P"]) -> dict[str, Tensor]:
    """The activations at `=` the columns read (geolens.model.engines.activation_names: every layer's residual
    stream and MLP activations, later layers' attention scores), no grad: by the fastest engine that
    computes the model (geolens.model.engines, 'auto')."""
    return choose_engine(model.cfg, "auto")[0].eq_activations(model, tokens)


class PrecursorProbe:
    """One member's precursor columns (module docstring), built once per model and training set."""

    def __init__(self, model: GeoTransformer, train_x: Int[Tensor, "N P"]):
        cfg = model.cfg
        self.cfg, self.train_x = cfg, train_x
        self.names = [n for n, _ in model.named_parameters()]
        self.columns = column_names(cfg)
        order, _ = class_order(cfg)
        self.order = None if order is None else order.to(train_x.device)
        self.eq_token = int(train_x[0, -1])

    @torch.no_grad()
    def values(self, model: GeoTransformer, logits: Float[Tensor, "N C"], acts: dict[str, Tensor]) -> Tensor:
        """[logit_rms, logit_margin, attn_var, attn_var_h*, participation_resid, participation_mlp, wl_gini,
        wl_top5, then the per-layer columns] at this state: logits the train logits, acts eq_activations of the
        train set (NaN where skipped)."""
        nan = logits.new_full((), float("nan"))
        H, L = self.cfg.n_heads, self.cfg.n_layers
        uniform = self.cfg.attention == "uniform"
        if uniform:
            attn = nan.expand(H + 1)
        else:
            var = attention_logit_variance(eq_query_scores(model, self.eq_token), self.train_x)
            attn = torch.cat([var.mean()[None], var])

        def layer(l: int) -> list[Tensor]:  # [participation_resid, participation_mlp, wl_gini, wl_top5] of layer l
            wl = nan.expand(2) if self.order is None else wl_concentration(neuron_logit_map(model, l)[:, self.order])
            ranks = [participation_ratio(acts[f"blocks.{l}.{n}"]) for n in ("hook_resid_post", "mlp.hook_post")]
            return [torch.stack(ranks), wl]

        later_attn = [nan if uniform else acts[f"blocks.{l}.attn.hook_attn_scores"].transpose(1, 2).flatten(0, 1)
                      .var(0, correction=0).mean() for l in range(1, L)]
        per_layer = ([torch.stack(later_attn)] if later_attn else []) + [t for l in range(L - 1) for t in layer(l)]
        return torch.cat([logit_scale(logits.detach()), attn, *layer(L - 1), *per_layer])

    def row(self, values: list[float], squared: list[float], train_loss: float, test_loss: float) -> dict[str, float]:
        """The columns of one metrics row: values (self.values, as floats), squared (each parameter's
        squared norm, recording.squared_norms order) and the losses."""
        named = dict(zip(self.columns[len(GROUPS) :], values))
        return {**group_norms(self.names, squared), **named, "loss_gap": test_loss - train_loss}
