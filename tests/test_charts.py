"""The report's charts say what they mean: what each draws, read back from its SVG.

Each chart is parsed as XML; bar lengths are read in the chart's own axis unit from the x axis's
tick labels, and compared with figures computed here from the raw trace events (stdlib json), or
with the analysis results the chart is drawn from where the figure is the analysis's own.
"""

from __future__ import annotations

import gzip
import json
import re
import xml.etree.ElementTree as ET
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from traceinsight.analysis import analyze
from traceinsight.analysis.causes import CauseKind
from traceinsight.load import load_trace
from traceinsight.render import charts
from traceinsight.render.html import HtmlRenderer
from traceinsight.results import Report, result_of
from traceinsight.rules import evaluate

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
SVG = "{http://www.w3.org/2000/svg}"


@dataclass(frozen=True)
class Drawn:
    """A rendered report page and the report it came from."""

    report: Report
    html: str

    def chart(self, chart_id: str) -> ET.Element | None:
        """The ``<svg>`` element of one chart, parsed (None when the page has none)."""
        found = re.search(rf'<svg [^>]*aria-labelledby="{chart_id}-title".*?</svg>', self.html, re.DOTALL)
        return None if found is None else ET.fromstring(found[0])


def drawn(name: str) -> Drawn:
    trace = load_trace(SAMPLES / name)
    analysis = analyze(trace)
    report = Report(analysis=analysis, findings=evaluate(analysis))
    return Drawn(report, HtmlRenderer().render(result_of(report)))


def raw_events(name: str) -> list[dict[str, Any]]:
    path = SAMPLES / name
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        document = json.load(handle)
    events = document if isinstance(document, list) else document["traceEvents"]
    return [event for event in events if isinstance(event, dict)]


@pytest.fixture(scope="module")
def workers0() -> Drawn:
    return drawn("v100_resnet50_workers0.pt.trace.json.gz")


@pytest.fixture(scope="module")
def gp100() -> Drawn:
    return drawn("gp100_mlp_pageable_sync.json.gz")


# --- reading a bar chart back ------------------------------------------------------------------


def texts(svg: ET.Element) -> list[tuple[float, float, str, str]]:
    """(x, y, anchor, text) of every text element."""
    return [
        (float(t.get("x", 0)), float(t.get("y", 0)), t.get("text-anchor", "start"), t.text or "")
        for t in svg.iter(f"{SVG}text")
    ]


def x_scale(svg: ET.Element) -> tuple[float, float]:
    """(points at value 0, points per unit) from the x axis's numeric tick labels (the lowest row
    of centred numbers)."""
    numeric = [(x, y, float(s)) for x, y, anchor, s in texts(svg) if anchor == "middle" and _is_number(s)]
    row = max(y for _, y, _ in numeric)
    ticks = sorted((value, x) for x, y, value in numeric if y == row)
    (v1, x1), (v2, x2) = ticks[0], ticks[-1]
    per_unit = (x2 - x1) / (v2 - v1)
    return x1 - v1 * per_unit, per_unit


def _is_number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True


@dataclass(frozen=True)
class Bar:
    """One drawn bar: its label lines (top to bottom) and its segments (colour, opacity, length in
    the axis unit), left to right."""

    label: tuple[str, ...]
    segments: tuple[tuple[str, float, float], ...]

    def length(self, color: str, opacity: float = 1.0) -> float:
        return sum(value for fill, alpha, value in self.segments if fill == color and alpha == opacity)


def bars(svg: ET.Element) -> list[Bar]:
    """The bars, top to bottom (legend swatches, 9 points tall, left out)."""
    zero, per_unit = x_scale(svg)
    rows: dict[float, list[tuple[float, str, float, float]]] = defaultdict(list)
    for rect in svg.iter(f"{SVG}rect"):
        height = float(rect.get("height", 0))
        if height <= 9.5:
            continue
        y = float(rect.get("y", 0)) + height / 2
        x, width = float(rect.get("x", 0)), float(rect.get("width", 0))
        alpha = float(rect.get("fill-opacity", 1))
        rows[round(y, 1)].append((x, rect.get("fill", ""), alpha, width / per_unit))
    labels = [(y, s) for x, y, anchor, s in texts(svg) if anchor == "end" and x < zero]
    result = []
    for middle, segments in sorted(rows.items()):
        assert min(x for x, *_ in segments) == pytest.approx(zero, abs=0.02)  # bars start at 0
        lines = tuple(s for y, s in sorted(labels) if abs(y - middle) < 12)
        result.append(Bar(lines, tuple((fill, alpha, value) for _, fill, alpha, value in sorted(segments))))
    return result


# --- the charts --------------------------------------------------------------------------------


def test_sync_chart_shows_waits_per_steady_step_not_the_sync_that_ends_the_profile(workers0: Drawn) -> None:
    """The end-of-profile ``cudaDeviceSynchronize`` (16 ms, once, after the steps) was the longest
    bar; it costs nothing per step. The chart draws each steady step's own waits."""
    events = raw_events("v100_resnet50_workers0.pt.trace.json.gz")
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"]) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")
    )
    device_syncs = [e for e in events if e.get("name") == "cudaDeviceSynchronize"]
    assert len(device_syncs) == 1 and device_syncs[0]["ts"] >= steps[-1][1]  # after every step
    assert device_syncs[0]["dur"] > 10_000  # µs: longer than all the other waits together
    steady = workers0.report.analysis.steady
    windows = [(start / 1000, end / 1000) for start, end in steady.windows]  # µs, trace clock
    stream_syncs = [
        e["dur"]
        for e in events
        if e.get("name") == "cudaStreamSynchronize" and any(a <= e["ts"] < b for a, b in windows)
    ]
    per_step_ms = sum(stream_syncs) / len(steady.steady_steps) / 1000

    svg = workers0.chart("syncs")
    assert svg is not None
    drawn_bars = bars(svg)
    assert not any("cudaDeviceSynchronize" in text for *_, text in texts(svg))
    assert drawn_bars[0].label[0].startswith("cudaStreamSynchronize")
    assert drawn_bars[0].length(charts.SYNC_MARK) == pytest.approx(per_step_ms, rel=0.01)
    assert any(s.endswith("per steady step") for *_, s in texts(svg))


def plain_self_times(events: list[dict[str, Any]]) -> dict[str, tuple[int, int]]:
    """name → (self µs, total µs): operators nest per thread like a stack (sorted by start, longer
    first); self is the duration minus the direct callees' durations; the total counts the
    occurrences whose direct caller has another name (a call inside a call of the same name once)."""
    by_thread: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for event in events:
        if event.get("ph") == "X" and event.get("cat") == "cpu_op" and "dur" in event:
            by_thread[(event.get("pid"), event.get("tid"))].append(event)
    own: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for ops in by_thread.values():
        stack: list[dict[str, Any]] = []
        callees: dict[int, int] = defaultdict(int)
        for op in sorted(ops, key=lambda e: (e["ts"], -e["dur"])):
            while stack and stack[-1]["ts"] + stack[-1]["dur"] <= op["ts"]:
                stack.pop()
            if stack:
                callees[id(stack[-1])] += op["dur"]
            if not stack or stack[-1]["name"] != op["name"]:
                total[op["name"]] += op["dur"]
            stack.append(op)
        for op in ops:
            own[op["name"]] += op["dur"] - callees[id(op)]
    return {name: (own[name], total[name]) for name in own}


def test_host_chart_is_ordered_and_drawn_by_self_time(gp100: Drawn) -> None:
    """The host chart said "by total time" but was ordered by self time: it now draws self time
    (the order), then the rest of the total lighter."""
    expected = plain_self_times(raw_events("gp100_mlp_pageable_sync.json.gz"))
    svg = gp100.chart("host")
    assert svg is not None
    drawn_bars = bars(svg)
    names = [bar.label[0] for bar in drawn_bars]
    top = sorted(expected, key=lambda name: (-expected[name][0], name))[: len(names)]
    assert names == top
    ms = {name: (own / 1000, total / 1000) for name, (own, total) in expected.items()}
    for bar in drawn_bars:
        own, total = ms[bar.label[0]]
        assert bar.length(charts.BUSY) == pytest.approx(own, abs=0.01)
        assert bar.length(charts.BUSY) + bar.length(charts.BUSY, 0.35) == pytest.approx(total, abs=0.01)
    assert "Busiest host operators by self time" in gp100.html


def test_step_chart_draws_the_time_before_the_first_work_first(workers0: Drawn) -> None:
    """Each bar sums the step window by category; the time before the step's first GPU work (70 ms
    in the first step here) is its first segment, not its last, and the time after the last work
    comes last; the axis says the time is summed, not placed."""
    svg = workers0.chart("steps")
    assert svg is not None
    before = charts.cause_color(CauseKind.BEFORE_FIRST.value)
    steps = workers0.report.analysis.steps
    first = steps[0].idle_by_cause_ns.get(CauseKind.BEFORE_FIRST.value, 0)
    assert first > 50e6  # ns: the trace's first step waited for its first kernel
    drawn_bars = bars(svg)
    assert len(drawn_bars) == len(steps)
    for bar, step in zip(drawn_bars, steps, strict=True):
        lead = step.idle_by_cause_ns.get(CauseKind.BEFORE_FIRST.value, 0)
        if lead:
            fill, alpha, value = bar.segments[0]
            assert (fill, alpha) == (before, 1.0)
            assert value == pytest.approx(lead / 1e6, abs=0.01)
        assert sum(value for *_, value in bar.segments) == pytest.approx(step.span_ns / 1e6, abs=0.05)
    assert any(s == "ms of the step window, summed by category" for *_, s in texts(svg))


def test_timeline_says_merged_blocks_hide_short_gaps_not_a_utilization(workers0: Drawn) -> None:
    svg = workers0.chart("timeline")
    assert svg is not None
    legend = [s for *_, s in texts(svg)]
    assert not any("busy 50-90" in s or "busy < 50" in s for s in legend)
    assert any(s.startswith("busy, with gaps too short to draw") for s in legend)
    assert "step start on the GPU" in legend


@pytest.mark.parametrize(
    "name",
    [
        "v100_resnet50_workers0.pt.trace.json.gz",
        "a100_recsys_rank0.json.gz",
        "a100_ddp_nccl.json.gz",
        "h100_qwen_inference_stacks.json.gz",
    ],
)
def test_every_chart_is_plain_svg_with_a_one_line_caption(name: str) -> None:
    """Each chart: SVG that parses as XML, with its accessible name, no script, no link, no style
    sheet, nothing loaded; a caption of one sentence under it."""
    page = drawn(name)
    figures = re.findall(
        r'<figure class="chart">\s*(<svg.*?</svg>)\s*<figcaption>(.*?)</figcaption>', page.html, re.DOTALL
    )
    assert len(figures) >= 4
    for svg_text, caption in figures:
        svg = ET.fromstring(svg_text)
        tags = {element.tag.removeprefix(SVG) for element in svg.iter()}
        assert tags <= {"svg", "title", "rect", "path", "line", "text"}, tags
        assert not any(
            key.endswith("href") or value.startswith(("url(", "http"))
            for e in svg.iter()
            for key, value in e.attrib.items()
        )
        assert svg.find(f"{SVG}title") is not None
        assert "\n" not in caption and caption.endswith(".") and caption.count(". ") == 0
