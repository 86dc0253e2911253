"""``traceinsight diff`` of two jobs shown: the words and cells every renderer of a
:class:`~traceinsight.results.job_comparison.JobComparison` shares, its terminal summary (rich) and
its page (``templates/job_diff.html``); the Markdown is in :mod:`.markdown`.

Same order everywhere: what differs in the setup, the job as a whole before and after, the
stragglers gone / new / still there (each with its cause before → after), the ranks (those in one
job only first, then those whose step time changed most), the findings fixed / new / still there
with their saving per step. Every string from a trace or a stored result is data (``rich.text.Text``
in the terminal, autoescaped HTML).
"""

from __future__ import annotations

from typing import Any, Final

from rich import box
from rich.console import RenderableType
from rich.table import Table
from rich.text import Text

from traceinsight.formatting import format_duration, format_share
from traceinsight.load.text import printable
from traceinsight.render.diff import diff_header
from traceinsight.render.templates import environment
from traceinsight.results.comparison import Metric
from traceinsight.results.job_comparison import JobComparison, JobFindingChange, RankChange, StragglerChange
from traceinsight.version import __version__

__all__ = [
    "FINDING_STATUSES",
    "RANK_COLUMNS",
    "STRAGGLER_STATUSES",
    "finding_saving",
    "job_comparison_page",
    "job_comparison_renderables",
    "rank_cells",
    "straggler_line",
]

STRAGGLER_STATUSES: Final = {"gone": ("Stragglers gone", "green"), "new": ("New stragglers", "red"),
                             "still": ("Still stragglers", "yellow")}  # fmt: skip
FINDING_STATUSES: Final = {
    "fixed": ("Fixed", "green"),
    "new": ("New", "red"),
    "still": ("Still present", "yellow"),
}
#: The rank table's columns (every renderer): each a rank's metric before → after.
RANK_COLUMNS: Final[tuple[tuple[str, str], ...]] = (
    ("step_time", "step"),
    ("busy_share", "GPU busy"),
    ("idle", "idle"),
    ("communication_exposed", "comm. exposed"),
    ("syncs_per_step", "syncs/step"),
    ("late_median", "late"),
    ("waited", "waited"),
)
_KEY: Final = (
    "before → after, ms per steady step (syncs per step; GPU busy a share of the step); late: median "
    "lateness in collectives; waited: in collectives"
)


def _short(metric: Metric, value: float | None) -> str:
    """A figure of the rank table: ms with one decimal, a share, a count."""
    if value is None:
        return "—"
    if metric.unit == "us":
        return f"{value / 1000:,.1f}".replace("-", "−")  # a minus sign, as every change is written
    if metric.unit == "share":
        return format_share(value)
    return f"{value:.1f}"


def rank_cells(change: RankChange) -> tuple[str, ...]:
    """One row: the rank (``3 (after only)``), each column before → after, the step's change."""
    rank = str(change.rank) + ("" if change.present == "both" else f" (only {change.present})")
    cells = [rank]
    for key, _ in RANK_COLUMNS:
        metric = change.metric(key)
        cells.append(f"{_short(metric, metric.before)} → {_short(metric, metric.after)}")
    step = change.metric("step_time")
    cells.append(step.change_text())
    return tuple(cells)


def _cause(words: str | None, excess_us: float | None) -> str:
    if words is None:
        return "not a straggler"
    if excess_us is None or words == "no single cause":
        return words
    return f"{words} (+{format_duration(excess_us * 1000)} per step over the median rank)"


def straggler_line(change: StragglerChange) -> str:
    """``rank 1: DataLoader (+19.98 ms per step over the median rank) → not a straggler``."""
    before = _cause(change.before_cause_words, change.before_cause_excess_per_step_us)
    after = _cause(change.after_cause_words, change.after_cause_excess_per_step_us)
    return f"rank {change.rank}: {before} → {after}"


def finding_saving(change: JobFindingChange) -> str:
    """The saving per step of the median rank it fired on, before → after, with its rank counts."""
    values = " → ".join(
        format_duration(value * 1000) if value is not None else "—"
        for value in (change.before_saving_us, change.after_saving_us)
    )
    return f"{values} ({len(change.before_ranks)} → {len(change.after_ranks)} ranks)"


def _metric_table(comparison: JobComparison) -> Table:
    table = Table(
        title="The job before and after (per step; the mean rank unless named)",
        title_justify="left",
        show_edge=False,
    )
    table.add_column("")
    for column in ("before", "after", "change"):
        table.add_column(column, justify="right", no_wrap=True)
    for metric in comparison.shown:
        table.add_row(
            Text(printable(metric.title)),
            metric.text(metric.before),
            metric.text(metric.after),
            metric.change_text(),
        )
    if comparison.headline:
        table.caption = comparison.headline
        table.caption_justify = "left"
    return table


def _rank_table(rows: list[RankChange], total: int) -> Table:
    shown = f"{len(rows)} of {total}, " if len(rows) < total else ""
    # No padding: the box's one-space rule between columns is the only gap (fits 120 columns); the
    # step's change is in the Markdown and the page.
    table = Table(
        title=f"Ranks ({shown}those in one job only first, then by how much their step changed)",
        title_justify="left",
        caption=_KEY,
        caption_justify="left",
        box=box.SIMPLE_HEAD,
        show_edge=False,
        padding=(0, 0),
    )
    table.add_column("rank", no_wrap=True)
    for _, name in RANK_COLUMNS:
        table.add_column(name, justify="right", no_wrap=True)
    for change in rows:
        table.add_row(*(Text(cell) for cell in rank_cells(change)[:-1]))
    return table


def job_comparison_renderables(comparison: JobComparison, top: int = 10) -> list[RenderableType]:
    """Everything ``diff`` prints for two jobs, in order (``top`` ranks in the rank table)."""
    parts = diff_header("traceinsight diff · two jobs", comparison.before, comparison.after, comparison.notes)
    parts.append(_metric_table(comparison))
    for status, (title, style) in STRAGGLER_STATUSES.items():
        moved = [change for change in comparison.stragglers if change.status == status]
        if moved:
            parts.append(Text(f"{title} ({len(moved)})", style=f"bold {style}"))
            parts += [Text(f"  {straggler_line(change)}") for change in moved]
    if not comparison.stragglers:
        parts.append(Text("No straggler in either job.", style="green"))
    ranks = list(comparison.changed_ranks)
    parts.append(_rank_table(ranks[:top], len(ranks)))
    for status, (title, style) in FINDING_STATUSES.items():
        changes = [change for change in comparison.findings if change.status == status]
        if not changes:
            continue
        listing = Table(
            title=f"Findings {title.lower()} ({len(changes)}; saving per step, the median rank's)",
            title_justify="left",
            title_style=style,
            show_edge=False,
            show_header=False,
        )
        listing.add_column("rule", no_wrap=True, style="dim")
        listing.add_column("finding", overflow="fold")
        savings = [finding_saving(change) for change in changes]
        listing.add_column("saving", justify="right", no_wrap=True, min_width=max(map(len, savings)))
        for change, saving in zip(changes, savings, strict=True):
            title_text = printable(change.title) + (" (minor)" if change.minor else "")
            listing.add_row(Text(printable(change.rule)), Text(title_text), saving)
        parts.append(listing)
    return parts


def page_values(comparison: JobComparison) -> dict[str, Any]:
    """What ``templates/job_diff.html`` shows (every rank)."""
    return {
        "version": __version__,
        "comparison": comparison,
        "rows": [(m.title, m.text(m.before), m.text(m.after), m.change_text()) for m in comparison.shown],
        "stragglers": [
            (
                title,
                status,
                [
                    (change, straggler_line(change))
                    for change in comparison.stragglers
                    if change.status == status
                ],
            )
            for status, (title, _) in STRAGGLER_STATUSES.items()
        ],
        "rank_columns": [name for _, name in RANK_COLUMNS],
        "ranks": [(change, rank_cells(change)) for change in comparison.changed_ranks],
        "key": _KEY,
        "statuses": [
            (
                title,
                status,
                [
                    (change, finding_saving(change))
                    for change in comparison.findings
                    if change.status == status
                ],
            )
            for status, (title, _) in FINDING_STATUSES.items()
        ],
    }


def job_comparison_page(comparison: JobComparison) -> str:
    """The diff of two jobs as one self-contained page, in the report's style."""
    return environment().get_template("job_diff.html").render(page_values(comparison))
