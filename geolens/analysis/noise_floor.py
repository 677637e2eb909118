"""The float-order noise floor of the grokking onset: how far the onset of one seed moves when only the
order of floating-point operations changes.

Runs of one configuration and seed (the same init, split and hyperparameters; runset.group_key and the
seeds) trained on one machine (run.json's CPU) that differ only in how they were computed (the engine:
fast, hooked or a batched stack; the torch threads) are replicates. Per seed and machine, the spread
is the largest minus the smallest onset (onset_095) of its replicates; per configuration, the floor is
the largest spread over its seeds and machines.
A shift of the onset (an intervention's arm against its parent) within the floor of the parent's
configuration is what a change of float order alone can do; only a shift beyond it is evidence of the
intervention. `geolens noise-floor` tabulates it; docs/noise-floor.md measures it.
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


def machine_name(run: Run) -> str:
    """The run's CPU as run.json records it ('?' for runs recorded before machines were)."""
    machine = _machine(run)
    return f"{machine['cpu']} ({machine.get('cpu_capability', '?')})" if machine.get("cpu") else "?"


@dataclass
class SeedSpread:
    """One seed's replicates on one machine: onset per float order (None: no onset within the budget)."""

    seed: int
    machine: str
    onsets: dict[str, int | None]

    @property
    def spread(self) -> int | None:
        """Largest minus smallest onset; None unless at least two replicates have one."""
        known = [o for o in self.onsets.values() if o is not None]
        return max(known) - min(known) if len(known) >= 2 else None


@dataclass
class Floor:
    """One configuration's replicated seeds and its floor."""

    configuration: str  # RunGroup.full_label of the runs
    key: str  # runset.group_key
    seeds: list[SeedSpread] = field(default_factory=list)  # the seeds with at least two replicates
    lone: list[tuple[int, str]] = field(default_factory=list)  # (seed, machine) with one run only

    @property
    def floor(self) -> int | None:
        """The largest spread over the seeds (None without a replicated seed)."""
        spreads = [s.spread for s in self.seeds if s.spread is not None]
        return max(spreads) if spreads else None

    @property
    def orders(self) -> list[str]:
        return list(dict.fromkeys(o for s in self.seeds for o in s.onsets))


def noise_floors(runs: list[Run], label) -> list[Floor]:
    """Floors of the configurations among runs that have a seed with at least two replicates (label(run):
    the configuration's name for the tables); forks are left out (a fork's onset depends on its parent's)."""
    floors: dict[str, Floor] = {}
    for run in sorted(runs, key=lambda r: (machine_name(r), r.config.seed, str(r.path))):
        if run.header.get("fork"):
            continue
        key = group_key(run.config)
        floor = floors.setdefault(key, Floor(label(run), key))
        machine = machine_name(run)
        seed = next((s for s in floor.seeds if (s.seed, s.machine) == (run.config.seed, machine)), None)
        if seed is None:
            seed = SeedSpread(run.config.seed, machine, {})
            floor.seeds.append(seed)
        order = float_order(run)
        while order in seed.onsets:  # the same float order twice (e.g. rerun): keep both
            order += "'"
        seed.onsets[order] = run.events.get("onset_095")
    for f in floors.values():
        f.lone = [(s.seed, s.machine) for s in f.seeds if len(s.onsets) < 2]
        f.seeds = [s for s in f.seeds if len(s.onsets) >= 2]
    return [f for f in floors.values() if f.seeds]


def floors_json(floors: list[Floor]) -> str:
    """{"format": "geolens-noise-floor", "floors": [{configuration, key, floor, seeds: [{seed, machine,
    onsets, spread}]}]}: what summaries of shifts read (read_floors)."""
    return json.dumps({"format": "geolens-noise-floor", "format_version": 1, "floors": [
        {"configuration": f.configuration, "key": f.key, "floor": f.floor,
         "seeds": [{"seed": s.seed, "machine": s.machine, "onsets": s.onsets, "spread": s.spread} for s in f.seeds]}
        for f in floors]},
        indent=1) + "\n"


def read_floors(text: str) -> dict[str, int | None]:
    """{group_key: floor} of a floors_json document."""
    try:
        data = json.loads(text)
    except ValueError as e:
        raise GeoError(f"a noise-floor file is not readable JSON ({e}); write one with `geolens noise-floor --runs DIR`") from None
    if not isinstance(data, dict) or data.get("format") != "geolens-noise-floor":
        raise GeoError("not a geolens noise-floor file; write one with `geolens noise-floor --runs DIR`")
    return {f["key"]: f["floor"] for f in data["floors"]}
