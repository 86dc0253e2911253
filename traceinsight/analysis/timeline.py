"""The GPU activity timeline, downsampled for drawing: busy blocks, host sync marks and steps.

A trace can hold hundreds of thousands of kernels; a chart a thousand pixels wide cannot show more
than a few thousand rectangles per device. The timeline is cut to a *resolution* (the displayed
window divided by ``max_blocks - 1``): busy intervals (the union of kernels, copies and memsets)
separated by less than one resolution are merged into one block, which keeps its true busy time,
so a chart can shade it by how busy it really was. Every remaining gap is at least one resolution
long, which bounds the number of blocks per device by ``max_blocks``. Host-blocking calls are merged
the same way into marks that keep their count.
"""

from __future__ import annotations

import math
from typing import Final

import polars as pl

from traceinsight.analysis.gpu_time import busy_intervals
from traceinsight.analysis.intervals import merge_intervals
from traceinsight.analysis.results import COUNT, DURATION
from traceinsight.analysis.shared import gpu_classes
from traceinsight.analysis.steady import SteadySteps, step_windows
from traceinsight.analysis.syncs import launch_devices
from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model, field

__all__ = ["BusyBlock", "DeviceTimeline", "StepWindow", "SyncMark", "Timeline", "timeline"]


#: Blocks (and sync marks) per device at most: a chart a thousand pixels wide shows no more.
MAX_BLOCKS: Final = 2000


class BusyBlock(Model, frozen=True):
    """Busy intervals merged at the timeline's resolution (trace clock, ns)."""

    start_ns: int
    end_ns: int
    #: Summed length of the busy intervals inside the block (at most end - start).
    busy_ns: int = field(metadata=DURATION)

    @property
    def busy_share(self) -> float:
        """busy / block length (1.0 for a zero-length block)."""
        length = self.end_ns - self.start_ns
        return self.busy_ns / length if length else 1.0


class SyncMark(Model, frozen=True):
    """Host-blocking calls (``cudaStreamSynchronize`` ...) merged at the resolution."""

    start_ns: int
    end_ns: int
    #: How many calls were merged into this mark.
    count: int = field(metadata=COUNT)


class DeviceTimeline(Model, frozen=True):
    """One device's downsampled busy blocks and the sync calls of the processes driving it."""

    device: int
    blocks: tuple[BusyBlock, ...] = field(metadata={"most": MAX_BLOCKS})
    syncs: tuple[SyncMark, ...] = field(metadata={"most": MAX_BLOCKS})
    #: Communication kernels (NCCL/RCCL ...) merged at the same resolution: drawn apart from compute.
    communication: tuple[BusyBlock, ...] = field(default=(), metadata={"most": MAX_BLOCKS})


class StepWindow(Model, frozen=True):
    """A step on the GPU's clock: its device window (the host range where no steady state is given)."""

    step: int
    start_ns: int
    end_ns: int


class Timeline(Model, frozen=True):
    """Everything a timeline chart draws. Times in ns from the trace's earliest event
    (:attr:`TraceMeta.origin_ns`), as the idle gaps' and the steps'."""

    #: The displayed window: GPU activity and step windows together.
    start_ns: int
    end_ns: int
    #: Busy intervals closer than this were merged; gaps shorter than this are not visible.
    resolution_ns: int = field(metadata=DURATION)
    devices: tuple[DeviceTimeline, ...]
    steps: tuple[StepWindow, ...]


def _merge_at_resolution(frame: pl.DataFrame, resolution_ns: int) -> pl.DataFrame:
    """Merge ``device, start, end`` rows whose gap to the running end is below the resolution.

    → ``device, start, end, busy, count`` (busy = summed lengths of the merged rows).
    """
    running_end = pl.col("end").cum_max().shift(1).over("device")
    return (
        frame.lazy()
        .sort("device", "start")
        .with_columns(
            block=(running_end.is_null() | (pl.col("start") - running_end >= resolution_ns))
            .cum_sum()
            .over("device")
        )
        .group_by("device", "block")
        .agg(
            start=pl.col("start").min(),
            end=pl.col("end").max(),
            busy=(pl.col("end") - pl.col("start")).sum(),
            count=pl.len(),
        )
        .sort("device", "start")
        .collect(engine="in-memory")
    )


def _sync_calls_per_device(trace: Trace, devices: list[int], launched: pl.DataFrame | None) -> pl.DataFrame:
    """Blocking host calls → ``device, start, end``: on every device their process launched on.

    A call from a process that launched nothing (or without a pid) is shown on every device.
    """
    calls = trace.runtime.filter(pl.col("name").is_in(list(taxonomy.BLOCKING_CALLS))).select(
        "pid", start="ts", end="end"
    )
    schema = pl.Schema({"device": pl.Int64, "start": pl.Int64, "end": pl.Int64})
    if calls.is_empty() or not devices:
        return pl.DataFrame(schema=schema)
    devices_of = (launch_devices(trace) if launched is None else launched).lazy().drop_nulls()
    mapped = calls.lazy().join(devices_of, on="pid", how="inner").select("device", "start", "end")
    unmapped = (
        calls.lazy()
        .join(devices_of, on="pid", how="anti")
        .join(pl.LazyFrame({"device": devices}, schema={"device": pl.Int64}), how="cross")
    )
    return (
        pl.concat([mapped, unmapped.select("device", "start", "end")])
        .cast(schema)
        .collect(engine="in-memory")
    )


def timeline(
    trace: Trace,
    max_blocks: int = MAX_BLOCKS,
    busy: pl.DataFrame | None = None,
    launched: pl.DataFrame | None = None,
    steady: SteadySteps | None = None,
    classes: pl.DataFrame | None = None,
) -> Timeline:
    """The per-device busy timeline with at most ``max_blocks`` blocks (and marks) per device.

    See the module docstring for how intervals are merged; ``max_blocks`` must be at least 2.
    ``busy`` is :func:`busy_intervals` and ``launched`` :func:`launch_devices` of the trace when
    the caller has them already (``classes`` its :func:`~.shared.gpu_classes`); with ``steady`` its
    steps are drawn by their device windows.
    """
    if max_blocks < 2:
        raise ValueError("max_blocks must be at least 2")
    origin = trace.meta.origin_ns
    busy = busy_intervals(trace) if busy is None else busy
    if steady is not None:
        steps = pl.DataFrame(
            {
                "step": [step.step for step in steady.steps],
                "start": [step.begin_ns for step in steady.steps],
                "end": [step.done_ns for step in steady.steps],
            },
            schema={"step": pl.Int64, "start": pl.Int64, "end": pl.Int64},
        )
    else:
        _, steps = step_windows(trace)
    bounds: list[int] = [
        value
        for frame in (busy, steps)
        if frame.height
        for value in frame.select(pl.col("start").min(), pl.col("end").max()).row(0)
    ]
    if not bounds:
        return Timeline(0, 0, 1, (), ())
    start, end = min(bounds), max(bounds)
    # k blocks leave k - 1 gaps of at least one resolution each: k ≤ window / resolution + 1.
    resolution = max(1, math.ceil((end - start) / (max_blocks - 1)))
    devices = sorted(int(d) for d in busy.get_column("device").unique().to_list())
    blocks = _merge_at_resolution(busy, resolution)
    marks = _merge_at_resolution(_sync_calls_per_device(trace, devices, launched), resolution)
    gpu = gpu_classes(trace) if classes is None else classes
    communication = _merge_at_resolution(
        merge_intervals(gpu.filter((pl.col("kind") == "kernel") & pl.col("communication")), by="device"),
        resolution,
    )

    def rows(table: pl.DataFrame, device: int, last: str) -> list[tuple[int, int, int]]:
        """The device's rows of ``table`` as ``(start, end, last)``, from the trace's earliest event."""
        chosen = table.lazy().filter(pl.col("device") == device)
        chosen = chosen.select(pl.col("start") - origin, pl.col("end") - origin, last)
        return chosen.collect(engine="in-memory").rows()

    per_device = []
    for device in devices:
        per_device.append(
            DeviceTimeline(
                device=device,
                blocks=tuple(BusyBlock(*row) for row in rows(blocks, device, "busy")),
                syncs=tuple(SyncMark(*row) for row in rows(marks, device, "count")),
                communication=tuple(BusyBlock(*row) for row in rows(communication, device, "busy")),
            )
        )
    return Timeline(
        start_ns=start - origin,
        end_ns=end - origin,
        resolution_ns=resolution,
        devices=tuple(per_device),
        steps=tuple(
            StepWindow(step, begin - origin, done - origin) for step, begin, done in steps.iter_rows()
        ),
    )
