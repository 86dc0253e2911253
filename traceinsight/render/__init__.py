"""The renderers: one shape for every output, ``render(result) -> str``.

Four renderers, one per format, each taking any of the four results (pyinstrument's
``Renderer.render(session)`` is the model): :class:`~.terminal.TerminalRenderer`,
:class:`~.json_report.JsonRenderer`, :class:`~.markdown.MarkdownRenderer`,
:class:`~.html.HtmlRenderer`. The JSON is the result's own (``to_json``); the summary, the page and
the Markdown of a trace are drawn from the result alone (its figures and its ``details``), so a
stored one draws them as the live one did; a job's result and a comparison (of two traces or two
jobs) carry all they show.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol, TypeAlias

from traceinsight.errors import TraceInsightError
from traceinsight.results import Result
from traceinsight.results.trace import Details

if TYPE_CHECKING:  # a job's and a diff's types are made when first used (traceinsight.results)
    from traceinsight.results import Comparison, JobComparison, JobResult

__all__ = ["AnyResult", "NotLive", "Renderer", "shown_details"]

#: What a renderer renders.
AnyResult: TypeAlias = "Result | JobResult | Comparison | JobComparison"


class Renderer(Protocol):
    """Turns a result into the text of one output."""

    def render(self, result: AnyResult) -> str:
        """The whole output as one string."""
        ...


class NotLive(TraceInsightError):
    """A result read back from its JSON holds the figures, not the analysis a page is drawn from."""


def shown_details(result: Result, output: str = "the report") -> Details:
    """What ``result``'s summary, page and Markdown show beyond its figures (its ``details``), for
    ``output`` (``the terminal summary``...): a stored result written before they were kept has none."""
    if result.details is None:
        raise NotLive(
            f"cannot draw {output} of {result.trace.name} from this stored result: an earlier "
            "traceinsight wrote it without the details a report shows (its 'details' key); analyze its trace"
        )
    return result.details
