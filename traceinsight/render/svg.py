"""A small SVG writer for the report's charts: shapes, text, axes and legends, written directly.

The charts are simple (bars, rectangles on a time axis, step lines), so they are written as SVG
elements here rather than drawn by a plotting library: the page costs no plotting import and no
glyph outlines, and the same values give the same bytes. Coordinates are in points of a chart
720 points wide (the page scales it to its width); text is ``<text>`` in the page's sans-serif
font, laid out with the advance widths of DejaVu Sans (:func:`text_width`), which is as wide as or
wider than the usual sans-serif fonts, so labels measured with it fit in any of them.

Text and axes are drawn in ``currentColor``, so a chart follows the page's text colour in light
mode, dark mode and print. Every string is escaped; nothing from a trace is interpreted.
"""

from __future__ import annotations

import math
import unicodedata
from collections.abc import Sequence
from typing import Any, Final

from markupsafe import escape

from traceinsight.model import Model

__all__ = [
    "FOREGROUND",
    "WIDTH",
    "Axis",
    "Canvas",
    "LegendItem",
    "legend_height",
    "nice_ticks",
    "number",
    "text_width",
]

#: Chart width in points (the page scales the SVG to its own width).
WIDTH: Final[float] = 720.0
#: Text, axes and ticks: the page's text colour.
FOREGROUND: Final[str] = "currentColor"
FONT_SIZE: Final[float] = 9.0
SMALL_SIZE: Final[float] = 7.5
LEGEND_SIZE: Final[float] = 8.5
FONT_FAMILY: Final[str] = "'DejaVu Sans', Verdana, 'Segoe UI', Helvetica, Arial, sans-serif"

#: DejaVu Sans advance widths of the printable ASCII characters (32-126), in 1/1000 em.
_ASCII_WIDTHS: Final[tuple[int, ...]] = (
    318, 401, 460, 838, 636, 950, 780, 275, 390, 390, 500, 838, 318, 361, 318, 337,
    636, 636, 636, 636, 636, 636, 636, 636, 636, 636, 337, 337, 838, 838, 838, 531,
    1000, 684, 686, 698, 770, 632, 575, 775, 752, 295, 295, 656, 557, 863, 748, 787,
    603, 787, 695, 635, 611, 732, 684, 989, 685, 611, 685, 390, 337, 390, 838, 500,
    500, 613, 635, 550, 635, 615, 352, 635, 634, 278, 278, 579, 278, 974, 634, 612,
    635, 635, 411, 521, 392, 634, 592, 818, 592, 592, 525, 636, 337, 636, 838,
)  # fmt: skip
#: Other characters the charts write themselves (DejaVu Sans widths).
_OTHER_WIDTHS: Final[dict[str, int]] = {"…": 1000, "→": 838, "·": 318, "µ": 636, "×": 838, "−": 838}


def _char_width(char: str) -> int:
    code = ord(char)
    if 32 <= code <= 126:
        return _ASCII_WIDTHS[code - 32]
    known = _OTHER_WIDTHS.get(char)
    if known is not None:
        return known
    if unicodedata.combining(char):
        return 0
    return 1000 if unicodedata.east_asian_width(char) in ("W", "F") else 700


def text_width(text: str, size: float = FONT_SIZE) -> float:
    """The width of ``text`` at ``size`` points in DejaVu Sans (see the module docstring)."""
    return sum(_char_width(char) for char in text) * size / 1000


def number(value: float) -> str:
    """A coordinate as written: at most two decimals, no trailing zeros (``-0`` as ``0``)."""
    text = f"{value:.2f}".rstrip("0").rstrip(".")
    return "0" if text in ("-0", "") else text


def nice_ticks(low: float, high: float, most: int = 8) -> list[float]:
    """Round tick values covering ``[low, high]`` (steps of 1, 2, 2.5 or 5 × 10^k), at most
    ``most`` + 1 of them, all inside the range."""
    span = high - low
    if not math.isfinite(span) or span <= 0:
        return [low]
    raw = span / most
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 2.5, 5, 10) if m * power >= raw)
    first = math.ceil(low / step - 1e-9)
    last = math.floor(high / step + 1e-9)
    return [k * step for k in range(first, last + 1)]


def tick_label(value: float, ticks: Sequence[float]) -> str:
    """``value`` written with as many decimals as the tick step needs."""
    step = ticks[1] - ticks[0] if len(ticks) > 1 else abs(value) or 1.0
    decimals = 0
    while decimals < 6 and abs(step * 10**decimals - round(step * 10**decimals)) > 1e-6:
        decimals += 1
    text = f"{value:.{decimals}f}"
    return "0" if float(text) == 0 else text


class Axis(Model, frozen=True):
    """A linear scale: data values ``low``..``high`` onto points ``start``..``end``."""

    low: float
    high: float
    start: float
    end: float

    def __call__(self, value: float) -> float:
        if self.high == self.low:
            return self.start
        return self.start + (value - self.low) * (self.end - self.start) / (self.high - self.low)


class LegendItem(Model, frozen=True):
    """One legend entry: a swatch (``box``, ``line``, ``dashed``, ``dotted``, ``triangle``) and its text."""

    label: str
    color: str
    shape: str = "box"
    opacity: float = 1.0


_LEGEND_ROW: Final[float] = 14.0
_SWATCH: Final[float] = 16.0


def _legend_columns(items: Sequence[LegendItem], columns: int, width: float) -> int:
    """As many columns as asked for, fewer when the widest entries would not fit in ``width``."""
    columns = max(1, min(columns, len(items)))
    while columns > 1:
        widest = max(_SWATCH + 4 + text_width(item.label, LEGEND_SIZE) for item in items)
        if columns * (widest + 14) <= width:
            break
        columns -= 1
    return columns


def legend_height(items: Sequence[LegendItem], columns: int, width: float = WIDTH) -> float:
    """The height :meth:`Canvas.legend` takes for ``items`` (0 without items)."""
    if not items:
        return 0.0
    per_row = _legend_columns(items, columns, width - 20)
    return math.ceil(len(items) / per_row) * _LEGEND_ROW + 6


#: One drawn mark, as :meth:`Canvas.marks` keeps it: its kind (``rect``, ``spans``, ``line``,
#: ``polyline``, ``triangles``, ``text``) and the drawing method's arguments.
Mark = tuple[str, tuple[Any, ...]]


class Canvas:
    """One chart, ``height`` points tall and :data:`WIDTH` wide: its marks (the chart's spec, read
    by every backend: :meth:`svg` for the page, :func:`traceinsight.render.figures.figure_of` for
    a matplotlib Figure) and their SVG elements."""

    def __init__(self, height: float, width: float = WIDTH) -> None:
        self.width = width
        self.height = height
        self._parts: list[str] = []
        self.marks: list[Mark] = []

    def rect(self, x: float, y: float, width: float, height: float, fill: str, opacity: float = 1.0) -> None:
        """One filled rectangle (nothing when it has no width)."""
        if width <= 0 or height <= 0:
            return
        self.marks.append(("rect", (x, y, width, height, fill, opacity)))
        self._parts.append(
            f'<rect x="{number(x)}" y="{number(y)}" width="{number(width)}" height="{number(height)}" '
            f'fill="{fill}"{_opacity(opacity)}/>'
        )

    def spans(
        self, spans: Sequence[tuple[float, float]], y: float, height: float, fill: str, opacity: float = 1.0
    ) -> None:
        """Rectangles from x0 to x1 (points), all ``y``..``y + height``, as one path: far smaller
        than one element each. Each is at least 0.5 points wide so that it shows."""
        if not spans:
            return
        self.marks.append(("spans", (tuple(spans), y, height, fill, opacity)))
        top, tall = number(y), number(height)
        moves = "".join(
            f"M{number(x0)} {top}h{number(max(x1 - x0, 0.5))}v{tall}h{number(-max(x1 - x0, 0.5))}z"
            for x0, x1 in spans
        )
        self._parts.append(f'<path d="{moves}" fill="{fill}"{_opacity(opacity)}/>')

    def line(
        self,
        x1: float,
        y1: float,
        x2: float,
        y2: float,
        color: str = FOREGROUND,
        width: float = 0.8,
        dash: str | None = None,
        opacity: float = 1.0,
    ) -> None:
        """A straight line."""
        self.marks.append(("line", (x1, y1, x2, y2, color, width, dash, opacity)))
        self._parts.append(
            f'<line x1="{number(x1)}" y1="{number(y1)}" x2="{number(x2)}" y2="{number(y2)}" '
            f'stroke="{color}" stroke-width="{number(width)}"'
            + (f' stroke-dasharray="{dash}"' if dash else "")
            + f"{_opacity(opacity, 'stroke-opacity')}/>"
        )

    def polyline(
        self, points: Sequence[tuple[float, float]], color: str, width: float = 1.5, dash: str | None = None
    ) -> None:
        """An open line through ``points``."""
        if len(points) < 2:
            return
        self.marks.append(("polyline", (tuple(points), color, width, dash)))
        path = "M" + "L".join(f"{number(x)} {number(y)}" for x, y in points)
        self._parts.append(
            f'<path d="{path}" fill="none" stroke="{color}" stroke-width="{number(width)}"'
            f' stroke-linejoin="round"' + (f' stroke-dasharray="{dash}"' if dash else "") + "/>"
        )

    def triangles(self, xs: Sequence[float], y: float, size: float, color: str) -> None:
        """Downward triangles centred on each x with their tip at ``y`` + ``size``, as one path."""
        if not xs:
            return
        self.marks.append(("triangles", (tuple(xs), y, size, color)))
        half = size / 2
        path = "".join(
            f"M{number(x - half)} {number(y)}h{number(size)}l{number(-half)} {number(size)}z" for x in xs
        )
        self._parts.append(f'<path d="{path}" fill="{color}"/>')

    def text(
        self,
        x: float,
        y: float,
        text: str,
        size: float = FONT_SIZE,
        anchor: str = "start",
        opacity: float = 1.0,
        color: str = FOREGROUND,
    ) -> None:
        """``text`` with its baseline's ``anchor`` point at (x, y); escaped, never interpreted."""
        self.marks.append(("text", (x, y, text, size, anchor, opacity, color)))
        anchor_attribute = "" if anchor == "start" else f' text-anchor="{anchor}"'
        size_attribute = "" if size == FONT_SIZE else f' font-size="{number(size)}"'
        self._parts.append(
            f'<text x="{number(x)}" y="{number(y)}"{anchor_attribute}{size_attribute}'
            f"{_opacity(opacity, 'fill-opacity')}"
            + ("" if color == FOREGROUND else f' fill="{color}"')
            + f">{escape(text)}</text>"
        )

    def x_axis(
        self, axis: Axis, top: float, bottom: float, label: str, grid: bool = True, most: int = 8
    ) -> None:
        """Ticks and their values below ``bottom`` (gridlines up to ``top``), the axis line, and
        ``label`` under them."""
        ticks = nice_ticks(min(axis.low, axis.high), max(axis.low, axis.high), most)
        for value in ticks:
            x = axis(value)
            if grid:
                self.line(x, top, x, bottom, width=0.6, opacity=0.18)
            self.line(x, bottom, x, bottom + 3.5)
            self.text(x, bottom + 13, tick_label(value, ticks), anchor="middle")
        self.line(axis.start, bottom, axis.end, bottom)
        self.text((axis.start + axis.end) / 2, bottom + 26, label, anchor="middle")

    def y_axis(self, axis: Axis, left: float, right: float, label: str, most: int = 6) -> None:
        """Ticks and their values left of ``left`` (gridlines to ``right``), the axis line, and
        ``label`` above it."""
        ticks = nice_ticks(min(axis.low, axis.high), max(axis.low, axis.high), most)
        for value in ticks:
            y = axis(value)
            self.line(left, y, right, y, width=0.6, opacity=0.18)
            self.line(left - 3.5, y, left, y)
            self.text(left - 6, y + 3, tick_label(value, ticks), anchor="end")
        self.line(left, axis.start, left, axis.end)
        self.text(left - 6, min(axis.start, axis.end) - 8, label, anchor="end")

    def legend(self, items: Sequence[LegendItem], top: float, columns: int) -> None:
        """``items`` in rows of at most ``columns``, centred, from ``top`` down
        (:func:`legend_height` tall)."""
        if not items:
            return
        per_row = _legend_columns(items, columns, self.width - 20)
        widths = [_SWATCH + 4 + text_width(item.label, LEGEND_SIZE) for item in items]
        column_width = [
            max(widths[index] for index in range(column, len(items), per_row)) + 14
            for column in range(per_row)
        ]
        left = (self.width - sum(column_width)) / 2
        for index, item in enumerate(items):
            row, column = divmod(index, per_row)
            x = left + sum(column_width[:column])
            y = top + row * _LEGEND_ROW + 4
            self._swatch(item, x, y)
            self.text(x + _SWATCH + 4, y + 7.5, item.label, size=LEGEND_SIZE)

    def _swatch(self, item: LegendItem, x: float, y: float) -> None:
        middle = y + 4.5
        if item.shape == "box":
            self.rect(x, y, _SWATCH, 9, item.color, item.opacity)
        elif item.shape == "triangle":
            self.triangles([x + _SWATCH / 2], y + 1, 7, item.color)
        else:
            dash = {"line": None, "dashed": "4 2", "dotted": "1.2 2"}.get(item.shape)
            self.line(x, middle, x + _SWATCH, middle, item.color, 1.5, dash, item.opacity)

    def svg(self, chart_id: str, title: str) -> str:
        """The chart as one ``<svg>`` element; ``title`` is its accessible name."""
        return (
            f'<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {number(self.width)} '
            f'{number(self.height)}" role="img" aria-labelledby="{chart_id}-title" class="chart-svg" '
            f'font-family="{FONT_FAMILY}" font-size="{number(FONT_SIZE)}" fill="{FOREGROUND}">'
            f'<title id="{chart_id}-title">{escape(title)}</title>\n' + "\n".join(self._parts) + "\n</svg>"
        )


def _opacity(value: float, attribute: str = "fill-opacity") -> str:
    return "" if value >= 1.0 else f' {attribute}="{number(value)}"'
