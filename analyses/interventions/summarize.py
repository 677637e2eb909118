"""The tables of docs/interventions.md from the records of analyses/interventions/run_cpu.sh.

    python analyses/interventions/summarize.py [RECORDS] [OUT]    (default results/interventions, same)

Writes OUT/tables.md: the parents' onsets, then per experiment (the first folder level under RECORDS)
one row per change and fork step with every seed's arm onset, the epochs from the fork to that onset,
and the shift against the parent's own onset (arm onset_095 minus the parent's; '-' where a run has no
onset within its budget), with the median shift over the seeds that have one.
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from geolens.outputs.figures import change_label, find_parent
from geolens.runs.runset import config_name, find_runs


def onset(run) -> int | None:
    return run.events.get("onset_095")


def fmt(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def summarize(records: Path) -> str:
    runs, _ = find_runs(records)
    parents = sorted((r for r in runs if r.header.get("fork") is None),
                     key=lambda r: (config_name(r.config), r.config.seed))
    lines = ["# Interventions: onsets", "", f"Records: `{records}` ({len(runs)} finished runs).", "",
             "## Parents (trained from scratch)", "", "| configuration | seed | onset_095 | sustained_099 | budget |",
             "| --- | --- | --- | --- | --- |"]
    for r in parents:
        lines.append(f"| {config_name(r.config)} wd {r.config.weight_decay:g} | {r.config.seed} | {fmt(onset(r))} | "
                     f"{fmt(r.events.get('sustained_099'))} | {r.config.epochs:,} |")
    arms: dict[str, dict[tuple[str, str, int], dict[int, tuple]]] = {}
    for r in runs:
        fork = r.header.get("fork")
        if fork is None:
            continue
        parent = find_parent(fork, runs)
        experiment = r.path.relative_to(records).parts[0]
        key = (f"{config_name(parent.config)}" if parent else "?", change_label(fork), fork["step"])
        shift = None if parent is None or None in (onset(r), onset(parent)) else onset(r) - onset(parent)
        arms.setdefault(experiment, {}).setdefault(key, {})[r.config.seed] = (
            onset(r), None if onset(r) is None else onset(r) - fork["step"], shift, onset(parent) if parent else None,
            r.config.epochs)
    for experiment in sorted(arms):
        seeds = sorted({s for v in arms[experiment].values() for s in v})
        lines += ["", f"## {experiment}", "",
                  "Per seed: arm onset / epochs from the fork to it / shift against the parent's onset "
                  "(parent onset in brackets).", "",
                  "| parent | change | fork step | " + " | ".join(f"seed {s}" for s in seeds) + " | median shift | arms with an onset |",
                  "| --- | --- | --- | " + " | ".join("---" for _ in seeds) + " | --- | --- |"]
        for (parent, change, step), by_seed in sorted(arms[experiment].items(), key=lambda kv: (kv[0][1], kv[0][2])):
            cells = []
            for s in seeds:
                if s not in by_seed:
                    cells.append("")
                    continue
                o, since, shift, p_onset, budget = by_seed[s]
                cells.append(f"{fmt(o)} / {fmt(since)} / {'-' if shift is None else f'{shift:+,}'} ({fmt(p_onset)})"
                             if o is not None else f"none by {budget:,} ({fmt(p_onset)})")
            shifts = [v[2] for v in by_seed.values() if v[2] is not None]
            median = f"{statistics.median(shifts):+,.0f}" if shifts else "-"
            lines.append(f"| {parent} | {change} | {step:,} | " + " | ".join(cells) +
                         f" | {median} | {sum(v[0] is not None for v in by_seed.values())}/{len(by_seed)} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> None:
    records = Path(argv[0]) if argv else Path("results/interventions")
    out = Path(argv[1]) if len(argv) > 1 else records
    text = summarize(records)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
