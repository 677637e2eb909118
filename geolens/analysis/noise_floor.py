"""The float-order noise floor of the grokking onset: how far the onset of one seed moves when only the
order of floating-point operations changes.

Runs of one configuration and seed (the same init, split and hyperparameters; runset.group_key and the
seeds) trained on one machine (run.json's CPU) that differ only in how they were computed (the engine:
fast, hooked or a batched stack; the torch threads) are replicates. Per seed and machine, the range is the
largest minus the smallest onset (onset_095) of its replicates (a range, not a half-width: it grows with the
number of replicates); per configuration and machine, the floor is the largest range over its seeds. Only
replicates trained from a committed tree count (every run.json segment names a commit without `+dirty`): two
runs of an uncommitted tree may differ in code, not only in float order. The range including those runs is
kept beside it, labelled, never in its place.
A shift of the onset (an intervention's arm against its parent) within the floor of the parent's
configuration on the machine the arm ran on is what a change of float order alone can do; only a shift beyond
it is evidence of the intervention, and a machine without a floor has none to judge by (another machine's is
not borrowed). `geolens noise-floor` tabulates it; docs/noise-floor.md measures it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from geolens.errors import GeoError
from geolens.runs.run import Run
from geolens.runs.runset import group_key


def _machine(run: Run) -> dict:
    segments = run.header.get("segments") or [{}]
    return segments[0].get("machine") or {}


def float_order(run: Run) -> str:
    """How the run was computed on its machine: 'fast, 1 thread', 'batched-fast, 1 thread', 'hooked, 2 threads'."""
    threads = _machine(run).get("torch_threads")
    return run.header.get("engine", "?") + ("" if threads is None else f", {threads} thread{'s' * (threads != 1)}")


def machine_name(run: Run, from_epoch: int = 0) -> str:
    """The CPU the run trained on from `from_epoch` on, as run.json records it ('?' for runs recorded before
    machines were; machines joined by ' + ' when its segments from there ran on several)."""
    segments = [s for s in run.header.get("segments") or [] if s.get("from_epoch", 0) >= from_epoch] or \
        (run.header.get("segments") or [{}])[:1]
    names = [f"{m['cpu']} ({m.get('cpu_capability', '?')})" if (m := s.get("machine") or {}).get("cpu") else "?"
             for s in segments]
    return " + ".join(dict.fromkeys(names)) or "?"


def committed(run: Run) -> bool:
    """Whether every training segment of the run names a commit without `+dirty` (a committed, known tree)."""
    commits = [s.get("geolens_commit") for s in run.header.get("segments") or []]
    return bool(commits) and all(c and not c.endswith("+dirty") for c in commits)


def _range(onsets: list[int | None]) -> int | None:
    known = [o for o in onsets if o is not None]
    return max(known) - min(known) if len(known) >= 2 else None


@dataclass
class SeedSpread:
    """One seed's replicates on one machine: onset per float order (None: no onset within the budget), and the
    float orders whose run was trained from an uncommitted tree or records no commit."""

    seed: int
    machine: str
    onsets: dict[str, int | None]
    uncommitted: set[str] = field(default_factory=set)

    @property
    def range(self) -> int | None:
        """Largest minus smallest onset of the committed replicates; None unless at least two have one."""
        return _range([o for order, o in self.onsets.items() if order not in self.uncommitted])

    @property
    def range_with_uncommitted(self) -> int | None:
        """The same over every replicate, uncommitted ones included (for display only)."""
        return _range(list(self.onsets.values()))


@dataclass
class Floor:
    """One configuration's replicated seeds on one machine and its floor there."""

    configuration: str  # RunGroup.full_label of the runs
    key: str  # runset.group_key
    machine: str  # machine_name
    seeds: list[SeedSpread] = field(default_factory=list)  # the seeds with at least two replicates
    lone: list[int] = field(default_factory=list)  # seeds with one run only on this machine

    @property
    def floor(self) -> int | None:
        """The largest range of committed replicates over the seeds (None: no seed has two committed replicates
        with an onset on this machine)."""
        ranges = [s.range for s in self.seeds if s.range is not None]
        return max(ranges) if ranges else None

    @property
    def floor_with_uncommitted(self) -> int | None:
        """The largest range with uncommitted replicates included (display only; never judges a shift)."""
        ranges = [s.range_with_uncommitted for s in self.seeds if s.range_with_uncommitted is not None]
        return max(ranges) if ranges else None

    @property
    def orders(self) -> list[str]:
        return list(dict.fromkeys(o for s in self.seeds for o in s.onsets))


def noise_floors(runs: list[Run], label) -> list[Floor]:
    """Floors of the configurations per machine among runs (label(run): the configuration's name for the tables),
    those without a seed of two replicates there included (no seeds, their seeds in `lone`); forks are left out (a
    fork's onset depends on its parent's)."""
    floors: dict[tuple[str, str], Floor] = {}
    for run in sorted(runs, key=lambda r: (machine_name(r), r.config.seed, str(r.path))):
        if run.header.get("fork"):
            continue
        key, machine = group_key(run.config), machine_name(run)
        floor = floors.setdefault((key, machine), Floor(label(run), key, machine))
        seed = next((s for s in floor.seeds if s.seed == run.config.seed), None)
        if seed is None:
            seed = SeedSpread(run.config.seed, machine, {})
            floor.seeds.append(seed)
        order = float_order(run)
        while order in seed.onsets:  # the same float order twice (e.g. rerun): keep both
            order += "'"
        seed.onsets[order] = run.events.get("onset_095")
        if not committed(run):
            seed.uncommitted.add(order)
    for f in floors.values():
        f.lone = [s.seed for s in f.seeds if len(s.onsets) < 2]
        f.seeds = [s for s in f.seeds if len(s.onsets) >= 2]
    return sorted(floors.values(), key=lambda f: (f.configuration, f.machine))


def floors_json(floors: list[Floor]) -> str:
    """{"format": "geolens-noise-floor", "floors": [{configuration, key, machine, floor, floor_with_uncommitted,
    seeds: [{seed, onsets, uncommitted, range, range_with_uncommitted}]}]}: what summaries of shifts read
    (read_floors)."""
    return json.dumps({"format": "geolens-noise-floor", "format_version": 2, "floors": [
        {"configuration": f.configuration, "key": f.key, "machine": f.machine, "floor": f.floor,
         "floor_with_uncommitted": f.floor_with_uncommitted,
         "seeds": [{"seed": s.seed, "onsets": s.onsets, "uncommitted": sorted(s.uncommitted), "range": s.range,
                    "range_with_uncommitted": s.range_with_uncommitted} for s in f.seeds]}
        for f in floors if f.seeds]},
        indent=1) + "\n"


@dataclass(frozen=True)
class MachineFloor:
    """A configuration's floor on one machine (read_floors): from committed replicates (None: none there), and
    with uncommitted ones included (display only)."""

    floor: int | None
    with_uncommitted: int | None


def read_floors(text: str) -> dict[tuple[str, str], MachineFloor]:
    """{(group_key, machine): MachineFloor} of a floors_json document."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise GeoError(f"a noise-floor file is not readable JSON ({e}); write one with `geolens noise-floor --runs DIR`") from None
    if not isinstance(data, dict) or data.get("format") != "geolens-noise-floor":
        raise GeoError("not a geolens noise-floor file; write one with `geolens noise-floor --runs DIR`")
    if data.get("format_version") != 2:
        raise GeoError(f"noise-floor file format version {data.get('format_version')} has one floor over all machines; "
                       "rewrite it with this geolens's `geolens noise-floor --runs DIR` (floors per machine)")
    return {(f["key"], f["machine"]): MachineFloor(f["floor"], f["floor_with_uncommitted"]) for f in data["floors"]}
