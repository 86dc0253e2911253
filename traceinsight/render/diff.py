"""``traceinsight diff`` shown: the terminal summary (rich) and the HTML page of a :class:`Comparison`
(drawn by :class:`~.terminal.TerminalRenderer` and :class:`~.html.HtmlRenderer`).

Same words and order everywhere: what differs in the setup, the before/after table (step time, busy,
idle by cause, syncs, copies, communication), findings fixed / new / still present, the kernels
that changed most. Every string from a trace or a stored result is shown as data (``rich.text.Text``
in every terminal cell, never rich markup; autoescaped HTML).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from markupsafe import Markup
from rich.console import RenderableType
from rich.panel import Panel
from rich.table import Table
from rich.text import Text

from traceinsight.formatting import format_change, format_count, format_duration, short_kernel_name
from traceinsight.load.text import printable
from traceinsight.render import charts
from traceinsight.render.svg import Canvas
from traceinsight.render.tables import KernelTable
from traceinsight.render.templates import environment
from traceinsight.results import Comparison
from traceinsight.results.vocabulary import cause_label
from traceinsight.version import __version__

__all__ = ["comparison_page", "comparison_renderables", "diff_header", "page_values"]

_STATUS = {"fixed": ("Fixed", "green"), "new": ("New", "red"), "still": ("Still present", "yellow")}


def diff_header(title: str, before: str, after: str, notes: Sequence[str]) -> list[RenderableType]:
    """What a diff prints first (a trace's and a job's alike): the two sides named, then the notes
    on what differs in their setup (none when the same)."""
    parts: list[RenderableType] = [
        Panel(
            Text.assemble(
                ("before ", "bold"), printable(before), "\n", ("after  ", "bold"), printable(after)
            ),
            title=title,
            title_align="left",
            border_style="blue",
        )
    ]
    if notes:
        body = Text("\n".join(f"• {printable(note)}" for note in notes))
        parts.append(Panel(body, title="not the same setup", title_align="left", border_style="yellow"))
    return parts


def comparison_renderables(comparison: Comparison) -> list[RenderableType]:
    """Everything ``diff`` prints, in order."""
    parts = diff_header("traceinsight diff", comparison.before, comparison.after, comparison.notes)
    if comparison.headline:
        body = Text(comparison.headline, style="bold")
        for line in comparison.moved:
            body.append(f"\n• {line}", style="none")
        parts.append(Panel(body, title="verdict", title_align="left", border_style="blue"))
    judged = any(metric.verdict is not None for metric in comparison.shown)
    table = Table(title=f"Before and after ({comparison.basis})", title_justify="left", show_edge=False)
    table.add_column("")
    for column in ("before", "after", "change"):
        table.add_column(column, justify="right", no_wrap=True)
    if judged:
        table.add_column(f"verdict ({comparison.confidence * 100:.0f}% interval)", no_wrap=True)
    for metric in comparison.shown:
        row: list[Text | str] = [
            Text(printable(metric.title)),
            metric.text(metric.before),
            metric.text(metric.after),
            metric.change_text(),
        ]
        table.add_row(*row, *([metric.verdict_text()] if judged else []))
    parts.append(table)
    if comparison.predictions:
        listing = Table(
            title="Predicted and measured (fixed findings)",
            title_justify="left",
            show_edge=False,
            show_header=False,
        )
        listing.add_column("rule", no_wrap=True, style="dim")
        listing.add_column("prediction")
        for prediction in comparison.predictions:
            listing.add_row(Text(printable(prediction.rule)), Text(printable(prediction.text())))
        parts.append(listing)
    for status, (title, style) in _STATUS.items():
        changes = [change for change in comparison.findings if change.status == status]
        if not changes:
            continue
        listing = Table(
            title=f"{title} ({len(changes)})",
            title_justify="left",
            title_style=style,
            show_edge=False,
            show_header=False,
        )
        listing.add_column("rule", no_wrap=True, style="dim")
        listing.add_column("finding")
        savings = [
            " → ".join(
                format_duration(value * 1000) if value is not None else "—"
                for value in (change.before_saving_us, change.after_saving_us)
            )
            for change in changes
        ]
        listing.add_column("saving", justify="right", no_wrap=True, min_width=max(map(len, savings)))
        for change, saving in zip(changes, savings, strict=True):
            listing.add_row(Text(printable(change.rule)), Text(printable(change.title)), saving)
        parts.append(listing)
    if comparison.kernels:
        parts.append(
            KernelTable(
                f"Kernels that changed most ({comparison.basis})",
                ("before", "after", "launches"),
                [
                    (
                        moved.device,
                        moved.name,
                        (
                            format_duration(moved.before_total_us * 1000),
                            format_duration(moved.after_total_us * 1000),
                            f"{format_count(moved.before_launches)} → {format_count(moved.after_launches)}",
                        ),
                    )
                    for moved in comparison.kernels
                ],
            )
        )
    if comparison.modules:
        modules = Table(
            title=f"Modules that changed most ({comparison.modules[0].time} time, {comparison.basis})",
            title_justify="left",
            show_edge=False,
        )
        modules.add_column("module", overflow="ellipsis", no_wrap=True, max_width=60)
        for column in ("before", "after", "change"):
            modules.add_column(column, justify="right", no_wrap=True)
        for module in comparison.modules:
            modules.add_row(
                Text(printable(module.path)),
                format_duration(module.before_us * 1000),
                format_duration(module.after_us * 1000),
                format_change(module.change_us),
            )
        parts.append(modules)
    return parts


def _bars(comparison: Comparison) -> list[tuple[str, list[tuple[str, str, float]]]]:
    """Each side's step (or analyzed time) split into busy classes and idle causes, in ns."""
    step = comparison.metric("step_time")
    bars: list[tuple[str, list[tuple[str, str, float]]]] = []
    for side, value, total in (("before", "before", step.before), ("after", "after", step.after)):
        if not total:
            bars.append((side, []))
            continue
        segments = []
        for key, label, color in (
            ("compute_share", "GPU busy: compute", charts.BUSY),
            ("communication_share", "GPU busy: communication", charts.COMMUNICATION),
            ("copy_share", "GPU busy: copies", charts.COPY),
        ):
            share = getattr(comparison.metric(key), value)
            if share:
                segments.append((label, color, share * total * 1000))
        for metric in comparison.idle:
            amount = getattr(metric, value)
            if amount:
                segments.append(
                    (f"idle: {cause_label(metric.label)}", charts.cause_color(metric.label), amount * 1000)
                )
        bars.append((side, segments))
    return bars


def _dots(comparison: Comparison) -> list[Markup | None]:
    """Each shown metric's steps as dots, before (upper row) and after (lower row) on one scale:
    a small inline SVG per row of the table (None: no per-step figures). Numbers only go in."""
    drawn: list[Markup | None] = []
    width, height, pad = 160, 26, 4
    for metric in comparison.shown:
        values = [*metric.before_steps, *metric.after_steps]
        if not values:
            drawn.append(None)
            continue
        low, high = min(values), max(values)
        span = (high - low) or 1.0
        circles = []
        for row, (steps, color) in enumerate(
            ((metric.before_steps, charts.BEFORE_DOT), (metric.after_steps, charts.AFTER_DOT))
        ):
            y = 7 + row * 12
            for value in steps:
                x = pad + (value - low) / span * (width - 2 * pad)
                circles.append(f'<circle cx="{x:.1f}" cy="{y}" r="2.5" fill="{color}" fill-opacity="0.7"/>')
        title = f"{len(metric.before_steps)} steps before (upper row), {len(metric.after_steps)} after (lower row)"
        drawn.append(
            Markup(
                f'<svg class="dots" width="{width}" height="{height}" viewBox="0 0 {width} {height}" '
                f'role="img" aria-label="{title}"><title>{title}</title>{"".join(circles)}</svg>'
            )
        )
    return drawn


#: The comparison's one chart: its id and title.
BEFORE_AFTER: Final = ("before-after", "Step time before and after")


def before_after_canvas(comparison: Comparison) -> Canvas | None:
    """The step time before and after, split by where it went (None when neither side has one)."""
    step = comparison.metric("step_time")
    longest = max(value for value in (step.before, step.after, 1.0) if value)
    per_unit, unit = (1e6, "ms") if longest * 1000 >= 1e6 else (1e3, "µs")
    return charts.before_after_chart(_bars(comparison), per_unit, f"{unit} {comparison.basis}")


def page_values(comparison: Comparison) -> dict[str, Any]:
    """What ``templates/diff.html`` shows."""
    canvas = before_after_canvas(comparison)
    chart = None if canvas is None else Markup(canvas.svg(*BEFORE_AFTER))
    return {
        "version": __version__,
        "comparison": comparison,
        "chart": chart,
        "rows": [(m.title, m.text(m.before), m.text(m.after), m.change_text()) for m in comparison.shown],
        "verdicts": [m.verdict_text() for m in comparison.shown],
        "judged": any(m.verdict is not None for m in comparison.shown),
        "dots": _dots(comparison),
        "statuses": [
            (title, status, [c for c in comparison.findings if c.status == status])
            for status, (title, _) in _STATUS.items()
        ],
        "duration": lambda us: "—" if us is None else format_duration(us * 1000),
        "signed": lambda us: "—" if us is None else format_change(us),
        "kernel_short": short_kernel_name,
    }


def comparison_page(comparison: Comparison) -> str:
    """The diff as one self-contained page, in the report's style."""
    return environment().get_template("diff.html").render(page_values(comparison))
