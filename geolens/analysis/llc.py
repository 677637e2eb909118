"""The local learning coefficient (LLC) of a checkpoint, estimated by SGLD with the devinterp library.

    llc = n_beta * (mean over chains and draws of the training loss at the SGLD samples - the loss at the checkpoint)

devinterp (Timaeus; `devinterp.slt.llc.llc`) samples around the checkpoint with a localisation term pulling
each chain back to it; geolens supplies two adapters to its interface:
- the dataset: a HuggingFace `datasets.Dataset` with an `input_ids` column; each row is an example's tokens
  with its label appended ([a, b, =, label]);
- the loss: devinterp asks for a per-token loss of shape (batch, seq - 1); geolens's loss is the cross-entropy
  at `=` alone, so every column of an example's row holds that example's loss (their mean is the mean loss),
  its logits from the fastest exact engine (the fast engine for one-layer post-norm models: SGLD needs only
  first derivatives).
GeoTransformer accepts HookedTransformer's `to(device, print_details=...)`, which devinterp calls on models
with a TransformerLens-style cfg.

Per component: the same estimate with SGLD restricted to one parameter group (devinterp's param_masks:
embed = W_E, W_pos; attn = W_Q, W_K, W_V, W_O; mlp = W_in, b_in, W_out, b_out; unembed = W_U), the other
parameters held at the checkpoint. The sampler's seeds (`seed`, and devinterp's derived chain and batch
seeds) make an estimate bit-reproducible on one machine. Settings (LLCSettings) are recorded with every
value and are part of the analysis cache's key (the metric's version). Uncalibrated settings give chains
that climb to chance loss: `geolens llc-calibrate` sweeps lr x n_beta and says which settings are stable.
"""

from __future__ import annotations

import contextlib
import io
import math
import warnings
from dataclasses import asdict, dataclass, fields, replace

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

from geolens.errors import GeoError
from geolens.model.engines import choose_engine
from geolens.model.transformer import param_group

COMPONENTS = ("embed", "attn", "mlp", "unembed")
SAMPLERS = {"sgld": "sgmcmc_sgld", "rmsprop_sgld": "rmsprop_sgld"}  # LLCSettings.sampler -> devinterp's sampling_method


@dataclass(frozen=True)
class LLCSettings:
    """SGLD settings: step size lr, inverse temperature n_beta (n times beta), localisation strength, chains,
    draws per chain, minibatch size, seed; sampler: devinterp's plain SGLD ('sgld') or its RMSprop-preconditioned
    SGLD ('rmsprop_sgld', devinterp's default alpha and eps); components: which weight-restricted estimates the llc
    metric adds to the whole model's ('all' of COMPONENTS, 'none', or a '+'-joined subset such as 'mlp+attn');
    burnin: SGLD steps per chain before the draws (devinterp's num_burnin_steps), left out of the estimate and the
    trace, so a chain that settles late need not run long enough to average its climb away."""

    lr: float = 1e-5  # the stable setting of docs/landscape.md's sweep at the shipped fb checkpoint
    n_beta: float = 100.0
    localization: float = 1e4
    chains: int = 2
    draws: int = 100
    batch_size: int = 512
    seed: int = 1
    sampler: str = "sgld"
    components: str = "all"
    burnin: int = 0

    def __post_init__(self):
        if self.sampler not in SAMPLERS:
            raise GeoError(f"LLC sampler '{self.sampler}' is not known; choose one of {', '.join(SAMPLERS)}")
        unknown = [c for c in self.components.split("+") if c not in COMPONENTS]
        if self.components not in ("all", "none") and unknown:
            raise GeoError(f"LLC components '{self.components}' names no component '{unknown[0]}'; use all, none or "
                           f"a '+'-joined subset of {', '.join(COMPONENTS)}, e.g. components=mlp+attn")

    @property
    def component_list(self) -> tuple[str, ...]:
        """The components to estimate besides the whole model, in COMPONENTS' order."""
        if self.components in ("all", "none"):
            return COMPONENTS if self.components == "all" else ()
        return tuple(c for c in COMPONENTS if c in self.components.split("+"))

    @classmethod
    def parse(cls, text: str, base: "LLCSettings | None" = None) -> "LLCSettings":
        """Settings from 'lr=1e-7,n_beta=1000,draws=20000' (fields of LLCSettings; the others base's, default
        DEFAULT_LLC's). A GeoError names an unknown field or a bad value (numbers other than the seed and the
        burn-in are > 0, the burn-in >= 0; chains, draws, batch_size, burnin and seed whole)."""
        kinds = {f.name: f.type for f in fields(cls)}
        changes: dict[str, object] = {}
        for item in filter(None, (part.strip() for part in text.split(","))):
            name, _, value = (part.strip() for part in item.partition("="))
            if name not in kinds:
                raise GeoError(f"LLC setting '{name}' is not known; use NAME=VALUE with NAME one of {', '.join(kinds)}")
            changes[name] = value if kinds[name] == "str" else _setting_number(name, value, kinds[name] == "int")
        return replace(base or cls(), **changes)

    def key(self) -> str:
        """The settings as one string: part of the llc metric's cache key (the sampler only when not 'sgld', the
        components only when not 'all', the burn-in only when not 0, so keys written before they were settings stay
        valid)."""
        return ";".join(f"{k}={v}" for k, v in self._keyed().items())

    def numbers(self) -> dict[str, float]:
        """The numeric settings the key holds, as recorded beside each value (llc_setting_*)."""
        return {k: float(v) for k, v in self._keyed().items() if not isinstance(v, str)}

    def _keyed(self) -> dict[str, object]:
        omitted_at = {"sampler": "sgld", "components": "all", "burnin": 0}
        return {k: v for k, v in asdict(self).items() if omitted_at.get(k, object()) != v}


DEFAULT_LLC = LLCSettings()


def _setting_number(name: str, text: str, whole: bool) -> float | int:
    """The number an LLC setting's text gives (LLCSettings.parse), or a GeoError saying what it must be."""
    try:
        number = float(text)
    except ValueError:
        number = math.nan
    floor = {"seed": -math.inf, "burnin": 0}.get(name)
    bad = number < floor if floor is not None else number <= 0
    if not math.isfinite(number) or (whole and not number.is_integer()) or bad:
        kind = "a whole number" if whole else "a number"
        bound = {"seed": "", "burnin": " of at least 0"}.get(name, " above 0")
        raise GeoError(f"LLC setting {name}={text!r} must be {kind}{bound}; e.g. --llc lr=1e-7,n_beta=1000,draws=20000")
    return int(number) if whole else number


def sample_llc(model: torch.nn.Module, rows: Int[Tensor, "N k"], loss_fn, settings: LLCSettings,
               param_masks: dict[str, Tensor | None] | None = None) -> dict:
    """devinterp's LLC estimate of `model` on the dataset `rows` (each row one input_ids sequence) with
    loss_fn(model, input_ids) -> [batch, k - 1]: {'llc', 'llc_std', 'init_loss', 'per_chain' [chains],
    'trace' [chains, draws]} (the sampler's progress bars silenced).

    devinterp's llc() is its sample() followed by its compute_llc(), which averages every SGLD step, burn-in
    included (devinterp 2.0.1); with settings.burnin the same compute_llc reads the steps after the burn-in only."""
    from datasets import Dataset
    from devinterp.slt.llc import compute_llc
    from devinterp.slt.sampling import sample

    data = Dataset.from_dict({"input_ids": rows.tolist()}).with_format("torch")
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        samples = sample(model=model, dataset=data, observables={}, lr=settings.lr, n_beta=settings.n_beta,
                         loss_fn=loss_fn, param_masks=param_masks, num_chains=settings.chains,
                         num_draws=settings.draws, num_burnin_steps=settings.burnin,
                         batch_size=min(settings.batch_size, len(rows)), localization=settings.localization,
                         init_seed=settings.seed, device="cpu", sampling_method=SAMPLERS[settings.sampler])
    out = compute_llc(samples.isel(step=slice(settings.burnin, None)) if settings.burnin else samples)
    return {"llc": float(out.llc_mean), "llc_std": float(out.llc_std), "init_loss": float(out.init_loss),
            "per_chain": out.llc_per_chain.values.tolist(), "trace": out.loss_trace.values.tolist()}


def loss_at_eq(model):
    """devinterp's loss_fn for `model`: the cross-entropy at `=` of rows [a, b, =, label], repeated over the
    (seq - 1) columns devinterp expects; the logits come from the fastest engine that computes the model exactly
    (geolens.model.engines, 'auto'; chosen once, not at every SGLD step)."""
    engine, _ = choose_engine(model.cfg, "auto")

    def loss_fn(m, input_ids: Tensor) -> Tensor:
        loss = F.cross_entropy(engine.logits(m, input_ids[:, :-1]), input_ids[:, -1], reduction="none")
        return loss[:, None].expand(-1, input_ids.shape[1] - 1)

    return loss_fn


def component_masks(model, component: str | None) -> dict[str, Tensor | None] | None:
    """devinterp param_masks sampling only `component`'s parameters (None: every parameter)."""
    if component is None:
        return None
    return {name: None for name, _ in model.named_parameters() if param_group(name) == component}


def model_llc(model, tokens: Int[Tensor, "N n_ctx"], labels: Int[Tensor, "N"], settings: LLCSettings = DEFAULT_LLC,
              component: str | None = None) -> dict:
    """sample_llc of a GeoTransformer on (tokens, labels), the whole model or one component (COMPONENTS)."""
    rows = torch.cat([tokens, labels[:, None]], 1)
    was = torch.get_num_threads()
    try:
        return sample_llc(model, rows, loss_at_eq(model), settings, component_masks(model, component))
    finally:
        torch.set_num_threads(was)


# ---- calibration ---------------------------------------------------------------------------------
STABLE_DRIFT = 0.1  # the last quarter of the trace may rise by at most this share of its rise above the start
STABLE_SPREAD = 0.2  # chains agree: std over chains / mean LLC below this


@dataclass
class Calibration:
    """One setting of a sweep: its estimate, the chains' traces, whether they are stable (and why not), and the
    SGLD step's curvature number along the checkpoint's sharpest direction (drift_factor)."""

    lr: float
    n_beta: float
    llc: float
    llc_std: float
    init_loss: float
    trace: list[list[float]]
    stable: bool
    why: str
    drift_factor: float


def drift_factor(lr: float, n_beta: float, localization: float, sharpness: float) -> float:
    """lr (n_beta sharpness + localization) / 2: how far one SGLD step's drift moves along the training loss's
    sharpest direction relative to the distance to the checkpoint (devinterp's step: w -= lr/2 (n_beta grad L +
    localization (w - w0)) + noise). On a quadratic the drift diverges where this exceeds 2; the chains only wander
    in a basin well below it."""
    return lr * (n_beta * sharpness + localization) / 2


def usable(values: dict[str, float]) -> bool:
    """Whether a recorded estimate (a metrics row's llc values) may be used: judged stable (llc_stable 1), or not
    judged (cached before llc_stable was recorded)."""
    return values.get("llc_stable", 1.0) == 1.0


#: training accuracy of a checkpoint that fits its training set
FITTED = 0.99


def loss_spikes(rows: list[dict[str, float]]) -> set[int]:
    """Epochs of a training record's rows (each with `epoch` and `train_acc`) inside a loss spike:
    training accuracy below FITTED after an earlier row reached it. The weights there sit at no minimum of the
    training loss, so an LLC estimated there measures none; rows before the first fit are no spike."""
    spikes, fitted = set(), False
    for r in sorted(rows, key=lambda r: r["epoch"]):
        a = r.get("train_acc")
        if a is None:
            continue
        if a < FITTED and fitted:
            spikes.add(int(r["epoch"]))
        fitted = fitted or a >= FITTED
    return spikes


def stable_word(values: dict[str, float]) -> str:
    """A recorded estimate's judgement in a table: 'yes', 'no', or '-' where it was not judged."""
    return "-" if "llc_stable" not in values else ("yes" if values["llc_stable"] == 1.0 else "no")


def judge(res: dict, chance: float) -> tuple[bool, str]:
    """(stable, reason) of one estimate: finite; positive; the mean trace plateaus (its last quarter rises by less than
    STABLE_DRIFT of its rise over the start); far from chance loss (half of ln C); chains agree (STABLE_SPREAD)."""
    trace = torch.tensor(res["trace"]).mean(0)
    if not (math.isfinite(res["llc"]) and bool(torch.isfinite(trace).all())):
        return False, "the chains diverged (non-finite loss: step too large)"
    q = max(len(trace) // 4, 1)
    rise = float(trace[-q:].mean() - trace[q : 2 * q].mean())
    above = float(trace[q : 2 * q].mean()) - res["init_loss"]
    if res["llc"] <= 0:
        return False, "the estimate is not positive (chains below the checkpoint's loss: step too small or too few draws)"
    if float(trace[-q:].mean()) > 0.5 * chance:
        return False, f"the chains climb towards chance loss ({float(trace[-q:].mean()):.2f} of ln C = {chance:.2f})"
    if above > 0 and rise > STABLE_DRIFT * above:
        return False, f"the trace still rises in its last quarter (+{rise:.3g})"
    if res["llc_std"] > STABLE_SPREAD * res["llc"]:
        return False, f"the chains disagree (std {res['llc_std']:.3g} of {res['llc']:.3g})"
    return True, "stable"


def calibrate(model, tokens: Int[Tensor, "N n_ctx"], labels: Int[Tensor, "N"], lrs: list[float], n_betas: list[float],
              base: LLCSettings = DEFAULT_LLC) -> tuple[list[Calibration], float]:
    """model_llc at every (lr, n_beta) of the grid (base's other settings), each judged (judge) and given its
    drift_factor at the checkpoint's sharpness (landscape.sharpness, computed once). Returns (rows, sharpness)."""
    from geolens.analysis.landscape import sharpness as top_eigenvalue

    chance = math.log(model.cfg.d_vocab_out)
    curvature = top_eigenvalue(model, tokens, labels)["sharpness"]
    out = []
    for lr in lrs:
        for n_beta in n_betas:
            settings = LLCSettings(**{**asdict(base), "lr": lr, "n_beta": n_beta})
            res = model_llc(model, tokens, labels, settings)
            stable, why = judge(res, chance)
            out.append(Calibration(lr, n_beta, res["llc"], res["llc_std"], res["init_loss"], res["trace"], stable, why,
                                   drift_factor(lr, n_beta, base.localization, curvature)))
    return out, curvature
