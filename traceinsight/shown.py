"""How a result shows itself in a notebook: two hooks, filled in by the renderers.

A result's ``_repr_html_`` (Jupyter's rich display) shows the scorecard and the finding cards of
the page, and ``Result.charts`` the page's charts: both are drawn by the renderers, a layer above
the results, which the results never import. The renderers register here what they draw for each
result type (:mod:`traceinsight.render.notebook`, imported with the public API: ``import
traceinsight`` then ``traceinsight.analyze(...)``); until they do, a result shows as its ``repr``
and has no charts to give.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping

from traceinsight.errors import TraceInsightError

__all__ = ["figures_of", "html_of"]


@functools.singledispatch
def html_of(value: object) -> str | None:
    """``value`` (a result, a finding) as self-contained HTML for a notebook; None where no
    renderer registered one (the notebook then shows its ``repr``)."""
    return None


@functools.singledispatch
def figures_of(value: object) -> Mapping[str, object]:
    """The page's charts of ``value`` as SVG drawings, by name."""
    raise TraceInsightError(
        "no renderer is loaded to draw the charts: use the result through the public API "
        "(import traceinsight; traceinsight.analyze(...))"
    )
