"""Tiny in-memory traces for edge cases, and plain readers of real ones (independent of the loader)."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
PID = 100
TID = 100

_correlation = itertools.count(1000)


def _event(
    cat: str, name: str, pid: int, tid: int, ts: float, dur: float, args: dict[str, Any]
) -> dict[str, Any]:
    """A complete ("X") event, its keys in the order torch.profiler writes them."""
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, "args": args}


def _on_gpu(
    cat: str, name: str, ts: float, dur: float, device: int, stream: int, correlation: int | None, **args: Any
) -> dict[str, Any]:
    """Work on ``device``/``stream`` (its pid and tid), with a correlation id (the next one unless given)."""
    with_ids = {"device": device, "stream": stream, **args}
    with_ids["correlation"] = correlation if correlation is not None else next(_correlation)
    return _event(cat, name, device, stream, ts, dur, with_ids)


def read_events(path: Path) -> tuple[dict[str, Any] | None, list[dict[str, Any]]]:
    """Plain stdlib reading of a trace: (top-level object or None for arrays, events)."""
    raw = path.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    value = json.loads(raw)
    if isinstance(value, list):
        return None, value
    return value, value["traceEvents"]


def step_of_launch(events: list[dict[str, Any]]) -> dict[int, int]:
    """Plain reading of a rank's trace: each runtime call's correlation → the ``ProfilerStep#N``
    whose host range holds the call (calls outside every step left out)."""
    steps = [
        (e["ts"], e["ts"] + e["dur"], int(e["name"].split("#")[1]))
        for e in events
        if e.get("name", "").startswith("ProfilerStep#")
    ]
    found = {}
    for e in events:
        if e.get("cat") == "cuda_runtime":
            step = next((number for start, end, number in steps if start <= e["ts"] <= end), None)
            if step is not None:
                found[e["args"]["correlation"]] = step
    return found


def nccl_kernels(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Plain reading: the collectives' kernels (NCCL) in start order."""
    return sorted(
        (e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()), key=lambda e: e["ts"]
    )


def union_length(intervals: list[tuple[int, int]]) -> int:
    """Length of the union of [start, end) intervals, by a plain sweep."""
    total = 0
    current_start = current_end = None
    for start, end in sorted(intervals):
        if current_end is None or start > current_end:
            if current_end is not None and current_start is not None:
                total += current_end - current_start
            current_start, current_end = start, end
        else:
            current_end = max(current_end, end)
    if current_end is not None and current_start is not None:
        total += current_end - current_start
    return total


def kernel(
    ts: float,
    dur: float,
    *,
    stream: int = 7,
    device: int = 0,
    correlation: int | None = None,
    name: str = "void gemm_kernel<float>(float*)",
) -> dict[str, Any]:
    """A kernel on ``device``/``stream``."""
    return _on_gpu("kernel", name, ts, dur, device, stream, correlation)


def memcpy(
    ts: float,
    dur: float,
    kind: str,
    *,
    nbytes: int = 4096,
    stream: int = 7,
    device: int = 0,
    correlation: int | None = None,
) -> dict[str, Any]:
    """A copy named like ``Memcpy HtoD (Pageable -> Device)``."""
    return _on_gpu("gpu_memcpy", kind, ts, dur, device, stream, correlation, bytes=nbytes)


def runtime(
    name: str,
    ts: float,
    dur: float,
    *,
    correlation: int | None = None,
    tid: int = TID,
    external_id: int | None = None,
) -> dict[str, Any]:
    """A host CUDA runtime call."""
    args: dict[str, Any] = {"correlation": correlation if correlation is not None else next(_correlation)}
    if external_id is not None:
        args["External id"] = external_id
    return _event("cuda_runtime", name, PID, tid, ts, dur, args)


def launch(
    ts: float, gpu_ts: float, gpu_dur: float, *, tid: int = TID, stream: int = 7
) -> list[dict[str, Any]]:
    """A cudaLaunchKernel at ``ts`` and the kernel it starts at ``gpu_ts``."""
    correlation = next(_correlation)
    return [
        runtime("cudaLaunchKernel", ts, 3, correlation=correlation, tid=tid),
        kernel(gpu_ts, gpu_dur, correlation=correlation, stream=stream),
    ]


def cpu_op(
    name: str, ts: float, dur: float, *, tid: int = TID, external_id: int | None = None
) -> dict[str, Any]:
    """An aten op on the host thread."""
    args = {"External id": external_id if external_id is not None else next(_correlation)}
    return _event("cpu_op", name, PID, tid, ts, dur, args)


def annotation(name: str, ts: float, dur: float, *, tid: int = TID) -> dict[str, Any]:
    """A user_annotation (ProfilerStep#N, DataLoader __next__, record_function)."""
    return _event("user_annotation", name, PID, tid, ts, dur, {})


def frame(
    name: str, ts: float, dur: float, *, python_id: int, parent: int | None = None, tid: int = TID
) -> dict[str, Any]:
    """A python_function frame such as ``train.py(47): train_step``."""
    return _event(
        "python_function", name, PID, tid, ts, dur, {"Python id": python_id, "Python parent id": parent}
    )


def run_frame(name: str, ts: float, dur: float, *, call_site: int, tid: int = TID) -> dict[str, Any]:
    """A frame as ``traceinsight run`` writes it: no ``Python id``, ``"Call site": 1`` when ``name``'s
    line is a call's (``train.py(52): train_step`` while that line runs), 0 for a function's first
    line."""
    return _event("python_function", name, PID, tid, ts, dur, {"Call site": call_site, "External id": 0})


def memory_record(
    ts: float,
    nbytes: int,
    *,
    allocated: int | None = None,
    reserved: int | None = None,
    device: int = 0,
    device_type: int = 1,
) -> dict[str, Any]:
    """An allocator's ``[memory]`` record: ``nbytes`` allocated (freed when negative); the totals
    after it (left out, as in 2021 traces, when None)."""
    args: dict[str, Any] = {"Device Type": device_type, "Device Id": device, "Bytes": nbytes, "Addr": 4096}
    if allocated is not None:
        args["Total Allocated"] = allocated
    if reserved is not None:
        args["Total Reserved"] = reserved
    return {"ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "[memory]", "pid": PID, "tid": TID,
            "ts": ts, "args": args}  # fmt: skip


def write_trace(path: Path, events: list[dict[str, Any]], *, gz: bool = False, **top: Any) -> Path:
    """Write a Kineto-style object trace with ``events`` (and extra top-level keys)."""
    document = {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": "Test GPU"}],
        **top,
        "traceEvents": events,
    }
    text = json.dumps(document).encode()
    path.write_bytes(gzip.compress(text) if gz else text)
    return path


def assert_same_trace(fast: Any, reference: Any) -> None:
    """Two loaded traces are equal: meta, and every table's schema and values exactly."""
    from polars.testing import assert_frame_equal

    from traceinsight.load.schema import TABLES

    assert fast.meta == reference.meta
    for name, table_schema in TABLES.items():
        frame = getattr(fast, name)
        assert frame.schema == table_schema, name
        assert_frame_equal(frame, getattr(reference, name), check_exact=True)


_REPORTS: dict[str, Any] = {}


def sample_report(name: str) -> Any:
    """The report of ``sample_traces/<name>``, analyzed once per test session (read-only: share it)."""
    if name not in _REPORTS:
        from traceinsight.analysis import analyze
        from traceinsight.load import load_trace
        from traceinsight.results import Report
        from traceinsight.rules import evaluate

        analysis = analyze(load_trace(SAMPLES / name))
        _REPORTS[name] = Report(analysis=analysis, findings=evaluate(analysis))
    return _REPORTS[name]


def sample_result(name: str) -> Any:
    """The typed result of ``sample_traces/<name>`` (:func:`sample_report`'s, read-only: share it)."""
    from traceinsight.results import result_of

    return result_of(sample_report(name))
