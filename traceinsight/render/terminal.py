"""The terminal summary (rich): header, scorecard, findings worst first, then the detail tables.

Same sections, same order as the HTML page.
"""

from __future__ import annotations

import io
from pathlib import Path

from rich.console import Console, Group, RenderableType
from rich.panel import Panel
from rich.style import StyleType
from rich.table import Table
from rich.text import Text

from traceinsight.formatting import format_duration, short_kernel_name
from traceinsight.load.text import printable
from traceinsight.render.scorecard import scorecard
from traceinsight.report import Report

_LEVEL_STYLE = {"good": "green", "warn": "yellow", "bad": "red", "info": "cyan"}
_SEVERITY_STYLE = {"high": "bold red", "medium": "yellow", "low": "cyan"}
_TOP = 5


class _DataTable(Table):
    """A table whose string cells are shown as written: trace strings are data, never rich markup."""

    def add_row(
        self, *renderables: RenderableType | None, style: StyleType | None = None, end_section: bool = False
    ) -> None:
        cells = (Text(cell) if isinstance(cell, str) else cell for cell in renderables)
        super().add_row(*cells, style=style, end_section=end_section)


def header_lines(report: Report) -> list[tuple[str, str]]:
    """(label, value) pairs for the header: trace, GPUs, rank, steps, span, versions."""
    analysis = report.analysis
    meta = analysis.meta
    gpus = (
        ", ".join(f"{device.device}: {device.name or 'unnamed GPU'}" for device in analysis.devices)
        or "none (no GPU activity in this trace)"
    )
    lines = [("trace", report.trace_name), ("GPUs", gpus)]
    rank = f"{meta.rank}" + (f" of {meta.world_size}" if meta.world_size else "")
    lines.append(("rank", rank))
    if analysis.iterations:
        kind = "ProfilerStep spans" if analysis.steps_marked else "optimizer steps"
        lines.append(("steps", f"{analysis.iterations} ({kind})"))
    if analysis.devices:
        lines.append(
            (
                "GPU span",
                format_duration(
                    max(d.last_ns for d in analysis.devices) - min(d.first_ns for d in analysis.devices)
                ),
            )
        )
    versions = [
        f"CUDA runtime {meta.cuda_runtime_version}" if meta.cuda_runtime_version else "",
        f"driver {meta.cuda_driver_version}" if meta.cuda_driver_version else "",
        f"HIP {meta.hip_runtime_version}" if meta.hip_runtime_version else "",
    ]
    if any(versions):
        lines.append(("versions", ", ".join(v for v in versions if v)))
    return lines


def renderables(report: Report) -> list[RenderableType]:
    """Everything the summary prints, in order."""
    analysis = report.analysis
    parts: list[RenderableType] = []
    head = _DataTable.grid(padding=(0, 2))
    head.add_column(style="bold")
    head.add_column()
    for label, value in header_lines(report):
        head.add_row(label, value)
    parts.append(Panel(head, title="traceinsight", title_align="left", border_style="blue"))

    scores = _DataTable(title="Scorecard", title_justify="left", show_edge=False, expand=False)
    scores.add_column("measure")
    scores.add_column("value", justify="right")
    scores.add_column("verdict")
    for score in scorecard(report):
        scores.add_row(score.label, Text(score.value, style=_LEVEL_STYLE[score.level]), score.verdict)
    parts.append(scores)

    if not analysis.has_gpu:
        parts.append(Text("Host-side view (no GPU activity in this trace)", style="bold cyan"))
    if report.findings:
        parts.append(
            Text(f"\nFindings ({len(report.findings)}), largest estimated saving first", style="bold")
        )
        for index, finding in enumerate(report.findings, 1):
            body = _DataTable.grid(padding=(0, 2))
            body.add_column(style="dim")
            body.add_column()
            for label, value in finding.evidence:
                body.add_row(label, value)
            body.add_row("saves up to", format_duration(finding.savings_ns))
            body.add_row("do", finding.advice.summary)
            title = Text.assemble(
                (f"{index}. [{finding.severity}] ", _SEVERITY_STYLE[finding.severity]), (finding.rule, "bold")
            )
            headline = Text(finding.title, style="bold")
            parts.append(Panel(Group(headline, body), title=title, title_align="left", border_style="dim"))
    elif analysis.has_gpu:
        parts.append(Text("\nNo findings: nothing in this trace keeps the GPU waiting.", style="green"))

    if analysis.idle_gaps:
        gaps = _detail_table(
            f"Longest idle gaps (of {len(analysis.idle_gaps)})", ("GPU", "start", "idle", "cause", "source")
        )
        for gap in analysis.idle_gaps[:_TOP]:
            gaps.add_row(
                str(gap.device),
                format_duration(gap.start_ns - analysis.meta.origin_ns),
                format_duration(gap.duration_ns),
                gap.cause,
                gap.source or "",
            )
        parts.append(gaps)
    if analysis.sync_hotspots:
        hot = _detail_table("Sync hot spots", ("call", "op", "source", "count", "blocked", "GPU idle after"))
        for hotspot in analysis.sync_hotspots[:_TOP]:
            hot.add_row(
                hotspot.call,
                hotspot.op or "",
                hotspot.source or "",
                str(hotspot.count),
                format_duration(hotspot.blocked_ns),
                format_duration(hotspot.idle_after_ns),
            )
        parts.append(hot)
    if analysis.copies:
        copies = _detail_table("Copies by kind", ("GPU", "kind", "count", "bytes", "time", "overlapped"))
        for group in analysis.copies[:_TOP]:
            share = group.overlapped_ns / group.duration_ns if group.duration_ns else 0.0
            copies.add_row(
                str(group.device),
                group.kind,
                str(group.count),
                f"{group.bytes:,}",
                format_duration(group.duration_ns),
                f"{share:.0%}",
            )
        parts.append(copies)
    if analysis.kernels.kernels:
        kernels = _DataTable(title="Top kernels", title_justify="left", show_edge=False)
        for column in ("GPU", "kernel", "count", "total", "mean"):
            kernels.add_column(column, overflow="ellipsis", no_wrap=column == "kernel")
        for stat in analysis.kernels.kernels[:_TOP]:
            kernels.add_row(
                str(stat.device),
                short_kernel_name(stat.name, 60),
                str(stat.count),
                format_duration(stat.total_ns),
                format_duration(stat.mean_ns),
            )
        parts.append(kernels)
    host = analysis.host
    if host.top_ops:
        ops = _detail_table("Busiest host operators", ("operator", "count", "total"))
        for name, count, total in host.top_ops[: len(host.top_ops) if not analysis.has_gpu else _TOP]:
            ops.add_row(name, str(count), format_duration(total))
        parts.append(ops)
    return parts


class TerminalRenderer:
    """Renders the summary as plain text at a fixed width (used for golden tests and files)."""

    def __init__(self, width: int = 100) -> None:
        self.width = width

    def render(self, report: Report) -> str:
        """The summary without colour codes."""
        buffer = io.StringIO()
        console = Console(file=buffer, width=self.width, color_system=None, force_terminal=False)
        for part in renderables(report):
            console.print(part)
        return buffer.getvalue()


def print_summary(report: Report, console: Console, outputs: list[tuple[str, Path]] | None = None) -> None:
    """Print the summary to ``console`` and, last, where each output was written."""
    for part in renderables(report):
        console.print(part)
    for label, path in outputs or []:
        console.print(Text.assemble(f"{label}: ", (printable(str(path)), "bold")))


def _detail_table(title: str, columns: tuple[str, ...]) -> Table:
    """A details table: title on the left, no outer border, long cells folded onto more lines."""
    table = _DataTable(title=title, title_justify="left", show_edge=False)
    for column in columns:
        table.add_column(column, overflow="fold")
    return table
