"""Analyses on real traces, against figures computed here from the raw JSON with plain Python."""

from __future__ import annotations

import threading
from collections import Counter
from decimal import ROUND_HALF_UP, Decimal
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tracebuild import SAMPLES, read_events, sample_report, union_length

from traceinsight.analysis import Analysis, analyze
from traceinsight.load import load_trace
from traceinsight.model import fields_of, replace
from traceinsight.results import Report
from traceinsight.results.contract import result_of
from traceinsight.rules import evaluate
from traceinsight.thresholds import Thresholds

GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
BLOCKING = {
    "cudaStreamSynchronize",
    "cudaDeviceSynchronize",
    "cudaEventSynchronize",
    "cudaMemcpy",
    "hipDeviceSynchronize",
    "hipStreamSynchronize",
    "hipEventSynchronize",
    "hipMemcpy",
    "hipMemcpyWithStream",
}


def report(name: str) -> Report:
    result: Report = sample_report(name)
    return result


@cache
def events(name: str) -> list[dict[str, Any]]:
    return read_events(SAMPLES / name)[1]


def rules_of(name: str) -> set[str]:
    return {finding.rule for finding in report(name).findings}


def _exact_ns(value: float) -> int:
    """µs as written in the JSON text → ns, exactly (Decimal of the float's shortest text)."""
    return int((Decimal(repr(value)) * 1000).to_integral_value(rounding=ROUND_HALF_UP))


def _device(event: dict[str, Any]) -> int:
    return int(event.get("args", {}).get("device", event["pid"]))


@pytest.mark.parametrize(
    "name",
    [
        "a100_recsys_rank0.json.gz",
        "gp100_mlp_pageable_sync.json.gz",
        "v100_resnet50_workers0.pt.trace.json.gz",
        "h100_bert_small_stacks.json.gz",
        "mi250_rocm_toy.json.gz",
        "v100_ddp_ns_timestamps.pt.trace.json.gz",
    ],
)
def test_busy_span_idle_per_device_match_a_plain_union(name: str) -> None:
    by_device: dict[int, list[tuple[float, float]]] = {}
    for e in events(name):
        if e.get("ph") == "X" and e.get("cat") in GPU_CATS:
            start = _exact_ns(e["ts"])
            by_device.setdefault(_device(e), []).append((start, start + _exact_ns(e.get("dur", 0))))
    analysis: Analysis = report(name).analysis
    assert [d.device for d in analysis.devices] == sorted(by_device)
    for device in analysis.devices:
        intervals = by_device[device.device]
        busy = union_length(intervals)
        span = max(end for _, end in intervals) - min(start for start, _ in intervals)
        assert device.busy_ns == busy
        assert device.span_ns == span
        assert device.idle_ns == span - busy


@pytest.mark.parametrize("name", sorted(path.name for path in SAMPLES.glob("*.json*")))
def test_the_header_names_one_gpu_by_its_index_not_as_a_count(name: str) -> None:
    """``GPU 2: …`` for a trace of one GPU (an MI300 trace's only GPU is 2: ``GPUs 2: …`` read as
    two GPUs); ``GPUs`` for none or several."""
    from traceinsight.render.facts import header_facts

    devices = sorted({_device(e) for e in events(name) if e.get("ph") == "X" and e.get("cat") in GPU_CATS})
    facts = dict(header_facts(result_of(report(name))))
    if len(devices) == 1:
        assert "GPUs" not in facts and facts["GPU"].startswith(f"{devices[0]}: ")
    else:
        assert "GPU" not in facts and facts["GPUs"].startswith("none" if not devices else f"{devices[0]}: ")


def test_the_header_lists_several_gpus_under_gpus_and_counts_events_in_words(tmp_path: Path) -> None:
    from tracebuild import kernel, write_trace

    from traceinsight.render.facts import header_facts

    path = write_trace(
        tmp_path / "two.json",
        [kernel(0, 10, device=0), kernel(5, 10, device=1)],
        deviceProperties=[{"id": 0, "name": "First GPU"}, {"id": 1, "name": "Second GPU"}],
    )
    analysis = analyze(load_trace(path))
    facts = dict(header_facts(result_of(Report(analysis, evaluate(analysis)))))
    assert "GPU" not in facts and facts["GPUs"] == "0: First GPU; 1: Second GPU"
    assert facts["Trace"] == "two.json: 2 events, format kineto"
    one = write_trace(tmp_path / "one.json", [kernel(0, 10)])
    analysis = analyze(load_trace(one))
    assert (
        dict(header_facts(result_of(Report(analysis, evaluate(analysis)))))["Trace"]
        == "one.json: 1 event, format kineto"
    )


def test_step_evidence_is_per_step_beside_a_share_of_each_step() -> None:
    """launch-bound, exposed-communication and low-gpu-utilization give their time per step, from
    the steady steps' own figures (was: the total of all steps, ``320.06 ms (48% of each step)`` with 3 steps of
    222 ms); without steps, the total with a share of the time."""
    from traceinsight.analysis.causes import CAUSE_LABELS
    from traceinsight.formatting import format_duration

    def per_step(name: str, figure: Any) -> str:
        steady = [step for step in report(name).analysis.steps if step.steady]
        return format_duration(round(sum(figure(step) for step in steady) / len(steady)))

    def evidence(name: str, rule: str) -> dict[str, str]:
        return dict(next(f for f in report(name).findings if f.rule == rule).evidence)

    launch = evidence("a100_ddp_nccl.json.gz", "launch-bound")["GPU idle while the host launched"]
    (pattern,) = report("a100_ddp_nccl.json.gz").analysis.launching.patterns  # its short gaps' idle
    steady = sum(step.steady for step in report("a100_ddp_nccl.json.gz").analysis.steps)
    assert launch.startswith(f"{format_duration(round(pattern.short_ns / steady))} per step (")
    assert launch.endswith(" of each step)")
    exposed = evidence("a100_recsys_rank0.json.gz", "exposed-communication")
    communication = per_step("a100_recsys_rank0.json.gz", lambda step: step.communication_ns)
    compute = per_step("a100_recsys_rank0.json.gz", lambda step: step.compute_ns)
    assert exposed["communication with no compute under it"].startswith(f"{communication} per step (")
    assert exposed["compute"].startswith(f"{compute} per step (") and exposed["compute"].endswith(
        " of each step)"
    )
    low = evidence("a100_ddp_nccl.json.gz", "low-gpu-utilization")
    compute = per_step("a100_ddp_nccl.json.gz", lambda step: step.compute_ns)
    assert low["compute"].startswith(f"{compute} per step (") and low["compute"].endswith(" of each step)")
    usage = report("a100_ddp_nccl.json.gz").analysis.device_usage(0)
    assert usage is not None
    for kind, _ in usage.idle:
        figure = per_step(
            "a100_ddp_nccl.json.gz", lambda step, kind=kind: dict(step.idle_by_cause_ns).get(kind, 0)
        )
        assert low[f"idle: {CAUSE_LABELS[kind]}"].startswith(f"{figure} per step (")
    no_steps = evidence("b200_eager_stacks.json.gz", "launch-bound")["GPU idle while the host launched"]
    assert "per step" not in no_steps and no_steps.endswith(" of the time)")


def test_pageable_copies_claim_only_the_idle_their_own_waits_caused() -> None:
    """recsys: 45 pageable copies of 6.6 KiB, whose syncs leave 0.1 ms of GPU idle in all (the card
    said "GPU idle waiting on these copies 78.16 ms"). The figure is the idle gaps tied to these
    waits, per step; test_rules holds it below the copy idle of other waits."""
    from traceinsight.formatting import format_duration

    name = "a100_recsys_rank0.json.gz"
    analysis = report(name).analysis
    finding = next(f for f in report(name).findings if f.rule == "pageable-memcpy")
    keys = {
        key for h in analysis.sync_hotspots if h.copy == "Memcpy HtoD (Pageable -> Device)" for key in h.keys
    }
    theirs = sum(gap.duration_ns for gap in analysis.idle_gaps if gap.sync_key in keys)
    assert 0 < theirs < 1_000_000
    steps = len(analysis.steady.steady_steps)
    shown = dict(finding.evidence)["GPU idle right after the waits"]
    assert shown.startswith(f"{format_duration(round(theirs / steps))} per step (")


def test_recsys_stream_syncs_and_pageable_copies() -> None:
    name = "a100_recsys_rank0.json.gz"
    raw = events(name)
    calls = Counter(e["name"] for e in raw if e.get("cat") == "cuda_runtime" and e["name"] in BLOCKING)
    assert calls["cudaStreamSynchronize"] == 75
    pageable = [e for e in raw if e.get("name") == "Memcpy HtoD (Pageable -> Device)"]
    analysis = report(name).analysis
    syncs = {call.call: call for call in analysis.syncs}
    assert syncs["cudaStreamSynchronize"].count == calls["cudaStreamSynchronize"]
    assert syncs["cudaStreamSynchronize"].blocked_ns == sum(
        e["dur"] * 1000 for e in raw if e.get("name") == "cudaStreamSynchronize"
    )
    group = next(g for g in analysis.copies if g.kind == "Memcpy HtoD (Pageable -> Device)")
    assert group.count == len(pageable) == 45
    assert group.bytes == sum(e["args"]["bytes"] for e in pageable) == 6720
    assert group.duration_ns == sum(e["dur"] for e in pageable) * 1000
    assert group.host_blocked == group.count  # pageable copies always block the host
    assert "pageable-memcpy" in rules_of(name)


def test_copy_overlap_with_kernels_matches_a_plain_intersection() -> None:
    name = "a100_recsys_rank0.json.gz"
    raw = events(name)
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in raw if e.get("cat") == "kernel")
    merged: list[list[float]] = []
    for start, end in kernels:
        if merged and start <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([start, end])
    copies = [e for e in raw if e.get("name") == "Memcpy HtoD (Pinned -> Device)"]
    expected = sum(
        max(0.0, min(e["ts"] + e["dur"], end) - max(e["ts"], start)) for e in copies for start, end in merged
    )
    group = next(g for g in report(name).analysis.copies if g.kind == "Memcpy HtoD (Pinned -> Device)")
    assert group.overlapped_ns / 1000 == pytest.approx(expected)
    htod = [g for g in report(name).analysis.copies if g.direction == "HtoD"]
    ratio = sum(g.overlapped_ns for g in htod) / sum(g.duration_ns for g in htod)
    assert report(name).analysis.overlap["HtoD"] == pytest.approx(ratio)


def test_gp100_pageable_copy_and_its_sync_are_one_finding_tied_to_to_copy() -> None:
    name = "gp100_mlp_pageable_sync.json.gz"
    findings = report(name).findings
    # The copy and the cudaStreamSynchronize after it have one fix: one finding, not two.
    assert "pageable-memcpy" in rules_of(name) and "sync-in-loop" not in rules_of(name)
    copy = next(f for f in findings if f.rule == "pageable-memcpy")
    assert copy.op == "aten::to"
    waits = dict(copy.evidence)["host waits after them"]
    assert "cudaStreamSynchronize" in waits and "aten::to > aten::_to_copy > aten::copy_" in waits
    raw = events(name)
    syncs = [e for e in raw if e.get("name") == "cudaStreamSynchronize"]
    hotspot = report(name).analysis.sync_hotspots[0]
    assert hotspot.count == len(syncs) == 10
    optimizer_steps = sum(
        1 for e in raw if e.get("cat") == "user_annotation" and e["name"].startswith("Optimizer.step#")
    )
    assert hotspot.per_step == pytest.approx(len(syncs) / optimizer_steps)


def test_serial_dataloader_stalls_and_parallel_one_does_not() -> None:
    assert "dataloader-stall" in rules_of("v100_resnet50_workers0.pt.trace.json.gz")
    assert "dataloader-stall" not in rules_of("v100_resnet50_workers4.pt.trace.json.gz")
    stall = next(
        f for f in report("v100_resnet50_workers0.pt.trace.json.gz").findings if f.rule == "dataloader-stall"
    )
    # the stall cannot exceed the time the host spent in DataLoader __next__ (plain sum from the JSON)
    dataloader_us = sum(
        e["dur"]
        for e in events("v100_resnet50_workers0.pt.trace.json.gz")
        if str(e.get("name", "")).startswith("enumerate(DataLoader)#")
    )
    assert 0 < stall.savings_total_ns / 1000 <= dataloader_us
    # the longest gap of the serial loader is ~62 ms and is blamed on the DataLoader
    gap = report("v100_resnet50_workers0.pt.trace.json.gz").analysis.idle_gaps[0]
    assert gap.cause_kind == "dataloader" and 55_000 < gap.duration_ns / 1000 < 70_000
    assert gap.source is not None and gap.source.endswith(".py:42")  # from the 2021 Call stack


def test_item_chain_in_event_sync_trace() -> None:
    name = "a100_item_event_sync.json.gz"
    # the copy into pageable memory waits inside cudaMemcpyAsync; with the sync after it, one wait
    hotspot = next(h for h in report(name).analysis.sync_hotspots if h.then_call == "cudaStreamSynchronize")
    assert hotspot.call == "cudaMemcpyAsync" and hotspot.count == 1
    assert hotspot.op == "aten::is_nonzero"
    assert hotspot.op_chain == "aten::is_nonzero > aten::item > aten::_local_scalar_dense"
    # the GPU is idle from the sync's return until the next kernel: computed from the raw events
    raw = events(name)
    sync = next(e for e in raw if e.get("name") == "cudaStreamSynchronize")
    returns = sync["ts"] + sync["dur"]
    gpu = [e for e in raw if e.get("cat") in GPU_CATS]
    busy_until = max(e["ts"] + e["dur"] for e in gpu if e["ts"] <= returns)
    next_start = min(e["ts"] for e in gpu if e["ts"] > returns)
    assert hotspot.idle_after_ns / 1000 == pytest.approx(next_start - max(busy_until, returns))
    assert "sync-in-loop" in rules_of(name)


def test_source_lines_come_from_python_stacks() -> None:
    hotspot = next(
        h
        for h in report("h100_bert_small_stacks.json.gz").analysis.sync_hotspots
        if h.op == "aten::is_nonzero"
    )
    assert hotspot.source is not None and hotspot.source.endswith(".py:28")
    assert not hotspot.source.startswith("torch/")


def test_a_busy_trace_gets_only_the_precision_finding() -> None:
    analysis = report("v100_ddp_ns_timestamps.pt.trace.json.gz").analysis
    assert analysis.devices[0].utilization > 0.9
    # 98% busy: nothing keeps the GPU waiting; its fp32 GEMMs on a V100 could use tensor cores
    assert {f.rule for f in report("v100_ddp_ns_timestamps.pt.trace.json.gz").findings} == {"amp-opportunity"}


def test_cpu_only_traces_still_get_the_host_view() -> None:
    for name in ("cpu_only_gloo.pt.trace.json.gz", "cpu_torch2.14_with_stack.pt.trace.json.gz"):
        analysis = report(name).analysis
        assert not analysis.has_gpu and analysis.devices == ()
        assert analysis.host.cpu_ops == sum(1 for e in events(name) if e.get("cat") == "cpu_op")
        # only host-side rules can fire: a sync waiting to happen (the sample calls .item() each step)
        assert {f.rule for f in report(name).findings} <= {
            "latent-sync",
            "sync-in-forward",
            "dataloader-stall",
        }


@pytest.mark.parametrize("path", sorted(SAMPLES.rglob("*.json*")), ids=lambda p: p.name)
def test_every_sample_analyzes(path: Path) -> None:
    analysis = analyze(load_trace(path))
    findings = evaluate(analysis)
    for gap in analysis.idle_gaps:
        assert gap.duration_ns >= 50_000
    assert all(f.savings_total_ns >= 0 for f in findings)


#: `traceinsight run examples/SCRIPT` on an H200 (torch 2.11): the line that makes the host wait, the op.
RUN_ON_H200 = {
    "h200_run_item_every_step.pt.trace.json.gz": ("item_every_step.py", "loss.item()", "aten::item"),
    "h200_run_tensor_branch.pt.trace.json.gz": ("tensor_branch.py", "if h.sum() > 0", "aten::is_nonzero"),
    "h200_run_serial_dataloader.pt.trace.json.gz": ("serial_dataloader.py", "images.to(device)", "aten::to"),
}


@pytest.mark.parametrize("name", sorted(RUN_ON_H200))
def test_a_run_on_a_gpu_names_the_examples_own_line_of_each_wait(name: str) -> None:
    """The blocking syncs of `run` on a GPU are tied to the example's line that causes them (with
    torch 2.11 they were tied to the script's ``<module>`` range, with no line), once per
    ``cudaStreamSynchronize`` the trace holds."""
    script, code, op = RUN_ON_H200[name]
    text = (Path(__file__).resolve().parent.parent / "examples" / script).read_text().splitlines()
    line = next(n for n, words in enumerate(text, 1) if code in words and not words.lstrip().startswith('"'))
    waits = sum(
        1 for e in events(name) if e.get("cat") == "cuda_runtime" and e["name"] == "cudaStreamSynchronize"
    )
    hotspot = next(h for h in report(name).analysis.sync_hotspots if h.call == "cudaStreamSynchronize")
    assert (hotspot.op, hotspot.source, hotspot.count) == (op, f"{script}:{line}", waits)


@pytest.mark.parametrize(
    "name",
    [
        "v100_resnet50_workers0.pt.trace.json.gz",
        "v100_ddp_ns_timestamps.pt.trace.json.gz",
        *sorted(RUN_ON_H200),  # ProfilerStep ranges drawn on the GPU row over later steps' work
    ],
)
def test_per_step_busy_matches_a_plain_clipped_union(name: str) -> None:
    """Each step's GPU figures are over its window on the GPU's clock: from the step before's done
    to its own (the later of its ProfilerStep's end and the end of the GPU work it launched)."""
    from reference_split import run_records_frames, step_windows

    document, raw = read_events(SAMPLES / name)
    gpu = [
        (_exact_ns(e["ts"]), _exact_ns(e["ts"]) + _exact_ns(e["dur"]))
        for e in raw
        if e.get("cat") in GPU_CATS
    ]
    first_at_first_event = run_records_frames(document)
    windows = {
        w.step: (w.begin, w.done)
        for w in step_windows(raw, _exact_ns, first_at_first_event=first_at_first_event)
    }
    steps = {step.step: step for step in report(name).analysis.steps}
    assert sorted(steps) == sorted(windows)
    first_gpu = min(start for start, _ in gpu)
    last_gpu = max(end for _, end in gpu)
    for number, (start, end) in windows.items():
        clipped = [(max(s, start), min(e, end)) for s, e in gpu if s < end and e > start]
        step = steps[number]
        assert step.busy_ns == union_length(clipped)
        assert step.idle_ns == (end - start) - union_length(clipped)
        causes = dict(step.idle_by_cause_ns)
        assert sum(causes.values()) == step.idle_ns
        assert causes.get("before-first-work", 0) == max(0, min(end, first_gpu) - start)
        assert causes.get("after-last-work", 0) == max(0, end - max(start, last_gpu))


def test_each_sync_is_tied_to_the_copy_it_waits_for() -> None:
    name = "a100_recsys_rank0.json.gz"
    raw = events(name)
    copy_names = {e["args"]["correlation"]: e["name"] for e in raw if e.get("cat") == "gpu_memcpy"}
    launches: dict[tuple[int, int], list[tuple[float, str]]] = {}
    for e in raw:
        if e.get("cat") == "cuda_runtime" and e["name"].startswith("cudaMemcpy"):
            kind = copy_names.get(e["args"]["correlation"])
            if kind:
                launches.setdefault((e["pid"], e["tid"]), []).append((e["ts"] + e["dur"], kind))
    expected: Counter[str] = Counter()
    for e in raw:
        if e.get("name") == "cudaStreamSynchronize":
            before = [
                (end, kind)
                for end, kind in launches.get((e["pid"], e["tid"]), [])
                if 0 <= e["ts"] - end <= 50
            ]
            if before:
                expected[max(before)[1]] += 1
    # a copy into pageable memory and the sync after it are one wait, counted once
    got = Counter(
        {
            h.copy: h.count
            for h in report(name).analysis.sync_hotspots
            if "cudaStreamSynchronize" in (h.call, h.then_call)
        }
    )
    assert got == expected
    dtoh = [h for h in report(name).analysis.sync_hotspots if h.copy == "Memcpy DtoH (Device -> Pageable)"]
    assert {(h.call, h.then_call) for h in dtoh} == {("cudaMemcpyAsync", "cudaStreamSynchronize")}
    assert expected == Counter(
        {"Memcpy HtoD (Pageable -> Device)": 45, "Memcpy DtoH (Device -> Pageable)": 30}
    )
    titles = [f.title for f in report(name).findings if f.rule == "sync-in-loop"]
    assert any("to the host" in title for title in titles)


@pytest.mark.parametrize(
    "name",
    [
        "v100_ddp_ns_timestamps.pt.trace.json.gz",
        "a100_recsys_rank0.json.gz",
        "h100_qwen_inference_stacks.json.gz",
    ],
)
def test_analyses_beside_the_main_thread_give_what_they_give_inline(
    name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The analyses started beside the main ones (host operators, warnings, replay …) run on a
    thread of their own, and the whole result is the one they give run one after another."""
    from traceinsight import analysis
    from traceinsight.analysis import host
    from traceinsight.process import Beside

    trace = load_trace(SAMPLES / name)
    threads: list[str] = []
    summary = host.host_summary

    def recorded(*args: Any, **kwargs: Any) -> Any:
        threads.append(threading.current_thread().name)
        return summary(*args, **kwargs)

    monkeypatch.setattr(host, "host_summary", recorded)
    results = []
    for thread in (False, True):
        beside = Beside(thread=thread)
        try:
            results.append(analysis._analyze(trace, Thresholds(), (), beside))
        finally:
            beside.close()
    assert threads[0] == threading.current_thread().name
    assert threads[1].startswith("traceinsight-analysis")
    inline, beside_result = results
    assert replace(beside_result, replay=inline.replay) == inline
    assert beside_result.host.top_ops
    # The replay's windows hold numpy arrays: compared field by field.
    assert len(beside_result.replay.windows) == len(inline.replay.windows) > 0
    for ours, theirs in zip(beside_result.replay.windows, inline.replay.windows, strict=True):
        for field in fields_of(ours):
            mine, other = getattr(ours, field.name), getattr(theirs, field.name)
            assert np.array_equal(mine, other) if isinstance(mine, np.ndarray) else mine == other, field.name
    assert (beside_result.replay.steps, beside_result.replay.recorded_ns) == (
        inline.replay.steps,
        inline.replay.recorded_ns,
    )


def test_an_error_in_an_analysis_beside_is_raised_by_analyze(monkeypatch: pytest.MonkeyPatch) -> None:
    from traceinsight.analysis import host

    def broken(*args: Any, **kwargs: Any) -> Any:
        raise ValueError("host summary broke")

    monkeypatch.setattr(host, "host_summary", broken)
    monkeypatch.delenv("TRACEINSIGHT_WORKERS", raising=False)
    trace = load_trace(SAMPLES / "a100_recsys_rank0.json.gz")
    with pytest.raises(ValueError, match="host summary broke"):
        analyze(trace)
    assert not [thread for thread in threading.enumerate() if thread.name.startswith("traceinsight-analysis")]


def test_a_second_core_is_used_only_where_the_process_may_use_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """The side thread needs two cores of the process's own, a polars of more
    than one thread (a job's worker on a one-core share has one), and no TRACEINSIGHT_WORKERS=0."""
    import os

    from traceinsight.cores import second_core

    for name in ("TRACEINSIGHT_WORKERS", "POLARS_MAX_THREADS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)
    assert second_core()
    monkeypatch.setenv("POLARS_MAX_THREADS", "1")
    assert not second_core()
    monkeypatch.setenv("POLARS_MAX_THREADS", "2")
    assert second_core()
    monkeypatch.setenv("TRACEINSIGHT_WORKERS", "0")
    assert not second_core()
    monkeypatch.delenv("TRACEINSIGHT_WORKERS")
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {3}, raising=False)
    assert not second_core()


def test_sync_in_loop_gives_the_steady_calls_host_time_per_step() -> None:
    """qwen: one cudaDeviceSynchronize in its one steady step and one outside it; the card said
    "host blocked 16.27 ms", both calls, beside "every step (1 in the steady state, 2 in the
    trace)". It now gives the steady calls' own time per step, as its saving does."""
    from traceinsight.formatting import format_duration

    name = "h100_qwen_inference_stacks.json.gz"
    raw = events(name)
    (step,) = [e for e in raw if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    start, end = step["ts"], step["ts"] + step["dur"]
    syncs = [e for e in raw if e.get("cat") == "cuda_runtime" and e["name"] == "cudaDeviceSynchronize"]
    inside = [e for e in syncs if start <= e["ts"] < end]
    assert len(syncs) == 2 and len(inside) == 1
    finding = next(f for f in report(name).findings if f.rule == "sync-in-loop")
    shown = dict(finding.evidence)["host blocked"]
    assert shown.startswith(f"{format_duration(round(inside[0]['dur'] * 1000))} per step (")


def test_recsys_blocking_copies_to_the_host_are_waits_with_their_real_blocked_time() -> None:
    """recsys: each step copies 5 values to pageable host memory (one of 704 bytes); the host waits
    inside cudaMemcpyAsync (146 ms for the 704-byte copy), then a cudaStreamSynchronize of a few
    µs. The hot spot showed 30 stream syncs blocking 0.90 ms; it is 30 waits blocking what the raw
    calls took, and the card says the host's time is not the GPU's: the GPU had work queued."""
    from traceinsight.formatting import format_duration

    name = "a100_recsys_rank0.json.gz"
    raw = events(name)
    dtoh = {e["args"]["correlation"] for e in raw if e.get("name") == "Memcpy DtoH (Device -> Pageable)"}
    runtime = sorted(
        (e for e in raw if e.get("cat") == "cuda_runtime"), key=lambda e: (e["pid"], e["tid"], e["ts"])
    )
    waits = []  # (start, blocked µs) of each copy call and the sync right after it
    for index, e in enumerate(runtime):
        if e["name"] == "cudaMemcpyAsync" and e["args"]["correlation"] in dtoh:
            after = runtime[index + 1]
            follows = after["name"] == "cudaStreamSynchronize" and after["ts"] - (e["ts"] + e["dur"]) <= 50
            waits.append((e["ts"], e["dur"] + (after["dur"] if follows else 0)))
    assert len(waits) == 30
    analysis = report(name).analysis
    hotspot = next(h for h in analysis.sync_hotspots if h.copy == "Memcpy DtoH (Device -> Pageable)")
    assert (hotspot.call, hotspot.then_call, hotspot.count) == (
        "cudaMemcpyAsync",
        "cudaStreamSynchronize",
        30,
    )
    assert hotspot.blocked_ns == sum(blocked for _, blocked in waits) * 1000
    steps = [(e["ts"], e["ts"] + e["dur"]) for e in raw if str(e.get("name", "")).startswith("ProfilerStep#")]
    steady = sum(blocked for start, blocked in waits if any(a <= start < b for a, b in steps))
    card = next(f for f in report(name).findings if f.rule == "sync-in-loop" and "to the host" in f.title)
    evidence = dict(card.evidence)
    assert evidence["call"] == "cudaMemcpyAsync + cudaStreamSynchronize"
    assert evidence["host blocked"].startswith(
        f"{format_duration(round(steady * 1000 / len(steps)))} per step"
    )
    # the GPU waited on its own dependencies meanwhile: the replay gives back far less than that
    assert card.savings_total_ns < steady * 1000 / 4
    assert card.saving_note is not None and "frees the host, not the GPU" in card.saving_note


def test_each_read_counts_once_even_when_item_and_its_scalar_read_share_one_span() -> None:
    """no_distributed_info: 5 `.item()` in its one step, each with its `_local_scalar_dense` inside;
    one pair has the same start and duration (within the µs), so each held the other and both were
    dropped: the card said 4. The read inside `Optimizer.step#FusedAdam.step` counts: a fused
    optimizer keeps its step counter on the device (only Adam, AdamW … keep it on the CPU)."""
    name = "no_distributed_info.json.gz"
    reads = [
        (index, e)
        for index, e in enumerate(events(name))
        if e.get("cat") == "cpu_op" and e.get("name") in ("aten::item", "aten::_local_scalar_dense")
    ]
    outermost = []
    for _, read in sorted(reads, key=lambda pair: (pair[1]["ts"], -pair[1]["dur"], pair[0])):
        end = read["ts"] + read["dur"]
        if not any(
            o["tid"] == read["tid"] and o["ts"] <= read["ts"] and end <= o["ts"] + o["dur"] for o in outermost
        ):
            outermost.append(read)
    fused = [e for e in events(name) if e.get("name") == "Optimizer.step#FusedAdam.step"]
    in_fused = [r for r in outermost if any(f["ts"] <= r["ts"] <= f["ts"] + f["dur"] for f in fused)]
    assert len(outermost) == 5 and len(in_fused) == 1
    syncs = report(name).analysis.latent_syncs
    assert [(s.op, s.count, s.cpu_value) for s in syncs] == [("aten::item", len(outermost), None)]
    (card,) = [f for f in report(name).findings if f.rule == "latent-sync"]
    assert card.title.startswith("`.item()` would make the host wait for the GPU 5× per step")
