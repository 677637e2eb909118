"""GeoConfig: one flat, JSON-serialisable description of a run (task, model topology, training).

Presets (`ln`, `rms`, `none`, `sphere`, `fb`, `sphere_raw`, modifiers `+uniform`, `+fourier`, `+notebook`) are
named bundles of field values; every field can be overridden afterwards.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import re
from dataclasses import dataclass
from typing import Any

from geolens.errors import GeoError
from geolens.model.roles import (ALWAYS, BOOKKEEPING, CHOICE, COMPARED, DISTINCT, IGNORED, NEVER, UNLESS_DEFAULT, VALUE,
                                 Roles, declare, default_of, roles_of, select)
from geolens.model.schedule import DEFAULT_KEEP

NORMS = ("none", "layernorm", "rmsnorm", "sphere")
PLACEMENTS = ("post", "pre")
UNEMBEDS = ("raw", "bounded")
ATTENTIONS = ("learned", "uniform")
INITS = ("paper", "notebook", "tl")
OPTIMIZERS = ("adamw", "sgd", "muon")
TASKS = ("add", "sub", "mul", "perm", "add3")
ENGINES = ("auto", "hooked", "fast", "deep")

PAPER_FOURIER_FREQS = (14, 35, 41, 42, 52)

# why a fork cannot change a field (Roles.fork_refused)
_SHAPES = "it changes parameter shapes"
_DATA = "the fork trains on the parent's split and data"
_INIT = "the fork starts from the parent's weights, not from an initialisation"


@dataclass
class GeoConfig:
    """Everything that defines a run. Derived fields (d_vocab, d_vocab_out, n_ctx) follow the task."""

    # Each field declares its roles (geolens.model.roles: what engines, forks, stacked sweeps, resumes, the
    # identity hash and the tables do with it); a field without them is refused when this module is imported.
    # task
    task: str = declare("add", "the task: a + b, a - b, a * b mod p, S_n composition, or a + b + c mod p "
                        "([a, b, c, =])",
                        choices=TASKS, reads={"fast": IGNORED, "deep": CHOICE}, forward=True, fork_refused=_SHAPES,
                        member=False, surface=True, hashed=ALWAYS, tables=DISTINCT, shown=True, sweep_axis="--task")
    p: int = declare(113, "the modulus of the Z_p tasks (a prime)", reads={"fast": IGNORED, "deep": VALUE},
                     forward=True, fork_refused=_SHAPES, member=False, surface=True, hashed=ALWAYS, tables=DISTINCT,
                     shown=True, sweep_axis="--p")
    n_perm: int = declare(5, "n of S_n for task perm (2..6)", reads={"fast": IGNORED, "deep": VALUE}, forward=True,
                          fork_refused=_SHAPES, member=False, surface=True, hashed=ALWAYS, tables=DISTINCT, shown=True)
    frac_train: float = declare(0.3, "the training fraction of all inputs", reads=IGNORED, forward=False,
                                fork_refused=_DATA, member=False, surface=True, hashed=ALWAYS, tables=DISTINCT,
                                grid_key="frac")
    data_seed: int = declare(0, "the seed of the train/test split", reads=IGNORED, forward=False, fork_refused=_DATA,
                             member=True, surface=True, hashed=ALWAYS, tables=BOOKKEEPING, sweep_axis="--data-seed")
    # model (the paper's defaults)
    n_layers: int = declare(1, "transformer blocks", reads={"fast": CHOICE, "deep": VALUE}, forward=True,
                            fork_refused=_SHAPES, member=False, surface=True, hashed=ALWAYS, tables=DISTINCT)
    d_model: int = declare(128, "residual stream width", reads=VALUE, forward=True, fork_refused=_SHAPES,
                           member=False, surface=True, hashed=ALWAYS, tables=DISTINCT)
    n_heads: int = declare(4, "attention heads per block", reads=VALUE, forward=True, fork_refused=_SHAPES,
                           member=False, surface=True, hashed=ALWAYS, tables=DISTINCT)
    d_head: int = declare(32, "width of one attention head", reads=VALUE, forward=True, fork_refused=_SHAPES,
                          member=False, surface=True, hashed=ALWAYS, tables=DISTINCT)
    d_mlp: int = declare(512, "MLP hidden width", reads=VALUE, forward=True, fork_refused=_SHAPES, member=False,
                         surface=True, hashed=ALWAYS, tables=DISTINCT)
    norm: str = declare("layernorm", "the norm of every layer, or one per layer comma-separated (a hybrid: "
                        "layernorm,sphere)", choices=NORMS, reads=CHOICE, forward=True, member=False, surface=True,
                        hashed=ALWAYS, tables=COMPARED, shown=True)
    norm_placement: str = declare("post", "post: the norm replaces the stream (the paper's); pre: HookedTransformer's "
                                  "ln1 / ln2 / ln_final", choices=PLACEMENTS, reads=CHOICE, forward=True, member=False,
                                  surface=True, hashed=UNLESS_DEFAULT, tables=DISTINCT)
    unembed: str = declare("raw", "the readout: raw W_U, or bounded (tau * W_U / ||W_U column||)", choices=UNEMBEDS,
                           reads=CHOICE, forward=True, member=False, surface=True, hashed=ALWAYS, tables=COMPARED,
                           shown=True)
    tau: float = declare(10.0, "the bounded readout's temperature", reads=VALUE, forward=True, member=False,
                         surface=True, hashed=ALWAYS, tables=DISTINCT)
    attention: str = declare("learned", "learned attention, or uniform (every key weighted equally)",
                             choices=ATTENTIONS, reads=CHOICE, forward=True, member=False, surface=True, hashed=ALWAYS,
                             tables=DISTINCT, shown=True)
    causal: bool = declare(False, "mask attention to earlier positions", reads=VALUE, forward=True, member=False,
                           surface=True, hashed=ALWAYS, tables=DISTINCT)
    fourier_init: list[int] = declare([], "initialise the embedding on these Fourier frequencies (Z_p tasks)",
                                      reads=IGNORED, forward=False, fork_refused=_INIT, member=False, surface=False,
                                      hashed=ALWAYS, tables=COMPARED, shown=True)
    init: str = declare("paper", "the initialisation scheme", choices=INITS, reads=IGNORED, forward=False,
                        fork_refused=_INIT, member=False, surface=False, hashed=ALWAYS, tables=COMPARED, shown=True)
    ln_eps: float = declare(1e-5, "LayerNorm's epsilon", reads=VALUE, forward=True, member=False, surface=True,
                            hashed=ALWAYS, tables=DISTINCT)
    rms_eps: float = declare(1e-8, "RMSNorm's epsilon", reads=VALUE, forward=True, member=False, surface=True,
                             hashed=ALWAYS, tables=DISTINCT)
    sphere_eps: float = declare(1e-12, "the sphere norm's floor on ||x||", reads=VALUE, forward=True, member=False,
                                surface=True, hashed=ALWAYS, tables=DISTINCT)
    # training
    seed: int = declare(0, "the initialisation seed", reads=IGNORED, forward=False, fork_refused=_INIT, member=True,
                        surface=False, hashed=ALWAYS, tables=BOOKKEEPING, sweep_axis="--seeds")
    lr: float = declare(6e-4, "AdamW's (and SGD's) learning rate; Muon's groups take muon_lr", reads=IGNORED,
                        forward=False, member=True, surface=False, hashed=ALWAYS, tables=DISTINCT, shown=True,
                        sweep_axis="--lr")
    beta1: float = declare(0.9, "AdamW's beta1", reads=IGNORED, forward=False, member=True, surface=False,
                           hashed=ALWAYS, tables=DISTINCT)
    beta2: float = declare(0.999, "AdamW's beta2", reads=IGNORED, forward=False, member=True, surface=False,
                           hashed=ALWAYS, tables=DISTINCT)
    weight_decay: float = declare(1.0, "weight decay (on all parameters)", reads=IGNORED, forward=False, member=True,
                                  surface=False, hashed=ALWAYS, tables=COMPARED, shown=True, sweep_axis="--wd")
    optimizer: str = declare("adamw", "the optimizer (geolens.training.optimizers)", choices=OPTIMIZERS,
                             reads=IGNORED, forward=False, member=False, surface=False, hashed=UNLESS_DEFAULT,
                             tables=DISTINCT)
    momentum: float = declare(0.9, "SGD's momentum", reads=IGNORED, forward=False, member=False, surface=False,
                              hashed=UNLESS_DEFAULT, tables=DISTINCT)
    muon_lr: float = declare(0.02, "Muon's learning rate (its groups; AdamW's is lr)", reads=IGNORED, forward=False,
                             member=False, surface=False, hashed=UNLESS_DEFAULT, tables=DISTINCT)
    muon_momentum: float = declare(0.95, "Muon's momentum", reads=IGNORED, forward=False, member=False,
                                   surface=False, hashed=UNLESS_DEFAULT, tables=DISTINCT)
    epochs: int = declare(5000, "full-batch epochs", reads=IGNORED, forward=False, member=False, surface=False,
                          hashed=ALWAYS, tables=BOOKKEEPING, resume=True, sweep_axis="--epochs")
    eval_every: int = declare(10, "evaluate every N epochs", reads=IGNORED, forward=False,
                              fork_refused="the fork keeps the parent's evaluation record", member=False,
                              surface=False, hashed=ALWAYS, tables=BOOKKEEPING, grid_key="eval_every")
    checkpoints: str = declare("adaptive", "the checkpoint schedule: every:N, log:K, adaptive[:MAXGAP] or ends",
                               reads=IGNORED, forward=False, member=False, surface=False, hashed=ALWAYS,
                               tables=BOOKKEEPING, grid_key="checkpoints")
    keep: str = declare(DEFAULT_KEEP, "storage policy: optimizer state every N epochs (sparse:N) or at every "
                        "checkpoint (all)",
                        reads=IGNORED, forward=False, member=False, surface=False, hashed=NEVER, tables=BOOKKEEPING)
    early_stop_after: int | None = declare(None, "stop N epochs after test accuracy stays >= 0.99 (None: never)",
                                           reads=IGNORED, forward=False, member=True, surface=False, hashed=ALWAYS,
                                           tables=BOOKKEEPING, resume=True, grid_key="early_stop")
    schedule: list[str] = declare([], "lr / weight_decay / tau for windows of epochs (geolens.model.hyperschedule), "
                                  "';'-separated", reads=IGNORED, forward=False, member=True, surface=False,
                                  hashed=ALWAYS, tables=DISTINCT)
    norm_clamp: float | None = declare(None, "hold the total parameter L2 norm at this value after every step "
                                       "(None: no clamp)", reads=IGNORED, forward=True, member=True, surface=False,
                                       hashed=ALWAYS, tables=DISTINCT)
    engine: str = declare("auto", "the training forward (geolens.model.engines): auto takes the fastest that "
                          "computes the model", choices=ENGINES, reads=IGNORED, forward=False, member=False,
                          surface=False, hashed=ALWAYS, tables=BOOKKEEPING)
    device: str = declare("cpu", "where training runs: cpu, cuda or cuda:N (analysis always runs on the CPU)",
                          reads=IGNORED, forward=False, member=False, surface=False, hashed=ALWAYS,
                          tables=BOOKKEEPING, resume=True)
    flush_denormal: bool = declare(False, "read and write CPU float32 subnormals as 0 while training "
                                   "(engine.denormals_flushed)", reads=IGNORED, forward=False, member=False,
                                   surface=False, hashed=UNLESS_DEFAULT, tables=BOOKKEEPING)
    preset: str = declare("", "the preset string this config was built from (informational)", reads=IGNORED,
                          forward=False, member=True, surface=False, hashed=ALWAYS, tables=BOOKKEEPING,
                          sweep_axis="--preset")

    def __post_init__(self) -> None:
        self.validate()

    # ---- derived ----------------------------------------------------------------------------
    @property
    def n_classes(self) -> int:
        """Number of output classes (d_vocab_out)."""
        if self.task == "perm":
            return _factorial(self.n_perm)
        return self.p

    @property
    def d_vocab(self) -> int:
        """Input vocabulary: the classes plus the `=` token (id n_classes)."""
        return self.n_classes + 1

    @property
    def d_vocab_out(self) -> int:
        return self.n_classes

    @property
    def task_label(self) -> str:
        """The task in words: 'add p=113', 'perm S5'."""
        return f"perm S{self.n_perm}" if self.task == "perm" else f"{self.task} p={self.p}"

    @property
    def n_operands(self) -> int:
        """Operands per example: 3 for add3 ([a, b, c, =]), else 2 ([a, b, =])."""
        return 3 if self.task == "add3" else 2

    @property
    def n_ctx(self) -> int:
        """Tokens per example: the operands, then `=`."""
        return self.n_operands + 1

    @property
    def n_inputs(self) -> int:
        """Number of distinct examples: n_classes ** n_operands."""
        return self.n_classes**self.n_operands

    @property
    def layer_norms(self) -> tuple[str, ...]:
        """The norm of each layer, [n_layers]: cfg.norm repeated, or its comma-separated values (a hybrid).
        Post-norm, the embedding's norm is layer 0's; pre-norm, ln_final is the last layer's."""
        norms = tuple(n.strip() for n in self.norm.split(","))
        return norms * self.n_layers if len(norms) == 1 else norms

    @property
    def hybrid(self) -> bool:
        """Whether the layers' norms differ."""
        return len(set(self.layer_norms)) > 1

    @property
    def normalization_type(self) -> str | None:
        """The kind of norm, in TransformerLens's words: 'LN' (layernorm), 'RMS' (rmsnorm, and the sphere,
        whose hook_scale is ||x||: dividing by it is the projection), None (none, and hybrids, whose layers
        differ: cfg.layer_norms lists them), or what fold_layer_norm set ('LNPre', 'RMSPre'). For both
        placements: where the norms sit is cfg.norm_placement ('post': the norm's output replaces the
        stream, so TransformerLens's pre-norm rescaling does not apply and geolens.model.cache gives the
        exact decompositions; 'pre': HookedTransformer's)."""
        if "_normalization_type" in self.__dict__:
            return self.__dict__["_normalization_type"]
        if self.hybrid or self.layer_norms[0] == "none":
            return None
        return "LN" if self.layer_norms[0] == "layernorm" else "RMS"

    @normalization_type.setter
    def normalization_type(self, value: str | None) -> None:
        """Set on a model's own copy by GeoTransformer.fold_layer_norm (as TransformerLens sets 'LNPre');
        not a field: the config's identity (sha256, to_dict) does not change."""
        self.__dict__["_normalization_type"] = value

    @property
    def model_name(self) -> str:
        """A name for TransformerLens code that prints or keys on cfg.model_name: 'geolens-fb', 'geolens-ln-pre'."""
        name = self.preset.split("+")[0] if self.preset else self.norm.replace(",", "-")
        return f"geolens-{name}" + ("-pre" if self.norm_placement == "pre" else "")

    @property
    def attention_dir(self) -> str:
        """TransformerLens's 'causal' or 'bidirectional' (cfg.causal)."""
        return "causal" if self.causal else "bidirectional"

    @property
    def eps(self) -> float:
        """The epsilon TransformerLens reads for its norms: ln_eps (layernorm), rms_eps (rmsnorm), sphere_eps."""
        return {"layernorm": self.ln_eps, "rmsnorm": self.rms_eps, "sphere": self.sphere_eps}.get(self.layer_norms[-1], self.ln_eps)

    # HookedTransformerConfig attributes TransformerLens 4.3's ActivationCache, FactoredMatrix, patching and
    # tools.analysis read (class attributes, not fields: the config's identity does not change). `device`
    # above is the training device. use_attn_result is set per model by GeoTransformer.set_use_attn_result.
    attn_only = False
    act_fn = "relu"
    positional_embedding_type = "standard"
    default_prepend_bos = False
    tokenizer_prepends_bos = False
    n_key_value_heads = None
    per_layer_num_key_value_heads = None
    n_devices = 1
    use_attn_result = False
    use_split_qkv_input = False
    use_attn_in = False
    use_hook_mlp_in = False
    parallel_attn_mlp = False
    layers_block_type = None
    original_architecture = "GeoTransformer"
    rmsnorm_uses_offset = False
    total_ut_steps = None
    init_weights = True
    final_rms = False  # a final RMSNorm under LayerNorm blocks: a hybrid, whose normalization_type is None

    # ---- checks -----------------------------------------------------------------------------
    def validate(self) -> None:
        self._check_types()
        norms = [n.strip() for n in self.norm.split(",")]
        for f in dataclasses.fields(self):  # the declared choices (norm: each per-layer value)
            choices = f.metadata["roles"].choices
            for value in (norms if f.name == "norm" else [getattr(self, f.name)]) if choices else ():
                _choice(f.name, value, choices)
        if len(norms) > 1 and len(norms) != self.n_layers:
            raise GeoError(f"norm = '{self.norm}' gives {len(norms)} per-layer norms but n_layers = {self.n_layers}; "
                           f"give one norm, or one per layer (e.g. --set n_layers={len(norms)})")
        if not re.fullmatch(r"cpu|cuda(:\d+)?", self.device):
            raise GeoError(f"device = {self.device!r} is not a device; use cpu, cuda or cuda:N")
        if self.task in ("add", "sub", "mul", "add3") and not _is_prime(self.p):
            raise GeoError(f"p = {self.p} is not prime; task '{self.task}' needs a prime p (e.g. 113)")
        if self.task in ("add", "sub", "mul", "add3") and self.p < 3:
            raise GeoError(f"p = {self.p} is too small: with {self.p} classes there is nothing to learn and no Fourier "
                           "frequency; use a prime p >= 3 (e.g. 113)")
        if self.task == "perm" and not 2 <= self.n_perm <= 6:
            raise GeoError(f"n_perm = {self.n_perm} is out of range; S_n composition supports 2 <= n <= 6")
        if not 0.0 < self.frac_train < 1.0:
            raise GeoError(f"frac_train = {self.frac_train} must lie strictly between 0 and 1")
        n_train, n_test = self.split_sizes
        if min(n_train, n_test) < 1:
            empty = "training" if n_train < 1 else "test"
            raise GeoError(f"frac_train = {self.frac_train} leaves the {empty} split empty ({n_train} train / {n_test} "
                           f"test of {self.n_inputs} inputs); choose --frac so that both splits hold examples")
        _positive_finite("lr", self.lr)
        _positive_finite("muon_lr", self.muon_lr)
        for name in ("momentum", "muon_momentum"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise GeoError(f"{name} = {getattr(self, name)} must lie in [0, 1)")
        _positive_finite("tau", self.tau)
        for name in ("ln_eps", "rms_eps", "sphere_eps"):
            _positive_finite(name, getattr(self, name))
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise GeoError(f"weight_decay = {self.weight_decay} must be a finite number >= 0 (e.g. --wd 1.0)")
        for name in ("beta1", "beta2"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise GeoError(f"{name} = {getattr(self, name)} must lie in [0, 1) (AdamW betas, e.g. 0.9, 0.999)")
        if self.early_stop_after is not None and self.early_stop_after < 0:
            raise GeoError(f"early_stop_after = {self.early_stop_after} must be >= 0 epochs (or none: no early stop)")
        if self.n_layers < 1:
            raise GeoError(f"n_layers = {self.n_layers} must be >= 1")
        if self.n_heads * self.d_head <= 0 or self.d_model <= 0 or self.d_mlp <= 0:
            raise GeoError("d_model, d_mlp, n_heads and d_head must be positive")
        if self.epochs < 0 or self.eval_every < 1:
            raise GeoError("epochs must be >= 0 and eval_every >= 1")
        if self.fourier_init:
            if self.task == "perm":
                raise GeoError("fourier_init applies to Z_p tasks only; drop '+fourier' for task perm")
            bad = [k for k in self.fourier_init if not 1 <= k <= (self.p - 1) // 2]
            if bad:
                raise GeoError(f"fourier_init frequencies {bad} are outside 1..{(self.p - 1) // 2} for p = {self.p}")
            if 2 * len(self.fourier_init) > self.d_model:
                raise GeoError(f"fourier_init needs 2 * {len(self.fourier_init)} <= d_model = {self.d_model}")
        if self.norm_clamp is not None and not (math.isfinite(self.norm_clamp) and self.norm_clamp > 0):
            raise GeoError(f"norm_clamp = {self.norm_clamp} must be a finite number > 0 (the held total weight norm) "
                           "or none")
        from geolens.model.hyperschedule import parse_hyper_schedule
        from geolens.model.schedule import parse_keep, parse_schedule

        parse_schedule(self.checkpoints)
        parse_keep(self.keep)
        parse_hyper_schedule(self.schedule)

    def _check_types(self) -> None:
        """Every field has its declared type (a hand-edited run.json may hold "p": "23"); ints are
        accepted for float fields and stored as floats."""
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if f.type in ("float", "float | None") and type(value) is int:
                setattr(self, f.name, float(value))
                continue
            if not _TYPE_CHECKS[f.type](value):
                raise GeoError(f"config field '{f.name}' = {value!r} is a {type(value).__name__}, not {f.type}; "
                               f"fix it (e.g. --set {f.name}=...) or restore the run's run.json")

    @property
    def split_sizes(self) -> tuple[int, int]:
        """(n_train, n_test) of the task's split (tasks.make_dataset)."""
        n = self.n_inputs
        n_train = int(n * self.frac_train)
        return n_train, n - n_train

    # ---- (de)serialisation ------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def sha256(self) -> str:
        """Hex SHA-256 of the config as canonical JSON (sorted keys): a run's identity in a fork's lineage.
        Every field, except a field hashed 'unless default' (its declared roles) at its default (fields added
        later leave the identities recorded before them, a fork's parent_identity, valid) and one hashed 'never'
        (the storage policy)."""
        d = self.to_dict()
        for f in dataclasses.fields(self):
            hashed = f.metadata["roles"].hashed
            if hashed == NEVER or (hashed == UNLESS_DEFAULT and d[f.name] == default_of(f)):
                del d[f.name]
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "GeoConfig":
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - names)
        if unknown:
            raise GeoError(f"unknown config field(s) {unknown}; known fields: {sorted(names)}")
        return cls(**d)

    def replace(self, **overrides: Any) -> "GeoConfig":
        return GeoConfig.from_dict({**self.to_dict(), **overrides})


#: every field's declared roles (geolens.model.roles), in declaration order; importing this module checks them
FIELD_ROLES: dict[str, Roles] = roles_of(GeoConfig)


def config_fields(**criteria: Any) -> tuple[str, ...]:
    """GeoConfig's fields whose declared roles meet every criterion, in declaration order:
    config_fields(member=True), config_fields(fast='value'), config_fields(tables='bookkeeping')."""
    return select(GeoConfig, **criteria)


#: fields added after fork identities were first recorded: hashed by sha256 only when not at their default
HASHED_UNLESS_DEFAULT = config_fields(hashed=UNLESS_DEFAULT)
#: fields that never enter the identity: how a run is stored (`geolens convert` changes it)
NOT_HASHED = config_fields(hashed=NEVER)


# ---- presets -------------------------------------------------------------------------------
PRESETS: dict[str, dict[str, Any]] = {
    "ln": dict(norm="layernorm", unembed="raw", weight_decay=1.0),
    "rms": dict(norm="rmsnorm", unembed="raw", weight_decay=1.0),
    "none": dict(norm="none", unembed="raw", weight_decay=1.0),
    "sphere": dict(norm="sphere", unembed="bounded", weight_decay=1.0),
    "fb": dict(norm="sphere", unembed="bounded", weight_decay=0.0),
    "sphere_raw": dict(norm="sphere", unembed="raw", weight_decay=1.0),
}
MODIFIERS: dict[str, dict[str, Any]] = {
    "uniform": dict(attention="uniform"),
    "fourier": dict(fourier_init=list(PAPER_FOURIER_FREQS)),
    "notebook": dict(init="notebook"),
}


def preset_fields(preset: str) -> dict[str, Any]:
    """Field values of a preset string such as 'fb+uniform+fourier'."""
    base, *mods = preset.split("+")
    if base not in PRESETS:
        raise GeoError(f"unknown preset '{base}'; choose one of {', '.join(PRESETS)} (modifiers: +uniform, +fourier, +notebook)")
    fields = dict(PRESETS[base])
    for m in mods:
        if m not in MODIFIERS:
            raise GeoError(f"unknown preset modifier '+{m}'; choose from +uniform, +fourier, +notebook")
        fields.update(MODIFIERS[m])
    fields["preset"] = preset
    return fields


def make_config(preset: str = "fb", **overrides: Any) -> GeoConfig:
    """Config from a preset plus field overrides: `make_config('ln', p=59, lr=1e-3)`."""
    return GeoConfig.from_dict({**preset_fields(preset), **overrides})


def parse_override(text: str) -> tuple[str, Any]:
    """Parse a CLI override 'key=value' into (key, typed value) using the field's type."""
    if "=" not in text:
        raise GeoError(f"override '{text}' is not of the form key=value (e.g. --set d_mlp=256)")
    key, raw = text.split("=", 1)
    key = key.strip()
    fields = {f.name: f for f in dataclasses.fields(GeoConfig)}
    if key not in fields:
        raise GeoError(f"unknown config field '{key}'; known fields: {', '.join(sorted(fields))}")
    default = GeoConfig().to_dict()[key]
    try:
        if key == "fourier_init":
            value: Any = [int(x) for x in raw.replace("[", "").replace("]", "").split(",") if x.strip()]
        elif key == "early_stop_after":
            value = None if raw.lower() in ("none", "") else int(raw)
        elif key == "norm_clamp":
            value = None if raw.lower() in ("none", "") else float(raw)
        elif key == "schedule":
            value = [x for x in raw.split(";") if x.strip()]
        elif isinstance(default, bool):
            if raw.lower() not in ("true", "false", "1", "0"):
                raise ValueError(raw)
            value = raw.lower() in ("true", "1")
        elif isinstance(default, int):
            value = int(raw)
        elif isinstance(default, float):
            value = float(raw)
        else:
            value = raw
    except ValueError:
        raise GeoError(f"override '{text}': '{raw}' is not a valid {type(default).__name__} for '{key}'") from None
    return key, value


_TYPE_CHECKS = {
    "str": lambda v: isinstance(v, str),
    "int": lambda v: type(v) is int,
    "float": lambda v: type(v) is float,
    "bool": lambda v: type(v) is bool,
    "list[int]": lambda v: isinstance(v, list) and all(type(x) is int for x in v),
    "int | None": lambda v: v is None or type(v) is int,
    "float | None": lambda v: v is None or type(v) is float,
    "list[str]": lambda v: isinstance(v, list) and all(type(x) is str for x in v),
}


def training_warnings(cfg: GeoConfig) -> list[str]:
    """Settings that train but are probably not what was meant (each a one-line warning)."""
    out = []
    n_train, n_test = cfg.split_sizes
    for name, n in (("training", n_train), ("test", n_test)):
        if n < SMALL_SPLIT:
            out.append(f"the {name} split has only {n} example(s), so its accuracy moves in steps of "
                       f"{1 / n:.2g}; choose --frac so that both splits hold at least {SMALL_SPLIT}")
    return out


SMALL_SPLIT = 10


def _positive_finite(name: str, value: float) -> None:
    if not (math.isfinite(value) and value > 0):
        raise GeoError(f"{name} = {value} must be a finite number > 0")


def _choice(name: str, value: str, options: tuple[str, ...]) -> None:
    if value not in options:
        raise GeoError(f"{name} = '{value}' is not valid; choose one of {', '.join(options)}")


def _is_prime(n: int) -> bool:
    return n >= 2 and all(n % d for d in range(2, int(n**0.5) + 1))


def _factorial(n: int) -> int:
    out = 1
    for i in range(2, n + 1):
        out *= i
    return out
