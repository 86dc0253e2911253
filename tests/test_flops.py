"""FLOPs from recorded shapes, their kernels, and MFU: formulas by hand, nesting on tiny traces, and
per-step counts on real traces against a plain-Python count over the raw JSON events."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.tracebuild import SAMPLES, annotation, kernel, read_events, runtime, sample_report, write_trace
from traceinsight.analysis import flops as fl
from traceinsight.analysis import peaks
from traceinsight.load import load_trace
from traceinsight.load.reference import load_trace_reference
from traceinsight.model import replace

# --- formulas, by hand ---------------------------------------------------------------------------


def test_gemm_formulas_count_two_flops_per_multiply_add() -> None:
    assert fl.operator_flops("aten::mm", [[3, 5], [5, 7]]) == 2 * 3 * 5 * 7
    assert fl.operator_flops("aten::addmm", [[7], [3, 5], [5, 7], [], []]) == 2 * 3 * 5 * 7
    assert fl.operator_flops("aten::bmm", [[4, 3, 5], [4, 5, 7]]) == 2 * 4 * 3 * 5 * 7
    assert fl.operator_flops("aten::baddbmm", [[4, 3, 7], [4, 3, 5], [4, 5, 7], [], []]) == 2 * 4 * 3 * 5 * 7
    # linear: x [B, T, K] · w [N, K]ᵀ
    assert fl.operator_flops("aten::linear", [[2, 9, 5], [7, 5], [7]]) == 2 * 18 * 5 * 7
    # matmul broadcasts leading dims and treats vectors as rows/columns
    assert fl.operator_flops("aten::matmul", [[6, 1, 3, 5], [4, 5, 7]]) == 2 * 24 * 3 * 5 * 7
    assert fl.operator_flops("aten::matmul", [[5], [5, 7]]) == 2 * 5 * 7
    # mismatched inner dims: not a count
    assert fl.operator_flops("aten::mm", [[3, 5], [6, 7]]) is None
    assert fl.operator_flops("aten::elu", [[3, 5]]) is None


def test_convolution_forward_needs_stride_padding_dilation_or_a_known_output() -> None:
    # 224² input, 7×7 kernel, stride 2, padding 3 → 112² output (ResNet's stem)
    dims = [[2, 3, 224, 224], [64, 3, 7, 7], [], [], [], [], []]
    concrete = ["", "", "", "[2, 2]", "[3, 3]", "[1, 1]", "1"]
    expected = 2 * 2 * 64 * 112 * 112 * 3 * 7 * 7
    assert fl.operator_flops("aten::conv2d", dims, concrete) == expected
    assert fl.operator_flops("aten::conv2d", dims, None) is None
    assert fl.operator_flops("aten::conv2d", dims, None, output=[2, 64, 112, 112]) == expected
    # cudnn_convolution's order is (input, weight, padding, stride, dilation, groups, ...)
    assert (
        fl.operator_flops("aten::cudnn_convolution", dims[:2], ["", "", "[3, 3]", "[2, 2]", "[1, 1]", "1"])
        == expected
    )
    # groups: the weight's second dim is C_in / groups (depthwise: 1)
    depthwise = fl.operator_flops(
        "aten::conv2d", [[1, 32, 10, 10], [32, 1, 3, 3]], ["", "", "", "1", "0", "1", "32"]
    )
    assert depthwise == 2 * 32 * 8 * 8 * 1 * 9


def test_convolution_backward_counts_one_forward_per_gradient_asked_for() -> None:
    grad, x, w = [2, 8, 5, 5], [2, 4, 7, 7], [8, 4, 3, 3]
    one = 2 * 2 * 8 * 25 * 4 * 9
    dims = [grad, x, w, [], [], [], [], [], [], [], []]
    assert fl.operator_flops("aten::convolution_backward", dims) == 2 * one
    concrete = [""] * 10 + ["[False, True, True]"]
    assert fl.operator_flops("aten::convolution_backward", dims, concrete) == one
    # 2021's split ops: the input gradient from grad_output and weight
    assert fl.operator_flops("aten::cudnn_convolution_backward_input", [[], grad, w]) == one


def test_attention_counts_as_torch_flop_counter() -> None:
    b, h, length, source, e = 2, 4, 16, 32, 8
    fwd = 2 * b * h * length * source * e * 2
    bwd = 2 * b * h * length * source * e * 5
    bhle = [[b, h, length, e], [b, h, source, e], [b, h, source, e]]
    assert fl.operator_flops("aten::scaled_dot_product_attention", bhle) == fwd
    blhe = [[b, length, h, e], [b, source, h, e], [b, source, h, e]]
    assert fl.operator_flops("aten::_flash_attention_forward", blhe) == fwd
    assert (
        fl.operator_flops("aten::_scaled_dot_product_flash_attention_backward", [[b, h, length, e], *bhle])
        == bwd
    )
    assert fl.operator_flops("aten::_flash_attention_backward", [[b, length, h, e], *blhe]) == bwd


def test_dtype_and_peak_lookup() -> None:
    assert fl.dtype_of(["c10::BFloat16", "c10::BFloat16"]) == "bf16"
    assert fl.dtype_of(["", "float"]) == "fp32"
    assert fl.dtype_of(["c10::Float8_e4m3fn"]) == "fp8"
    assert fl.dtype_of(None) is None
    h100 = peaks.peak_for("NVIDIA H100 80GB HBM3")
    assert h100 is not None and h100.model == "H100 SXM" and h100.peak("bf16") == 989_500_000_000_000
    pcie = peaks.peak_for("NVIDIA H100 PCIe")
    assert pcie is not None and pcie.model == "H100 PCIe"
    assert peaks.peak_for("Tesla V100-DGXS-32GB") is not None
    v100 = peaks.peak_for("Tesla V100-SXM2-32GB")
    assert v100 is not None and v100.peak("bf16") is None  # no bf16 tensor cores
    assert peaks.peak_for("AMD Radeon Graphics") is None
    assert peaks.peak_for(None) is None


# --- nesting and kernels on tiny traces ----------------------------------------------------------


def _op(
    name: str, ts: float, dur: float, dims: list[list[int]], types: list[str] | None = None
) -> dict[str, Any]:
    return {
        "ph": "X",
        "cat": "cpu_op",
        "name": name,
        "pid": 100,
        "tid": 100,
        "ts": ts,
        "dur": dur,
        "args": {"Input Dims": dims, "Input type": types or ["float"] * len(dims)},
    }


def test_a_linear_and_the_addmm_under_it_count_once_at_their_kernel(tmp_path: Path) -> None:
    events = [
        annotation("ProfilerStep#1", 0, 100),
        _op("aten::linear", 10, 30, [[64, 128], [256, 128], [256]]),
        _op("aten::addmm", 15, 20, [[256], [64, 128], [128, 256], [], []]),
        runtime("cudaLaunchKernel", 20, 3, correlation=1),
        kernel(50, 10, correlation=1, name="ampere_sgemm_64x64_nn"),
        # an elementwise op with a kernel: busy time whose FLOPs are unknown
        _op("aten::relu", 45, 5, [[64, 256]]),
        runtime("cudaLaunchKernel", 46, 2, correlation=2),
        kernel(61, 10, correlation=2, name="elementwise_kernel"),
    ]
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    counted = fl.counted_operators(trace)
    assert counted.get_column("name").to_list() == ["aten::linear"]
    assert counted.get_column("flops").to_list() == [2 * 64 * 128 * 256]
    report = sample_like(trace)
    stats = report.flops
    assert stats.flops == 2 * 64 * 128 * 256
    assert stats.coverage == pytest.approx(0.5)
    (top,) = stats.kernels
    assert top.name == "ampere_sgemm_64x64_nn"
    assert top.achieved_flops_per_s == pytest.approx(2 * 64 * 128 * 256 / 10e-6)
    # "Test GPU" is in no datasheet: achieved FLOP/s, no MFU, and why
    (device,) = stats.mfu
    assert device.mfu is None and device.efficiency_while_busy is None
    assert device.unknown == "GPU 'Test GPU' is not in the peak table"
    assert device.achieved_flops_per_s == pytest.approx(stats.flops / device.busy_ns * 1e9)


def test_an_outer_call_without_a_count_leaves_it_to_the_calls_inside(tmp_path: Path) -> None:
    # A 2021 conv2d: no stride recorded, so its convolution is counted where the inner op's output
    # size is known from a backward call with the same input and weight.
    x, w, out = [2, 3, 8, 8], [4, 3, 3, 3], [2, 4, 6, 6]
    events = [
        _op("aten::conv2d", 0, 20, [x, w, [], [], [], [], []]),
        _op("aten::cudnn_convolution", 2, 10, [x, w, [], [], [], [], [], [], []]),
        _op("aten::cudnn_convolution_backward", 40, 20, [x, out, w, [], [], [], [], [], [], [], []]),
        _op("aten::cudnn_convolution_backward_input", 41, 5, [[], out, w, [], [], [], [], [], [], []]),
        _op("aten::cudnn_convolution_backward_weight", 47, 5, [[], out, x, [], [], [], [], [], [], []]),
    ]
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    counted = fl.counted_operators(trace)
    one = 2 * 2 * 4 * 36 * 3 * 9
    assert dict(zip(counted.get_column("name"), counted.get_column("flops"), strict=True)) == {
        "aten::conv2d": one,
        "aten::cudnn_convolution_backward": 2 * one,
    }


def test_shapes_load_alike_in_every_loader(tmp_path: Path) -> None:
    op = _op("aten::mm", 0, 5, [[3, 5], [5, 7]])
    op["args"]["Concrete Inputs"] = ["", "[1, 1]"]
    odd = _op("aten::mm", 10, 5, [[3, 5], [5, 7]])
    odd["args"]["Input Dims"] = "[[3, 5]]"  # a string, not a list: not shapes
    path = write_trace(tmp_path / "t.json", [op, odd])
    # pretty-printed: the scanner's raw text has newlines; every loader gives the compact form
    path.write_text(json.dumps(json.loads(path.read_text()), indent=2))
    fast, reference = load_trace(path), load_trace_reference(path)
    assert fast.cpu_ops.get_column("input_dims").to_list() == ["[[3,5],[5,7]]", None]
    assert fast.cpu_ops.get_column("concrete_inputs").to_list() == ['["","[1, 1]"]', None]
    assert fast.cpu_ops.equals(reference.cpu_ops)


def sample_like(trace: Any) -> Any:
    from traceinsight.analysis import analyze

    return analyze(trace)


# --- real traces against an independent count ----------------------------------------------------

_GEMMS = {"aten::mm": (0, 1), "aten::addmm": (1, 2), "aten::bmm": (0, 1), "aten::baddbmm": (1, 2)}


def _independent_step_flops(name: str) -> list[int]:
    """FLOPs per ProfilerStep, counted from the raw events in plain Python: each innermost GEMM call
    (``mm``/``addmm``/``bmm``/``baddbmm``: ``2·M·K·N``, batched), each flash-attention kernel call
    (``_flash_attention_forward``, ``[B, L, H, E]``: 4·B·H·L·S·E), each cuDNN convolution forward
    (its output size read from the operator that consumes it next on the thread) and backward half
    (input gradient from grad_output and weight; weight gradient with the parent's weight)."""
    _top, events = read_events(SAMPLES / name)
    ops = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "Operator")]
    steps = sorted(
        (e["ts"], e["ts"] + e["dur"])
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    by_thread: dict[Any, list[dict[str, Any]]] = defaultdict(list)
    for op in ops:
        by_thread[(op["pid"], op["tid"])].append(op)
    counted: list[tuple[float, int]] = []
    for thread_ops in by_thread.values():
        thread_ops.sort(key=lambda e: (e["ts"], -e["dur"]))
        for i, op in enumerate(thread_ops):
            dims = op.get("args", {}).get("Input Dims")
            if not dims:
                continue
            start, end = op["ts"], op["ts"] + op["dur"]
            inside = [o for o in thread_ops[i + 1 : i + 40] if o["ts"] < end and o["ts"] + o["dur"] <= end]
            flops = 0
            if op["name"] in _GEMMS and not any(o["name"] in _GEMMS for o in inside):
                a, b = (dims[j] for j in _GEMMS[op["name"]])
                batch = a[0] if len(a) == 3 else 1
                flops = 2 * batch * a[-2] * a[-1] * b[-1]
            elif op["name"] == "aten::_flash_attention_forward":
                q, k = dims[0], dims[1]
                flops = 4 * q[0] * q[2] * q[1] * k[1] * q[3]
            elif op["name"] == "aten::cudnn_convolution":
                x, w = dims[0], dims[1]
                # the next operator on the thread taking an [N, C_out, H, W] tensor (batch norm)
                after = next(
                    o
                    for o in thread_ops[i + 1 :]
                    if o["ts"] >= end
                    and len((o["args"].get("Input Dims") or [[]])[0]) == 4
                    and o["args"]["Input Dims"][0][:2] == [x[0], w[0]]
                )
                out = after["args"]["Input Dims"][0]
                flops = 2 * out[0] * out[1] * out[2] * out[3] * w[1] * w[2] * w[3]
            elif op["name"] == "aten::cudnn_convolution_backward":
                x, g, w = dims[0], dims[1], dims[2]
                one = 2 * g[0] * g[1] * g[2] * g[3] * w[1] * w[2] * w[3]
                halves = {o["name"] for o in inside}
                flops = one * sum(
                    f"aten::cudnn_convolution_backward_{half}" in halves for half in ("input", "weight")
                )
            if flops:
                counted.append((start, flops))
    return [sum(f for ts, f in counted if a <= ts < b) for a, b in steps]


@pytest.mark.parametrize(
    "name",
    [
        "h100_bert_small_stacks.json.gz",
        "h100_qwen_inference_stacks.json.gz",
        "v100_resnet50_workers0.pt.trace.json.gz",
    ],
)
def test_flops_per_step_match_a_count_over_the_raw_events(name: str) -> None:
    per_step = _independent_step_flops(name)
    report = sample_report(name)
    stats = report.analysis.flops
    steady = {step.step for step in report.analysis.steady.steady_steps}
    assert stats.steps == len(steady) > 0
    expected = [flops for index, flops in enumerate(per_step) if index in _step_indexes(name, steady)]
    assert stats.flops_per_step == pytest.approx(sum(expected) / len(expected), rel=0.05)


def _step_indexes(name: str, steady: set[int]) -> set[int]:
    _top, events = read_events(SAMPLES / name)
    numbered = sorted(
        (e["ts"], int(str(e["name"]).split("#")[1]))
        for e in events
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("ProfilerStep#")
    )
    return {index for index, (_ts, number) in enumerate(numbered) if number in steady}


def test_mfu_names_its_peak_and_dtype_and_splits_into_busy_times_efficiency() -> None:
    report = sample_report("h100_bert_small_stacks.json.gz")
    (device,) = report.analysis.flops.mfu
    assert device.model == "H100 SXM" and device.dtype == "bf16"
    assert device.peak_flops_per_s == 989_500_000_000_000
    usage = report.analysis.device_usage(0)
    assert device.window_ns == usage.window_ns and device.busy_ns == usage.busy_ns
    # every counted FLOP is bf16 here: MFU = FLOPs / (window × peak)
    assert device.mfu == pytest.approx(device.flops / (device.window_ns * 1e-9 * 989.5e12))
    assert device.mfu == pytest.approx(device.busy_share * device.efficiency_while_busy)


def test_v100_fp32_has_a_peak_and_a_cpu_trace_counts_flops_without_mfu() -> None:
    report = sample_report("v100_resnet50_workers0.pt.trace.json.gz")
    (device,) = report.analysis.flops.mfu
    assert device.model == "V100 SXM2" and device.dtype == "fp32"
    assert device.mfu is not None  # V100 has an fp32 peak
    report = sample_report("cpu_torch2.14_with_stack.pt.trace.json.gz")
    assert report.analysis.flops.mfu == ()
    assert report.analysis.flops.flops > 0  # CPU FLOPs still counted


def test_low_compute_efficiency_names_the_kernel_and_bounds_its_saving_by_the_peak(tmp_path: Path) -> None:
    from traceinsight.rules import evaluate

    n = 4096
    events: list[dict[str, Any]] = []
    for step in range(6):
        start = step * 1100.0
        events += [
            annotation(f"ProfilerStep#{step}", start, 1100),
            _op("aten::mm", start + 10, 20, [[n, n], [n, n]], ["c10::BFloat16", "c10::BFloat16"]),
            runtime("cudaLaunchKernel", start + 15, 3, correlation=500 + step),
            kernel(start + 40, 1000, correlation=500 + step, name="sm90_xmma_gemm_bf16bf16_slow"),
        ]
    path = write_trace(
        tmp_path / "t.json", events, deviceProperties=[{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
    )
    analysis = sample_like(load_trace(path))
    (device,) = analysis.flops.mfu
    assert device.busy_share >= 0.8
    (finding,) = [f for f in evaluate(analysis) if f.rule == "low-compute-efficiency"]
    # per step: 1000 µs of kernel, 2·n³ FLOPs that take 2·n³ / (0.5 · 989.5 TFLOP/s) at half the peak
    at_half_peak_ns = 2 * n**3 / (0.5 * 989.5e12) * 1e9
    assert finding.savings_per_step_ns == pytest.approx(1_000_000 - at_half_peak_ns, abs=2)
    assert any("sm90_xmma_gemm_bf16bf16_slow" in value for _label, value in finding.evidence)


def test_diff_lists_the_modules_whose_gpu_time_changed_and_the_mfu() -> None:

    from tests.tracebuild import sample_result
    from traceinsight.results.comparison import compare

    before = sample_result("h100_bert_small_stacks.json.gz")
    scopes = before.scopes
    slower = {"BertLMHeadModel_0/BertModel_0/BertEncoder_0/BertLayer_1": 40_000}
    after = before.replace(
        scopes=replace(
            scopes,
            modules=tuple(
                replace(scope, gpu_ns=scope.gpu_ns + slower.get(scope.path, 0)) for scope in scopes.modules
            ),
        )
    )
    comparison = compare(before, after, "a", "b")
    (change,) = comparison.modules
    assert change.path == next(iter(slower)) and change.time == "gpu"
    assert change.change_us == pytest.approx(40.0)
    mfu = comparison.metric("mfu")
    assert mfu.before == mfu.after == before.flops.mfu[0].mfu
    assert compare(before, before, "a", "a").modules == ()


def test_torchs_flops_arg_is_cross_checked_and_used_where_shapes_do_not_say(tmp_path: Path) -> None:
    agreeing = _op("aten::mm", 0, 5, [[3, 5], [5, 7]])
    agreeing["args"]["flops"] = 2 * 3 * 5 * 7
    # a convolution without stride or padding: only torch's count says
    conv = _op("aten::conv2d", 10, 5, [[1, 3, 8, 8], [4, 3, 3, 3], [], [], [], [], []])
    conv["args"]["flops"] = 12_345
    trace = load_trace(write_trace(tmp_path / "t.json", [agreeing, conv]))
    counted = dict(
        zip(
            *fl.counted_operators(trace).select("name", "flops").to_dict(as_series=False).values(),
            strict=True,
        )
    )
    assert counted == {"aten::mm": 210, "aten::conv2d": 12_345}
    stats = sample_like(trace).flops
    assert stats.torch_counted == 2
    assert stats.torch_agreement == pytest.approx(1.0)


@pytest.mark.parametrize(
    "name",
    [
        "h100_bert_small_stacks.json.gz",
        "h200_run_tensor_branch.pt.trace.json.gz",
        "b200_eager_stacks.json.gz",
    ],
)
def test_module_times_per_step_sum_to_at_most_the_step(name: str) -> None:
    from tests.tracebuild import sample_result

    result = sample_result(name)
    scopes = result.scopes
    assert scopes.modules
    top = [scope for scope in scopes.modules if scope.depth == 0]
    gpu = sum(scope.gpu_ns for scope in top) + scopes.outside_modules_gpu_ns
    # per step when there are steps; else totals over the steady window
    reference = result.steady_state.step_time_ns if scopes.per == "step" else result.utilization.window_ns
    assert 0 < gpu <= reference
    # a child never has more GPU time than its parent
    by_path = {scope.path: scope for scope in scopes.modules}
    for scope in scopes.modules:
        parent = scope.path.rsplit("/", 1)[0] if "/" in scope.path else None
        if parent in by_path:
            assert scope.gpu_ns <= by_path[parent].gpu_ns + 1
