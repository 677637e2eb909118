"""`geolens explore`: the trajectory explorer, a static folder whose index.html walks one or more runs step by step.

The folder opens from file:// with no network and no server:
    index.html      the page (explorer_assets/index.html with the title and the runs' summaries)
    explorer.js     the step control and every panel (explorer_assets/explorer.js)
    plotly.min.js   plotly.js from the installed plotly package (no CDN); the explorer `geolens analyze` writes
                    beside its report loads the analysis folder's shared copy instead (../plotly.min.js)
    data.js         the runs' numbers as one script (Chromium does not let a file:// page fetch local JSON):
                    window.GEOLENS_EXPLORER = {title, clock_pizza, runs: [explorer_data.run_payload, ...]}
"""

from __future__ import annotations

import html
import json
import os
from importlib import resources
from pathlib import Path
from string import Template

from geolens.analysis.trajectory import Trajectory
from geolens.errors import GeoError
from geolens.outputs.explorer_data import run_payload
from geolens.outputs.plots import PLOTLY_JS, plotly_js
from geolens.runs.storage import atomic_write_bytes

FILES = ("index.html", "explorer.js", PLOTLY_JS, "data.js")


def asset(name: str) -> str:
    return resources.files("geolens.outputs").joinpath("explorer_assets", name).read_text(encoding="utf-8")


def run_labels(trajs: list[Trajectory]) -> list[str]:
    """A short unique label per run: its folder's name, with the parent's where names repeat, numbered where
    that repeats too (the same run twice)."""
    names = [t.run.path.name for t in trajs]
    labels = [n if names.count(n) == 1 else f"{t.run.path.parent.name}/{n}" for n, t in zip(names, trajs)]
    return [lab if labels.count(lab) == 1 else f"{name} ({i + 1})" for i, (lab, name) in enumerate(zip(labels, names))]


def summary_html(payloads: list[dict]) -> str:
    rows = sorted({k for p in payloads for k in p["summary"]}, key=lambda k: min(
        list(p["summary"]).index(k) if k in p["summary"] else 99 for p in payloads))
    head = "".join(f"<th>{html.escape(p['label'])}</th>" for p in payloads)
    body = "".join(f"<tr><th>{html.escape(k)}</th>" + "".join(
        f"<td>{html.escape(str(p['summary'].get(k, '')))}</td>" for p in payloads) + "</tr>" for k in rows)
    return f"<details><summary>runs</summary><table><tr><th></th>{head}</tr>{body}</table></details>"


def check_out(out: Path) -> None:
    """Refuse to write into an existing folder that holds anything but an explorer page."""
    if out.exists() and (not out.is_dir() or any(p.name not in FILES for p in out.iterdir())):
        raise GeoError(f"{out} exists and holds other files than an explorer page; choose a new or empty --out folder")


def write_explorer(trajs: list[Trajectory], out: str | Path, plotly: Path | None = None) -> Path:
    """Write the explorer folder of these trajectories (each from analyze_run) to `out`; returns index.html.
    plotly: a plotly.min.js outside `out` for the page to load by its relative path (the report's, shared: the
    folder then opens only beside it) instead of a copy of its own (an earlier one is removed)."""
    from geolens.analysis.clockpizza import DIST_IRR_CLOCK_MIN, GRAD_SYM_PIZZA_MIN

    if not trajs:
        raise GeoError("geolens explore needs at least one run: pass --run RUN")
    out = Path(out)
    check_out(out)
    payloads = [run_payload(t, label) for t, label in zip(trajs, run_labels(trajs))]
    title = "geolens explorer: " + ", ".join(p["label"] for p in payloads)
    data = {"title": title, "clock_pizza": {"grad_sym_pizza_min": GRAD_SYM_PIZZA_MIN, "dist_irr_clock_min": DIST_IRR_CLOCK_MIN},
            "runs": payloads}
    src = PLOTLY_JS if plotly is None else Path(os.path.relpath(plotly, out)).as_posix()
    page = Template(asset("index.html")).substitute(title=html.escape(title), summary=summary_html(payloads),
                                                    plotly=html.escape(src))
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise GeoError(f"cannot write the explorer to {out} ({e.strerror}); choose another --out folder") from None
    atomic_write_bytes(out / "data.js", b"window.GEOLENS_EXPLORER = " +
                       json.dumps(data, separators=(",", ":"), allow_nan=False).encode() + b";\n")
    if plotly is None:
        atomic_write_bytes(out / PLOTLY_JS, plotly_js())
    else:
        (out / PLOTLY_JS).unlink(missing_ok=True)
    atomic_write_bytes(out / "explorer.js", asset("explorer.js").encode())
    atomic_write_bytes(out / "index.html", page.encode())
    return out / "index.html"
