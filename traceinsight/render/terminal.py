"""The terminal summary (rich): header, warnings, scorecard, where the GPU time goes, findings by
saving, the minor ones, then the detail tables. Same sections, same order as the HTML page.
:class:`TerminalRenderer` draws any result: a trace's summary (here), a job's
(:mod:`.job_text`), the diff's (:mod:`.diff`).

Every string that comes from the trace is printed as a ``rich.text.Text``: never read as markup.
"""

from __future__ import annotations

import io
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import IO, Any, Final

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from traceinsight.formatting import format_duration, format_share, source_label
from traceinsight.load.text import printable
from traceinsight.render import AnyResult, shown_details
from traceinsight.render.facts import (
    MEMORY_COLUMNS,
    allocator_fact,
    header_facts,
    memory_rows,
    no_findings_text,
    saving_text,
    time_split,
)
from traceinsight.render.flops_view import flop_kernel_table, module_table
from traceinsight.render.scorecard import scorecard
from traceinsight.render.tables import DataTable, KernelTable, data
from traceinsight.results import Result
from traceinsight.results.trace import Finding, IdleGap, SyncHotspot
from traceinsight.results.vocabulary import cause_label


def reader_gone(stream: IO[str] | None = None) -> None:
    """The reader of ``stream`` (stdout by default) went away, as after ``traceinsight analyze … |
    head``: what is left to print there goes to /dev/null. The command still finishes its work
    (its files are written, its gate is checked) and exits with the status that work gives, so a
    cut pipe is neither a failure nor a broken gate (status 1), and never a traceback."""
    try:
        target = (stream or sys.stdout).fileno()
    except (AttributeError, OSError, ValueError):  # not a file of the OS (a StringIO): nothing to do
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, target)
    os.close(devnull)


#: How wide output that goes to a pipe or a file (a CI log) is laid out, unless ``COLUMNS`` says.
PIPED_WIDTH: Final = 120


class TerminalConsole(Console):
    """A rich console whose cut pipe is :func:`reader_gone` (rich's own exits with status 1).

    Piped or redirected, it lays out :data:`PIPED_WIDTH` columns unless ``COLUMNS`` (or ``width``)
    says otherwise: rich's 80 cut kernel names to a few dozen characters and wrapped table rows
    over several lines in CI logs, which no terminal limits to 80 columns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if kwargs.get("width") is None and not self.is_terminal and not os.environ.get("COLUMNS"):
            self.width = PIPED_WIDTH

    def on_broken_pipe(self) -> None:
        self.quiet = True
        reader_gone(self.file)


_LEVEL_STYLE = {"good": "green", "warn": "yellow", "bad": "red", "info": "cyan"}
_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
#: Rows in each table of a trace's summary, and ranks in a job's.
_TOP = 5
_TOP_RANKS = 10


def header_lines(result: Result) -> list[tuple[str, str]]:
    """(label, value) pairs for the header (the facts every renderer shows)."""
    return header_facts(result)


def _failure(result: Result) -> RenderableType | None:
    run = result.run
    if run is None or (run.failure is None and run.exit_status == 0):
        return None
    steps = f"; the trace holds {run.steps_recorded} complete steps" if run.steps_recorded is not None else ""
    text = Text.assemble(
        ("The script failed", "bold red"),
        f" after {run.elapsed_s:,.1f} s with exit status {run.exit_status}",
        (f": {run.failure}" if run.failure else ""),
        f"{steps}. The report covers what ran before that.",
    )
    return Panel(text, border_style="red")


def _warnings(result: Result) -> RenderableType | None:
    if not result.warnings:
        return None
    body = DataTable.grid(padding=(0, 1))
    body.add_column()
    for warning in result.warnings:
        body.add_row(Text.assemble(("• ", "yellow"), warning.message))
        body.add_row(Text.assemble("  ", ("what to do: ", "dim"), warning.advice))
    return Panel(body, title="read this first", title_align="left", border_style="yellow")


def _time_split(result: Result) -> list[RenderableType]:
    parts: list[RenderableType] = []
    for usage in shown_details(result).usage:
        if not usage.window_ns:
            continue
        per_step = usage.steps > 0
        title = f"Where GPU {usage.device}'s time goes ({usage.of_what}"
        title += f", {usage.steps} steady step{'s' if usage.steps != 1 else ''})" if per_step else ")"
        table = DataTable(title=title, title_justify="left", show_edge=False)
        table.add_column("")
        table.add_column("per step" if per_step else "time", justify="right", no_wrap=True)
        table.add_column("share", justify="right", no_wrap=True)
        for row in time_split(usage):
            amount = row.per_step_ns if row.per_step_ns is not None else row.ns
            table.add_row(row.label, format_duration(amount), format_share(row.share))
        if usage.outside_ns:
            table.caption = (
                f"Idle outside the steady state, not in these figures: {format_duration(usage.outside_ns)}."
            )
        parts.append(table)
    return parts


def _finding_card(index: int, finding: Finding) -> RenderableType:
    body = DataTable.grid(padding=(0, 2))
    body.add_column(style="dim")
    body.add_column()
    for label, value in finding.evidence:
        body.add_row(data(label), data(value))
    body.add_row("saves", saving_text(finding) + (f": {finding.saving_note}" if finding.saving_note else ""))
    body.add_row("do", finding.advice.summary)
    title = Text.assemble(
        (f"{index}. [{finding.severity}] ", _SEVERITY_STYLE[finding.severity]), (finding.rule, "bold")
    )
    return Panel(
        Group(Text(finding.title, style="bold"), body), title=title, title_align="left", border_style="dim"
    )


def trace_renderables(result: Result, top: int = _TOP) -> list[RenderableType]:
    """Everything the summary prints, in order."""
    details = shown_details(result, "the summary")
    has_gpu = result.trace.has_gpu_activity
    parts: list[RenderableType] = []
    head = DataTable.grid(padding=(0, 2))
    head.add_column(style="bold", no_wrap=True)
    head.add_column()
    for label, value in header_lines(result):
        head.add_row(label, data(value))
    parts.append(Panel(head, title="traceinsight", title_align="left", border_style="blue"))
    for extra in (_failure(result), _warnings(result)):
        if extra is not None:
            parts.append(extra)

    scores = DataTable(title="Scorecard", title_justify="left", show_edge=False, expand=False)
    scores.add_column("measure", no_wrap=True)
    scores.add_column("value", justify="right", no_wrap=True)
    scores.add_column("verdict")
    for score in scorecard(result):
        scores.add_row(score.label, Text(score.value, style=_LEVEL_STYLE[score.level]), score.verdict)
    parts.append(scores)
    parts.extend(_time_split(result))

    if not has_gpu:
        foreign = details.foreign_accelerator
        parts.append(
            Text(
                f"Host-side view (the {foreign.name} accelerator's activity is not read)"
                if foreign is not None
                else "Host-side view (no GPU activity in this trace)",
                style="bold cyan",
            )
        )
    cards = [finding for finding in result.findings if not finding.minor]
    minor = [finding for finding in result.findings if finding.minor]
    if cards:
        parts.append(Text(f"\nFindings ({len(cards)}), largest saving first", style="bold"))
        for index, finding in enumerate(cards, 1):
            parts.append(_finding_card(index, finding))
    elif has_gpu:
        parts.append(Text("\n" + no_findings_text(result), style="green"))
    if minor:
        listing = DataTable(
            title=f"Minor findings ({len(minor)}): each saves under 1% of the step",
            title_justify="left",
            show_edge=False,
            show_header=False,
        )
        listing.add_column("rule", style="dim", no_wrap=True)
        listing.add_column("finding")
        listing.add_column("saves", justify="right", no_wrap=True)
        for finding in minor:
            listing.add_row(finding.rule, data(finding.title), format_duration(finding.savings_total_ns))
        parts.append(listing)

    if result.idle_gaps:
        gaps = _detail_table(
            f"Longest idle gaps (of {len(result.idle_gaps)}; start counts from the trace's first event)",
            ("GPU", "start", "idle", "cause", "what the host did", "source"),
        )
        for gap in result.idle_gaps[:top]:
            gaps.add_row(
                str(gap.device),
                format_duration(gap.start_ns),
                format_duration(gap.duration_ns),
                cause_label(gap.cause_kind),
                data(gap.cause),
                data(_source(gap)),
            )
        parts.append(gaps)
    if result.sync_hotspots:
        hot = _detail_table("Sync hot spots", ("call", "op", "source", "count", "blocked", "GPU idle after"))
        for hotspot in result.sync_hotspots[:top]:
            hot.add_row(
                data(hotspot.call_text),
                data(hotspot.op or ""),
                data(_source(hotspot)),
                str(hotspot.count),
                format_duration(hotspot.blocked_ns),
                format_duration(hotspot.idle_after_ns),
            )
        parts.append(hot)
    if result.memcpy:
        copies = _detail_table("Copies by kind", ("GPU", "kind", "count", "bytes", "time", "overlapped"))
        for group in result.memcpy[:top]:
            share = group.overlapped_ns / group.duration_ns if group.duration_ns else 0.0
            copies.add_row(
                str(group.device),
                data(group.kind),
                str(group.count),
                f"{group.bytes:,}",
                format_duration(group.duration_ns),
                format_share(share),
            )
        parts.append(copies)
    memory = memory_rows(result)
    if memory:
        table = _detail_table("Memory (peaks over the whole trace)", MEMORY_COLUMNS)
        for row in memory:
            table.add_row(*row)
        parts.append(table)
    allocator = allocator_fact(result)
    if allocator is not None:
        parts.append(Text.assemble(("Allocator calls: ", "bold"), allocator))
    if result.kernels:
        parts.append(
            KernelTable(
                "Top kernels",
                ("count", "total", "mean"),
                [
                    (
                        stat.device,
                        stat.name,
                        (f"{stat.count:,}", format_duration(stat.total_ns), format_duration(stat.mean_ns)),
                    )
                    for stat in result.kernels[:top]
                ],
            )
        )
    flop_kernels = flop_kernel_table(result.flops, top)
    if flop_kernels is not None:
        parts.append(flop_kernels)
    modules = module_table(result.scopes, top)
    if modules is not None:
        parts.append(modules)
    host = result.host
    if host.top_ops:
        ops = _detail_table("Busiest host operators (by self time)", ("operator", "count", "self", "total"))
        shown = len(host.top_ops) if not has_gpu else top
        for op in host.top_ops[:shown]:
            ops.add_row(
                data(op.name), str(op.count), format_duration(op.self_ns), format_duration(op.total_ns)
            )
        parts.append(ops)
    return parts


def _source(item: IdleGap | SyncHotspot) -> str:
    """The source column: the line, named as what it is when it is not the call's."""
    if item.source is None:
        return ""
    return source_label(item.source, item.source_kind, item.source_line_kind, item.source_function)


class TerminalRenderer:
    """Renders a result's terminal summary: ``top`` rows per table (a trace's default 5; a job's
    ranks, 10 and every straggler). :meth:`render` gives plain text at ``width`` columns (files,
    golden tests); :meth:`print` prints to a console as it is (colour, its width)."""

    def __init__(self, width: int = 100, top: int | None = None) -> None:
        self.width = width
        self.top = top

    def renderables(self, result: AnyResult) -> list[RenderableType]:
        """Everything the summary prints, in order."""
        if not isinstance(result, Result):  # a diff's or a job's: their drawing loads when first used
            from traceinsight.render.diff import comparison_renderables
            from traceinsight.render.job_diff import job_comparison_renderables
            from traceinsight.render.job_text import job_renderables
            from traceinsight.results import Comparison, JobComparison, JobResult

            if isinstance(result, Comparison):
                return comparison_renderables(result)
            if isinstance(result, JobComparison):
                return job_comparison_renderables(result, top=self.top or _TOP_RANKS)
            if isinstance(result, JobResult):
                return job_renderables(result, top=self.top or _TOP_RANKS)
        return trace_renderables(result, self.top or _TOP)

    def render(self, result: AnyResult) -> str:
        """The summary without colour codes."""
        buffer = io.StringIO()
        console = Console(file=buffer, width=self.width, color_system=None, force_terminal=False)
        for part in self.renderables(result):
            console.print(part)
        return buffer.getvalue()

    def print(self, result: AnyResult, console: Console, outputs: Sequence[tuple[str, Path]] = ()) -> None:
        """Print the summary to ``console`` and, last, where each output was written."""
        for part in self.renderables(result):
            console.print(part)
        print_outputs(console, outputs)


def print_outputs(console: Console, outputs: Sequence[tuple[str, Path]]) -> None:
    """``label: path`` for each output written (control characters of a path replaced)."""
    for label, path in outputs:
        console.print(Text.assemble(f"{printable(label)}: ", (printable(str(path)), "bold")))


def _detail_table(title: str, columns: tuple[str, ...]) -> Table:
    """A details table: title on the left, no outer border, long cells folded onto more lines."""
    table = DataTable(title=title, title_justify="left", show_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table
