"""The LLC of fb and LayerNorm checkpoints at one sampler setting (docs/landscape.md), from `geolens
llc-calibrate` outputs of one (lr, n_beta) each.

    python analyses/landscape/llc_common_table.py [FOLDER]   # FOLDER/llc_common.md (default results/landscape/llc_common)

Every FOLDER/*/llc_calibration.md becomes one row: the checkpoint, its sharpness, chains x draws, the estimate with
its standard deviation over chains, the loss the chains end at, the chains' split-R-hat and bulk-ESS and the
judgement (geolens.analysis.llc.judge), ordered by run, epoch and draws. A table written before judge read the
whole trace (no R-hat column; its R-hat and ESS are '-') cannot be judged again, its traces not kept: it fails where
a check of today's judge reads the table alone (its drift factor, llc.STABLE_DRIFT_FACTOR; a failure the old rule
shared with today's, OLD_CHECKS: diverged, not positive, chance loss), each marked '(trace not kept)', and is
otherwise 'not judged: trace not kept (old rule: ...)' with the one-direction rule's verdict.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from geolens.analysis.llc import STABLE_DRIFT_FACTOR

HEAD = re.compile(r"^# LLC calibration: (?P<run>\S+) at epoch (?P<epoch>\d+)$", re.M)
#: the old rule's reasons that today's judge gives alike, read from the record (llc.judge)
OLD_CHECKS = ("the chains diverged", "the estimate is not positive", "the chains climb towards chance loss")
SETTING = re.compile(r"(?P<chains>\d+) chains x (?P<draws>\d+) draws.*Sharpness \(top Hessian eigenvalue of the training "
                     r"loss\) (?P<sharpness>[^;]+);")


def row(path: Path) -> tuple[tuple, tuple[str, str], str]:
    """(sort key, (lr, n_beta), Markdown row) of one llc_calibration.md holding a single setting."""
    text = path.read_text()
    head, setting = HEAD.search(text), SETTING.search(text)
    rows = [line for line in text.splitlines() if re.match(r"^\| \d", line)]
    if head is None or setting is None or len(rows) != 1:
        raise SystemExit(f"{path}: not a one-setting llc-calibrate table; rerun llc-calibrate with one --lr and one --n-beta")
    cells = [c.strip() for c in rows[0].strip("|").split("|")]
    if len(cells) == 8:  # written by the one-direction rule, before the R-hat and ESS columns
        lr, n_beta, drift, llc, std, init, final, stable = cells
        rhat = ess = "-"
        reason = stable.removeprefix("no: ")
        if reason.startswith(OLD_CHECKS):  # judge's order: these before the drift factor
            stable = f"no: {reason} (trace not kept)"
        elif not float(drift) < STABLE_DRIFT_FACTOR:
            stable = (f"no: the step overshoots along the sharpest direction (drift factor {drift} >= "
                      f"{STABLE_DRIFT_FACTOR:g}) (trace not kept)")
        else:
            stable = f"not judged: trace not kept (old rule: {stable})"
    else:
        lr, n_beta, drift, llc, std, init, final, rhat, ess, stable = cells
    run, epoch, draws = Path(head["run"]).name, int(head["epoch"]), int(setting["draws"])
    cells = [run, f"{epoch:,}", setting["sharpness"], drift, f"{setting['chains']} x {draws:,}", f"{llc} ± {std}", init,
             final, rhat, ess, stable]
    return (run, epoch, draws), (lr, n_beta), "| " + " | ".join(cells) + " |"


def table(folder: Path) -> str:
    rows = sorted(row(p) for p in folder.glob("*/llc_calibration.md"))
    settings = {setting for _, setting, _ in rows}
    if len(settings) != 1:
        raise SystemExit(f"{folder}: the tables hold different (lr, n_beta) settings {sorted(settings)}; one table per setting")
    (lr, n_beta), = settings
    return (f"SGLD lr {lr}, n_beta {n_beta}\n\n| checkpoint | epoch | sharpness | drift | chains x draws | LLC ± std over "
            "chains | loss at the checkpoint | chains' final loss | R-hat | ESS | stable |\n"
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n" + "\n".join(r for _, _, r in rows) + "\n")


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("folder", nargs="?", default="results/landscape/llc_common")
    folder = Path(ap.parse_args(argv).folder)
    text = table(folder)
    (folder / "llc_common.md").write_text(text)
    print(text, end="")


if __name__ == "__main__":
    sys.exit(main())
