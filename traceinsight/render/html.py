"""The shareable HTML report: one self-contained page (inline CSS and SVG, no scripts, no network).

Built from jinja2 templates (``templates/``, shipped in the wheel as ``traceinsight/templates``)
with autoescape on, so every name taken from the trace is escaped. The page shows what the
terminal summary shows, in the same order: header, scorecard, findings ranked by saving, then the
details (idle gaps, sync hot spots, copies, top kernels); charts sit with the section they explain.
Tables are capped and charts downsampled, so the page stays small for any trace; nothing depends on
the clock or the machine except the optional code excerpts, read from ``source_root``. The same
renderer draws a job's page (:mod:`.job_html`) and the diff's (:mod:`.diff`).
"""

from __future__ import annotations

import heapq
from collections import defaultdict
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Final

from markupsafe import Markup

from traceinsight.formatting import (
    source_label,
)
from traceinsight.load.tables import gpus_in_words
from traceinsight.model import Model
from traceinsight.render import AnyResult, charts, shown_details
from traceinsight.render.excerpts import SourceExcerpt, source_excerpt
from traceinsight.render.facts import (
    MEMORY_COLUMNS,
    allocator_fact,
    header_facts,
    memory_rows,
    no_findings_text,
    saving_text,
    time_split,
)
from traceinsight.render.flops_view import module_rows
from traceinsight.render.scorecard import Score, scorecard
from traceinsight.render.svg import Canvas
from traceinsight.render.templates import environment, prepare, templates_dir
from traceinsight.results import Result
from traceinsight.results.trace import Finding, IdleGap
from traceinsight.results.vocabulary import CALL, DEF, ENTRY, RECORDING_START, Located
from traceinsight.version import __version__

__all__ = [
    "HtmlRenderer",
    "SourceExcerpt",
    "chart_specs",
    "finding_views",
    "prepare",
    "source_excerpt",
    "templates_dir",
]

#: Rows shown in each detail table (the page says how many were left out).
TOP_GAPS: Final[int] = 20
TOP_SOURCES: Final[int] = 30
TOP_HOTSPOTS: Final[int] = 20
TOP_COPIES: Final[int] = 30
TOP_KERNELS: Final[int] = 20


#: Colours of the busy classes in the "where the time goes" table (the charts' colours).
_BUSY_COLORS: Final[dict[str, str]] = {
    "compute": charts.BUSY,
    "communication": charts.COMMUNICATION,
    "copy": charts.COPY,
}


# --- view models -------------------------------------------------------------------------------


class FindingView(Model, frozen=True):
    """A finding with what the page adds: its rank, its share of GPU time, its code excerpt."""

    #: Its place among the cards (None: a finding shown alone).
    rank: int | None
    finding: Finding
    saving_share: float | None
    excerpt: SourceExcerpt | None
    #: The source as the page names it (:func:`~traceinsight.formatting.source_label`).
    source: str | None = None
    #: What the source line is, when it is not the call's, and how to get the call's.
    line_note: str | None = None

    @property
    def tag(self) -> str:
        """``#3``: the card's place (nothing for a finding shown alone)."""
        return "" if self.rank is None else f"#{self.rank}"

    @property
    def anchor(self) -> str:
        """The card's id in the page."""
        return "finding" if self.rank is None else f"finding-{self.rank}"


class CauseTotal(Model, frozen=True):
    """Idle in reported gaps of one cause kind."""

    kind: str
    label: str
    color: str
    gaps: int
    idle_ns: int
    share: float | None


class SourceTotal(Model, frozen=True):
    """Idle in reported gaps attributed to one source line (and cause)."""

    source: str
    kind: str
    label: str
    gaps: int
    idle_ns: int
    #: ``source`` as the page names it (:func:`~traceinsight.formatting.source_label`).
    shown: str = ""


class Chart(Model, frozen=True):
    """An inline SVG with its caption."""

    svg: Markup
    caption: str


def _cause_totals(result: Result) -> list[CauseTotal]:
    by_kind: dict[str, list[IdleGap]] = defaultdict(list)
    for gap in result.idle_gaps:
        by_kind[gap.cause_kind].append(gap)
    idle = sum(device.idle_ns for device in result.devices)
    order = charts.ordered_causes(by_kind)
    totals = []
    for kind in order:
        total = sum(gap.duration_ns for gap in by_kind[kind])
        totals.append(
            CauseTotal(
                kind=kind,
                label=charts.cause_label(kind),
                color=charts.cause_color(kind),
                gaps=len(by_kind[kind]),
                idle_ns=total,
                share=total / idle if idle else None,
            )
        )
    return sorted(totals, key=lambda item: -item.idle_ns)


def _source_totals(gaps: Sequence[IdleGap]) -> list[SourceTotal]:
    grouped: dict[tuple[str, str], list[int]] = defaultdict(list)
    shown: dict[str, str] = {}
    for gap in gaps:
        if gap.source:
            grouped[(gap.source, gap.cause_kind)].append(gap.duration_ns)
            if gap.source not in shown:  # the first gap's label, made once a line
                shown[gap.source] = line_label(gap) or gap.source
    return sorted(
        (
            SourceTotal(source, kind, charts.cause_label(kind), len(lengths), sum(lengths), shown[source])
            for (source, kind), lengths in grouped.items()
        ),
        key=lambda item: (-item.idle_ns, item.source, item.kind),
    )


def line_label(item: Located) -> str | None:
    """A result's source as the page names it (a line that is not the call's named as what it is)."""
    if item.source is None:
        return None
    return source_label(item.source, item.source_kind, item.source_line_kind, item.source_function)


def _line_note(finding: Finding) -> str | None:
    """For a source line that is not the call's: what it is, and how to get the call's line."""
    function, line_kind = finding.source_function, finding.source_line_kind
    if finding.source is None or function is None or line_kind == CALL:
        return None
    if line_kind == DEF:
        what = f"{finding.source} is where `{function}` is defined: torch's stack names a function by its `def` line"
    elif line_kind == RECORDING_START:
        what = (
            f"{finding.source} is the line `{function}` was on when recording began: torch's stack keeps "
            "that line for a function already running"
        )
    elif line_kind == ENTRY:
        what = (
            f"`{function}` was entered at {finding.source} and at later lines of that file under one caller: "
            "torch's stack names a frame by its `def` line but a generator resumed by its `yield` line, so "
            "none of them is known to be where it is defined"
        )
    else:
        what = f"this trace's frames do not say whether {finding.source} is the call's line or where `{function}` begins"
    return (
        f"{what}, not the line of the call. To name the call's own line, profile with "
        f"traceinsight run (it records each call's line), or look in `{function}` for the call the title names."
    )


def _excerpt(finding: Finding, root: Path | None) -> SourceExcerpt | None:
    """The code excerpt of a card: around a call's line; from a function's first line on (its body
    holds the call); none for the line a running function was on when recording began, nor for one
    of several lines a function was entered at (neither is where the finding happens)."""
    if finding.source is None or finding.minor or finding.source_line_kind in (RECORDING_START, ENTRY):
        return None
    return source_excerpt(finding.source, root, from_line=finding.source_line_kind == DEF)


class _ChartSpec(Model, frozen=True):
    """One chart to draw: ``build`` gives its canvas (None when the trace has nothing to show)."""

    chart_id: str
    title: str
    caption: str
    build: Callable[[], Canvas | None]

    def chart(self) -> Chart | None:
        canvas = self.build()
        return None if canvas is None else Chart(Markup(canvas.svg(self.chart_id, self.title)), self.caption)


def _render_charts(specs: Sequence[_ChartSpec]) -> dict[str, Chart | None]:
    """Every chart, as inline SVG (a few milliseconds each: they are written, not drawn)."""
    return {spec.chart_id: spec.chart() for spec in specs}


def chart_specs(result: Result) -> list[_ChartSpec]:
    """The page's charts, in the page's order: each drawn when its ``build`` is called."""
    details = shown_details(result, "the charts")
    timeline = details.timeline
    steady_steps = result.steady_state.steady_steps
    sync_basis = "per steady step" if steady_steps else "in the steady state"
    return [
        _ChartSpec(
            "timeline",
            "GPU activity over time",
            "Each GPU over time: blue where it was busy, idle gaps of at least "
            f"{details.thresholds.min_gap_us:g} µs coloured by cause, triangles where the host "
            "waited in a sync call, dashed lines where each step began on the GPU.",
            lambda: charts.timeline_chart(timeline, result.idle_gaps) if timeline else None,
        ),
        _ChartSpec(
            "steps",
            "Each profiled step: GPU busy and idle by cause",
            "Each step's window on the GPU, its time summed by category: before the step's first "
            "GPU work, busy, idle by cause, after its last work; steps outside the steady state "
            "are marked.",
            lambda: charts.step_breakdown_chart(result.steps),
        ),
        _ChartSpec(
            "gaps",
            "The longest GPU idle gaps and their causes",
            "The longest idle gaps, coloured by cause, with what the host was doing and its source line.",
            lambda: charts.idle_gaps_chart(result.idle_gaps),
        ),
        _ChartSpec(
            "syncs",
            "Host waits for the GPU in the steady state",
            f"Host waits for the GPU {sync_basis}: time blocked in the call, then the GPU idle "
            "it caused; waits outside the steady state (the sync that ends a profile) are in "
            "the table only.",
            lambda: charts.sync_hotspots_chart(result.sync_hotspots, steady_steps),
        ),
        _ChartSpec(
            "copies",
            "Copy time by direction and memory kind",
            "Copy time by direction and memory kind: while kernels ran on the same GPU, or "
            "exposed (no kernel ran meanwhile).",
            lambda: charts.copies_chart(result.memcpy),
        ),
        _ChartSpec(
            "memory",
            "Memory over time",
            "Memory over time from the allocator's records: allocated (solid), reserved by the "
            "caching allocator (dashed), the device's total (dotted); each point is the largest "
            "value of its time slice.",
            lambda: charts.memory_chart(result.memory.devices),
        ),
        _ChartSpec(
            "host",
            "Busiest host operators by self time",
            "The operators with the most self time (their own, without the operators they "
            "call), as in the table below; lighter: the rest of their total time.",
            lambda: charts.host_ops_chart(result.host),
        ),
    ]


def finding_views(findings: Sequence[Finding], source_root: Path | None) -> list[FindingView]:
    """The findings as the page's cards show them (a rank each, largest saving first)."""
    return [
        FindingView(
            rank=index + 1,
            finding=finding,
            saving_share=finding.saving_share,
            excerpt=_excerpt(finding, source_root),
            source=line_label(finding),
            line_note=_line_note(finding),
        )
        for index, finding in enumerate(findings)
    ]


class HtmlRenderer:
    """Renders a result as one self-contained HTML page: a trace's report (from the result alone,
    live or stored), a job's page, or the diff's page.

    ``source_root`` is the directory a trace's code excerpts may be read from (see
    :mod:`.excerpts`; None: no excerpts).
    """

    def __init__(self, source_root: Path | None = None) -> None:
        self.source_root = source_root
        self._environment = environment()

    def render(self, result: AnyResult) -> str:
        """The whole page as one string (deterministic for the same result and source files)."""
        if not isinstance(result, Result):  # a diff's or a job's: their drawing loads when first used
            from traceinsight.render.diff import comparison_page
            from traceinsight.render.job_diff import job_comparison_page
            from traceinsight.render.job_html import job_page
            from traceinsight.results import Comparison, JobComparison, JobResult

            if isinstance(result, Comparison):
                return comparison_page(result)
            if isinstance(result, JobComparison):
                return job_comparison_page(result)
            if isinstance(result, JobResult):
                return job_page(result)
        return self._environment.get_template("report.html").render(self.context(result))

    def context(self, result: Result) -> dict[str, object]:
        """Everything the template shows, computed once (no logic left for the template)."""
        details = shown_details(result, "the page")
        name = result.trace.name
        findings = finding_views(result.findings, self.source_root or result.source_root)
        cards = [view for view in findings if not view.finding.minor]
        source_totals = _source_totals(result.idle_gaps)
        # The longest first (sorted()[:TOP_GAPS], without sorting the tens of thousands after them).
        gaps_ranked = heapq.nsmallest(
            TOP_GAPS, result.idle_gaps, key=lambda g: (-g.duration_ns, g.device, g.start_ns)
        )
        scores: tuple[Score, ...] = scorecard(result)
        drawn = _render_charts(chart_specs(result))
        overview = [chart for chart in (drawn["timeline"], drawn["steps"]) if chart is not None]
        on_gpu = any(scope.gpu_ns for scope in result.scopes.modules)
        return {
            "version": __version__,
            "trace_name": name,
            "page_title": (
                f"{result.run.script} · {result.run.started[:16].replace('T', ' ')} · traceinsight"
                if result.run
                else f"{name} · traceinsight"
            ),
            "heading": result.run.command if result.run else name,
            "facts": header_facts(result),
            "run": result.run,
            "warnings": result.warnings,
            "time_splits": [(usage, time_split(usage)) for usage in details.usage if usage.window_ns],
            "busy_color": _BUSY_COLORS,
            "minor": [view for view in findings if view.finding.minor],
            "saving_text": saving_text,
            "line_label": line_label,
            "no_findings": no_findings_text(result),
            "thresholds": details.thresholds,
            "host": result.host,
            "has_gpu": result.trace.has_gpu_activity,
            # source lines known without Python frame events (from the operators' stacks)
            "sources_named": any(f.source for f in result.findings)
            or any(g.source for g in result.idle_gaps),
            "foreign_accelerator": details.foreign_accelerator,
            "gpus_unprofiled": gpus_in_words(result.trace.gpus_listed),
            "scores": scores,
            "overview": overview,
            "findings": cards,
            "cause_totals": _cause_totals(result),
            "source_totals": source_totals[:TOP_SOURCES],
            "source_total_count": len(source_totals),
            "gaps": gaps_ranked,
            "gap_count": len(result.idle_gaps),
            "gaps_idle_ns": sum(gap.duration_ns for gap in result.idle_gaps),
            "gaps_chart": drawn["gaps"],
            "cause_label": charts.cause_label,
            "cause_color": charts.cause_color,
            "hotspots": result.sync_hotspots[:TOP_HOTSPOTS],
            "hotspot_count": len(result.sync_hotspots),
            "syncs_chart": drawn["syncs"],
            "copies": result.memcpy[:TOP_COPIES],
            "copy_count": len(result.memcpy),
            "copies_chart": drawn["copies"],
            "kernels": {"distinct": details.kernels_distinct, "kernel_count": details.kernel_launches},
            "kernel_rows": result.kernels[:TOP_KERNELS],
            "kernel_totals": {total.device: total.kernel_ns for total in details.kernel_totals},
            "host_chart": drawn["host"],
            "memory_chart": drawn["memory"],
            "memory_columns": MEMORY_COLUMNS,
            "memory_rows": memory_rows(result),
            "allocator_fact": allocator_fact(result),
            "host_ops": result.host.top_ops,
            # the module tree (render/flops_view.py)
            "module_rows": module_rows(result.scopes),
            "modules_per_step": bool(result.scopes.steps),
            "modules_on_gpu": on_gpu,
            "modules_outside": result.scopes.outside_modules_gpu_ns,
            "modules_backward": result.scopes.backward_linked_gpu_ns if on_gpu else 0,
            "limits": {
                "gaps": TOP_GAPS,
                "sources": TOP_SOURCES,
                "hotspots": TOP_HOTSPOTS,
                "copies": TOP_COPIES,
                "kernels": TOP_KERNELS,
            },
        }
