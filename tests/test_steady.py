"""The steady state and the warnings: findings speak for the training loop, not its start-up."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loops import ahead_loop, dataloader_loop, item_loop
from tracebuild import (
    SAMPLES,
    annotation,
    cpu_op,
    kernel,
    launch,
    read_events,
    runtime,
    sample_report,
    union_length,
    write_trace,
)

from traceinsight.analysis import Analysis, analyze
from traceinsight.analysis.causes import cause_label
from traceinsight.analysis.steady import steady_state
from traceinsight.analysis.validity import trace_warnings
from traceinsight.load import load_trace
from traceinsight.model import replace
from traceinsight.render.terminal import TerminalRenderer
from traceinsight.results import Report, result_of
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
        assert finding.savings_total_ns < longest.duration_ns / 100
        assert finding.savings_total_ns <= result.analysis.steady.window_ns
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
    meta = replace(trace.meta, load_notes=(("dropped-time", 3), ("repaired-name", 1)))
    changed = replace(trace, meta=meta)
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
    text = " ".join(TerminalRenderer(width=400).render(result_of(result)).split())
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


# --- a step ends when its work ends ------------------------------------------------------------


def _gpu_paced(events: list[dict[str, Any]]) -> tuple[list[tuple[int, int]], list[int]]:
    """From the raw events: each step's (begin, done) in ns and its step time. Each kernel belongs
    to the ProfilerStep holding its launch call (same correlation); a step is done when its range
    and its kernels have ended, never before the step before it."""
    launched = {e["args"]["correlation"]: e["ts"] for e in events if e["cat"] == "cuda_runtime"}
    ranges = sorted(
        (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000))
        for e in events
        if e["name"].startswith("ProfilerStep#")
    )
    kernels = [
        (round(launched[e["args"]["correlation"]] * 1000), round((e["ts"] + e["dur"]) * 1000))
        for e in events
        if e["cat"] == "kernel"
    ]
    windows, previous = [], None
    for start, end in ranges:
        done = max([end] + [k_end for at, k_end in kernels if start <= at < end])
        begin = start if previous is None else previous
        done = max(done, begin)
        windows.append((begin, done))
        previous = done
    return windows, [done - begin for begin, done in windows]


def _busy(events: list[dict[str, Any]], begin: int, done: int) -> int:
    kernels = [
        (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in events if e["cat"] == "kernel"
    ]
    return union_length([(max(a, begin), min(b, done)) for a, b in kernels if a < done and b > begin])


def test_a_host_that_runs_ahead_is_timed_by_the_gpu(tmp_path: Path) -> None:
    """ProfilerStep ranges of 0.39 ms launch 8.4 ms of GPU work each: the step time is the GPU's
    pace, and the header says the GPU sets it (was: "median 0.39 ms", nothing about the pace)."""
    import json
    from statistics import median

    from traceinsight.formatting import format_duration
    from traceinsight.render.facts import header_facts
    from traceinsight.render.html import HtmlRenderer
    from traceinsight.render.markdown import MarkdownRenderer
    from traceinsight.results import result_of

    loop = ahead_loop()
    result = analysis_of(tmp_path, loop.events)
    windows, steps = _gpu_paced(loop.events)
    host = [round((end - start) * 1000) for start, end in loop.steps]
    assert median(steps) == 8_400_000 and median(host) == 390_000  # the loop as built
    assert result.steady.step_ns == median(steps)
    assert result.steady.host_step_ns == median(host)
    assert [step.duration_ns for step in result.steady.steps] == steps
    assert all(step.steady for step in result.steady.steps)
    gpu = median(_busy(loop.events, begin, done) for begin, done in windows)  # no waits on the GPU
    report = Report(result, evaluate(result))
    facts = dict(header_facts(result_of(report)))
    assert facts["Steps"].endswith(f"median {format_duration(median(steps))}")
    assert facts["Pace"] == (
        f"the GPU sets it: its work takes {format_duration(gpu)} of each {format_duration(median(steps))} "
        f"step, the host's own {format_duration(median(host))} (the host runs ahead, or waits for the GPU)"
    )
    typed = result_of(report)
    pace = json.loads(typed.to_json())["steady_state"]["pace"]
    assert pace == {"set_by": "gpu", "host_us": median(host) / 1000, "gpu_us": gpu / 1000}
    assert json.loads(typed.to_json())["steady_state"]["step_time_us"] == median(steps) / 1000
    for text in (
        TerminalRenderer(width=400).render(typed),
        MarkdownRenderer().render(typed),
        HtmlRenderer(tmp_path).render(typed),
    ):
        assert "the GPU sets it" in text


def test_a_host_the_gpu_waits_for_sets_the_pace(tmp_path: Path) -> None:
    """A serial DataLoader: the host's own 5.1 ms per step against 1 ms of GPU work."""
    from statistics import median

    from traceinsight.render.facts import pace_fact

    loop = dataloader_loop()
    result = analysis_of(tmp_path, loop.events)
    _, steps = _gpu_paced(loop.events)
    assert result.steady.step_ns == median(steps)
    assert result.pace.set_by is not None and result.pace.set_by.value == "host"
    assert result.pace.host_ns == median(round((end - start) * 1000) for start, end in loop.steps)
    text = pace_fact(result_of(Report(result, evaluate(result))))
    assert text is not None and text.startswith("the host sets it")


def test_where_both_sides_agree_no_side_is_named(tmp_path: Path) -> None:
    """The host waits in a sync each step for GPU work as long as its own: neither sets the pace."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(4):
        events += launch(t + 1, t + 11, 1_000)  # 1 ms of GPU work
        events.append(runtime("cudaStreamSynchronize", t + 12, 1_000))  # waits for it
        events.append(cpu_op("aten::host_work", t + 1_012, 1_000))  # then 1 ms of its own
        events.append(annotation(f"ProfilerStep#{step}", t, 2_020))
        t += 2_020
    from traceinsight.render.facts import header_facts

    result = analysis_of(tmp_path, events)
    assert result.pace.set_by is None
    assert "Pace" not in dict(header_facts(result_of(Report(result, evaluate(result)))))


def test_a_gpu_profiler_step_range_ends_its_step(tmp_path: Path) -> None:
    """Work the trace cannot tie to a launch (launched by a thread it did not record) still ends
    the step where Kineto drew the step's range on the GPU row (``gpu_user_annotation``)."""
    events: list[dict[str, Any]] = []
    ends = []
    for step in range(4):
        t = step * 400.0
        events.append(annotation(f"ProfilerStep#{step}", t, 400))
        events += launch(t + 1, max(t + 11, step * 3_000), 50)
        events.append(kernel(step * 3_000 + 100, 2_900))  # its launch is not in the trace
        events.append(
            {"ph": "X", "cat": "gpu_user_annotation", "name": f"ProfilerStep#{step}", "pid": 0, "tid": 7,
             "ts": max(t + 11, step * 3_000), "dur": step * 3_000 + 3_000 - max(t + 11, step * 3_000),
             "args": {}}
        )  # fmt: skip
        ends.append((step * 3_000 + 3_000) * 1000)
    result = analysis_of(tmp_path, events)
    assert [step.done_ns for step in result.steady.steps] == ends
    assert result.steady.step_ns == 3_000_000


def test_a_gpu_profiler_step_range_drawn_over_later_steps_work_does_not_end_them(tmp_path: Path) -> None:
    """The kineto of torch 2.11 drew ProfilerStep#3 on the GPU row over the work of steps 3-6 (an
    H200, tests/data/torch2.11_h200_item_every_step.raw.json.gz): steps 4-6 came out 0 long and the
    median step 0. A drawn range ends its step only up to where a later step's own work starts."""
    events: list[dict[str, Any]] = []
    own_ends = []
    for step in range(4):
        t = step * 1_000.0
        events.append(annotation(f"ProfilerStep#{step}", t, 1_000))
        events += launch(t + 10, t + 20, 300)  # each step's own kernel, launched in its range
        own_ends.append(round((t + 20 + 300) * 1000))
    events.append(
        {"ph": "X", "cat": "gpu_user_annotation", "name": "ProfilerStep#0", "pid": 0, "tid": 7,
         "ts": 19.0, "dur": 3_000.0, "args": {}}
    )  # fmt: skip
    result = analysis_of(tmp_path, events)
    host_ends = [(step + 1) * 1_000_000 for step in range(4)]
    # each step is done when its host range ends (its own kernel ended before), step 0 where the
    # range drawn for it meets step 1's kernel (1,020 µs: what it may cover is step 0's)
    expected = [max(a, b) for a, b in zip(own_ends, host_ends, strict=True)]
    expected[0] = (1_000 + 20) * 1000
    assert [step.done_ns for step in result.steady.steps] == expected
    assert result.steady.step_ns == 1_000_000  # the median of 1.02, 0.98, 1, 1 ms (was 0: three steps 0 long)


# --- one steady step ------------------------------------------------------------------------------


def test_findings_resting_on_one_step_are_flagged(tmp_path: Path) -> None:
    """mi250_rocm_toy's findings came from its first and only steady step (a 6.5 ms first kernel
    launch in a 9.3 ms step) and nothing said so. Counted from the raw ProfilerStep ranges."""
    _, raw = read_events(SAMPLES / "mi250_rocm_toy.json.gz")
    profiler_steps = [
        e
        for e in raw
        if str(e.get("name", "")).startswith("ProfilerStep#") and e.get("cat") == "user_annotation"
    ]
    assert len(profiler_steps) == 2  # the second launched nothing (cut short), so one step is left
    result = report("mi250_rocm_toy.json.gz").analysis
    warning = next(w for w in result.warnings if w.kind == "one-step")
    first = min(profiler_steps, key=lambda e: e["ts"])["name"].removeprefix("ProfilerStep#")
    assert f"step {first}, the first one recorded" in warning.message
    assert "--wait" in warning.advice
    # one steady step after a left-out start-up: flagged, but not as the first one recorded
    later = analysis_of(tmp_path, _steps([20_000, 2_000]))
    assert [step.steady for step in later.steady.steps] == [False, True]
    message = next(w.message for w in later.warnings if w.kind == "one-step")
    assert "step 1)" in message and "first one recorded" not in message
    # two steady steps: nothing to flag
    assert "one-step" not in kinds(analysis_of(tmp_path, _steps([2_000, 2_050])))


@pytest.mark.parametrize("stacks", ["user", "none"])
def test_runs_switch_into_recording_is_not_the_first_steps(stacks: str, tmp_path: Path) -> None:
    """torch opens the first recorded step's range before `run` has switched its own recording on:
    step 3 opened 7.8 ms before its first event (step 4: 0.08 ms) and read as not steady, with advice
    to skip it. In a trace of `run` recording frames, the first step starts at its first event."""
    from tracebuild import annotation, cpu_op, frame

    events: list[dict[str, Any]] = []
    switch_us = 8_000  # the tool's own switch, before step 3's first event
    starts = [0, 1_000 + switch_us, 2_000 + switch_us, 3_000 + switch_us, 4_000 + switch_us]
    for index, start in enumerate(starts):
        first = start + (switch_us if index == 0 else 5)
        events.append(annotation(f"ProfilerStep#{index + 3}", start, first - start + 995))
        events.append(frame("train.py(52): train_step", first, 990, python_id=index + 1))
        events.append(cpu_op("aten::addmm", first + 10, 900))
    record = {"stacks": stacks, "stepMarks": "optimizer"}
    analysis = analyze(
        load_trace(write_trace(tmp_path / "t.json", events, deviceProperties=[], traceinsight=record))
    )
    first = analysis.steady.steps[0]
    if stacks == "user":
        assert first.steady, first.reason
        assert len(analysis.steady.steady_steps) == 5
        assert not [w for w in analysis.warnings if w.kind == "startup-captured"]
    else:  # without frames, nothing shows what ran before the first operator: left as it was
        assert not first.steady
