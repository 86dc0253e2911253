"""Shapes read by their pattern (issue 29, item 4): launch-bound only for many short gaps between
many short kernels, a pipeline bubble, per-parameter collectives, and advice code that fits the
trace (its optimizer, its compile state, its communication). Every figure a test pins is computed
here from the raw events, never taken from the tool."""

from __future__ import annotations

import itertools
from pathlib import Path
from statistics import median
from typing import Any

import pytest
from loops import launch_loop, model_parallel_loop
from tracebuild import annotation, cpu_op, kernel, runtime, sample_report, write_trace

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
    """The steps on the GPU's clock (µs), recomputed from the raw events (tests/reference_split.py)."""
    from reference_split import step_windows as device_windows

    return [(window.begin / 1000, window.done / 1000) for window in device_windows(events)]


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
    # the host recorded nothing in the pause: it is neither launch overhead nor a pause of launching
    # (issue 51): the card names it as untraced time and advises recording stacks, not CUDA graphs
    evidence = dict(low.evidence)
    assert "idle: nothing recorded on the host" in evidence
    assert evidence["longest such gap"].startswith(
        f"{format_duration(pause * 1000)}: nothing recorded on the host"
    )
    assert low.advice is advice.UNTRACED and "CUDA graph" not in low.advice.after


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
    assert launch.savings_per_step_ns == round(sum(gaps) * 1000 / steps)
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
    assert launch.savings_per_step_ns == round(sum(short) * 1000 / len(windows))
    # the pauses, in which the host recorded nothing, are not host-launch idle at all (issue 51)
    assert dict(launch.evidence)["share of the host-launch idle in such gaps"] == "100%"
    # they are left to low-gpu-utilization, which names them as untraced host time (not CUDA graphs)
    low = card(findings, "low-gpu-utilization")
    assert low.savings_per_step_ns == round(sum(pauses) * 1000 / len(windows))
    assert low.advice is advice.UNTRACED


@pytest.mark.parametrize(
    "name", ["gp100_mlp_pageable_sync.json.gz", "v100_resnet50_workers4.pt.trace.json.gz"]
)
def test_launch_bound_samples_show_their_pattern(name: str) -> None:
    """The short host-bound gaps of the plain-Python idle split (tests/reference_split.py), and the
    raw kernels, inside the steady steps (every step steady in these two)."""
    from reference_split import reference_gaps
    from tracebuild import SAMPLES, read_events

    gaps = reference_gaps(SAMPLES / name)
    first, last = gaps.windows[0][1], gaps.windows[-1][2]
    steps, window = len(gaps.windows), sum(end - start for _, start, end in gaps.windows)
    host_bound = [
        (start, end)
        for _, start, end, kind in gaps.classified
        if kind == "host-bound" and start < last and end > first
    ]
    short = [(start, end) for start, end in host_bound if end - start < 1_000_000]
    idle = sum(min(end, last) - max(start, first) for start, end in short)
    _, events = read_events(SAMPLES / name)
    kernels = [
        e["dur"]
        for e in events
        if e.get("cat") in ("kernel", "Kernel") and first <= round(e["ts"] * 1000) < last
    ]
    top = next(f for f in sample_report(name).findings if not f.minor)
    assert top.rule == "launch-bound"
    assert top.title == (
        f"The host cannot launch kernels fast enough: GPU 0 waits {idle / window:.0%} of each step in "
        f"{len(short) / steps:,.0f} short gaps between {len(kernels) / steps:,.0f} kernels per step (median gap "
        f"{format_duration(median(end - start for start, end in short))}, median kernel "
        f"{format_duration(median(kernels) * 1000)})"
    )
    share = idle / sum(min(end, last) - max(start, first) for start, end in host_bound)
    assert dict(top.evidence)["share of the host-launch idle in such gaps"].startswith(f"{share:.0%}")


def test_a_toy_with_few_kernels_is_not_launch_bound() -> None:
    # legacy_category_names: 4 kernels and 3 gaps, one of 1.45 ms: no pattern of many short gaps
    assert "launch-bound" not in {f.rule for f in sample_report("legacy_category_names.json.gz").findings}


# --- per-parameter collectives ---------------------------------------------------------------------


def _per_parameter_allreduces(
    *, steps: int = 4, parameters: int = 120, allreduce_us: float = 10, ddp: bool = False
) -> list[dict[str, Any]]:
    """Training steps: 8 compute kernels of 100 µs, then ``parameters`` all-reduces of ``allreduce_us``, one
    per gradient, each issued by its own ``dist.all_reduce`` (c10d::allreduce_ → record_param_comms
    → a launch 4 µs after the last) and queued back to back on the NCCL stream after the compute;
    ``optimizer.step()`` and a sync end the step."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(steps):
        start = t
        for k in range(8):
            correlation = next(_correlation)
            events.append(runtime("cudaLaunchKernel", start + k * 2, 1, correlation=correlation))
            events.append(kernel(start + 20 + k * 100, 100, correlation=correlation))
        gpu_free = start + 20 + 800
        if ddp:
            events.append(annotation("DistributedDataParallel.forward", start, 17))
        for index in range(parameters):
            at = start + 20 + index * 4
            correlation = next(_correlation)
            events += [
                cpu_op("c10d::allreduce_", at, 3.5),
                cpu_op("record_param_comms", at + 0.5, 2.5),
                runtime("cudaLaunchKernel", at + 1, 1, correlation=correlation),
                kernel(
                    gpu_free,
                    allreduce_us,
                    correlation=correlation,
                    stream=20,
                    name="ncclKernel_AllReduce_RING_LL_Sum_float",
                ),
            ]
            gpu_free += allreduce_us
        end_of_launches = start + 20 + parameters * 4
        events.append(annotation("Optimizer.step#SGD.step", end_of_launches, 5))
        events.append(
            runtime("cudaStreamSynchronize", end_of_launches + 6, gpu_free + 2 - (end_of_launches + 6))
        )
        t = gpu_free + 10
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
    return events


def test_per_parameter_all_reduces_are_counted_and_named(tmp_path: Path) -> None:
    events = _per_parameter_allreduces()
    windows = step_windows(events)
    allreduces = [e for e in events if e["cat"] == "kernel" and "AllReduce" in e["name"]]
    per_step = len(allreduces) / len(windows)
    exposed = sum(e["dur"] for e in allreduces)  # no compute kernel runs under any of them
    findings = evaluate(analysis_of(tmp_path, events))
    comm = card(findings, "exposed-communication")
    assert comm.title == (
        f"GPU 0 communicates with no compute under it {exposed / sum(e - s for s, e in windows):.0%} of "
        f"each step: {per_step:.0f} small all-reduces per step, one per parameter "
        f"(median {format_duration(median(e['dur'] for e in allreduces) * 1000)} each)"
    )
    assert dict(comm.evidence)["collectives"].startswith(f"{per_step:.0f} all-reduces per step (median ")
    # no DDP: the user's own loop of dist.all_reduce → DDP, or flatten into buckets
    assert comm.advice is advice.PER_PARAMETER_LOOP and "DDP(model" in comm.advice.after
    assert "dist.all_reduce(p.grad)" in comm.advice.before


def test_per_parameter_all_reduces_under_ddp_get_bucket_advice(tmp_path: Path) -> None:
    findings = evaluate(analysis_of(tmp_path, _per_parameter_allreduces(ddp=True)))
    comm = card(findings, "exposed-communication")
    assert comm.advice is advice.PER_PARAMETER_DDP and "bucket_cap_mb" in comm.advice.after


def test_a_few_bucketed_all_reduces_are_not_the_per_parameter_pattern(tmp_path: Path) -> None:
    # DDP's usual buckets: 8 all-reduces of 150 µs per step
    findings = evaluate(analysis_of(tmp_path, _per_parameter_allreduces(parameters=8, allreduce_us=150)))
    comm = card(findings, "exposed-communication")
    assert "one per parameter" not in comm.title and "the pattern" not in dict(comm.evidence)
    assert comm.advice is advice.COMMUNICATION


# --- advice code that fits the trace -------------------------------------------------------------


def _sgd_steps(per_step: int = 60) -> list[dict[str, Any]]:
    """A loop whose ``optimizer.step()`` (torch.optim.SGD, no foreach) launches ``per_step``
    one-parameter kernels; a sync ends each step."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(4):
        start = t
        events.append(annotation("Optimizer.step#SGD.step", start + 20, 300))
        for index in range(per_step):
            correlation = next(_correlation)
            events.append(runtime("cudaLaunchKernel", start + 21 + index * 4, 2, correlation=correlation))
            events.append(
                kernel(start + 35 + index * 4, 2, correlation=correlation, name="sgd_kernel<float>")
            )
        events.append(runtime("cudaStreamSynchronize", start + 330, 10))
        t = start + 400
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
    return events


def test_an_sgd_trace_is_advised_in_sgd(tmp_path: Path) -> None:
    events = _sgd_steps()
    (name,) = {
        e["name"].split("#")[1].split(".")[0] for e in events if e["name"].startswith("Optimizer.step#")
    }
    optimizer = card(evaluate(analysis_of(tmp_path, events)), "optimizer-not-fused")
    assert optimizer.title.startswith(f"{name}.step() launches 60 small kernels per step")
    assert (
        f"torch.optim.{name}(" in optimizer.advice.before and f"torch.optim.{name}(" in optimizer.advice.after
    )
    assert (
        "fused=True" in optimizer.advice.after
        and "AdamW" not in optimizer.advice.before + optimizer.advice.after
    )


def test_the_sgd_samples_are_advised_in_sgd() -> None:
    for sample in ("v100_resnet50_workers0.pt.trace.json.gz", "v100_resnet50_workers4.pt.trace.json.gz"):
        optimizer = card(sample_report(sample).findings, "optimizer-not-fused")
        assert "torch.optim.SGD(" in optimizer.advice.after and "AdamW" not in optimizer.advice.after


def test_an_optimizer_without_a_fused_kernel_is_told_foreach_and_a_custom_one_foreach_ops() -> None:
    assert "torch.optim.RMSprop(" in advice.fused_optimizer("RMSprop").after
    assert "foreach=True" in advice.fused_optimizer("RMSprop").after
    assert "fused" not in advice.fused_optimizer("RMSprop").after
    custom = advice.fused_optimizer("Lion")
    assert "Lion" in custom.summary and "torch._foreach_" in custom.after


def _compiled(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``events`` as a compiled model runs them: every kernel TorchInductor's, launched inside a
    ``CompiledFunction`` range that covers each step."""
    compiled = []
    for index, event in enumerate(events):
        if event["cat"] == "kernel":
            event = {**event, "name": f"triton_poi_fused_add_mul_{index % 7}"}
        compiled.append(event)
        if event["name"].startswith("ProfilerStep#"):
            compiled.append(cpu_op("CompiledFunction", event["ts"], event["dur"] - 1))
    return compiled


def test_a_compiled_model_is_not_told_to_compile(tmp_path: Path) -> None:
    events = _compiled(launch_loop(steps=6, kernels=12).events)
    kernels = [e for e in events if e["cat"] == "kernel"]
    inductor = [e for e in kernels if e["name"].startswith("triton_poi_fused_")]
    regions = [e for e in events if e["name"] == "CompiledFunction"]
    launch = card(evaluate(analysis_of(tmp_path, events)), "launch-bound")
    assert launch.advice is advice.LAUNCH_BOUND_COMPILED
    assert (
        "torch.compile(MyModel" not in launch.advice.after and 'mode="reduce-overhead"' in launch.advice.after
    )
    assert dict(launch.evidence)["torch.compile"] == (
        f"{len(kernels)} of {len(kernels)} kernels compiled ({len(inductor)} TorchInductor's triton_*, "
        f"{len(regions)} compiled regions ran); no CUDA graph replays"
    )


def test_an_eager_model_is_told_to_compile(tmp_path: Path) -> None:
    launch = card(evaluate(analysis_of(tmp_path, launch_loop(steps=6, kernels=12).events)), "launch-bound")
    assert launch.advice is advice.LAUNCH_BOUND and "torch.compile" not in dict(launch.evidence)


def test_ddp_buffer_broadcast_on_the_host_is_advised_as_ddp_not_as_a_dataset() -> None:
    """a100_ddp_nccl: the host idles the GPU in aten::unflatten_dense_tensors inside
    DistributedDataParallel.forward (DDP's buffer broadcast), not in the user's data preparation."""
    from tracebuild import SAMPLES, read_events

    _, events = read_events(SAMPLES / "a100_ddp_nccl.json.gz")
    forwards = [
        e for e in events if e.get("name") == "DistributedDataParallel.forward" and e.get("ph") == "X"
    ]
    unflatten = [e for e in events if e.get("name") == "aten::unflatten_dense_tensors"]
    assert unflatten and all(
        any(f["ts"] <= u["ts"] and u["ts"] + u["dur"] <= f["ts"] + f["dur"] for f in forwards)
        for u in unflatten
    )
    low = card(sample_report("a100_ddp_nccl.json.gz").findings, "low-gpu-utilization")
    assert dict(low.evidence)["the host was in"].startswith("aten::unflatten_dense_tensors")
    assert low.advice is advice.DDP_BUFFERS and "Dataset" not in low.advice.after


# --- a pipeline bubble: one thread, two GPUs -------------------------------------------------------

TWO_GPUS = {"deviceProperties": [{"id": 0, "name": "Test GPU"}, {"id": 1, "name": "Test GPU"}]}


def _busy_gaps(events: list[dict[str, Any]], device: int) -> list[tuple[float, float]]:
    """(start, end) of the idle stretches between the merged GPU activity of ``device`` (µs)."""
    spans = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["cat"] in ("kernel", "gpu_memcpy") and e["args"]["device"] == device
    )
    gaps, busy_until = [], spans[0][1]
    for start, end in spans[1:]:
        if start > busy_until:
            gaps.append((busy_until, start))
        busy_until = max(busy_until, end)
    return gaps


def test_a_model_parallel_pair_is_a_pipeline_bubble(tmp_path: Path) -> None:
    loop = model_parallel_loop(steps=6)
    windows = step_windows(loop.events)
    lengths = sorted(end - start for start, end in windows)
    assert lengths[-1] < 2 * median(lengths)  # no start-up or outlier step: all are steady
    total = sum(end - start for start, end in windows)
    findings = evaluate(analysis_of(tmp_path, loop.events, **TWO_GPUS))
    bubbles = {f.device: f for f in findings if f.rule == "pipeline-bubble"}
    assert set(bubbles) == {0, 1}
    for device, other in ((1, 0), (0, 1)):
        # the gaps of 50 µs or more inside the steps: each waits for the other GPU
        idle = sum(
            max(0.0, min(end, w_end) - max(start, w_start))
            for start, end in _busy_gaps(loop.events, device)
            if end - start >= 50
            for w_start, w_end in windows
        )
        amount = (
            f"{format_duration(round(idle * 1000 / len(windows)))} per step ({idle / total:.0%} of each step)"
        )
        bubble = bubbles[device]
        assert bubble.title == (
            f"GPU {device} waits for GPU {other} {amount}: a pipeline bubble, the model's stages run one "
            "after the other"
        )
        assert bubble.advice is advice.PIPELINE and "split(" in bubble.advice.after
    # GPU 0's idle is not "host busy in aten::item": the host waited in it for GPU 1
    gpu0 = dict(bubbles[0].evidence)["longest such gap"]
    assert "cudaStreamSynchronize in aten::item while GPU 1 worked" in gpu0
    assert "low-gpu-utilization" not in {f.rule for f in findings}


def test_the_pipeline_bubble_split_equals_the_plain_python_recomputation(tmp_path: Path) -> None:
    from reference_split import reference_split

    path = write_trace(tmp_path / "mp.json", model_parallel_loop(steps=6).events, **TWO_GPUS)
    expected = reference_split(path)
    result = analyze(load_trace(path))
    assert {d.device: dict(d.idle_by_cause_ns) for d in result.devices} == expected.devices
    assert {(s.step, s.device): dict(s.idle_by_cause_ns) for s in result.steps} == expected.steps
    assert all("other-gpu" in causes for causes in expected.devices.values())


def test_one_process_per_gpu_is_never_a_pipeline_bubble(tmp_path: Path) -> None:
    """The same timeline with GPU 1 driven by a process of its own (two ranks in one file): its
    gaps are not waits for a GPU of the same process."""
    loop = model_parallel_loop(steps=6)
    on_gpu1 = {
        e["args"]["correlation"] for e in loop.events if e["cat"] == "kernel" and e["args"]["device"] == 1
    }
    for event in loop.events:
        if event["cat"] == "cuda_runtime" and event["args"]["correlation"] in on_gpu1:
            event["pid"] = 200
    result = analyze(load_trace(write_trace(tmp_path / "t.json", loop.events, **TWO_GPUS)))
    assert {gap.cause_kind for gap in result.idle_gaps} and all(
        gap.cause_kind != "other-gpu" for gap in result.idle_gaps
    )


def test_data_parallel_replicas_waiting_on_each_other_are_told_ddp(tmp_path: Path) -> None:
    """The same timeline with each GPU's kernels launched by a thread of its own and none spanning
    both (nn.DataParallel's replicas): the waits are named, the advice is DDP, not micro-batches."""
    loop = model_parallel_loop(steps=6)
    device_of = {e["args"]["correlation"]: e["args"]["device"] for e in loop.events if e["cat"] == "kernel"}
    for event in loop.events:
        if event["cat"] == "cuda_runtime" and event["args"]["correlation"] in device_of:
            event["tid"] = 300 + device_of[event["args"]["correlation"]]
    findings = evaluate(analysis_of(tmp_path, loop.events, **TWO_GPUS))
    waits = [f for f in findings if f.rule == "pipeline-bubble"]
    assert waits and all(f.advice is advice.DDP and "(nn.DataParallel)" in f.title for f in waits)


def test_host_time_inside_ddp_forward_is_advised_as_ddp_work(tmp_path: Path) -> None:
    """Steps whose GPU waits 3 ms while the host is inside DistributedDataParallel.forward (and no
    operator under it covers the gap): DDP's own work, not the user's data preparation."""
    events: list[dict[str, Any]] = []
    for step in range(4):
        start = step * 4000.0
        events.append(annotation(f"ProfilerStep#{step}", start, 4000))
        events.append(annotation("DistributedDataParallel.forward", start + 100, 3300))
        for k in range(4):
            at = start + 3420 + k * 20
            correlation = next(_correlation)
            events.append(runtime("cudaLaunchKernel", at, 3, correlation=correlation))
            events.append(kernel(at + 10, 100, correlation=correlation))
    low = card(evaluate(analysis_of(tmp_path, events)), "low-gpu-utilization")
    assert dict(low.evidence)["the host was in"].startswith("DistributedDataParallel.forward")
    assert low.advice is advice.DDP_FORWARD and "Dataset" not in low.advice.after
