"""The rules of what slows real training loops (issue 10): each fires on a hand-built trace and on a
real sample that shows it, stays quiet on its healthy twin, with figures computed here."""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from loops import item_loop
from tracebuild import annotation, cpu_op, frame, kernel, runtime, sample_report, write_trace

from traceinsight.analysis import Analysis, analyze
from traceinsight.load import load_trace
from traceinsight.render.scorecard import scorecard
from traceinsight.results import Report
from traceinsight.results.contract import result_of
from traceinsight.rules import evaluate
from traceinsight.rules.findings import Finding

_correlation = itertools.count(700_000)


def analysis_of(tmp_path: Path, events: list[dict[str, Any]], **top: Any) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events, **top)))


def found(tmp_path: Path, events: list[dict[str, Any]], **top: Any) -> tuple[Finding, ...]:
    return evaluate(analysis_of(tmp_path, events, **top))


def rules(findings: tuple[Finding, ...]) -> set[str]:
    return {finding.rule for finding in findings}


def sample_rules(name: str) -> set[str]:
    return {finding.rule for finding in sample_report(name).findings}


def gpu_bound_steps(
    names: list[str], *, steps: int = 4, kernel_us: float = 100, device: int = 0, pid: int = 100
) -> list[dict[str, Any]]:
    """Steps of 8 kernels (named in turn from ``names``) queued in 16 µs, then a stream sync that
    waits for them: the GPU sets the pace, as in a loop that reads its loss every step."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(steps):
        start = t
        for k in range(8):
            correlation = next(_correlation)
            call = runtime("cudaLaunchKernel", start + k * 2, 1, correlation=correlation)
            call["pid"] = pid
            events.append(call)
            gpu = kernel(
                start + 10 + k * kernel_us, kernel_us, correlation=correlation, name=names[k % len(names)]
            )
            gpu["pid"] = gpu["args"]["device"] = device
            events.append(gpu)
        drained = start + 10 + 8 * kernel_us
        sync = runtime("cudaStreamSynchronize", start + 20, drained + 2 - (start + 20))
        sync["pid"] = pid
        events.append(sync)
        t = drained + 7
        step_range = annotation(f"ProfilerStep#{step}", start, t - start)
        step_range["pid"] = pid
        events.append(step_range)
    return events


def device(capability: tuple[int, int]) -> dict[str, Any]:
    return {
        "deviceProperties": [
            {"id": 0, "name": "Test GPU", "computeMajor": capability[0], "computeMinor": capability[1]}
        ]
    }


# --- launch-bound -------------------------------------------------------------------------------


def test_launch_bound_fires_on_a_loop_of_tiny_kernels(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    for step in range(4):  # 10 kernels of 20 µs, each after 90 µs of dispatch on the host
        start = step * 1000
        events.append(annotation(f"ProfilerStep#{step}", start, 1000))
        for k in range(10):
            correlation = next(_correlation)
            events.append(cpu_op("aten::add", start + k * 100 - 85, 93))
            events.append(runtime("cudaLaunchKernel", start + k * 100 + 5, 3, correlation=correlation))
            events.append(kernel(start + k * 100 + 15, 20, correlation=correlation))
    result = found(tmp_path, events)
    launch = next(f for f in result if f.rule == "launch-bound")
    assert "10 kernels per step" in launch.title and "median kernel 20.0 µs" in launch.title
    assert "aten::add" in dict(launch.evidence)["the host was dispatching"]
    # low-gpu-utilization does not count the same launch idle again: one finding per fix
    assert "low-gpu-utilization" not in rules(result)


def test_launch_bound_is_the_top_finding_on_b200_eager_decode() -> None:
    top = next(f for f in sample_report("b200_eager_stacks.json.gz").findings if not f.minor)
    assert top.rule == "launch-bound"


def test_launch_bound_quiet_on_a_gpu_bound_loop(tmp_path: Path) -> None:
    assert "launch-bound" not in rules(found(tmp_path, gpu_bound_steps(["relu_kernel"])))


# --- sync-in-forward ----------------------------------------------------------------------------


def test_a_sync_inside_a_module_forward_is_sync_in_forward(tmp_path: Path) -> None:
    loop = item_loop()
    for step_start, step_end in loop.steps:  # the .item() runs inside a module's forward
        loop.events.append(
            frame("nn.Module: GatedBlock_0", step_start + 90, step_end - step_start - 200, python_id=0)
        )
    result = found(tmp_path, loop.events)
    forward = next(f for f in result if f.rule == "sync-in-forward")
    assert "GatedBlock's forward" in forward.title and "train.py:52" in forward.title
    assert dict(forward.evidence)["inside the forward of"] == "GatedBlock"
    assert "sync-in-loop" not in rules(result)


def test_bert_mask_check_is_a_sync_in_forward() -> None:
    forward = next(
        f for f in sample_report("h100_bert_small_stacks.json.gz").findings if f.rule == "sync-in-forward"
    )
    assert "BertModel's forward" in forward.title


# --- amp / tf32 ---------------------------------------------------------------------------------


def test_amp_fires_on_fp32_matmuls_on_volta_with_a_replayed_saving(tmp_path: Path) -> None:
    events = gpu_bound_steps(["volta_sgemm_128x64_nn", "relu_kernel"], kernel_us=100)
    result = found(tmp_path, events, **device((7, 0)))
    amp = next(f for f in result if f.rule == "amp-opportunity")
    assert amp.title.startswith("50% of GPU 0's kernel time is fp32 matrix multiplies")
    # GPU-bound: 4 sgemm kernels of 100 µs per step run twice as fast → each step 200 µs shorter
    assert amp.savings_per_step_ns == pytest.approx(200_000, rel=0.02)
    assert "tf32-opportunity" not in rules(result)


def test_amp_quiet_when_the_matmuls_already_use_tensor_cores(tmp_path: Path) -> None:
    events = gpu_bound_steps(["volta_h884gemm_64x64_ldg8_nn", "relu_kernel"])
    assert "amp-opportunity" not in rules(found(tmp_path, events, **device((7, 0))))


def test_amp_quiet_without_tensor_cores(tmp_path: Path) -> None:
    events = gpu_bound_steps(["maxwell_sgemm_128x64_nn", "relu_kernel"])
    assert not {"amp-opportunity", "tf32-opportunity"} & rules(found(tmp_path, events, **device((6, 0))))


def test_tf32_not_amp_on_ampere(tmp_path: Path) -> None:
    events = gpu_bound_steps(["ampere_sgemm_128x64_nn", "relu_kernel"])
    result = rules(found(tmp_path, events, **device((8, 0))))
    assert "tf32-opportunity" in result and "amp-opportunity" not in result


def test_amp_on_the_v100_samples_and_not_on_b200() -> None:
    assert "amp-opportunity" in sample_rules("v100_ddp_ns_timestamps.pt.trace.json.gz")
    assert "amp-opportunity" in sample_rules("v100_resnet50_workers0.pt.trace.json.gz")
    assert not {"amp-opportunity", "tf32-opportunity"} & sample_rules("b200_eager_stacks.json.gz")
    assert "tf32-opportunity" in sample_rules("a100_alexnet_cuda_sync.json.gz")


# --- exposed-communication -----------------------------------------------------------------------


def _compute_then_allreduce(*, overlapped: bool, devices: tuple[int, ...] = (0,)) -> list[dict[str, Any]]:
    """4 steps: 8 kernels of 100 µs, and a 300 µs all-reduce on stream 20, after the compute (alone)
    or under it; one process drives every device in ``devices``; a sync at the step's end waits."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(4):
        start = t
        for gpu in devices:
            for k in range(8):
                correlation = next(_correlation)
                events.append(runtime("cudaLaunchKernel", start + k * 2, 1, correlation=correlation))
                work = kernel(start + 10 + k * 100, 100, correlation=correlation, device=gpu)
                work["pid"] = gpu
                events.append(work)
            correlation = next(_correlation)
            events.append(runtime("cudaLaunchKernel", start + 17, 1, correlation=correlation))
            at = start + 50 if overlapped else start + 810
            comm = kernel(
                at,
                300,
                correlation=correlation,
                name="ncclKernel_AllReduce_RING_LL_Sum_float",
                stream=20,
                device=gpu,
            )
            comm["pid"] = gpu
            events.append(comm)
        drained = start + (810 if overlapped else 1110)
        events.append(runtime("cudaStreamSynchronize", start + 20, drained + 2 - (start + 20)))
        t = drained + 7
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
    return events


def test_exposed_communication_fires_when_collectives_run_alone(tmp_path: Path) -> None:
    result = analysis_of(tmp_path, _compute_then_allreduce(overlapped=False))
    comm = next(f for f in evaluate(result) if f.rule == "exposed-communication")
    # 300 µs of each 1117 µs step
    assert f"communicates with no compute under it {300 / 1117:.0%} of each step" in comm.title


def test_exposed_communication_quiet_when_overlapped(tmp_path: Path) -> None:
    assert "exposed-communication" not in rules(found(tmp_path, _compute_then_allreduce(overlapped=True)))


def test_exposed_communication_on_the_two_rank_sample() -> None:
    assert "exposed-communication" in sample_rules("two_ranks/rank-0.json.gz")


def test_one_process_on_two_gpus_is_told_to_use_ddp(tmp_path: Path) -> None:
    result = analysis_of(tmp_path, _compute_then_allreduce(overlapped=False, devices=(0, 1)))
    assert result.multi_gpu_processes == 1
    comm = next(f for f in evaluate(result) if f.rule == "exposed-communication")
    assert "nn.DataParallel" in comm.title and "DistributedDataParallel" in comm.advice.summary


# --- optimizer-not-fused -------------------------------------------------------------------------


def _optimizer_steps(kernel_name: str, per_step: int, *, zeroing: int = 0) -> list[dict[str, Any]]:
    events = gpu_bound_steps(["relu_kernel"], steps=4)
    starts = sorted(e["ts"] for e in events if e["name"].startswith("ProfilerStep#"))
    for step_start in starts:
        start = step_start + 20
        events.append(annotation("Optimizer.step#SGD.step", start, 300))
        for index in range(per_step):
            correlation = next(_correlation)
            events.append(runtime("cudaLaunchKernel", start + 1 + index * 4, 2, correlation=correlation))
            events.append(
                kernel(start + 900 + index, 1, correlation=correlation, name=kernel_name, stream=30)
            )
        if zeroing:
            events.append(annotation("Optimizer.zero_grad#SGD.zero_grad", start + 310, 100))
            for index in range(zeroing):
                correlation = next(_correlation)
                events.append(runtime("cudaMemsetAsync", start + 311 + index, 0.5, correlation=correlation))
                memset = kernel(
                    start + 950 + index, 1, correlation=correlation, name="Memset (Device)", stream=30
                )
                memset["cat"] = "gpu_memset"
                events.append(memset)
    return events


def test_a_per_parameter_optimizer_loop_is_found(tmp_path: Path) -> None:
    result = found(tmp_path, _optimizer_steps("elementwise_kernel<add>", 60, zeroing=20))
    steps = [f for f in result if f.rule == "optimizer-not-fused"]
    assert any("SGD.step() launches 60 small kernels per step" in f.title for f in steps)
    assert any("zero_grad() writes zeros into every gradient: 20 kernels per call" in f.title for f in steps)
    # the steps' host time in all, and per optimizer step: each Optimizer.step range is 300 µs
    (fused,) = (f for f in steps if "small kernels" in f.title)
    host = dict(fused.evidence)["host time in optimizer.step()"]
    steady = int(dict(fused.evidence)["optimizer steps in the steady state"])
    assert host == f"{steady * 0.3:.2f} ms (0.30 ms per step)"


def test_a_multi_tensor_optimizer_is_quiet(tmp_path: Path) -> None:
    events = _optimizer_steps("multi_tensor_apply_kernel<SGDFunctor>", 60)
    assert "optimizer-not-fused" not in rules(found(tmp_path, events))


def test_optimizer_on_real_samples() -> None:
    assert "optimizer-not-fused" in sample_rules("v100_resnet50_workers0.pt.trace.json.gz")  # torch 1.8 SGD


# --- latent-sync (no GPU) -----------------------------------------------------------------------


def _cpu_steps(ops: list[tuple[str, float, float]], *, module: bool = False) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for step in range(4):
        start = step * 1000
        events.append(annotation(f"ProfilerStep#{step}", start, 1000))
        events.append(frame("train.py(52): train_step", start + 1, 990, python_id=step * 10 + 1))
        if module:
            events.append(frame("nn.Module: Router_0", start + 5, 900, python_id=step * 10 + 2))
        for name, at, duration in ops:
            events.append(cpu_op(name, start + at, duration))
    return events


def test_a_cpu_run_is_told_where_a_gpu_run_would_wait(tmp_path: Path) -> None:
    events = _cpu_steps([("aten::item", 500, 10), ("aten::_local_scalar_dense", 501, 8)])
    result = analysis_of(tmp_path, events, deviceProperties=[])
    latent = next(f for f in evaluate(result) if f.rule == "latent-sync")
    # torch's frame names train_step by its def line (entered while recording): never "at" it
    assert latent.title.startswith(
        "`.item()` in `train_step` (defined at train.py:52) would make the host wait for the GPU every step"
    )
    assert not latent.minor and not latent.saving_known
    score = next(
        s for s in scorecard(result_of(Report(result, evaluate(result)))) if s.label == "Host syncs / step"
    )
    assert score.value == "1 on a GPU" and "No host waits" not in score.verdict


def test_a_latent_sync_in_a_forward_is_sync_in_forward(tmp_path: Path) -> None:
    events = _cpu_steps([("aten::is_nonzero", 500, 10), ("aten::item", 501, 8)], module=True)
    result = rules(found(tmp_path, events, deviceProperties=[]))
    assert "sync-in-forward" in result and "latent-sync" not in result


def test_no_latent_syncs_without_such_ops(tmp_path: Path) -> None:
    events = _cpu_steps([("aten::addmm", 500, 10)])
    assert not {"latent-sync", "sync-in-forward"} & rules(found(tmp_path, events, deviceProperties=[]))


def _steps_with(
    extra: list[tuple[str, float, float]], ops: list[tuple[str, float, float]]
) -> list[dict[str, Any]]:
    """``_cpu_steps`` with annotations (name, start, duration) added to every step."""
    events = _cpu_steps(ops)
    for step in range(4):
        start = step * 1000
        for name, at, duration in extra:
            if name.startswith("frame:"):
                events.append(
                    frame(name.removeprefix("frame:"), start + at, duration, python_id=step * 10 + 5)
                )
            else:
                events.append(annotation(name, start + at, duration))
    return events


def _what(title: str) -> str:
    """A latent-sync title's first words: what the line does (before "at train.py:52" or, for a
    line torch's stack names by its function's first line, "in `train_step` (defined at …)")."""
    return title.split(" at ")[0].split(" in `")[0]


def _not_counted(result: Analysis) -> str:
    return next(
        s for s in scorecard(result_of(Report(result, evaluate(result)))) if s.label.startswith("Host syncs")
    ).verdict


def test_adams_step_counters_and_the_data_pipeline_are_not_would_be_syncs(tmp_path: Path) -> None:
    """Adam's `.item()` reads its CPU step counter; what the DataLoader's fetch reads is a CPU tensor
    too: neither would wait for a GPU (both were cards at the optimizer.step() and for lines)."""
    events = _steps_with(
        [("Optimizer.step#Adam.step", 400, 200), ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 10, 100)],
        [("aten::item", 450, 10), ("aten::item", 470, 5), ("aten::is_nonzero", 20, 5), ("aten::item", 40, 5)],
    )  # fmt: skip
    result = analysis_of(tmp_path, events, deviceProperties=[])
    assert not {"latent-sync", "sync-in-forward"} & {f.rule for f in evaluate(result)}
    kept = {(sync.cpu_value, sync.cpu_detail): sync.count for sync in result.latent_syncs}
    # counted here: per step, two reads inside Adam's step and two inside the fetch
    assert kept == {
        ("optimizer step counters", "Adam"): 4 * 2,
        ("data loading", "the DataLoader's fetch"): 4 * 2,
    }
    assert "Not counted: 16 reads of CPU values (data loading, optimizer step counters)" in _not_counted(
        result
    )


def test_a_step_counter_read_is_the_innermost_optimizer_s_when_two_start_together(tmp_path: Path) -> None:
    """An optimizer whose step calls another's at once (both ranges start together): the counters
    read inside are the inner optimizer's (AdamW, the range that ends first), every step. Was: the
    range that started last, and between two starting together whichever the sort left last."""
    events = _steps_with(
        [("Optimizer.step#Adam.step", 400, 200), ("Optimizer.step#AdamW.step", 400, 100)],
        [("aten::item", 450, 10), ("aten::item", 470, 5)],
    )
    result = analysis_of(tmp_path, events, deviceProperties=[])
    kept = {(sync.cpu_value, sync.cpu_detail): sync.count for sync in result.latent_syncs}
    assert kept == {("optimizer step counters", "AdamW"): 4 * 2}


def test_reads_inside_other_optimizers_or_user_code_in_a_step_are_would_be_syncs(tmp_path: Path) -> None:
    """LBFGS reads the loss and the gradients (GPU values on a GPU); a closure (the user's code,
    called from the step) reads what the user's code computed: both stay would-be syncs."""
    lbfgs = _steps_with([("Optimizer.step#LBFGS.step", 400, 200)], [("aten::is_nonzero", 450, 10)])
    assert "latent-sync" in rules(found(tmp_path, lbfgs, deviceProperties=[]))
    closure = _steps_with(
        [("Optimizer.step#Adam.step", 400, 200), ("frame:train.py(60): closure", 420, 100)],
        [("aten::item", 450, 10)],
    )
    (latent,) = [f for f in found(tmp_path, closure, deviceProperties=[]) if f.rule == "latent-sync"]
    assert latent.source == "train.py:60"


def test_printing_a_tensor_is_one_would_be_sync_at_its_line(tmp_path: Path) -> None:
    """print(loss) formats the tensor: a boolean-mask selection, `if`s and `.item()`, in __repr__
    with __format__ inside it: one card for the line, once per print (it was three cards)."""
    events = _steps_with(
        [("frame:torch/_tensor.py(568): __repr__", 400, 300), ("frame:torch/_tensor.py(1136): __format__", 600, 50)],
        [("aten::masked_select", 410, 10), ("aten::is_nonzero", 450, 10), ("aten::is_nonzero", 470, 10),
         ("aten::item", 610, 10)],
    )  # fmt: skip
    latent = [
        f
        for f in found(tmp_path, events, deviceProperties=[])
        if f.rule in ("latent-sync", "sync-in-forward")
    ]
    assert [(f.source, _what(f.title)) for f in latent] == [
        ("train.py:52", '`print(tensor)` or formatting a tensor (`str(t)`, `f"{t}"`)')
    ]
    assert "every step" in latent[0].title  # 4 prints in 4 steps, not 16 operators


def test_several_reads_at_one_line_are_one_card_naming_each(tmp_path: Path) -> None:
    events = _cpu_steps([("aten::is_nonzero", 500, 10), ("aten::masked_select", 600, 10)])
    latent = [f for f in found(tmp_path, events, deviceProperties=[]) if f.rule == "latent-sync"]
    assert [_what(f.title) for f in latent] == ["A Python `if` on a tensor and boolean-mask indexing"]
    # outside a forward the trace cannot tell whether the value would be on the GPU: said so
    assert "the trace cannot tell" in dict(latent[0].evidence)["on this run"]


def test_would_be_syncs_rank_by_how_often_they_would_wait(tmp_path: Path) -> None:
    """An `if` in a forward 8x per step ranks before one .item() per step (it ranked last)."""
    events: list[dict[str, Any]] = []
    for step in range(4):
        start = step * 1000
        events.append(annotation(f"ProfilerStep#{step}", start, 1000))
        events.append(frame("train.py(52): train_step", start + 1, 990, python_id=step * 10 + 1))
        events.append(frame("nn.Module: Router_0", start + 5, 400, python_id=step * 10 + 2))
        events.append(frame("model.py(10): forward", start + 6, 390, python_id=step * 10 + 3))
        events += [cpu_op("aten::is_nonzero", start + 10 + 40 * index, 5) for index in range(8)]
        events.append(cpu_op("aten::item", start + 600, 5))
    latent = [
        f
        for f in found(tmp_path, events, deviceProperties=[])
        if f.rule in ("latent-sync", "sync-in-forward")
    ]
    assert [(f.rule, f.source, f.severity) for f in latent] == [
        ("sync-in-forward", "model.py:10", "high"),
        ("latent-sync", "train.py:52", "medium"),
    ]


def test_without_steps_the_scorecard_counts_the_would_be_syncs_the_findings_count(tmp_path: Path) -> None:
    """No step markers: the scorecard said "Host syncs 0" beside a finding counting the calls."""
    events = [frame("train.py(52): main", 0, 5000, python_id=1)]
    events += [cpu_op("aten::item", 10 + 100 * index, 5) for index in range(12)]
    result = analysis_of(tmp_path, events, deviceProperties=[])
    score = next(
        s for s in scorecard(result_of(Report(result, evaluate(result)))) if s.label.startswith("Host syncs")
    )
    assert (score.label, score.value) == ("Host syncs", "12 on a GPU")
    # no steps to count the line's in: not "in 0 steps"
    assert [(sync.steady_count, sync.steady_steps_with) for sync in result.latent_syncs] == [(12, None)]


def test_a_run_trace_without_steps_says_how_to_mark_them_not_with_stack(tmp_path: Path) -> None:
    """A trace of `traceinsight run` that saw no step: the advice is run's traceinsight.step(), not
    torch's with_stack=True nor --wait (options run does not have, or that cannot help)."""
    events = [cpu_op("aten::item", 10 + 100 * index, 5) for index in range(12)]
    record = {"stacks": "user", "stepMarks": "none"}
    result = analysis_of(tmp_path, events, deviceProperties=[], traceinsight=record)
    texts = [value for f in evaluate(result) for _, value in f.evidence] + [w.advice for w in result.warnings]
    assert not [text for text in texts if "with_stack" in text or "--wait" in text], texts
    assert any("traceinsight.step()" in text for text in texts)


def _steps_ns(events: list[dict[str, Any]]) -> list[int]:
    """Each ProfilerStep's duration in ns, from the raw events (``dur`` is in µs)."""
    return [round(e["dur"] * 1000) for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]


def _median(values: list[int]) -> int:
    ordered = sorted(values)
    return ordered[len(ordered) // 2]


@pytest.mark.parametrize(("before_us", "warned"), [(500, True), (950, False)])
def test_recorded_steps_slower_than_the_unrecorded_ones_are_said(
    before_us: int, warned: bool, tmp_path: Path
) -> None:
    """`run` writes each step before recording; recorded steps more than 10% slower than the steady
    ones (the first left out) get a warning saying by how much and against what."""
    events = _cpu_steps([("aten::addmm", 500, 10)])
    before = [5_000_000, before_us * 1000, before_us * 1000 + 20_000, before_us * 1000 - 20_000]
    record = {
        "stacks": "user",
        "stepMarks": "optimizer",
        "unprofiledStepNs": _median(before),
        "unprofiledSteps": len(before),
        "unprofiledStepsNs": before,
    }
    result = analysis_of(tmp_path, events, deviceProperties=[], traceinsight=record)
    cost = [w for w in result.warnings if w.kind == "recording-cost"]
    assert bool(cost) == warned
    if warned:
        share = _median(_steps_ns(events)) / _median(before[1:]) - 1
        assert f"{share:.0%} more than unrecorded ones" in cost[0].message
        assert "the median of the 3 unrecorded steps before the window" in cost[0].message


def test_recording_cost_is_measured_against_steady_steps_not_start_up_ones(tmp_path: Path) -> None:
    """The baseline was the 1-2 steps just before recording, often start-up ones: a steady loop got
    a false "538 % slower", and a real 5x slowdown went unsaid. Now: the steps after the window
    (the one that wrote the trace left out), else those before it but the first, else none."""
    from traceinsight.results import RunContext, report_for

    events = _cpu_steps([("aten::addmm", 500, 10)])
    recorded = _median(_steps_ns(events))  # 1 ms
    path = write_trace(
        tmp_path / "t.json",
        events,
        deviceProperties=[],
        # what run wrote: the two steps before the window were quick start-up ones
        traceinsight={"stacks": "user", "stepMarks": "optimizer", "unprofiledStepNs": 160_000,
                      "unprofiledSteps": 2, "unprofiledStepsNs": [150_000, 160_000]},
    )  # fmt: skip
    trace = load_trace(path)

    def cost(after_ns: tuple[int, ...]) -> list[str]:
        run = RunContext("traceinsight run t.py", "t.py", "2026-12-05T11:00:00+00:00", None, 1.0, 0,
                         after_window_ns=after_ns)  # fmt: skip
        return [w.message for w in report_for(trace, run=run).analysis.warnings if w.kind == "recording-cost"]

    # the file alone: one step left once the first is out, no baseline, no false "525 % more"
    assert not [w for w in analyze(trace).warnings if w.kind == "recording-cost"]
    # steady steps after the window as long as the recorded ones: no warning
    assert cost((8_000_000, 990_000, 1_000_000, 980_000)) == []
    # a real 5x slowdown against the steady steps after the window is still said
    after = (8_000_000, 200_000, 210_000, 190_000)
    (message,) = cost(after)
    share = recorded / _median(list(after[1:])) - 1
    assert round(share, 2) == 4.0
    assert f"{share:.0%} more than unrecorded ones" in message
    assert "the median of the 3 unrecorded steps after the window" in message


def test_a_cpu_dataloader_share_never_passes_the_step(tmp_path: Path) -> None:
    """A fetch nested in another and one running past its step are counted once, inside the steps
    (a card said 107% of the step)."""
    events = _steps_with(
        [("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 900),
         ("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 100, 700)],
        [("aten::addmm", 950, 10)],
    )  # fmt: skip
    stall = next(f for f in found(tmp_path, events, deviceProperties=[]) if f.rule == "dataloader-stall")
    assert "(90% of the step)" in stall.title


def test_a_dataloader_cards_figures_are_shares_of_one_step(tmp_path: Path) -> None:
    """One DataLoader card gave 83 %, 76 % and 69 % for the same stall: the title's share was of
    the median step, the evidence's of all steps together, the saving's of the mean step. Now the
    title and the saving are both of the median step (the saving is its wait less the hand-over),
    and the evidence names what each of its shares is of. All from the raw events."""
    import statistics

    from traceinsight.thresholds import Thresholds

    loader = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
    events: list[dict[str, Any]] = []
    at = 0
    for step, (length, wait) in enumerate([(10, 9), (12, 10), (10, 8), (15, 10), (10, 6), (10, 8.5)]):  # ms
        events += [annotation(f"ProfilerStep#{step}", at, length * 1000),
                   annotation(loader, at + 1, wait * 1000),
                   cpu_op("aten::addmm", at + wait * 1000 + 10, 10)]  # fmt: skip
        at += length * 1000
    steps = [e["dur"] for e in events if e["name"].startswith("ProfilerStep#")]
    waits = [e["dur"] for e in events if e["name"] == loader]
    handover = Thresholds().dataloader_handover_us
    median_step = statistics.median(steps)
    title_share = statistics.median(waits) / median_step
    saving_share = statistics.median(w - handover for w in waits) / median_step
    overall = sum(waits) / sum(steps)
    # the three figures the old card gave differ here as on the real one
    mean_based = statistics.median(w - handover for w in waits) * len(steps) / sum(steps)
    assert len({f"{title_share:.0%}", f"{overall:.0%}", f"{mean_based:.0%}"}) == 3
    (card,) = [f for f in found(tmp_path, events, deviceProperties=[]) if f.rule == "dataloader-stall"]
    assert f"({title_share:.0%} of the step)" in card.title
    assert card.saving_share is not None and abs(card.saving_share - saving_share) < 1e-4
    assert abs((title_share - card.saving_share) - handover / median_step) < 1e-4  # one denominator
    assert card.savings_per_step_ns == round(statistics.median(w - handover for w in waits) * 1000)
    evidence = dict(card.evidence)["time in DataLoader __next__"]
    assert f"{title_share:.0%} of the median step" in evidence
    assert f"all steps together: {overall:.0%} of their time" in evidence


def test_latent_sync_on_the_cpu_sample_names_its_line() -> None:
    latent = next(
        f
        for f in sample_report("cpu_torch2.14_with_stack.pt.trace.json.gz").findings
        if f.rule == "latent-sync"
    )
    assert latent.source == "make_cpu_trace.py:32"
    # <module> was running when the optimizer hook started recording: line 32 is where it was then
    assert latent.source_line_kind == "recording-start" and latent.source_function == "<module>"
    assert "in `<module>` (recorded from make_cpu_trace.py:32)" in latent.title


# --- quiet where the loop is healthy -------------------------------------------------------------


def test_the_scheduling_rules_stay_quiet_on_a_busy_ddp_trace() -> None:
    report = sample_report("v100_ddp_ns_timestamps.pt.trace.json.gz")
    busy = report.analysis.usage[0]
    assert busy.busy_ns / busy.window_ns > 0.95
    assert not {"launch-bound", "sync-in-forward", "optimizer-not-fused", "latent-sync"} & {
        f.rule for f in report.findings
    }


def test_recording_cost_never_advises_the_option_in_use(tmp_path: Path) -> None:
    """Under ``--stacks none`` the recording-cost warning advised ``--stacks none``."""
    record = {"stacks": "none", "stepMarks": "optimizer", "unprofiledStepNs": 500_000, "unprofiledSteps": 3,
              "unprofiledStepsNs": [900_000, 500_000, 500_000]}  # fmt: skip
    result = analysis_of(
        tmp_path, _cpu_steps([("aten::addmm", 500, 10)]), deviceProperties=[], traceinsight=record
    )
    (cost,) = [w for w in result.warnings if w.kind == "recording-cost"]
    assert "--stacks none" not in cost.advice.replace("--stacks none already", "")
    assert "run --stacks none" not in cost.advice


@pytest.mark.parametrize("cut", [True, False])
def test_a_step_the_memory_budget_cut_short_is_not_counted_per_step(cut: bool, tmp_path: Path) -> None:
    """A window the memory budget stopped inside its only step holds part of it: a card said
    "11× per step" counted over 10 % of a step. `run` writes ``cutShort`` then; the count is said
    as it is."""
    events = [
        annotation("ProfilerStep#3", 0, 2_000),
        frame("train.py(52): train_step", 1, 1_990, python_id=1),
    ]
    events += [cpu_op("aten::item", 10 + 100 * index, 5) for index in range(11)]
    record = {"stacks": "user", "stepMarks": "optimizer", **({"cutShort": True} if cut else {})}
    result = analysis_of(tmp_path, events, deviceProperties=[], traceinsight=record)
    (card,) = [f for f in evaluate(result) if f.rule == "latent-sync"]
    if cut:
        assert "11 times in the part of a step recorded" in card.title and "per step" not in card.title
    else:
        assert "11× per step" in card.title


def test_the_step_usage_a_trace_records_is_read_as_written_and_nothing_else(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``run`` writes each recorded step's usage into the trace's record (``stepUsage``: wall, CPU,
    CPU wait in ns, the load), what lets a diff of traces alone tell a run starved of CPU. The three
    loaders read the entries that are a step (of a longer list, its first four: a later field) and
    leave out what is not (a boolean, a string, a float or negative time, a wait longer than the
    step, a list of three, a list inside, an object), at most 1,000."""
    from traceinsight.load.reference import load_trace_reference

    good = [
        [2_000_000, 800_000, 1_200_000, 7.5],
        [3_000_000, 900_000, None, None],
        [1, 0, 1, 0],
        [5, 1, 1, -0.0],
    ]
    bad = [["2", 1, 1, 1.0], [-5, 1, 1, 1.0], [5, -1, 1, 1.0], [5, 1, -1, 1.0], [5, 1, 1, -2.0],
           [5, 1, 1], {"wall": 5}, None, "x", [5.5, 1, 1, 1.0], [True, 1, 1, 1.0], [5, False, 1, 1.0],
           [5, 1, True, 1.0], [5, 1, 1, True], [5, 1, 6, 1.0], [5, 1, [1], 1.0], [5, 1, 1, {}],
           [5, 1, 1, 1e300]]  # fmt: skip
    written = [good[0], *bad, *good[1:3], [*good[3], "a later field"]]
    record = {"stacks": "user", "stepMarks": "optimizer", "stepUsage": written}
    path = write_trace(tmp_path / "t.json", _cpu_steps([("aten::addmm", 500, 10)]), deviceProperties=[],
                       traceinsight=record)  # fmt: skip
    many = write_trace(tmp_path / "many.json", _cpu_steps([("aten::addmm", 500, 10)]), deviceProperties=[],
                       traceinsight={"stepUsage": [good[0]] * 5000})  # fmt: skip
    expected = [
        (wall, cpu, wait, None if load is None else abs(float(load))) for wall, cpu, wait, load in good
    ]

    def pure(trace_path: Path) -> Any:
        monkeypatch.setenv("TRACEINSIGHT_NATIVE", "0")
        try:
            return load_trace(trace_path)
        finally:
            monkeypatch.delenv("TRACEINSIGHT_NATIVE")

    for load in (load_trace, load_trace_reference, pure):
        profile = load(path).meta.recorded_by_run
        assert profile is not None
        read = [(u.wall_ns, u.cpu_ns, u.cpu_wait_ns, u.load_1m) for u in profile.step_usage]
        assert read == expected, load
        assert str(read[-1][3]) == "0.0"  # -0.0 written as 0.0
        profile = load(many).meta.recorded_by_run
        assert profile is not None and len(profile.step_usage) == 1000
