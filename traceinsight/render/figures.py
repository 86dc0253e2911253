"""A trace's result's charts (``Result.charts``), for a notebook: the page's own charts.

Registered into :mod:`traceinsight.shown` when this module is imported (the public API
does). The charts are the page's (:func:`traceinsight.render.html.chart_specs`), written as SVG
when first asked for (issue 34: the page draws no charts with matplotlib, so nothing here imports a
plotting library). Each shows itself in a notebook (``_repr_svg_``) and can be saved as a file.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from traceinsight.render import NotLive
from traceinsight.results import Result
from traceinsight.shown import figures_of

__all__ = ["Drawing", "result_figures"]


@dataclass(frozen=True, slots=True)
class Drawing:
    """One of the page's charts: its name, title, one-line caption and SVG markup."""

    name: str
    title: str
    caption: str
    svg: str

    def _repr_svg_(self) -> str:
        return self.svg

    def save(self, path: str | Path) -> Path:
        """Write the chart as an SVG file at ``path``; the path written."""
        target = Path(path)
        target.write_text(self.svg, encoding="utf-8")
        return target


@figures_of.register
def result_figures(result: Result) -> dict[str, Any]:
    """A live result's page charts, by name (those with something to show)."""
    from traceinsight.render.html import chart_specs

    if result.report is None:
        raise NotLive(
            f"cannot draw the charts of {result.trace.name} from a stored result: it holds the figures, "
            "not the timeline; analyze its trace"
        )
    drawings: dict[str, Any] = {}
    for spec in chart_specs(result.report.analysis):
        canvas = spec.build()
        if canvas is not None:
            svg = canvas.svg(spec.chart_id, spec.title)
            drawings[spec.chart_id] = Drawing(spec.chart_id, spec.title, spec.caption, svg)
    return drawings
