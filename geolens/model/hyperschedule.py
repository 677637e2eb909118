"""Hyperparameter schedules: lr, weight decay and the readout temperature as functions of the epoch.

A run's `schedule` config field is a list of entries (`geolens train/fork --schedule`, repeatable):
    'weight_decay=3.0@2000:2200'   weight decay 3.0 for the steps taken at epochs [2000, 2200)
    'lr=1e-3@0:500', 'tau=20@1000:1500'   the same for the learning rate and tau
    'lr=warmup:500'                 the lr rises linearly: the step at epoch e uses lr * min(1, (e + 1) / 500)
In a fork (`geolens fork`, `geolens sweep --fork-from`) a window may be given relative to the fork
step, '@+0:+200' (resolve_relative). Outside its windows a quantity has the config's base value
(cfg.lr, cfg.weight_decay, cfg.tau); a warmup scales whatever lr applies. "The step at epoch e" is the optimizer step from state e to e + 1;
tau at epoch e is the temperature of the forward at state e (that step's and that evaluation's).
Every value is a pure function of the epoch, so a resumed or forked run sees exactly the schedule
an uninterrupted one does.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

from geolens.errors import GeoError

SCHEDULED = ("lr", "weight_decay", "tau")
_RELATIVE = re.compile(r"@\+(\d+):\+(\d+)$")
_WINDOW = re.compile(r"(?P<name>\w+)=(?P<value>[^@]+)@(?P<start>\d+):(?P<end>\d+)")
_WARMUP = re.compile(r"lr=warmup:(?P<n>\d+)")
_EXAMPLE = "weight_decay=3.0@2000:2200 or lr=warmup:500"


@dataclass(frozen=True)
class Window:
    """`name` takes `value` for the epochs [start, end)."""

    name: str
    value: float
    start: int
    end: int


@dataclass(frozen=True)
class HyperSchedule:
    """A parsed `schedule`: its windows and the lr warmup."""

    windows: tuple[Window, ...]
    warmup: int  # epochs of linear lr warmup (0: none)

    def value(self, name: str, base: float, epoch: int) -> float:
        """`name`'s value at `epoch` (base outside its windows; the lr times the warmup factor)."""
        out = next((w.value for w in self.windows if w.name == name and w.start <= epoch < w.end), base)
        if name == "lr" and epoch < self.warmup:
            out *= (epoch + 1) / self.warmup
        return out


def parse_hyper_schedule(entries: list[str]) -> HyperSchedule:
    """The schedule of a config's `schedule` entries; a GeoError naming a malformed, unknown or
    overlapping entry."""
    windows, warmup = [], 0
    for text in entries:
        text = text.replace(" ", "")
        if m := _WARMUP.fullmatch(text):
            if warmup:
                raise GeoError(f"schedule '{text}': a second lr warmup; give one 'lr=warmup:N'")
            warmup = int(m["n"])
            if warmup < 1:
                raise GeoError(f"schedule '{text}': the warmup needs N >= 1 epochs (e.g. {_EXAMPLE})")
            continue
        m = _WINDOW.fullmatch(text)
        if m is None and _RELATIVE.search(text):
            raise GeoError(f"schedule '{text}': a window relative to a fork step (@+A:+B) is for `geolens fork` and "
                           "`geolens sweep --fork-from`; give absolute epochs here")
        if m is None:
            raise GeoError(f"schedule '{text}' is not NAME=VALUE@START:END or lr=warmup:N (e.g. {_EXAMPLE})")
        if m["name"] not in SCHEDULED:
            raise GeoError(f"schedule '{text}': '{m['name']}' cannot be scheduled; choose one of {', '.join(SCHEDULED)}")
        try:
            value = float(m["value"])
        except ValueError:
            raise GeoError(f"schedule '{text}': '{m['value']}' is not a number") from None
        start, end = int(m["start"]), int(m["end"])
        if end <= start:
            raise GeoError(f"schedule '{text}': the window [{start}, {end}) is empty; END must exceed START")
        ok = value >= 0 if m["name"] == "weight_decay" else value > 0
        if not math.isfinite(value) or not ok:
            raise GeoError(f"schedule '{text}': {m['name']} must be a finite number {'>= 0' if m['name'] == 'weight_decay' else '> 0'}")
        w = Window(m["name"], value, start, end)
        clash = next((o for o in windows if o.name == w.name and o.start < w.end and w.start < o.end), None)
        if clash:
            raise GeoError(f"schedule '{text}' overlaps {clash.name}={clash.value}@{clash.start}:{clash.end}; give "
                           "each epoch of a quantity one value")
        windows.append(w)
    return HyperSchedule(tuple(sorted(windows, key=lambda w: (w.name, w.start))), warmup)


def resolve_relative(entries: list[str], step: int) -> list[str]:
    """The entries with windows relative to `step` ('weight_decay=3@+0:+200') made absolute
    ('weight_decay=3@STEP:STEP+200'); other entries unchanged."""
    return [_RELATIVE.sub(lambda m: f"@{step + int(m[1])}:{step + int(m[2])}", e.replace(" ", "")) for e in entries]


def relative_to(entries: list[str], step: int) -> list[str]:
    """The inverse of resolve_relative for windows from `step` on: 'weight_decay=3@3000:3200' at step 3000
    -> 'weight_decay=3@+0:+200' (so the same pulse at different fork steps reads the same)."""
    def rel(m: re.Match) -> str:
        start, end = int(m["start"]), int(m["end"])
        return f"{m['name']}={m['value']}@+{start - step}:+{end - step}" if start >= step else m[0]

    return [_WINDOW.sub(rel, e.replace(" ", "")) for e in entries]
