"""The job report as one self-contained page, in the style of the one-trace report (``templates/job.html``)."""

from __future__ import annotations

import traceinsight
from traceinsight.job.combine import JobReport
from traceinsight.render.job_text import (
    RANK_COLUMNS,
    job_headline,
    job_saving,
    rank_cells,
    ranks_in_order,
    straggler_lines,
)

__all__ = ["JobHtmlRenderer"]

#: Columns of figures (right-aligned).
NUMERIC_COLUMNS = frozenset(RANK_COLUMNS[1:6] + RANK_COLUMNS[7:10])


class JobHtmlRenderer:
    """Renders a :class:`JobReport` as HTML (every rank in the table; autoescaped)."""

    def render(self, job: JobReport) -> str:
        """The whole page."""
        from traceinsight.render.html import _environment

        return (
            _environment()
            .get_template("job.html")
            .render(
                version=traceinsight.__version__,
                job=job,
                headline=job_headline(job),
                unit="rank" if job.cycles_of is None else "cycle",
                saving=lambda finding: job_saving(job, finding),
                stragglers=straggler_lines(job),
                straggling={str(straggler.rank) for straggler in job.stragglers},
                columns=RANK_COLUMNS,
                numeric=[column in NUMERIC_COLUMNS for column in RANK_COLUMNS],
                # the top finding is its rule id in the table (its title on hover; the findings
                # section below has the words), so that a row stays one line
                rows=[(rank_cells(job, result)[:-1], result.top_finding) for result in ranks_in_order(job)],
            )
        )
