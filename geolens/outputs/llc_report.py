"""`geolens llc-calibrate`'s records: a table of the sweep with its verdicts and the one setting it recommends
(markdown and CSV), the chains' loss traces (CSV, so that the verdicts can be judged again) and their figure."""

from __future__ import annotations

from pathlib import Path

from geolens.analysis.llc import (CHANCE_SHARE, STABLE_DRIFT_FACTOR, STABLE_ESS_PER_CHAIN, STABLE_RHAT, Calibration,
                                  LLCSettings)
from geolens.analysis.trajectory import writing
from geolens.outputs.plots import FigureSpec, Line, Panel, save_static
from geolens.runs.storage import atomic_write_bytes


def calibration_table(rows: list[Calibration], base: LLCSettings, label: str, sharpness: float,
                      recommended: tuple[Calibration | None, str]) -> str:
    """The sweep as markdown: one row per setting with its drift factor, estimate, split-R-hat, bulk-ESS and verdict,
    then the recommended setting and the rule that chose it."""
    plain = base.sampler == "sgld"
    sampler = "SGLD" if plain else "RMSprop-preconditioned SGLD (whose step the drift column ignores)"
    burnin = f" after {base.burnin} burn-in steps" if base.burnin else ""
    drift_rule = f", drift factor below {STABLE_DRIFT_FACTOR:g}" if plain else ""
    head = (f"# LLC calibration: {label}\n\n{sampler} (devinterp) with localization {base.localization:g}, {base.chains} chains x "
            f"{base.draws} draws{burnin}, batch {base.batch_size}, seed {base.seed}; stable (geolens.analysis.llc.judge, on the "
            f"whole trace) = finite, positive, the last quarter below {CHANCE_SHARE:g} of chance loss{drift_rule}, the chains mixed: "
            f"rank-normalised split-R-hat below {STABLE_RHAT:g} and bulk-ESS at least {STABLE_ESS_PER_CHAIN} per chain. "
            f"Sharpness (top Hessian eigenvalue of the training loss) {sharpness:.4g}; drift = lr (n_beta sharpness + "
            "localization) / 2, the step's drift along that direction (llc.drift_factor: it overshoots above 1, diverges "
            "above 2).\n\n"
            "| lr | n_beta | drift | LLC | std over chains | init loss | final loss | R-hat | ESS | stable |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n")
    lines = [f"| {r.lr:g} | {r.n_beta:g} | {r.drift_factor:.3g} | {r.llc:.4g} | {r.llc_std:.3g} | {r.init_loss:.4g} | "
             f"{sum(t[-1] for t in r.trace) / len(r.trace):.4g} | {r.verdict.rhat:.3g} | {r.verdict.ess:.0f} | "
             f"{'yes' if r.stable else 'no: ' + r.verdict.why} |" for r in rows]
    best, rule = recommended
    pick = ("Recommended: none; " + rule if best is None else
            f"Recommended: lr {best.lr:g}, n_beta {best.n_beta:g} (LLC {best.llc:.4g}; `--llc lr={best.lr:g},"
            f"n_beta={best.n_beta:g}` with this table's other settings); rule: {rule}.")
    return head + "\n".join(lines) + "\n\n" + pick + "\n"


def calibration_figure(rows: list[Calibration]) -> FigureSpec:
    panels = []
    for r in rows:
        traces = [Line(list(range(len(t))), t, f"chain {i}") for i, t in enumerate(r.trace)]
        traces.append(Line([0, len(r.trace[0]) - 1], [r.init_loss] * 2, "checkpoint", dash=True, color="#333333"))
        panels.append(Panel(f"lr {r.lr:g}, n_beta {r.n_beta:g}: LLC {r.llc:.3g} ({'stable' if r.stable else 'unstable'})",
                            traces, "draw", "train loss"))
    return FigureSpec("llc_calibration", "SGLD loss traces per setting", panels, cols=3)


def write_calibration(rows: list[Calibration], base: LLCSettings, label: str, sharpness: float,
                      recommended: tuple[Calibration | None, str], out: Path) -> list[Path]:
    """OUT/llc_calibration.md, .csv (a recommended column: 1 on the recommended row), llc_traces.csv (lr, n_beta,
    chain, draw, loss: every draw of every chain), .png, .svg."""
    best = recommended[0]
    with writing(out):
        atomic_write_bytes(out / "llc_calibration.md", calibration_table(rows, base, label, sharpness, recommended).encode())
        csv = ["lr,n_beta,drift,llc,llc_std,init_loss,rhat,ess,stable,recommended"] + [
            f"{r.lr!r},{r.n_beta!r},{r.drift_factor!r},{r.llc!r},{r.llc_std!r},{r.init_loss!r},{r.verdict.rhat!r},"
            f"{r.verdict.ess!r},{int(r.stable)},{int(r is best)}" for r in rows]
        atomic_write_bytes(out / "llc_calibration.csv", ("\n".join(csv) + "\n").encode())
        traces = ["lr,n_beta,chain,draw,loss"] + [f"{r.lr!r},{r.n_beta!r},{c},{d},{v!r}" for r in rows
                                                  for c, t in enumerate(r.trace) for d, v in enumerate(t)]
        atomic_write_bytes(out / "llc_traces.csv", ("\n".join(traces) + "\n").encode())
        figures = save_static(calibration_figure(rows), out)
    return [out / "llc_calibration.md", out / "llc_calibration.csv", out / "llc_traces.csv", *figures]
