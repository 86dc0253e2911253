"""The job report as text: the terminal summary (rich) and the Markdown summary.

Both show, in this order: the job line, warnings, stragglers (why each is slow, what the others
waited for it), the per-rank table (stragglers first, then the latest ranks), and the findings
common to the ranks, each once with its rank count. Every string from a trace is data: rich
``Text`` in the terminal, escaped and cut in Markdown (:func:`.markdown.escape`).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Final

from rich import box
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderResult
from rich.table import Table
from rich.text import Text

from traceinsight.analysis.causes import cause_label
from traceinsight.formatting import format_duration, format_share
from traceinsight.job.combine import CAUSE_WORDS, JobReport
from traceinsight.job.rank import RankResult
from traceinsight.load.text import printable
from traceinsight.render.markdown import _bounded, _table, escape

__all__ = [
    "RANK_COLUMNS",
    "TERMINAL_COLUMNS",
    "job_headline",
    "print_job_summary",
    "rank_cells",
    "ranks_in_order",
    "render_job_markdown",
    "straggler_lines",
    "terminal_cells",
]

#: The per-rank table's columns (every renderer).
RANK_COLUMNS: Final[tuple[str, ...]] = (
    "rank",
    "step",
    "GPU busy",
    "compute",
    "comm. (exposed)",
    "idle",
    "largest idle cause",
    "syncs/step",
    "late (median)",
    "others waited",
    "top finding",
)
#: Ranks in the Markdown table (stragglers and the latest first).
MARKDOWN_RANKS: Final = 64


def ranks_in_order(job: JobReport) -> list[RankResult]:
    """Stragglers first (as ranked), then by median lateness, latest first, then by rank."""
    straggling = [straggler.rank for straggler in job.stragglers]
    by_rank = {result.rank: result for result in job.ranks}

    def lateness(result: RankResult) -> int:
        timing = job.timing(result.rank)
        return timing.late_median_ns if timing is not None else 0

    rest = sorted((r for r in job.ranks if r.rank not in straggling), key=lambda r: (-lateness(r), r.rank))
    return [by_rank[rank] for rank in straggling] + rest


def _per_step(result: RankResult, ns: int) -> str:
    return format_duration(result.per_step(ns))


#: The terminal's narrower table (ms per steady step; fits 80 columns): no top finding (the
#: stragglers section names it), the largest idle cause in a few words.
TERMINAL_COLUMNS: Final[tuple[str, ...]] = (
    "rank", "step", "busy", "comm", "exposed", "idle", "idle cause", "syncs", "late", "waits",
)  # fmt: skip
_TERMINAL_KEY: Final = (
    "ms per steady step; comm: communication kernels (exposed: with no compute under them); idle "
    "cause: the largest; "
    "late: median lateness in collectives; waits: the others' wait for this rank"
)


def _ms(ns: int | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:,.1f}"


def terminal_cells(job: JobReport, result: RankResult) -> tuple[str, ...]:
    """One row of :data:`TERMINAL_COLUMNS`."""
    usage = result.usage
    timing = job.timing(result.rank)
    largest = next((kind.value for kind, ns in usage.idle if ns), None)
    return (
        str(result.rank),
        _ms(result.step_ns),
        format_share(usage.share(usage.busy_ns)) if usage.window_ns else "—",
        *(
            (
                _ms(result.per_step(result.communication_total_ns)),
                _ms(result.per_step(usage.communication_ns)),
                _ms(result.per_step(usage.idle_ns)),
            )
            if usage.window_ns
            else ("—", "—", "—")  # no GPU activity: no GPU time to split
        ),
        "—" if largest is None else CAUSE_WORDS.get(largest, largest),
        f"{result.syncs_per_step:.1f}" if result.syncs_per_step is not None else "—",
        _ms(timing.late_median_ns if timing is not None else None),
        _ms(result.per_step(timing.caused_ns) if timing is not None else None),
    )


def rank_cells(job: JobReport, result: RankResult) -> tuple[str, ...]:
    """One row of the per-rank table (figures per steady step when the rank has steps)."""
    usage = result.usage
    timing = job.timing(result.rank)
    largest = next(((kind, ns) for kind, ns in usage.idle if ns), None)
    top = result.top_finding
    return (
        str(result.rank),
        format_duration(result.step_ns) if result.step_ns is not None else "—",
        format_share(usage.share(usage.busy_ns)) if usage.window_ns else "—",
        _per_step(result, usage.compute_ns),
        f"{_per_step(result, result.communication_total_ns)} ({_per_step(result, usage.communication_ns)})",
        _per_step(result, usage.idle_ns),
        f"{cause_label(largest[0].value)} {_per_step(result, largest[1])}" if largest is not None else "—",
        f"{result.syncs_per_step:.1f}" if result.syncs_per_step is not None else "—",
        format_duration(timing.late_median_ns) if timing is not None else "—",
        _per_step(result, timing.caused_ns) if timing is not None else "—",
        top.title if top is not None else "—",
    )


def job_headline(job: JobReport) -> str:
    """``64 ranks (nccl, world size 64) · step 615.12 ms · 100 collectives matched (GPU kernels)``."""
    first = job.ranks[0] if job.ranks else None
    setup = ", ".join(
        part
        for part in (
            first.backend if first is not None else None,
            f"world size {first.world_size}" if first is not None and first.world_size is not None else None,
        )
        if part
    )
    parts = [f"{len(job.ranks)} ranks" + (f" ({setup})" if setup else "")]
    if job.step_ns is not None:
        parts.append(f"median step {format_duration(job.step_ns)}")
    where = {"gpu": "communication kernels", "host": "host c10d operators"}.get(job.collectives_from)
    if where is not None:
        how = (
            "by process group and sequence number"
            if job.collectives_matched_by_seq == job.collectives_matched
            else "by kind and order"
            if not job.collectives_matched_by_seq
            else f"{job.collectives_matched_by_seq:,} by process group and sequence number, the rest by order"
        )
        parts.append(f"{job.collectives_matched:,} collectives matched across ranks ({where}, {how})")
    return " · ".join(parts)


def straggler_lines(job: JobReport) -> list[tuple[int, str, list[str]]]:
    """(rank, headline, detail lines) for each straggler."""
    lines = []
    for straggler in job.stragglers:
        headline = f"rank {straggler.rank}: slow because of {straggler.cause_words}"
        if straggler.cause is not None:
            headline += f" (+{format_duration(straggler.cause_excess_ns)} per step over the median rank)"
        details = list(straggler.reasons)
        if straggler.caused_ns:
            details.append(
                f"the other ranks waited {format_duration(straggler.caused_ns)} for it in collectives "
                "(summed over the ranks and the collectives it came last to)"
            )
        if straggler.top_finding:
            details.append(f"its top finding: {straggler.top_finding}")
        lines.append((straggler.rank, headline, details))
    return lines


class _RankTable:
    """The terminal's per-rank table, made when the width is known: every figure keeps its width,
    the idle cause takes what is left (cut with an ellipsis)."""

    _CAUSE: Final = TERMINAL_COLUMNS.index("idle cause")

    def __init__(self, rows: list[tuple[str, ...]]) -> None:
        self.rows = rows

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [
            max(len(column), *(len(row[i]) for row in self.rows)) for i, column in enumerate(TERMINAL_COLUMNS)
        ]
        # No padding: the box's one-space rule between columns is the only gap.
        fixed = sum(width for i, width in enumerate(widths) if i != self._CAUSE) + len(widths) - 1
        room = max(options.max_width - fixed, 6)
        table = Table(title="Ranks", caption=_TERMINAL_KEY, title_justify="left", caption_justify="left",
                      box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0))  # fmt: skip
        for index, (column, width) in enumerate(zip(TERMINAL_COLUMNS, widths, strict=True)):
            if index == self._CAUSE:
                table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=room)
            else:
                justify: JustifyMethod = "left" if column == "rank" else "right"
                table.add_column(column, no_wrap=True, justify=justify, min_width=width)
        for row in self.rows:
            table.add_row(*(Text(cell) for cell in row))
        yield table


def print_job_summary(
    job: JobReport, console: Console, outputs: list[tuple[str, Path]] | None = None, top: int = 10
) -> None:
    """The terminal summary: ``top`` ranks in the table (stragglers always), then where outputs went."""
    console.print(Text(f"traceinsight job: {job_headline(job)}", style="bold"))
    for warning in job.warnings:
        console.print(Text(f"! {warning}", style="yellow"))
    if job.stragglers:
        console.print(Text(f"Stragglers ({len(job.stragglers)})", style="bold red"))
        for _, headline, details in straggler_lines(job):
            console.print(Text(f"  {headline}", style="bold"))
            for detail in details:
                console.print(Text(f"    {detail}"))
    elif len(job.ranks) >= 3:
        console.print(
            Text("No straggler: no rank's collectives or step time stand out from the others.", style="green")
        )
    ordered = ranks_in_order(job)
    shown = ordered[: max(top, len(job.stragglers))]
    console.print(_RankTable([terminal_cells(job, result) for result in shown]))
    if len(ordered) > len(shown):
        console.print(
            Text(f"… {len(ordered) - len(shown)} more ranks in the JSON and HTML report", style="dim")
        )
    if job.findings:
        console.print(Text("Findings across ranks", style="bold"))
        for finding in job.findings[: max(top, 5)]:
            console.print(
                Text.assemble(
                    (finding.rule, "bold"),
                    f" · {len(finding.ranks)} of {len(job.ranks)} ranks · {finding.severity}"
                    f" · saves {format_duration(finding.savings_ns)} (all ranks)"
                    + (" · minor" if finding.minor else ""),
                )
            )
            console.print(Text(finding.title), style="dim", overflow="fold")
    for label, path in outputs or []:
        console.print(Text.assemble(f"{printable(label)}: ", (printable(str(path)), "bold")))


def render_job_markdown(job: JobReport) -> str:
    """The job as GitHub Markdown, bounded like the one-trace summary (:data:`~.markdown.MAX_CHARS`)."""
    lines = [f"## traceinsight job: {escape(job_headline(job), 300)}", ""]
    lines += [f"> **warning:** {escape(warning, 400)}" for warning in job.warnings]
    lines.append("")
    lines.append(f"### Stragglers ({len(job.stragglers)})")
    if not job.stragglers:
        lines.append("No rank's collectives or step time stand out from the others.")
    for _, headline, details in straggler_lines(job):
        lines.append(f"- **{escape(headline, 300)}**")
        lines += [f"  - {escape(detail, 300)}" for detail in details]
    lines += ["", "### Ranks (per steady step)", ""]
    ordered = ranks_in_order(job)
    cell: Callable[[str], str] = lambda text: escape(text, 120)  # noqa: E731
    rows = [tuple(cell(value) for value in rank_cells(job, result)) for result in ordered[:MARKDOWN_RANKS]]
    lines += _table(RANK_COLUMNS, rows)
    if len(ordered) > MARKDOWN_RANKS:
        lines.append(f"\n… {len(ordered) - MARKDOWN_RANKS} more ranks in the JSON and HTML report")
    if job.findings:
        lines += ["", "### Findings across ranks", ""]
        lines += _table(
            ("rule", "ranks", "severity", "saving (all ranks)", "finding"),
            [
                (escape(f.rule), f"{len(f.ranks)} of {len(job.ranks)}", f.severity,
                 format_duration(f.savings_ns), escape(f.title) + (" (minor)" if f.minor else ""))
                for f in job.findings[:20]
            ],
        )  # fmt: skip
    return _bounded("\n".join(lines) + "\n")
