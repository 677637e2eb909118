"""Onset events of a run, read from its metrics rows (docs/run-format.md, events.json).

onset_095 is the first evaluated epoch with test accuracy above 0.95; sustained_099 the first epoch
after which every evaluation has test accuracy at least 0.99. Used by both training loops (the
early-stop rule), by sweeps (a member's state on disk) and by integrity (repairing events.json).
"""

from __future__ import annotations

from geolens.model.config import GeoConfig

ONSET_ACC = 0.95
SUSTAINED_ACC = 0.99


def onset_events(rows: list[dict]) -> dict[str, int | None]:
    """onset_095: first evaluated epoch with test acc > 0.95; sustained_099: first epoch after which
    every evaluation has test acc >= 0.99 (None if the last one is below)."""
    onset = next((r["epoch"] for r in rows if r["test_acc"] > ONSET_ACC), None)
    sustained = None
    for r in rows:
        if r["test_acc"] >= SUSTAINED_ACC:
            sustained = r["epoch"] if sustained is None else sustained
        else:
            sustained = None
    return {"onset_095": onset, "sustained_099": sustained}


def early_stop_due(cfg: GeoConfig, epoch: int, events: dict) -> bool:
    """Whether `epoch` is at least cfg.early_stop_after epochs past sustained_099."""
    sustained = events["sustained_099"]
    return cfg.early_stop_after is not None and sustained is not None and epoch - sustained >= cfg.early_stop_after


def finish_events(rows: list[dict], stop_reason: str, eval_every: int, start: int = 0) -> dict:
    """events.json of a finished run: onset_events of its metrics rows, how and where it ended."""
    return {**onset_events(rows), "stop_reason": stop_reason, "final_epoch": rows[-1]["epoch"] if rows else start,
            "eval_every": eval_every}
