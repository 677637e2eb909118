"""Markdown summary of analysed runs next to the paper's numbers (used for docs/results.md).

    python analyses/summarize_runs.py runs/fb_lr6e-4_seed1 runs/ln_lr6e-4_seed1

For each run: onset events, ms per epoch, and at the checkpoint nearest the onset and at the final
checkpoint: key frequencies (keyfreq_wl_fft), fve_paper U/V per key, truncated-logit accuracy and
the Clock/Pizza reading. Runs must have been analysed (`geolens analyze --run DIR`).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from geolens.analysis.clockpizza import VERDICT_CODES
from geolens.run import load_run
from geolens.trajectory import analyze_run

REFERENCE = Path(__file__).resolve().parents[2] / "shared" / "reference" / "paper_tables.json"
METRICS = ["loss", "keyfreq_wl_fft", "fve_paper", "truncated_logit_acc", "grad_symmetricity", "distance_irrelevance",
           "clock_pizza"]


def verdict(code: float) -> str:
    return next(n for n, c in VERDICT_CODES.items() if c == code or (c != c and code != code))


def at_step(values: dict, step: int) -> str:
    v = values[step]
    keys = [int(v["keyfreq_wl_fft"][f"keyfreq_wl_fft_{r}"]) for r in range(1, 6)]
    fve = v["fve_paper"]
    per_key = ", ".join(f"{k}: {fve[f'fve_paper_U_{r}']:.1f} / {fve[f'fve_paper_V_{r}']:.1f}" for r, k in enumerate(keys, 1))
    return (f"| {step} | {v['loss']['acc_test']:.4f} | {', '.join(map(str, keys))} | {per_key} | "
            f"{fve['fve_paper_U_max']:.1f} / {fve['fve_paper_V_max']:.1f} | {v['truncated_logit_acc']['truncated_logit_acc']:.4f} | "
            f"{verdict(v['clock_pizza']['clock_pizza'])} ({v['grad_symmetricity']['grad_symmetricity']:.3f}, "
            f"{v['distance_irrelevance']['distance_irrelevance']:.3f}) |")


def main(paths: list[str]) -> None:
    ref = json.loads(REFERENCE.read_text()) if REFERENCE.exists() else None
    for path in paths:
        run = load_run(path)
        cfg, ev = run.config, run.events
        traj = analyze_run(run, METRICS, progress=False)
        print(f"### {path}: preset {cfg.preset}, lr {cfg.lr}, seed {cfg.seed}, p = {cfg.p}\n")
        print(f"onset (test acc > 0.95): epoch {ev.get('onset_095')}; stays >= 0.99 from epoch {ev.get('sustained_099')} "
              f"(evaluated every {ev.get('eval_every')} epochs); {run.header['timing']['ms_per_epoch']:.1f} ms per epoch "
              f"({run.header['engine']} engine)\n")
        print("| checkpoint | test acc | key frequencies | fve_paper U / V % per key | U / V max | truncated-logit acc | "
              "clock/pizza (grad sym, dist irr) |")
        print("| --- | --- | --- | --- | --- | --- | --- |")
        onset = ev.get("onset_095")
        for step in sorted({run.nearest_step(onset), run.steps[-1]} if onset is not None else {run.steps[-1]}):
            print(at_step(traj.values, step))
        print()
    if ref:
        print("Paper (spectral section 4.3, seed 42 at first test acc >= 0.99):",
              json.dumps(ref["spectral_section4_3"]["fve_percent"]),
              "truncated-logit accuracy", json.dumps(ref["spectral_section4_3"]["truncated_logit_accuracy"]))


if __name__ == "__main__":
    main(sys.argv[1:])
