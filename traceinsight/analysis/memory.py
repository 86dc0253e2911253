"""Memory: how close each device came to its limit, and whether the allocator churns in the loop.

From the ``[memory]`` records (``profile_memory=True``): per device, the peak of the allocator's
``Total Allocated`` and ``Total Reserved`` over the whole trace (an out-of-memory error happens at
the peak, wherever it falls), against the GPU's ``totalGlobalMem`` from ``deviceProperties``, and
the series over time for the report's chart. 2021 traces recorded only each block's ``Bytes``: the
allocated series is then their running sum, shifted up by the lowest value it reaches (memory
allocated before the trace began is unknown, but never negative), a lower bound, said so.

From the runtime calls: ``cudaMalloc``/``cudaFree`` (``hipMalloc``/``hipFree``) inside the
steady-state steps, per steady step; in a trace without steps, inside the steady window while the
GPU has work to do (from its first work to the end of its last: a call before it is set-up, one
after it is teardown, and neither holds the GPU back; the step replay measures such a trace on the
GPU the same way). PyTorch's caching allocator reuses blocks, so in a loop at
its usual pace it calls neither; calls every step mean the cache is being emptied
(``torch.cuda.empty_cache()``) or cannot serve the requests (fragmentation, or memory so close to
the limit that a failed allocation frees the cache and retries).
"""

from __future__ import annotations

from typing import ClassVar

import polars as pl

from traceinsight.analysis.intervals import within
from traceinsight.analysis.results import LOCAL
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model, field

__all__ = ["AllocatorCall", "AllocatorCalls", "Memory", "MemoryDevice", "MemorySample", "memory_usage"]

_INT64_MAX = 2**63 - 1


class MemorySample(Model, frozen=True):
    """``[start_us, allocated, reserved]``: a time slice's start (from the trace's first event)
    and its largest values."""

    JSON_ARRAY: ClassVar[bool] = True
    at_ns: int
    allocated_bytes: int | None
    reserved_bytes: int | None


class MemoryDevice(Model, frozen=True, kw_only=True):
    """One allocator's records: a device's peak memory and its memory over time."""

    device: str
    """``GPU 0``, ``CPU``: what the report calls it."""
    device_type: int
    """c10's ``DeviceType`` of the records (0 CPU, 1 GPU; -1 when not recorded)."""
    device_id: int
    """The device's index (-1 for the CPU or when not recorded)."""
    records: int
    """``[memory]`` records (allocations and frees)."""
    peak_allocated_bytes: int
    """Largest ``Total Allocated``: memory held by tensors."""
    peak_allocated_at_ns: int
    """When it was reached (ns from the trace's origin)."""
    allocated_is_lower_bound: bool
    """True when the trace recorded no totals and the allocated series is the running sum of the
    records' ``Bytes`` (see the module docstring)."""
    peak_reserved_bytes: int | None
    """Largest ``Total Reserved``: memory the caching allocator holds from the device (None when
    not recorded)."""
    total_memory_bytes: int | None
    """The GPU's memory (``deviceProperties.totalGlobalMem``); None for the CPU or when not listed."""
    peak_share: float | None
    """The peak's (the larger of the two) share of the device's memory, 4 decimals (None without
    a total)."""
    series: tuple[MemorySample, ...] = ()
    """At most ``memory_series_points`` samples: the records cut into equal time buckets, each
    sample the bucket's start and its largest values (so the peak is always drawn)."""

    @property
    def peak_bytes(self) -> int:
        """The larger of the two peaks: what the device had to hold."""
        return max(self.peak_allocated_bytes, self.peak_reserved_bytes or 0)


class AllocatorCall(Model, frozen=True, kw_only=True):
    """One allocator call's count and host time in the steady state."""

    call: str
    count: int
    host_ns: int


class AllocatorCalls(Model, frozen=True, kw_only=True):
    """Allocator runtime calls inside the steady state."""

    count: int = 0
    """``cudaMalloc``/``cudaFree``/``hipMalloc``/``hipFree`` calls in the steady steps; without
    steps, in the steady window while the GPU has work to do (see :func:`busy_windows`)."""
    host_ns: int = 0
    """Their summed host time."""
    by_name: tuple[AllocatorCall, ...] = ()
    steady_steps: int = 0
    """Steady steps (0 for a trace without steps)."""
    steps_with_calls: int = 0
    """Steady steps holding at least one of the calls."""
    ranges: tuple[tuple[int, int], ...] = field(default=(), compare=False, repr=False, metadata=LOCAL)
    """Each call's (start, end) host range (ns, trace clock): what the fix removes in the replay.
    Live only."""


class Memory(Model, frozen=True, kw_only=True):
    """Peak memory per device and its series (from the ``[memory]`` records); the allocator's
    calls in the steady state."""

    devices: tuple[MemoryDevice, ...] = ()
    allocator_calls: AllocatorCalls = field(default_factory=AllocatorCalls)

    @property
    def recorded(self) -> bool:
        """True when the trace holds ``[memory]`` records (``profile_memory=True``)."""
        return bool(self.devices)


def _label(device_type: int, device_id: int) -> str:
    kind = taxonomy.MEMORY_DEVICE_TYPES.get(device_type, f"device type {device_type}")
    return kind if device_id < 0 else f"{kind} {device_id}"


def _allocated(records: pl.DataFrame) -> tuple[pl.Series, bool]:
    """The allocated series of one device's records (in time order), and whether it is a lower
    bound (no recorded totals: running sum of ``Bytes``, shifted so that its lowest value is 0 when
    it dips below 0). The sum is taken in floats: no overflow on hostile values, exact for
    any real one (below 2**53 bytes)."""
    totals = records.get_column("total_allocated")
    if totals.null_count() == 0:
        return totals, False
    running = records.get_column("bytes").fill_null(0).cast(pl.Float64).cum_sum()
    low = min(float(running.min() or 0.0), 0.0)  # type: ignore[arg-type]
    shifted = (running - low).clip(0.0, float(_INT64_MAX // 2)).round(0).cast(pl.Int64)
    return shifted, True


def _series(
    times: pl.Series, allocated: pl.Series, reserved: pl.Series, points: int
) -> tuple[MemorySample, ...]:
    """At most ``points`` (time, allocated, reserved): equal time buckets, each at its first
    record's time with its largest values."""
    frame = pl.DataFrame({"t": times, "a": allocated, "r": reserved})
    first, last = int(times.min()), int(times.max())  # type: ignore[arg-type]
    width = max(1, -(-(last - first + 1) // max(points, 1)))
    buckets = (
        frame.with_columns(bucket=(pl.col("t") - first) // width)
        .group_by("bucket", maintain_order=True)
        .agg(pl.col("t").min(), pl.col("a").max(), pl.col("r").max())
        .sort("t")
    )
    return tuple(
        MemorySample(int(t), int(a), None if r is None else int(r))
        for t, a, r in buckets.select("t", "a", "r").iter_rows()
    )


def device_memory(trace: Trace, points: int) -> tuple[MemoryDevice, ...]:
    """Per (device type, device id) of the ``[memory]`` records: peaks, total, series."""
    records = trace.memory
    if records.is_empty():
        return ()
    totals = {device.index: device.total_memory_bytes for device in trace.meta.devices}
    origin = trace.meta.origin_ns
    records = records.with_columns(
        pl.col("device_type").fill_null(-1), pl.col("device_id").fill_null(-1)
    ).sort("ts", maintain_order=True)
    devices = []
    for (device_type, device_id), group in sorted(
        records.group_by("device_type", "device_id", maintain_order=True),
        key=lambda item: (int(item[0][0]), int(item[0][1])),
    ):
        kind, index = int(device_type), int(device_id)
        allocated, lower_bound = _allocated(group)
        allocated = allocated.fill_null(0)
        reserved = group.get_column("total_reserved")
        times = group.get_column("ts") - origin
        at = int(allocated.arg_max() or 0)
        peak_reserved = reserved.max()
        peak_allocated = int(allocated.max() or 0)  # type: ignore[arg-type]
        reserved_bytes = None if peak_reserved is None else int(peak_reserved)  # type: ignore[arg-type]
        total = totals.get(index) if kind == taxonomy.GPU_DEVICE_TYPE else None
        peak = max(peak_allocated, reserved_bytes or 0)
        devices.append(
            MemoryDevice(
                device=_label(kind, index),
                device_type=kind,
                device_id=index,
                records=group.height,
                peak_allocated_bytes=peak_allocated,
                peak_allocated_at_ns=int(times[at]),
                allocated_is_lower_bound=lower_bound,
                peak_reserved_bytes=reserved_bytes,
                total_memory_bytes=total,
                peak_share=round(peak / total, 4) if total and total > 0 else None,
                series=_series(times, allocated, reserved, points),
            )
        )
    return tuple(devices)


def busy_windows(trace: Trace, windows: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    """``windows`` cut to when the GPU has work to do: from the later of a window's start and the
    GPU's first work in the trace to the end of the last GPU work that started before the window
    ended (a window the GPU never works in is dropped). A trace without GPU work keeps them."""
    gpu = trace.gpu.select("device", "ts", "end").filter(pl.col("device").is_not_null())
    if gpu.is_empty():
        return windows
    first = int(gpu.get_column("ts").min())  # type: ignore[arg-type]
    cut = []
    for start, end in windows:
        last = gpu.filter((pl.col("ts") < end) & (pl.col("end") > start)).get_column("end").max()
        if isinstance(last, int) and min(end, last) > max(start, first):
            cut.append((max(start, first), min(end, last)))
    return tuple(cut)


def allocator_churn(trace: Trace, steady: SteadySteps) -> AllocatorCalls:
    """The allocator's runtime calls inside the steady steps (without steps: in the steady window
    while the GPU has work to do, :func:`busy_windows`), and the steady steps holding them."""
    calls = trace.runtime.filter(pl.col("name").is_in(list(taxonomy.ALLOCATOR_CALLS)))
    windows = steady.windows if steady.steady_steps else busy_windows(trace, steady.windows)
    calls = calls.filter(within(calls.get_column("ts"), windows)).sort("ts")
    by_name = (
        calls.group_by("name")
        .agg(count=pl.len(), ns=pl.col("dur").sum())
        .sort(["ns", "name"], descending=[True, False])
    )
    steps = steady.steady_steps
    starts = calls.get_column("ts")
    with_calls = sum(1 for step in steps if bool(((starts >= step.start_ns) & (starts < step.end_ns)).any()))
    return AllocatorCalls(
        count=calls.height,
        host_ns=int(calls.get_column("dur").sum()),
        by_name=tuple(
            AllocatorCall(call=str(n), count=int(c), host_ns=int(d)) for n, c, d in by_name.iter_rows()
        ),
        steady_steps=len(steps),
        steps_with_calls=with_calls,
        ranges=tuple(
            (int(start), int(end if end is not None else start))
            for start, end in calls.select("ts", "end").iter_rows()
        ),
    )


def memory_usage(trace: Trace, steady: SteadySteps, points: int = 600) -> Memory:
    """Every device's memory and the allocator's calls in the steady state (see the module docstring)."""
    return Memory(devices=device_memory(trace, points), allocator_calls=allocator_churn(trace, steady))
