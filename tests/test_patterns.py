"""Shapes read by their pattern (issue 29, item 4): launch-bound only for many short gaps between
many short kernels, a pipeline bubble, per-parameter collectives, and advice code that fits the
trace (its optimizer, its compile state, its communication). Every figure a test pins is computed
here from the raw events, never taken from the tool."""

from __future__ import annotations

import itertools
from pathlib import Path
from statistics import median
from typing import Any

from loops import launch_loop
from tracebuild import cpu_op, kernel, runtime, sample_report, write_trace

from traceinsight.analysis import Analysis, analyze
from traceinsight.formatting import format_duration
from traceinsight.load import load_trace
from traceinsight.rules import advice, evaluate
from traceinsight.rules.findings import Finding

_correlation = itertools.count(800_000)


def analysis_of(tmp_path: Path, events: list[dict[str, Any]], **top: Any) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events, **top)))


def card(findings: tuple[Finding, ...], rule: str) -> Finding:
    return next(f for f in findings if f.rule == rule)


def kernel_spans(events: list[dict[str, Any]], device: int | None = None) -> list[tuple[float, float]]:
    """(start, end) of every kernel in the raw events, in time order (µs)."""
    return sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["cat"] == "kernel" and (device is None or e["args"]["device"] == device)
    )


def gaps_between(spans: list[tuple[float, float]]) -> list[float]:
    """The idle between consecutive kernels of one device (µs), in time order."""
    gaps, busy_until = [], spans[0][1]
    for start, end in spans[1:]:
        if start > busy_until:
            gaps.append(start - busy_until)
        busy_until = max(busy_until, end)
    return gaps


def step_windows(events: list[dict[str, Any]]) -> list[tuple[float, float]]:
    return sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["name"].startswith("ProfilerStep#"))


# --- launch-bound: the pattern, not any host-bound idle -------------------------------------------


def _toy_with_a_pause(pause_us: float = 18_000) -> list[dict[str, Any]]:
    """Three kernels, each launched by its operator; between the second and the third the host
    pauses ``pause_us`` recording nothing (a sleep, Python outside any operator). No steps."""
    events: list[dict[str, Any]] = []
    for at in (0.0, 50.0, 75.0 + pause_us):
        correlation = next(_correlation)
        events += [
            cpu_op("aten::mm", at, 20),
            runtime("cudaLaunchKernel", at + 5, 3, correlation=correlation),
            kernel(at + 15, 30, correlation=correlation),
        ]
    return events


def test_a_three_kernel_toy_with_one_long_pause_is_not_launch_bound(tmp_path: Path) -> None:
    events = _toy_with_a_pause()
    pause = max(gaps_between(kernel_spans(events)))  # the host's 18 ms pause, from the raw kernels
    findings = evaluate(analysis_of(tmp_path, events))
    assert "launch-bound" not in {f.rule for f in findings}
    low = card(findings, "low-gpu-utilization")
    # the card says what the pattern was: one pause of the host, not launch overhead
    assert dict(low.evidence)["gaps between launches"] == (
        f"1 pause of the host, the longest {format_duration(pause * 1000)}: its own work between "
        "launches, not launch overhead"
    )
    assert low.advice is advice.HOST_PAUSES and "CUDA graph" not in low.advice.after
    assert "pausing between launches" in low.why


def test_a_loop_of_tiny_kernels_is_launch_bound_with_its_pattern(tmp_path: Path) -> None:
    loop = launch_loop(steps=6, kernels=12, kernel_us=20, dispatch_us=60)
    spans, windows = kernel_spans(loop.events), step_windows(loop.events)
    gaps = gaps_between(spans)
    steps = len(windows)
    assert len({round(end - start, 3) for start, end in windows}) == 1  # equal steps: all steady
    step_time = sum(end - start for start, end in windows)
    findings = evaluate(analysis_of(tmp_path, loop.events))
    launch = card(findings, "launch-bound")
    assert launch.title == (
        f"The host cannot launch kernels fast enough: GPU 0 waits {sum(gaps) / step_time:.0%} of each "
        f"step in {len(gaps) / steps:,.0f} short gaps between {len(spans) / steps:,.0f} kernels per step "
        f"(median gap {format_duration(median(gaps) * 1000)}, median kernel "
        f"{format_duration(median(end - start for start, end in spans) * 1000)})"
    )
    assert launch.saving_per_step_ns == round(sum(gaps) * 1000 / steps)
    assert dict(launch.evidence)["share of the host-launch idle in such gaps"] == "100%"
    # one finding per fix: low-gpu-utilization does not count the launch gaps again
    assert "low-gpu-utilization" not in {f.rule for f in findings}


def test_a_launch_bound_loop_with_a_pause_claims_only_its_short_gaps(tmp_path: Path) -> None:
    loop = launch_loop(steps=6, kernels=12, kernel_us=20, dispatch_us=60, pause_us=3000)
    spans, windows = kernel_spans(loop.events), step_windows(loop.events)
    gaps = gaps_between(spans)
    short = [gap for gap in gaps if gap < 1000]
    pauses = [gap for gap in gaps if gap >= 1000]
    assert len(pauses) == len(windows)  # one pause per step
    findings = evaluate(analysis_of(tmp_path, loop.events))
    launch = card(findings, "launch-bound")
    assert launch.saving_per_step_ns == round(sum(short) * 1000 / len(windows))
    assert dict(launch.evidence)["share of the host-launch idle in such gaps"] == (
        f"{sum(short) / sum(gaps):.0%}; the rest is {len(pauses)} pauses of the host, the longest "
        f"{format_duration(max(pauses) * 1000)}: its own work between launches, not launch overhead"
    )
    # the pauses are left to low-gpu-utilization, which advises on them (not CUDA graphs)
    low = card(findings, "low-gpu-utilization")
    assert low.saving_per_step_ns == round(sum(pauses) * 1000 / len(windows))
    assert low.advice is advice.HOST_PAUSES


def test_launch_bound_on_the_real_launch_bound_samples() -> None:
    for name in ("gp100_mlp_pageable_sync.json.gz", "h100_bert_small_stacks.json.gz"):
        top = next(f for f in sample_report(name).findings if not f.minor)
        assert top.rule == "launch-bound", name


def test_a_toy_with_few_kernels_is_not_launch_bound() -> None:
    # legacy_category_names: 4 kernels and 3 gaps, one of 1.45 ms: no pattern of many short gaps
    assert "launch-bound" not in {f.rule for f in sample_report("legacy_category_names.json.gz").findings}
