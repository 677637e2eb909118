"""Figures as small declarative specs, rendered two ways: interactive plotly (the HTML report) and
static matplotlib (PNG/SVG export, no browser needed).

A FigureSpec is a grid of Panels; a Panel holds traces: Line, Bar, Heatmap, Region (filled
polygon) and VLine. Each figure is built once as a spec, so both renderings show the same data;
html_page puts several into one page that works offline: plotly.js inlined once, or loaded from a shared copy
beside the page (write_plotly_js), never from a CDN.
"""

from __future__ import annotations

import io
import math
import textwrap
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Sequence, Union

from geolens.errors import GeoError
from geolens.runs.storage import atomic_write_bytes

PANEL_WIDTH = 5.2  # inches per panel in the static export, by default
LEGEND_INSIDE = 4  # legends with more entries go below the panels (static export)
LEGEND_COLUMNS = 4
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]
#: Line.marker -> (matplotlib marker, filled, size; plotly symbol, size): a path's start and end
MARKERS = {"dot": ("o", True, 3, "circle", 6), "start": ("o", False, 8, "circle-open", 11),
           "end": ("*", True, 12, "star", 14)}


@dataclass
class Line:
    x: Sequence[float]
    y: Sequence[float]
    name: str = ""
    mode: str = "lines"  # lines | markers | lines+markers
    color: str | None = None
    dash: bool = False
    text: Sequence[str] | None = None  # hover labels
    legend: bool = True  # False: no legend entry (e.g. every seed after the first of a configuration)
    marker: str = "dot"  # a key of MARKERS: how its markers are drawn


@dataclass
class Bar:
    """Bars at x (numbers, or category labels); several Bars in a panel stand side by side."""

    x: Sequence
    y: Sequence[float]
    name: str = ""
    color: str | None = None


@dataclass
class Heatmap:
    z: Sequence[Sequence[float]]  # [len(y), len(x)]
    x: Sequence
    y: Sequence
    colorscale: str = "Viridis"


@dataclass
class Region:
    x: Sequence[float]  # polygon vertices
    y: Sequence[float]
    name: str
    color: str


@dataclass
class VLine:
    x: float
    name: str
    color: str = "black"


Trace = Union[Line, Bar, Heatmap, Region, VLine]


@dataclass
class Panel:
    title: str
    traces: list[Trace] = field(default_factory=list)
    xlabel: str = ""
    ylabel: str = ""
    logy: bool = False
    equal_axes: bool = False
    xticks: Sequence[tuple[float, str]] | None = None  # (position, label) instead of numbers
    yrange: tuple[float, float] | None = None  # fixed y axis (linear axes), e.g. one scale across panels
    xrange: tuple[float, float] | None = None


@dataclass
class FigureSpec:
    name: str  # file stem
    title: str
    panels: list[Panel]
    cols: int = 2
    panel_width: float = PANEL_WIDTH  # inches per panel in the static export (plotly: wider figures scale alike)

    @property
    def rows(self) -> int:
        return math.ceil(len(self.panels) / self.cols)


# ---- plotly ----------------------------------------------------------------------------------
VLINE_LABELS = ("top left", "top right", "bottom right", "bottom left")


def _label_position(panel: Panel, line: VLine) -> str:
    """Where a vertical line's label goes: by the lines' order along x, the first to the left of its line at
    the top, the next to the right, then the bottom right and left, so that labels of nearby lines never
    overlap (two events a few epochs apart: one reads leftwards, the other rightwards)."""
    lines = sorted((t for t in panel.traces if isinstance(t, VLine)), key=lambda t: t.x)
    return VLINE_LABELS[next(i for i, t in enumerate(lines) if t is line) % len(VLINE_LABELS)]


def to_plotly(spec: FigureSpec):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cols = min(spec.cols, len(spec.panels))
    chars = _title_chars(spec.panel_width)
    fig = make_subplots(rows=spec.rows, cols=cols, subplot_titles=[_wrap(p.title, chars, "<br>") for p in spec.panels])
    for i, panel in enumerate(spec.panels):
        row, col = i // cols + 1, i % cols + 1
        for j, tr in enumerate(panel.traces):
            color = getattr(tr, "color", None) or PALETTE[j % len(PALETTE)]
            if isinstance(tr, Line):
                *_, symbol, size = MARKERS[tr.marker]
                fig.add_trace(go.Scatter(x=list(tr.x), y=list(tr.y), name=tr.name, mode=tr.mode, text=tr.text,
                                         showlegend=tr.legend and bool(tr.name), legendgroup=tr.name or None,
                                         line=dict(color=color, dash="dash" if tr.dash else None),
                                         marker=dict(symbol=symbol, size=size)), row=row, col=col)
            elif isinstance(tr, Bar):
                fig.add_trace(go.Bar(x=list(tr.x), y=list(tr.y), name=tr.name, marker_color=color,
                                     showlegend=bool(tr.name)), row=row, col=col)
            elif isinstance(tr, Heatmap):
                fig.add_trace(go.Heatmap(z=tr.z, x=list(tr.x), y=list(tr.y), colorscale=tr.colorscale,
                                         showscale=False), row=row, col=col)
            elif isinstance(tr, Region):
                fig.add_trace(go.Scatter(x=list(tr.x), y=list(tr.y), name=tr.name, fill="toself", mode="lines",
                                         line=dict(width=0), fillcolor=_rgba(tr.color, 0.15)), row=row, col=col)
            elif isinstance(tr, VLine):
                fig.add_vline(x=tr.x, line=dict(color=tr.color, dash="dot"), row=row, col=col,
                              annotation_text=tr.name, annotation_position=_label_position(panel, tr))
        fig.update_xaxes(title_text=panel.xlabel, row=row, col=col)
        fig.update_yaxes(title_text=panel.ylabel, type="log" if panel.logy else None, range=panel.yrange, row=row, col=col)
        if panel.xrange is not None:
            fig.update_xaxes(range=panel.xrange, row=row, col=col)
        if panel.xticks is not None:
            fig.update_xaxes(tickvals=[p for p, _ in panel.xticks], ticktext=[_wrap(t, TICK_CHARS, "<br>") for _, t in panel.xticks],
                             row=row, col=col)
        if panel.equal_axes:
            fig.update_yaxes(scaleanchor=f"x{i + 1 if i else ''}", row=row, col=col)
    fig.update_layout(title=_wrap(spec.title, chars * cols, "<br>"), height=340 * spec.rows + 100, template="plotly_white",
                      barmode="group", width=round(130 * spec.panel_width * cols) if spec.panel_width > PANEL_WIDTH else None)
    return fig


PLOTLY_JS = "plotly.min.js"


def plotly_js() -> bytes:
    """plotly.min.js of the installed plotly package (~4.8 MB)."""
    return resources.files("plotly").joinpath("package_data", PLOTLY_JS).read_bytes()


def write_plotly_js(folder: Path) -> Path:
    """FOLDER/plotly.min.js, the installed plotly's (rewritten only where it differs); returns its path."""
    path, js = folder / PLOTLY_JS, plotly_js()
    if not path.is_file() or path.stat().st_size != len(js) or path.read_bytes() != js:
        atomic_write_bytes(path, js)
    return path


def figure_fragments(specs: Sequence[FigureSpec], inline_plotly: bool = True) -> list[str]:
    """One HTML <div> per spec; with inline_plotly the first also carries plotly.js itself (never a CDN link)."""
    return [to_plotly(spec).to_html(full_html=False, include_plotlyjs=inline_plotly and i == 0) for i, spec in enumerate(specs)]


def html_page(title: str, specs: Sequence[FigureSpec], intro_html: str = "", plotly_src: str | None = None) -> str:
    """A page that works offline: title, intro (HTML) and every figure, interactive. plotly.js is inlined (the page
    stands alone, +4.8 MB), or with plotly_src loaded from that relative path (a copy from write_plotly_js)."""
    import html

    head = "" if plotly_src is None else f'<script src="{html.escape(plotly_src)}"></script>\n'
    return f"""<!DOCTYPE html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
{head}<style>body{{font-family:sans-serif;margin:2em}} table{{border-collapse:collapse}} th,td{{padding:2px 10px;text-align:left}}</style>
</head><body>
<h1>{html.escape(title)}</h1>
{intro_html}
{"".join(figure_fragments(specs, inline_plotly=plotly_src is None))}
</body></html>
"""


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# ---- matplotlib (static export) --------------------------------------------------------------
STATIC_FORMATS = ("png", "pdf", "svg")


def check_formats(formats: Sequence[str]) -> None:
    """A GeoError naming any format save_static cannot write (checked before the work, not after it)."""
    bad = [f for f in formats if f not in STATIC_FORMATS]
    if bad:
        raise GeoError(f"static format(s) {bad} not supported; use a comma-separated subset of {', '.join(STATIC_FORMATS)}")


def save_static(spec: FigureSpec, folder: Path, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Render the spec with matplotlib and write FOLDER/<name>.<fmt> for each format."""
    fig = to_matplotlib(spec)
    paths = []
    for fmt in formats:
        path = folder / f"{spec.name}.{fmt}"
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=110)
        atomic_write_bytes(path, buf.getvalue())
        paths.append(path)
    return paths


def to_matplotlib(spec: FigureSpec):
    """The spec as a matplotlib Figure (not registered with pyplot: no global state, any backend;
    a notebook displays it as the value of a cell)."""
    from matplotlib.figure import Figure

    cols = min(spec.cols, len(spec.panels))
    fig = Figure(figsize=(spec.panel_width * cols, 3.8 * spec.rows))
    axes = fig.subplots(spec.rows, cols, squeeze=False)
    chars = _title_chars(spec.panel_width)
    for ax in axes.flat[len(spec.panels) :]:
        ax.set_visible(False)
    for panel, ax in zip(spec.panels, axes.flat):
        bars = [t for t in panel.traces if isinstance(t, Bar)]
        slots = _bar_slots(bars)
        for j, tr in enumerate(panel.traces):
            color = getattr(tr, "color", None) or PALETTE[j % len(PALETTE)]
            if isinstance(tr, Line):
                linestyle = "none" if tr.mode == "markers" else ("--" if tr.dash else "-")
                marker, filled, size, *_ = MARKERS[tr.marker]
                ax.plot(list(tr.x), list(tr.y), color=color, label=(tr.name or None) if tr.legend else None,
                        markersize=size, markerfacecolor=None if filled else "none", linestyle=linestyle,
                        marker=marker if "markers" in tr.mode else None)
            elif isinstance(tr, Bar):
                i = bars.index(tr)
                x = [slots.position(v) + (i - (len(bars) - 1) / 2) * slots.width for v in tr.x]
                ax.bar(x, list(tr.y), width=slots.width, color=color, label=tr.name or None)
            elif isinstance(tr, Heatmap):
                xs, ys = list(tr.x), list(tr.y)
                ax.pcolormesh(range(len(xs) + 1), range(len(ys) + 1), tr.z, cmap=_mpl_cmap(tr.colorscale), shading="flat")
                _ticks(ax.set_xticks, ax.set_xticklabels, xs)
                _ticks(ax.set_yticks, ax.set_yticklabels, ys)
            elif isinstance(tr, Region):
                ax.fill(list(tr.x), list(tr.y), color=color, alpha=0.15, label=tr.name)
            elif isinstance(tr, VLine):
                ax.axvline(tr.x, color=tr.color, linestyle=":", label=tr.name)
        ax.set_title(_wrap(panel.title, chars, "\n"), fontsize=8)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        if panel.logy:
            ax.set_yscale("log")
        if panel.yrange is not None:
            ax.set_ylim(*panel.yrange)
        if panel.xrange is not None:
            ax.set_xlim(*panel.xrange)
        if panel.equal_axes:
            ax.set_aspect("equal", adjustable="datalim")
        if slots.labels:
            ax.set_xticks(range(len(slots.labels)), slots.labels, fontsize=7)
        if panel.xticks is not None:
            ax.set_xticks([p for p, _ in panel.xticks], [_wrap(t, TICK_CHARS, "\n") for _, t in panel.xticks], fontsize=6)
    fig.suptitle(_wrap(spec.title, chars * cols, "\n"), fontsize=10, y=1 - 0.08 / fig.get_figheight(), va="top")
    _legends(fig, axes.flat[: len(spec.panels)])
    return fig


def _legends(fig, axes) -> None:
    """Legends that never hide data: up to LEGEND_INSIDE entries inside the panel where it fits best;
    more below the panels, once for the figure when every panel names the same entries."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    entries = [ax.get_legend_handles_labels() for ax in axes]
    named = [labels for _, labels in entries if labels]
    if named and len(named[0]) > LEGEND_INSIDE and all(labels == named[0] for labels in named):
        handles, labels = next(e for e in entries if e[1])
        ncol = min(len(labels), LEGEND_COLUMNS)
        legend = fig.legend(handles, labels, loc="lower center", ncol=ncol, fontsize=7, frameon=False)
        height = legend.get_window_extent(FigureCanvasAgg(fig).get_renderer()).height / fig.dpi  # inches
        fig.tight_layout(rect=(0, (height + 0.1) / fig.get_figheight(), 1, 1))
        return
    for ax, (_, labels) in zip(axes, entries):
        if len(labels) > LEGEND_INSIDE:
            ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.16), ncol=2, frameon=False)
        elif labels:
            ax.legend(fontsize=7)
    fig.tight_layout()


@dataclass
class _BarSlots:
    """Where a panel's bars stand in matplotlib: numeric x as is, category labels at 0, 1, ...;
    `width` per bar so that the bars of one x fill 80% of the smallest gap."""

    labels: list[str]
    width: float

    def position(self, x) -> float:
        return float(self.labels.index(str(x))) if self.labels else float(x)


def _bar_slots(bars: list[Bar]) -> _BarSlots:
    xs = [x for b in bars for x in b.x]
    if not xs:
        return _BarSlots([], 0.8)
    if any(isinstance(x, str) for x in xs):
        labels = list(dict.fromkeys(map(str, xs)))
        return _BarSlots(labels, 0.8 / len(bars))
    values = sorted(set(float(x) for x in xs))
    gap = min((b - a for a, b in zip(values, values[1:])), default=1.0)
    return _BarSlots([], 0.8 * gap / len(bars))


TICK_CHARS = 22  # wrap category tick labels at about this many characters


def _title_chars(panel_width: float) -> int:
    """About how many characters of an 8-10 pt title fit across a panel `panel_width` inches wide."""
    return max(30, int(13 * panel_width))


def _wrap(text: str, width: int, newline: str) -> str:
    return newline.join(textwrap.wrap(text, width)) or text


def _mpl_cmap(name: str) -> str:
    """matplotlib's name of a plotly colorscale ('Viridis' -> 'viridis', 'Blues' -> 'Blues')."""
    import matplotlib

    return name if name in matplotlib.colormaps else name.lower()


def _ticks(set_ticks, set_labels, labels: list, max_ticks: int = 12) -> None:
    every = max(1, math.ceil(len(labels) / max_ticks))
    idx = list(range(0, len(labels), every))
    set_ticks([i + 0.5 for i in idx])
    set_labels([str(labels[i]) for i in idx], fontsize=7)
