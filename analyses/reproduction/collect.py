"""Copy the small records of every finished run under RUNS into RESULTS, keeping the relative layout:
run.json, metrics.csv and events.json (no checkpoints), so results outlive the machine.

    python analyses/reproduction/collect.py runs/table1_lr6e-4 results/table1_lr6e-4
"""

import json
import shutil
import sys
from pathlib import Path

RECORDS = ("run.json", "metrics.csv", "events.json")


def collect(src: Path, dest: Path) -> int:
    """Copy the records of finished runs under src to dest; returns how many runs were copied."""
    copied = 0
    for run_json in sorted(src.rglob("run.json")):
        hidden = any(part.startswith(".") for part in run_json.relative_to(src).parts)  # a run being built or swapped
        if hidden or json.loads(run_json.read_text()).get("status") != "finished":
            continue
        target = dest / run_json.parent.relative_to(src)
        target.mkdir(parents=True, exist_ok=True)
        for name in RECORDS:
            shutil.copy2(run_json.parent / name, target / name)
        copied += 1
    return copied


if __name__ == "__main__":
    src, dest = Path(sys.argv[1]), Path(sys.argv[2])
    print(f"{collect(src, dest)} finished runs copied from {src} to {dest}")
