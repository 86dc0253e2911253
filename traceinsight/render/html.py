"""The shareable HTML report: one self-contained page (inline CSS and SVG, no scripts, no network).

Built from jinja2 templates (``templates/``, shipped in the wheel as ``traceinsight/templates``)
with autoescape on, so every name taken from the trace is escaped. The page shows what the
terminal summary shows, in the same order: header, scorecard, findings ranked by saving, then the
details (idle gaps, sync hot spots, copies, top kernels); charts sit with the section they explain.
Tables are capped and charts downsampled, so the page stays small for any trace; nothing depends on
the clock or the machine except the optional code excerpts, read from ``source_root``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.resources
import mmap
import os
import pickle
import select
import signal
import struct
from collections import defaultdict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final, TypeVar

import jinja2
from markupsafe import Markup
from matplotlib.figure import Figure

import traceinsight
from traceinsight.analysis import Analysis
from traceinsight.analysis.kernels import TopKernels
from traceinsight.analysis.results import IdleGap
from traceinsight.analysis.sources import CALL, DEF, RECORDING_START, Located
from traceinsight.analysis.timeline import Timeline
from traceinsight.cores import second_core
from traceinsight.errors import TraceInsightError
from traceinsight.formatting import (
    format_duration,
    format_share,
    format_size,
    short_kernel_name,
    source_label,
)
from traceinsight.render import charts
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
from traceinsight.render.scorecard import Score, scorecard
from traceinsight.report import Report
from traceinsight.rules.findings import Finding

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

_Carried = TypeVar("_Carried")

__all__ = ["HtmlRenderer", "SourceExcerpt", "source_excerpt", "templates_dir"]

#: Rows shown in each detail table (the page says how many were left out).
TOP_GAPS: Final[int] = 20
TOP_SOURCES: Final[int] = 30
TOP_HOTSPOTS: Final[int] = 20
TOP_COPIES: Final[int] = 30
TOP_KERNELS: Final[int] = 20
#: How long the chart child may go without taking a chart or sending a byte before it is taken for
#: stuck, killed, and its charts drawn here. A chart takes at most about 0.3 s on any trace (they
#: are downsampled); a forked child can wait for good on a lock that another thread of this
#: process held at the fork and no fork handler released (seen under AddressSanitizer, whose
#: allocator has no such handler: 1 run in 48 of the fuzz corpus's trace with a 500 MB name).
CHART_CHILD_STALL_S: Final[float] = 5.0


#: Colours of the busy classes in the "where the time goes" table (the charts' colours).
_BUSY_COLORS: Final[dict[str, str]] = {
    "compute": charts.BUSY,
    "communication": charts.COMMUNICATION,
    "copy": charts.COPY,
}


class TemplatesMissing(TraceInsightError):
    """The report templates are neither in the installed package nor in the source checkout."""


def templates_dir() -> Traversable:
    """Where the report templates are: inside the installed wheel, else ``<checkout>/templates``."""
    packaged = importlib.resources.files("traceinsight") / "templates"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if checkout.is_dir():
        return checkout
    raise TemplatesMissing(
        f"cannot find the report templates (looked in {packaged} and {checkout}); "
        "reinstall torch-traceinsight."
    )


@functools.cache
def _environment() -> jinja2.Environment:
    """The pages' jinja2 environment, made once per process: it keeps each template compiled."""
    root = templates_dir()

    def load(name: str) -> str:
        return (root / name).read_text(encoding="utf-8")

    environment = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    environment.filters.update(
        duration=format_duration,
        size=format_size,
        pct=format_share,
        count=lambda value: f"{value:,}",
        kernel_short=short_kernel_name,
    )
    return environment


def prepare() -> None:
    """Compile the report page's templates ahead of use (~80 ms): the pipeline calls this in a
    thread of its own while the trace loads."""
    _environment().get_template("report.html")


# --- view models -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class FindingView:
    """A finding with what the page adds: its rank, its share of GPU time, its code excerpt."""

    rank: int
    finding: Finding
    saving_share: float | None
    excerpt: SourceExcerpt | None
    #: The source as the page names it (:func:`~traceinsight.formatting.source_label`).
    source: str | None = None
    #: What the source line is, when it is not the call's, and how to get the call's.
    line_note: str | None = None


@dataclass(frozen=True, slots=True)
class CauseTotal:
    """Idle in reported gaps of one cause kind."""

    kind: str
    label: str
    color: str
    gaps: int
    idle_ns: int
    share: float | None


@dataclass(frozen=True, slots=True)
class SourceTotal:
    """Idle in reported gaps attributed to one source line (and cause)."""

    source: str
    kind: str
    label: str
    gaps: int
    idle_ns: int
    #: ``source`` as the page names it (:func:`~traceinsight.formatting.source_label`).
    shown: str = ""


@dataclass(frozen=True, slots=True)
class Chart:
    """An inline SVG with its caption."""

    svg: Markup
    caption: str


def _cause_totals(analysis: Analysis) -> list[CauseTotal]:
    by_kind: dict[str, list[IdleGap]] = defaultdict(list)
    for gap in analysis.idle_gaps:
        by_kind[gap.cause_kind].append(gap)
    idle = sum(device.idle_ns for device in analysis.devices)
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
            shown.setdefault(gap.source, line_label(gap) or gap.source)
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
    else:
        what = f"this trace's frames do not say whether {finding.source} is the call's line or where `{function}` begins"
    return (
        f"{what}, not the line of the call. To name the call's own line, profile with "
        f"traceinsight run (it records each call's line), or look in `{function}` for the call the title names."
    )


def _excerpt(finding: Finding, root: Path | None) -> SourceExcerpt | None:
    """The code excerpt of a card: around a call's line; from a function's first line on (its body
    holds the call); none for the line a running function was on when recording began (it is not
    where the finding happens)."""
    if finding.source is None or finding.minor or finding.source_line_kind == RECORDING_START:
        return None
    return source_excerpt(finding.source, root, from_line=finding.source_line_kind == DEF)


@dataclass(frozen=True, slots=True)
class _ChartSpec:
    """One chart to draw: ``build`` gives its figure (None when the trace has nothing to show)."""

    chart_id: str
    title: str
    caption: str
    build: Callable[[], Figure | None]

    def svg(self) -> str | None:
        figure = self.build()
        return None if figure is None else charts.to_svg(figure, self.chart_id, self.title)


def _render_charts(specs: Sequence[_ChartSpec]) -> dict[str, Chart | None]:
    """Every chart, as inline SVG.

    matplotlib holds the GIL, so threads would not help: where the OS can fork, a child process
    draws charts from the last one backwards while this one draws from the first onwards, until
    they meet (each says in shared memory which chart it takes next, so the split follows what the
    charts cost on this trace rather than a fixed half), and sends its SVG back over a pipe.
    The child only runs matplotlib on the report's plain values (never polars, whose threads do not
    survive a fork) and leaves with ``os._exit``. Any chart it did not deliver is drawn here, so
    the page is the same either way; a child that stops making progress is killed
    (:data:`CHART_CHILD_STALL_S`), so a fork that inherited a held lock costs time, never the page.
    """
    svgs: dict[str, str | None] = {}
    claims = _Claims(len(specs)) if len(specs) > 1 and _can_fork() else None
    child = _fork_charts(specs, claims) if claims is not None else None
    for index, spec in enumerate(specs):
        if child is not None and claims is not None and not claims.take_front(index):
            break
        svgs[spec.chart_id] = spec.svg()
    if child is not None and claims is not None:
        if len(svgs) < len(specs):
            delivered = _collect_charts(*child, claims)
            svgs.update((key, value) for key, value in delivered.items() if key not in svgs)
        else:  # every chart is drawn here already: the child has nothing to give
            _stop_chart_child(*child)
    for spec in specs:
        if spec.chart_id not in svgs:
            svgs[spec.chart_id] = spec.svg()
    return {
        spec.chart_id: None
        if svgs[spec.chart_id] is None
        else Chart(Markup(svgs[spec.chart_id]), spec.caption)
        for spec in specs
    }


class _Claims:
    """Which charts the parent (from the front) and the child (from the back) have taken, in
    memory the two share after the fork. Each writes its claim, then reads the other's; when both
    claim the same chart at once, either both draw it (the same SVG) or neither does and the
    parent draws it after the child is done, so a race costs time, never a chart."""

    def __init__(self, count: int) -> None:
        self._shared = mmap.mmap(-1, 16)
        struct.pack_into("qq", self._shared, 0, 0, count)

    def take_front(self, index: int) -> bool:
        struct.pack_into("q", self._shared, 0, index + 1)
        return index < int(struct.unpack_from("q", self._shared, 8)[0])

    def take_back(self, index: int) -> bool:
        struct.pack_into("q", self._shared, 8, index)
        return index >= int(struct.unpack_from("q", self._shared, 0)[0])

    def back(self) -> int:
        """The chart the child took last (the count of charts before it takes one)."""
        return int(struct.unpack_from("q", self._shared, 8)[0])


def _can_fork() -> bool:
    return hasattr(os, "fork") and second_core()


def _fork_charts(specs: Sequence[_ChartSpec], claims: _Claims) -> tuple[int, int] | None:
    """Start a child drawing ``specs`` from the last backwards while ``claims`` lets it; (pid, read
    end of its pipe), or None if it cannot start."""
    try:
        read, write = os.pipe()
        pid = os.fork()
    except OSError:
        return None
    if pid == 0:  # the child: draw, send, leave without running any of the parent's exit code
        status = 1
        try:
            os.close(read)
            drawn: dict[str, str | None] = {}
            for index in range(len(specs) - 1, -1, -1):
                if not claims.take_back(index):
                    break
                drawn[specs[index].chart_id] = specs[index].svg()
            payload = pickle.dumps(drawn)
            with os.fdopen(write, "wb") as stream:
                stream.write(payload)
            status = 0
        finally:
            os._exit(status)
    os.close(write)
    return pid, read


def _collect_charts(pid: int, read: int, claims: _Claims) -> dict[str, str | None]:
    """The child's charts; empty if it failed, or went :data:`CHART_CHILD_STALL_S` without taking a
    chart or sending a byte (it is killed then). The caller draws whatever is missing."""
    payload = bytearray()
    taken = claims.back()
    ended = False
    waiting = select.poll()  # (not select.select: no limit on the descriptor's number)
    waiting.register(read, select.POLLIN)
    try:
        while True:
            if waiting.poll(CHART_CHILD_STALL_S * 1000):  # data, or the end of the pipe
                chunk = os.read(read, 1 << 20)
                if not chunk:
                    ended = True
                    break
                payload += chunk
            elif claims.back() != taken:
                taken = claims.back()
            else:
                break  # stuck: no chart taken and no byte sent in all that time
    finally:
        status = _stop_chart_child(pid, read, kill=not ended)
    if status != 0 or not payload:
        return {}
    try:
        result: dict[str, str | None] = pickle.loads(payload)
    except Exception:
        return {}
    return result


def _stop_chart_child(pid: int, read: int, *, kill: bool = True) -> int:
    """Close our end of the child's pipe, kill the child unless it is done, reap it; its status."""
    os.close(read)
    if kill:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    return os.waitpid(pid, 0)[1]


class HtmlRenderer:
    """Renders a :class:`Report` to one self-contained HTML page.

    ``source_root`` is the directory the code excerpts may be read from (see
    :mod:`.excerpts`; None: no excerpts). ``timeline`` and ``kernels`` feed the timeline chart and the
    top-kernels table; when omitted they are taken from ``report.analysis`` if it carries them.
    """

    def __init__(
        self,
        source_root: Path | None = None,
        *,
        timeline: Timeline | None = None,
        kernels: TopKernels | None = None,
    ) -> None:
        self.source_root = source_root
        self.timeline = timeline
        self.kernels = kernels
        self._environment = _environment()

    def render(self, report: Report) -> str:
        """The whole page as one string (deterministic for the same report and source files)."""
        return self._environment.get_template("report.html").render(self.context(report))

    def context(self, report: Report) -> dict[str, object]:
        """Everything the template shows, computed once (no logic left for the template)."""
        analysis = report.analysis
        timeline = self.timeline if self.timeline is not None else _carried(analysis, "timeline", Timeline)
        kernels = self.kernels if self.kernels is not None else _carried(analysis, "kernels", TopKernels)
        findings = [
            FindingView(
                rank=index + 1,
                finding=finding,
                saving_share=finding.saving_share,
                excerpt=_excerpt(finding, self.source_root),
                source=line_label(finding),
                line_note=_line_note(finding),
            )
            for index, finding in enumerate(report.findings)
        ]
        cards = [view for view in findings if not view.finding.minor]
        source_totals = _source_totals(analysis.idle_gaps)
        gaps_ranked = sorted(analysis.idle_gaps, key=lambda g: (-g.duration_ns, g.device, g.start_ns))
        scores: tuple[Score, ...] = scorecard(report)
        drawn = _render_charts(
            [
                _ChartSpec(
                    "timeline",
                    "GPU activity over time",
                    "GPU activity over time. Blue: GPU busy (lighter where short gaps were merged to "
                    "fit the page); a dark strip below it: communication kernels. Shaded: idle gaps of at least "
                    f"{analysis.thresholds.min_gap_us:g} µs, coloured by what the host was doing. "
                    "Triangles: host calls that waited for the GPU.",
                    lambda: charts.timeline_figure(timeline, analysis.idle_gaps) if timeline else None,
                ),
                _ChartSpec(
                    "steps",
                    "Each profiled step: GPU busy and idle by cause",
                    "Each profiled step window: GPU busy (compute, communication, copies) and idle time by "
                    "cause; steps left out of the steady state are marked.",
                    lambda: charts.step_breakdown_figure(analysis.steps),
                ),
                _ChartSpec(
                    "gaps",
                    "The longest GPU idle gaps and their causes",
                    "The longest idle gaps, coloured by cause, with the host activity and source line "
                    "that explain them.",
                    lambda: charts.idle_gaps_figure(analysis.idle_gaps, analysis.meta.origin_ns),
                ),
                _ChartSpec(
                    "syncs",
                    "Host sync hot spots by blocked time",
                    "Where the host waited for the GPU: time blocked in the call, then GPU idle until "
                    "the host queued new work.",
                    lambda: charts.sync_hotspots_figure(analysis.sync_hotspots),
                ),
                _ChartSpec(
                    "copies",
                    "Copy time by direction and memory kind",
                    "Copy time by direction and memory kind: overlapped with kernels on the same GPU, "
                    "or exposed (no kernel ran meanwhile).",
                    lambda: charts.copies_figure(analysis.copies),
                ),
                _ChartSpec(
                    "memory",
                    "Memory over time",
                    "Memory over time from the allocator's records: allocated by tensors (solid), "
                    "reserved by the caching allocator (dashed), the device's total memory (dotted). "
                    "Each point is the largest value of its time slice, so peaks are kept.",
                    lambda: charts.memory_figure(analysis.memory.devices),
                ),
                _ChartSpec(
                    "host",
                    "Busiest host operators",
                    "The busiest host operators by total time (inclusive of the operators they call).",
                    lambda: charts.host_ops_figure(analysis.host),
                ),
            ]
        )
        overview = [chart for chart in (drawn["timeline"], drawn["steps"]) if chart is not None]
        return {
            "version": traceinsight.__version__,
            "trace_name": report.trace_name,
            "page_title": (
                f"{report.run.script} · {report.run.started[:16].replace('T', ' ')} · traceinsight"
                if report.run
                else f"{report.trace_name} · traceinsight"
            ),
            "heading": report.run.command if report.run else report.trace_name,
            "facts": header_facts(report),
            "run": report.run,
            "warnings": analysis.warnings,
            "time_splits": [(usage, time_split(usage)) for usage in analysis.usage if usage.window_ns],
            "busy_color": _BUSY_COLORS,
            "minor": [view for view in findings if view.finding.minor],
            "saving_text": saving_text,
            "line_label": line_label,
            "no_findings": no_findings_text(report),
            "analysis": analysis,
            "has_gpu": analysis.has_gpu,
            "foreign_accelerator": analysis.meta.foreign_accelerator,
            "origin_ns": analysis.meta.origin_ns,
            "scores": scores,
            "overview": overview,
            "timeline_missing": analysis.has_gpu and timeline is None,
            "findings": cards,
            "cause_totals": _cause_totals(analysis),
            "source_totals": source_totals[:TOP_SOURCES],
            "source_total_count": len(source_totals),
            "gaps": gaps_ranked[:TOP_GAPS],
            "gap_count": len(gaps_ranked),
            "gaps_idle_ns": sum(gap.duration_ns for gap in gaps_ranked),
            "gaps_chart": drawn["gaps"],
            "cause_label": charts.cause_label,
            "cause_color": charts.cause_color,
            "hotspots": analysis.sync_hotspots[:TOP_HOTSPOTS],
            "hotspot_count": len(analysis.sync_hotspots),
            "syncs_chart": drawn["syncs"],
            "copies": analysis.copies[:TOP_COPIES],
            "copy_count": len(analysis.copies),
            "copies_chart": drawn["copies"],
            "kernels": kernels,
            "kernel_rows": kernels.kernels[:TOP_KERNELS] if kernels is not None else (),
            "kernel_totals": dict(kernels.total_ns_by_device) if kernels else {},
            "host_chart": drawn["host"],
            "memory_chart": drawn["memory"],
            "memory_columns": MEMORY_COLUMNS,
            "memory_rows": memory_rows(report),
            "allocator_fact": allocator_fact(report),
            "host_ops": list(zip(analysis.host.top_ops, analysis.host.top_ops_self, strict=True)),
            "limits": {
                "gaps": TOP_GAPS,
                "sources": TOP_SOURCES,
                "hotspots": TOP_HOTSPOTS,
                "copies": TOP_COPIES,
                "kernels": TOP_KERNELS,
            },
        }


def _carried(analysis: Analysis, field: str, kind: type[_Carried]) -> _Carried | None:
    """``analysis.<field>`` when this version of :class:`Analysis` carries it."""
    value = getattr(analysis, field, None)
    return value if isinstance(value, kind) else None
