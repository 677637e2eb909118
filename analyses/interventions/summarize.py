"""The tables of docs/interventions.md from the records of analyses/interventions/run_cpu.sh.

    python analyses/interventions/summarize.py [RECORDS] [OUT] [FLOORS]
        (defaults results/interventions, the same, results/noise_floor/noise_floor.json)

Writes OUT/tables/parents.md (the parents' onsets) and OUT/tables/<experiment>.md for each experiment
(the first folder level under RECORDS): one row per change and fork step with every seed's arm onset,
the epochs from the fork to that onset and the shift against the parent's own onset (arm onset_095
minus the parent's), with the median shift over the seeds that have one, the sign test of the shifts
across seeds and how many shifts lie beyond the float-order noise floor of the parent's configuration
(FLOORS, written by `geolens noise-floor`; geolens.analysis.noise_floor); then, for a change forked at
several steps, one row pooling them: the sign test of each seed's mean shift over its steps (the steps
of one seed share its parent's onset, so they are not independent shifts) and how many of all the
seed-step shifts lie beyond the floor. An arm without an onset shows its last epoch and its
peak test accuracy after the fork. OUT/tables.md holds them all. docs/interventions.md embeds them
(analyses/reproduction/embed_tables.py).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from geolens.analysis.noise_floor import read_floors
from geolens.analysis.significance import fmt_p, sign_test
from geolens.outputs.figures import change_label, find_parent
from geolens.runs.runset import config_name, find_runs, group_key


def onset(run) -> int | None:
    return run.events.get("onset_095")


def fmt(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


def shift_cells(shifts: list[float], floor: int | None, beyond: list[float] | None = None) -> str:
    """'3-/0+ (p 0.25) | 2/3 beyond ±410': the sign test of the shifts and how many of `beyond` (default:
    the shifts) exceed the floor."""
    neg, pos, p = sign_test(shifts)
    beyond = shifts if beyond is None else beyond
    exceed = "-" if floor is None else f"{sum(abs(x) > floor for x in beyond)}/{len(beyond)} beyond ±{floor:,}"
    return f"{neg}-/{pos}+ (p {fmt_p(p)}) | {exceed}"


def summarize(records: Path, floors: dict[str, int | None]) -> dict[str, str]:
    """{name: Markdown table}: 'parents', then one per experiment (floors: read_floors, by group_key)."""
    runs, _ = find_runs(records)
    parents = sorted((r for r in runs if r.header.get("fork") is None),
                     key=lambda r: (config_name(r.config), r.config.seed))
    tables = {"parents": "\n".join(
        ["| configuration | seed | onset_095 | sustained_099 | budget |", "| --- | --- | --- | --- | --- |"] +
        [f"| {config_name(r.config)} wd {r.config.weight_decay:g} | {r.config.seed} | {fmt(onset(r))} | "
         f"{fmt(r.events.get('sustained_099'))} | {r.config.epochs:,} |" for r in parents])}
    arms: dict[str, dict[tuple[str, str, int], dict[int, tuple]]] = {}
    for r in runs:
        fork = r.header.get("fork")
        if fork is None:
            continue
        parent = find_parent(fork, runs)
        experiment = r.path.relative_to(records).parts[0]
        key = (config_name(parent.config) if parent else "?", change_label(fork), fork["step"],
               floors.get(group_key(parent.config)) if parent else None)
        shift = None if parent is None or None in (onset(r), onset(parent)) else onset(r) - onset(parent)
        peak = max(row["test_acc"] for row in r.metrics if row["epoch"] >= fork["step"])
        arms.setdefault(experiment, {}).setdefault(key, {})[r.config.seed] = (
            onset(r), None if onset(r) is None else onset(r) - fork["step"], shift, onset(parent) if parent else None,
            r.metrics[-1]["epoch"], peak)
    for experiment in sorted(arms):
        seeds = sorted({s for v in arms[experiment].values() for s in v})
        lines = ["| parent | change | fork step | " + " | ".join(f"seed {s}" for s in seeds) +
                 " | median shift | arms with an onset | sign test | beyond the noise floor |",
                 "| --- | --- | --- | " + " | ".join("---" for _ in seeds) + " | --- | --- | --- | --- |"]
        pooled: dict[tuple, dict[int, list[int]]] = {}
        for (parent, change, step, floor), by_seed in sorted(arms[experiment].items(), key=lambda kv: (kv[0][1], kv[0][2])):
            cells = []
            for s in seeds:
                if s not in by_seed:
                    cells.append("")
                    continue
                o, since, shift, p_onset, last, peak = by_seed[s]
                cells.append(f"{fmt(o)} / {fmt(since)} / {'-' if shift is None else f'{shift:+,}'} ({fmt(p_onset)})"
                             if o is not None else f"none by {last:,}, peak test acc {peak:.2f} ({fmt(p_onset)})")
            shifts = [v[2] for v in by_seed.values() if v[2] is not None]
            for seed, v in by_seed.items():
                if v[2] is not None:
                    pooled.setdefault((parent, change, floor), {}).setdefault(seed, []).append(v[2])
            median = f"{statistics.median(shifts):+,.0f}" if shifts else "-"
            lines.append(f"| {parent} | {change} | {step:,} | " + " | ".join(cells) +
                         f" | {median} | {sum(v[0] is not None for v in by_seed.values())}/{len(by_seed)} | "
                         f"{shift_cells(shifts, floor) if shifts else '- | -'} |")
        for (parent, change, floor), by_seed_shifts in pooled.items():
            every = [x for xs in by_seed_shifts.values() for x in xs]
            if len(every) > len(by_seed_shifts):  # more than one fork step: each seed's mean over its steps
                means = {seed: statistics.fmean(xs) for seed, xs in by_seed_shifts.items()}
                lines.append(f"| {parent} | {change} | all steps, mean per seed | "
                             + " | ".join(f"{means[s]:+,.0f}" if s in means else "" for s in seeds)
                             + f" | {statistics.median(every):+,.0f} | | {shift_cells(list(means.values()), floor, every)} |")
        tables[experiment] = "\n".join(lines)
    return tables


def main(argv: list[str]) -> None:
    records = Path(argv[0]) if argv else Path("results/interventions")
    out = Path(argv[1]) if len(argv) > 1 else records
    floors_file = Path(argv[2]) if len(argv) > 2 else Path("results/noise_floor/noise_floor.json")
    floors = read_floors(floors_file.read_text()) if floors_file.exists() else {}
    tables = summarize(records, floors)
    (out / "tables").mkdir(parents=True, exist_ok=True)
    for name, table in tables.items():
        (out / "tables" / f"{name}.md").write_text(table + "\n")
    legend = ("Per seed: arm onset / epochs from the fork to it / shift against the parent's onset (parent onset in "
              "brackets); an arm without an onset: its last epoch and its peak test accuracy after the fork. Sign test: "
              "negative/positive shifts and the two-sided binomial p-value (scipy.stats.binomtest; three seeds cannot go "
              f"below 0.25; a row of all steps tests each seed's mean shift, since the steps of one seed share its "
              f"parent's onset). Beyond the noise floor: shifts larger than the float-order floor of the parent's "
              f"configuration ({floors_file}, `geolens noise-floor`), over every seed-step.")
    text = "\n\n".join([f"# Interventions: onsets\n\nRecords: `{records}`. {legend}"] +
                         [f"## {name}\n\n{table}" for name, table in tables.items()]) + "\n"
    (out / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
