"""The default LLC setting's sweep (docs/landscape.md#the-default-setting): one-setting `geolens llc-calibrate`
outputs at several checkpoints of one trajectory, one table, and the setting that llc.recommend's rule picks among
those stable at every checkpoint.

    python analyses/landscape/llc_default_table.py [FOLDER]   # FOLDER/llc_default.md (default results/landscape/llc_default)

Every FOLDER/*/llc_calibration.md (llc-calibrate's table, with R-hat and ESS: today's judge) and its
llc_calibration.csv give one row per (setting, checkpoint): the drift factor, the estimate, split-R-hat, bulk-ESS
and the verdict. A setting is a candidate default when it is stable at every checkpoint swept; llc.recommend then
picks one by its stated rule, each setting taken at its worst checkpoint (its largest drift factor and R-hat, its
smallest ESS). The rule's n is the training set's size (the paper's 3,830 unless --n).
"""

from __future__ import annotations

import argparse
import csv
import math
import re
import sys
from collections import defaultdict
from pathlib import Path

from geolens.analysis.llc import Calibration, Verdict, recommend

HEAD = re.compile(r"^# LLC calibration: (?P<run>\S+) at epoch (?P<epoch>\d+)$", re.M)
SETTING = re.compile(r"(?P<chains>\d+) chains x (?P<draws>\d+) draws(?: after (?P<burnin>\d+) burn-in steps)?")
SHARPNESS = re.compile(r"Sharpness \(top Hessian eigenvalue of the training loss\) (?P<sharpness>[^;]+);")


def rows(folder: Path) -> list[dict]:
    """Every row of every llc-calibrate output under folder, with its checkpoint, sampler length and verdict text."""
    out = []
    for md in sorted(folder.glob("*/llc_calibration.md")):
        text = md.read_text()
        head, setting, sharp = HEAD.search(text), SETTING.search(text), SHARPNESS.search(text)
        if head is None or setting is None or sharp is None or "| R-hat |" not in text:
            raise SystemExit(f"{md}: not an llc-calibrate table of today's judge (R-hat and ESS columns); rerun it")
        why = [line.rstrip(" |").rsplit("| ", 1)[1] for line in text.splitlines() if re.match(r"^\| \d", line)]
        with (md.parent / "llc_calibration.csv").open() as f:
            for r, verdict in zip(csv.DictReader(f), why, strict=True):
                out.append({"run": Path(head["run"]).name, "epoch": int(head["epoch"]), "lr": float(r["lr"]),
                            "n_beta": float(r["n_beta"]), "drift": float(r["drift"]), "llc": float(r["llc"]),
                            "llc_std": float(r["llc_std"]), "rhat": float(r["rhat"]), "ess": float(r["ess"]),
                            "stable": r["stable"] == "1", "verdict": verdict, "sharpness": sharp["sharpness"],
                            "length": (int(setting["chains"]), int(setting["draws"]), int(setting["burnin"] or 0))})
    if len({r["length"] for r in out}) > 1:
        raise SystemExit(f"{folder}: the tables differ in chains, draws or burn-in; one sweep per folder")
    return out


def table(folder: Path, n: int) -> str:
    found = rows(folder)
    if not found:
        raise SystemExit(f"{folder}: no */llc_calibration.md; run geolens llc-calibrate --out {folder}/NAME first")
    chains, draws, burnin = found[0]["length"]
    by_setting: dict[tuple[float, float], list[dict]] = defaultdict(list)
    for r in sorted(found, key=lambda r: (r["lr"], r["n_beta"], r["run"], r["epoch"])):
        by_setting[(r["lr"], r["n_beta"])].append(r)
    epochs = sorted({(r["run"], r["epoch"]) for r in found})
    lines = [f"{chains} chains x {draws:,} draws after {burnin:,} burn-in steps per estimate\n",
             "| lr | n_beta | checkpoint | epoch | sharpness | drift | LLC ± std over chains | R-hat | ESS | stable |",
             "| --- " * 10 + "|"]
    worst = []
    for (lr, n_beta), rs in by_setting.items():
        lines += [f"| {lr:g} | {n_beta:g} | {r['run']} | {r['epoch']:,} | {r['sharpness']} | {r['drift']:.3g} | "
                  f"{r['llc']:.4g} ± {r['llc_std']:.3g} | {r['rhat']:.3g} | {r['ess']:.0f} | {r['verdict']} |" for r in rs]
        everywhere = len(rs) == len(epochs) and all(r["stable"] for r in rs)
        verdict = Verdict(everywhere, "stable at every checkpoint" if everywhere else "not stable at every checkpoint",
                          max(r["rhat"] for r in rs), min(r["ess"] for r in rs), max(r["drift"] for r in rs))
        worst.append(Calibration(lr, n_beta, math.nan, math.nan, math.nan, [], verdict, verdict.drift))
    best, rule = recommend(worst, n)
    pick = ("Default: none; " + rule if best is None else
            f"Default: lr {best.lr:g}, n_beta {best.n_beta:g}, burnin {burnin}, draws {draws}, chains {chains} (stable at "
            f"all {len(epochs)} checkpoints; largest drift {best.drift_factor:.3g}, smallest ESS {best.verdict.ess:.0f}); "
            f"llc.recommend's rule over the settings stable at every checkpoint, each at its worst checkpoint: {rule}.")
    return "\n".join(lines) + "\n\n" + pick + "\n"


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", default="results/landscape/llc_default", type=Path)
    ap.add_argument("--n", type=int, default=3830, help="training examples (recommend's n / ln n)")
    args = ap.parse_args(argv)
    text = table(args.folder, args.n)
    (args.folder / "llc_default.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
