"""What a result shows in a notebook (Jupyter's ``_repr_html_``), and its charts as figures.

Registered into :mod:`traceinsight.shown` when this module is imported (the public API
does): a trace's result shows the page's scorecard and finding cards, a finding its card, a job or
a comparison the sections of its page. All of it comes from the pages' own templates
(``_cards.html``, the pages' ``content`` block), styled by the pages' CSS scoped to the view: one
self-contained ``<div>``, no script, nothing loaded. The charts are :mod:`.figures`'.
"""

from __future__ import annotations

from typing import Any

from markupsafe import Markup

from traceinsight.model import replace
from traceinsight.render.facts import saving_text
from traceinsight.render.scorecard import scorecard
from traceinsight.render.templates import environment
from traceinsight.results import Comparison, JobComparison, JobResult, Result
from traceinsight.results import trace as contract
from traceinsight.shown import html_of

__all__ = ["comparison_html", "finding_html", "job_html", "result_html"]

#: What the pages' CSS calls its root in a notebook: the ``<div>`` that holds the view (CSS nesting).
_SCOPE = Markup("&")


def _view(**shown: Any) -> str:
    """The notebook's ``<div>`` (``templates/notebook.html``) showing ``shown``."""
    context: dict[str, Any] = {"heading": None, "scores": (), "findings": (), "note": None, "sections": ""}
    context.update(shown)
    return (
        environment()
        .get_template("notebook.html")
        .render(css_root=_SCOPE, saving_text=saving_text, **context)
    )


def _content(template: str, values: dict[str, Any]) -> Markup:
    """The ``content`` block of a page template: its sections, without the page around them."""
    page = environment().get_template(template)
    return Markup("".join(page.blocks["content"](page.new_context(values))))


@html_of.register
def result_html(result: Result) -> str:
    """The scorecard and the finding cards, largest saving first."""
    from traceinsight.render.html import finding_views  # the page's renderer

    root = result.source_root
    cards = [view for view in finding_views(result.findings, root) if not view.finding.minor]
    minor = len(result.findings) - len(cards)
    return _view(
        heading=result.trace.name,
        scores=scorecard(result) if result.details is not None else (),
        findings=cards,
        note=f"and {minor} minor finding{'s' if minor != 1 else ''} (frames['findings'] lists them all)"
        if minor
        else None,
    )


@html_of.register
def finding_html(finding: contract.Finding) -> str:
    """One finding's card."""
    from traceinsight.render.html import finding_views

    (view,) = finding_views((finding,), None)
    return _view(findings=[replace(view, rank=None)])


@html_of.register
def comparison_html(comparison: Comparison) -> str:
    """The diff page's sections: setup notes, before and after, findings, kernels."""
    from traceinsight.render.diff import page_values as comparison_values  # its chart

    return _view(
        heading=f"{comparison.before} → {comparison.after}",
        sections=_content("diff.html", comparison_values(comparison)),
    )


@html_of.register
def job_html(job: JobResult) -> str:
    """The job page's sections: stragglers, ranks, findings across ranks (a stored result's too)."""
    from traceinsight.render.job_html import page_values as job_values

    heading = f"job of {job.job.ranks} ranks"
    return _view(heading=heading, sections=_content("job.html", job_values(job)))


@html_of.register
def job_comparison_html(comparison: JobComparison) -> str:
    """The page of two jobs compared: setup notes, the job, stragglers, ranks, findings."""
    from traceinsight.render.job_diff import page_values as job_comparison_values

    return _view(
        heading=f"{comparison.before} → {comparison.after}",
        sections=_content("job_diff.html", job_comparison_values(comparison)),
    )
