"""Bytes moved by memory-bound kernels (analysis/membytes.py): the convention by hand, and a real
trace against a plain count over the raw events."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import polars as pl
import pytest

from tests.tracebuild import SAMPLES, read_events, sample_report, sample_result
from traceinsight.analysis.membytes import ELEMENTWISE, REDUCTIONS, operator_bytes
from traceinsight.results.frames import result_frames


def test_out_of_place_reads_its_inputs_and_writes_their_broadcast() -> None:
    # bf16 [64, 256] + bf16 [256] (a bias): read 64·256·2 + 256·2, write 64·256·2
    assert operator_bytes(
        "aten::add", [[64, 256], [256], []], ["c10::BFloat16", "c10::BFloat16", "Scalar"]
    ) == (64 * 256 * 2 + 256 * 2 + 64 * 256 * 2)
    # a 0-dim tensor is one element; scalars and int lists count nothing
    assert operator_bytes("aten::mul", [[8, 1, 4], [3, 1], []], ["float", "float", "Scalar"]) == (
        32 * 4 + 3 * 4 + 8 * 3 * 4 * 4
    )


def test_in_place_writes_its_first_input_and_a_reduction_nothing() -> None:
    assert operator_bytes("aten::add_", [[1024], [1024], []], ["float", "float", "Scalar"]) == 3 * 1024 * 4
    assert (
        operator_bytes("aten::copy_", [[1024], [1024], []], ["float", "c10::BFloat16", "Scalar"]) == 1024 * 6
    )
    assert (
        operator_bytes("aten::sum", [[64, 10], [], [], []], ["float", "ScalarList", "Scalar", ""]) == 640 * 4
    )
    two = [[256, 256], [256]]
    assert operator_bytes("aten::_foreach_add_", [two, two, []], ["TensorList", "TensorList", "Scalar"]) == (
        3 * (256 * 256 + 256) * 4
    )
    assert operator_bytes("aten::fill_", [[], []], ["ScalarList", "Scalar"]) is None


def test_operators_that_read_part_of_their_inputs_have_no_count() -> None:
    # a gather reads the rows its index names, a KV-cache write a slot of the cache: not the shapes
    assert (
        operator_bytes("aten::gather", [[50000, 512], [], [64, 512]], ["float", "Scalar", "long int"]) is None
    )
    cache = [[64, 16], [4096, 16, 8, 64], []]
    assert (
        operator_bytes("_C_cache_ops::reshape_and_cache_flash", cache, ["c10::BFloat16"] * 2 + [""]) is None
    )


_SIZE = {"float": 4, "long int": 8, "bool": 1, "c10::BFloat16": 2, "c10::Half": 2, "int": 4}
_FLOP_WORDS = ("mm", "linear", "matmul", "mv", "attention", "convolution", "conv1d", "conv2d", "conv3d")


def _flop_bearing(name: str) -> bool:
    """An aten operator whose FLOPs the count covers (GEMMs, attention, convolutions), by its name."""
    return name.startswith("aten::") and any(word in name for word in _FLOP_WORDS)


_REDUCE = REDUCTIONS  # the convention's table of reductions (what the count is told, not what it finds)


def _plain_bytes(name: str, dims: list[Any], types: list[Any]) -> int | None:
    """The convention again, written out over one event's args."""
    if name not in ELEMENTWISE and not name.startswith("aten::_foreach_"):
        return None
    tensors = []
    lists = 0
    for d, kind in zip(dims, types, strict=False):
        if kind == "TensorList":
            lists += sum(eval_elements(s) for s in d)
        elif kind in _SIZE:
            tensors.append((d, _SIZE[kind]))
    if not tensors and not lists:
        return None
    size = tensors[0][1] if tensors else 4
    read = sum(eval_elements(d) * s for d, s in tensors) + lists * size
    first = (
        eval_elements(dims[0]) * size
        if types[0] != "TensorList"
        else sum(eval_elements(s) for s in dims[0]) * 4
    )
    if name in ("aten::copy_", "aten::fill_", "aten::zero_"):
        return read  # the destination is written, not read: once
    if name.endswith("_"):
        return read + first
    if name in _REDUCE or not tensors:
        return read
    rank = max(len(d) for d, _ in tensors)
    out = [1] * rank
    for d, _ in tensors:
        for i, n in enumerate(d):
            if n != 1:
                out[rank - len(d) + i] = n
    return read + eval_elements(out) * size


def eval_elements(shape: list[int]) -> int:
    n = 1
    for v in shape:
        n *= v
    return n


@pytest.mark.parametrize(
    "name",
    [
        "h200_run_tensor_branch.pt.trace.json.gz",
        "h100_bert_small_stacks.json.gz",
        "b200_eager_stacks.json.gz",
    ],
)
def test_bytes_per_kernel_name_match_a_count_over_the_raw_events(name: str) -> None:
    path = SAMPLES / name
    _, events = read_events(path)
    analysis = sample_report(name).analysis
    windows = analysis.steady.device_windows
    xs = [e for e in events if e.get("ph") == "X"]
    ops: dict[tuple[Any, Any], list[dict[str, Any]]] = defaultdict(list)
    for e in xs:
        if e.get("cat") == "cpu_op":
            ops[(e["pid"], e["tid"])].append(e)
    calls = {
        e["args"]["correlation"]: e
        for e in reversed(xs)
        if e.get("cat") in ("cuda_runtime", "cuda_driver") and "correlation" in e.get("args", {})
    }
    owner: dict[int, tuple[int, int]] = {}  # kernel index -> (op id, dur ns)
    op_bytes: dict[int, int] = {}
    for index, e in enumerate(xs):
        ts = round(e["ts"] * 1000)
        if e.get("cat") != "kernel" or not any(a <= ts < b for a, b in windows):
            continue
        call = calls.get(e["args"]["correlation"])
        if call is None:
            continue
        at = call["ts"]
        holding = [o for o in ops[(call["pid"], call["tid"])] if o["ts"] <= at < o["ts"] + o["dur"]]
        if any(_flop_bearing(o["name"]) and "Input Dims" in o["args"] for o in holding):
            continue  # its FLOPs are counted
        shaped = [o for o in holding if "Input Dims" in o["args"]]
        if not shaped:
            continue
        op = max(shaped, key=lambda o: o["ts"])
        moved = _plain_bytes(op["name"], op["args"]["Input Dims"], op["args"]["Input type"])
        if moved is None:
            continue
        op_bytes[id(op)] = moved
        owner[index] = (id(op), round(e["dur"] * 1000))
    op_time: dict[int, int] = defaultdict(int)
    for op_id, dur in owner.values():
        op_time[op_id] += dur
    expected: dict[str, float] = defaultdict(float)
    launches: dict[str, int] = defaultdict(int)
    for index, (op_id, dur) in owner.items():
        expected[xs[index]["name"]] += op_bytes[op_id] * dur / op_time[op_id]
        launches[xs[index]["name"]] += 1
    got = {k.name: k for k in analysis.flops.memory_kernels}
    assert got and set(got) == set(expected)
    for kernel_name, kernel in got.items():
        assert kernel.launches == launches[kernel_name]
        assert abs(kernel.bytes_moved - expected[kernel_name]) <= kernel.launches, kernel_name
    # the result and its kernels frame carry them, with bytes/s = bytes over kernel time
    result = sample_result(name)
    by_name = {k.name: k for k in result.flops.memory_kernels}
    assert {n: k.bytes_moved for n, k in by_name.items()} == {n: k.bytes_moved for n, k in got.items()}
    frame = result_frames(result)["kernels"].filter(pl.col("bytes_moved").is_not_null())
    assert frame.height > 0
    for row in frame.iter_rows(named=True):
        kernel = by_name[row["name"]]
        assert row["bytes_moved"] == kernel.bytes_moved
        assert row["achieved_bytes_per_s"] == pytest.approx(kernel.bytes_moved / kernel.kernel_ns * 1e9)
