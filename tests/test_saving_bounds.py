"""No saving above what it frees, and evidence in the saving's unit.

Each test builds a loop whose saving can be worked out from its raw events, and pins the figure the
card must show: allocator calls after the GPU's last work (teardown) are not churn; a DataLoader
loop whose steps vary never reads above 100 %; a pageable batch copy with no kernel under it saves
the copy moved under compute at a pinned copy's speed; a sync card's rows agree with its saving.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pytest
from loops import LAUNCH_LATENCY, Loop, copy_loop, dataloader_loop
from tracebuild import SAMPLES, annotation, cpu_op, kernel, runtime, sample_report, write_trace

from traceinsight.analysis import Analysis, analyze
from traceinsight.formatting import format_duration
from traceinsight.load import load_trace
from traceinsight.rules import evaluate
from traceinsight.rules.findings import Finding

PAGEABLE = "Memcpy HtoD (Pageable -> Device)"
PINNED = "Memcpy HtoD (Pinned -> Device)"


def analysis_of(tmp_path: Path, events: list[dict[str, Any]]) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events)))


def one(analysis: Analysis, rule: str) -> Finding:
    (finding,) = (f for f in evaluate(analysis) if f.rule == rule)
    return finding


def ns(us: float) -> int:
    return round(us * 1000)


def gpu_events(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy")]


def recorded_window_us(loop: Loop) -> float:
    """A window of steps as recorded: from the first step's start to the later of the last step's
    end and the GPU's last end."""
    last_gpu = max(e["ts"] + e["dur"] for e in gpu_events(loop.events))
    return max(loop.steps[-1][1], last_gpu) - loop.steps[0][0]


# --- memory-pressure: teardown is not churn ------------------------------------------------------


def test_allocator_calls_after_the_gpus_last_work_are_teardown_not_churn(tmp_path: Path) -> None:
    """No steps: 8 times, a 50 µs kernel then a 1 ms cudaMalloc before the next launch (the GPU
    waits for each); after the last kernel, 10 cudaFree of 2 ms and a synchronize (teardown). The
    card once counted all 18 calls and replayed the host's teardown as saved time, more than the
    whole time analyzed. Only the 8 calls while the GPU has work count, and without them the host
    launches faster than the kernels run: they run back to back, and the saving is the GPU's span
    minus its kernels."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for index in range(8):
        correlation = 70_000 + index
        events += [
            runtime("cudaLaunchKernel", t, 3, correlation=correlation),
            kernel(t + LAUNCH_LATENCY, 50, correlation=correlation),
            runtime("cudaMalloc", t + 15, 1000),
        ]
        t += 1020
    teardown = t + 100
    for index in range(10):
        events.append(runtime("cudaFree", teardown + index * 2010, 2000))
    events.append(runtime("cudaDeviceSynchronize", teardown + 10 * 2010, 10))

    analysis = analysis_of(tmp_path, events)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    first, last = min(e["ts"] for e in kernels), max(e["ts"] + e["dur"] for e in kernels)
    during = [e for e in events if e.get("name") in ("cudaMalloc", "cudaFree") and first <= e["ts"] < last]
    after = [e for e in events if e.get("name") == "cudaFree" and e["ts"] >= last]
    assert (len(during), len(after)) == (8, 10)

    finding = one(analysis, "memory-pressure")
    evidence = dict(finding.evidence)
    assert evidence["allocator calls in the steady state"] == "8 (cudaMalloc 8)"
    assert analysis.memory.allocator_calls.host_ns == ns(sum(e["dur"] for e in during))
    span_us = last - first
    busy_us = sum(e["dur"] for e in kernels)
    assert finding.savings_total_ns == pytest.approx(ns(span_us - busy_us), rel=0.01)
    assert finding.saving_share == pytest.approx((span_us - busy_us) / span_us, rel=0.01)
    assert finding.saving_share is not None and finding.saving_share <= 1


def test_allocator_churn_on_the_alexnet_benchmark_stops_at_the_gpus_last_work() -> None:
    """a100 AlexNet (PARAM): the card said 16 calls, 52.91 ms of host time, saving 64 % of the time
    analyzed; 10 of the 11 cudaFree come after the GPU's last work (the benchmark's teardown). The
    window runs from the end of the last warm-up range to the GPU's last end (from the raw JSON)."""
    name = "a100_alexnet_cuda_sync.json.gz"
    report = sample_report(name)
    raw = [e for e in load_raw(name) if e.get("ph") == "X"]
    warmup_end = max(e["ts"] + e["dur"] for e in raw if "warmup" in e["name"])
    gpu_end = max(e["ts"] + e["dur"] for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset"))
    calls = [e for e in raw if e["name"] in ("cudaMalloc", "cudaFree") and warmup_end <= e["ts"] < gpu_end]
    teardown = [e for e in raw if e["name"] == "cudaFree" and e["ts"] >= gpu_end]
    assert len(teardown) == 10
    mallocs = sum(e["name"] == "cudaMalloc" for e in calls)
    finding = next(f for f in report.findings if f.rule == "memory-pressure")
    assert dict(finding.evidence)["allocator calls in the steady state"] == (
        f"{len(calls)} (cudaMalloc {mallocs}, cudaFree {len(calls) - mallocs})"
    )
    assert report.analysis.memory.allocator_calls.host_ns == ns(sum(e["dur"] for e in calls))
    # what it frees is GPU idle inside the window: at most the window less the GPU's busy time
    kernels = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in raw
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and e["ts"] + e["dur"] > warmup_end
    )
    busy = union_us([(max(a, warmup_end), b) for a, b in kernels])
    idle = gpu_end - warmup_end - busy
    assert 0 < finding.savings_total_ns <= ns(idle)
    assert finding.saving_share == pytest.approx(
        finding.savings_total_ns / ns(gpu_end - warmup_end), rel=0.001
    )


def load_raw(name: str) -> list[dict[str, Any]]:
    from tracebuild import read_events

    return read_events(SAMPLES / name)[1]


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, reach = 0.0, -math.inf
    for start, end in sorted(intervals):
        if end <= reach:
            continue
        total += end - max(start, reach)
        reach = end
    return total


# --- dataloader-stall: a share of the step is at most the step ---------------------------------


def test_a_dataloader_bound_loop_whose_steps_vary_saves_at_most_its_steps(tmp_path: Path) -> None:
    """Nine steps waiting 4.98 ms and 14.9 ms in turn for a serial DataLoader (no step is 3x the
    5 ms median, so all are steady), 0.2 ms of GPU work each. With every batch ready (handed over
    in 1 ms) each wait loses all but 1 ms and the host stays the bottleneck: the saving is the sum
    of (wait - 1 ms), 8.39 ms per step. Its share was taken of the median step (5 ms): 168 %. It
    is a share of the steps it was measured on (the recorded window)."""
    waits = [4980.0, 14900.0] * 4 + [4980.0]
    loop = dataloader_loop(waits_us=waits, kernels=2, kernel_us=100)
    analysis = analysis_of(tmp_path, loop.events)
    assert len(analysis.steady.steady_steps) == len(waits)
    finding = one(analysis, "dataloader-stall")
    handover = analysis.thresholds.dataloader_handover_us
    saved_us = sum(wait - handover for wait in waits)
    assert finding.savings_total_ns == pytest.approx(ns(saved_us), rel=0.001)
    assert finding.savings_per_step_ns == pytest.approx(ns(saved_us / len(waits)), rel=0.001)
    assert finding.saving_share == pytest.approx(saved_us / recorded_window_us(loop), rel=0.001)
    assert finding.saving_share is not None and finding.saving_share < 1
    shown = int(finding.title.split("per step (")[1].split("%")[0])
    assert shown <= 100


# --- pageable-memcpy: the copy moves under compute at a pinned copy's speed ----------------------


def test_a_pageable_batch_copy_with_no_kernel_under_it_saves_the_copy(tmp_path: Path) -> None:
    """Each step copies a 25.6 MB batch from pageable memory: 6.4 ms on the compute stream with no
    kernel under it (35 % of the GPU's time), the host blocked until it ends; then 12 ms of kernels.
    The card read "low": the replay kept the copy slow and on the compute stream. Pinned, it is
    queued at once on a stream of its own, at the assumed 12 GB/s (2.13 ms, under the 12 ms of
    compute; the trace has no pinned copy to measure): the kernels run back to back and each step
    loses its 6.4 ms copy and the host's waits."""
    steps = 6
    loop = copy_loop(kind=PAGEABLE, steps=steps, copy_us=6400, nbytes=25_600_000, kernels=10, kernel_us=1200)
    analysis = analysis_of(tmp_path, loop.events)
    copies = [e for e in loop.events if e.get("name") == PAGEABLE]
    kernels = [e for e in loop.events if e.get("cat") == "kernel"]
    copy_us = sum(e["dur"] for e in copies)
    compute_us = sum(e["dur"] for e in kernels)
    assert copy_us / (copy_us + compute_us) == pytest.approx(0.35, abs=0.01)
    pinned_us = max(e["args"]["bytes"] for e in copies) / 12_000  # 12 GB/s = 12,000 bytes per µs
    assert pinned_us < compute_us / steps

    finding = one(analysis, "pageable-memcpy")
    fixed_us = compute_us  # the compute stream back to back, the copies under it
    expected_us = recorded_window_us(loop) - fixed_us
    assert finding.savings_total_ns == pytest.approx(ns(expected_us), rel=0.005)
    assert finding.savings_per_step_ns == pytest.approx(ns(copy_us / steps), rel=0.01)
    assert finding.severity == "high"
    assert finding.saving_note is not None and "at 12 GB/s (assumed" in finding.saving_note
    evidence = dict(finding.evidence)
    assert evidence[PAGEABLE] == (
        f"every step, 24.4 MiB per step, {format_duration(ns(copy_us / steps))} per step on the GPU, "
        "0% under compute"
    )


def test_a_pageable_copy_replays_at_the_traces_own_pinned_rate(tmp_path: Path) -> None:
    """The same loop with 2 ms of compute per step and an 8 ms copy of 32 MB, and beside each
    step's first kernel a pinned copy of 4 MiB at 10 GB/s: the trace's own pinned rate. Pinned, the
    batch copy takes 32 MB / 10 GB/s = 3.2 ms, longer than the compute: the copies, one after the
    other on their stream, set the pace, and the replayed window is six of them."""
    steps = 6
    loop = copy_loop(
        kind=PAGEABLE,
        steps=steps,
        copy_us=8000,
        nbytes=32_000_000,
        kernels=10,
        kernel_us=200,
        pinned_beside=(4_194_304, 419.4304),
    )
    analysis = analysis_of(tmp_path, loop.events)
    pinned = [e for e in loop.events if e.get("name") == PINNED]
    rate = sum(e["args"]["bytes"] for e in pinned) / sum(e["dur"] for e in pinned)  # bytes per µs
    assert rate == pytest.approx(10_000)
    batch = [e for e in loop.events if e.get("name") == PAGEABLE]
    pinned_us = sum(e["args"]["bytes"] / rate for e in batch)
    first_copy = min(e["ts"] for e in batch)  # it starts where it did: nothing before it changes

    finding = one(analysis, "pageable-memcpy")
    expected_us = recorded_window_us(loop) - (first_copy - loop.steps[0][0] + pinned_us)
    assert finding.savings_total_ns == pytest.approx(ns(expected_us), rel=0.002)
    assert finding.saving_note is not None and "at 10 GB/s (the rate of this trace's own pinned copies)" in (
        finding.saving_note
    )


# --- sync-in-loop: the rows agree with the saving ----------------------------------------------


def sync_then_host_work_loop(steps: int = 6) -> Loop:
    """Each step launches a 1 ms kernel, prepares for 700 µs in an operator, synchronizes (waiting
    the kernel's last 0.3 ms), runs 800 µs of host work in another operator, launches a 100 µs
    kernel and prepares the next step for 200 µs. The gap after the sync is the second operator's
    (the sync waited far less than it), so no idle is the sync's own; yet without the wait all the
    host did next comes 0.3 ms earlier, and so does the GPU's next work."""
    loop = Loop()
    t = 0.0
    for step in range(steps):
        start = t
        a, b = 80_000 + 2 * step, 80_001 + 2 * step
        a_start = t + LAUNCH_LATENCY
        loop.events += [
            runtime("cudaLaunchKernel", t, 3, correlation=a),
            kernel(a_start, 1000, correlation=a),
            cpu_op("aten::prepare", t + 5, 700),
        ]
        loop.gpu.append((a_start, a_start + 1000))
        returned = a_start + 1000 + 2
        loop.events.append(runtime("cudaDeviceSynchronize", t + 710, returned - (t + 710)))
        loop.sync_returns.append(returned)
        t = returned + 1
        loop.events.append(cpu_op("aten::host_preprocess", t, 800))
        t += 805
        loop.events += [
            runtime("cudaLaunchKernel", t, 3, correlation=b),
            kernel(t + LAUNCH_LATENCY, 100, correlation=b),
        ]
        loop.gpu.append((t + LAUNCH_LATENCY, t + LAUNCH_LATENCY + 100))
        t += 5 + 200
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def test_a_sync_card_whose_saving_is_later_idle_says_so_in_its_rows(tmp_path: Path) -> None:
    """The card read "GPU idle it caused 0.0 µs" beside a saving of the whole wait. The rows now
    say what each measures, in the saving's unit: the host blocked in the calls (from the raw
    events), the GPU idle right after them (none: the operator's), and the note gives the saving as
    later idle. The host is the bottleneck after the wait, so all of the wait comes back."""
    steps = 6
    loop = sync_then_host_work_loop(steps)
    analysis = analysis_of(tmp_path, loop.events)
    finding = one(analysis, "sync-in-loop")
    syncs = [e for e in loop.events if e.get("name") == "cudaDeviceSynchronize"]
    blocked_us = sum(e["dur"] for e in syncs)
    assert finding.savings_total_ns == pytest.approx(ns(blocked_us), rel=0.01)
    assert finding.savings_per_step_ns == pytest.approx(ns(blocked_us / steps), rel=0.01)

    evidence = dict(finding.evidence)
    window = ns(recorded_window_us(loop))  # the steps the saving is measured on
    assert evidence["host blocked"] == (
        f"{format_duration(ns(blocked_us / steps))} per step ({ns(blocked_us) / window:.0%} of the step)"
    )
    assert evidence["GPU idle right after it"] == "0.0 µs per step (0% of the step)"
    assert "GPU idle it caused" not in evidence
    assert finding.saving_note is not None
    assert f"the other {format_duration(finding.savings_per_step_ns or 0)} per step" in finding.saving_note


def test_without_steps_a_wait_saves_only_the_gpus_idle_not_the_hosts_teardown(tmp_path: Path) -> None:
    """No steps: five times a 1 ms kernel, a synchronize that waits for it, 100 µs of host work;
    then 50 ms of host teardown. The time analyzed is the GPU's (first work to last end). Without
    the waits the host launches the kernels 0.1 ms apart and they run back to back: the saving is
    the GPU's span minus its kernels, not the 5 ms of waiting that moved the teardown earlier."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for index in range(5):
        correlation = 90_000 + index
        events += [
            runtime("cudaLaunchKernel", t, 3, correlation=correlation),
            kernel(t + LAUNCH_LATENCY, 1000, correlation=correlation),
            runtime("cudaDeviceSynchronize", t + 5, LAUNCH_LATENCY + 1000 + 2 - 5),
        ]
        t += LAUNCH_LATENCY + 1000 + 2 + 100
    events.append(cpu_op("aten::teardown", t, 50_000))
    analysis = analysis_of(tmp_path, events)
    kernels = [e for e in events if e.get("cat") == "kernel"]
    span_us = max(e["ts"] + e["dur"] for e in kernels) - min(e["ts"] for e in kernels)
    idle_us = span_us - sum(e["dur"] for e in kernels)
    finding = one(analysis, "sync-in-loop")
    assert finding.savings_total_ns == pytest.approx(ns(idle_us), rel=0.01)
    assert finding.saving_share == pytest.approx(idle_us / span_us, rel=0.01)


# --- every sample ------------------------------------------------------------------------------


@pytest.mark.parametrize("path", sorted(str(p.relative_to(SAMPLES)) for p in SAMPLES.rglob("*.json*")))
def test_no_saving_on_a_sample_is_more_than_the_time_it_is_measured_on(path: str) -> None:
    report = sample_report(path)
    for finding in report.findings:
        assert finding.saving_share is None or 0 <= finding.saving_share <= 1, finding.title
