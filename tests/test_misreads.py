"""The misreads left on real traces (issue 51): each shape built from raw events, or read from a
sample, with the expected figures worked out from the raw events in the test."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from tracebuild import SAMPLES, annotation, cpu_op, kernel, memcpy, runtime, sample_report, write_trace

from traceinsight.analysis import Analysis, analyze
from traceinsight.load import load_trace
from traceinsight.results.contract import result_of
from traceinsight.rules import evaluate
from traceinsight.rules.common import host_caused_idle_ns
from traceinsight.rules.findings import Finding

_correlation = itertools.count(900_000)

#: Rules whose fix is on the host alone: it can free at most the GPU idle the host caused.
HOST_ONLY = frozenset(
    {
        "sync-in-loop",
        "sync-in-forward",
        "latent-sync",
        "dataloader-stall",
        "host-preprocessing",
        "launch-bound",
        "memory-pressure",
        "optimizer-not-fused",
    }
)


def analysis_of(tmp_path: Path, events: list[dict[str, Any]], **top: Any) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events, **top)))


def findings_of(analysis: Analysis, rule: str) -> list[Finding]:
    return [f for f in evaluate(analysis) if f.rule == rule]


def host_late_idle_us(events: list[dict[str, Any]], lo: float, hi: float, device: int = 0) -> float:
    """GPU idle on ``device`` within [lo, hi) that the host caused, from the raw events: each stretch
    with no GPU activity whose next activity's launch call ended after the stretch began (the host
    launched it late); a stretch whose next work was launched before it began was queued."""
    calls = {e["args"]["correlation"]: e for e in events if e.get("cat") == "cuda_runtime"}
    gpu = sorted(
        (e["ts"], e["ts"] + e["dur"], e["args"]["correlation"])
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["pid"] == device
    )
    reach, host = lo, 0.0
    for start, end, correlation in gpu:
        if start > reach:
            call = calls[correlation]
            if call["ts"] + call["dur"] > reach:
                host += min(start, hi) - max(reach, lo)
        reach = max(reach, end)
    return host


# --- 1. no host-side saving above the idle it could free, across streams ------------------------


def cross_stream_loop(steps: int = 6) -> tuple[list[dict[str, Any]], list[tuple[float, float]]]:
    """Each step: a 10 ms kernel on stream 9 (it waits on stream 7's work through an event, so it
    is queued), its result copied to the host (`.cpu()`: a blocking copy and a stream sync), then a
    10 ms kernel on stream 7 that uses it. The GPU is never idle but for the launch after the sync:
    the host sets nothing; removing the sync would let the stream-7 kernel run beside the stream-9
    one only by breaking the dependency the sync stood for."""
    events: list[dict[str, Any]] = []
    windows = []
    t = a_free = b_free = 0.0
    for step in range(steps):
        start = t
        k = next(_correlation)
        kb = max(t + 10, b_free, a_free)
        events += [
            runtime("cudaStreamWaitEvent", t, 2),
            runtime("cudaLaunchKernel", t + 3, 3, correlation=k),
            kernel(kb, 10_000, stream=9, correlation=k),
        ]
        copy_at, k = kb + 10_000, next(_correlation)
        returned = copy_at + 5
        events += [
            cpu_op("aten::item", t + 10, returned + 1 - (t + 10)),
            cpu_op("aten::_local_scalar_dense", t + 10.5, returned + 0.5 - (t + 10)),
            runtime("cudaMemcpyAsync", t + 11, 3, correlation=k),
            memcpy(copy_at, 2, "Memcpy DtoH (Device -> Pageable)", nbytes=4, stream=9, correlation=k),
            runtime("cudaStreamSynchronize", t + 15, returned - (t + 15)),
        ]
        b_free, k = copy_at + 2, next(_correlation)
        events += [
            runtime("cudaLaunchKernel", returned + 5, 3, correlation=k),
            kernel(returned + 15, 10_000, stream=7, correlation=k),
        ]
        a_free = returned + 15 + 10_000
        t = returned + 50
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        windows.append((start, t))
    return events, windows


def test_a_sync_whose_gpu_was_busy_on_another_stream_saves_at_most_the_idle_the_host_caused(
    tmp_path: Path,
) -> None:
    """The replay let the stream-7 kernel start beside the stream-9 one it depends on and said the
    sync saved half of each step (60 ms of 120 ms) while the GPU idled 0.1 ms in all."""
    events, windows = cross_stream_loop()
    analysis = analysis_of(tmp_path, events)
    (finding,) = findings_of(analysis, "sync-in-loop")
    late_ns = round(host_late_idle_us(events, windows[0][0], windows[-1][1]) * 1000)
    assert 0 < late_ns < 200_000
    assert 0 < finding.savings_total_ns <= late_ns
    assert finding.saving_note is not None and "at most the GPU idle the host caused" in finding.saving_note
    assert finding.severity == "low"


SAMPLE_NAMES = sorted(p.name for p in SAMPLES.glob("*.json*"))


@pytest.mark.parametrize("name", SAMPLE_NAMES)
def test_no_host_side_finding_on_a_sample_saves_more_than_the_idle_the_host_caused(name: str) -> None:
    """Over every sample: a host-side card's saving is at most the GPU idle the host caused in the
    steady state, which is at most the device's idle there."""
    report = sample_report(name)
    analysis = report.analysis
    if not any(usage.window_ns for usage in analysis.usage):
        return  # no GPU work: the host is the whole step
    cap = host_caused_idle_ns(analysis)
    assert cap <= max(usage.idle_ns for usage in analysis.usage)
    for finding in report.findings:
        if finding.rule in HOST_ONLY:
            assert finding.savings_total_ns <= cap, (finding.rule, finding.savings_total_ns, cap)


# --- 3. not recorded is not "did not happen" ----------------------------------------------------


def report_of(tmp_path: Path, events: list[dict[str, Any]]) -> Any:
    from traceinsight.results import Report

    analysis = analysis_of(tmp_path, events)
    return Report(analysis=analysis, findings=evaluate(analysis))


def host_loop_with(calls: list[tuple[str, float]]) -> list[dict[str, Any]]:
    """Three steps of host work, each making ``calls`` (name, duration) inside an aten op."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(3):
        start = t
        for name, dur in calls:
            events += [cpu_op("aten::add", t, dur + 2), runtime(name, t + 1, dur)]
            t += dur + 10
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        t += 5
    return events


def test_launches_with_no_gpu_activity_are_records_lost_not_cuda_off(tmp_path: Path) -> None:
    """236 cudaLaunchKernel and 24 cuLaunchKernel over three steps and not one kernel: the GPU's
    records were lost, CUDA was on. The report says how many launches, claims no GPU figure, and
    advises a shorter window, fewer activities or a larger buffer, never ProfilerActivity.CUDA."""
    from traceinsight.render.facts import header_facts
    from traceinsight.render.scorecard import scorecard

    events = host_loop_with([("cudaLaunchKernel", 5)] * 79 + [("cuLaunchKernel", 5)] * 8)
    counts = {
        name: sum(e.get("name") == name for e in events) for name in ("cudaLaunchKernel", "cuLaunchKernel")
    }
    assert counts == {"cudaLaunchKernel": 237, "cuLaunchKernel": 24}
    report = report_of(tmp_path, events)
    (warning,) = (w for w in report.analysis.warnings if w.kind == "gpu-records-lost")
    assert f"{counts['cudaLaunchKernel']:,} cudaLaunchKernel, {counts['cuLaunchKernel']} cuLaunchKernel" in (
        warning.message
    )
    assert "unknown" in warning.message
    assert "shorter window" in warning.advice and "larger buffer" in warning.advice
    assert not report.analysis.has_gpu
    assert all(f.savings_total_ns == 0 for f in report.findings)
    (score,) = (s for s in scorecard(result_of(report)) if s.label == "GPU activity")
    assert "records were lost" in score.verdict and "ProfilerActivity.CUDA" not in score.verdict
    gpu_line = dict(header_facts(result_of(report)))["GPUs"]
    assert "records lost" in gpu_line


def test_cuda_calls_without_any_launch_say_no_gpu_work_ran(tmp_path: Path) -> None:
    """CUDA activity on (runtime calls), no launch and no GPU activity: nothing ran on the GPU."""
    from traceinsight.render.scorecard import scorecard

    events = host_loop_with([("cudaGetDevice", 1), ("cudaStreamIsCapturing", 1)])
    report = report_of(tmp_path, events)
    kinds = [w.kind for w in report.analysis.warnings]
    assert "no-gpu-work" in kinds and "gpu-records-lost" not in kinds
    (warning,) = (w for w in report.analysis.warnings if w.kind == "no-gpu-work")
    assert f"{sum(e['cat'] == 'cuda_runtime' for e in events)} runtime calls" in warning.message
    (score,) = (s for s in scorecard(result_of(report)) if s.label == "GPU activity")
    assert "No GPU work ran" in score.verdict


def test_no_cuda_call_at_all_with_a_gpu_listed_is_cuda_off(tmp_path: Path) -> None:
    """No CUDA runtime call at all and a GPU listed: the profiler was not asked for CUDA."""
    from traceinsight.render.scorecard import scorecard

    events = [e for e in host_loop_with([("cudaGetDevice", 1)]) if e["cat"] != "cuda_runtime"]
    report = report_of(tmp_path, events)
    kinds = [w.kind for w in report.analysis.warnings]
    assert "no-gpu-work" not in kinds and "gpu-records-lost" not in kinds
    (score,) = (s for s in scorecard(result_of(report)) if s.label == "GPU activity")
    assert "ProfilerActivity.CUDA" in score.verdict


# --- 5. silence on the host is not launch overhead ----------------------------------------------


def silent_loop(steps: int = 5, silence_us: float = 18_600) -> list[dict[str, Any]]:
    """Each step: 4 kernels of 200 µs launched back to back, then 18.6 ms in which the host records
    only one 20 µs ``aten::empty`` (a sleep, untraced Python), all inside the script's frame."""
    from tracebuild import frame

    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(steps):
        start = t
        gpu = t + 10
        for _ in range(4):
            k = next(_correlation)
            events += [runtime("cudaLaunchKernel", t, 5, correlation=k), kernel(gpu, 200, correlation=k)]
            t += 8
            gpu += 200
        events.append(cpu_op("aten::empty", gpu + silence_us / 2, 20))
        t = gpu + silence_us
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
    events.append(frame("toy.py(12): main", -5, t + 10, python_id=1))
    return events


def test_a_long_gap_with_nothing_recorded_on_the_host_is_not_launch_overhead(tmp_path: Path) -> None:
    """The 18.6 ms with one 20 µs operator in it read "host launching (Python / launch overhead)":
    it is "nothing recorded on the host", inside the open frame, and no launch-bound card."""
    from traceinsight.analysis.causes import CAUSE_LABELS, CauseKind

    events = silent_loop()
    analysis = analysis_of(tmp_path, events)
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "kernel")
    silences = [(a[1], b[0]) for a, b in itertools.pairwise(kernels) if b[0] - a[1] > 1000]
    assert len(silences) == 4
    gaps = [g for g in analysis.idle_gaps if g.end_ns - g.start_ns > 1_000_000]
    origin = analysis.meta.origin_ns  # gaps count from the trace's earliest event
    assert (
        sorted((g.start_ns + origin, g.end_ns + origin) for g in gaps)[: len(silences)]
        == [(round(a * 1000), round(b * 1000)) for a, b in silences][: len(gaps)]
    )
    for gap in gaps:
        if gap.cause_kind != CauseKind.OUTSIDE_STEADY.value:
            assert gap.cause_kind == CauseKind.UNTRACED.value
            assert gap.cause.startswith("nothing recorded on the host, inside toy.py(12): main")
    (usage,) = analysis.usage
    idle = dict(usage.idle)
    assert CauseKind.LAUNCH not in idle or idle[CauseKind.LAUNCH] < 0.05 * usage.window_ns
    assert idle[CauseKind.UNTRACED] == round(sum(b - a for a, b in silences) * 1000)
    assert CAUSE_LABELS[CauseKind.UNTRACED] == "nothing recorded on the host"
    assert not findings_of(analysis, "launch-bound")


# --- 2. the allocator's time is the allocator's ------------------------------------------------


def allocator_loop(steps: int = 6) -> list[dict[str, Any]]:
    """Each step: a 300 µs kernel, then ``aten::cudnn_convolution`` whose three cudaMalloc calls
    (1 ms each) run before it launches its own kernel: the GPU waits 3 ms in an operator, all of
    it in the allocator."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(steps):
        start = t
        k = next(_correlation)
        events += [runtime("cudaLaunchKernel", t, 5, correlation=k), kernel(t + 10, 300, correlation=k)]
        op_start = t + 320
        events.append(cpu_op("aten::cudnn_convolution", op_start, 3040))
        for index in range(3):
            events.append(runtime("cudaMalloc", op_start + 5 + index * 1005, 1000))
        k = next(_correlation)
        launch_at = op_start + 3025
        events += [
            runtime("cudaLaunchKernel", launch_at, 5, correlation=k),
            kernel(launch_at + 10, 300, correlation=k, name="cudnn_conv_kernel"),
        ]
        t = launch_at + 320
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
    return events


def test_cuda_malloc_inside_an_operator_is_the_allocators_time_not_the_operators(tmp_path: Path) -> None:
    """The gap before each convolution kernel is 3 cudaMalloc calls: cause ``allocator`` (not
    "host busy in an operator" with advice to move work into a Dataset), its idle the raw gaps,
    and the memory card replays them on its own."""
    from traceinsight.analysis.causes import CauseKind

    events = allocator_loop()
    analysis = analysis_of(tmp_path, events)
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "kernel")
    mallocs = [(e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "cudaMalloc"]
    gaps = [(a[1], b[0]) for a, b in itertools.pairwise(kernels)]
    allocator_gaps = [(a, b) for a, b in gaps if any(a <= m0 and m1 <= b for m0, m1 in mallocs)]
    assert len(allocator_gaps) == 6
    found = [g for g in analysis.idle_gaps if g.cause_kind == CauseKind.ALLOCATOR.value]
    origin = analysis.meta.origin_ns  # gaps count from the trace's earliest event
    assert sorted((g.start_ns + origin, g.end_ns + origin) for g in found) == [
        (round(a * 1000), round(b * 1000)) for a, b in allocator_gaps
    ]
    assert all(
        g.cause.startswith("cudaMalloc and 2 more allocator calls in aten::cudnn_convolution") for g in found
    )
    (usage,) = analysis.usage
    steady = {(g.start_ns, g.end_ns) for g in found if g.cause_kind == CauseKind.ALLOCATOR.value}
    assert dict(usage.idle)[CauseKind.ALLOCATOR] <= sum(b - a for a, b in steady)
    assert CauseKind.HOST_OP not in dict(usage.idle)
    findings = evaluate(analysis)
    assert not [f for f in findings if "Dataset" in f.advice.summary]
    (memory,) = (f for f in findings if f.rule == "memory-pressure")
    assert memory.savings_total_ns > 0


def test_the_alexnet_benchmarks_cuda_malloc_gaps_are_the_allocators() -> None:
    """a100 AlexNet: gaps in the steady window that cudaMalloc/cudaFree calls cover are the
    allocator's; no such gap is named for the convolution or addmm around the calls, and the
    allocator's idle is at most the calls' own host time (from the raw events)."""
    from traceinsight.analysis.causes import CauseKind

    name = "a100_alexnet_cuda_sync.json.gz"
    report = sample_report(name)
    from tracebuild import read_events

    raw = [e for e in read_events(SAMPLES / name)[1] if e.get("ph") == "X"]
    warmup_end = max(e["ts"] + e["dur"] for e in raw if "warmup" in e["name"])
    gpu_end = max(e["ts"] + e["dur"] for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    calls = [e for e in raw if e["name"] in ("cudaMalloc", "cudaFree") and warmup_end <= e["ts"] < gpu_end]
    assert len({e["tid"] for e in raw if e.get("cat") == "cuda_runtime"}) == 1
    (usage,) = report.analysis.usage
    allocator_ns = dict(usage.idle).get(CauseKind.ALLOCATOR, 0)
    assert 0 < allocator_ns <= round(sum(e["dur"] for e in calls) * 1000)
    origin = report.analysis.meta.origin_ns  # gaps count from the trace's earliest event
    steady_gaps = [g for g in report.analysis.idle_gaps if g.start_ns + origin >= warmup_end * 1000]
    covered = {
        (g.start_ns, g.end_ns): sum(
            max(
                0.0,
                min((g.end_ns + origin) / 1000, e["ts"] + e["dur"])
                - max((g.start_ns + origin) / 1000, e["ts"]),
            )
            for e in calls  # one launching thread in this benchmark (asserted above)
        )
        for g in steady_gaps
    }
    in_allocator = [
        g for g in steady_gaps if covered[(g.start_ns, g.end_ns)] * 1000 >= 0.5 * (g.end_ns - g.start_ns)
    ]
    assert in_allocator
    for gap in in_allocator:
        assert gap.cause_kind == CauseKind.ALLOCATOR.value, gap
        assert gap.cause.split(" ")[0] in ("cudaMalloc", "cudaFree")


# --- 6. request-driven traces -------------------------------------------------------------------


def request_server(requests: int = 8, *, ranges: bool = True) -> list[dict[str, Any]]:
    """A server with no step markers. Each ``handle_request``: 1.5 ms of ``tokenize`` on the host,
    40 kernels of 20 µs launched 8 µs apart, a blocking ``.cpu()`` of the answer; then 2-2.5 ms with
    nothing recorded until the next request arrives. ``ranges=False``: no ``handle_request`` range
    (nor any other ``record_function``)."""
    events: list[dict[str, Any]] = []
    t = 0.0
    gpu_free = 0.0
    for index in range(requests):
        start = t
        events.append(cpu_op("tokenize", t + 2, 1500))
        t += 1510
        for _ in range(40):
            k = next(_correlation)
            begin = max(t + 10, gpu_free)
            events += [runtime("cudaLaunchKernel", t, 5, correlation=k), kernel(begin, 20, correlation=k)]
            gpu_free = begin + 20
            t += 8
        k = next(_correlation)
        copy_at = max(t + 12, gpu_free)
        returned = copy_at + 2 + 3
        events += [
            cpu_op("aten::to", t, returned + 2 - t),
            cpu_op("aten::_to_copy", t + 0.5, returned + 1 - t),
            cpu_op("aten::copy_", t + 1, returned - t),
            runtime("cudaMemcpyAsync", t + 2, returned - t - 2, correlation=k),
            memcpy(copy_at, 2, "Memcpy DtoH (Device -> Pageable)", nbytes=64, correlation=k),
        ]
        gpu_free = copy_at + 2
        t = returned + 5
        if ranges:
            events.append(annotation("handle_request", start, t - start))
        t += 2000 + 500 * (index % 2)  # waiting for the next request: nothing recorded
    return events


def test_a_request_server_without_step_markers_is_judged_per_request(tmp_path: Path) -> None:
    """Each request is a step; the time between requests is waiting for work, in no window and no
    finding; the blocking `.cpu()` at a request's end saves nothing (the next request does not come
    sooner); ``tokenize`` is named as the host work before each request's first GPU work; and no
    card calls the server launch-bound."""
    from traceinsight.analysis.causes import CauseKind

    events = request_server()
    analysis = analysis_of(tmp_path, events)
    ranges = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("name") == "handle_request")
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e.get("cat") in ("kernel", "gpu_memcpy"))
    assert analysis.steady.source == "request"
    assert analysis.steady.request_name == "handle_request"
    assert len(analysis.steady.steps) == len(ranges)
    # the waiting time: from each steady request's end (its range and its GPU work) to the next start
    steady = {step.start_ns for step in analysis.steady.steady_steps}
    done = [max(b, max(g1 for g0, g1 in gpu if a <= g0 < b)) for a, b in ranges]
    waiting_us = sum(
        ranges[i + 1][0] - done[i]
        for i in range(len(ranges) - 1)
        if round(ranges[i][0] * 1000) in steady and round(ranges[i + 1][0] * 1000) in steady
    )
    assert analysis.steady.waiting_ns == round(waiting_us * 1000)
    (usage,) = analysis.usage
    assert CauseKind.WAITING not in dict(usage.idle)
    device_idle = dict(analysis.devices[0].idle_by_cause_ns)
    assert device_idle[CauseKind.WAITING.value] == round(waiting_us * 1000)
    # the window is the requests themselves: their lengths summed
    assert usage.window_ns == sum(step.duration_ns for step in analysis.steady.steady_steps)
    findings = evaluate(analysis)
    for finding in findings:
        if finding.rule in ("sync-in-loop", "sync-in-forward"):
            assert finding.minor and finding.savings_total_ns < 0.01 * usage.window_ns
    assert not [f for f in findings if f.rule == "launch-bound"]
    assert "tokenize" in [name for name, _ in analysis.step_leads.ops]
    idle = dict(usage.idle)
    assert idle.get(CauseKind.LAUNCH, 0) < 0.01 * usage.window_ns
    assert {g.cause for g in analysis.idle_gaps if g.cause_kind == CauseKind.HOST_OP.value} == {"tokenize"}
    kinds = [w.kind for w in analysis.warnings]
    assert "steps-from-requests" in kinds and "no-steps" not in kinds


def test_a_request_server_without_any_range_is_cut_into_requests_by_its_host_pattern(tmp_path: Path) -> None:
    """The same server with no ``record_function`` range at all: the host's repeating top-level
    pattern (``tokenize``, launches, the ``.cpu()``, then a silence with nothing recorded and the GPU
    idle) is taken as the requests. Each request's host range, the waiting between them, and the
    saving of the end-of-request sync are checked against the raw events."""
    from traceinsight.analysis.causes import CauseKind

    events = request_server(ranges=False)
    assert not [e for e in events if e["cat"] == "user_annotation"]
    analysis = analysis_of(tmp_path, events)
    host = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] in ("cpu_op", "cuda_runtime"))
    gpu = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] in ("kernel", "gpu_memcpy"))
    # the requests from the raw events: host activity cut at silences of 1 ms or more
    pieces: list[list[float]] = []
    for start, end in host:
        if pieces and start - pieces[-1][1] < 1000:
            pieces[-1][1] = max(pieces[-1][1], end)
        else:
            pieces.append([start, end])
    assert len(pieces) == 8
    steady = analysis.steady
    assert steady.source == "request" and steady.request_from_pattern
    assert steady.request_name == "tokenize"
    assert [(s.start_ns, s.end_ns) for s in steady.steps] == [
        (round(a * 1000), round(b * 1000)) for a, b in pieces
    ]
    done = [max(b, max(g1 for g0, g1 in gpu if a <= g0 < b + 100)) for a, b in pieces]
    kept = {step.start_ns for step in steady.steady_steps}
    waiting_us = sum(
        pieces[i + 1][0] - done[i]
        for i in range(len(pieces) - 1)
        if round(pieces[i][0] * 1000) in kept and round(pieces[i + 1][0] * 1000) in kept
    )
    assert waiting_us > 0.4 * sum(b - a for a, b in pieces)  # the silences are a large part of the time
    assert steady.waiting_ns == round(waiting_us * 1000)
    device_idle = dict(analysis.devices[0].idle_by_cause_ns)
    assert device_idle[CauseKind.WAITING.value] == round(waiting_us * 1000)
    (usage,) = analysis.usage
    assert CauseKind.WAITING not in dict(usage.idle)
    assert dict(usage.idle).get(CauseKind.LAUNCH, 0) < 0.01 * usage.window_ns
    findings = evaluate(analysis)
    syncs = [f for f in findings if f.rule in ("sync-in-loop", "sync-in-forward")]
    for finding in syncs:
        assert finding.minor and finding.savings_total_ns < 0.01 * usage.window_ns
    assert not [f for f in findings if f.rule == "launch-bound"]
    assert "tokenize" in [name for name, _ in analysis.step_leads.ops]
    (warning,) = (w for w in analysis.warnings if w.kind == "steps-from-requests")
    assert "`tokenize`" in warning.message and "8 times" in warning.message


def test_a_training_loop_with_untraced_pauses_is_not_taken_for_requests(tmp_path: Path) -> None:
    """The same shape with a backward operator in each piece is a training loop: its silences are
    its own untraced work, so no requests are made of it (the trace is judged as one window)."""
    events = request_server(ranges=False)
    tokenizes = [e for e in events if e["name"] == "tokenize"]
    for op in tokenizes:
        events.append(cpu_op("autograd::engine::evaluate_function: MmBackward0", op["ts"] + 10, 100))
    analysis = analysis_of(tmp_path, events)
    assert analysis.steady.source == "none" and not analysis.steady.request_from_pattern


def test_pieces_that_begin_differently_are_not_a_request_pattern(tmp_path: Path) -> None:
    """Silences alone are not enough: when the pieces do not all begin with the same operator, the
    trace is left as one window."""
    events = request_server(ranges=False)
    second = [e for e in events if e["name"] == "tokenize"][1]
    second["name"] = "detokenize"
    analysis = analysis_of(tmp_path, events)
    assert analysis.steady.source == "none"


# --- 4. a window of first calls claims nothing --------------------------------------------------


def cold_pass(passes: int = 1) -> list[dict[str, Any]]:
    """``passes`` inference passes, no step markers: 4 kernels with names of their own; in the first
    pass each launch call takes 4-9 ms (a kernel's first launch loads its code), later 5 µs."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for index in range(passes):
        for number, slow in enumerate((4000, 6000, 9000, 5000)):
            k = next(_correlation)
            call = slow if index == 0 else 5
            events += [
                cpu_op("aten::conv2d", t, call + 20),
                runtime("cudaLaunchKernel", t + 5, call, correlation=k),
                kernel(t + 5 + call + 10, 300, correlation=k, name=f"conv_kernel_{number}"),
            ]
            t += call + 400
    return events


def test_a_cold_single_pass_claims_no_saving(tmp_path: Path) -> None:
    """One cold pass: every kernel is its name's first, and 24 ms of its window are launch calls
    loading code; the GPU is 95 % idle, but no card claims a saving, and a warning says why."""
    events = cold_pass()
    analysis = analysis_of(tmp_path, events)
    kernels = [e for e in events if e["cat"] == "kernel"]
    assert len({e["name"] for e in kernels}) == len(kernels) == 4
    slow = [e for e in events if e.get("name") == "cudaLaunchKernel" and e["dur"] >= 1000]
    (warning,) = (w for w in analysis.warnings if w.kind == "first-calls-only")
    assert "4 of its 4 kernels" in warning.message
    assert f"{len(slow)} first launches took {sum(e['dur'] for e in slow) / 1000:.2f} ms" in warning.message
    assert "warm" in warning.advice
    findings = evaluate(analysis)
    assert findings
    assert all(f.savings_total_ns == 0 and not f.saving_known and f.severity == "low" for f in findings)


def test_the_same_pass_warm_is_judged_as_usual(tmp_path: Path) -> None:
    """Five passes of the same kernels: after the start-up, no window of first calls."""
    analysis = analysis_of(tmp_path, cold_pass(passes=5))
    assert "first-calls-only" not in [w.kind for w in analysis.warnings]


# --- 7. one-step preprocessing ----------------------------------------------------------------


def test_one_steady_step_spent_mostly_preparing_on_the_host_gets_its_card(tmp_path: Path) -> None:
    """A video model's one step: 217 ms decoding before the GPU's first work, 165 ms of kernels.
    host-preprocessing fires on the one step (57 % ≥ 30 %), its idle before the first work from the
    raw events, with the one-step caveat."""
    from loops import preprocessing_loop

    loop = preprocessing_loop(steps=1)
    analysis = analysis_of(tmp_path, loop.events)
    (step_start, step_end) = loop.steps[0]
    first_kernel = min(e["ts"] for e in loop.events if e["cat"] == "kernel")
    lead_us = first_kernel - step_start
    assert lead_us / (step_end - step_start) >= 0.3
    (finding,) = findings_of(analysis, "host-preprocessing")
    evidence = dict(finding.evidence)
    assert evidence["steps"].startswith("one steady step only")
    assert finding.saving_note is not None and "from one step" in finding.saving_note
    leads = analysis.step_leads
    first_launch = min(e["ts"] for e in loop.events if e.get("name") == "cudaLaunchKernel")
    assert [lead[:2] for lead in leads.leads] == [(round(step_start * 1000), round(first_launch * 1000))]
    assert "aten::upsample_bilinear2d" in [name for name, _ in leads.ops]
    assert finding.savings_total_ns <= round(lead_us * 1000)


def test_one_step_with_a_short_preparation_gets_no_card(tmp_path: Path) -> None:
    """The same step preparing for 20 % of it: one step is not evidence enough."""
    from loops import preprocessing_loop

    loop = preprocessing_loop(steps=1, prep_us=41_000)
    (step_start, step_end) = loop.steps[0]
    first_kernel = min(e["ts"] for e in loop.events if e["cat"] == "kernel")
    assert 0.1 < (first_kernel - step_start) / (step_end - step_start) < 0.3
    assert not findings_of(analysis_of(tmp_path, loop.events), "host-preprocessing")


def test_one_step_whose_wait_is_an_operators_own_first_launch_gets_no_preprocessing_card() -> None:
    """a100 item/event sync: one step, 89 % of it before the GPU's first work, most of that inside
    ``aten::ones``, which launches that first work itself (its first call's set-up, from the raw
    events): not preparing the step, so no host-preprocessing card."""
    from tracebuild import read_events

    name = "a100_item_event_sync.json.gz"
    raw = [e for e in read_events(SAMPLES / name)[1] if e.get("ph") == "X"]
    first_kernel = min(e["ts"] for e in raw if e.get("cat") == "kernel")
    (ones,) = [
        e for e in raw if e["name"] == "aten::ones" and e["ts"] < first_kernel <= e["ts"] + e["dur"] + 50
    ]
    launch = min(e["ts"] for e in raw if e["name"] == "cudaLaunchKernel")
    assert ones["ts"] <= launch <= ones["ts"] + ones["dur"]
    report = sample_report(name)
    assert not [f for f in report.findings if f.rule == "host-preprocessing"]
    assert report.analysis.step_leads.in_launching_op_ns >= round((launch - ones["ts"]) * 1000) - 1000


# --- 8. the smaller items ---------------------------------------------------------------------


def test_an_amd_gpu_is_named_by_its_gfx_architecture_not_a_compute_capability() -> None:
    """mi250_rocm_toy: deviceProperties say computeMajor 9, computeMinor 0 and a 64-wide wavefront
    (read here from the raw file): an AMD gfx9.0 GPU (gfx90a/gfx908), with compute units."""
    from tracebuild import read_events

    from traceinsight.render.facts import header_facts

    top, _ = read_events(SAMPLES / "mi250_rocm_toy.json.gz")
    assert top is not None
    props = {p["id"]: p for p in top["deviceProperties"]}
    report = sample_report("mi250_rocm_toy.json.gz")
    (device,) = report.analysis.meta.devices
    raw = props[device.index]
    assert (raw["computeMajor"], raw["computeMinor"], raw["warpSize"]) == (9, 0, 64)
    line = dict(header_facts(result_of(report)))["GPU"]
    assert "compute capability" not in line
    assert f"gfx90a or gfx908 (MI200 or MI100), {raw['numSms']} CUs" in line


def test_the_only_listed_device_is_the_gpu_in_use_under_another_index(tmp_path: Path) -> None:
    """deviceProperties lists one GPU (id 0, named), the work runs on device 2: that GPU is the
    listed one, named, with a note of the index it was listed under."""
    from traceinsight.render.facts import header_facts
    from traceinsight.results import Report

    props = [
        {"id": 0, "name": "AMD Instinct MI300X", "totalGlobalMem": 206141652992, "computeMajor": 9,
         "computeMinor": 4, "numSms": 304, "warpSize": 64},
    ]  # fmt: skip
    events = []
    for index in range(3):
        k = next(_correlation)
        events += [
            runtime("hipLaunchKernel", index * 100.0, 5, correlation=k),
            kernel(index * 100.0 + 10, 50, device=2, stream=3, correlation=k),
        ]
    analysis = analyze(load_trace(write_trace(tmp_path / "t.json", events, deviceProperties=props)))
    (device,) = analysis.meta.devices
    assert (device.index, device.listed_as, device.name) == (2, 0, "AMD Instinct MI300X")
    line = dict(header_facts(result_of(Report(analysis=analysis, findings=evaluate(analysis)))))["GPU"]
    assert line.startswith("2: AMD Instinct MI300X (gfx942 (MI300), 304 CUs") and "listed as device 0" in line


def test_a_graph_break_between_compiled_regions_is_named(tmp_path: Path) -> None:
    """Each step: compiled region 0/0 launches 5 kernels, then 2 ms of eager host work (the graph
    break), then region 1/0 launches 5 more. The gap between them names the break and both
    regions; its length is the raw gap between the two regions' kernels."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(4):
        start = t
        for region, length in (("Torch-Compiled Region: 0/0", 100.0), ("Torch-Compiled Region: 1/0", 100.0)):
            events.append(annotation(region, t, length))
            for index in range(5):
                k = next(_correlation)
                events += [
                    runtime("cudaLaunchKernel", t + 2 + index * 10, 5, correlation=k),
                    kernel(t + 12 + index * 10, 8, correlation=k),
                ]
            t += length
            if region.endswith("0/0"):
                events.append(cpu_op("aten::nonzero", t + 5, 2000))
                t += 2010
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        t += 20
    analysis = analysis_of(tmp_path, events)
    origin = analysis.meta.origin_ns
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "kernel")
    breaks = [(a[1], b[0]) for a, b in itertools.pairwise(kernels) if b[0] - a[1] > 1000]
    named = [g for g in analysis.idle_gaps if "graph break" in g.cause]
    assert len(named) == len(breaks) == 4
    for gap in named:
        assert "(Torch-Compiled Region: 0/0 → Torch-Compiled Region: 1/0)" in gap.cause
        assert (gap.start_ns + origin, gap.end_ns + origin) in [
            (round(a * 1000), round(b * 1000)) for a, b in breaks
        ]


def test_a_first_copy_waiting_on_work_from_before_the_profiler_is_not_start_up(tmp_path: Path) -> None:
    """No steps. The GPU is busy at the trace's start with work queued before the profiler (no
    launch recorded); the first ``aten::copy_`` waits for it inside ``hipMemcpyWithStream`` (15 ms,
    later calls 30 µs). Its length is the wait, not a first call's set-up: no start-up is cut."""
    events: list[dict[str, Any]] = [kernel(0, 15_000, correlation=1)]  # launched before recording
    t = 10.0
    for index in range(6):
        k = next(_correlation)
        wait = 15_000 - t if index == 0 else 20
        events += [
            cpu_op("aten::copy_", t, wait + 10),
            runtime("hipMemcpyWithStream", t + 2, wait + 5, correlation=k),
            memcpy(t + wait + 1, 4, "Memcpy DtoH (Device -> Host)", correlation=k),
        ]
        t += wait + 20
        for _ in range(3):
            events += launch_pair(t)
            t += 40
    first = events[1]
    assert first["dur"] >= 100 * events[4]["dur"]
    analysis = analysis_of(tmp_path, events)
    assert analysis.steady.startup_end_ns is None
    assert "startup-captured" not in [w.kind for w in analysis.warnings]


def launch_pair(t: float) -> list[dict[str, Any]]:
    """A hipLaunchKernel at ``t`` and its 20 µs kernel 10 µs later."""
    k = next(_correlation)
    return [runtime("hipLaunchKernel", t, 5, correlation=k), kernel(t + 10, 20, correlation=k)]
