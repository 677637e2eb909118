"""The tables of docs/interventions.md from the records of analyses/interventions/run_cpu.sh.

    python analyses/interventions/summarize.py [RECORDS] [OUT] [FLOORS]
        (defaults results/interventions, the same, results/noise_floor/noise_floor.json)

Writes OUT/tables/parents.md (the parents' onsets) and OUT/tables/<experiment>.md for each experiment
(the first folder level under RECORDS): one row per change and fork step with every seed's arm onset,
the epochs from the fork to that onset and the shift against the parent's own onset (arm onset_095
minus the parent's), with the median shift over the seeds that have one, the sign test of the shifts
across seeds (Holm-corrected over every sign test of the tables: one family) and how many shifts lie beyond the
float-order noise floor of the parent's configuration on the machine the arm trained on after its fork (FLOORS,
written by `geolens noise-floor`; geolens.analysis.noise_floor: the largest range of committed replicates; a
machine without one is named, never given another machine's); then, for a change forked at several steps, one row
pooling them: the sign test of each seed's mean shift over its steps (the steps of one seed share its parent's
onset, so they are not independent shifts) and how many of all the seed-step shifts lie beyond the floor. An arm
without an onset shows its last epoch and its peak test accuracy after the fork. Each table's notes say which of
its records were trained from an uncommitted tree or name no commit: after the fork (the arm's own segments) or
before it (segments inherited from the parent). Two tables compare arms with other runs of the same seed rather
than with their parent: OUT/tables/pairs.md, the two changes of an experiment forked from one parent at one step
(the first change's onset minus the second's, per seed; judged against the parent configuration's floor), and
OUT/tables/against_fresh.md, the arms of an experiment in FRESH against the parents of another configuration
trained from scratch (arm onset minus that run's, per seed; judged against that configuration's floor; with the
one-sided exact Mann-Whitney p that the arms grok earlier, Holm-corrected over that table's tests). OUT/tables.md
holds them all. docs/interventions.md embeds them (analyses/reproduction/embed_tables.py).
"""

from __future__ import annotations

import statistics
import sys
from pathlib import Path

from geolens.analysis.noise_floor import MachineFloor, committed, machine_name, read_floors
from geolens.analysis.significance import fmt_p, holm, sign_test, smaller_than
from geolens.outputs.figures import change_label, find_parent
from geolens.runs.runset import config_name, find_runs, group_key


def onset(run) -> int | None:
    return run.events.get("onset_095")


def fmt(x: int | None) -> str:
    return "-" if x is None else f"{x:,}"


HOLM = "{holm}"  # where a sign test's Holm-corrected p-value goes, once every table's tests are known

#: experiment -> the configuration (config_name) whose runs from scratch its arms are compared with, seed by seed
FRESH = {"reverse": "ln"}


def beyond_cell(shifts: list[tuple[float, str]], key: str, floors: dict[tuple[str, str], MachineFloor]) -> str:
    """How many shifts (shift, machine the arm trained on) exceed the floor of the parent's configuration (key) on
    their machine, one clause per machine: '2/3 beyond 1,410 (MACHINE)'; a machine without a floor of committed
    replicates says so, with the range its uncommitted replicates give where there is one."""
    parts = []
    for machine in dict.fromkeys(m for _, m in shifts):
        xs = [x for x, m in shifts if m == machine]
        f = floors.get((key, machine), MachineFloor(None, None))
        if f.floor is not None:
            parts.append(f"{sum(abs(x) > f.floor for x in xs)}/{len(xs)} beyond {f.floor:,} ({machine})")
        elif f.with_uncommitted is not None:
            parts.append(f"no floor of committed runs on {machine}; {sum(abs(x) > f.with_uncommitted for x in xs)}/"
                         f"{len(xs)} beyond its range with uncommitted runs, {f.with_uncommitted:,}")
        else:
            parts.append(f"no floor measured on {machine}")
    return "; ".join(parts)


def sign_cell(shifts: list[float]) -> tuple[str, float | None]:
    """('3-/0+ (p 0.25, Holm {holm})', p): the sign test of the shifts, its corrected p filled in later."""
    neg, pos, p = sign_test(shifts)
    return f"{neg}-/{pos}+ (p {fmt_p(p)}, Holm {HOLM})", p


def same_machine(a: str, b: str) -> str:
    """The machine two compared runs trained on: one name, or 'A against B' (which no floor covers)."""
    return a if a == b else f"{a} against {b}"


def difference_rows(lead: str, per_seed: dict[int, list[tuple[int, str]]], seeds: list[int], key: str,
                    floors: dict[tuple[str, str], MachineFloor], pvalues: list[float | None]) -> list[str]:
    """Rows of a table of per-seed differences (difference, machine) at one step each, or at several: then each
    seed's cell is its mean over them, and the sign test is of those means (the steps of one seed share its runs).
    `lead`: the row's first cells; the sign test's p goes into `pvalues` (one family with the experiments' tables);
    beyond the noise floor: every difference against the floor of configuration `key` on its machine."""
    every = [d for ds in per_seed.values() for d in ds]
    if not every:
        return []
    means = {s: statistics.fmean(x for x, _ in ds) for s, ds in per_seed.items() if ds}
    cell, p = sign_cell(list(means.values()))
    pvalues.append(p)
    return [f"| {lead} | " + " | ".join(f"{means[s]:+,.0f}" if s in means else "" for s in seeds)
            + f" | {statistics.median(x for x, _ in every):+,.0f} | {cell} | {beyond_cell(every, key, floors)} |"]


def pairs_table(arms: dict, floors: dict[tuple[str, str], MachineFloor], pvalues: list[float | None]) -> str | None:
    """The two changes of an experiment forked from one parent at one step, seed by seed: the first change's onset
    minus the second's (in the tables' order), its median, sign test and how many differences exceed the parent
    configuration's floor on the arms' machine; with a row pooling the steps where the pair was forked at several.
    None where no experiment has such a pair."""
    lines, seeds = [], sorted({s for e in arms.values() for v in e.values() for s in v})
    for experiment in sorted(arms):
        at: dict[tuple, dict[str, dict[int, tuple]]] = {}
        for (parent, change, step, key), by_seed in arms[experiment].items():
            at.setdefault((parent, step, key), {})[change] = by_seed
        pooled: dict[tuple, dict[int, list[tuple[int, str]]]] = {}
        for (parent, step, key), changes in sorted(at.items(), key=lambda kv: kv[0][1]):
            if len(changes) != 2:
                continue
            (a, va), (b, vb) = sorted(changes.items())
            diffs = {s: [(va[s][0] - vb[s][0], same_machine(va[s][6], vb[s][6]))] for s in seeds
                     if s in va and s in vb and va[s][0] is not None and vb[s][0] is not None}
            lines += difference_rows(f"{experiment} | {parent} | {a} minus {b} | {step:,}", diffs, seeds, key, floors, pvalues)
            for s, ds in diffs.items():
                pooled.setdefault((parent, a, b, key), {}).setdefault(s, []).extend(ds)
        for (parent, a, b, key), per_seed in pooled.items():
            if sum(map(len, per_seed.values())) > len(per_seed):
                lines += difference_rows(f"{experiment} | {parent} | {a} minus {b} | all steps, mean per seed", per_seed,
                                         seeds, key, floors, pvalues)
    if not lines:
        return None
    return "\n".join(["| experiment | parent | difference | fork step | " + " | ".join(f"seed {s}" for s in seeds) +
                      " | median difference | sign test | beyond the noise floor |",
                      "| --- | --- | --- | --- | " + " | ".join("---" for _ in seeds) + " | --- | --- | --- |"] + lines)


def fresh_table(arms: dict, parents: list, fresh: dict[str, str], floors: dict[tuple[str, str], MachineFloor],
                pvalues: list[float | None]) -> str | None:
    """The arms of each experiment in `fresh` against the runs from scratch (parents) of the configuration it
    names, seed by seed: arm onset minus that run's, its median, sign test, how many differences exceed that
    configuration's floor on the arms' machine, and the one-sided exact Mann-Whitney p that the arms grok earlier
    than those runs (significance.smaller_than; an arm without an onset ranks last), Holm-corrected over this
    table's Mann-Whitney tests. None where no experiment has such runs."""
    rows, mann_whitney = [], []
    seeds = sorted({s for e in fresh if e in arms for v in arms[e].values() for s in v})
    for experiment, name in fresh.items():
        scratch = {r.config.seed: r for r in parents if config_name(r.config) == name}
        if experiment not in arms or not scratch:
            continue
        key = group_key(next(iter(scratch.values())).config)
        for (parent, change, step, _), by_seed in sorted(arms[experiment].items(), key=lambda kv: (kv[0][1], kv[0][2])):
            diffs = {s: [(v[0] - onset(scratch[s]), same_machine(v[6], machine_name(scratch[s])))]
                     for s, v in by_seed.items() if s in scratch and v[0] is not None and onset(scratch[s]) is not None}
            row = difference_rows(f"{experiment} | {parent}: {change} | {name} from scratch | {step:,}", diffs, seeds,
                                  key, floors, pvalues)
            if row:
                mann_whitney.append(smaller_than([v[0] for v in by_seed.values()], [onset(r) for r in scratch.values()]))
                rows.append(row[0])
    if not rows:
        return None
    rows = [f"{r} {fmt_p(p)} ({fmt_p(adjusted)}) |" for r, p, adjusted in zip(rows, mann_whitney, holm(mann_whitney))]
    return "\n".join(["| experiment | arm | against | fork step | " + " | ".join(f"seed {s}" for s in seeds) +
                      " | median difference | sign test | beyond the noise floor | earlier: Mann-Whitney p (Holm) |",
                      "| --- | --- | --- | --- | " + " | ".join("---" for _ in seeds) + " | --- | --- | --- | --- |"] + rows)


def provenance(arms: list, parents: list) -> list[str]:
    """Notes on the code that trained a table's records: arms whose own segments (from the fork on) or whose
    inherited segments (the parent's, before the fork) were trained from an uncommitted tree or name no commit."""
    def bad(segments: list[dict]) -> bool:
        return any(not s.get("geolens_commit") or s["geolens_commit"].endswith("+dirty") for s in segments)

    own, inherited = 0, 0
    for r in arms:
        step = r.header["fork"]["step"]
        segments = r.header.get("segments") or []
        if bad([s for s in segments if s.get("from_epoch", 0) >= step]) or not segments:
            own += 1
        elif bad([s for s in segments if s.get("from_epoch", 0) < step]):
            inherited += 1
    notes = []
    if own:
        notes.append(f"provenance: {own} of {len(arms)} arms were trained after their fork from an uncommitted tree or "
                     "name no commit: their code is not exactly any commit's")
    if inherited:
        notes.append(f"provenance: {inherited} of {len(arms)} arms trained from a committed tree after their fork but "
                     "inherit epochs before it from a parent trained from an uncommitted tree (run.json segments)")
    dirty_parents = [r for r in parents if not committed(r)]
    if dirty_parents:
        notes.append(f"provenance: {len(dirty_parents)} of {len(parents)} parents were trained from an uncommitted tree "
                     "or name no commit")
    return notes


def summarize(records: Path, floors: dict[tuple[str, str], MachineFloor], fresh: dict[str, str] = FRESH) -> dict[str, str]:
    """{name: Markdown table with its notes}: 'parents', then one per experiment, then 'pairs' and 'against_fresh'
    where there are such comparisons (floors: read_floors, by (group_key, machine); fresh: as FRESH)."""
    runs, _ = find_runs(records)
    parents = sorted((r for r in runs if r.header.get("fork") is None),
                     key=lambda r: (config_name(r.config), r.config.seed))
    tables = {"parents": "\n".join(
        ["| configuration | seed | onset_095 | sustained_099 | budget |", "| --- | --- | --- | --- | --- |"] +
        [f"| {config_name(r.config)} wd {r.config.weight_decay:g} | {r.config.seed} | {fmt(onset(r))} | "
         f"{fmt(r.events.get('sustained_099'))} | {r.config.epochs:,} |" for r in parents])}
    if notes := provenance([], parents):
        tables["parents"] += "\n\nNotes:\n\n" + "\n".join(f"- {n}" for n in notes)
    arms: dict[str, dict[tuple[str, str, int, str], dict[int, tuple]]] = {}
    arm_runs: dict[str, list] = {}
    for r in runs:
        fork = r.header.get("fork")
        if fork is None:
            continue
        parent = find_parent(fork, runs)
        experiment = r.path.relative_to(records).parts[0]
        arm_runs.setdefault(experiment, []).append(r)
        key = (config_name(parent.config) if parent else "?", change_label(fork), fork["step"],
               group_key(parent.config) if parent else "?")
        shift = None if parent is None or None in (onset(r), onset(parent)) else onset(r) - onset(parent)
        peak = max(row["test_acc"] for row in r.metrics if row["epoch"] >= fork["step"])
        arms.setdefault(experiment, {}).setdefault(key, {})[r.config.seed] = (
            onset(r), None if onset(r) is None else onset(r) - fork["step"], shift, onset(parent) if parent else None,
            r.metrics[-1]["epoch"], peak, machine_name(r, fork["step"]))
    pvalues: list[float | None] = []  # every sign test of the tables, in the order their HOLM marks appear
    for experiment in sorted(arms):
        seeds = sorted({s for v in arms[experiment].values() for s in v})
        lines = ["| parent | change | fork step | " + " | ".join(f"seed {s}" for s in seeds) +
                 " | median shift | arms with an onset | sign test | beyond the noise floor |",
                 "| --- | --- | --- | " + " | ".join("---" for _ in seeds) + " | --- | --- | --- | --- |"]
        pooled: dict[tuple, dict[int, list[tuple[int, str]]]] = {}
        for (parent, change, step, key), by_seed in sorted(arms[experiment].items(), key=lambda kv: (kv[0][1], kv[0][2])):
            cells = []
            for s in seeds:
                if s not in by_seed:
                    cells.append("")
                    continue
                o, since, shift, p_onset, last, peak, _ = by_seed[s]
                cells.append(f"{fmt(o)} / {fmt(since)} / {'-' if shift is None else f'{shift:+,}'} ({fmt(p_onset)})"
                             if o is not None else f"none by {last:,}, peak test acc {peak:.2f} ({fmt(p_onset)})")
            shifts = [(v[2], v[6]) for v in by_seed.values() if v[2] is not None]
            for seed, v in by_seed.items():
                if v[2] is not None:
                    pooled.setdefault((parent, change, key), {}).setdefault(seed, []).append((v[2], v[6]))
            median = f"{statistics.median(x for x, _ in shifts):+,.0f}" if shifts else "-"
            tested = "- | -"
            if shifts:
                cell, p = sign_cell([x for x, _ in shifts])
                pvalues.append(p)
                tested = f"{cell} | {beyond_cell(shifts, key, floors)}"
            lines.append(f"| {parent} | {change} | {step:,} | " + " | ".join(cells) +
                         f" | {median} | {sum(v[0] is not None for v in by_seed.values())}/{len(by_seed)} | {tested} |")
        for (parent, change, key), by_seed_shifts in pooled.items():
            every = [x for xs in by_seed_shifts.values() for x in xs]
            if len(every) > len(by_seed_shifts):  # more than one fork step: each seed's mean over its steps
                means = {seed: statistics.fmean(x for x, _ in xs) for seed, xs in by_seed_shifts.items()}
                cell, p = sign_cell(list(means.values()))
                pvalues.append(p)
                lines.append(f"| {parent} | {change} | all steps, mean per seed | "
                             + " | ".join(f"{means[s]:+,.0f}" if s in means else "" for s in seeds)
                             + f" | {statistics.median(x for x, _ in every):+,.0f} | | {cell} | "
                             f"{beyond_cell(every, key, floors)} |")
        text = "\n".join(lines)
        if notes := provenance(arm_runs[experiment], []):
            text += "\n\nNotes:\n\n" + "\n".join(f"- {n}" for n in notes)
        tables[experiment] = text
    if text := pairs_table(arms, floors, pvalues):
        tables["pairs"] = text
    if text := fresh_table(arms, parents, fresh, floors, pvalues):
        tables["against_fresh"] = text
    corrected = iter(holm(pvalues))
    for name, text in tables.items():
        while HOLM in text:
            text = text.replace(HOLM, fmt_p(next(corrected)), 1)
        tables[name] = text
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
              f"parent's onset), Holm-corrected over every sign test of these tables (one family). Beyond the noise "
              f"floor: shifts larger than the float-order floor of the parent's configuration on the machine the arm "
              f"trained on after its fork ({floors_file}, `geolens noise-floor`: the largest range of one seed's "
              f"replicates trained from a committed tree on that machine), over every seed-step; a machine without "
              f"such a floor is named, with the range its uncommitted replicates give, and no other machine's floor "
              f"stands in for it. pairs: two changes forked from one parent at one step, the first's onset minus the "
              f"second's per seed (same sign test family; the parent configuration's floor). against_fresh: an "
              f"experiment's arms against the runs from scratch of another configuration, arm onset minus that run's "
              f"per seed (that configuration's floor), with the one-sided exact Mann-Whitney p that the arms grok "
              f"earlier, Holm-corrected over that table's Mann-Whitney tests.")
    text = "\n\n".join([f"# Interventions: onsets\n\nRecords: `{records}`. {legend}"] +
                         [f"## {name}\n\n{table}" for name, table in tables.items()]) + "\n"
    (out / "tables.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main(sys.argv[1:])
