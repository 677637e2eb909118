"""Disk sizes of a run directory under each storage policy (`keep`, docs/run-format.md "Storage policy").

Trains the paper's model (fb, p = 113) for 100 epochs with a checkpoint every 10 epochs under the default
policy and under `keep=all`, measures each kind of file (`du -b` of the files), and computes from those sizes
what a run of C checkpoints and R evaluations holds (default: the demo's 54 checkpoints and 271 evaluations,
docs/results.md). Writes OUT/sizes.md and OUT/sizes.json. With --run DIR it also measures that run directory
(the demo's, trained and analysed: `geolens demo --out DIR`) part by part, as `du -sb DIR` counts it, into
OUT/demo_run.md and OUT/demo_run.json.

    python benchmarks/bench_storage.py --out results/storage
    python benchmarks/bench_storage.py --out results/storage --checkpoints 23 --rows 220 --run runs/demo
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import tempfile
from pathlib import Path

import geolens
from geolens.model.schedule import DEFAULT_KEEP
from geolens.runs.storage import atomic_write_bytes, atomic_write_json, source_commit
from geolens.training.train import train

MB, MIB = 1e6, 1 << 20


def file_sizes(run: Path) -> dict:
    """Bytes per kind of file of a run directory: step_* and non-empty optim_* (mean), resume, metrics per row, the rest."""
    ckpt = run / "checkpoints"
    steps = [f.stat().st_size for f in ckpt.glob("step_*.safetensors")]
    optims = [f.stat().st_size for f in ckpt.glob("optim_*.safetensors") if not f.name.endswith("0000000.safetensors")]
    rows = len((run / "metrics.csv").read_text().splitlines()) - 1
    small = sum(f.stat().st_size for f in run.rglob("*") if f.is_file() and not f.name.startswith(".")
                and f.suffix != ".safetensors" and f.name != "metrics.csv")
    return {"step": statistics.mean(steps), "optim": statistics.mean(optims) if optims else 0.0,
            "optim_files": len(optims), "optim0": (ckpt / "optim_0000000.safetensors").stat().st_size,
            "resume": (run / "resume.safetensors").stat().st_size,
            "metrics_row": (run / "metrics.csv").stat().st_size / rows, "small": small,
            "total": sum(f.stat().st_size for f in run.rglob("*") if f.is_file() and not f.name.startswith("."))}


def estimate(sizes: dict, checkpoints: int, rows: int, full: int) -> float:
    """Bytes of a run with `checkpoints` checkpoints, `rows` evaluations and `full` non-empty optim_* files."""
    return (checkpoints * sizes["step"] + full * sizes["optim"] + sizes["optim0"] + sizes["resume"]
            + rows * sizes["metrics_row"] + sizes["small"])


#: the parts of a run directory, each file counted in the first part whose pattern matches its whole path (the rest,
#: and hidden files: OTHER)
PARTS = (("`checkpoints/step_*.safetensors` (weights)", "checkpoints/step_*.safetensors"),
         ("`checkpoints/optim_*.safetensors` (optimizer state)", "checkpoints/optim_*.safetensors"),
         ("`checkpoints/manifest.json`", "checkpoints/manifest.json"),
         ("`resume.safetensors` (the newest full state)", "resume.safetensors"),
         ("`metrics.csv`, `events.json`, `run.json`", "*.*"),
         ("`analysis/plotly.min.js` (shared by the report and the explorer)", "analysis/plotly.min.js"),
         ("`analysis/report.html`", "analysis/report.html"),
         ("`analysis/figures/` (PNG and SVG)", "analysis/figures/*"),
         ("`analysis/explorer/` (index.html, explorer.js, data.js)", "analysis/explorer/*"),
         ("`analysis/metrics.csv`", "analysis/metrics.csv"),
         ("`analysis/cache/` (one JSON per checkpoint)", "analysis/cache/*"))
OTHER = "other files (the writers' lock files)"
BANNER = b"* plotly.js v"  # plotly.min.js's first lines


def run_parts(run: Path) -> dict:
    """Bytes and file count of each part of a run directory (PARTS), `du -sb` of the whole, the folders' own share
    (what du counts beyond the files), how many files hold plotly.js, the checkpoints."""
    files = sorted(f for f in run.rglob("*") if f.is_file())
    parts = {label: {"files": 0, "bytes": 0} for label, _ in (*PARTS, (OTHER, ""))}
    for f in files:
        rel = f.relative_to(run)
        label = next((label for label, pattern in PARTS if not rel.name.startswith(".")
                      and len(rel.parts) == pattern.count("/") + 1 and rel.match(pattern)),
                     OTHER)
        parts[label]["files"] += 1
        parts[label]["bytes"] += f.stat().st_size
    du = int(subprocess.run(["du", "-sb", str(run)], capture_output=True, text=True, check=True).stdout.split()[0])
    header = json.loads((run / "run.json").read_text())
    return {"parts": {k: v for k, v in parts.items() if v["files"]}, "du_sb": du,
            "folders": du - sum(f.stat().st_size for f in files),
            "plotly_copies": sum(BANNER in f.read_bytes()[:200_000] for f in files),
            "checkpoints": parts[PARTS[0][0]]["files"], "schedule": header["config"]["checkpoints"],
            "final_epoch": json.loads((run / "events.json").read_text()).get("final_epoch"),
            "trained_at": [s.get("geolens_commit") for s in header.get("segments", [])]}


def run_table(m: dict, command: str) -> str:
    lines = ["| part of the run directory | files | bytes |", "| --- | --- | --- |"]
    lines += [f"| {label} | {v['files']} | {v['bytes']:,} |" for label, v in m["parts"].items()]
    lines += [f"| the folders themselves (what `du` counts beyond the files) | | {m['folders']:,} |",
              f"| **`du -sb`** | | **{m['du_sb']:,}** ({m['du_sb'] / MB:.1f} MB, {m['du_sb'] / MIB:.1f} MiB) |",
              "", f"`{command}`: {m['checkpoints']} checkpoints (`{m['schedule']}`, final epoch {m['final_epoch']:,}), "
              f"files holding plotly.js: {m['plotly_copies']}; trained at geolens {', '.join(c or 'unknown' for c in m['trained_at'])}."]
    return "\n".join(lines) + "\n"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--checkpoints", type=int, default=54, help="checkpoints of the run to estimate (the demo's)")
    ap.add_argument("--rows", type=int, default=271, help="evaluations of the run to estimate (the demo's)")
    ap.add_argument("--run", type=Path, help="also measure this run directory part by part (OUT/demo_run.md)")
    args = ap.parse_args()
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for keep in (DEFAULT_KEEP, "all"):
            cfg = geolens.make_config("fb", p=113, epochs=100, checkpoints="every:10", keep=keep, seed=1, data_seed=1)
            train(cfg, Path(tmp) / keep.replace(":", "_"), progress=False)
            measured[keep] = file_sizes(Path(tmp) / keep.replace(":", "_"))
    base = measured["all"]
    demo = {keep: estimate(base, args.checkpoints, args.rows, full)
            for keep, full in ((DEFAULT_KEEP, 0), ("all", args.checkpoints - 1))}
    lines = ["| file (fb, p = 113) | bytes |", "| --- | --- |",
             f"| `step_*.safetensors` (weights) | {base['step']:,.0f} |",
             f"| `optim_*.safetensors` (AdamW state, after epoch 0) | {base['optim']:,.0f} |",
             f"| `resume.safetensors` (weights and AdamW state) | {base['resume']:,.0f} |",
             f"| `metrics.csv`, per evaluation | {base['metrics_row']:,.0f} |"]
    for keep, m in measured.items():
        lines.append(f"| a 100-epoch run, checkpoints every 10 (11), keep = `{keep}`: {m['optim_files']} optim files | "
                     f"{m['total']:,} |")
    for keep, size in demo.items():
        lines.append(f"| a run of {args.checkpoints} checkpoints and {args.rows} evaluations (the demo's), keep = "
                     f"`{keep}` | {size:,.0f} ({size / MB:.1f} MB, {size / MIB:.1f} MiB) |")
    commit = source_commit()
    lines += ["", f"`python benchmarks/bench_storage.py --out {args.out} --checkpoints {args.checkpoints} --rows {args.rows}` "
              f"(geolens {commit[:7] if commit else 'unknown'}; "
              f"under `{DEFAULT_KEEP}` a run shorter than 5,000 epochs keeps no optimizer state besides epoch 0's "
              "and the resume state)."]
    args.out.mkdir(parents=True, exist_ok=True)
    atomic_write_bytes(args.out / "sizes.md", ("\n".join(lines) + "\n").encode())
    atomic_write_json(args.out / "sizes.json", {"commit": commit, "measured": measured, "estimate": demo,
                                                "checkpoints": args.checkpoints, "rows": args.rows})
    print("\n".join(lines))
    if args.run is not None:
        parts = run_parts(args.run)
        table = run_table(parts, f"geolens demo --out {args.run}; du -sb {args.run}")
        atomic_write_bytes(args.out / "demo_run.md", table.encode())
        atomic_write_json(args.out / "demo_run.json", {"commit": commit, "run": str(args.run), **parts})
        print(table)


if __name__ == "__main__":
    main()
