"""`geolens llc-calibrate`'s records: a table of the sweep (markdown and CSV) and the chains' loss traces."""

from __future__ import annotations

from pathlib import Path

from geolens.analysis.llc import Calibration, LLCSettings
from geolens.analysis.trajectory import writing
from geolens.outputs.plots import FigureSpec, Line, Panel, save_static
from geolens.runs.storage import atomic_write_bytes


def calibration_table(rows: list[Calibration], base: LLCSettings, label: str, sharpness: float) -> str:
    sampler = "SGLD" if base.sampler == "sgld" else "RMSprop-preconditioned SGLD (whose step the drift column ignores)"
    burnin = f" after {base.burnin} burn-in steps" if base.burnin else ""
    head = (f"# LLC calibration: {label}\n\n{sampler} (devinterp) with localization {base.localization:g}, {base.chains} chains x "
            f"{base.draws} draws{burnin}, batch {base.batch_size}, seed {base.seed}; stable = positive, the mean trace plateaus, "
            "far from chance loss, chains agree (geolens.analysis.llc.judge). Sharpness (top Hessian eigenvalue of the "
            f"training loss) {sharpness:.4g}; drift = lr (n_beta sharpness + localization) / 2, the step's drift along "
            "that direction (llc.drift_factor: it diverges above 2).\n\n"
            "| lr | n_beta | drift | LLC | std over chains | init loss | final loss | stable |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- |\n")
    lines = [f"| {r.lr:g} | {r.n_beta:g} | {r.drift_factor:.3g} | {r.llc:.4g} | {r.llc_std:.3g} | {r.init_loss:.4g} | "
             f"{sum(t[-1] for t in r.trace) / len(r.trace):.4g} | {'yes' if r.stable else 'no: ' + r.why} |" for r in rows]
    return head + "\n".join(lines) + "\n"


def calibration_figure(rows: list[Calibration]) -> FigureSpec:
    panels = []
    for r in rows:
        traces = [Line(list(range(len(t))), t, f"chain {i}") for i, t in enumerate(r.trace)]
        traces.append(Line([0, len(r.trace[0]) - 1], [r.init_loss] * 2, "checkpoint", dash=True, color="#333333"))
        panels.append(Panel(f"lr {r.lr:g}, n_beta {r.n_beta:g}: LLC {r.llc:.3g} ({'stable' if r.stable else 'unstable'})",
                            traces, "draw", "train loss"))
    return FigureSpec("llc_calibration", "SGLD loss traces per setting", panels, cols=3)


def write_calibration(rows: list[Calibration], base: LLCSettings, label: str, sharpness: float, out: Path) -> list[Path]:
    """OUT/llc_calibration.md, .csv, .png, .svg."""
    with writing(out):
        atomic_write_bytes(out / "llc_calibration.md", calibration_table(rows, base, label, sharpness).encode())
        csv = ["lr,n_beta,drift,llc,llc_std,init_loss,stable"] + [
            f"{r.lr!r},{r.n_beta!r},{r.drift_factor!r},{r.llc!r},{r.llc_std!r},{r.init_loss!r},{int(r.stable)}" for r in rows]
        atomic_write_bytes(out / "llc_calibration.csv", ("\n".join(csv) + "\n").encode())
        figures = save_static(calibration_figure(rows), out)
    return [out / "llc_calibration.md", out / "llc_calibration.csv", *figures]
