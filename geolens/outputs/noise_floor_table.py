"""`geolens noise-floor`: per configuration, machine and seed, the onset of each float order and their range,
and per configuration and machine the floor (geolens.analysis.noise_floor), as Markdown, CSV and JSON."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from geolens.analysis.noise_floor import Floor, floors_json, noise_floors
from geolens.runs.runset import RunGroup, find_runs, provenance_notes
from geolens.runs.storage import atomic_write_bytes


def floor_tables(roots: list[str | Path]) -> tuple[list[Floor], list[str]]:
    """The floors of the replicated runs under the roots together, and notes (runs skipped, seeds without
    a replicate)."""
    runs, notes = [], []
    for root in roots:
        found, skipped = find_runs(root)
        runs += found
        notes += [f"skipped {path}: {why}" for path, why in skipped.items()]
    notes = provenance_notes(runs) + notes  # over every folder's runs together
    floors = noise_floors(runs, lambda run: RunGroup(run.config, [run]).full_label)
    for f in floors:
        if f.lone:
            notes.append(f"{f.configuration} on {f.machine}: {len(f.lone)} seeds have one run there (no range): "
                         + ", ".join(map(str, f.lone)))
        if f.seeds and f.floor is None:
            notes.append(f"{f.configuration} on {f.machine}: no seed has two replicates trained from a committed tree, "
                         f"so no floor is measured there (a shift on this machine has no floor to be judged by)")
    floors = [f for f in floors if f.seeds]
    if not floors:
        notes.append("no configuration and seed has two runs: nothing to compare (train one seed in two float orders)")
    return floors, notes


def _fmt(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def write_floor_tables(floors: list[Floor], notes: list[str], folder: Path) -> list[Path]:
    """folder/noise_floor.md (one row per configuration, machine and seed, a column per float order, the range of
    the committed replicates and the range with uncommitted ones; then its notes), floors.md (one row per
    configuration and machine: its floor, the seeds and float orders it rests on), noise_floor.csv (one row per
    run) and noise_floor.json (floors_json)."""
    folder.mkdir(parents=True, exist_ok=True)
    orders = list(dict.fromkeys(o for f in floors for o in f.orders))
    md = ["| configuration | seed | machine | " + " | ".join(orders) + " | range | range with uncommitted runs |",
          "| --- | --- | --- |" + " --- |" * (len(orders) + 2)]
    summary = ["| configuration | machine | floor: largest range (epochs) | with uncommitted runs | replicated seeds | "
               "float orders | largest range at |", "| --- | --- | --- | --- | --- | --- | --- |"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["configuration", "seed", "machine", "float order", "onset_095", "committed", "seed range",
                     "seed range with uncommitted", "floor"])
    for f in floors:
        for s in f.seeds:
            cells = [(_fmt(s.onsets[o]) + ("*" if o in s.uncommitted else "")) if o in s.onsets else "" for o in orders]
            md.append(f"| {f.configuration} | {s.seed} | {s.machine} | " + " | ".join(cells)
                      + f" | {_fmt(s.range)} | {_fmt(s.range_with_uncommitted)} |")
            for order, onset in s.onsets.items():
                writer.writerow([f.configuration, s.seed, s.machine, order, "" if onset is None else onset,
                                 int(order not in s.uncommitted), "" if s.range is None else s.range,
                                 "" if s.range_with_uncommitted is None else s.range_with_uncommitted,
                                 "" if f.floor is None else f.floor])
        widest = max(f.seeds, key=lambda s: -1 if s.range is None else s.range)
        summary.append(f"| {f.configuration} | {f.machine} | {_fmt(f.floor)} | {_fmt(f.floor_with_uncommitted)} | "
                       f"{len(f.seeds)} | {len(f.orders)} | {'-' if f.floor is None else f'seed {widest.seed}'} |")
    notes = ["range: the largest minus the smallest onset of a seed's replicates trained from a committed tree on one "
             "machine (a range over 2-4 replicates, not a half-width; it grows with their number); *: a run trained "
             "from an uncommitted tree or without a recorded commit, left out of the range and counted only in the "
             "range with uncommitted runs", *notes]
    md += [""] + [f"- {n}" for n in notes]
    paths = [folder / "noise_floor.md", folder / "floors.md", folder / "noise_floor.csv", folder / "noise_floor.json"]
    atomic_write_bytes(paths[0], ("\n".join(md) + "\n").encode())
    atomic_write_bytes(paths[1], ("\n".join(summary) + "\n").encode())
    atomic_write_bytes(paths[2], out.getvalue().encode())
    atomic_write_bytes(paths[3], floors_json(floors).encode())
    return paths
