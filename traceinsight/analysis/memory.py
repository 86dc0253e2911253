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

from dataclasses import dataclass

import polars as pl

from traceinsight.analysis.intervals import within
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace, taxonomy

__all__ = ["AllocatorChurn", "DeviceMemory", "MemoryUsage", "memory_usage"]

_INT64_MAX = 2**63 - 1


@dataclass(frozen=True, slots=True)
class DeviceMemory:
    """One allocator's records: a device's peak memory and its memory over time."""

    device_type: int
    """c10's ``DeviceType`` of the records (0 CPU, 1 GPU; -1 when not recorded)."""
    device_id: int
    """The device's index (-1 for the CPU or when not recorded)."""
    label: str
    """``GPU 0``, ``CPU``: what the report calls it."""
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
    series: tuple[tuple[int, int, int | None], ...]
    """(ns from the origin, allocated, reserved) at most ``memory_series_points`` points: the
    records cut into equal time buckets, each point the bucket's start and its largest values (so
    the peak is always drawn)."""

    @property
    def peak_bytes(self) -> int:
        """The larger of the two peaks: what the device had to hold."""
        return max(self.peak_allocated_bytes, self.peak_reserved_bytes or 0)

    @property
    def peak_share(self) -> float | None:
        """The peak's share of the device's memory (None without a total)."""
        if not self.total_memory_bytes or self.total_memory_bytes <= 0:
            return None
        return self.peak_bytes / self.total_memory_bytes


@dataclass(frozen=True, slots=True)
class AllocatorChurn:
    """Allocator runtime calls inside the steady state."""

    calls: int
    """``cudaMalloc``/``cudaFree``/``hipMalloc``/``hipFree`` calls in the steady steps; without
    steps, in the steady window while the GPU has work to do (see :func:`busy_windows`)."""
    call_ns: int
    """Their summed host time."""
    by_name: tuple[tuple[str, int, int], ...]
    """(call name, count, host time) by name."""
    steady_steps: int
    """Steady steps (0 for a trace without steps)."""
    steps_with_calls: int
    """Steady steps holding at least one of the calls."""
    ranges: tuple[tuple[int, int], ...]
    """Each call's (start, end) host range (ns, trace clock): what the fix removes in the replay."""


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """Every device's memory from the ``[memory]`` records, and the allocator's churn."""

    devices: tuple[DeviceMemory, ...]
    churn: AllocatorChurn

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
) -> tuple[tuple[int, int, int | None], ...]:
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
        (int(t), int(a), None if r is None else int(r))
        for t, a, r in buckets.select("t", "a", "r").iter_rows()
    )


def device_memory(trace: Trace, points: int) -> tuple[DeviceMemory, ...]:
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
        devices.append(
            DeviceMemory(
                device_type=kind,
                device_id=index,
                label=_label(kind, index),
                records=group.height,
                peak_allocated_bytes=int(allocated.max() or 0),  # type: ignore[arg-type]
                peak_allocated_at_ns=int(times[at]),
                allocated_is_lower_bound=lower_bound,
                peak_reserved_bytes=None if peak_reserved is None else int(peak_reserved),  # type: ignore[arg-type]
                total_memory_bytes=totals.get(index) if kind == taxonomy.GPU_DEVICE_TYPE else None,
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


def allocator_churn(trace: Trace, steady: SteadySteps) -> AllocatorChurn:
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
    return AllocatorChurn(
        calls=calls.height,
        call_ns=int(calls.get_column("dur").sum()),
        by_name=tuple((str(n), int(c), int(d)) for n, c, d in by_name.iter_rows()),
        steady_steps=len(steps),
        steps_with_calls=with_calls,
        ranges=tuple(
            (int(start), int(end if end is not None else start))
            for start, end in calls.select("ts", "end").iter_rows()
        ),
    )


def memory_usage(trace: Trace, steady: SteadySteps, points: int = 600) -> MemoryUsage:
    """Every device's memory and the allocator's churn (see the module docstring)."""
    return MemoryUsage(devices=device_memory(trace, points), churn=allocator_churn(trace, steady))
