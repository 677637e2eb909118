"""Sweep grids: the members of `geolens sweep`, their folders, their state on disk, and the jobs that train them.

A grid is presets x seeds x learning rates x weight decays x tasks x moduli p, given by flags and/or
a TOML grid file (docs/cli.md). Member folders under OUT:
    flat   (one configuration):   seed_<seed>
    nested (otherwise):           [<task>/][p<p>/]<preset>/lr<lr>/[wd<wd>/]seed_<seed>
the bracketed levels appear when that axis is given (flag or grid-file key), whatever its number of
values, so a folder's name never depends on what else is in the grid. Numbers are spelled shortest:
lr 6e-4 -> lr6e-4, lr 0.01 -> lr1e-2, wd 1.0 -> wd1, wd 0.1 -> wd0.1, wd 1e-4 -> wd1e-4.

Each member's folder is inspected before anything runs: missing -> new; finished with the same
config -> done (skipped); same config, not finished -> resumed from its resume state, finished
(if killed between its last checkpoint and the final record) or restarted (no resume state); the
same config but a smaller epoch budget -> extended (resumed to the new budget), unless it stopped
early; not finished, with a larger budget -> resumed to the sweep's smaller one if it is still
training before it; any other difference -> a GeoError naming the field (the folder is never overwritten).

Jobs: members that may share one stacked process (geolens.training.batched.check_members: everything but
MEMBER_FIELDS agrees) and start at the same epoch, split into up to `workers` chunks of at least
two members each; a job of one member is stacked with an unrecorded copy of itself, so every
member computes with the stacked path's float order whatever the grid, the chunking or a resume.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from geolens.errors import GeoError
from geolens.model.config import FIELD_ROLES, GeoConfig, make_config, parse_override, preset_fields

SWEEP_RECORD = "sweep.json"
LAYOUTS = ("auto", "nested", "flat")
#: grid-file keys, which are also the `geolens sweep` flag names (presets <-> --preset)
GRID_KEYS = ("presets", "seeds", "lr", "wd", "task", "p", "epochs", "data_seed", "frac", "eval_every",
             "checkpoints", "early_stop", "layout", "set")
#: config fields that are grid axes or per-member: not settable with --set (field -> its flag; declared roles)
AXIS_FIELDS = {name: roles.sweep_axis for name, roles in FIELD_ROLES.items() if roles.sweep_axis}
#: grid keys shared by every member -> their config field
SHARED_FIELDS = {roles.grid_key: name for name, roles in FIELD_ROLES.items() if roles.grid_key}
#: how many members a job holds at least (a lone member gets an unrecorded copy: geolens.training.batched min_stack)
MIN_STACK = 2


# ---- the grid ---------------------------------------------------------------------------------
@dataclass
class Arms:
    """A fork sweep: every parent run (one run, or each run under a sweep folder, optionally only some
    seeds) forked at every step with every combination of the changed fields' values (axes: field ->
    values), the schedule entries (windows may be relative to the step) and the shared changes."""

    parent: Path
    steps: list[int]
    axes: dict[str, list[Any]]
    schedule: list[str]
    shared: dict[str, Any]
    seeds: list[int] | None = None


@dataclass
class Grid:
    """Axes (None: not given, so the preset's/config's default and no folder level), per-preset
    epochs ({'*': default}), the fields shared by every member, the layout choice, and how many
    configurations the grid file declares (flags may narrow the sweep to some of them)."""

    presets: list[str]
    seeds: list[int]
    lrs: list[float] | None = None
    wds: list[float] | None = None
    tasks: list[str] | None = None
    ps: list[int] | None = None
    epochs: dict[str, int] = field(default_factory=dict)
    data_seed: int | None = None
    shared: dict[str, Any] = field(default_factory=dict)
    layout: str = "auto"
    file_configs: int = 1
    arms: Arms | None = None  # a fork sweep (--fork-from): its arms replace the axes above

    @property
    def n_configs(self) -> int:
        """Configurations (members per seed)."""
        return _count_configs(self.presets, self.lrs, self.wds, self.tasks, self.ps)


def load_grid_file(path: Path) -> dict[str, Any]:
    """The keys of a TOML grid file (GRID_KEYS; `set` a table of config fields)."""
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        import tomli as tomllib  # type: ignore[no-redef]
    try:
        data = tomllib.loads(Path(path).read_text())
    except FileNotFoundError:
        raise GeoError(f"grid file {path} does not exist; check --grid") from None
    except tomllib.TOMLDecodeError as e:
        raise GeoError(f"grid file {path} is not valid TOML ({e}); fix it (see docs/cli.md for an example)") from None
    data = {("presets" if k == "preset" else k): v for k, v in data.items()}
    unknown = sorted(set(data) - set(GRID_KEYS))
    if unknown:
        raise GeoError(f"grid file {path}: unknown key(s) {unknown}; known keys: {', '.join(GRID_KEYS)}")
    if "set" in data and not isinstance(data["set"], dict):
        raise GeoError(f"grid file {path}: 'set' must be a table of config fields, e.g. [set] d_mlp = 256")
    return data


def make_grid(file: Path | None = None, flags: dict[str, Any] | None = None, sets: list[str] = (),
              fork_from: Path | None = None, steps: str | None = None, schedules: list[str] = ()) -> Grid:
    """The grid of a grid file (optional) and flags (GRID_KEYS -> flag value, None when not given):
    a given flag replaces the file's key; --set fields are added to the file's [set] table. With
    fork_from, the fork sweep of make_arms instead."""
    if fork_from is not None or steps is not None:
        if file is not None:
            raise GeoError("--grid and --fork-from do not combine: a fork sweep takes its configuration from the parents")
        return Grid(presets=[], seeds=[], arms=make_arms(fork_from, steps, flags or {}, sets, schedules))
    if schedules:  # every member's schedule
        sets = [*sets, "schedule=" + ";".join(schedules)]
    keys = load_grid_file(file) if file is not None else {}
    file_axes = {k: _values(keys[k]) for k in ("presets", "lr", "wd", "task", "p") if k in keys}
    file_presets = file_axes.get("presets", []) if (flags or {}).get("epochs") is None else []
    keys.update({k: v for k, v in (flags or {}).items() if v is not None})
    unknown = sorted(set(keys) - set(GRID_KEYS))
    if unknown:
        raise GeoError(f"unknown grid key(s) {unknown}; known keys: {', '.join(GRID_KEYS)}")
    presets = _items(keys.get("presets", "fb"), str, "--preset")
    for preset in presets:
        preset_fields(preset)  # an unknown preset fails here, naming it
    if "seeds" not in keys:
        raise GeoError("a sweep needs seeds; give --seeds 1-10 (or seeds = \"1-10\" in the grid file)")
    # every shared value is typed by its config field, as --set does (a file may say frac = "0.5")
    shared = dict(parse_override(f"{SHARED_FIELDS[k]}={keys[k]}") for k in SHARED_FIELDS if k in keys)
    set_table = dict(parse_override(f"{name}={value}") for name, value in keys.get("set", {}).items())
    given = [parse_override(text) for text in sets]
    repeated = sorted({name for name, _ in given if [n for n, _ in given].count(name) > 1})
    if repeated:
        raise GeoError(f"--set {repeated[0]} is given twice; give each field once")
    set_table.update(dict(given))
    for name in set_table:
        if name in AXIS_FIELDS:
            raise GeoError(f"'{name}' is a sweep axis; give it with {AXIS_FIELDS[name]} instead of --set/[set]")
    shared.update(set_table)
    layout = str(keys.get("layout", "auto"))
    if layout not in LAYOUTS:
        raise GeoError(f"layout '{layout}' is not valid; choose one of {', '.join(LAYOUTS)}")
    return Grid(
        presets=presets,
        seeds=parse_seeds(keys["seeds"]),
        lrs=_items(keys["lr"], float, "--lr") if "lr" in keys else None,
        wds=_items(keys["wd"], float, "--wd") if "wd" in keys else None,
        tasks=_items(keys["task"], str, "--task") if "task" in keys else None,
        ps=_items(keys["p"], int, "--p") if "p" in keys else None,
        # a file's per-preset budgets may name presets a --preset flag left out (unused here)
        epochs=parse_epochs(keys["epochs"], presets + file_presets) if "epochs" in keys else {},
        data_seed=parse_override(f"data_seed={keys['data_seed']}")[1] if "data_seed" in keys else None,
        shared=shared,
        layout=layout,
        file_configs=_count_configs(*file_axes.values()),
    )


#: flags a fork sweep takes (its arms' budget, checkpoints, early stop and which parents' seeds)
ARM_FLAGS = {"epochs": "epochs", "checkpoints": "checkpoints", "early_stop": "early_stop_after", "seeds": None}


def make_arms(fork_from: Path | None, steps: str | None, flags: dict[str, Any], sets: list[str],
              schedules: list[str]) -> Arms:
    """The arms of `geolens sweep --fork-from PARENT --steps K,... [--set field=v1,v2 ...] [--schedule ...]`:
    a --set value list is an axis, and repeated --set of one field add to it."""
    if fork_from is None or steps is None:
        raise GeoError("a fork sweep needs both --fork-from RUN_OR_SWEEP and --steps K[,K...]")
    given = sorted(k for k, v in flags.items() if v is not None and k not in ARM_FLAGS and k != "layout")
    if given:
        flag = {"presets": "preset"}.get(given[0], given[0]).replace("_", "-")
        raise GeoError(f"--fork-from takes its configuration from the parents; drop --{flag} "
                       "(change a field with --set field=value[,value...])")
    shared = {ARM_FLAGS[k]: parse_override(f"{ARM_FLAGS[k]}={flags[k]}")[1] for k in ARM_FLAGS
              if ARM_FLAGS[k] and flags.get(k) is not None}
    axes: dict[str, list[Any]] = {}
    for text in sets:
        name, _, raw = text.partition("=")
        name = name.strip()
        values = [parse_override(f"{name}={v}")[1] for v in (raw.split(",") if name != "schedule" else [raw])]
        axes.setdefault(name, [])
        for v in values:
            if v in axes[name]:
                raise GeoError(f"--set {name} names {v!r} twice; give each value once")
            axes[name].append(v)
    return Arms(Path(fork_from), _items(steps, int, "--steps"), axes, list(schedules), shared,
                parse_seeds(flags["seeds"]) if flags.get("seeds") is not None else None)


def _values(value: Any) -> list:
    """A grid-file list or comma-separated string as its items (unparsed)."""
    return value if isinstance(value, list) else [v for v in str(value).split(",") if v.strip()]


def _count_configs(*axes: list | None) -> int:
    """The product of the given axes' lengths (None: not given, one value)."""
    n = 1
    for axis in axes:
        n *= len(axis) if axis else 1
    return n


def parse_seeds(value: Any) -> list[int]:
    """'1-3,8' (or a list of ints) -> [1, 2, 3, 8]; duplicates refused."""
    text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
    seeds: list[int] = []
    try:
        for part in (t.strip() for t in text.split(",") if t.strip()):
            lo, _, hi = part.partition("-") if not part.startswith("-") else (part, "", "")
            seeds.extend(range(int(lo), int(hi) + 1) if hi else [int(lo)])
    except ValueError:
        raise GeoError(f"--seeds '{text}' must be integers and ranges, e.g. --seeds 1-10 or --seeds 1,4,7") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise GeoError(f"--seeds '{text}' must name at least one seed and no seed twice")
    return seeds


def parse_epochs(value: Any, presets: list[str]) -> dict[str, int]:
    """Epoch budgets: 5000 -> {'*': 5000}; 'ln=15000,rms=15000,5000' (or the TOML table
    {ln = 15000, rms = 15000, default = 5000}) -> {'ln': 15000, 'rms': 15000, '*': 5000}."""
    if isinstance(value, dict):
        items = [(("*" if k == "default" else k), v) for k, v in value.items()]
    else:
        items = [(k.strip() if v else "*", v or k) for k, _, v in
                 (part.partition("=") for part in str(value).split(",") if part.strip())]
    out: dict[str, int] = {}
    for key, raw in items:
        try:
            n = int(str(raw).strip())
        except ValueError:
            n = -1
        if n < 0 or key in out:
            raise GeoError(f"--epochs '{value}' must be N or preset=N items with one default, e.g. "
                           "--epochs ln=15000,rms=15000,5000")
        if key != "*" and key not in presets:
            raise GeoError(f"--epochs names preset '{key}', which is not in the grid ({', '.join(presets)})")
        out[key] = n
    return out


def _items(value: Any, kind: type, flag: str) -> list:
    """A flag's comma-separated values (or a grid file's list or scalar) as `kind`; duplicates refused."""
    raw = _values(value)
    try:
        items = [kind(str(v).strip()) for v in raw]
    except ValueError:
        raise GeoError(f"{flag} '{value}' must be comma-separated {kind.__name__} values, e.g. {flag} "
                       f"{ {float: '6e-4,1e-3', int: '23,59', str: 'fb,ln'}[kind] }") from None
    if not items or len(set(items)) != len(items):
        raise GeoError(f"{flag} '{value}' must name at least one value and none twice")
    return items


# ---- members and their folders ------------------------------------------------------------
@dataclass
class Member:
    """One run of the grid: its folder name (relative to OUT), config and path; `state` (new, done,
    resume, finish, restart) and `start` (the epoch it trains from) come from inspect_member."""

    name: str
    cfg: GeoConfig
    path: Path
    state: str = "new"
    start: int = 0
    fork: tuple[Path, int, dict] | None = None  # an arm of a fork sweep: (parent run, step, changes)
    prepared: bool = False  # an arm this sweep wrote as a fork (then resumed from its step)


def number_label(x: float, scientific: bool = False) -> str:
    """The shortest spelling of x that reads back as x: 1.0 -> '1', 0.1 -> '0.1', 6e-4 -> '6e-4' (always
    mantissa-exponent when scientific: 0.01 -> '1e-2')."""
    if not scientific and (x == int(x) and abs(x) < 1e4 or 1e-2 <= abs(x) < 1e4):
        return str(int(x)) if x == int(x) else repr(x)
    for digits in range(17):  # 17 significant digits always read back
        text = f"{x:.{digits}e}"
        if float(text) == x:
            break
    mantissa, exponent = text.split("e")
    return f"{mantissa}e{int(exponent)}"


def resolve_layout(grid: Grid, out: Path) -> str:
    """'flat' or 'nested': the grid's choice; auto: nested for more than one configuration (in the grid or
    its grid file: `--preset ln` with a four-preset file still writes the file's folders) or when OUT
    already holds a nested sweep (its sweep.json), else flat."""
    recorded = None
    record = Path(out) / SWEEP_RECORD
    if record.exists():
        try:
            recorded = json.loads(record.read_text()).get("layout")
        except (json.JSONDecodeError, AttributeError):
            raise GeoError(f"{record} is corrupt; delete it (it only records the last sweep) and rerun") from None
    layout = grid.layout
    if layout == "auto":
        layout = "nested" if max(grid.n_configs, grid.file_configs) > 1 or recorded == "nested" else "flat"
    if layout == "flat" and grid.n_configs > 1:
        raise GeoError(f"layout flat holds one configuration but the grid has {grid.n_configs}; use --layout nested")
    if recorded is not None and recorded != layout:
        raise GeoError(f"{out} holds a {recorded} sweep ({record}); use --layout {recorded} or another --out")
    return layout


def expand(grid: Grid, out: Path, layout: str) -> list[Member]:
    """The members in folder order: task, p, preset, lr, wd, seed (a fork sweep: expand_arms). Raises the
    config's GeoError for a bad combination (e.g. a p that is not prime) before anything runs."""
    if grid.arms is not None:
        return expand_arms(grid.arms, Path(out))
    members = []
    for task in grid.tasks or [None]:
        for p in grid.ps or [None]:
            for preset in grid.presets:
                for lr in grid.lrs or [None]:
                    for wd in grid.wds or [None]:
                        axes = {"task": task, "p": p, "lr": lr, "weight_decay": wd,
                                "epochs": grid.epochs.get(preset, grid.epochs.get("*"))}
                        given = {k: v for k, v in axes.items() if v is not None}
                        for seed in grid.seeds:
                            data_seed = seed if grid.data_seed is None else grid.data_seed
                            cfg = make_config(preset, **{**grid.shared, **given, "seed": seed, "data_seed": data_seed})
                            levels = [] if layout == "flat" else [
                                *([task] if task else []), *([f"p{p}"] if p else []), preset,
                                f"lr{number_label(cfg.lr, scientific=True)}", *([f"wd{number_label(wd)}"] if wd is not None else [])]
                            name = "/".join([*levels, f"seed_{seed}"])
                            members.append(Member(name, cfg, Path(out) / name))
    return members


def expand_arms(arms: Arms, out: Path) -> list[Member]:
    """The arms of a fork sweep, in folder order OUT/[<parent's folder under the sweep>/]step<K>/<change>,
    <change> naming every --set field and schedule entry (field-value joined by '_'; 'same' for none).
    Each arm's config is its parent's with the changes (training.fork.forked_config: refused fields and
    budgets not past the step fail here, before anything runs)."""
    from geolens.runs.run import Run
    from geolens.training.fork import check_fork_step, forked_config, with_schedule

    if out.resolve() == arms.parent.resolve() or arms.parent.resolve() in out.resolve().parents:
        raise GeoError(f"--out {out} is inside --fork-from {arms.parent}; the parents are never written (and arms would "
                       "become parents): choose an --out outside it")
    parents = [arms.parent] if (arms.parent / "run.json").exists() else sorted(
        f.parent for f in arms.parent.rglob("run.json")
        if not any(part.startswith(".") for part in f.relative_to(arms.parent).parts))
    if not parents:
        raise GeoError(f"--fork-from {arms.parent} holds no run (no run.json under it); name a run or a sweep folder")
    combos = [{}]
    for name, values in arms.axes.items():
        combos = [{**c, name: v} for c in combos for v in values]
    members = []
    for parent in parents:
        run = Run(parent)
        if arms.seeds is not None and run.config.seed not in arms.seeds:
            continue
        rel = [] if parent == arms.parent else list(parent.relative_to(arms.parent).parts)
        for step in arms.steps:
            check_fork_step(run, step)
            cfg = run.config_at(step, scheduled_tau=False)
            for combo in combos:
                changes = with_schedule({**arms.shared, **combo}, cfg, step, arms.schedule)
                label = "_".join([*(f"{k}-{_value_label(v)}" for k, v in combo.items()),
                                  *(_value_label(e) for e in arms.schedule)]) or "same"
                name = "/".join([*rel, f"step{step}", label])
                members.append(Member(name, forked_config(cfg, step, changes), out / name, fork=(parent, step, changes)))
    if not members:
        raise GeoError(f"--seeds {arms.seeds} selects none of the runs under {arms.parent}")
    return members


def _value_label(value: Any) -> str:
    """A changed value in a folder name: numbers shortest (number_label), schedule entries without '=' and ':'."""
    if isinstance(value, bool) or value is None:
        return str(value).lower()
    if isinstance(value, (int, float)):
        return number_label(float(value))
    if isinstance(value, list):
        return "+".join(map(_value_label, value))
    return str(value).replace("=", "").replace(":", "-").replace("/", "-")


def inspect_member(member: Member, force: bool = False) -> None:
    """Set member.state/start from its folder (module docstring); a GeoError for a folder that holds
    something else. force: every existing member run is restarted."""
    from geolens.runs.events import early_stop_due, onset_events
    from geolens.runs.storage import RunDir, load_tensors, read_metrics

    run = RunDir(member.path)
    if not run.exists():
        member.state = "new"  # an arm: prepared (training.fork.prepare_fork) before the jobs are planned
        return
    if not run.run_json.exists():
        raise GeoError(f"member folder {member.path} exists but is not a geolens run (no run.json); move it away "
                       "or choose another --out")
    if force:
        member.state = "restart"
        return
    header = run.read_header()
    found = GeoConfig.from_dict(header["config"]).to_dict()
    wanted = member.cfg.to_dict()
    finished = header.get("status") == "finished"
    extended, lowered = found["epochs"] < wanted["epochs"], found["epochs"] > wanted["epochs"]
    for key, value in wanted.items():
        # a budget may be raised; an unfinished member's may also be lowered (to stop it sooner)
        if found[key] != value and not (key == "epochs" and (extended or not finished)):
            raise GeoError(f"member {member.path} exists with {key} = {found[key]!r} but the sweep asks for {value!r}; "
                           "it is never overwritten: choose another --out, or move that folder away")
    if finished and not extended:
        member.state = "done"
        return
    if not run.resume_file.exists():
        if finished:  # and extended
            raise GeoError(f"member {member.path} finished at {found['epochs']} epochs and has no resume state to "
                           f"extend it to {wanted['epochs']}; keep its budget, or move that folder away")
        member.state = "restart"
        return
    step = int(load_tensors(run.resume_file)["epoch"].item())
    rows = [r for r in read_metrics(run.metrics_csv) if r["epoch"] <= step]
    stopped = early_stop_due(member.cfg, step, onset_events(rows))
    if finished:  # extended: continued unless it had stopped early
        member.state, member.start = ("done" if stopped else "resume"), step
        return
    if lowered and (step >= wanted["epochs"] or stopped):  # only to stop a member sooner
        state = "stopped early" if stopped else f"trained to epoch {step}"
        raise GeoError(f"member {member.path} has {state} under its budget of {found['epochs']} epochs, so the sweep's "
                       f"{wanted['epochs']} cannot stop it sooner; ask for {found['epochs']} (or more), or move that folder away")
    member.state, member.start = ("finish" if step >= member.cfg.epochs or stopped else "resume"), step


# ---- jobs ------------------------------------------------------------------------------------
@dataclass
class Job:
    """Members trained in one process: kind 'train' (new and restarted members, stacked), 'resume'
    (stacked from resume states at one epoch) or 'finish' (final records of members whose training
    is over)."""

    kind: str
    members: list[Member]

    @property
    def cost(self) -> int:
        """Seed-epochs this job steps (a lone member is stacked with a copy)."""
        if self.kind == "finish":
            return 0
        return max(len(self.members), MIN_STACK) * (self.members[0].cfg.epochs - self.members[0].start)


def shape_key(cfg: GeoConfig) -> str:
    """Members with equal keys may share a stack (the fields outside geolens.training.batched.MEMBER_FIELDS)."""
    from geolens.training.batched import MEMBER_FIELDS

    return json.dumps({k: v for k, v in cfg.to_dict().items() if k not in MEMBER_FIELDS}, sort_keys=True)


def plan_jobs(members: list[Member], workers: int) -> list[Job]:
    """Jobs for the members that need work, largest first: one 'finish' job, and per stackable group
    (same shape; resumed ones at the same epoch) up to `workers` chunks of at least MIN_STACK members."""
    groups: dict[tuple, list[Member]] = {}
    for m in members:
        if m.state in ("new", "restart"):
            groups.setdefault(("train", shape_key(m.cfg)), []).append(m)
        elif m.state == "resume":
            groups.setdefault(("resume", shape_key(m.cfg), m.start), []).append(m)
    jobs = [Job(key[0], chunk) for key, group in groups.items() for chunk in chunks(group, workers)]
    finish = [m for m in members if m.state == "finish"]
    if finish:
        jobs.append(Job("finish", finish))
    return sorted(jobs, key=lambda j: -j.cost)


def chunks(items: list, workers: int) -> list[list]:
    """items in min(workers, len // MIN_STACK) (at least 1) contiguous chunks of near-equal size."""
    k = max(1, min(workers, len(items) // MIN_STACK))
    sizes = [len(items) // k + (i < len(items) % k) for i in range(k)]
    starts = [sum(sizes[:i]) for i in range(k)]
    return [items[s : s + n] for s, n in zip(starts, sizes)]

