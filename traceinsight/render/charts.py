"""Charts for the HTML report, written as inline SVG (:mod:`.svg`): no plotting library.

Every chart is deterministic (the same values give the same bytes) and bounded in size whatever
the trace: timelines are downsampled (:mod:`traceinsight.analysis.timeline`), bar charts show the
top N only. Text and axes are drawn in ``currentColor``, so a chart follows the page's text
colour in light mode, dark mode and print; the data colours are mid-tones (Okabe-Ito) readable on
both backgrounds. Each function returns a :class:`~.svg.Canvas` (None when the trace has nothing
to show); the page turns it into an ``<svg>`` element with its id and accessible name.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Sequence
from typing import Final

from traceinsight.formatting import format_duration, format_size
from traceinsight.model import Model
from traceinsight.render.svg import (
    FOREGROUND,
    SMALL_SIZE,
    WIDTH,
    Axis,
    Canvas,
    LegendItem,
    legend_height,
    text_width,
)
from traceinsight.results import vocabulary
from traceinsight.results.trace import CopyGroup, Host, IdleGap, MemoryDevice, Step, SyncHotspot, Timeline
from traceinsight.results.vocabulary import CauseKind, cause_label

__all__ = [
    "CAUSE_COLORS",
    "CAUSE_ORDER",
    "before_after_chart",
    "cause_color",
    "cause_label",
    "copies_chart",
    "host_ops_chart",
    "idle_gaps_chart",
    "memory_chart",
    "ordered_causes",
    "step_breakdown_chart",
    "sync_hotspots_chart",
    "timeline_chart",
]

BUSY: Final[str] = "#0072B2"
COPY: Final[str] = "#56B4E9"
#: A diff's per-step dots: the before side's and the after side's (Okabe-Ito grey and blue).
BEFORE_DOT: Final[str] = "#999999"
AFTER_DOT: Final[str] = "#0072B2"
SYNC_MARK: Final[str] = "#D55E00"
EXPOSED: Final[str] = "#E69F00"

#: A colour per idle cause (``CauseKind`` values); a cause this version does not know is grey.
CAUSE_COLORS: Final[dict[str, str]] = {
    CauseKind.DATALOADER.value: "#E69F00",
    CauseKind.SYNC.value: "#D55E00",
    CauseKind.COPY.value: "#F0A0A0",
    CauseKind.COMMUNICATION.value: "#882255",
    CauseKind.OTHER_GPU.value: "#AA4499",
    CauseKind.HOST_OP.value: "#CC79A7",
    CauseKind.ALLOCATOR.value: "#8C6BB1",
    CauseKind.LAUNCH.value: "#009E73",
    CauseKind.QUEUED.value: "#44AA99",
    CauseKind.UNTRACED.value: "#999933",
    CauseKind.UNKNOWN.value: "#7F7F7F",
    CauseKind.CAPTURE.value: "#B0C4DE",
    CauseKind.WAITING.value: "#D8D8D8",
    CauseKind.OUTSIDE_STEADY.value: "#C8C8C8",
    CauseKind.BEFORE_FIRST.value: "#E4E4E4",
    CauseKind.AFTER_LAST.value: "#E4E4E4",
}
#: Causes in the order every chart and table lists them.
CAUSE_ORDER: Final[tuple[str, ...]] = tuple(kind.value for kind in vocabulary.CAUSE_ORDER)
COMMUNICATION: Final[str] = "#332288"


def cause_color(kind: str) -> str:
    """The colour of an idle cause kind (grey for kinds this version does not know)."""
    return CAUSE_COLORS.get(kind, CAUSE_COLORS[CauseKind.UNKNOWN.value])


def ordered_causes(kinds: Iterable[str]) -> list[str]:
    """The distinct ``kinds`` in :data:`CAUSE_ORDER`, unknown kinds after them by name."""
    present = set(kinds)
    return [kind for kind in CAUSE_ORDER if kind in present] + sorted(present - set(CAUSE_ORDER))


def _text(value: str, limit: int = 60) -> str:
    """Long trace names shortened for a chart label (the tables show them in full)."""
    return value if len(value) <= limit else value[: limit - 1] + "…"


def _unit(largest_ns: float) -> tuple[float, str]:
    """The axis unit for values up to ``largest_ns``: (ns per unit, unit name)."""
    if largest_ns >= 10e9:
        return 1e9, "s"
    if largest_ns >= 100e3:
        return 1e6, "ms"
    return 1e3, "µs"


def _plural(count: int, one: str, many: str) -> str:
    return f"{count:,} {one if count == 1 else many}"


# --- horizontal bars ---------------------------------------------------------------------------

_IDLE_OPACITY: Final[float] = 0.5
_ROW: Final[float] = 21.6  # points per bar (0.3 inch)
_MARGIN: Final[float] = 10.0


class _Segment(Model, frozen=True):
    value: float  # in the axis unit
    color: str
    opacity: float = 1.0


class _Bar(Model, frozen=True):
    label: tuple[str, ...]  # one line or more, right-aligned left of the bar
    segments: tuple[_Segment, ...]
    note: str = ""  # written just right of the bar's end

    @property
    def total(self) -> float:
        return sum(segment.value for segment in self.segments)


def _bar_chart(
    bars: Sequence[_Bar], x_label: str, legend: Sequence[LegendItem] = (), columns: int = 3
) -> Canvas:
    """Stacked horizontal bars, first at the top, with their notes, an x axis from 0 and a legend.

    The scale is the largest that leaves every bar's note inside the chart (notes never overlap
    the edge), but never so small that the longest bar takes less than a third of the plot.
    """
    lines = max(len(bar.label) for bar in bars)
    row = _ROW * (1 + 0.55 * (lines - 1))
    label_width = max(text_width(line) for bar in bars for line in bar.label)
    left = min(_MARGIN + label_width + 8, WIDTH * 0.5)
    right = WIDTH - _MARGIN
    plot = right - left
    top = 8.0
    bottom = top + row * len(bars)
    longest = max((bar.total for bar in bars), default=0.0) or 1.0
    scale = plot / longest
    for bar in bars:
        if bar.total > 0 and bar.note:
            room = plot - 6 - text_width(bar.note, SMALL_SIZE)
            scale = min(scale, max(room, plot / 3) / bar.total)
    axis = Axis(0.0, plot / scale, left, right)
    legend_top = bottom + 34
    canvas = Canvas(legend_top + legend_height(legend, columns) + 4)
    canvas.x_axis(axis, top, bottom, x_label)
    height = row * 0.68
    for index, bar in enumerate(bars):
        middle = top + row * (index + 0.5)
        x = left
        for segment in bar.segments:
            width = segment.value * scale
            canvas.rect(x, middle - height / 2, width, height, segment.color, segment.opacity)
            x += max(width, 0.0)
        if bar.note:
            canvas.text(x + 4, middle + 2.7, bar.note, size=SMALL_SIZE)
        first = middle + 3.2 - (len(bar.label) - 1) * 5.5
        for number, line in enumerate(bar.label):
            canvas.text(left - 6, first + number * 11, line, anchor="end")
    canvas.line(left, top, left, bottom)
    canvas.legend(legend, legend_top, columns)
    return canvas


def step_breakdown_chart(steps: Sequence[Step], limit: int = 40) -> Canvas | None:
    """Each profiled step's device window as one bar of its time summed by category: the time
    before the step's first GPU work first, then GPU busy (compute, communication, copies), then
    idle by cause, then the time after its last GPU work; so a bar adds up to the window exactly.
    Steps left out of the steady state are marked. None without steps; at most ``limit`` bars."""
    if not steps:
        return None
    shown = list(steps)[:limit]
    multi_device = len({step.device for step in shown}) > 1
    per_unit, unit = _unit(max(step.span_ns for step in shown))
    edges = (CauseKind.BEFORE_FIRST.value, CauseKind.AFTER_LAST.value)
    middle_causes = [
        kind for kind in ordered_causes(k for s in shown for k in s.idle_by_cause_ns) if kind not in edges
    ]
    parts: list[tuple[str, str, float, list[float]]] = [
        (
            f"idle: {cause_label(CauseKind.BEFORE_FIRST.value)}",
            cause_color(CauseKind.BEFORE_FIRST.value),
            1.0,
            [s.idle_by_cause_ns.get(CauseKind.BEFORE_FIRST.value, 0) / per_unit for s in shown],
        ),
        ("GPU busy: compute", BUSY, 1.0, [s.compute_ns / per_unit for s in shown]),
        ("GPU busy: communication", COMMUNICATION, 1.0, [s.communication_ns / per_unit for s in shown]),
        ("GPU busy: copies", COPY, 1.0, [s.copy_exposed_ns / per_unit for s in shown]),
        *(
            (
                f"idle: {cause_label(kind)}",
                cause_color(kind),
                0.8,
                [s.idle_by_cause_ns.get(kind, 0) / per_unit for s in shown],
            )
            for kind in middle_causes
        ),
        (  # the same grey as before the first work: lighter, so the legend tells them apart
            f"idle: {cause_label(CauseKind.AFTER_LAST.value)}",
            cause_color(CauseKind.AFTER_LAST.value),
            0.5,
            [s.idle_by_cause_ns.get(CauseKind.AFTER_LAST.value, 0) / per_unit for s in shown],
        ),
    ]
    drawn = [part for part in parts if any(part[3])]
    bars = [
        _Bar(
            label=(
                f"step {step.step}"
                + (f" · GPU {step.device}" if multi_device else "")
                + ("" if step.steady else " (not steady)"),
            ),
            segments=tuple(_Segment(values[index], color, alpha) for _, color, alpha, values in drawn),
        )
        for index, step in enumerate(shown)
    ]
    legend = [LegendItem(label, color, opacity=alpha) for label, color, alpha, _ in drawn]
    return _bar_chart(bars, f"{unit} of the step window, summed by category", legend, columns=3)


def idle_gaps_chart(gaps: Sequence[IdleGap], top: int = 15) -> Canvas | None:
    """The ``top`` longest idle gaps as bars coloured by cause, labelled with when they started."""
    if not gaps:
        return None
    shown = heapq.nsmallest(top, gaps, key=lambda g: (-g.duration_ns, g.device, g.start_ns))  # sorted()[:top]
    multi_device = len({gap.device for gap in gaps}) > 1
    per_unit, unit = _unit(shown[0].duration_ns)
    bars = [
        _Bar(
            label=(
                f"#{index + 1} at {format_duration(gap.start_ns)}"
                + (f" · GPU {gap.device}" if multi_device else ""),
            ),
            segments=(_Segment(gap.duration_ns / per_unit, cause_color(gap.cause_kind)),),
            note=_text(
                f"{format_duration(gap.duration_ns)} · {gap.cause}"
                + (f" · {gap.source}" if gap.source else ""),
                90,
            ),
        )
        for index, gap in enumerate(shown)
    ]
    kinds = ordered_causes(gap.cause_kind for gap in shown)
    legend = [LegendItem(cause_label(kind), cause_color(kind)) for kind in kinds]
    return _bar_chart(bars, f"idle gap length ({unit})", legend, columns=min(5, len(kinds)))


def sync_hotspots_chart(hotspots: Sequence[SyncHotspot], steady_steps: int, top: int = 10) -> Canvas | None:
    """Host waits in the steady state, per steady step when there are steps: host time blocked in
    the calls, then the GPU idle they caused, stacked, largest first. Waits with no call in the
    steady state (the sync that ends a profile) are left out: they cost nothing per step. None
    when no wait is in the steady state."""
    steady = [hotspot for hotspot in hotspots if hotspot.steady_count > 0]
    if not steady:
        return None
    per = steady_steps if steady_steps > 0 else 1
    shown = sorted(steady, key=lambda h: -(h.steady_blocked_ns + h.idle_caused_ns))[:top]
    per_unit, unit = _unit(max(h.steady_blocked_ns + h.idle_caused_ns for h in shown) / per)

    def label(hotspot: SyncHotspot) -> tuple[str, str]:
        op = f" in {hotspot.op}" if hotspot.op else ""
        return _text(hotspot.call_text + op, 48), _text(hotspot.source or "source not recorded", 48)

    def note(hotspot: SyncHotspot) -> str:
        if steady_steps > 0:
            return f"{hotspot.steady_count / steady_steps:.3g} call{'s' if hotspot.steady_count != steady_steps else ''} per step"
        return _plural(hotspot.steady_count, "call", "calls")

    bars = [
        _Bar(
            label=label(hotspot),
            segments=(
                _Segment(hotspot.steady_blocked_ns / per / per_unit, SYNC_MARK),
                _Segment(hotspot.idle_caused_ns / per / per_unit, cause_color("sync"), _IDLE_OPACITY),
            ),
            note=note(hotspot),
        )
        for hotspot in shown
    ]
    legend = [
        LegendItem("host blocked in the call", SYNC_MARK),
        LegendItem("GPU idle it caused", cause_color("sync"), opacity=_IDLE_OPACITY),
    ]
    where = "per steady step" if steady_steps > 0 else "in the steady state"
    return _bar_chart(bars, f"{unit} {where}", legend, columns=2)


def copies_chart(copies: Sequence[CopyGroup], top: int = 10) -> Canvas | None:
    """Copy time per kind (direction, memory kinds, device): overlapped with kernels vs exposed."""
    shown = list(copies)[:top]
    if not shown:
        return None
    multi_device = len({group.device for group in copies}) > 1
    per_unit, unit = _unit(max(group.duration_ns for group in shown))
    bars = [
        _Bar(
            label=(
                f"{g.direction} {g.src or '?'} → {g.dst or '?'}"
                + (f" · GPU {g.device}" if multi_device else ""),
            ),
            segments=(
                _Segment(g.overlapped_ns / per_unit, BUSY),
                _Segment(max(g.duration_ns - g.overlapped_ns, 0) / per_unit, EXPOSED),
            ),
            note=f"{format_size(g.bytes)} in {_plural(g.count, 'copy', 'copies')}",
        )
        for g in shown
    ]
    legend = [LegendItem("ran while kernels ran", BUSY), LegendItem("ran while no kernel ran", EXPOSED)]
    return _bar_chart(bars, f"copy time ({unit})", legend, columns=2)


def host_ops_chart(host: Host) -> Canvas | None:
    """The busiest host operators by self time (their own time, without the operators they call),
    in the order of the table below; the rest of their total time (inside the operators they call)
    drawn lighter after it."""
    if not host.top_ops:
        return None
    per_unit, unit = _unit(max(max(op.total_ns, op.self_ns) for op in host.top_ops))
    bars = [
        _Bar(
            label=(_text(op.name, 60),),
            segments=(
                _Segment(op.self_ns / per_unit, BUSY),
                _Segment(max(op.total_ns - op.self_ns, 0) / per_unit, BUSY, 0.35),
            ),
            note=f"self {format_duration(op.self_ns)} of {format_duration(op.total_ns)} in "
            f"{_plural(op.count, 'call', 'calls')}",
        )
        for op in host.top_ops
    ]
    legend = [
        LegendItem("self time", BUSY),
        LegendItem("inside the operators it calls", BUSY, opacity=0.35),
    ]
    return _bar_chart(bars, f"host time ({unit})", legend, columns=2)


def before_after_chart(
    bars: Sequence[tuple[str, Sequence[tuple[str, str, float]]]], unit_ns: float, unit: str
) -> Canvas | None:
    """One stacked horizontal bar per side (``before``, ``after``): (label, color, ns) segments,
    so a diff shows where the step time went before and after. None when every bar is empty."""
    if not any(value for _, segments in bars for _, _, value in segments):
        return None
    order: list[str] = []
    colors: dict[str, str] = {}
    for _, segments in bars:
        for label, color, _ in segments:
            if label not in colors:
                order.append(label)
                colors[label] = color
    drawn = [
        label for label in order if any(v for _, segments in bars for name, _, v in segments if name == label)
    ]
    rows = [
        _Bar(
            label=(side,),
            segments=tuple(
                _Segment(sum(v for name, _, v in segments if name == label) / unit_ns, colors[label])
                for label in drawn
            ),
        )
        for side, segments in bars
    ]
    return _bar_chart(rows, unit, [LegendItem(label, colors[label]) for label in drawn], columns=3)


# --- time axes ---------------------------------------------------------------------------------

#: Step boundaries are drawn up to this many steps (and labelled up to 30).
_MAX_STEP_LINES: Final[int] = 100

#: Busy blocks are shaded by the share of the block that was really busy: a block stands for a
#: stretch where gaps shorter than the timeline's resolution were merged (too short to draw).
_BUSY_LEVELS: Final[tuple[tuple[float, float, str], ...]] = (
    (0.9, 1.0, "GPU busy"),
    (0.5, 0.65, "busy, with gaps too short to draw (10-50 % of the stretch idle)"),
    (0.0, 0.35, "busy, with gaps too short to draw (over half of the stretch idle)"),
)


def _busy_level(share: float) -> int:
    """Index into :data:`_BUSY_LEVELS` for a block's busy share (the lowest for a share no block of
    an analysis has: below 0, from a stored result's edited timeline)."""
    return next(
        (index for index, (low, _, _) in enumerate(_BUSY_LEVELS) if share >= low), len(_BUSY_LEVELS) - 1
    )


def timeline_chart(timeline: Timeline, gaps: Sequence[IdleGap], step_labels: bool = True) -> Canvas | None:
    """GPU activity per device over time: busy blocks, idle gaps shaded by cause, host syncs, and
    each step's start on the GPU's clock (its device window).

    None when the trace has no GPU activity. Gaps narrower than the timeline's resolution are not
    drawn (they could not be seen); x counts from the trace's first event.
    """
    if not timeline.devices:
        return None
    resolution = timeline.resolution_ns
    per_unit, unit = _unit(timeline.end_ns)
    left = _MARGIN + max(text_width(f"GPU {d.device}") for d in timeline.devices) + 8
    right = WIDTH - _MARGIN
    labelled = step_labels and 0 < len(timeline.steps) <= 30
    lines = 0 < len(timeline.steps) <= _MAX_STEP_LINES
    top = 16.0 if labelled else 6.0
    row = 57.6
    bottom = top + row * len(timeline.devices)
    axis = Axis(timeline.start_ns / per_unit, timeline.end_ns / per_unit, left, right)

    def x(ns: float) -> float:
        return axis(ns / per_unit)

    levels_drawn: set[int] = set()
    causes_drawn: set[str] = set()
    any_sync = any_communication = False
    legend: list[LegendItem] = []
    # First pass: which legend entries there are (the legend's height sets the canvas's).
    for device in timeline.devices:
        levels_drawn.update(_busy_level(block.busy_share) for block in device.blocks)
        any_communication = any_communication or bool(device.communication)
        any_sync = any_sync or any(
            timeline.start_ns <= mark.end_ns and mark.start_ns <= timeline.end_ns for mark in device.syncs
        )
        causes_drawn.update(
            gap.cause_kind for gap in gaps if gap.device == device.device and gap.duration_ns >= resolution
        )
    legend += [
        LegendItem(label, BUSY, opacity=alpha)
        for level, (_, alpha, label) in enumerate(_BUSY_LEVELS)
        if level in levels_drawn
    ]
    legend += [
        LegendItem(f"idle: {cause_label(c)}", cause_color(c), opacity=_IDLE_OPACITY)
        for c in ordered_causes(causes_drawn)
    ]
    if any_communication:
        legend.append(LegendItem("communication kernels (strip below)", COMMUNICATION))
    if any_sync:
        legend.append(LegendItem("host sync call", SYNC_MARK, shape="triangle"))
    if lines:
        legend.append(LegendItem("step start on the GPU", FOREGROUND, shape="dashed", opacity=0.45))
    legend_top = bottom + 34
    canvas = Canvas(legend_top + legend_height(legend, 2) + 4)
    canvas.x_axis(axis, top, bottom, f"time since the first event of the trace ({unit})")

    for index, device in enumerate(timeline.devices):
        row_top = top + row * index

        def y(fraction: float, row_top: float = row_top) -> float:
            return row_top + row * (1 - fraction / 1.05)

        by_level: dict[int, list[tuple[float, float]]] = {}
        for block in device.blocks:
            # At least two resolutions wide (about a pixel): a lone short kernel stays visible.
            end = max(block.end_ns, block.start_ns + 2 * resolution)
            by_level.setdefault(_busy_level(block.busy_share), []).append((x(block.start_ns), x(end)))
        for level, spans in sorted(by_level.items()):
            canvas.spans(spans, y(0.85), y(0.15) - y(0.85), BUSY, _BUSY_LEVELS[level][1])
        if device.communication:
            spans = [
                (x(b.start_ns), x(max(b.end_ns, b.start_ns + 2 * resolution))) for b in device.communication
            ]
            canvas.spans(spans, y(0.13), y(0.02) - y(0.13), COMMUNICATION)
        by_cause: dict[str, list[tuple[float, float]]] = {}
        for gap in gaps:
            if gap.device == device.device and gap.duration_ns >= resolution:
                by_cause.setdefault(gap.cause_kind, []).append((x(gap.start_ns), x(gap.end_ns)))
        for cause in ordered_causes(by_cause):
            canvas.spans(by_cause[cause], y(0.85), y(0.15) - y(0.85), cause_color(cause), _IDLE_OPACITY)
        # Only calls inside the drawn window: a sync long before the first kernel is not drawn.
        marks = [
            x((mark.start_ns + mark.end_ns) / 2)
            for mark in device.syncs
            if timeline.start_ns <= mark.end_ns and mark.start_ns <= timeline.end_ns
        ]
        canvas.triangles(marks, y(1.04), 5.0, SYNC_MARK)
        canvas.text(left - 6, y(0.5) + 3.2, f"GPU {device.device}", anchor="end")
    if lines:
        for step in timeline.steps:
            canvas.line(
                x(step.start_ns), top, x(step.start_ns), bottom, dash="3.5 2", width=0.7, opacity=0.45
            )
    if labelled:
        for step in timeline.steps:
            canvas.text(x(step.start_ns) + 2, top - 4, f"step {step.step}", size=SMALL_SIZE, opacity=0.8)
    canvas.legend(legend, legend_top, 2)
    return canvas


#: Line colours of the memory chart, one per device in turn.
_MEMORY_COLORS: Final[tuple[str, ...]] = (BUSY, "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")


def _size_unit(largest: float) -> tuple[float, str]:
    """The axis unit for sizes up to ``largest`` bytes: (bytes per unit, unit name)."""
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if largest >= scale:
            return float(scale), unit
    return 1.0, "B"


def memory_chart(devices: Sequence[MemoryDevice]) -> Canvas | None:
    """Memory over time per device: allocated (solid), reserved by the caching allocator (dashed)
    and the device's total (dotted), from the bounded series of the analysis. None when the trace
    holds no ``[memory]`` records."""
    drawn = [device for device in devices if device.series]
    if not drawn:
        return None
    largest = max(max(device.peak_bytes, device.total_memory_bytes or 0) for device in drawn)
    per_byte, size_unit = _size_unit(float(largest))
    first = min(min(sample.at_ns for sample in device.series) for device in drawn)
    last = max(max(sample.at_ns for sample in device.series) for device in drawn)
    per_unit, unit = _unit(last)
    legend: list[LegendItem] = []
    for index, device in enumerate(drawn):
        color = _MEMORY_COLORS[index % len(_MEMORY_COLORS)]
        bound = " (at least)" if device.allocated_is_lower_bound else ""
        legend.append(LegendItem(f"{device.device} allocated{bound}", color, shape="line"))
        if device.peak_reserved_bytes:  # the CPU allocator records 0 reserved: not drawn
            legend.append(LegendItem(f"{device.device} reserved", color, shape="dashed"))
        if device.total_memory_bytes:
            legend.append(
                LegendItem(
                    f"{device.device} total ({format_size(device.total_memory_bytes)})", color, shape="dotted"
                )
            )
    top, bottom = 20.0, 200.0
    left = _MARGIN + text_width("0000.0") + 10
    right = WIDTH - _MARGIN
    legend_top = bottom + 34
    canvas = Canvas(legend_top + legend_height(legend, 3) + 4)
    x_axis = Axis(first / per_unit, max(last, first + 1) / per_unit, left, right)
    y_axis = Axis(0.0, largest / per_byte * 1.05, bottom, top)
    canvas.x_axis(x_axis, top, bottom, f"time from the trace's first event ({unit})")
    canvas.y_axis(y_axis, left, right, size_unit)

    def steps_post(device: MemoryDevice, values: Sequence[float]) -> list[tuple[float, float]]:
        """The series drawn as steps: each value holds until the next point's time."""
        points: list[tuple[float, float]] = []
        for position, (sample, value) in enumerate(zip(device.series, values, strict=True)):
            x = x_axis(sample.at_ns / per_unit)
            if position:
                points.append((x, points[-1][1]))
            points.append((x, y_axis(value / per_byte)))
        return points

    for index, device in enumerate(drawn):
        color = _MEMORY_COLORS[index % len(_MEMORY_COLORS)]
        canvas.polyline(steps_post(device, [s.allocated_bytes or 0 for s in device.series]), color)
        if device.peak_reserved_bytes:
            canvas.polyline(
                steps_post(device, [s.reserved_bytes or 0 for s in device.series]), color, dash="5 2.5"
            )
        if device.total_memory_bytes:
            level = y_axis(device.total_memory_bytes / per_byte)
            canvas.line(left, level, right, level, color, 1.5, "1.5 2.5")
    canvas.legend(legend, legend_top, 3)
    return canvas
