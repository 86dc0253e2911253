"""Every idle nanosecond explained: the causes add up to the idle time, per device and per step, and
equal a plain-Python recomputation from the raw JSON on real traces."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from reference_split import reference_split
from tracebuild import SAMPLES, read_events, sample_report, union_length

from traceinsight.analysis import Analysis, analyze
from traceinsight.analysis.causes import CauseKind
from traceinsight.load import load_trace

ALL_SAMPLES = sorted(str(path.relative_to(SAMPLES)) for path in SAMPLES.rglob("*.json*"))
GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}


def analysis(name: str) -> Analysis:
    result: Analysis = sample_report(name).analysis
    return result


@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_device_idle_causes_add_up_to_the_idle_time(name: str) -> None:
    for device in analysis(name).devices:
        assert sum(device.idle_by_cause_ns.values()) == device.idle_ns
        assert device.compute_ns + device.communication_ns + device.copy_exposed_ns == device.busy_ns
        assert all(ns > 0 for ns in device.idle_by_cause_ns.values())
        assert set(device.idle_by_cause_ns) <= {kind.value for kind in CauseKind}


@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_step_busy_and_idle_causes_add_up_to_the_step_time(name: str) -> None:
    for step in analysis(name).steps:
        idle = sum(step.idle_by_cause_ns.values())
        assert idle == step.idle_ns
        assert step.compute_ns + step.communication_ns + step.copy_exposed_ns + idle == step.span_ns


@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_steady_usage_adds_up(name: str) -> None:
    for usage in analysis(name).usage:
        assert usage.busy_ns + usage.idle_ns == usage.window_ns


@pytest.mark.parametrize("name", ["v100_resnet50_workers0.pt.trace.json.gz", "two_ranks/rank-0.json.gz"])
def test_device_idle_is_a_plain_union_complement(name: str) -> None:
    """The total the causes add up to: span minus the union of GPU activity, from the raw JSON."""
    _, raw = read_events(SAMPLES / name)
    intervals = [
        (round(e["ts"] * 1000), round(e["ts"] * 1000) + round(e["dur"] * 1000))
        for e in raw
        if e.get("cat") in GPU_CATS
    ]
    span = max(end for _, end in intervals) - min(start for start, _ in intervals)
    (device,) = analysis(name).devices
    assert device.idle_ns == span - union_length(intervals)


@pytest.mark.parametrize(
    "name",
    [
        "a100_recsys_rank0.json.gz",  # CUDA graphs (queued), pageable copies, NCCL, syncs
        "two_ranks/rank-0.json.gz",  # NCCL, communication ops, dispatch
        "two_ranks/rank-1.json.gz",
        "gp100_mlp_pageable_sync.json.gz",  # pageable copy + sync, optimizer-step windows
        "v100_resnet50_workers0.pt.trace.json.gz",  # 2021 format, serial DataLoader
    ],
)
def test_idle_split_equals_a_plain_python_recomputation(name: str) -> None:
    expected = reference_split(SAMPLES / name)
    result = analysis(name)
    assert {d.device: dict(d.idle_by_cause_ns) for d in result.devices} == expected.devices
    assert {(s.step, s.device): dict(s.idle_by_cause_ns) for s in result.steps} == expected.steps
    # the recomputation sees more than one cause, so agreeing means something
    kinds = {kind for causes in expected.devices.values() for kind in causes}
    assert len(kinds) >= 2


def test_the_recomputations_cover_every_host_cause() -> None:
    names = [
        "a100_recsys_rank0.json.gz",
        "two_ranks/rank-0.json.gz",
        "gp100_mlp_pageable_sync.json.gz",
        "v100_resnet50_workers0.pt.trace.json.gz",
    ]
    seen = {
        kind
        for name in names
        for causes in reference_split(SAMPLES / name).devices.values()
        for kind in causes
    }
    assert {"dataloader", "copy", "queued", "cpu_op", "host-bound", "communication"} <= seen


def test_a_hand_built_split_adds_up_exactly(tmp_path: Path) -> None:
    from loops import ahead_loop, dataloader_loop, item_loop
    from reference_split import step_windows
    from tracebuild import write_trace

    for index, loop in enumerate((item_loop(), dataloader_loop(), ahead_loop())):
        result = analyze(load_trace(write_trace(tmp_path / f"{index}.json", loop.events)))
        windows = {window.step: window for window in step_windows(loop.events)}
        assert sorted(step.step for step in result.steps) == sorted(windows)
        for step in result.steps:
            assert sum(step.idle_by_cause_ns.values()) == step.idle_ns
            start, end = windows[step.step].begin, windows[step.step].done
            assert (step.start_ns, step.end_ns) == (start, end)
            clipped = [
                (max(round(a * 1000), start), min(round(b * 1000), end))
                for a, b in loop.gpu
                if round(a * 1000) < end and round(b * 1000) > start
            ]
            assert step.busy_ns == union_length(clipped)


def test_a_gaps_source_line_is_a_frame_of_its_own_thread(tmp_path: Path) -> None:
    """A gap's line is the innermost user frame on the thread that launched the work ending it; a
    frame of another thread at the same moment, even one starting later (more inner), is not it."""
    from tracebuild import TID, frame, launch, write_trace

    other = TID + 1
    events = [
        *launch(0, 10, 10),  # busy 10-20 µs
        frame("train.py(12): train_step", 30, 2000, python_id=1),
        frame("loader.py(7): prefetch", 40, 1000, python_id=2, tid=other),
        frame("loader.py(9): decode", 50, 500, python_id=3, tid=other),
        *launch(1000, 1100, 10),  # idle 20-1100 µs: the launching thread was in train_step
    ]
    analysis = analyze(load_trace(write_trace(tmp_path / "t.json", events)))
    (gap,) = analysis.idle_gaps
    assert (gap.start_ns, gap.end_ns) == (20_000, 1_100_000)
    assert gap.source == "train.py:12"


def test_an_op_and_the_op_it_calls_starting_and_ending_together_name_the_callee(tmp_path: Path) -> None:
    """``aten::to`` and the ``aten::_to_copy`` it calls often share their start and end (70 such
    pairs in the samples; a parent is recorded first): each of 300 gaps they cover is named for the
    one recorded second, every time. The tie was broken by the sort alone, which ordered the pair
    either way (74 of 400 such gaps named ``aten::to`` under polars 2.1, 15 under 1.37)."""
    from tracebuild import cpu_op, launch, write_trace

    events: list[dict[str, object]] = []
    for i in range(300):
        t = i * 200.0
        events += launch(t, t + 5, 10)
        events += [cpu_op("aten::to", t + 20, 100), cpu_op("aten::_to_copy", t + 20, 100)]
        events += launch(t + 118, t + 120, 10)  # idle from t+15 to t+120 µs, inside the pair
    analysis = analyze(load_trace(write_trace(tmp_path / "t.json", events)))
    covered = {
        (round((e["ts"] - 5) * 1000), round((e["ts"] + 100) * 1000))  # type: ignore[operator]
        for e in events
        if e["name"] == "aten::_to_copy"
    }
    named = {(g.start_ns, g.end_ns): g.cause for g in analysis.idle_gaps if (g.start_ns, g.end_ns) in covered}
    assert len(named) == 300
    assert set(named.values()) == {
        "dispatching aten::_to_copy: the host took this long to launch its next kernel"
    }


@pytest.mark.parametrize(
    ("ending_correlation", "record_begins", "expected"),
    [
        (5, 50.0, "queued"),  # numbered below the first recorded call, which began before the gap
        (3_000, 50.0, "copy"),  # numbered above it: the host may have launched it late, in the copy
        (5, 500.0, "copy"),  # the host record begins inside the gap: the launch may fall in it too
    ],
)
def test_work_launched_before_the_host_record_began_waited_queued(
    tmp_path: Path, ending_correlation: int, record_begins: float, expected: str
) -> None:
    """The profiler starts with work still queued from the step before: the trace holds that work
    but not its launches. A gap inside it is the GPU waiting with work queued, not the copy call
    the main thread sat in meanwhile (recsys's first step: 78 ms were "waiting on a blocking copy",
    tied to no finding)."""
    from tracebuild import kernel, memcpy, runtime, write_trace

    events = [
        kernel(0, 100, correlation=4),
        kernel(1000, 100, correlation=ending_correlation),
        # the host's first recorded call: a copy to pageable memory that waits for the queue
        runtime("cudaMemcpyAsync", record_begins, 1200 - record_begins, correlation=2_000),
        memcpy(1150, 2, "Memcpy DtoH (Device -> Pageable)", correlation=2_000),
    ]
    result = analyze(load_trace(write_trace(tmp_path / "t.json", events)))
    gap = max(result.idle_gaps, key=lambda g: g.duration_ns)
    assert (gap.start_ns, gap.end_ns) == (100_000, 1_000_000)
    assert gap.cause_kind == expected
    assert ("its launch is not in the trace" in gap.cause) == (expected == "queued")


def test_work_numbered_above_another_process_first_call_keeps_its_host_cause(tmp_path: Path) -> None:
    """Each process numbers its own calls: work below one process's first call but above another's
    may be that other process's, launched late; the gap keeps the cause its host activity gives."""
    from tracebuild import kernel, memcpy, runtime, write_trace

    other = runtime("cudaLaunchKernel", 60, 3, correlation=3)
    other["pid"] = 200
    events = [
        kernel(0, 100, correlation=2),
        kernel(1000, 100, correlation=5),
        runtime("cudaMemcpyAsync", 50, 1150, correlation=2_000),
        memcpy(1150, 2, "Memcpy DtoH (Device -> Pageable)", correlation=2_000),
        runtime("cudaStreamSynchronize", 1210, 1, correlation=2_001),  # the main thread: most calls
        other,
        kernel(2000, 10, correlation=3),
    ]
    result = analyze(load_trace(write_trace(tmp_path / "t.json", events)))
    gap = next(g for g in result.idle_gaps if g.start_ns == 100_000)
    assert gap.cause_kind == "copy"
    # the same trace with the other process's first call numbered above the work: queued
    other["args"]["correlation"] = events[-1]["args"]["correlation"] = 6
    result = analyze(load_trace(write_trace(tmp_path / "t2.json", events)))
    assert next(g for g in result.idle_gaps if g.start_ns == 100_000).cause_kind == "queued"


def test_a_graph_capture_split_equals_the_recomputation(tmp_path: Path) -> None:
    """Idle while the launching thread captures a CUDA graph is ``graph-capture`` (its launches went
    into the graph), in the plain recomputation as in the analysis."""
    import json

    from test_shapes import _capture_trace
    from tracebuild import annotation

    path = _capture_trace(tmp_path / "capture.json")
    document = json.loads(path.read_text())
    document["traceEvents"].append(annotation("ProfilerStep#1", 500, 59_000))
    path.write_text(json.dumps(document))
    expected = reference_split(path)
    result = analyze(load_trace(path))
    assert {d.device: dict(d.idle_by_cause_ns) for d in result.devices} == expected.devices
    assert {(s.step, s.device): dict(s.idle_by_cause_ns) for s in result.steps} == expected.steps
    assert expected.devices[0]["graph-capture"] > 0.9 * sum(expected.devices[0].values())


@pytest.mark.parametrize("sync_after", [False, True])
def test_a_copy_that_waits_inside_its_call_splits_like_the_recomputation(
    tmp_path: Path, sync_after: bool
) -> None:
    """`.item()` into pageable memory waits inside cudaMemcpyAsync: the idle after it is ``sync``
    (the host drained the queue there), in the plain recomputation as in the analysis."""
    from loops import blocking_item_loop
    from tracebuild import write_trace

    path = write_trace(tmp_path / "t.json", blocking_item_loop(sync_after=sync_after).events)
    expected = reference_split(path)
    result = analyze(load_trace(path))
    assert {d.device: dict(d.idle_by_cause_ns) for d in result.devices} == expected.devices
    assert {(s.step, s.device): dict(s.idle_by_cause_ns) for s in result.steps} == expected.steps
    assert expected.devices[0]["sync"] > 0


@pytest.mark.parametrize("builder", ["ahead_loop", "preprocessing_loop", "item_loop"])
def test_hand_built_loops_split_as_the_plain_python_recomputation(tmp_path: Path, builder: str) -> None:
    """A host that runs 20× ahead of its GPU, a host that prepares each step before its first GPU
    work, a host that syncs each step: per device and per step (each step's window on the GPU's
    clock) the causes equal the recomputation from the raw JSON."""
    import loops
    from reference_split import step_windows
    from tracebuild import write_trace

    events = getattr(loops, builder)().events
    path = write_trace(tmp_path / "t.json", events)
    expected = reference_split(path)
    result = analyze(load_trace(path))
    windows = {w.step: (w.begin, w.done) for w in step_windows(events)}
    assert {s.step: (s.start_ns, s.end_ns) for s in result.steps} == windows
    assert {d.device: dict(d.idle_by_cause_ns) for d in result.devices} == expected.devices
    assert {(s.step, s.device): dict(s.idle_by_cause_ns) for s in result.steps} == expected.steps


def _first_launch_loop() -> list[dict[str, object]]:
    """Three steps of three small kernels; in the first, the second kernel's `aten::add_` sits
    6.54 ms in its `hipLaunchKernel` (mi250_rocm_toy's shape: a kernel's first launch loads its GPU
    code) while the GPU, done with the first kernel, waits."""
    from tracebuild import annotation, cpu_op, kernel, runtime

    events: list[dict[str, object]] = []
    t, correlation = 0.0, 5000
    for step in range(3):
        start = t
        for index in range(3):
            slow = step == 0 and index == 1
            call = 6_540.0 if slow else 6.0
            correlation += 1
            events.append(cpu_op("aten::add_", t, call + 20))
            events.append(runtime("hipLaunchKernel", t + 10, call, correlation=correlation))
            events.append(
                kernel(t + 10 + call + 5, 7, correlation=correlation, name="void add_kernel<float>()")
            )
            t += call + 40
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
    return events


def test_a_slow_first_launch_is_the_launch_not_the_operators_work(tmp_path: Path) -> None:
    """The gap the slow launch leaves is ``host-bound``, named as a slow launch inside `aten::add_`
    (it was ``cpu_op`` "aten::add_", advised to move the work into the Dataset), in the plain
    recomputation as in the analysis; its length from the raw events."""
    from reference_split import reference_gaps
    from tracebuild import write_trace

    events = _first_launch_loop()
    path = write_trace(tmp_path / "t.json", events)
    result = analyze(load_trace(path))
    expected = {(start, end): kind for _, start, end, kind in reference_gaps(path).classified}
    assert {(g.start_ns, g.end_ns): g.cause_kind for g in result.idle_gaps} == {
        key: kind for key, kind in expected.items() if key[1] - key[0] >= 50_000
    }
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in events if e["cat"] == "kernel")  # type: ignore[operator]
    longest = max(b[0] - a[1] for a, b in itertools.pairwise(kernels))
    gap = max(result.idle_gaps, key=lambda g: g.duration_ns)
    assert gap.duration_ns == round(longest * 1000)
    assert gap.cause_kind == CauseKind.LAUNCH.value
    assert gap.cause.startswith(
        "the host sat in hipLaunchKernel inside aten::add_ for most of the gap: a slow launch"
    )


def test_a_wait_inside_a_graph_replay_is_named_and_advised_as_such(tmp_path: Path) -> None:
    """Each step replays a CUDA graph (one cudaGraphLaunch, then its kernels on the GPU) whose
    second node waits 4 ms on the GPU with its work queued: the gap is ``queued`` "in a CUDA graph
    replay", and the low-gpu-utilization card advises on graph dependencies (it was the generic
    stream/event advice, recsys's top card)."""
    from tracebuild import annotation, kernel, runtime, write_trace

    from traceinsight.analysis.idle_gaps import QUEUED_IN_GRAPH
    from traceinsight.rules import advice, evaluate

    events: list[dict[str, object]] = []
    correlation = 7000
    for step in range(4):
        start = step * 5_000.0
        correlation += 1
        events.append(runtime("cudaGraphLaunch", start + 10, 20, correlation=correlation))
        events.append(kernel(start + 40, 100, correlation=correlation))
        events.append(kernel(start + 4_140, 100, correlation=correlation))  # waited 4 ms, queued
        events.append(annotation(f"ProfilerStep#{step}", start, 4_990))
    path = write_trace(tmp_path / "t.json", events)
    result = analyze(load_trace(path))
    waits = [g for g in result.idle_gaps if g.duration_ns == 4_000_000]
    assert len(waits) == 4 and {g.cause_kind for g in waits} == {"queued"}
    assert {g.cause for g in waits} == {QUEUED_IN_GRAPH}
    low = next(f for f in evaluate(result) if f.rule == "low-gpu-utilization")
    assert low.advice is advice.DEPENDENCY_IN_GRAPH


@pytest.mark.parametrize("overlapping", [False, True])
def test_idle_split_inside_windows_equals_the_overlaps_summed(overlapping: bool) -> None:
    """A gap's time inside the steady windows is its overlap with each window, summed: found by a
    search over disjoint windows, by a join where they overlap."""
    import random

    import polars as pl

    from traceinsight.analysis.gpu_time import idle_split
    from traceinsight.analysis.steady import SteadySteps

    rng = random.Random(5 + overlapping)
    windows, at = [], 0
    for _ in range(30):
        start = at + rng.randint(-40 if overlapping else 0, 50)
        windows.append((start, start + rng.randint(0, 80)))
        at = windows[-1][1]
    gaps = []
    for _ in range(400):
        start = rng.randint(-50, at + 50)
        gaps.append((rng.randint(0, 1), start, start + rng.randint(1, 120), rng.choice(["launch", "queued"])))
    table = pl.DataFrame(
        gaps,
        schema={"device": pl.Int64, "start": pl.Int64, "end": pl.Int64, "cause_kind": pl.String},
        orient="row",
    ).with_columns(duration=pl.col("end") - pl.col("start"))
    steady = SteadySteps(source="none", steps=(), windows=tuple(windows))
    expected: dict[int, dict[str, int]] = {}
    for device, start, end, kind in gaps:
        inside = sum(max(0, min(end, w_end) - max(start, w_start)) for w_start, w_end in windows)
        causes = expected.setdefault(device, {})
        causes[kind] = causes.get(kind, 0) + inside
        causes[CauseKind.OUTSIDE_STEADY.value] = (
            causes.get(CauseKind.OUTSIDE_STEADY.value, 0) + end - start - inside
        )
    assert {device: dict(causes) for device, causes in idle_split(table, steady).items()} == {
        device: {kind: ns for kind, ns in causes.items() if ns > 0} for device, causes in expected.items()
    }


def test_the_fallback_launcher_of_two_threads_with_as_many_calls_is_the_lower_one(tmp_path: Path) -> None:
    """A gap whose work has no launch recorded is looked up on the thread that made the most runtime
    calls; between threads that made as many (counted from the raw events here), the lowest pid,
    then tid, every time, whatever order a hash leaves the threads in."""
    from collections import Counter

    from tracebuild import PID, runtime, write_trace

    from traceinsight.analysis.idle_gaps import _main_thread

    events = []
    for i in range(12):
        for tid in (400, 90, 250, 7):  # 7 makes fewer calls
            if tid != 7 or i < 5:
                events.append(runtime("cudaGetDevice", 10 + i * 40 + tid / 100, 1, tid=tid))
    counts = Counter((PID, e["tid"]) for e in events)
    most = max(counts.values())
    expected = min(thread for thread, count in counts.items() if count == most)
    assert expected == (PID, 90)
    assert _main_thread(load_trace(write_trace(tmp_path / "t.json", events))) == expected


@pytest.mark.parametrize("written", ["outer first", "inner first"])
def test_a_gap_in_nested_dataloader_ranges_is_named_by_the_outer_one(tmp_path: Path, written: str) -> None:
    """The loop's ``__next__`` range and another DataLoader range inside it: each of the gaps
    they cover is named by the outer one, the loop's own call, whichever the file holds first.
    Was: the inner one in both orders."""
    from loops import dataloader_loop
    from tracebuild import annotation, write_trace

    loop = dataloader_loop(steps=40, wait_us=5000)
    events = []
    for event in loop.events:
        if event["name"].startswith("enumerate(DataLoader)"):
            inner = annotation(
                "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__",
                event["ts"] + 1,
                event["dur"] - 2,
            )
            events += [event, inner] if written == "outer first" else [inner, event]
        else:
            events.append(event)
    gaps = analyze(load_trace(write_trace(tmp_path / "t.json", events))).idle_gaps
    named = [gap.cause for gap in gaps if gap.cause_kind == "dataloader"]
    assert len(named) == len(loop.steps) - 1  # each wait but the first is a gap between steps' work
    assert set(named) == {"enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"}


def test_a_gap_is_named_by_the_dataloader_range_covering_it_not_one_that_ended_before(
    tmp_path: Path,
) -> None:
    """Before each wait, another loader's ``__next__`` that ends 20 µs before the GPU goes idle
    (inside the sync-drain slack, so it touches the gap), then the loop's own, which covers the
    gap: every gap is named by the one covering it (was: the one that started first, covering
    none of it)."""
    from loops import dataloader_loop
    from tracebuild import annotation, write_trace

    loop = dataloader_loop(steps=10, wait_us=5000)
    kernels = [e for e in loop.events if e["cat"] == "kernel"]
    events = []
    for event in loop.events:
        if event["name"].startswith("enumerate(DataLoader)") and event["ts"] > 0:
            # the GPU goes idle when the last kernel before the wait's end ends (raw events: the
            # step's kernels are launched after it)
            idle_from = max(k["ts"] + k["dur"] for k in kernels if k["ts"] < event["ts"] + event["dur"])
            assert event["ts"] <= idle_from < event["ts"] + event["dur"]
            ends = idle_from - 20
            other = "enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__"
            events.append(annotation(other, ends - 180, 180))
            events.append(annotation(event["name"], ends, event["ts"] + event["dur"] - ends))
        else:
            events.append(event)
    gaps = analyze(load_trace(write_trace(tmp_path / "b.json", events))).idle_gaps
    named = [g.cause for g in gaps if g.cause_kind == "dataloader"]
    assert len(named) == len(loop.steps) - 1
    assert set(named) == {"enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"}
