"""`geolens noise-floor`: per configuration and seed, the onset of each float order and their spread,
and per configuration the floor (geolens.analysis.noise_floor), as Markdown, CSV and JSON."""

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
            notes.append(f"{f.configuration}: {len(f.lone)} seeds have one run on their machine (no spread): "
                         + ", ".join(f"{seed} on {machine}" for seed, machine in f.lone))
    if not floors:
        notes.append("no configuration and seed has two runs: nothing to compare (train one seed in two float orders)")
    return floors, notes


def _fmt(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def write_floor_tables(floors: list[Floor], notes: list[str], folder: Path) -> list[Path]:
    """folder/noise_floor.md (one row per configuration, seed and machine, a column per float order, the
    spread; then its notes), floors.md (one row per configuration: its floor, the seeds and float orders
    it rests on), noise_floor.csv (one row per run) and noise_floor.json (floors_json)."""
    folder.mkdir(parents=True, exist_ok=True)
    orders = list(dict.fromkeys(o for f in floors for o in f.orders))
    md = ["| configuration | seed | machine | " + " | ".join(orders) + " | spread |",
          "| --- | --- | --- |" + " --- |" * (len(orders) + 1)]
    summary = ["| configuration | floor (epochs) | replicated seeds | float orders | largest spread at |",
               "| --- | --- | --- | --- | --- |"]
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["configuration", "seed", "machine", "float order", "onset_095", "seed spread", "floor"])
    for f in floors:
        for s in f.seeds:
            md.append(f"| {f.configuration} | {s.seed} | {s.machine} | "
                      + " | ".join(_fmt(s.onsets[o]) if o in s.onsets else "" for o in orders) + f" | {_fmt(s.spread)} |")
            for order, onset in s.onsets.items():
                writer.writerow([f.configuration, s.seed, s.machine, order, "" if onset is None else onset,
                                 "" if s.spread is None else s.spread, "" if f.floor is None else f.floor])
        widest = max(f.seeds, key=lambda s: -1 if s.spread is None else s.spread)
        summary.append(f"| {f.configuration} | {_fmt(f.floor)} | {len(f.seeds)} | {len(f.orders)} | "
                       f"seed {widest.seed} on {widest.machine} |")
    md += [""] + [f"- {n}" for n in notes]
    paths = [folder / "noise_floor.md", folder / "floors.md", folder / "noise_floor.csv", folder / "noise_floor.json"]
    atomic_write_bytes(paths[0], ("\n".join(md) + "\n").encode())
    atomic_write_bytes(paths[1], ("\n".join(summary) + "\n").encode())
    atomic_write_bytes(paths[2], out.getvalue().encode())
    atomic_write_bytes(paths[3], floors_json(floors).encode())
    return paths
