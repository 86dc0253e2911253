"""Charts for the HTML report: matplotlib ``Figure`` objects (never pyplot) rendered to inline SVG.

Every chart is deterministic (fixed SVG hash salt, no date metadata) and bounded in size whatever
the trace: timelines are downsampled (:mod:`traceinsight.analysis.timeline`), bar charts show the top
N only. Text and axes are drawn in a sentinel colour that :func:`to_svg` turns into
``currentColor``, so the inline SVG follows the page's text colour in light mode, dark mode and
print; the data colours are mid-tones (Okabe-Ito) readable on both backgrounds.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, Final

import matplotlib
import numpy as np
from markupsafe import escape
from matplotlib.axes import Axes
from matplotlib.backends.backend_svg import FigureCanvasSVG
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, PathPatch
from matplotlib.path import Path as MplPath

from traceinsight.analysis import causes
from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.memory import DeviceMemory
from traceinsight.analysis.results import CopyGroup, HostSummary, IdleGap, StepTime, SyncHotspot
from traceinsight.analysis.timeline import Timeline
from traceinsight.formatting import format_duration, format_size

if TYPE_CHECKING:
    from matplotlib.typing import RcKeyType

__all__ = [
    "CAUSE_COLORS",
    "CAUSE_ORDER",
    "before_after_figure",
    "cause_color",
    "cause_label",
    "chart_style",
    "copies_figure",
    "host_ops_figure",
    "idle_gaps_figure",
    "memory_figure",
    "ordered_causes",
    "step_breakdown_figure",
    "sync_hotspots_figure",
    "timeline_figure",
    "to_svg",
]

#: Drawn for text, axes and ticks; :func:`to_svg` replaces it with ``currentColor``.
FOREGROUND: Final[str] = "#010203"
BUSY: Final[str] = "#0072B2"
COPY: Final[str] = "#56B4E9"
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
    CauseKind.LAUNCH.value: "#009E73",
    CauseKind.QUEUED.value: "#44AA99",
    CauseKind.UNTRACED.value: "#999933",
    CauseKind.UNKNOWN.value: "#7F7F7F",
    CauseKind.CAPTURE.value: "#B0C4DE",
    CauseKind.OUTSIDE_STEADY.value: "#C8C8C8",
    CauseKind.BEFORE_FIRST.value: "#E4E4E4",
    CauseKind.AFTER_LAST.value: "#E4E4E4",
}
#: Causes in the order every chart and table lists them.
CAUSE_ORDER: Final[tuple[str, ...]] = tuple(kind.value for kind in causes.CAUSE_ORDER)
COMMUNICATION: Final[str] = "#332288"


def cause_color(kind: str) -> str:
    """The colour of an idle cause kind (grey for kinds this version does not know)."""
    return CAUSE_COLORS.get(kind, CAUSE_COLORS[CauseKind.UNKNOWN.value])


def cause_label(kind: str) -> str:
    """Plain words for an idle cause kind (the kind itself when this version does not know it)."""
    return causes.cause_label(kind)


def ordered_causes(kinds: Iterable[str]) -> list[str]:
    """The distinct ``kinds`` in :data:`CAUSE_ORDER`, unknown kinds after them by name."""
    present = set(kinds)
    return [kind for kind in CAUSE_ORDER if kind in present] + sorted(present - set(CAUSE_ORDER))


_STYLE: Final[dict[RcKeyType, Any]] = {
    "svg.hashsalt": "traceinsight",
    "svg.fonttype": "path",  # glyphs as paths: the page looks the same without the fonts installed
    "font.family": "DejaVu Sans",
    "font.size": 9.0,
    "text.parse_math": False,  # trace names may hold "$": never mathtext
    "text.color": FOREGROUND,
    "axes.labelcolor": FOREGROUND,
    "axes.edgecolor": FOREGROUND,
    "axes.facecolor": "none",
    "axes.titlesize": 10.0,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "xtick.color": FOREGROUND,
    "ytick.color": FOREGROUND,
    "grid.color": FOREGROUND,
    "grid.alpha": 0.18,
    "grid.linewidth": 0.6,
    "figure.facecolor": "none",
    "figure.edgecolor": "none",
    "savefig.facecolor": "none",
    "savefig.edgecolor": "none",
    "legend.frameon": False,
    "legend.fontsize": 8.5,
    "path.simplify": True,
}
_WIDTH_IN: Final[float] = 10.0
_ID = re.compile(r'\sid="([^"]+)"')
_REFERENCE = re.compile(r'(?:url\(#|href="#)([^)"]+)')


@contextmanager
def chart_style() -> Iterator[None]:
    """The report's matplotlib settings (colours, fonts, SVG hash salt), for building and saving."""
    with matplotlib.rc_context(_STYLE):
        yield


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


def _lay_out(figure: Figure) -> None:
    """Run ``figure``'s layout engine, then take the engine off, so that saving draws it once.

    With a layout engine, ``savefig`` draws the whole figure twice: once with output turned off,
    only so that the engine runs, then for real (with the engine off). That first draw is 10-20 %
    of a chart's cost. The engine needs only the extents of the texts, which it measures with an
    SVG renderer, as in that first draw: the SVG is the same byte for byte
    (tests/test_html_report.py holds the charts of three shapes to matplotlib's own way). A figure
    with no engine is left as it is.
    """
    engine = figure.get_layout_engine()
    if engine is None:
        return
    dpi = figure.dpi
    try:
        engine.execute(figure)  # measures the texts with an SVG renderer, which sets 72 dpi
    finally:
        figure.dpi = dpi
    figure.set_layout_engine(None)


def to_svg(figure: Figure, chart_id: str, title: str) -> str:
    """Render ``figure`` to an SVG element for inlining in HTML.

    The XML prolog, comments and metadata are dropped; element ids are kept only where referenced
    (glyphs, clip paths, markers) and prefixed with ``chart_id`` so several charts share a page;
    the sentinel foreground becomes ``currentColor``; ``title`` is the accessible name.
    """
    FigureCanvasSVG(figure)
    buffer = io.StringIO()
    with chart_style():
        _lay_out(figure)
        figure.savefig(buffer, format="svg", metadata={"Date": None})
    svg = buffer.getvalue()
    svg = svg[svg.index("<svg") :]
    svg = re.sub(r"<!--.*?-->", "", svg, flags=re.DOTALL)
    svg = re.sub(r"\s*<metadata>.*?</metadata>", "", svg, flags=re.DOTALL)
    referenced = set(_REFERENCE.findall(svg))
    svg = _ID.sub(lambda m: f' id="{chart_id}-{m[1]}"' if m[1] in referenced else "", svg)
    svg = _REFERENCE.sub(lambda m: f"{m[0][: -len(m[1])]}{chart_id}-{m[1]}", svg)
    svg = svg.replace(FOREGROUND, "currentColor")
    svg = re.sub(r"\n\s*", "\n", svg)
    opening = svg.index(">") + 1
    head = svg[: opening - 1] + f' role="img" aria-labelledby="{chart_id}-title" class="chart-svg">'
    return f'{head}<title id="{chart_id}-title">{escape(title)}</title>{svg[opening:]}'


def _rectangles(spans: Sequence[tuple[float, float]], bottom: float, top: float) -> MplPath:
    """One compound path of rectangles (x0, x1): far smaller in SVG than one patch each."""
    count = len(spans)
    vertices = np.empty((count * 5, 2))
    codes = np.empty(count * 5, dtype=MplPath.code_type)
    x = np.asarray(spans, dtype=float).reshape(count, 2)
    vertices[0::5] = np.column_stack([x[:, 0], np.full(count, bottom)])
    vertices[1::5] = np.column_stack([x[:, 1], np.full(count, bottom)])
    vertices[2::5] = np.column_stack([x[:, 1], np.full(count, top)])
    vertices[3::5] = np.column_stack([x[:, 0], np.full(count, top)])
    vertices[4::5] = vertices[0::5]
    codes[0::5] = MplPath.MOVETO
    codes[1::5] = MplPath.LINETO
    codes[2::5] = MplPath.LINETO
    codes[3::5] = MplPath.LINETO
    codes[4::5] = MplPath.CLOSEPOLY
    return MplPath(vertices, codes)


def _add_rectangles(
    axes: Axes, spans: Sequence[tuple[float, float]], bottom: float, top: float, color: str, alpha: float
) -> None:
    if spans:
        axes.add_patch(
            PathPatch(_rectangles(spans, bottom, top), facecolor=color, edgecolor="none", alpha=alpha)
        )


_IDLE_ALPHA: Final[float] = 0.5
#: Step boundaries are drawn up to this many steps (and labelled up to 30).
_MAX_STEP_LINES: Final[int] = 100

#: Busy blocks are shaded by the share of the block that was really busy (short gaps merged).
_BUSY_LEVELS: Final[tuple[tuple[float, float, str], ...]] = (
    (0.9, 1.0, "busy"),
    (0.5, 0.65, "busy 50-90% (short gaps merged)"),
    (0.0, 0.35, "busy < 50% (short gaps merged)"),
)


def _busy_level(share: float) -> int:
    """Index into :data:`_BUSY_LEVELS` for a block's busy share."""
    return next(index for index, (low, _, _) in enumerate(_BUSY_LEVELS) if share >= low)


def timeline_figure(timeline: Timeline, gaps: Sequence[IdleGap], step_labels: bool = True) -> Figure | None:
    """GPU activity per device over time: busy blocks, idle gaps shaded by cause, syncs, steps.

    None when the trace has no GPU activity. Gaps narrower than the timeline's resolution are not
    drawn (they could not be seen); x counts from the trace's first event.
    """
    if not timeline.devices:
        return None
    origin = timeline.origin_ns
    resolution = timeline.resolution_ns
    per_unit, unit = _unit(timeline.end_ns - origin)

    def x(ns: float) -> float:
        return (ns - origin) / per_unit

    with chart_style():
        rows = len(timeline.devices)
        figure = Figure(figsize=(_WIDTH_IN, 1.25 + 0.8 * rows), layout="constrained")
        axes_list = figure.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
        causes_drawn: set[str] = set()
        levels_drawn: set[str] = set()
        any_sync = False
        any_communication = False
        for axes, device in zip(axes_list, timeline.devices, strict=True):
            by_level: dict[int, list[tuple[float, float]]] = {}
            for block in device.blocks:
                # At least two resolutions wide (about a pixel): a lone short kernel stays visible.
                end = max(block.end_ns, block.start_ns + 2 * resolution)
                by_level.setdefault(_busy_level(block.busy_share), []).append((x(block.start_ns), x(end)))
            for level, spans in sorted(by_level.items()):
                _, alpha, label = _BUSY_LEVELS[level]
                levels_drawn.add(label)
                _add_rectangles(axes, spans, 0.15, 0.85, BUSY, alpha)
            if device.communication:
                any_communication = True
                _add_rectangles(
                    axes,
                    [
                        (x(b.start_ns), x(max(b.end_ns, b.start_ns + 2 * resolution)))
                        for b in device.communication
                    ],
                    0.02,
                    0.13,
                    COMMUNICATION,
                    1.0,
                )
            by_cause: dict[str, list[tuple[float, float]]] = {}
            for gap in gaps:
                if gap.device == device.device and gap.duration_ns >= resolution:
                    by_cause.setdefault(gap.cause_kind, []).append((x(gap.start_ns), x(gap.end_ns)))
            for cause in ordered_causes(by_cause):
                causes_drawn.add(cause)
                _add_rectangles(axes, by_cause[cause], 0.15, 0.85, cause_color(cause), _IDLE_ALPHA)
            # Only calls inside the drawn window: a sync long before the first kernel is not drawn.
            marks = [
                x((mark.start_ns + mark.end_ns) / 2)
                for mark in device.syncs
                if timeline.start_ns <= mark.end_ns and mark.start_ns <= timeline.end_ns
            ]
            if marks:
                any_sync = True
                axes.plot(
                    marks, [0.96] * len(marks), linestyle="none", marker="v", markersize=5, color=SYNC_MARK
                )
            for step in timeline.steps if len(timeline.steps) <= _MAX_STEP_LINES else ():
                axes.axvline(x(step.start_ns), color=FOREGROUND, alpha=0.45, linewidth=0.7, linestyle="--")
            axes.set_ylim(0, 1.05)
            axes.set_yticks([])
            axes.spines["left"].set_visible(False)
            axes.set_ylabel(f"GPU {device.device}", rotation=0, ha="right", va="center")
            axes.grid(axis="x")
        if step_labels and 0 < len(timeline.steps) <= 30:
            for step in timeline.steps:
                axes_list[0].annotate(
                    f"step {step.step}",
                    xy=(x(step.start_ns), 1.0),
                    xycoords=("data", "axes fraction"),
                    xytext=(2, 2),
                    textcoords="offset points",
                    fontsize=7.5,
                    alpha=0.8,
                )
        axes_list[-1].set_xlabel(f"time since the first event of the trace ({unit})")
        axes_list[-1].set_xlim(x(timeline.start_ns), x(timeline.end_ns))
        handles: list[Patch | Line2D] = [
            Patch(facecolor=BUSY, alpha=alpha, label=label)
            for _, alpha, label in _BUSY_LEVELS
            if label in levels_drawn
        ]
        handles += [
            Patch(facecolor=cause_color(c), alpha=_IDLE_ALPHA, label=f"idle: {cause_label(c)}")
            for c in ordered_causes(causes_drawn)
        ]
        if any_communication:
            handles.append(Patch(facecolor=COMMUNICATION, label="communication kernels (strip below)"))
        if any_sync:
            handles.append(
                Line2D([], [], linestyle="none", marker="v", color=SYNC_MARK, label="host sync call")
            )
        if 0 < len(timeline.steps) <= _MAX_STEP_LINES:
            handles.append(Line2D([], [], color=FOREGROUND, alpha=0.45, linestyle="--", label="step start"))
        figure.legend(handles=handles, loc="outside lower center", ncols=min(3, len(handles)))
    return figure


def _hbar_axes(rows: int, extra: float = 0.9) -> tuple[Figure, Axes]:
    figure = Figure(figsize=(_WIDTH_IN, extra + 0.3 * rows), layout="constrained")
    axes = figure.add_subplot()
    axes.grid(axis="x")
    axes.set_axisbelow(True)
    return figure, axes


def _label_bars(axes: Axes, ends: Sequence[float], texts: Sequence[str]) -> None:
    """Write ``texts`` just right of each bar's end."""
    for row, (end, text) in enumerate(zip(ends, texts, strict=True)):
        axes.annotate(
            text, xy=(end, row), xytext=(4, 0), textcoords="offset points", va="center", fontsize=7.5
        )


def step_breakdown_figure(steps: Sequence[StepTime], limit: int = 40) -> Figure | None:
    """Each profiled step as one stacked bar: GPU compute, communication, copies, then idle by cause.

    Each busy nanosecond is counted once (compute, then communication, then copies), so a bar adds up
    to the step window exactly. Steps left out of the steady state are marked. None without steps;
    at most ``limit`` bars.
    """
    if not steps:
        return None
    shown = list(steps)[:limit]
    multi_device = len({step.device for step in shown}) > 1
    per_unit, unit = _unit(max(step.span_ns for step in shown))
    with chart_style():
        figure, axes = _hbar_axes(len(shown), extra=1.3)
        labels = [
            f"step {s.step}"
            + (f" · GPU {s.device}" if multi_device else "")
            + ("" if s.steady else " (not steady)")
            for s in shown
        ]
        rows = np.arange(len(shown))
        left = np.zeros(len(shown))
        segments: list[tuple[str, str, float, list[float]]] = [
            ("GPU busy: compute", BUSY, 1.0, [s.compute_ns / per_unit for s in shown]),
            ("GPU busy: communication", COMMUNICATION, 1.0, [s.communication_ns / per_unit for s in shown]),
            ("GPU busy: copies", COPY, 1.0, [s.copy_exposed_ns / per_unit for s in shown]),
        ]
        for cause in ordered_causes(kind for s in shown for kind, _ in s.idle_by_cause_ns):
            widths = [dict(s.idle_by_cause_ns).get(cause, 0) / per_unit for s in shown]
            segments.append((f"idle: {cause_label(cause)}", cause_color(cause), 0.8, widths))
        for label, color, alpha, widths in segments:
            if any(widths):
                axes.barh(rows, widths, left=left, color=color, alpha=alpha, label=label, height=0.7)
                left += np.asarray(widths)
        axes.set_yticks(rows, labels)
        axes.invert_yaxis()
        axes.set_xlabel(f"{unit} within the step window")
        figure.legend(loc="outside lower center", ncols=3)
    return figure


def idle_gaps_figure(gaps: Sequence[IdleGap], origin_ns: int, top: int = 15) -> Figure | None:
    """The ``top`` longest idle gaps as bars coloured by cause, labelled with when they started."""
    if not gaps:
        return None
    shown = sorted(gaps, key=lambda g: (-g.duration_ns, g.device, g.start_ns))[:top]
    multi_device = len({gap.device for gap in gaps}) > 1
    per_unit, unit = _unit(shown[0].duration_ns)
    with chart_style():
        figure, axes = _hbar_axes(len(shown))
        rows = np.arange(len(shown))
        widths = [gap.duration_ns / per_unit for gap in shown]
        colors = [cause_color(gap.cause_kind) for gap in shown]
        axes.barh(rows, widths, color=colors, height=0.7)
        labels = [
            f"#{i + 1} at {format_duration(gap.start_ns - origin_ns)}"
            + (f" · GPU {gap.device}" if multi_device else "")
            for i, gap in enumerate(shown)
        ]
        axes.set_yticks(rows, labels)
        axes.invert_yaxis()
        texts = [
            _text(
                f"{format_duration(gap.duration_ns)} · {gap.cause}"
                + (f" · {gap.source}" if gap.source else ""),
                90,
            )
            for gap in shown
        ]
        _label_bars(axes, widths, texts)
        axes.set_xlim(0, max(widths) * 1.9)
        axes.set_xlabel(f"idle gap length ({unit})")
        kinds = ordered_causes(gap.cause_kind for gap in shown)
        figure.legend(
            handles=[Patch(facecolor=cause_color(c), label=cause_label(c)) for c in kinds],
            loc="outside lower center",
            ncols=min(5, len(kinds)),
        )
    return figure


def _hotspot_label(hotspot: SyncHotspot) -> str:
    where = hotspot.source or "source not recorded"
    op = f" in {hotspot.op}" if hotspot.op else ""
    return f"{_text(hotspot.call_text + op, 48)}\n{_text(where, 48)}"


def sync_hotspots_figure(hotspots: Sequence[SyncHotspot], top: int = 10) -> Figure | None:
    """Host sync hot spots: time the host was blocked, then GPU idle right after, stacked."""
    shown = list(hotspots)[:top]
    if not shown:
        return None
    per_unit, unit = _unit(max(h.blocked_ns + h.idle_after_ns for h in shown))
    with chart_style():
        figure, axes = _hbar_axes(len(shown) * 2, extra=1.0)
        rows = np.arange(len(shown))
        blocked = np.asarray([h.blocked_ns / per_unit for h in shown])
        after = np.asarray([h.idle_after_ns / per_unit for h in shown])
        axes.barh(rows, blocked, color=SYNC_MARK, label="host blocked in the call", height=0.6)
        axes.barh(
            rows,
            after,
            left=blocked,
            color=CAUSE_COLORS["sync"],
            alpha=_IDLE_ALPHA,
            label="GPU idle right after",
            height=0.6,
        )
        axes.set_yticks(rows, [_hotspot_label(h) for h in shown])
        axes.invert_yaxis()
        texts = [
            f"{h.count:,} call{'s' if h.count != 1 else ''}"
            + (f", {h.per_step:.3g} per step" if h.per_step is not None else "")
            for h in shown
        ]
        _label_bars(axes, list(blocked + after), texts)
        axes.set_xlim(0, max(float((blocked + after).max()), 1e-9) * 1.3)
        axes.set_xlabel(f"{unit} over the whole trace")
        figure.legend(loc="outside lower center", ncols=2)
    return figure


def copies_figure(copies: Sequence[CopyGroup], top: int = 10) -> Figure | None:
    """Copy time per kind (direction, memory kinds, device): overlapped with kernels vs exposed."""
    shown = list(copies)[:top]
    if not shown:
        return None
    multi_device = len({group.device for group in copies}) > 1
    per_unit, unit = _unit(max(group.duration_ns for group in shown))
    with chart_style():
        figure, axes = _hbar_axes(len(shown), extra=1.0)
        rows = np.arange(len(shown))
        overlapped = np.asarray([g.overlapped_ns / per_unit for g in shown])
        exposed = np.asarray([max(g.duration_ns - g.overlapped_ns, 0) / per_unit for g in shown])
        axes.barh(rows, overlapped, color=BUSY, label="ran while kernels ran", height=0.6)
        axes.barh(rows, exposed, left=overlapped, color=EXPOSED, label="ran while no kernel ran", height=0.6)
        labels = [
            f"{g.direction} {g.src or '?'} → {g.dst or '?'}" + (f" · GPU {g.device}" if multi_device else "")
            for g in shown
        ]
        axes.set_yticks(rows, labels)
        axes.invert_yaxis()
        texts = [f"{format_size(g.bytes)} in {g.count:,} cop{'ies' if g.count != 1 else 'y'}" for g in shown]
        _label_bars(axes, list(overlapped + exposed), texts)
        axes.set_xlim(0, max(float((overlapped + exposed).max()), 1e-9) * 1.35)
        axes.set_xlabel(f"copy time ({unit})")
        figure.legend(loc="outside lower center", ncols=2)
    return figure


def host_ops_figure(host: HostSummary) -> Figure | None:
    """The busiest host operators by total (inclusive) time: the host-side view."""
    if not host.top_ops:
        return None
    per_unit, unit = _unit(max(total for _, _, total in host.top_ops))
    with chart_style():
        figure, axes = _hbar_axes(len(host.top_ops), extra=0.7)
        rows = np.arange(len(host.top_ops))
        widths = [total / per_unit for _, _, total in host.top_ops]
        axes.barh(rows, widths, color=BUSY, height=0.6)
        axes.set_yticks(rows, [_text(name, 60) for name, _, _ in host.top_ops])
        axes.invert_yaxis()
        texts = [
            f"{format_duration(total)} in {count:,} call{'s' if count != 1 else ''}"
            for _, count, total in host.top_ops
        ]
        _label_bars(axes, widths, texts)
        axes.set_xlim(0, max(max(widths) * 1.3, 1e-9))
        axes.set_xlabel(f"host time inside the operator ({unit}, inclusive)")
    return figure


#: Line colours of the memory chart, one per device in turn.
_MEMORY_COLORS: Final[tuple[str, ...]] = (BUSY, "#D55E00", "#009E73", "#CC79A7", "#E69F00", "#56B4E9")


def _size_unit(largest: float) -> tuple[float, str]:
    """The axis unit for sizes up to ``largest`` bytes: (bytes per unit, unit name)."""
    for scale, unit in ((1 << 30, "GiB"), (1 << 20, "MiB"), (1 << 10, "KiB")):
        if largest >= scale:
            return float(scale), unit
    return 1.0, "B"


def memory_figure(devices: Sequence[DeviceMemory]) -> Figure | None:
    """Memory over time per device: allocated (solid), reserved by the caching allocator (dashed)
    and the device's total (dotted), from the bounded series of the analysis. None when the trace
    holds no ``[memory]`` records."""
    drawn = [device for device in devices if device.series]
    if not drawn:
        return None
    largest = max(max(device.peak_bytes, device.total_memory_bytes or 0) for device in drawn)
    per_byte, size_unit = _size_unit(float(largest))
    per_unit, unit = _unit(max(max(t for t, _, _ in device.series) for device in drawn))
    with chart_style():
        figure = Figure(figsize=(_WIDTH_IN, 3.4), layout="constrained")
        axes = figure.add_subplot()
        for index, device in enumerate(drawn):
            color = _MEMORY_COLORS[index % len(_MEMORY_COLORS)]
            times = np.array([t for t, _, _ in device.series], dtype=np.float64) / per_unit
            allocated = np.array([a for _, a, _ in device.series], dtype=np.float64) / per_byte
            bound = " (at least)" if device.allocated_is_lower_bound else ""
            axes.plot(
                times,
                allocated,
                drawstyle="steps-post",
                color=color,
                label=f"{device.label} allocated{bound}",
            )
            if device.peak_reserved_bytes:  # the CPU allocator records 0 reserved: not drawn
                reserved = np.array([r or 0 for _, _, r in device.series], dtype=np.float64) / per_byte
                axes.plot(
                    times, reserved, drawstyle="steps-post", color=color, linestyle="--",
                    label=f"{device.label} reserved",
                )  # fmt: skip
            if device.total_memory_bytes:
                axes.axhline(
                    device.total_memory_bytes / per_byte, color=color, linestyle=":",
                    label=f"{device.label} total ({format_size(device.total_memory_bytes)})",
                )  # fmt: skip
        axes.set_ylim(bottom=0)
        axes.set_xlabel(f"time from the trace's first event ({unit})")
        axes.set_ylabel(size_unit)
        figure.legend(loc="outside lower center", ncols=3)
    return figure


def before_after_figure(
    bars: Sequence[tuple[str, Sequence[tuple[str, str, float]]]], unit_ns: float, unit: str
) -> Figure | None:
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
    with chart_style():
        figure, axes = _hbar_axes(len(bars), extra=1.5)
        rows = np.arange(len(bars))
        left = np.zeros(len(bars))
        for label in order:
            widths = (
                np.array([sum(v for name, _, v in segments if name == label) for _, segments in bars])
                / unit_ns
            )
            if widths.any():
                axes.barh(rows, widths, left=left, color=colors[label], label=label, height=0.6)
                left += widths
        axes.set_yticks(rows, [name for name, _ in bars])
        axes.invert_yaxis()
        axes.set_xlabel(unit)
        figure.legend(loc="outside lower center", ncols=3)
    return figure
