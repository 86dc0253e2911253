"""The page's charts as matplotlib Figures: a chart's marks (:attr:`~.svg.Canvas.marks`, the one
spec both backends draw) drawn by matplotlib, with the page's labels, colours and layout.

A Figure is as large as the page's chart (1 unit of the chart = 1 point), its one Axes covers it
with the chart's coordinates (y down) and no frame; every mark is an artist of that Axes, so a
Figure restyles, saves (``savefig`` to PNG, PDF, SVG) and sits in a grid of the user's own plots
as any other. Text is never parsed as mathtext (a kernel's name may hold ``$``). This module is
imported when a chart is first asked for: matplotlib's import (about 0.3 s) is not part of
``analyze``.
"""

from __future__ import annotations

import io
from collections.abc import Sequence

from matplotlib.collections import PolyCollection
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from traceinsight.render.svg import FOREGROUND, Canvas

__all__ = ["INK", "ChartFigure", "figure_of"]

#: The page's ``currentColor`` (its text colour) in a Figure: a light theme's.
INK = "#1f2328"
_ANCHORS = {"start": "left", "middle": "center", "end": "right"}


def _color(color: str) -> str:
    return INK if color == FOREGROUND else color


def _style(dash: str | None, width: float) -> object:
    """SVG's ``stroke-dasharray`` as a matplotlib line style (dash lengths scale with the width)."""
    if not dash:
        return "solid"
    return (0, tuple(float(part) / max(width, 0.1) for part in dash.split()))


def _boxes(spans: Sequence[tuple[float, float]], y: float, height: float) -> list[list[tuple[float, float]]]:
    return [
        [(x0, y), (x0 + max(x1 - x0, 0.5), y), (x0 + max(x1 - x0, 0.5), y + height), (x0, y + height)]
        for x0, x1 in spans
    ]


class ChartFigure(Figure):
    """A Figure that shows itself in a notebook (as PNG) without pyplot, and keeps the page's
    chart it was drawn from: ``svg`` (the page's markup) and ``caption``."""

    svg: str = ""
    caption: str = ""

    def _repr_png_(self) -> bytes:
        buffer = io.BytesIO()
        self.savefig(buffer, format="png")
        return buffer.getvalue()


def figure_of(canvas: Canvas, title: str, caption: str = "", svg: str = "") -> ChartFigure:
    """``canvas``'s chart as a Figure labelled ``title`` (``figure.get_label()``)."""
    figure = ChartFigure(figsize=(canvas.width / 72, canvas.height / 72), dpi=100)
    figure.set_label(title)
    figure.svg, figure.caption = svg, caption
    axes = figure.add_axes((0.0, 0.0, 1.0, 1.0))
    axes.set_xlim(0, canvas.width)
    axes.set_ylim(canvas.height, 0)
    axes.set_axis_off()
    for kind, arguments in canvas.marks:
        if kind == "rect":
            x, y, width, height, fill, opacity = arguments
            axes.add_patch(
                Rectangle((x, y), width, height, facecolor=_color(fill), alpha=opacity, linewidth=0)
            )
        elif kind == "spans":
            spans, y, height, fill, opacity = arguments
            axes.add_collection(
                PolyCollection(_boxes(spans, y, height), facecolors=_color(fill), alpha=opacity, linewidths=0)
            )
        elif kind == "line":
            x1, y1, x2, y2, color, width, dash, opacity = arguments
            axes.plot([x1, x2], [y1, y2], color=_color(color), linewidth=width, linestyle=_style(dash, width),
                      alpha=opacity, solid_capstyle="butt")  # fmt: skip
        elif kind == "polyline":
            points, color, width, dash = arguments
            axes.plot([x for x, _ in points], [y for _, y in points], color=_color(color), linewidth=width,
                      linestyle=_style(dash, width), solid_joinstyle="round")  # fmt: skip
        elif kind == "triangles":
            xs, y, size, color = arguments
            half = size / 2
            shapes = [[(x - half, y), (x + half, y), (x, y + size)] for x in xs]
            axes.add_collection(PolyCollection(shapes, facecolors=_color(color), linewidths=0))
        elif kind == "text":
            x, y, text, size, anchor, opacity, color = arguments
            axes.text(x, y, text, fontsize=size, ha=_ANCHORS.get(anchor, "left"), va="baseline",
                      color=_color(color), alpha=opacity, family="DejaVu Sans", parse_math=False)  # fmt: skip
    return figure
