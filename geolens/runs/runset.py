"""Run directories under a folder, grouped into configurations by their run.json config.

Any folder holding a run.json is a run, at any depth (`geolens sweep` writes OUT/seed_N; grid
sweeps add levels such as OUT/fb/lr6e-4/seed_3). Folder names are never read: runs whose configs
agree in every field except the bookkeeping ones (seeds, preset name, engine, device, budget,
evaluation and checkpoint schedule) form one group, one "configuration" of the tables and figures.
A fork (run.json `fork`) groups only with forks of the same step from parents of one configuration.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from geolens.model.config import MODIFIERS, PRESETS, GeoConfig
from geolens.errors import GeoError
from geolens.runs.run import Run

#: config fields that do not make a configuration different (who, where, how long, how often recorded)
BOOKKEEPING = ("seed", "data_seed", "preset", "engine", "device", "checkpoints", "early_stop_after", "epochs", "eval_every",
               "flush_denormal", "keep")
#: fields a group's name and the tables' columns show; the other non-default fields are "extras"
SHOWN = ("norm", "unembed", "weight_decay", "attention", "fourier_init", "init", "lr", "task", "p", "n_perm")


@dataclass
class RunGroup:
    """Finished runs of one configuration, ordered by (seed, data seed, path)."""

    config: GeoConfig  # the first run's config (the bookkeeping fields are that run's)
    runs: list[Run] = field(default_factory=list)

    @property
    def name(self) -> str:
        """config_name, and for forks their lineage: 'fb, forked from ln at 3000'."""
        lineage = fork_label(self.runs[0]) if self.runs else ""
        return config_name(self.config) + (f", {lineage}" if lineage else "")

    @property
    def fork(self) -> dict | None:
        """The fork record (run.json `fork`) of the group's first run; None for runs trained from scratch."""
        return self.runs[0].forks[0] if self.runs and self.runs[0].forks else None

    @property
    def variant(self) -> str:
        """name plus the non-default fields outside the tables' columns: 'fb (d_model=32, d_mlp=64)'."""
        extra = ", ".join(f"{k}={v}" for k, v in extras(self.config).items())
        return f"{self.name} ({extra})" if extra else self.name

    @property
    def label(self) -> str:
        """variant, learning rate and weight decay: 'fb lr 0.0006 wd 0'."""
        return f"{self.variant} lr {self.config.lr:g} wd {self.config.weight_decay:g}"

    @property
    def full_label(self) -> str:
        """label with the task: 'fb lr 0.0006 wd 0, add p=113'."""
        return f"{self.label}, {self.config.task_label}"

    @property
    def seeds(self) -> list[int]:
        return [r.config.seed for r in self.runs]

    @property
    def epochs(self) -> tuple[int, int]:
        """(smallest, largest) epoch budget among its runs."""
        budgets = [r.config.epochs for r in self.runs]
        return min(budgets), max(budgets)

    @property
    def representative(self) -> Run:
        """The run with the lowest seed (the one drawn where a figure shows one run per configuration)."""
        return self.runs[0]


def find_runs(root: str | Path) -> tuple[list[Run], dict[str, str]]:
    """(finished runs under root, {path: why skipped}) for every folder with a run.json.

    Symbolic links to folders are followed (runs of several places joined under one root), each real
    folder once. Runs still training or that cannot be read are skipped with their reason, not fatal; a
    root without any run is refused.
    """
    root = Path(root)
    if not root.is_dir():
        raise GeoError(f"--runs {root} is not a directory; pass the folder holding the run directories")
    runs, skipped = [], {}
    seen = {os.path.realpath(root)}
    for folder, dirs, files in os.walk(root, followlinks=True):
        if "run.json" not in files:
            dirs[:] = sorted(d for d in dirs if _first_visit(os.path.join(folder, d), seen))
            continue
        dirs.clear()  # runs do not nest
        try:
            run = Run(folder)
            evaluated = bool(run.metrics)  # read (and cached) here, so a damaged metrics.csv skips the run
        except GeoError as e:
            skipped[folder] = str(e)
            continue
        if not evaluated:
            skipped[folder] = "metrics.csv has no evaluation"
        elif run.header.get("status") != "finished":
            skipped[folder] = f"status {run.header.get('status')!r}: still training or interrupted (finish it with --resume)"
        else:
            runs.append(run)
    if not runs:
        why = f" ({len(skipped)} skipped: {next(iter(skipped.values()))})" if skipped else ""
        raise GeoError(f"no finished run directory (a folder with run.json) under {root}{why}; "
                       "train some with `geolens sweep` or `geolens train`")
    return runs, skipped


def _first_visit(folder: str, seen: set[str]) -> bool:
    """Whether `folder` (through any links) has not been walked yet; marks it walked."""
    real = os.path.realpath(folder)
    if real in seen:
        return False
    seen.add(real)
    return True


def found_runs(root: str | Path) -> tuple[list[Run], list[str]]:
    """(finished runs under root, notes): find_runs, with provenance_notes on the runs and one note per
    run skipped, as the commands that tabulate runs print them."""
    runs, skipped = find_runs(root)
    return runs, provenance_notes(runs) + [f"skipped {path}: {why}" for path, why in skipped.items()]


def group_key(cfg: GeoConfig, ignoring: tuple[str, ...] = ()) -> str:
    """The configuration of a run: its config without the BOOKKEEPING fields (and those `ignoring` names), as
    canonical JSON."""
    return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in BOOKKEEPING and k not in ignoring},
                      sort_keys=True)


def group_runs(runs: list[Run]) -> list[RunGroup]:
    """Groups of equal configuration, ordered by full_label; runs in a group by (seed, data seed, path)."""
    groups: dict[str, RunGroup] = {}
    seen: dict[tuple[str, int, int], Run] = {}
    for run in sorted(runs, key=lambda r: (r.config.seed, r.config.data_seed, str(r.path))):
        key = group_key(run.config) + lineage_key(run)
        twin = seen.setdefault((key, run.config.seed, run.config.data_seed), run)
        if twin is not run:  # e.g. the same seed through another engine: counting both would double it
            raise GeoError(f"{twin.path} and {run.path} are the same configuration and seed (at most "
                           "their engine, device, budget or folder differ); pass a --runs folder that holds one run per seed")
        groups.setdefault(key, RunGroup(run.config)).runs.append(run)
    return sorted(groups.values(), key=lambda g: g.full_label)


def lineage_key(run: Run) -> str:
    """What makes forks one configuration besides their config: every generation's step and its parent's
    configuration ('' for a run trained from scratch), so a fork never joins the runs trained as its config."""
    return json.dumps([[f["step"], group_key(run.config_at(f["step"] - 1))] for f in run.forks]) if run.forks else ""


def fork_label(run: Run) -> str:
    """'forked from ln at 3000' (each generation, newest first; '' for a run trained from scratch)."""
    return ", ".join(f"forked from {config_name(run.config_at(f['step'] - 1))} at {f['step']}" for f in run.forks)


def config_name(cfg: GeoConfig) -> str:
    """The preset that names the config's topology and weight decay ('fb', 'ln+uniform', ...), from
    its fields; 'sphere/bounded' style when no preset has them."""
    base = next((name for name, fields in PRESETS.items() if all(getattr(cfg, k) == v for k, v in fields.items())),
                f"{cfg.norm}/{cfg.unembed}")
    mods = [m for m, fields in MODIFIERS.items() if all(getattr(cfg, k) == v for k, v in fields.items())]
    if cfg.fourier_init and "fourier" not in mods:
        mods.append("fourier" + ",".join(map(str, cfg.fourier_init)))
    if cfg.init == "tl":
        mods.append("tl_init")
    return "+".join([base, *mods])


def extras(cfg: GeoConfig) -> dict[str, object]:
    """Fields outside SHOWN and BOOKKEEPING whose value differs from GeoConfig's default."""
    default = GeoConfig().to_dict()
    return {k: v for k, v in cfg.to_dict().items() if k not in BOOKKEEPING and k not in SHOWN and v != default[k]}


def trained_on(segment: dict) -> str | None:
    """The kind of device a run.json segment trained on: its GPU's name, or 'CPU'; None for segments recorded
    before machines were."""
    machine = segment.get("machine")
    return (machine.get("gpu") or "CPU") if machine else None


def provenance_notes(runs: list[Run], shown: int = 3) -> list[str]:
    """What a table drawn from these runs must say about the code that trained them (run.json
    `segments`): the runs trained, in whole or in part, from an uncommitted tree ('+dirty'), the
    commits when more than one trained them, the devices (a GPU's name, or CPU) when more than one did (a seed
    trains in another float order on each), the runs that record no commit. [] when one clean commit on one kind
    of device trained every run."""
    def listed(paths: list[str]) -> str:
        return ", ".join(paths[:shown]) + (f" and {len(paths) - shown} more" if len(paths) > shown else "")

    dirty, unknown, commits, devices = [], [], {}, {}
    for run in runs:
        segments = run.header.get("segments", [])
        for device in sorted({trained_on(seg) for seg in segments} - {None}):  # sorted: ties list in one order
            devices[device] = devices.get(device, 0) + 1
        made = [seg.get("geolens_commit") for seg in segments] or [None]
        if any(c is None for c in made):
            unknown.append(str(run.path))
        if any(c and c.endswith("+dirty") for c in made):
            dirty.append(str(run.path))
        for sha in sorted({c.removesuffix("+dirty")[:7] for c in made if c}):
            commits[sha] = commits.get(sha, 0) + 1
    notes = []
    if dirty:
        notes.append(f"provenance: {len(dirty)} of {len(runs)} runs were trained from an uncommitted tree (+dirty in "
                     f"run.json): {listed(dirty)}; their code is not exactly any commit's")
    if len(commits) > 1:
        notes.append(f"provenance: the runs were trained at {len(commits)} commits: "
                     + ", ".join(f"{sha} ({n} runs)" for sha, n in sorted(commits.items(), key=lambda kv: -kv[1])))
    if len(devices) > 1:
        notes.append(f"provenance: the runs were trained on {len(devices)} kinds of device (a seed trains in another "
                     "float order on each): " + ", ".join(f"{d} ({n} runs)" for d, n in
                                                          sorted(devices.items(), key=lambda kv: -kv[1])))
    if unknown:
        notes.append(f"provenance: {len(unknown)} of {len(runs)} runs record no commit: {listed(unknown)}")
    return notes
