"""The local learning coefficient (LLC) of a checkpoint, estimated by SGLD with the devinterp library.

    llc = n_beta * (mean over chains and draws of the training loss at the SGLD samples - the loss at the checkpoint)

devinterp (Timaeus; `devinterp.slt.llc.llc`) samples around the checkpoint with a localisation term pulling
each chain back to it; geolens supplies two adapters to its interface:
- the dataset: a torch Dataset of {'input_ids': row} items (what devinterp reads from its HuggingFace datasets),
  each row an example's tokens with its label appended ([a, b, =, label]) (EveryExample);
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
that climb to chance loss: `geolens llc-calibrate` sweeps lr x n_beta, judges every estimate (judge: the whole
trace, both directions and across chains, by split-R-hat and bulk-ESS; the drift factor where the sharpness is
known) and recommends one setting (recommend).

Every example enters the minibatches: devinterp draws drop-last batches from one shuffled pass of its dataset
(replayed when the chain outlasts it), which would leave N mod batch_size examples out of every step; geolens
hands it the training set repeated batch / gcd(N, batch) times (EveryExample), a whole number of batches in
which every example appears equally often. devinterp writes each estimate's samples to a zarr folder; geolens
gives it one inside a TemporaryDirectory removed when the estimate has been read (devinterp's own default, a
mkdtemp folder, is never removed).
"""

from __future__ import annotations

import contextlib
import io
import math
import tempfile
import warnings
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

import torch
import torch.nn.functional as F
from jaxtyping import Int
from torch import Tensor

from geolens.analysis.convergence import bulk_ess, split_rhat
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

    # the defaults: llc.recommend's rule over the settings of docs/landscape.md's sweep that judge passes at the shipped
    # fb trajectory's epochs 500, 1,500 and 2,710 (analyses/landscape/llc_default_table.py)
    lr: float = 5e-6
    n_beta: float = 464.0
    localization: float = 1e4
    chains: int = 2
    draws: int = 1000
    batch_size: int = 512
    seed: int = 1
    sampler: str = "sgld"
    components: str = "all"
    burnin: int = 200

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
        """The settings as numbers, recorded beside each value (llc_setting_*): the numeric ones the key holds, the
        sampler as its position in SAMPLERS (0 sgld, 1 rmsprop_sgld) and the components estimated as the sum of
        2^i over their positions i in COMPONENTS (embed 1, attn 2, mlp 4, unembed 8: all 15, none 0), so that
        values at different samplers or component sets are never read as one series (precursors.llc_series
        groups by these columns)."""
        out = {k: float(v) for k, v in self._keyed().items() if not isinstance(v, str)}
        out["sampler"] = float(list(SAMPLERS).index(self.sampler))
        out["components"] = float(sum(2 ** COMPONENTS.index(c) for c in self.component_list))
        return out

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


class EveryExample(torch.utils.data.Dataset):
    """The rows [N, k] as devinterp's sampling dataset ({'input_ids': row}), repeated batch / gcd(N, batch) times
    (item i is row i mod N): its length lcm(N, batch) is a whole number of batches, so devinterp's drop-last
    batches of one shuffled pass hold every example equally often (the rows alone would lose N mod batch of them
    at every step: 246 of 3,830 at batch 512)."""

    def __init__(self, rows: Int[Tensor, "N k"], batch: int):
        self.rows, self.copies = rows, batch // math.gcd(len(rows), batch)

    def __len__(self) -> int:
        return len(self.rows) * self.copies

    def __getitem__(self, i: int) -> dict[str, Tensor]:
        return {"input_ids": self.rows[i % len(self.rows)]}


def sample_llc(model: torch.nn.Module, rows: Int[Tensor, "N k"], loss_fn, settings: LLCSettings,
               param_masks: dict[str, Tensor | None] | None = None) -> dict:
    """devinterp's LLC estimate of `model` on the dataset `rows` (each row one input_ids sequence, every one used:
    EveryExample) with loss_fn(model, input_ids) -> [batch, k - 1]: {'llc', 'llc_std', 'init_loss', 'per_chain'
    [chains], 'trace' [chains, draws]}.

    devinterp's llc() is its sample() followed by its compute_llc(), which averages every SGLD step, burn-in
    included (devinterp 2.0.1); with settings.burnin the same compute_llc reads the steps after the burn-in only.
    The samples go to a zarr folder in a TemporaryDirectory, read and removed before this returns. The sampler's
    progress bars are silenced; any warning it raises is passed on to the caller."""
    from devinterp.slt.llc import compute_llc
    from devinterp.slt.sampling import sample

    batch = min(settings.batch_size, len(rows))
    with tempfile.TemporaryDirectory(prefix="geolens-llc-") as folder, warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with contextlib.redirect_stderr(io.StringIO()):  # tqdm's bars; the warnings are caught above, not here
            samples = sample(model=model, dataset=EveryExample(rows, batch), observables={}, lr=settings.lr,
                             n_beta=settings.n_beta, loss_fn=loss_fn, param_masks=param_masks,
                             num_chains=settings.chains, num_draws=settings.draws, num_burnin_steps=settings.burnin,
                             batch_size=batch, localization=settings.localization, init_seed=settings.seed,
                             device="cpu", sampling_method=SAMPLERS[settings.sampler],
                             output_path=Path(folder) / "samples.zarr")
        out = compute_llc(samples.isel(step=slice(settings.burnin, None)) if settings.burnin else samples)
        res = {"llc": float(out.llc_mean), "llc_std": float(out.llc_std), "init_loss": float(out.init_loss),
               "per_chain": out.llc_per_chain.values.tolist(), "trace": out.loss_trace.values.tolist()}
        samples.close()
    for w in caught:
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    return res


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


# ---- judgement and calibration ------------------------------------------------------------------
#: an estimate is stable when its chains' rank-normalised split-R-hat is below this and their bulk-ESS at least
#: STABLE_ESS_PER_CHAIN per chain: the thresholds rstan's documentation gives for Vehtari et al.'s (2021) diagnostics
STABLE_RHAT = 1.05
STABLE_ESS_PER_CHAIN = 100
#: ... and, where the checkpoint's sharpness is known, its drift factor below this: above 1 the step overshoots the
#: minimum along the sharpest direction (on a quadratic the chain's variance there is 2 / (2 - drift) times the
#: target's, at least twice it; above 2 the chain diverges there)
STABLE_DRIFT_FACTOR = 1.0
#: ... and its chains' last quarter below this share of chance loss (ln C)
CHANCE_SHARE = 0.5


@dataclass(frozen=True)
class Verdict:
    """judge's verdict on one estimate: stable or not, why (the first rule it fails, or 'stable'), its chains'
    split-R-hat and bulk-ESS (nan where the trace is not finite), and the drift factor judged (None: not known)."""

    stable: bool
    why: str
    rhat: float
    ess: float
    drift: float | None = None


def judge(res: dict, chance: float, drift: float | None = None) -> Verdict:
    """The verdict on one estimate (sample_llc's dict) from its whole trace [chains, draws], read in every direction:
    finite; positive; its chains' last quarter far from chance loss (below CHANCE_SHARE of ln C); where the drift
    factor is known (llc-calibrate measures the sharpness; `geolens analyze` does not), below STABLE_DRIFT_FACTOR;
    the chains mixed: split-R-hat (convergence.split_rhat: each chain's halves and the chains agree, so a rising,
    a falling or a wandering trace and chains that disagree all fail it) below STABLE_RHAT, and bulk-ESS
    (convergence.bulk_ess) at least STABLE_ESS_PER_CHAIN per chain."""
    trace = torch.tensor(res["trace"], dtype=torch.float64)
    if not (math.isfinite(res["llc"]) and bool(torch.isfinite(trace).all())):
        return Verdict(False, "the chains diverged (non-finite loss: step too large)", math.nan, math.nan, drift)
    rhat, ess = split_rhat(trace.numpy()), bulk_ess(trace.numpy())
    q = max(trace.shape[1] // 4, 1)
    end = float(trace[:, -q:].mean())

    def no(why: str) -> Verdict:
        return Verdict(False, why, rhat, ess, drift)

    if res["llc"] <= 0:
        return no("the estimate is not positive (chains below the checkpoint's loss: step too small or too few draws)")
    if end > CHANCE_SHARE * chance:
        return no(f"the chains climb towards chance loss ({end:.2f} of ln C = {chance:.2f})")
    if drift is not None and not drift < STABLE_DRIFT_FACTOR:
        return no(f"the step overshoots along the sharpest direction (drift factor {drift:.3g} >= {STABLE_DRIFT_FACTOR:g})")
    if not rhat < STABLE_RHAT:
        return no(f"the chains have not mixed (split-R-hat {rhat:.3g} >= {STABLE_RHAT:g}: the trace drifts or the "
                  "chains disagree)")
    if not ess >= STABLE_ESS_PER_CHAIN * trace.shape[0]:
        return no(f"too few effective draws (bulk-ESS {ess:.0f} < {STABLE_ESS_PER_CHAIN} per chain)")
    return Verdict(True, "stable", rhat, ess, drift)


@dataclass
class Calibration:
    """One setting of a sweep: its estimate, the chains' traces, the verdict (judge, with the drift factor) and the
    SGLD step's curvature number along the checkpoint's sharpest direction (drift_factor)."""

    lr: float
    n_beta: float
    llc: float
    llc_std: float
    init_loss: float
    trace: list[list[float]]
    verdict: Verdict
    drift_factor: float

    @property
    def stable(self) -> bool:
        return self.verdict.stable


def drift_factor(lr: float, n_beta: float, localization: float, sharpness: float) -> float:
    """lr (n_beta sharpness + localization) / 2: how far one SGLD step's drift moves along the training loss's
    sharpest direction relative to the distance to the checkpoint (devinterp's step: w -= lr/2 (n_beta grad L +
    localization (w - w0)) + noise). On a quadratic the step multiplies the distance along that direction by
    1 - drift: above 1 it overshoots, above 2 it diverges; the chain's variance there is 2 / (2 - drift) times
    the target's (each direction's share of the LLC inflated alike, less along flatter directions)."""
    return lr * (n_beta * sharpness + localization) / 2


def recorded_drift(values: dict[str, float]) -> float | None:
    """The drift factor of a recorded estimate (a metrics row: llc_setting_lr, _n_beta, _localization beside a
    `sharpness` of the same checkpoint), None where the row has no sharpness. Plain SGLD's step only: None for the
    preconditioned sampler (llc_setting_sampler 1), whose step is rescaled per coordinate."""
    keys = ("llc_setting_lr", "llc_setting_n_beta", "llc_setting_localization", "sharpness")
    if not all(k in values for k in keys) or values.get("llc_setting_sampler", 0.0) != 0.0:
        return None
    return drift_factor(*(values[k] for k in keys))


def usable(values: dict[str, float]) -> bool:
    """Whether a recorded estimate (a metrics row's llc values) may be used: passed by today's judge (llc_stable 1
    with llc_rhat beside it: judged on the whole trace) and, where the row also holds the checkpoint's sharpness, its
    drift factor below STABLE_DRIFT_FACTOR (recorded_drift; `geolens analyze` judges without it). Not an estimate
    recorded before judge read the whole trace (no llc_rhat: its trace was not kept, so it cannot be judged again;
    stable_word 'not judged: trace not kept ...'), nor one never judged (no llc_stable)."""
    drift = recorded_drift(values)
    judged = values.get("llc_stable") == 1.0 and "llc_rhat" in values
    return judged and (drift is None or drift < STABLE_DRIFT_FACTOR)


def stable_word(values: dict[str, float]) -> str:
    """A recorded estimate's judgement in a table: 'yes' or 'no' (judge, with the drift factor where the row holds
    the sharpness: 'no: drift D'), '-' where it was not judged. A verdict recorded before judge read the whole trace
    (no llc_rhat beside it) cannot be judged again, its trace not kept: it fails where a check of today's judge reads
    the record alone (a non-finite or non-positive estimate: 'no: not positive (trace not kept)'; the drift factor
    where the row holds the sharpness: 'no: drift D (trace not kept)'), and is otherwise 'not judged: trace not kept
    (old rule: yes)' (or 'no': the one-direction rule's verdict, which no check of today's can confirm here)."""
    if "llc_stable" not in values:
        return "-"
    drift = recorded_drift(values)
    overshoots = drift is not None and not drift < STABLE_DRIFT_FACTOR
    word = "yes" if values["llc_stable"] == 1.0 else "no"
    if "llc_rhat" in values:
        return f"no: drift {drift:.3g}" if word == "yes" and overshoots else word
    if not values.get("llc", math.nan) > 0:
        return "no: not positive (trace not kept)"
    if overshoots:
        return f"no: drift {drift:.3g} (trace not kept)"
    return f"not judged: trace not kept (old rule: {word})"


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


def calibrate(model, tokens: Int[Tensor, "N n_ctx"], labels: Int[Tensor, "N"], lrs: list[float], n_betas: list[float],
              base: LLCSettings = DEFAULT_LLC) -> tuple[list[Calibration], float]:
    """model_llc at every (lr, n_beta) of the grid (base's other settings), each given its drift_factor at the
    checkpoint's sharpness (landscape.sharpness, computed once) and judged (judge) with it where it is the step's:
    plain SGLD only, since the preconditioned sampler rescales its step per coordinate (as recorded_drift).
    Returns (rows, sharpness)."""
    from geolens.analysis.landscape import sharpness as top_eigenvalue

    chance = math.log(model.cfg.d_vocab_out)
    curvature = top_eigenvalue(model, tokens, labels)["sharpness"]
    out = []
    for lr in lrs:
        for n_beta in n_betas:
            settings = LLCSettings(**{**asdict(base), "lr": lr, "n_beta": n_beta})
            res = model_llc(model, tokens, labels, settings)
            drift = drift_factor(lr, n_beta, base.localization, curvature)
            out.append(Calibration(lr, n_beta, res["llc"], res["llc_std"], res["init_loss"], res["trace"],
                                   judge(res, chance, drift if base.sampler == "sgld" else None), drift))
    return out, curvature


def wbic_n_beta(n: int) -> float:
    """n / ln n: n times Watanabe's WBIC inverse temperature 1/ln n, the n_beta of the LLC estimator of Lau et al.
    (2023) for a training set of n examples."""
    return n / math.log(n)


def recommend(rows: list[Calibration], n: int) -> tuple[Calibration | None, str]:
    """The one setting of a sweep to use, and the rule that chose it: of the stable settings, those whose n_beta is
    nearest (in ratio) to wbic_n_beta(n) (n: training examples), of those the smallest drift factor (the step's
    bias along the sharpest direction is at most drift / (2 - drift) of that direction's share), then the larger
    bulk-ESS. None when no setting is stable, with the failure to address."""
    target = wbic_n_beta(n)
    rule = (f"of the stable settings, the n_beta nearest n / ln n = {target:.4g} (n = {n:,} training examples: "
            "Watanabe's WBIC temperature, the LLC estimator's), then the smallest drift factor, then the largest bulk-ESS")
    stable = [r for r in rows if r.stable]
    if not stable:
        return None, ("no setting is stable, so none is recommended; rerun with more --draws or a --burnin where the "
                      "chains have not mixed, a smaller --lr where they climb towards chance or the step overshoots")
    best = min(stable, key=lambda r: (abs(math.log(r.n_beta / target)), r.drift_factor, -r.verdict.ess))
    return best, rule
