"""The paper's section 4.3 (spectral analysis) from geolens runs: for every finished run under RUNS
(trained until the first logged test accuracy >= 0.99, analyses/reproduction/spectral.toml), analyse
its last checkpoint and write the comparison with the paper's numbers to OUT/spectral.md, copying each
run's analysis/metrics.csv to RESULTS (same layout as RUNS). The table's notes say which runs were trained from an
uncommitted tree or record no commit (runset.provenance_notes).

    python analyses/reproduction/spectral.py runs/spectral results/spectral results/tables
"""

import shutil
import sys
from pathlib import Path

from geolens import load_run
from geolens.outputs.paper import paper_tables
from geolens.runs.runset import provenance_notes

METRICS = ["loss", "keyfreq_wl_fft", "fve_paper", "truncated_logit_acc", "clock_pizza", "grad_symmetricity",
           "distance_irrelevance"]
_PAPER = paper_tables()["spectral_section4_3"]
_FVE, _TRUNC = _PAPER["fve_percent"], _PAPER["truncated_logit_accuracy"]
#: preset -> the paper's section 4.3 numbers for it: FVE (as the paper words it) and truncated-logit accuracy
PAPER = {
    "ln": (f"up to ~{_FVE['layernorm_max']}%", f"{_TRUNC['layernorm']:.4f}"),
    "sphere": (f"at most ~{_FVE['sphere_wd1_max']}%", "-"),
    "fb": (f"U {_FVE['sphere_wd0_U']}% / V {_FVE['sphere_wd0_V']}%", f"{_TRUNC['fully_bounded']:.4f}"),
}


def row(run) -> list[str]:
    """One table row: the last checkpoint's circuit, next to the paper's numbers."""
    step = run.steps[-1]
    values = run.analyze(METRICS, steps=[step], progress=False).values[step]
    keys = [int(values["keyfreq_wl_fft"][f"keyfreq_wl_fft_{i}"]) for i in range(1, 6)]
    fve = values["fve_paper"]
    per_key = ", ".join(f"{k}: {fve[f'fve_paper_U_{i}']:.1f} / {fve[f'fve_paper_V_{i}']:.1f}" for i, k in enumerate(keys, 1))
    cfg = run.config
    paper_fve, paper_trunc = PAPER.get(cfg.preset, ("-", "-"))
    return [cfg.preset, str(cfg.seed), f"{step:,}", f"{values['loss']['acc_test']:.4f}", per_key,
            f"{fve['fve_paper_U_max']:.2f} / {fve['fve_paper_V_max']:.2f}", paper_fve,
            f"{values['truncated_logit_acc']['truncated_logit_acc']:.4f}", paper_trunc,
            f"{values['grad_symmetricity']['grad_symmetricity']:.3f} / "
            f"{values['distance_irrelevance']['distance_irrelevance']:.3f}"]


def main(src: Path, results: Path, out: Path) -> None:
    header = ["config", "seed", "epoch (first logged acc >= 0.99)", "test acc", "key frequencies: fve_paper U / V (%)",
              "U / V max (%)", "paper FVE", "truncated-logit acc", "paper", "grad symmetricity / distance irrelevance"]
    rows, runs = [], []
    for run_json in sorted(src.rglob("run.json")):
        run = load_run(run_json.parent)
        if run.header.get("status") != "finished":
            continue
        rows.append(row(run))
        runs.append(run)
        target = results / run_json.parent.relative_to(src) / "analysis"
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(run.path / "analysis" / "metrics.csv", target / "metrics.csv")
    lines = ["# Section 4.3: the circuit when test accuracy first reaches 0.99 (200-epoch grid)", "",
             f"From `python analyses/reproduction/spectral.py {src} {results} {out}`; definitions in docs/metrics.md.", "",
             "| " + " | ".join(header) + " |", "|" + " --- |" * len(header)]
    lines += ["| " + " | ".join(r) + " |" for r in rows]
    if notes := provenance_notes(runs):
        lines += ["", "Notes:", ""] + [f"- {n}" for n in notes]
    out.mkdir(parents=True, exist_ok=True)
    (out / "spectral.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main(Path(sys.argv[1]), Path(sys.argv[2]), Path(sys.argv[3]))
