"""What ``optimizer.step()`` and ``zero_grad()`` cost: per-parameter loops of small kernels (an
optimizer without ``foreach``/``fused``) and a zeroing memset per gradient."""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.intervals import joined_where, within
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model

__all__ = ["OptimizerStats", "optimizer_stats"]


class OptimizerStats(Model, frozen=True):
    """The optimizer's work inside the steady state."""

    #: ``Optimizer.step#...`` ranges in the steady state, and their host time.
    steps: int
    step_ns: int
    #: Kernels launched inside them (by the host call's time), and the median kernel's duration.
    kernels: int
    median_kernel_ns: int
    #: GPU busy time of those kernels (summed durations).
    kernel_ns: int
    #: True when any of them updates many tensors per launch (``multi_tensor_apply``: foreach/fused).
    multi_tensor: bool
    #: The optimizer class, from the range name (``Optimizer.step#AdamW.step`` → ``AdamW``).
    optimizer: str | None
    #: ``Optimizer.zero_grad#...`` ranges and the memsets/fill kernels launched inside them.
    zero_grads: int
    zeroing: int
    #: Each steady ``Optimizer.step`` range: (start, end, GPU time of the kernels launched in it),
    #: for replaying the step at the pace of its kernels.
    ranges: tuple[tuple[int, int, int], ...] = ()


def _inside(launches: pl.DataFrame, ranges: pl.DataFrame) -> pl.DataFrame:
    """Launch calls whose start falls inside one of ``ranges`` on the same thread."""
    if ranges.is_empty() or launches.is_empty():
        return launches.clear()
    bounds = ranges.lazy().select(r_pid="pid", r_tid="tid", r_ts="ts", r_end="end")
    held = (
        bounds.drop_nulls()
        .filter(pl.col("r_end") > pl.col("r_ts"))
        .sort("r_pid", "r_tid", "r_ts")
        .collect(engine="in-memory")
    )
    overlapping = held.select(
        (pl.col("r_ts") < pl.col("r_end").shift(1)).over("r_pid", "r_tid").fill_null(False).any()
    ).item()
    if not overlapping:
        # Ranges that do not overlap on a thread: the one that can hold a call is the last to start
        # at or before it (one search per call, not a join of every call with every range).
        return (
            launches.lazy()
            .drop_nulls(["pid", "tid", "ts"])
            .sort("ts")
            .join_asof(
                held.lazy().sort("r_ts"),
                left_on="ts",
                right_on="r_ts",
                by_left=["pid", "tid"],
                by_right=["r_pid", "r_tid"],
                strategy="backward",
                check_sortedness=False,
            )
            .filter(pl.col("ts") < pl.col("r_end"))
            .with_columns(r_pid="pid", r_tid="tid")
            .select(*launches.columns, "r_pid", "r_tid", "r_ts", "r_end")
            .unique("correlation")
            .collect(engine="in-memory")
        )
    return (
        joined_where(launches.lazy(), bounds, pl.col("ts") >= pl.col("r_ts"), pl.col("ts") < pl.col("r_end"))
        .filter((pl.col("pid") == pl.col("r_pid")) & (pl.col("tid") == pl.col("r_tid")))
        .unique("correlation")
        .collect(engine="in-memory")
    )


def optimizer_stats(trace: Trace, steady: SteadySteps) -> OptimizerStats:
    """Kernels launched inside the steady state's ``Optimizer.step`` and ``zero_grad`` ranges."""
    annotations = trace.annotations
    if steady.windows:
        annotations = annotations.filter(within(annotations.get_column("ts"), steady.windows))
    steps = annotations.filter(pl.col("name").str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX))
    zero = annotations.filter(pl.col("name").str.starts_with("Optimizer.zero_grad#"))
    gpu = trace.gpu.select("correlation", "kind", "name", "dur")
    launches = trace.runtime.select("pid", "tid", "ts", "correlation").join(
        gpu, on="correlation", how="inner"
    )
    in_step = _inside(launches, steps).filter(pl.col("kind") == "kernel")
    in_zero = _inside(launches, zero).filter(
        (pl.col("kind") == "memset") | pl.col("name").str.contains(r"(?i)fill|zero")
    )
    median = in_step.get_column("dur").median()
    names = steps.get_column("name").unique().to_list()
    optimizer = names[0].split("#", 1)[1].split(".", 1)[0] if len(names) == 1 and "#" in names[0] else None
    return OptimizerStats(
        steps=steps.height,
        step_ns=int(steps.get_column("dur").sum()),
        kernels=in_step.height,
        median_kernel_ns=int(median) if isinstance(median, (int, float)) else 0,
        kernel_ns=int(in_step.get_column("dur").sum()),
        multi_tensor=bool(
            in_step.get_column("name").str.contains(taxonomy.MULTI_TENSOR_KERNEL_PATTERN).any()
        ),
        optimizer=optimizer,
        zero_grads=zero.height,
        zeroing=in_zero.height,
        ranges=_range_kernels(steps, in_step),
    )


def _range_kernels(steps: pl.DataFrame, in_step: pl.DataFrame) -> tuple[tuple[int, int, int], ...]:
    """Each ``Optimizer.step`` range with the summed duration of the kernels launched in it."""
    kernel_ns = (
        {
            (int(start), int(end)): int(ns)
            for start, end, ns in in_step.group_by("r_ts", "r_end").agg(pl.col("dur").sum()).iter_rows()
        }
        if in_step.height
        else {}
    )
    return tuple(
        (int(start), int(end), kernel_ns.get((int(start), int(end)), 0))
        for start, end in steps.sort("ts").select("ts", "end").iter_rows()
    )
