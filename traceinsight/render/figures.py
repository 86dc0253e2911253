"""A trace's result's charts (``Result.charts``), for a notebook: the page's own charts as
matplotlib Figures.

Registered into :mod:`traceinsight.shown` when this module is imported (the public API
does). The charts are the page's (:func:`traceinsight.render.html.chart_specs`): each chart's
marks, the spec the page's SVG is written from, drawn by matplotlib (:mod:`.mpl`) when first asked
for; the page itself draws no chart with matplotlib (issue 34: its import is 0.3 s of a small
trace's ``analyze``), so matplotlib is imported here only then.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from traceinsight.render.diff import BEFORE_AFTER, before_after_canvas
from traceinsight.render.html import chart_specs
from traceinsight.render.job_html import ARRIVALS, arrivals_chart
from traceinsight.render.svg import Canvas
from traceinsight.results import Comparison, JobResult, Result
from traceinsight.shown import figures_of

if TYPE_CHECKING:
    from traceinsight.render.mpl import ChartFigure

__all__ = ["result_figures"]


def _figure(canvas: Canvas, title: str, caption: str, svg: str) -> ChartFigure:
    """:func:`.mpl.figure_of`: matplotlib (0.3 s) imported only when a chart is asked for."""
    from traceinsight.render.mpl import figure_of

    return figure_of(canvas, title, caption, svg)


@figures_of.register(Result)  # by class: the annotations name types imported for the checker only
def result_figures(result: Result) -> dict[str, ChartFigure]:
    """A result's page charts, by name (those with something to show): a stored one's too."""
    drawings: dict[str, ChartFigure] = {}
    for spec in chart_specs(result):
        canvas = spec.build()
        if canvas is not None:
            svg = canvas.svg(spec.chart_id, spec.title)
            drawings[spec.chart_id] = _figure(canvas, spec.title, spec.caption, svg)
    return drawings


@figures_of.register(JobResult)
def job_figures(job: JobResult) -> dict[str, ChartFigure]:
    """A job's chart (each collective's arrivals across ranks, as on its page), by name: a stored
    result's too (it keeps the arrivals)."""
    canvas = arrivals_chart(job.job.collectives.arrivals)
    if canvas is None:
        return {}
    name, title = ARRIVALS
    return {name: _figure(canvas, title, "", canvas.svg(name, title))}


@figures_of.register(Comparison)
def comparison_figures(comparison: Comparison) -> dict[str, ChartFigure]:
    """A comparison's chart (the step time before and after, as on its page), by name."""
    canvas = before_after_canvas(comparison)
    if canvas is None:
        return {}
    name, title = BEFORE_AFTER
    return {name: _figure(canvas, title, "", canvas.svg(name, title))}
