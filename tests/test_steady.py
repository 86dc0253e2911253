"""The steady state and the warnings: findings speak for the training loop, not its start-up."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
from loops import item_loop
from tracebuild import (
    SAMPLES,
    annotation,
    cpu_op,
    kernel,
    launch,
    read_events,
    runtime,
    sample_report,
    write_trace,
)

from traceinsight.analysis import Analysis, analyze
from traceinsight.analysis.causes import cause_label
from traceinsight.analysis.steady import steady_state
from traceinsight.analysis.validity import trace_warnings
from traceinsight.load import load_trace
from traceinsight.render.terminal import TerminalRenderer
from traceinsight.report import Report
from traceinsight.rules import evaluate

ALL_SAMPLES = sorted(str(path.relative_to(SAMPLES)) for path in SAMPLES.rglob("*.json*"))


def report(name: str) -> Report:
    result: Report = sample_report(name)
    return result


def analysis_of(tmp_path: Path, events: list[dict[str, Any]]) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events)))


def kinds(result: Analysis) -> set[str]:
    return {warning.kind for warning in result.warnings}


# --- a100 alexnet: start-up captured, no steps ---------------------------------------------------


def test_alexnet_warns_that_start_up_was_captured() -> None:
    result = report("a100_alexnet_cuda_sync.json.gz").analysis
    assert {"startup-captured", "no-steps"} <= kinds(result)
    warning = next(w for w in result.warnings if w.kind == "startup-captured")
    assert "warmup" in warning.message and "--wait" in warning.advice
    # the steady window starts where the benchmark's own warm-up range ends (from the raw JSON)
    _, raw = read_events(SAMPLES / "a100_alexnet_cuda_sync.json.gz")
    warmup_end = max(round((e["ts"] + e["dur"]) * 1000) for e in raw if "warmup" in str(e.get("name")))
    assert result.steady.startup_end_ns == warmup_end


def test_alexnet_gives_no_saving_from_the_start_up_gap() -> None:
    result = report("a100_alexnet_cuda_sync.json.gz")
    longest = max(result.analysis.idle_gaps, key=lambda gap: gap.duration_ns)
    assert longest.duration_ns > 10_000_000_000  # the 10 s cuDNN start-up gap
    assert longest.end_ns <= result.analysis.steady.windows[0][0]  # outside the steady state
    for finding in result.findings:
        assert finding.savings_ns < longest.duration_ns / 100
        assert finding.savings_ns <= result.analysis.steady.window_ns
    outside = dict(result.analysis.devices[0].idle_by_cause_ns)["outside-steady-state"]
    assert outside >= longest.duration_ns


# --- steps: start-up, outliers, cut short -------------------------------------------------------


def _steps(durations: list[float], *, launches: bool = True) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    t = 0.0
    for step, duration in enumerate(durations):
        events.append(annotation(f"ProfilerStep#{step}", t, duration))
        if launches:
            events += launch(t + 1, t + 11, min(50, duration / 2))
        t += duration
    return events


def test_a_slow_first_step_is_start_up(tmp_path: Path) -> None:
    result = analysis_of(tmp_path, _steps([20_000, 2_000, 2_100, 1_900, 2_000]))
    first = result.steady.steps[0]
    assert not first.steady and first.reason is not None and first.reason.startswith("start-up")
    assert [step.steady for step in result.steady.steps[1:]] == [True] * 4
    assert result.steady.step_ns == 2_000_000
    assert "startup-captured" in kinds(result)


def test_an_outlier_step_is_left_out(tmp_path: Path) -> None:
    result = analysis_of(tmp_path, _steps([2_000, 2_000, 9_000, 2_000, 2_000]))
    assert [step.steady for step in result.steady.steps] == [True, True, False, True, True]
    assert len(result.steady.windows) == 2  # split around the outlier
    assert "outlier-steps" in kinds(result)


def test_even_steps_are_all_steady(tmp_path: Path) -> None:
    result = analysis_of(tmp_path, _steps([2_000, 2_100, 1_950, 2_050]))
    assert all(step.steady for step in result.steady.steps)
    assert len(result.steady.windows) == 1 and not result.warnings


def test_a_step_that_launched_nothing_was_cut_short() -> None:
    result = report("mi250_rocm_toy.json.gz").analysis
    assert [step.steady for step in result.steady.steps] == [True, False]
    assert "cut-short-steps" in kinds(result)


def test_findings_come_from_the_steady_steps_only(tmp_path: Path) -> None:
    # a per-step .item() loop whose first step also holds a long start-up (host work before it)
    loop = item_loop(steps=6)
    first = loop.steps[0]
    shifted: list[dict[str, Any]] = []
    for event in loop.events:
        moved = dict(event)
        if event["cat"] != "user_annotation" or not event["name"].startswith("ProfilerStep#0"):
            moved["ts"] = event["ts"] + 50_000
        shifted.append(moved)
    step0 = next(e for e in shifted if e["name"] == "ProfilerStep#0")
    step0["dur"] = first[1] - first[0] + 50_000
    result = analysis_of(tmp_path, shifted)
    assert not result.steady.steps[0].steady
    sync = next(f for f in evaluate(result) if f.rule == "sync-in-loop")
    assert "every step" in sync.title  # 5 syncs in 5 steady steps, not "6 in 6"


def test_without_steps_a_first_call_outlier_marks_the_start_up(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = [cpu_op("aten::cudnn_convolution", 0, 50_000)]  # 50 ms first call
    events += launch(49_990, 50_000, 100)
    t = 51_000.0
    for _ in range(5):
        events.append(cpu_op("aten::cudnn_convolution", t, 200))
        events += launch(t + 150, t + 160, 100)
        t += 1_000
    result = analysis_of(tmp_path, events)
    assert result.steady.startup_end_ns == 50_000_000
    assert "first call of aten::cudnn_convolution" in (result.steady.startup_evidence or "")


def test_without_steps_or_start_up_the_whole_trace_is_judged(tmp_path: Path) -> None:
    result = analysis_of(tmp_path, [kernel(i * 100, 95) for i in range(20)])
    assert result.steady.startup_end_ns is None and len(result.steady.windows) == 1
    assert kinds(result) == {"no-steps"}


# --- validity ------------------------------------------------------------------------------------


def test_overlapping_work_on_one_stream_is_a_recording_problem(tmp_path: Path) -> None:
    events = [*_steps([2_000, 2_000, 2_000]), kernel(10, 500, stream=3), kernel(200, 500, stream=3)]
    assert "stream-overlap" in kinds(analysis_of(tmp_path, events))


def test_work_starting_before_its_launch_is_clock_skew(tmp_path: Path) -> None:
    events = _steps([2_000, 2_000, 2_000])
    events += [runtime("cudaLaunchKernel", 5_000, 3, correlation=4242), kernel(4_000, 10, correlation=4242)]
    warning = next(w for w in analysis_of(tmp_path, events).warnings if w.kind == "clock-skew")
    assert "1.00 ms" in warning.message


def test_launches_without_kernels_mean_dropped_gpu_events(tmp_path: Path) -> None:
    events = _steps([2_000] * 3)
    events += [runtime("cudaLaunchKernel", 10 + i, 1, correlation=70_000 + i) for i in range(20)]
    assert "dropped-gpu-events" in kinds(analysis_of(tmp_path, events))


def test_cuda_graph_replay_is_said() -> None:
    warning = next(
        w for w in report("a100_recsys_rank0.json.gz").analysis.warnings if w.kind == "cuda-graphs"
    )
    _, raw = read_events(SAMPLES / "a100_recsys_rank0.json.gz")
    graphs = sum(1 for e in raw if e.get("name") == "cudaGraphLaunch")
    assert f"{graphs:,} graph launches" in warning.message


def test_what_the_loader_dropped_or_repaired_is_a_warning(tmp_path: Path) -> None:
    trace = load_trace(write_trace(tmp_path / "t.json", _steps([2_000] * 3)))
    meta = dataclasses.replace(trace.meta, load_notes=(("dropped-time", 3), ("repaired-name", 1)))
    changed = dataclasses.replace(trace, meta=meta)
    warned = {w.kind: w.message for w in trace_warnings(changed, steady_state(changed))}
    assert "3 events had impossible times" in warned["dropped-time"]
    assert "1 Python frame name" in warned["repaired-name"]


# --- what a reader of a busy-but-idle trace is told ----------------------------------------------


@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_a_mostly_idle_gpu_never_gets_a_bare_no_findings(name: str) -> None:
    result = report(name)
    usages = result.analysis.usage
    window = sum(usage.window_ns for usage in usages)
    idle = sum(usage.idle_ns for usage in usages)
    text = " ".join(TerminalRenderer(width=400).render(result).split())
    if window and idle >= 0.4 * window:
        assert "No findings" not in text  # never a bare "no"
        if not any(not finding.minor for finding in result.findings):
            top = max((kind for usage in usages for kind in usage.idle), key=lambda item: item[1])[0]
            assert f"mostly {cause_label(top.value)}" in text
    for usage in usages:
        if usage.window_ns:
            assert f"Where GPU {usage.device}'s time goes" in text  # where every microsecond went


def test_workers0_pageable_copy_is_one_finding_and_workers4_has_no_dataloader_stall() -> None:
    workers0 = [f for f in report("v100_resnet50_workers0.pt.trace.json.gz").findings if not f.minor]
    assert workers0[0].rule == "dataloader-stall"
    copies = [f for f in workers0 if f.rule in {"pageable-memcpy", "blocking-h2d", "sync-in-loop"}]
    assert [f.rule for f in copies] == ["pageable-memcpy"]  # the copy, its sync, its idle: one finding
    assert "resnet50_profiler_api.py:44" in copies[0].title
    workers4 = {f.rule for f in report("v100_resnet50_workers4.pt.trace.json.gz").findings}
    assert "dataloader-stall" not in workers4
