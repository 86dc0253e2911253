"""The job as text: the terminal summary (rich), and the cells every job renderer shares.

The terminal, the Markdown (:mod:`.markdown`) and the page (:mod:`.job_html`) show, in this order:
the job line, warnings, stragglers (why each is slow, what the others waited for it), the per-rank
table (stragglers first, then the latest ranks), and the findings common to the ranks, each once
with its rank count. Every figure is the :class:`~traceinsight.results.job.JobResult`'s, so a job's
stored result draws them as the live one did. Every string from a trace is data: rich ``Text`` in
the terminal, escaped and cut in Markdown (:func:`.markdown.escape`).
"""

from __future__ import annotations

from typing import Final

from rich import box
from rich.console import Console, ConsoleOptions, JustifyMethod, RenderableType, RenderResult
from rich.table import Table
from rich.text import Text

from traceinsight.formatting import format_duration, format_share
from traceinsight.results.job import CAUSE_WORDS, JobFinding, JobResult, Rank
from traceinsight.results.vocabulary import cause_label

__all__ = [
    "RANK_COLUMNS",
    "TERMINAL_COLUMNS",
    "job_headline",
    "job_renderables",
    "job_saving",
    "rank_cells",
    "ranks_in_order",
    "split_cells",
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
    "wait",
    "transfer",
    "waiting for",
    "idle",
    "largest idle cause",
    "syncs/step",
    "late (median)",
    "others waited",
    "top finding",
)


def ranks_in_order(job: JobResult) -> list[Rank]:
    """Stragglers first (as ranked), then by median lateness, latest first, then by rank."""
    straggling = [straggler.rank for straggler in job.stragglers]
    by_rank = {result.rank: result for result in job.ranks}

    def lateness(result: Rank) -> int:
        timing = result.collectives
        return timing.late_median_ns if timing is not None else 0

    rest = sorted((r for r in job.ranks if r.rank not in straggling), key=lambda r: (-lateness(r), r.rank))
    return [by_rank[rank] for rank in straggling if rank in by_rank] + rest


def _per_step(result: Rank, ns: int) -> str:
    return format_duration(result.per_step_of(ns))


#: The terminal's narrower table (ms per steady step; fits 80 columns): no top finding (the
#: stragglers section names it), the largest idle cause in a few words.
TERMINAL_COLUMNS: Final[tuple[str, ...]] = (
    "rank", "step", "busy", "comm", "exposed", "wait", "xfer", "for", "idle", "idle cause", "syncs", "late",
    "waits",
)  # fmt: skip
_TERMINAL_KEY: Final = (
    "ms per steady step; comm: communication kernels (exposed: with no compute under them), split "
    "into wait (for the last rank to arrive; for: the rank waited for longest) and xfer (the transfer "
    "after it); idle cause: the largest; late: median lateness in collectives; waits: the others' wait "
    "for this rank"
)


def _ms(ns: int | None) -> str:
    return "—" if ns is None else f"{ns / 1e6:,.1f}"


def split_cells(result: Rank, duration: bool = False) -> tuple[str, str, str]:
    """The rank's wait, transfer (per steady step) and the rank it waited for longest: ``—`` where
    its collectives are not split (one rank, or its clock could not be aligned)."""
    timing = result.collectives
    if timing is None or not timing.clock_aligned:
        return ("—", "—", "—")
    show = format_duration if duration else _ms
    return (
        show(result.per_step_of(timing.wait_ns)),
        show(result.per_step_of(timing.transfer_ns)),
        "—"
        if timing.waited_for is None
        else (f"rank {timing.waited_for}" if duration else f"r{timing.waited_for}"),
    )


def terminal_cells(result: Rank) -> tuple[str, ...]:
    """One row of :data:`TERMINAL_COLUMNS`."""
    timing = result.collectives
    per_step = result.per_step
    largest = result.largest_idle
    return (
        str(result.rank),
        _ms(result.step_time_ns),
        format_share(result.busy_share),
        *(
            (
                _ms(per_step.communication_ns),
                _ms(per_step.communication_exposed_ns),
                *split_cells(result),
                _ms(per_step.idle_ns),
            )
            if result.utilization.window_ns
            else ("—",) * 6  # no GPU activity: no GPU time to split
        ),
        "—" if largest is None else CAUSE_WORDS.get(largest[0], largest[0]),
        f"{result.syncs_per_step:.1f}" if result.syncs_per_step is not None else "—",
        _ms(timing.late_median_ns if timing is not None else None),
        _ms(result.per_step_of(timing.others_waited_ns) if timing is not None else None),
    )


def rank_cells(result: Rank) -> tuple[str, ...]:
    """One row of the per-rank table (figures per steady step when the rank has steps)."""
    timing = result.collectives
    per_step = result.per_step
    largest = result.largest_idle
    top = result.top_finding
    return (
        str(result.rank),
        format_duration(result.step_time_ns) if result.step_time_ns is not None else "—",
        format_share(result.busy_share),
        format_duration(per_step.compute_ns),
        f"{format_duration(per_step.communication_ns)} ({format_duration(per_step.communication_exposed_ns)})",
        *split_cells(result, duration=True),
        format_duration(per_step.idle_ns),
        f"{cause_label(largest[0])} {_per_step(result, largest[1])}" if largest is not None else "—",
        f"{result.syncs_per_step:.1f}" if result.syncs_per_step is not None else "—",
        format_duration(timing.late_median_ns) if timing is not None else "—",
        _per_step(result, timing.others_waited_ns) if timing is not None else "—",
        top.title if top is not None else "—",
    )


def job_headline(job: JobResult) -> str:
    """``64 ranks (nccl, world size 64) · step 615.12 ms · 100 collectives matched (GPU kernels)``."""
    info = job.job
    collectives = info.collectives
    clock = collectives.clock
    setup = ", ".join(
        part
        for part in (info.backend, f"world size {info.world_size}" if info.world_size is not None else None)
        if part
    )
    if info.cycles_of is not None:
        parts = [f"{len(job.ranks)} profiler cycles of one process ({info.cycles_of}), not ranks"]
    else:
        parts = [f"{len(job.ranks)} ranks" + (f" ({setup})" if setup else "")]
    if info.step_time_ns is not None:
        step = f"step {format_duration(info.step_time_ns)} (median rank)"
        if info.slowest_step_time_ns is not None and info.slowest_rank is not None and len(job.ranks) > 1:
            step += f", slowest rank {info.slowest_rank} {format_duration(info.slowest_step_time_ns)}"
        parts.append(step)
    where = {"gpu": "communication kernels", "host": "host c10d operators"}.get(collectives.source)
    if where is not None:
        how = (
            "by process group and sequence number"
            if collectives.matched_by_seq == collectives.matched
            else "by kind and order"
            if not collectives.matched_by_seq
            else f"{collectives.matched_by_seq:,} by process group and sequence number, the rest by order"
        )
        parts.append(f"{collectives.matched:,} collectives matched across ranks ({where}, {how})")
    if clock.aligned_ranks and clock.residual_ns is not None:
        parts.append(
            f"clocks aligned on the collectives' ends ({clock.aligned_ranks:,} of {len(job.ranks):,} ranks, "
            f"residual {format_duration(clock.residual_ns)})"
        )
    return " · ".join(parts)


def _unit(job: JobResult) -> str:
    """What a row of the job is: a rank, or one process's profiler cycle."""
    return "cycle" if job.cycles else "rank"


def job_saving(job: JobResult, finding: JobFinding) -> str:
    """A finding's saving, per steady step: the median rank's, and the sum over the ranks it fired
    on when more than one (``4.10 ms per step (median rank; 16.40 ms summed over 4 ranks)``)."""
    unit = _unit(job)
    if finding.straggler is not None and finding.job_savings_per_step_ns:
        return (
            f"if rank {finding.straggler} kept pace, every other rank saves up to "
            f"{format_duration(finding.job_savings_per_step_ns)} per step (the time they wait for it)"
        )
    text = f"{format_duration(finding.savings_per_step_ns)} per step"
    if finding.straggler is not None:
        return text + f" on rank {finding.straggler} (the others wait for a slower rank first)"
    if len(finding.ranks) > 1:
        text += (
            f" (median {unit}; {format_duration(finding.savings_per_step_all_ranks_ns)} summed over "
            f"{len(finding.ranks)} {unit}s)"
        )
    return text


def straggler_lines(job: JobResult) -> list[tuple[int, str, list[str]]]:
    """(rank, headline, detail lines) for each straggler."""
    lines = []
    for straggler in job.stragglers:
        headline = f"rank {straggler.rank}: slow because of {straggler.cause_words}"
        if straggler.cause is not None:
            headline += (
                f" (+{format_duration(straggler.cause_excess_per_step_ns)} per step over the median rank)"
            )
        details = list(straggler.reasons)
        if straggler.steps <= 1 and not any("one-off" in reason for reason in details):
            details.append(f"{straggler.steps or 'no'} step recorded: it may be a one-off")
        if straggler.others_waited_ns and not straggler.waits_caused_per_step_ns:
            details.append(
                f"the other ranks waited {format_duration(straggler.others_waited_ns)} for it in collectives "
                "(summed over the ranks and the collectives it came last to)"
            )
        if straggler.waits_caused_per_step_ns:
            details.append(
                "if it kept pace, every other rank would save up to "
                f"{format_duration(straggler.waits_caused_per_step_ns)} "
                "per step (their mean wait for it)"
            )
        if straggler.top_finding:
            where = f" ({straggler.top_finding_source})" if straggler.top_finding_source else ""
            details.append(f"its top finding: {straggler.top_finding}{where}")
        lines.append((straggler.rank, headline, details))
    return lines


class _RankTable:
    """The terminal's per-rank table, made when the width is known: every figure keeps its width,
    the idle cause takes what is left (cut with an ellipsis)."""

    _CAUSE: Final = TERMINAL_COLUMNS.index("idle cause")

    def __init__(self, rows: list[tuple[str, ...]], unit: str = "rank") -> None:
        self.rows = rows
        self.unit = unit

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        widths = [
            max(len(column), *(len(row[i]) for row in self.rows)) for i, column in enumerate(TERMINAL_COLUMNS)
        ]
        # No padding: the box's one-space rule between columns is the only gap.
        fixed = sum(width for i, width in enumerate(widths) if i != self._CAUSE) + len(widths) - 1
        room = max(options.max_width - fixed, 6)
        table = Table(title=f"{self.unit.capitalize()}s", caption=_TERMINAL_KEY, title_justify="left", caption_justify="left",
                      box=box.SIMPLE_HEAD, show_edge=False, padding=(0, 0))  # fmt: skip
        for index, (column, width) in enumerate(zip(TERMINAL_COLUMNS, widths, strict=True)):
            if index == self._CAUSE:
                table.add_column(column, no_wrap=True, overflow="ellipsis", max_width=room)
            else:
                justify: JustifyMethod = "left" if column == "rank" else "right"
                name = self.unit if column == "rank" else column
                table.add_column(name, no_wrap=True, justify=justify, min_width=width)
        for row in self.rows:
            table.add_row(*(Text(cell) for cell in row))
        yield table


def job_renderables(job: JobResult, top: int = 10) -> list[RenderableType]:
    """The terminal summary: ``top`` ranks in the table (stragglers always)."""
    parts: list[RenderableType] = [Text(f"traceinsight job: {job_headline(job)}", style="bold")]
    parts += [Text(f"! {warning}", style="yellow") for warning in job.warnings]
    if job.stragglers:
        parts.append(Text(f"Stragglers ({len(job.stragglers)})", style="bold red"))
        for _, headline, details in straggler_lines(job):
            parts.append(Text(f"  {headline}", style="bold"))
            parts += [Text(f"    {detail}") for detail in details]
    elif len(job.ranks) >= 3 and not job.cycles:
        parts.append(
            Text(
                "No straggler: no rank keeps the others waiting, and no rank's collectives or step time stand "
                "out from the others.",
                style="green",
            )
        )
    ordered = ranks_in_order(job)
    shown = ordered[: max(top, len(job.stragglers))]
    unit = _unit(job)
    parts.append(_RankTable([terminal_cells(result) for result in shown], unit))
    if len(ordered) > len(shown):
        parts.append(
            Text(f"… {len(ordered) - len(shown)} more {unit}s in the JSON and HTML report", style="dim")
        )
    if job.findings:
        parts.append(Text(f"Findings across {unit}s", style="bold"))
        for finding in job.findings[: max(top, 5)]:
            parts.append(
                Text.assemble(
                    (finding.rule, "bold"),
                    f" · {len(finding.ranks)} of {len(job.ranks)} {unit}s · {finding.severity}"
                    f" · {'' if finding.straggler is not None else 'saves '}{job_saving(job, finding)}"
                    + (" · minor" if finding.minor else ""),
                )
            )
            parts.append(Text(finding.title, style="dim", overflow="fold"))
            if finding.note:
                parts.append(Text(f"({finding.note})", style="dim", overflow="fold"))
    return parts
