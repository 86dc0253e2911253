"""A trace's result's charts as matplotlib figures (``Result.charts``), for a notebook.

Registered into :mod:`traceinsight.results.shown` when this module is imported (the public API
does). The figures are the page's charts (:func:`traceinsight.render.html.chart_specs`), drawn when
first asked for: matplotlib is imported then, not before.
"""

from __future__ import annotations

from typing import Any

from traceinsight.render import NotLive
from traceinsight.results import Result
from traceinsight.results.shown import figures_of

__all__ = ["result_figures"]


@figures_of.register
def result_figures(result: Result) -> dict[str, Any]:
    """A live result's page charts as matplotlib figures, by name (those with something to show)."""
    from traceinsight.render.html import chart_specs

    if result.report is None:
        raise NotLive(
            f"cannot draw the charts of {result.trace.name} from a stored result: it holds the figures, "
            "not the timeline; analyze its trace"
        )
    figures = {spec.chart_id: spec.build() for spec in chart_specs(result.report.analysis)}
    return {name: figure for name, figure in figures.items() if figure is not None}
