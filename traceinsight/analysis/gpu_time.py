"""GPU busy, idle and span per device and per ProfilerStep."""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.intervals import merge_intervals, overlap_ns
from traceinsight.analysis.results import DeviceTime, IdleGap, StepTime
from traceinsight.load import Trace, taxonomy


def busy_intervals(trace: Trace) -> pl.DataFrame:
    """Union of kernel, copy and memset intervals per device → ``device, start, end``."""
    return merge_intervals(trace.gpu.filter(pl.col("device").is_not_null()), by="device")


def kernel_intervals(trace: Trace) -> pl.DataFrame:
    """Union of kernel intervals only, per device → ``device, start, end`` (compute time)."""
    return merge_intervals(trace.gpu.filter(pl.col("kind") == "kernel"), by="device")


def device_times(trace: Trace, busy: pl.DataFrame, kernels: pl.DataFrame) -> tuple[DeviceTime, ...]:
    """Busy (interval union), span (first start → last end) and idle per device."""
    if trace.gpu.is_empty():
        return ()
    per_device = busy.group_by("device").agg(
        busy=(pl.col("end") - pl.col("start")).sum(),
        first=pl.col("start").min(),
        last=pl.col("end").max(),
    )
    kernel_busy = kernels.group_by("device").agg(kernel=(pl.col("end") - pl.col("start")).sum())
    copies = trace.gpu.filter(pl.col("kind") == "memcpy").group_by("device").agg(copy=pl.col("dur").sum())
    table = (
        per_device.join(kernel_busy, on="device", how="left")
        .join(copies, on="device", how="left")
        .fill_null(0)
        .sort("device")
    )
    names = {device.index: device.name for device in trace.meta.devices}
    return tuple(
        DeviceTime(
            device=row["device"],
            name=names.get(row["device"]),
            span_ns=row["last"] - row["first"],
            busy_ns=row["busy"],
            kernel_ns=row["kernel"],
            copy_ns=row["copy"],
            first_ns=row["first"],
            last_ns=row["last"],
        )
        for row in table.iter_rows(named=True)
    )


def step_windows(trace: Trace) -> pl.DataFrame:
    """Host ``ProfilerStep#N`` ranges → ``step, start, end`` (one per step number)."""
    return (
        trace.annotations.filter(pl.col("name").str.starts_with("ProfilerStep#"))
        .select(
            step=pl.col("name").str.extract(taxonomy.STEP_PATTERN.pattern, 1).cast(pl.Int64),
            start=pl.col("ts"),
            end=pl.col("end"),
        )
        .drop_nulls("step")
        .unique("step", keep="first")
        .sort("step")
    )


def iteration_count(trace: Trace) -> int | None:
    """Training iterations: ProfilerStep spans, else ``Optimizer.step#`` ranges, else unknown."""
    steps = step_windows(trace).height
    if steps:
        return steps
    optimizer_steps = trace.annotations.filter(
        pl.col("name").str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX)
    ).height
    return optimizer_steps or None


def step_times(trace: Trace, busy: pl.DataFrame, gaps: tuple[IdleGap, ...]) -> tuple[StepTime, ...]:
    """GPU busy, copy and idle-by-cause inside each host step window, per device.

    Idle not covered by a reported gap (stretches shorter than the gap threshold) is ``short-gaps``;
    window time before the device's first activity or after its last is ``outside-gpu-span``.
    """
    windows = step_windows(trace)
    if windows.is_empty() or busy.is_empty():
        return ()
    devices = busy.select("device").unique()
    grid = windows.join(devices, how="cross")
    busy_in = (
        grid.join_where(
            busy.rename({"start": "b_start", "end": "b_end", "device": "b_device"}),
            pl.col("b_start") < pl.col("end"),
            pl.col("b_end") > pl.col("start"),
        )
        .filter(pl.col("device") == pl.col("b_device"))
        .group_by("step", "device")
        .agg(busy=overlap_ns("start", "end", "b_start", "b_end").sum())
    )
    copies = trace.gpu.filter(pl.col("kind") == "memcpy").select(c_device="device", c_start="ts", c_end="end")
    copy_in = (
        grid.join_where(copies, pl.col("c_start") < pl.col("end"), pl.col("c_end") > pl.col("start"))
        .filter(pl.col("device") == pl.col("c_device"))
        .group_by("step", "device")
        .agg(copy=overlap_ns("start", "end", "c_start", "c_end").sum())
    )
    gap_frame = pl.DataFrame(
        {
            "g_device": [gap.device for gap in gaps],
            "g_start": [gap.start_ns for gap in gaps],
            "g_end": [gap.end_ns for gap in gaps],
            "cause_kind": [gap.cause_kind for gap in gaps],
        },
        schema={"g_device": pl.Int64, "g_start": pl.Int64, "g_end": pl.Int64, "cause_kind": pl.String},
    )
    idle_in = (
        grid.join_where(gap_frame, pl.col("g_start") < pl.col("end"), pl.col("g_end") > pl.col("start"))
        .filter(pl.col("device") == pl.col("g_device"))
        .group_by("step", "device", "cause_kind")
        .agg(idle=overlap_ns("start", "end", "g_start", "g_end").sum())
    )
    table = (
        grid.join(busy_in, on=["step", "device"], how="left")
        .join(copy_in, on=["step", "device"], how="left")
        .fill_null(0)
        .sort("step", "device")
    )
    causes: dict[tuple[int, int], dict[str, int]] = {}
    for row in idle_in.iter_rows(named=True):
        causes.setdefault((row["step"], row["device"]), {})[row["cause_kind"]] = row["idle"]
    result = []
    extent = busy.group_by("device").agg(first=pl.col("start").min(), last=pl.col("end").max())
    first = dict(
        zip(extent.get_column("device").to_list(), extent.get_column("first").to_list(), strict=True)
    )
    last = dict(zip(extent.get_column("device").to_list(), extent.get_column("last").to_list(), strict=True))
    for row in table.iter_rows(named=True):
        by_cause = dict(causes.get((row["step"], row["device"]), {}))
        idle = (row["end"] - row["start"]) - row["busy"]
        # Window time before the device's first or after its last activity is not a gap between
        # GPU work: the profile had not reached the GPU yet (or had left it).
        outside = max(0, min(row["end"], first[row["device"]]) - row["start"]) + max(
            0, row["end"] - max(row["start"], last[row["device"]])
        )
        if outside > 0:
            by_cause["outside-gpu-span"] = outside
        short = idle - sum(by_cause.values())
        if short > 0:
            by_cause["short-gaps"] = short
        result.append(
            StepTime(
                step=row["step"],
                device=row["device"],
                start_ns=row["start"],
                end_ns=row["end"],
                busy_ns=row["busy"],
                copy_ns=row["copy"],
                idle_by_cause_ns=tuple(sorted(by_cause.items(), key=lambda item: -item[1])),
            )
        )
    return tuple(result)
