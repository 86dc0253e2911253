"""The job's page, in the style of the one-trace report (``templates/job.html``), drawn by
:class:`~.html.HtmlRenderer`."""

from __future__ import annotations

from typing import Any

from traceinsight.render.job_text import (
    RANK_COLUMNS,
    job_headline,
    job_saving,
    rank_cells,
    ranks_in_order,
    straggler_lines,
)
from traceinsight.render.templates import environment
from traceinsight.results import JobReport
from traceinsight.version import __version__

__all__ = ["job_page", "page_values"]

#: Columns of figures (right-aligned).
NUMERIC_COLUMNS = frozenset(RANK_COLUMNS[1:6] + RANK_COLUMNS[7:10])


def page_values(job: JobReport) -> dict[str, Any]:
    """What ``templates/job.html`` shows (every rank in the table)."""
    return {
        "version": __version__,
        "job": job,
        "headline": job_headline(job),
        "unit": "rank" if job.cycles_of is None else "cycle",
        "saving": lambda finding: job_saving(job, finding),
        "stragglers": straggler_lines(job),
        "straggling": {str(straggler.rank) for straggler in job.stragglers},
        "columns": RANK_COLUMNS,
        "numeric": [column in NUMERIC_COLUMNS for column in RANK_COLUMNS],
        # the top finding is its rule id in the table (its title on hover; the findings section
        # below has the words), so that a row stays one line
        "rows": [(rank_cells(job, result)[:-1], result.top_finding) for result in ranks_in_order(job)],
    }


def job_page(job: JobReport) -> str:
    """The whole page (autoescaped)."""
    return environment().get_template("job.html").render(page_values(job))
