"""The idle split computed again in plain Python from the raw JSON, as the docs describe it.

Independent of the loader and of the polars code: stdlib ``json``, loops and ``bisect``, following
the rules written in ``traceinsight/analysis/idle_gaps.py``'s module docstring and the README. For
traces with integer µs times (so ns are exact without the loader's decimal rules) whose steps are
all steady. Steps are measured on the GPU's clock as ``traceinsight/analysis/steady.py`` describes:
each GPU activity belongs to the step whose host range holds its launching call (or whose
``gpu_user_annotation`` ProfilerStep covers it), a step is done when both its host range and that
work have ended (never before the step before it), and its window runs from the previous step's
done (the first step's host start) to its own.
"""

from __future__ import annotations

import bisect
import itertools
import re
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from tracebuild import read_events

GPU_KINDS = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}
RUNTIME = {"cuda_runtime", "cuda_driver", "Runtime"}
LEGACY_ANNOTATIONS = ("ProfilerStep#", "enumerate(DataLoader)#", "Optimizer.step#", "Optimizer.zero_grad#")
BLOCKING = {
    "cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize", "cudaMemcpy", "cudaMemcpy2D",
    "cuStreamSynchronize", "cuCtxSynchronize", "cuEventSynchronize", "hipStreamSynchronize",
    "hipDeviceSynchronize", "hipEventSynchronize", "hipMemcpy", "hipMemcpyWithStream",
}  # fmt: skip
COPY_CALLS = ("cudaMemcpy", "hipMemcpy", "cuMemcpy")
ALLOCATOR_CALLS = {"cudaMalloc", "cudaFree", "hipMalloc", "hipFree"}
LAUNCH_CALLS = {
    "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx",
    "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel",
}  # fmt: skip
CAPTURE_BEGIN = ("cudaStreamBeginCapture", "hipStreamBeginCapture", "cuStreamBeginCapture")
CAPTURE_END = ("cudaStreamEndCapture", "hipStreamEndCapture", "cuStreamEndCapture")
COMMUNICATION_OP = re.compile(
    r"^(c10d::|c10d_functional::|_c10d_functional::|record_param_comms|nccl:|gloo:|symm_mem::)|^vllm::all_|ProcessGroup"
)
MIN_GAP, SLACK, COVERAGE, DISPATCH_MAX, COPY_WINDOW = 50_000, 50_000, 0.5, 1_000_000, 50_000


@dataclass
class HostEvent:
    ts: int
    end: int
    name: str
    kind: str  # capture | dataloader | sync | copy | op | runtime
    correlation: int | None = None


@dataclass
class Split:
    """Per device idle by cause (steady state) and per (step, device) idle by cause."""

    devices: dict[int, dict[str, int]] = field(default_factory=dict)
    steps: dict[tuple[int, int], dict[str, int]] = field(default_factory=dict)


def _ns(value: Any) -> int:
    return round(value * 1000)


def _overlap(a: int, b: int, c: int, d: int) -> int:
    return max(0, min(b, d) - max(a, c))


@dataclass
class Gaps:
    """Every gap with its cause, and the step windows (step, start, end), in ns."""

    classified: list[tuple[int, int, int, str]]  # device, start, end, cause kind
    windows: list[tuple[int, int, int]]
    extent: dict[int, tuple[int, int]]  # device → first start, last end


class StepWindow(NamedTuple):
    """One step: its host range and its window on the GPU's clock, in ns."""

    step: int
    host_start: int
    host_end: int
    begin: int
    done: int


def run_records_frames(document: dict[str, Any] | None) -> bool:
    """Whether ``traceinsight run`` wrote the trace with frames recorded (``--stacks user``/``all``):
    then its first ProfilerStep starts at its first recorded event (torch opens the range before
    ``run`` switches its own recording on; that time is the tool's, not the user's step)."""
    record = (document or {}).get("traceinsight")
    return isinstance(record, dict) and record.get("stacks") in ("user", "all")


#: The host categories whose first event inside the first step marks where ``run``'s recording began.
_FIRST_EVENT_CATS = {"cpu_op", "python_function", "cuda_runtime", "cuda_driver", "user_annotation"}


def step_windows(
    events: list[dict[str, Any]],
    ns: Callable[[Any], int] | None = None,
    *,
    first_at_first_event: bool = False,
) -> list[StepWindow]:
    """The trace's steps in start order, from the raw events alone (see the module doc).
    ``first_at_first_event`` (a trace of ``run`` recording frames, :func:`run_records_frames`):
    the first ProfilerStep starts at the first host event inside it.

    Host ranges: ``ProfilerStep#N`` (the first of each N), else the windows between the ends of
    consecutive ``Optimizer.step#`` ranges of the most frequent name. Each GPU activity belongs to
    the range holding the first runtime call of its correlation; done = max(host end, the end of the
    work it launched, the end of its ``gpu_user_annotation`` ProfilerStep range up to where work a
    later step launched on that device starts, the previous done).
    ``ns`` turns a µs value into ns (default: rounded, exact for integer µs).
    """
    ns = ns or _ns
    profiler: dict[int, tuple[int, int]] = {}
    optimizer: list[tuple[str, int]] = []
    drawn: dict[tuple[int, int], int] = {}  # (step, device) → end
    first_launch: dict[int, int] = {}
    gpu: list[tuple[int, int | None, int, int]] = []  # end, correlation, device, start
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name, args = e.get("cat"), e.get("name", ""), e.get("args", {})
        ts, end = ns(e["ts"]), ns(e["ts"]) + ns(e["dur"])
        match = re.match(r"^ProfilerStep#(\d+)$", name)
        if cat in ("user_annotation", "Operator") and match and int(match[1]) not in profiler:
            profiler[int(match[1])] = (ts, end)
        elif cat in ("user_annotation", "Operator") and name.startswith("Optimizer.step#"):
            optimizer.append((name, end))
        elif cat == "gpu_user_annotation" and match:
            key = (int(match[1]), int(args.get("device", e.get("pid"))))
            drawn[key] = max(drawn.get(key, end), end)
        elif cat in RUNTIME and args.get("correlation") is not None:
            first_launch.setdefault(args["correlation"], ts)
        elif cat in GPU_KINDS:
            gpu.append((end, args.get("correlation"), int(args.get("device", e.get("pid"))), ts))
    if profiler and first_at_first_event:
        first = min(profiler, key=lambda s: (profiler[s], s))
        start, stop = profiler[first]
        inside = [
            ns(e["ts"])
            for e in events
            if e.get("ph") == "X"
            and e.get("cat") in _FIRST_EVENT_CATS
            and not str(e.get("name", "")).startswith("ProfilerStep#")
            and start <= ns(e["ts"]) < stop
        ]
        if inside and min(inside) > start:
            profiler[first] = (min(inside), stop)
    if profiler:
        ranges = [(step, *profiler[step]) for step in sorted(profiler, key=lambda s: (profiler[s], s))]
    else:
        counts: dict[str, int] = defaultdict(int)
        for name, _ in optimizer:
            counts[name] += 1
        if not counts:
            return []
        chosen = min(counts, key=lambda name: (-counts[name], name))
        ends = sorted(end for name, end in optimizer if name == chosen)
        ranges = [(index, a, b) for index, (a, b) in enumerate(itertools.pairwise(ends)) if b > a]
    gpu_end: dict[int, int] = {}
    first_start: dict[tuple[int, int], int] = {}  # (step, device) → start of the first work it launched
    for end, corr, device, ts in gpu:
        launched = first_launch.get(corr) if corr is not None else None
        if launched is None:
            continue
        for step, start, stop in ranges:
            if start <= launched < stop:
                gpu_end[step] = max(gpu_end.get(step, end), end)
                first_start[step, device] = min(first_start.get((step, device), ts), ts)
    if profiler:
        last: dict[int, int] = {}  # a range drawn past its device's last activity ends with it
        for end, _, device, _ in gpu:
            last[device] = max(last.get(device, end), end)
        for (step, device), end in drawn.items():
            if device in last:
                later = [ts for (other, on), ts in first_start.items() if on == device and other > step]
                end = min(end, last[device], *later)
                gpu_end[step] = max(gpu_end.get(step, end), end)
    result = []
    previous: int | None = None
    for step, start, stop in ranges:
        begin = start if previous is None else previous
        done = max(stop, gpu_end.get(step, stop), begin)
        result.append(StepWindow(step, start, stop, begin, done))
        previous = done
    return result


def reference_split(path: Path) -> Split:
    gaps = reference_gaps(path)
    return _split(gaps.classified, gaps.windows, gaps.extent)


def reference_gaps(path: Path) -> Gaps:
    """Each gap's cause, as the docs describe the rules (see the module doc)."""
    document, events = read_events(path)
    gpu: list[tuple[int, int, int, int | None, str]] = []  # device, start, end, correlation, name
    runtime: list[tuple[int, int, int, int, str, int | None]] = []  # pid, tid, ts, end, name, correlation
    ops: list[tuple[int, int, int, int, str]] = []
    annotations: list[tuple[int, int, int, int, str]] = []
    for e in events:
        if e.get("ph") != "X" or "dur" not in e:
            continue
        cat, name, args = e.get("cat"), e.get("name", ""), e.get("args", {})
        ts, end = _ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])
        if cat in GPU_KINDS:
            device = args.get("device", e.get("pid"))
            gpu.append((int(device), ts, end, args.get("correlation"), name))
        elif cat in RUNTIME:
            runtime.append((e["pid"], e["tid"], ts, end, name, args.get("correlation")))
        elif cat in ("cpu_op", "Operator"):
            target = annotations if cat == "Operator" and name.startswith(LEGACY_ANNOTATIONS) else ops
            target.append((e["pid"], e["tid"], ts, end, name))
        elif cat == "user_annotation":
            annotations.append((e["pid"], e["tid"], ts, end, name))

    # busy blocks and gaps per device
    by_device: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for device, start, end, _, _ in gpu:
        by_device[device].append((start, end))
    gaps: list[tuple[int, int, int]] = []
    extent: dict[int, tuple[int, int]] = {}
    blocks: dict[int, list[tuple[int, int]]] = defaultdict(list)  # merged busy blocks per device
    for device, intervals in by_device.items():
        intervals.sort()
        block_start, block_end = intervals[0]
        extent[device] = (block_start, max(e for _, e in intervals))
        for start, end in intervals[1:]:
            if start > block_end:
                gaps.append((device, block_end, start))
                blocks[device].append((block_start, block_end))
                block_start, block_end = start, end
            else:
                block_end = max(block_end, end)
        blocks[device].append((block_start, block_end))

    # who launched the work that ends each gap
    launch_of = {corr: (pid, tid, ts, end) for pid, tid, ts, end, _, corr in runtime if corr is not None}
    starting: dict[tuple[int, int], list[tuple[int, tuple[int, int, int, int]]]] = defaultdict(list)
    for device, start, _, corr, _ in gpu:
        if corr in launch_of:
            starting[(device, start)].append((corr, launch_of[corr]))
    # work numbered below every process's first recorded call was launched before the host record
    # began, at the latest when the last of those first calls began
    first_call: dict[int, tuple[int, int]] = {}  # pid → (correlation, ts)
    for pid, _, ts, _, _, corr in runtime:
        if corr is not None and corr > 0 and (pid not in first_call or corr < first_call[pid][0]):
            first_call[pid] = (corr, ts)
    lowest = min((corr for corr, _ in first_call.values()), default=0)
    recorded_from = max((ts for _, ts in first_call.values()), default=None)
    early_starts = {
        (device, start) for device, start, _, corr, _ in gpu if corr is not None and 0 < corr < lowest
    }
    # the devices each process launched kernels on (a process on several GPUs: model parallelism)
    process_devices: dict[int, set[int]] = defaultdict(set)
    for device, _, _, corr, name in gpu:
        if corr in launch_of and not name.startswith(("Memcpy", "Memset")):
            process_devices[launch_of[corr][0]].add(device)
    syncs_of: dict[int, list[tuple[int, int, int]]] = defaultdict(list)  # pid → (tid, ts, end)
    for pid, tid, ts, end, name, _ in runtime:
        if name in BLOCKING:
            syncs_of[pid].append((tid, ts, end))
    calls_per_thread: dict[tuple[int, int], int] = defaultdict(int)
    for pid, tid, *_ in runtime:
        calls_per_thread[(pid, tid)] += 1
    main = max(calls_per_thread, key=lambda key: calls_per_thread[key]) if calls_per_thread else None

    # host events per thread, and what each blocking call waited for
    copy_names = {corr: name for _, _, _, corr, name in gpu if corr is not None and name.startswith("Memcpy")}
    host: dict[tuple[int, int], list[HostEvent]] = defaultdict(list)
    copy_returns: dict[tuple[int, int], list[tuple[int, str]]] = defaultdict(list)
    for pid, tid, ts, end, name, corr in runtime:
        if name in BLOCKING:
            host[(pid, tid)].append(HostEvent(ts, end, name, "sync", corr))
        elif name.startswith(COPY_CALLS):
            host[(pid, tid)].append(HostEvent(ts, end, name, "copy"))
            # a copy into pageable host memory waits inside the call: a host wait like a sync
            if re.match(r"^Memcpy DtoH \(\w+ -> Pageable\)", copy_names.get(corr, "")):
                host[(pid, tid)].append(HostEvent(ts, end, name, "sync", corr))
        elif name in ALLOCATOR_CALLS:
            host[(pid, tid)].append(HostEvent(ts, end, name, "alloc"))
        else:
            host[(pid, tid)].append(HostEvent(ts, end, name, "runtime"))
        if name.startswith(COPY_CALLS) and corr in copy_names:
            copy_returns[(pid, tid)].append((end, copy_names[corr]))
    # graph captures: each begin call to the first end call on its thread that ends after it
    by_thread: dict[tuple[int, int], list[tuple[int, int, str]]] = defaultdict(list)
    for pid, tid, ts, end, name, _ in runtime:
        by_thread[(pid, tid)].append((ts, end, name))
    for thread, calls in by_thread.items():
        ends = sorted(end for _, end, name in calls if name.startswith(CAPTURE_END))
        for ts, _, name in calls:
            if name.startswith(CAPTURE_BEGIN):
                stop = next((end for end in ends if end >= ts), max(end for _, end, _ in calls))
                host[thread].append(HostEvent(ts, stop, "graph capture", "capture"))
    for pid, tid, ts, end, name in ops:
        host[(pid, tid)].append(HostEvent(ts, end, name, "op"))
    for pid, tid, ts, end, name in annotations:
        if name.startswith("enumerate(DataLoader)#") and name.endswith("__next__"):
            host[(pid, tid)].append(HostEvent(ts, end, name, "dataloader"))
        elif not name.startswith(("ProfilerStep#", "enumerate(DataLoader)#")):
            host[(pid, tid)].append(HostEvent(ts, end, name, "op"))
    for thread in copy_returns.values():
        thread.sort()

    def waited_copy(thread: tuple[int, int], call: HostEvent) -> str | None:
        if call.correlation in copy_names:
            return copy_names[call.correlation]
        returns = copy_returns.get(thread, [])
        index = bisect.bisect_right(returns, (call.ts, "\uffff")) - 1
        if index >= 0 and call.ts - returns[index][0] <= COPY_WINDOW:
            return returns[index][1]
        return None

    def cause(device: int, start: int, end: int) -> str:
        launchers = starting.get((device, end), [])
        if launchers:
            pid, tid = min(launchers)[1][:2]
            l_ts = min(launch[2] for _, launch in launchers)
            l_end = min(launch[3] for _, launch in launchers)
        elif (device, end) in early_starts and recorded_from is not None and recorded_from <= start:
            return "queued"
        elif main is not None:
            (pid, tid), l_ts, l_end = main, None, None
        else:
            return "unknown"
        duration = end - start
        others = process_devices.get(pid, set()) - {device}
        other_busy = max(
            (sum(_overlap(start, end, a, b) for a, b in blocks[other]) for other in others), default=0
        )
        waits_other = duration >= MIN_GAP and len(others) > 0 and other_busy >= duration * COVERAGE
        if l_end is not None and l_end <= start:
            return "other-gpu" if waits_other else "queued"
        if duration < MIN_GAP:
            return "host-bound"
        touching = [h for h in host[(pid, tid)] if h.ts < end and h.end >= start - SLACK]
        covered = {id(h): _overlap(start, end, h.ts, h.end) for h in touching}
        if sum(covered[id(h)] for h in touching if h.kind == "capture") >= duration * COVERAGE:
            return "graph-capture"
        if sum(covered[id(h)] for h in touching if h.kind == "dataloader") >= duration * COVERAGE:
            return "dataloader"
        drained = [
            h for h in touching
            if h.kind == "sync" and start - SLACK <= h.end <= start + SLACK and h.end - h.ts >= duration * COVERAGE
        ]  # fmt: skip
        if drained:
            waited = waited_copy((pid, tid), max(drained, key=lambda h: h.end))
            return "copy" if waited is not None and waited.startswith("Memcpy HtoD") else "sync"
        if waits_other:  # a thread blocked in syncs until the work was launched, then it waited queued
            launched = min(end, l_end) if l_end is not None else end
            per_thread: dict[int, int] = defaultdict(int)
            for sync_tid, sync_ts, sync_end in syncs_of[pid]:
                per_thread[sync_tid] += _overlap(start, launched, sync_ts, sync_end)
            blocked = max(per_thread.values(), default=0)
            queued = end - min(max(l_end, start), end) if l_end is not None else 0
            if blocked + queued >= duration * COVERAGE:
                return "other-gpu"
        if any(h.kind == "copy" and covered[id(h)] >= duration * COVERAGE for h in touching):
            return "copy"
        covering = [h for h in touching if h.kind == "op" and covered[id(h)] >= duration * COVERAGE]
        op_name = max(covering, key=lambda h: (h.ts, covered[id(h)])).name if covering else ""
        allocating = sum(covered[id(h)] for h in touching if h.kind == "alloc")
        if not COMMUNICATION_OP.search(op_name) and allocating >= duration * COVERAGE:
            return "allocator"
        in_call = [h for h in touching if h.kind == "runtime" and covered[id(h)] >= duration * COVERAGE]
        if covering and in_call and max(in_call, key=lambda h: covered[id(h)]).name in LAUNCH_CALLS:
            return "host-bound"  # a slow launch call (a first launch loading its code)
        if covering:
            op = max(covering, key=lambda h: (h.ts, covered[id(h)]))
            if COMMUNICATION_OP.search(op.name):
                return "communication"
            if l_ts is not None and op.ts <= l_ts <= op.end and duration < DISPATCH_MAX:
                return "host-bound"
            return "cpu_op"
        ending_launch = lambda h: h.kind == "runtime" and l_ts is not None and h.ts >= l_ts  # noqa: E731
        recorded = [
            covered[id(h)]
            for h in touching
            if covered[id(h)] > 0 and h.kind not in ("dataloader", "capture") and not ending_launch(h)
        ]
        # a long gap the thread's events cover less than half of: silence, not launch overhead
        if recorded and not (duration >= DISPATCH_MAX and sum(recorded) < duration * (1 - COVERAGE)):
            return "host-bound"
        return "untraced"

    classified = [(device, start, end, cause(device, start, end)) for device, start, end in gaps]

    # steps on the GPU's clock; all steady in these traces
    windows = [
        (step, begin, done)
        for step, _, _, begin, done in step_windows(events, first_at_first_event=run_records_frames(document))
    ]
    return Gaps(classified, windows, extent)


def _split(
    classified: list[tuple[int, int, int, str]],
    windows: list[tuple[int, int, int]],
    extent: dict[int, tuple[int, int]],
) -> Split:
    steady = (windows[0][1], windows[-1][2])
    split = Split()
    for device in extent:
        totals: dict[str, int] = defaultdict(int)
        for gap_device, start, end, kind in classified:
            if gap_device == device:
                inside = _overlap(start, end, *steady)
                totals[kind] += inside
                totals["outside-steady-state"] += (end - start) - inside
        split.devices[device] = {kind: ns for kind, ns in totals.items() if ns}
        first, last = extent[device]
        for step, w_start, w_end in windows:
            per_step: dict[str, int] = defaultdict(int)
            for gap_device, start, end, kind in classified:
                if gap_device == device:
                    per_step[kind] += _overlap(start, end, w_start, w_end)
            per_step["before-first-work"] += max(0, min(w_end, first) - w_start)
            per_step["after-last-work"] += max(0, w_end - max(w_start, last))
            split.steps[(step, device)] = {kind: ns for kind, ns in per_step.items() if ns}
    return split
