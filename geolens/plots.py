"""Figures as small declarative specs, rendered two ways: interactive plotly (the HTML report) and
static matplotlib (PNG/SVG export, no browser needed).

A FigureSpec is a grid of Panels; a Panel holds traces: Line, Heatmap, Region (filled polygon)
and VLine. Each figure of the report is built once as a spec, so both renderings show the same data.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence, Union

from geolens.storage import atomic_write_bytes

PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf"]


@dataclass
class Line:
    x: Sequence[float]
    y: Sequence[float]
    name: str = ""
    mode: str = "lines"  # lines | markers | lines+markers
    color: str | None = None
    dash: bool = False
    text: Sequence[str] | None = None  # hover labels


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


Trace = Union[Line, Heatmap, Region, VLine]


@dataclass
class Panel:
    title: str
    traces: list[Trace] = field(default_factory=list)
    xlabel: str = ""
    ylabel: str = ""
    logy: bool = False
    equal_axes: bool = False


@dataclass
class FigureSpec:
    name: str  # file stem
    title: str
    panels: list[Panel]
    cols: int = 2

    @property
    def rows(self) -> int:
        return math.ceil(len(self.panels) / self.cols)


# ---- plotly ----------------------------------------------------------------------------------
def to_plotly(spec: FigureSpec):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    cols = min(spec.cols, len(spec.panels))
    fig = make_subplots(rows=spec.rows, cols=cols, subplot_titles=[p.title for p in spec.panels])
    for i, panel in enumerate(spec.panels):
        row, col = i // cols + 1, i % cols + 1
        for j, tr in enumerate(panel.traces):
            color = getattr(tr, "color", None) or PALETTE[j % len(PALETTE)]
            if isinstance(tr, Line):
                fig.add_trace(go.Scatter(x=list(tr.x), y=list(tr.y), name=tr.name, mode=tr.mode, text=tr.text,
                                         line=dict(color=color, dash="dash" if tr.dash else None)), row=row, col=col)
            elif isinstance(tr, Heatmap):
                fig.add_trace(go.Heatmap(z=tr.z, x=list(tr.x), y=list(tr.y), colorscale=tr.colorscale,
                                         showscale=False), row=row, col=col)
            elif isinstance(tr, Region):
                fig.add_trace(go.Scatter(x=list(tr.x), y=list(tr.y), name=tr.name, fill="toself", mode="lines",
                                         line=dict(width=0), fillcolor=_rgba(tr.color, 0.15)), row=row, col=col)
            elif isinstance(tr, VLine):
                fig.add_vline(x=tr.x, line=dict(color=tr.color, dash="dot"), row=row, col=col,
                              annotation_text=tr.name, annotation_position="top left")
        fig.update_xaxes(title_text=panel.xlabel, row=row, col=col)
        fig.update_yaxes(title_text=panel.ylabel, type="log" if panel.logy else None, row=row, col=col)
        if panel.equal_axes:
            fig.update_yaxes(scaleanchor=f"x{i + 1 if i else ''}", row=row, col=col)
    fig.update_layout(title=spec.title, height=340 * spec.rows + 80, template="plotly_white")
    return fig


def _rgba(hex_color: str, alpha: float) -> str:
    h = hex_color.lstrip("#")
    r, g, b = (int(h[i : i + 2], 16) for i in (0, 2, 4))
    return f"rgba({r},{g},{b},{alpha})"


# ---- matplotlib (static export) --------------------------------------------------------------
def save_static(spec: FigureSpec, folder: Path, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Render the spec with matplotlib (Agg) and write FOLDER/<name>.<fmt> for each format."""
    import matplotlib

    matplotlib.use("Agg", force=True)
    import matplotlib.pyplot as plt

    cols = min(spec.cols, len(spec.panels))
    fig, axes = plt.subplots(spec.rows, cols, figsize=(5.2 * cols, 3.6 * spec.rows), squeeze=False)
    for ax in axes.flat[len(spec.panels) :]:
        ax.set_visible(False)
    for panel, ax in zip(spec.panels, axes.flat):
        for j, tr in enumerate(panel.traces):
            color = getattr(tr, "color", None) or PALETTE[j % len(PALETTE)]
            if isinstance(tr, Line):
                linestyle = "none" if tr.mode == "markers" else ("--" if tr.dash else "-")
                marker = "o" if "markers" in tr.mode else None
                ax.plot(list(tr.x), list(tr.y), color=color, label=tr.name or None, markersize=3,
                        linestyle=linestyle, marker=marker)
            elif isinstance(tr, Heatmap):
                xs, ys = list(tr.x), list(tr.y)
                ax.pcolormesh(range(len(xs) + 1), range(len(ys) + 1), tr.z, cmap=_mpl_cmap(tr.colorscale), shading="flat")
                _ticks(ax.set_xticks, ax.set_xticklabels, xs)
                _ticks(ax.set_yticks, ax.set_yticklabels, ys)
            elif isinstance(tr, Region):
                ax.fill(list(tr.x), list(tr.y), color=color, alpha=0.15, label=tr.name)
            elif isinstance(tr, VLine):
                ax.axvline(tr.x, color=tr.color, linestyle=":", label=tr.name)
        ax.set_title(panel.title, fontsize=10)
        ax.set_xlabel(panel.xlabel)
        ax.set_ylabel(panel.ylabel)
        if panel.logy:
            ax.set_yscale("log")
        if panel.equal_axes:
            ax.set_aspect("equal", adjustable="datalim")
        if any(getattr(t, "name", "") for t in panel.traces if not isinstance(t, Heatmap)):
            ax.legend(fontsize=7)
    fig.suptitle(spec.title)
    fig.tight_layout()
    paths = []
    for fmt in formats:
        path = folder / f"{spec.name}.{fmt}"
        buf = io.BytesIO()
        fig.savefig(buf, format=fmt, dpi=110)
        atomic_write_bytes(path, buf.getvalue())
        paths.append(path)
    plt.close(fig)
    return paths


def _mpl_cmap(name: str) -> str:
    """matplotlib's name of a plotly colorscale ('Viridis' -> 'viridis', 'Blues' -> 'Blues')."""
    import matplotlib

    return name if name in matplotlib.colormaps else name.lower()


def _ticks(set_ticks, set_labels, labels: list, max_ticks: int = 12) -> None:
    every = max(1, math.ceil(len(labels) / max_ticks))
    idx = list(range(0, len(labels), every))
    set_ticks([i + 0.5 for i in idx])
    set_labels([str(labels[i]) for i in idx], fontsize=7)
