"""The job's page, in the style of the one-trace report (``templates/job.html``), drawn by
:class:`~.html.HtmlRenderer`."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from markupsafe import Markup

from traceinsight.formatting import format_duration
from traceinsight.render.job_text import (
    RANK_COLUMNS,
    job_headline,
    job_saving,
    rank_cells,
    ranks_in_order,
    straggler_lines,
)
from traceinsight.render.svg import FOREGROUND, SMALL_SIZE, WIDTH, Axis, Canvas, LegendItem, text_width
from traceinsight.render.templates import environment
from traceinsight.results.job import ARRIVALS_SHOWN, Arrival, JobResult
from traceinsight.version import __version__

__all__ = ["arrivals_chart", "job_page", "page_values"]

#: Columns of figures (right-aligned).
NUMERIC_COLUMNS = frozenset(
    ("step", "GPU busy", "compute", "comm. (exposed)", "wait", "transfer", "idle", "syncs/step", "late (median)",
     "others waited")
)  # fmt: skip

_LAST: Final = "#D55E00"
_ROW: Final = 18.0
_MARGIN: Final = 10.0


def arrivals_chart(arrivals: Sequence[Arrival]) -> Canvas | None:
    """The first collectives (at most :data:`~traceinsight.results.job.ARRIVALS_SHOWN`), one row
    each: every rank's arrival after the first rank's (a tick per rank, ticks closer than half a
    point drawn once), the last rank's in red and named. A collective whose last rank has no
    arrival (a stored result says so) is left out."""
    lasts = {id(arrival): arrival.after_first_ns(arrival.last_rank) for arrival in arrivals}
    arrivals = [arrival for arrival in arrivals[:ARRIVALS_SHOWN] if lasts[id(arrival)] is not None]
    if not arrivals:
        return None
    last_of = {id(arrival): lasts[id(arrival)] or 0 for arrival in arrivals}
    latest = max((entry.after_first_ns for arrival in arrivals for entry in arrival.arrivals), default=0) or 1
    per_unit, unit = (1e6, "ms") if latest >= 100_000 else (1e3, "µs")
    labels = [
        f"#{index + 1} {arrival.kind}" + ("" if arrival.step is None else f" · step {arrival.step}")
        for index, arrival in enumerate(arrivals)
    ]
    notes = [
        f"last: rank {arrival.last_rank}, +{format_duration(last_of[id(arrival)])}" for arrival in arrivals
    ]
    left = min(_MARGIN + max(text_width(label) for label in labels) + 8, WIDTH * 0.4)
    right = WIDTH - _MARGIN - max(text_width(note, SMALL_SIZE) for note in notes) - 8
    axis = Axis(0.0, latest / per_unit, left, right)
    top = 8.0
    bottom = top + _ROW * len(arrivals)
    canvas = Canvas(bottom + 34 + 24)
    canvas.x_axis(axis, top, bottom, f"arrival after the first rank ({unit}), on the aligned clock")
    for index, (arrival, label, note) in enumerate(zip(arrivals, labels, notes, strict=True)):
        middle = top + _ROW * (index + 0.5)
        points = sorted(
            {
                round(axis(entry.after_first_ns / per_unit) * 2) / 2
                for entry in arrival.arrivals
                if entry.rank != arrival.last_rank
            }
        )
        canvas.spans([(x - 0.5, x + 0.5) for x in points], middle - 5, 10, FOREGROUND, 0.55)
        last_x = axis(last_of[id(arrival)] / per_unit)
        canvas.rect(last_x - 1.5, middle - 6, 3, 12, _LAST)
        canvas.text(left - 6, middle + 3.2, label, anchor="end")
        canvas.text(last_x + 6, middle + 2.7, note, size=SMALL_SIZE)
    canvas.legend([LegendItem("a rank's arrival", FOREGROUND, opacity=0.55), LegendItem("the last rank", _LAST)],
                  bottom + 34, 2)  # fmt: skip
    return canvas


#: The job page's chart: its id and title.
ARRIVALS: Final = ("arrivals", "Each collective's arrivals across ranks")


def page_values(job: JobResult) -> dict[str, Any]:
    """What ``templates/job.html`` shows (every rank in the table)."""
    chart = arrivals_chart(job.job.collectives.arrivals)
    return {
        "version": __version__,
        # the SVG is ours (every text in it escaped by the canvas), so it goes in as markup
        "arrivals_svg": Markup(chart.svg(*ARRIVALS)) if chart else None,
        "job": job,
        "headline": job_headline(job),
        "unit": "cycle" if job.cycles else "rank",
        "saving": lambda finding: job_saving(job, finding),
        "stragglers": straggler_lines(job),
        "straggling": {str(straggler.rank) for straggler in job.stragglers},
        "columns": RANK_COLUMNS,
        "numeric": [column in NUMERIC_COLUMNS for column in RANK_COLUMNS],
        # the top finding is its rule id in the table (its title on hover; the findings section
        # below has the words), so that a row stays one line
        "rows": [(rank_cells(result)[:-1], result.top_finding) for result in ranks_in_order(job)],
    }


def job_page(job: JobResult) -> str:
    """The whole page (autoescaped)."""
    return environment().get_template("job.html").render(page_values(job))
