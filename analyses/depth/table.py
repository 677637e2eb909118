"""The depth and placement onset table of docs/depth.md, from the records analyses/depth/run_cpu.sh trains.

    python analyses/depth/table.py [RECORDS] [--out results/depth]   # depth_table.md, depth_tests.md

One row per configuration (preset, placement, per-layer norms, task), one column group per depth: the
onset (first evaluated epoch with test accuracy > 0.95, every evaluated epoch) mean ± std and range over the seeds
with an onset (outputs.stats.onset_cell), the seeds without an onset within their budget, and the paper's
one-layer row (Table 1, lr 6e-4) where one exists. Then the tests the verdicts of docs/depth.md rest on, exact
Mann-Whitney U tests (scipy.stats.mannwhitneyu) on the per-seed onsets, a seed without an onset ranked after every
onset (censored at its budget): one-sided for a question asked in one direction (does a configuration grok earlier
than LayerNorm at the same depth and placement, does the post-norm placement grok earlier than the same norms as
pre-norms, do the hybrids grok later than the all-sphere model), two-sided for one asked in both (which hybrid comes
first, does depth change a configuration's onset); Holm-corrected over every test of the table (one family). Then,
as a family of its own, whether a GPU's runs grok at other epochs than the CPU's within the configurations trained
on both (significance.differ_within, two-sided). Provenance notes (runset.found_runs) say which commits trained the
records.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from geolens.analysis.significance import differ_within, fmt_p, holm, onsets_differ, smaller_than
from geolens.outputs.paper import paper_tables
from geolens.outputs.stats import onset_cell
from geolens.outputs.tables import Rule
from geolens.runs.runset import found_runs, trained_on

RULE = Rule()  # test accuracy > 0.95, every evaluated epoch
PAPER_ROWS = {"ln_post": ("layernorm", 1.0), "sphere_post": ("bounded_sphere", 1.0), "fb_post": ("bounded_sphere", 0.0)}
ORDER = ["ln_post", "ln_pre", "rms_pre", "sphere_post", "fb_post", "sphere_pre", "sphere_ln_post", "ln_sphere_post"]
HYBRIDS = ["sphere_ln_post", "ln_sphere_post"]  # two layers, post-norm: the sphere in one layer, LayerNorm in the other


def config_key(cfg) -> str:
    """The run_cpu.sh name of a configuration: ln_post, sphere_pre, sphere_ln_post (a hybrid), ..."""
    if cfg.hybrid:
        return "_".join("ln" if n == "layernorm" else n for n in cfg.layer_norms) + f"_{cfg.norm_placement}"
    base = {"layernorm": "ln", "rmsnorm": "rms", "none": "none"}.get(cfg.norm, "fb" if cfg.weight_decay == 0 else "sphere")
    return f"{base}_{cfg.norm_placement}"


def device(run) -> str:
    """The kind of device of the run's first training segment (runset.trained_on; CPU when not recorded)."""
    return trained_on((run.header.get("segments") or [{}])[0]) or "CPU"


def collect(root: Path) -> tuple[dict[tuple[str, str, int], list[tuple[int | None, int]]],
                                 dict[tuple[str, str, int], list[str]], list[str]]:
    """{(task label, config key, n_layers): [(onset or None, final epoch) per seed]}, the same keys' devices
    (device() per seed) and the provenance notes."""
    runs, notes = found_runs(root)
    out: dict[tuple[str, str, int], list[tuple[int | None, int]]] = {}
    devices: dict[tuple[str, str, int], list[str]] = {}
    for run in sorted(runs, key=lambda r: (r.config.task_label, config_key(r.config), r.config.n_layers, r.config.seed)):
        if run.header.get("status") != "finished":
            continue
        cfg = run.config
        key = (cfg.task_label, config_key(cfg), cfg.n_layers)
        out.setdefault(key, []).append((RULE.onset(run.metrics), run.metrics[-1]["epoch"]))
        devices.setdefault(key, []).append(device(run))
    return out, devices, notes


def device_tests(data, devices) -> list[tuple[str, str, float | None]]:
    """(question, configurations, two-sided p) per GPU: do its runs grok at other epochs than the CPU's, within the
    configurations trained on both (significance.differ_within: one stratum per configuration, depth and task)."""
    rows = []
    for gpu in sorted({d for ds in devices.values() for d in ds} - {"CPU"}):
        strata = [([o for (o, _), d in zip(data[k], devices[k]) if d == gpu],
                   [o for (o, _), d in zip(data[k], devices[k]) if d == "CPU"])
                  for k in data if {gpu, "CPU"} <= set(devices[k])]
        runs = f"{len(strata)} ({sum(len(a) for a, _ in strata)} vs {sum(len(b) for _, b in strata)} runs)"
        rows.append((f"{gpu} runs and CPU runs differ", runs, differ_within(strata)))
    return rows


def cell(seeds: list[tuple[int | None, int]] | None) -> str:
    return onset_cell(seeds) if seeds else "-"


def earlier(a: list[tuple[int | None, int]], b: list[tuple[int | None, int]]) -> float | None:
    """One-sided Mann-Whitney U p-value that a's onsets come earlier than b's (significance.smaller_than;
    None when either has < 2 seeds)."""
    return smaller_than([o for o, _ in a], [o for o, _ in b])


def differ(a: list[tuple[int | None, int]], b: list[tuple[int | None, int]]) -> float | None:
    """Two-sided Mann-Whitney U p-value that a's and b's onsets differ (significance.onsets_differ)."""
    return onsets_differ([o for o, _ in a], [o for o, _ in b])


def with_holm(rows: list[tuple[str, ...]], ps: list[float | None]) -> list[str]:
    """Table lines: each row's cells, its p and its Holm-corrected p over the rows (one family)."""
    return [f"| {' | '.join(r)} | {fmt_p(p)} | {fmt_p(q)} |" for r, p, q in zip(rows, ps, holm(ps))]


def paper_cell(key: str) -> str:
    if key not in PAPER_ROWS:
        return "-"
    name, wd = PAPER_ROWS[key]
    row = next(r for r in paper_tables()["table1_zp_addition_p113"]["rows"]
               if r["config"] == name and r["wd"] == wd and r["lr"] == 6e-4)
    return f"{row['mean']:,} ± {row['std']:,}"


def build(root: Path) -> tuple[str, str]:
    """(the onset table with its notes, the table of tests), as Markdown."""
    data, devices, notes = collect(root)
    tasks = sorted({t for t, _, _ in data})
    lines = ["| task | configuration | 1 layer: onset mean ± std (range; seeds) | 2 layers | paper, 1 layer (Table 1, lr 6e-4) |",
             "| --- | --- | --- | --- | --- |"]
    for task in tasks:
        keys = sorted({k for t, k, _ in data if t == task}, key=lambda k: ORDER.index(k) if k in ORDER else 99)
        for key in keys:
            lines.append(f"| {task} | {key} | {cell(data.get((task, key, 1)))} | {cell(data.get((task, key, 2)))} | "
                         f"{paper_cell(key) if task == 'add p=113' else '-'} |")
    rows: list[tuple[str, ...]] = []
    ps: list[float | None] = []

    def test(task, question, layers, sided, p):
        rows.append((task, question, layers, sided))
        ps.append(p)

    for task in tasks:
        for layers in (1, 2):
            for placement in ("post", "pre"):
                ln = data.get((task, f"ln_{placement}", layers))
                for key in sorted({k for t, k, L in data if t == task and L == layers and k.endswith(placement)}):
                    if ln and key != f"ln_{placement}" and data.get((task, key, layers)):
                        test(task, f"{key} earlier than ln_{placement}", str(layers), "one",
                             earlier(data[(task, key, layers)], ln))
        for layers in (1, 2):  # the placement: post-norm earlier than the same norms as pre-norms
            for base in sorted({k.rsplit("_", 1)[0] for t, k, L in data if t == task and L == layers}):
                post, pre = data.get((task, f"{base}_post", layers)), data.get((task, f"{base}_pre", layers))
                if post and pre:
                    test(task, f"{base}_post earlier than {base}_pre", str(layers), "one", earlier(post, pre))
        sphere = data.get((task, "sphere_post", 2))  # the hybrids against the all-sphere model and each other
        hybrids = [k for k in HYBRIDS if data.get((task, k, 2))]
        for i, key in enumerate(hybrids):
            if sphere:
                test(task, f"sphere_post earlier than {key}", "2", "one", earlier(sphere, data[(task, key, 2)]))
            for other in hybrids[i + 1:]:
                test(task, f"{key} and {other} differ", "2", "two", differ(data[(task, key, 2)], data[(task, other, 2)]))
        for key in sorted({k for t, k, _ in data if t == task}):
            one, two = data.get((task, key, 1)), data.get((task, key, 2))
            if one and two:
                test(task, f"{key}: 1 and 2 layers differ", "2 vs 1", "two", differ(two, one))
    tested = sum(p is not None for p in ps)
    tests = [f"Exact Mann-Whitney U on the per-seed onsets (a seed without an onset ranks last); one-sided for a question "
             f"asked in one direction, two-sided for one asked in both; p (Holm): corrected over the {tested} tests of "
             f"this table (one family):", "",
             "| task | question | layers | sided | p | p (Holm) |", "| --- | --- | --- | --- | --- | --- |",
             *with_holm(rows, ps)]
    if device_rows := device_tests(data, devices):
        tests += ["", "Devices, a family of its own: two-sided stratified Mann-Whitney (a stratum per configuration trained",
                  "on both; a seed trains in another float order on each device, which should move onsets either way alike):",
                  "", "| question | configurations | p | p (Holm) |", "| --- | --- | --- | --- |",
                  *with_holm([(q, c) for q, c, _ in device_rows], [p for _, _, p in device_rows])]
    onsets = "\n".join(lines)
    if notes:
        onsets += "\n\nNotes:\n\n" + "\n".join(f"- {n}" for n in notes)
    return onsets + "\n", "\n".join(tests) + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("records", nargs="?", default="results/depth/records")
    ap.add_argument("--out", default="results/depth", help="folder for depth_table.md and depth_tests.md")
    args = ap.parse_args(argv)
    onsets, tests = build(Path(args.records))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "depth_table.md").write_text(onsets)
    (out / "depth_tests.md").write_text(tests)
    print(onsets + "\n" + tests, end="")


if __name__ == "__main__":
    sys.exit(main())
