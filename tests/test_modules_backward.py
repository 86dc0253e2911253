"""Backward time attributed to its forward module (analysis/modules.py), against a plain count over
the raw events that follows torch's ``fwdbwd`` flow arrows (the code follows sequence numbers)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest

from tests.tracebuild import PID, SAMPLES, annotation, cpu_op, frame, read_events, runtime, write_trace
from tests.tracebuild import kernel as gpu_kernel
from traceinsight.analysis import analyze
from traceinsight.load import load_trace

FWD, BWD = 100, 200  # the forward (main) thread and autograd's backward thread


def _ns(value: Any) -> int:
    return round(float(value) * 1000)


def _inside(t: int, windows: tuple[tuple[int, int], ...]) -> bool:
    return any(start <= t < end for start, end in windows)


def count_backward_by_module(
    events: list[dict[str, Any]],
    host_windows: tuple[tuple[int, int], ...],
    device_windows: tuple[tuple[int, int], ...],
) -> tuple[dict[str, int], int, int]:
    """Per module path: the steady kernel time launched outside every module under a backward
    operator whose ``fwdbwd`` flow arrow starts at a forward operator inside that module (or a module
    inside it); that time in all; and the steady kernel time launched outside every module. Plain
    Python over the raw events."""
    xs = [e for e in events if e.get("ph") == "X"]
    frames: dict[tuple[Any, Any], list[tuple[int, int, str]]] = defaultdict(list)
    for e in xs:
        if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: "):
            start = _ns(e["ts"])
            frames[(e["pid"], e["tid"])].append(
                (start, start + _ns(e["dur"]), e["name"][len("nn.Module: ") :])
            )

    def around(pid: Any, tid: Any, t: int) -> list[tuple[int, int, str]]:
        held = [f for f in frames[(pid, tid)] if f[0] <= t < f[1]]
        return sorted(held, key=lambda f: (f[0], -f[1]))  # outermost first

    starts: dict[Any, tuple[Any, Any, int]] = {}
    ends: dict[tuple[Any, Any, int], Any] = {}
    for e in events:
        if e.get("cat") == "fwdbwd" and e.get("ph") == "s":
            starts[e["id"]] = (e["pid"], e["tid"], _ns(e["ts"]))
        elif e.get("cat") == "fwdbwd" and e.get("ph") == "f":
            ends[(e["pid"], e["tid"], _ns(e["ts"]))] = e["id"]
    linked_ops: dict[tuple[Any, Any], list[tuple[int, int, Any]]] = defaultdict(list)
    for e in xs:
        start = _ns(e["ts"])
        flow = ends.get((e["pid"], e["tid"], start))
        if e.get("cat") == "cpu_op" and flow is not None:
            linked_ops[(e["pid"], e["tid"])].append((start, start + _ns(e["dur"]), flow))
    # autograd's range around a node's call (``autograd::engine::evaluate_function: AddmmBackward0``)
    # holds work of that node outside the call (the bias gradient's sum): it follows the arrow of the
    # node's call inside it
    for e in xs:
        if e.get("cat") == "cpu_op" and e["name"].startswith("autograd::engine::evaluate_function: "):
            start, key = _ns(e["ts"]), (e["pid"], e["tid"])
            end = start + _ns(e["dur"])
            inner = [
                op for op in linked_ops[key] if start <= op[0] and op[1] <= end and op[0:2] != (start, end)
            ]
            if inner:
                linked_ops[key].append((start, end, min(inner)[2]))
    launches = {
        e["args"]["correlation"]: e
        for e in reversed(xs)
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    by_path: dict[str, int] = defaultdict(int)
    total = outside = 0
    for e in xs:
        if e.get("cat") != "kernel" or not _inside(_ns(e["ts"]), device_windows):
            continue
        call = launches.get(e["args"].get("correlation"))
        if call is None:
            continue
        key, at = (call["pid"], call["tid"]), _ns(call["ts"])
        if around(*key, at):
            continue  # launched inside a module: forward time
        outside += _ns(e["dur"])
        holding = [op for op in linked_ops[key] if op[0] <= at < op[1]]
        if not holding:
            continue
        flow = max(holding)[2]  # the innermost (latest started) backward operator's arrow
        if flow not in starts:
            continue
        chain = around(*starts[flow])
        if chain:
            total += _ns(e["dur"])
        for depth, (start, _, _) in enumerate(chain):
            if _inside(start, host_windows):
                by_path["/".join(f[2] for f in chain[: depth + 1])] += _ns(e["dur"])
    return dict(by_path), total, outside


def _op(name: str, ts: float, dur: float, *, seq: int, tid: int, backward: bool) -> dict[str, Any]:
    """An aten op with autograd's sequence number (tracebuild's op, its args replaced)."""
    op = cpu_op(name, ts, dur, tid=tid, external_id=0)  # an id given: no correlation number taken
    return {**op, "args": {"Sequence number": seq, "Fwd thread id": 1 if backward else 0}}


def _flow(phase: str, flow: int, ts: float, tid: int) -> dict[str, Any]:
    return {"ph": phase, "id": flow, "pid": PID, "tid": tid, "ts": ts, "cat": "fwdbwd", "name": "fwdbwd"}


def _launch(ts: float, gpu_ts: float, gpu_dur: float, tid: int) -> list[dict[str, Any]]:
    correlation = int(ts * 10) + tid
    return [
        runtime("cudaLaunchKernel", ts, 2, correlation=correlation, tid=tid),
        gpu_kernel(gpu_ts, gpu_dur, correlation=correlation),
    ]


def _training_steps(steps: int = 6) -> list[dict[str, Any]]:
    """Per step (1000 µs): Net_0 { Linear_0 { addmm seq a }, Linear_1 { a gt (seq b, in Net_0 only)
    then addmm seq b } }, a loss op outside every module (seq c); on the backward thread the three
    backward ops (c first) with their kernels, then an optimizer kernel under no backward op."""
    events: list[dict[str, Any]] = []
    flow = 0
    for step in range(steps):
        t = 10_000 + step * 1000.0
        a, b, c = 3 * step + 1, 3 * step + 2, 3 * step + 3
        events.append(annotation(f"ProfilerStep#{step}", t, 990))
        events.append(frame("nn.Module: Net_0", t + 10, 300, python_id=step * 10 + 1))
        events.append(
            frame("nn.Module: Linear_0", t + 20, 100, python_id=step * 10 + 2, parent=step * 10 + 1)
        )
        events.append(_op("aten::addmm", t + 30, 50, seq=a, tid=FWD, backward=False))
        events += _launch(t + 40, t + 50, 30, FWD)
        # a non-differentiable op with the next number, outside Linear_1: not the maker of node b
        events.append(_op("aten::gt", t + 130, 10, seq=b, tid=FWD, backward=False))
        events.append(
            frame("nn.Module: Linear_1", t + 150, 100, python_id=step * 10 + 3, parent=step * 10 + 1)
        )
        events.append(_op("aten::addmm", t + 160, 50, seq=b, tid=FWD, backward=False))
        events += _launch(t + 170, t + 180, 40, FWD)
        events.append(_op("aten::nll_loss", t + 320, 20, seq=c, tid=FWD, backward=False))
        events += _launch(t + 325, t + 330, 5, FWD)
        for seq, start, first, dur in ((c, 400, 410, 7), (b, 500, 510, 60), (a, 650, 660, 35)):
            flow += 1
            maker = {a: t + 30, b: t + 160, c: t + 320}[seq]
            events.append(_flow("s", flow, maker, FWD))
            events.append(
                _op(
                    "autograd::engine::evaluate_function: X",
                    t + start - 5,
                    120,
                    seq=seq,
                    tid=BWD,
                    backward=True,
                )
            )
            events.append(_op("XBackward0", t + start, 100, seq=seq, tid=BWD, backward=True))
            events.append(_flow("f", flow, t + start, BWD))
            events += _launch(t + start + 10, t + first, dur, BWD)
            events += _launch(t + start + 50, t + first + dur + 5, 11, BWD)
            events += _launch(t + start + 105, t + first + dur + 20, 3, BWD)  # in autograd's range only
        events += _launch(t + 900, t + 905, 50, FWD)  # the optimizer: no backward op around it
    return events


def test_backward_kernels_count_for_the_forward_module_that_made_their_node(tmp_path: Path) -> None:
    events = _training_steps()
    analysis = analyze(load_trace(write_trace(tmp_path / "t.json", events)))
    steady = analysis.steady
    expected, linked, outside = count_backward_by_module(events, steady.windows, steady.device_windows)
    scopes = analysis.scopes
    got = {scope.path: scope.backward_ns for scope in scopes.modules}
    assert expected["Net_0/Linear_1"] > 0 and expected["Net_0/Linear_0"] > 0
    assert got == {path: expected.get(path, 0) for path in got}
    assert got["Net_0"] == got["Net_0/Linear_0"] + got["Net_0/Linear_1"]
    assert scopes.backward_linked_gpu_ns == linked
    # the loss's backward (its forward op outside every module) and the optimizer stay outside
    assert scopes.outside_modules_gpu_ns == outside
    assert outside - linked >= len(steady.steady_steps) * (5 + 7 + 11 + 3) * 1000
    # forward time is unchanged by the backward: Linear_1 holds its forward kernel only
    linear_1 = next(s for s in scopes.modules if s.path == "Net_0/Linear_1")
    assert linear_1.gpu_ns == linear_1.calls * 40_000


def test_without_sequence_numbers_no_backward_time_is_linked(tmp_path: Path) -> None:
    events = _training_steps()
    for e in events:
        if e.get("cat") == "cpu_op":
            e["args"] = {}
    analysis = analyze(load_trace(write_trace(tmp_path / "t.json", events)))
    assert all(scope.backward_ns == 0 for scope in analysis.scopes.modules)
    assert analysis.scopes.backward_linked_gpu_ns == 0
    assert analysis.scopes.outside_modules_gpu_ns > 0


@pytest.mark.parametrize(
    "name", ["h200_run_tensor_branch.pt.trace.json.gz", "h200_run_serial_dataloader.pt.trace.json.gz"]
)
def test_backward_time_by_module_on_a_real_trace_matches_the_fwdbwd_arrows(name: str) -> None:
    path = SAMPLES / name
    _, events = read_events(path)
    analysis = analyze(load_trace(path))
    steady = analysis.steady
    expected, linked, outside = count_backward_by_module(events, steady.windows, steady.device_windows)
    assert linked > 0
    scopes = analysis.scopes
    kernels = sum(1 for e in events if e.get("cat") == "kernel")  # 1 ns of rounding per kernel at most
    for scope in scopes.modules:
        assert abs(scope.backward_ns - expected.get(scope.path, 0)) <= kernels, scope.path
    assert abs(scopes.backward_linked_gpu_ns - linked) <= kernels
    assert abs(scopes.outside_modules_gpu_ns - outside) <= kernels
    assert scopes.backward_linked_gpu_ns <= scopes.outside_modules_gpu_ns
    # the result's per-step figures, and module time per step (forward + backward) within the step
    result_scopes = analysis_result_scopes(analysis)
    top = [s for s in result_scopes.modules if s.depth == 0]
    steady_step = steady.window_ns / len(steady.steady_steps)  # the mean steady step on the GPU
    assert 0 < sum(s.gpu_ns + s.backward_gpu_ns for s in top) <= steady_step


def analysis_result_scopes(analysis: Any) -> Any:
    from traceinsight.results.flops import scopes_of

    return scopes_of(analysis.scopes)
