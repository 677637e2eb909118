"""Online onset forecasts: a threshold rule on one recorded column, and the forecast file that carries
one fitted rule per configuration from `geolens precursors --online --save FILE` to
`geolens train --forecast FILE`.

A ThresholdRule fires at the first evaluation whose value of `column` is >= threshold ('above') or
<= threshold ('below'): decided by the rows so far, so it fires the same way while a run trains as
over its finished record. Its forecast of the onset is the firing epoch plus `lead` (the mean lead,
onset minus firing epoch, of the runs it was fitted on), give or take `error` (its leave-one-seed-out
mean absolute error on those runs, misses counted; chosen as the lowest among a configuration's columns, it
is optimistic: `geolens precursors --online` also reports the nested error of that choice).
geolens.analysis.online_rules fits rules; docs/precursors.md measures them.

Forecast file (JSON): {"format": "geolens-forecast", "format_version": 1, "min_warning": N,
"forecasts": [{"configuration": label, "key": runset.group_key, "seeds": [...], "rule": {...},
"loo_mae": E, "baseline_mae": B, "min_warning": N, "mean_onset": M}, ...]}.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from geolens.errors import GeoError
from geolens.model.config import GeoConfig
from geolens.runs.storage import atomic_write_json, current_column

FORMAT, FORMAT_VERSION = "geolens-forecast", 1
DIRECTIONS = ("above", "below")


def column_value(row: dict, column: str) -> float | None:
    """The value of a metrics column in a row (loss_gap derived from the losses where a run predates it);
    None when the row lacks it or holds NaN."""
    value = row.get(column)
    if value is None and column == "loss_gap" and "test_loss" in row:
        value = row["test_loss"] - row["train_loss"]
    return None if value is None or math.isnan(value) else float(value)


@dataclass(frozen=True)
class ThresholdRule:
    """Fires at the first evaluation with column >= threshold ('above') or <= threshold ('below');
    forecasts the onset at the firing epoch + lead, give or take error (None before it is measured)."""

    column: str
    direction: str
    threshold: float
    lead: float
    error: float | None = None

    def __post_init__(self):
        if self.direction not in DIRECTIONS:
            raise GeoError(f"a threshold rule's direction is 'above' or 'below', not {self.direction!r}")

    @classmethod
    def from_dict(cls, fields: dict) -> ThresholdRule:
        """A rule as asdict wrote it (a forecast file, run.json's "forecast"); a column renamed since reads
        under its present name (storage.RENAMED_COLUMNS)."""
        return cls(**{**fields, "column": current_column(fields["column"])})

    def fires(self, value: float | None) -> bool:
        if value is None:
            return False
        return value >= self.threshold if self.direction == "above" else value <= self.threshold

    def first_firing(self, rows: list[dict]) -> int | None:
        """The epoch of the first row on which the rule fires; None if none."""
        return next((int(r["epoch"]) for r in rows if self.fires(column_value(r, self.column))), None)

    def describe(self) -> str:
        """'wl_gini >= 0.412'."""
        return f"{self.column} {'>=' if self.direction == 'above' else '<='} {self.threshold:.4g}"

    def expected(self, fired: int) -> str:
        """'onset expected ~8,120 (±140)' for a rule that fired at epoch `fired`."""
        spread = "" if self.error is None else f" (±{self.error:,.0f})"
        return f"onset expected ~{fired + self.lead:,.0f}{spread}"


@dataclass(frozen=True)
class Forecast:
    """One configuration's fitted rule in a forecast file."""

    configuration: str  # RunGroup.full_label of the runs it was fitted on
    key: str  # runset.group_key of their config: a run of this configuration is forecast by this rule
    seeds: list[int]
    rule: ThresholdRule
    loo_mae: float | None
    baseline_mae: float | None
    min_warning: int
    mean_onset: float | None = None  # the fitting runs' mean onset: the baseline a forecast of new runs must beat

    def matches(self, key: str) -> bool:
        """Whether a run whose config has runset.group_key `key` is of this forecast's configuration: the
        two keys as configs, fields a key lacks (added to GeoConfig after it was written) at their defaults."""
        return _config_of(self.key) == _config_of(key)


def _config_of(key: str) -> GeoConfig | None:
    try:
        return GeoConfig.from_dict(json.loads(key))
    except (GeoError, ValueError, TypeError):
        return None


def write_forecasts(path: str | Path, forecasts: list[Forecast], min_warning: int) -> Path:
    """Write the forecast file (module docstring) atomically."""
    path = Path(path)
    atomic_write_json(path, {"format": FORMAT, "format_version": FORMAT_VERSION, "min_warning": min_warning,
                             "forecasts": [{**asdict(f), "rule": asdict(f.rule)} for f in forecasts]})
    return path


def read_forecasts(path: str | Path) -> list[Forecast]:
    """The forecasts of a file written by write_forecasts; a one-line GeoError for anything else."""
    path = Path(path)
    fix = "write one with `geolens precursors --runs SWEEP --online --save FILE`"
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise GeoError(f"forecast file {path} does not exist; {fix}") from None
    except (OSError, ValueError) as e:
        raise GeoError(f"forecast file {path} is not readable JSON ({e}); {fix}") from None
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise GeoError(f"{path} is not a geolens forecast file; {fix}")
    if data.get("format_version") != FORMAT_VERSION:
        raise GeoError(f"{path} is forecast format version {data.get('format_version')}, this geolens reads "
                       f"{FORMAT_VERSION}; {fix}")
    try:
        return [Forecast(**{**f, "rule": ThresholdRule.from_dict(f["rule"])}) for f in data["forecasts"]]
    except (KeyError, TypeError, AttributeError) as e:
        raise GeoError(f"forecast file {path} is damaged ({e}); {fix}") from None


def forecast_for(path: str | Path, key: str) -> Forecast:
    """The forecast of the file fitted on runs of the configuration `key` (runset.group_key of a run's
    config); refused in one line when none is."""
    forecasts = read_forecasts(path)
    match = next((f for f in forecasts if f.matches(key)), None)
    if match is None:
        known = "; ".join(f.configuration for f in forecasts) or "none"
        raise GeoError(f"forecast file {path} has no rule fitted on this run's configuration (it has: {known}); "
                       "fit one on runs of this configuration with `geolens precursors --online --save`")
    return match


class ForecastWatch:
    """A forecast followed while a run trains: fed its metrics rows (`add`); `describe()` is '' until
    the rule fires, then 'onset expected ~E (±M)'."""

    def __init__(self, rule: ThresholdRule, rows: list[dict] = ()):
        self.rule, self.fired = rule, None
        for row in rows:
            self.add(row)

    def add(self, row: dict) -> None:
        if self.fired is None and self.rule.fires(column_value(row, self.rule.column)):
            self.fired = int(row["epoch"])

    def describe(self) -> str:
        if self.fired is None:
            return ""
        return f"{self.rule.expected(self.fired)} ({self.rule.describe()} at {self.fired:,})"
