"""Markdown summary of runs next to the paper's section 4.3 numbers (used for docs/results.md).

    python analyses/summarize_runs.py runs/fb_lr6e-4_seed1 runs/ln_lr6e-4_seed1

For each run: onset events, ms per epoch, and at the checkpoint nearest the onset and at the final
checkpoint: that checkpoint's own key frequencies (keyfreq_wl_fft), fve_paper U/V on the final
checkpoint's keys (geolens analyze's default, as Nanda et al. fix the final keys), truncated-logit
accuracy and the Clock/Pizza reading. Metrics already in the run's analysis cache are reused; the rest
are computed.
"""

from __future__ import annotations

import json
import math
import sys

from geolens.analysis.clockpizza import VERDICT_CODES
from geolens.analysis.trajectory import analyze_run
from geolens.outputs.paper import paper_tables
from geolens.runs.run import load_run

METRICS = ["loss", "keyfreq_wl_fft", "fve_paper", "truncated_logit_acc", "grad_symmetricity", "distance_irrelevance",
           "clock_pizza"]
HEADER = ("| checkpoint | test acc | its key frequencies | fve_paper U / V % per final key | U / V max | truncated-logit acc | "
          "clock/pizza (grad sym, dist irr) |")


def verdict(code: float) -> str:
    """clock / pizza / mixed / unsolved from its metrics-table code (unsolved is NaN)."""
    return next(name for name, c in VERDICT_CODES.items() if c == code or (math.isnan(c) and math.isnan(code)))


def row(values: dict, step: int, pinned: list[int]) -> str:
    """One checkpoint's table row from its metric values (trajectory.values[step]); pinned: the keys of fve_paper."""
    keys = [int(values["keyfreq_wl_fft"][f"keyfreq_wl_fft_{r}"]) for r in range(1, 6)]
    fve = values["fve_paper"]
    per_key = ", ".join(f"{k}: {fve[f'fve_paper_U_{r}']:.1f} / {fve[f'fve_paper_V_{r}']:.1f}" for r, k in enumerate(pinned, 1))
    return (f"| {step:,} | {values['loss']['acc_test']:.4f} | {', '.join(map(str, keys))} | {per_key} | "
            f"{fve['fve_paper_U_max']:.1f} / {fve['fve_paper_V_max']:.1f} | "
            f"{values['truncated_logit_acc']['truncated_logit_acc']:.4f} | "
            f"{verdict(values['clock_pizza']['clock_pizza'])} ({values['grad_symmetricity']['grad_symmetricity']:.3f}, "
            f"{values['distance_irrelevance']['distance_irrelevance']:.3f}) |")


def summary(paths: list[str]) -> str:
    """Markdown: per run, its onsets and timing, then rows at the onset's nearest checkpoint and the last."""
    lines = []
    for path in paths:
        run = load_run(path)
        cfg, ev = run.config, run.events
        onset = ev.get("onset_095")
        steps = sorted({run.nearest_step(onset), run.steps[-1]} if onset is not None else {run.steps[-1]})
        traj = analyze_run(run, METRICS, steps=steps, progress=False, workers=1)
        values = traj.values
        lines += [f"### {path}: preset {cfg.preset}, lr {cfg.lr}, seed {cfg.seed}, p = {cfg.p}", "",
                  f"onset (test acc > 0.95): epoch {onset}; stays >= 0.99 from epoch {ev.get('sustained_099')} "
                  f"(evaluated every {ev.get('eval_every')} epochs); {run.header['timing']['ms_per_epoch']:.1f} ms per "
                  f"epoch ({run.header['engine']} engine)", "",
                  HEADER, "|" + " --- |" * 7]
        lines += [row(values[step], step, traj.keys) for step in steps] + [""]
    paper = paper_tables()["spectral_section4_3"]
    lines.append("Paper (section 4.3, seed 42 at the first test acc >= 0.99): FVE % "
                 f"{json.dumps(paper['fve_percent'])}, truncated-logit accuracy "
                 f"{json.dumps(paper['truncated_logit_accuracy'])}")
    return "\n".join(lines)


if __name__ == "__main__":
    print(summary(sys.argv[1:]))
