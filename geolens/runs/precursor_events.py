"""Precursor events: one rule per precursor turns its series in metrics.csv into an event epoch.

A Precursor is a quantity of a run's metrics rows (a column, or one derived from columns; the
precursor columns are geolens.training.precursor_columns') with one rule, applied the same way to
every run:
    peak        the epoch of the series' running maximum at the first evaluation where the series has
                fallen back by PEAK_DROP of that maximum's rise above the first value; none when it never
                does (still rising, or falling from the start)
    trough      the same rule on the negated series (a collapse, e.g. of an effective rank)
    crossing:F  the first evaluated epoch at which the series has covered the fraction F of its
                eventual change (from its first to its last value); none when it does not change
peak and trough are causal: decided by the rows up to the evaluation that confirms them. A crossing
needs the last value: it exists only over a finished record. Neither is an onset forecast: on the
runs of docs/precursors.md the causal rules fire during memorisation, thousands of epochs before a
LayerNorm onset, whatever the onset; the online forecast is a fitted threshold rule
(geolens.runs.forecast, geolens.analysis.online_rules).
A row without the column (a run recorded before it existed) gives no series and no event.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from geolens.errors import GeoError

PEAK_DROP = 0.2  # a peak is confirmed once the series falls back by this fraction of its rise


@dataclass(frozen=True)
class Precursor:
    """name, how its value is read from a metrics row (None when the row lacks it), and its event
    rule ('peak', 'trough' or 'crossing:F'); docs/metrics.md defines each."""

    name: str
    value: Callable[[dict[str, float]], float | None]
    rule: str


def _column(name: str) -> Callable[[dict[str, float]], float | None]:
    return lambda row: row.get(name)


PRECURSORS = [
    Precursor("test_loss", _column("test_loss"), "peak"),
    Precursor("loss_gap", lambda r: r["test_loss"] - r["train_loss"], "peak"),
    Precursor("weight_norm", _column("weight_norm"), "peak"),
    Precursor("wn_embed", _column("wn_embed"), "peak"),
    Precursor("wn_mlp", _column("wn_mlp"), "peak"),
    Precursor("logit_scale", _column("max_abs_logit"), "crossing:0.5"),
    Precursor("logit_margin", _column("logit_margin"), "crossing:0.5"),
    Precursor("attn_var", _column("attn_var"), "peak"),
    Precursor("participation_resid", _column("participation_resid"), "trough"),
    Precursor("participation_mlp", _column("participation_mlp"), "trough"),
    Precursor("wl_gini", _column("wl_gini"), "crossing:0.5"),
    Precursor("wl_top5", _column("wl_top5"), "crossing:0.5"),
    Precursor("llc", _column("llc"), "peak"),  # checkpoint-derived: geolens.analysis.precursors.series_rows
]


def check_rule(rule: str) -> None:
    """A GeoError unless `rule` is 'peak', 'trough' or 'crossing:F' with 0 < F <= 1."""
    if rule in ("peak", "trough"):
        return
    if rule.startswith("crossing:"):
        try:
            frac = float(rule.split(":", 1)[1])
        except ValueError:
            frac = -1.0
        if 0 < frac <= 1:
            return
    raise GeoError(f"unknown event rule {rule!r}; use 'peak', 'trough' or 'crossing:F' with 0 < F <= 1")


class _Extremum:
    """The causal peak rule over a series fed one value at a time (negated for a trough)."""

    def __init__(self, sign: float):
        self.sign, self.first, self.top, self.top_epoch, self.event = sign, None, None, None, None

    def add(self, epoch: int, value: float) -> bool:
        """Feed one value; True when this value confirms the peak (once)."""
        if self.event is not None or value is None or math.isnan(value):
            return False
        v = self.sign * value
        if self.first is None:
            self.first, self.top, self.top_epoch = v, v, epoch
            return False
        if v > self.top:
            self.top, self.top_epoch = v, epoch
            return False
        rise = self.top - self.first
        if rise > 0 and self.top - v >= PEAK_DROP * rise:
            self.event = self.top_epoch
            return True
        return False


def event_epoch(epochs: list[int], values: list[float | None], rule: str) -> int | None:
    """The event of a series (values at epochs, ascending) under `rule` (module docstring); None if
    none, or if the series is missing (None values: rows without the column)."""
    check_rule(rule)
    if len(epochs) != len(values) or not epochs:
        raise GeoError(f"a series needs as many values as epochs (got {len(values)} and {len(epochs)})")
    kept = [(e, v) for e, v in zip(epochs, values) if v is not None and not math.isnan(v)]
    if len(kept) < 2:
        return None
    if rule in ("peak", "trough"):
        ext = _Extremum(1.0 if rule == "peak" else -1.0)
        for e, v in kept:
            if ext.add(e, v):
                return ext.event
        return None
    frac = float(rule.split(":", 1)[1])
    first, change = kept[0][1], kept[-1][1] - kept[0][1]
    if change == 0:
        return None
    return next(e for e, v in kept if (v - first) / change >= frac)
