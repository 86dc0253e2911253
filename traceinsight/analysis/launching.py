"""How the host launches work: kernels per step, how long a kernel runs against how long its launch
takes, and which operators' dispatch leaves the GPU waiting (launch-bound loops)."""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.intervals import within
from traceinsight.analysis.sources import enclosing_ops
from traceinsight.analysis.steady import SteadyState
from traceinsight.load import Trace

__all__ = ["LaunchStats", "launch_stats"]

#: Host calls that put one kernel in the queue.
_KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel")  # fmt: skip


@dataclass(frozen=True, slots=True)
class LaunchStats:
    """Launching in the steady state (all devices)."""

    kernels: int
    #: Kernels per steady step (None without steps).
    kernels_per_step: float | None
    median_kernel_ns: int
    #: Median duration of a kernel launch call on the host.
    median_launch_ns: int
    #: The operators the host was dispatching in launch-overhead gaps: (op, idle ns, gaps).
    dispatching: tuple[tuple[str, int, int], ...]


def launch_stats(trace: Trace, steady: SteadyState, gaps: pl.DataFrame, top: int = 5) -> LaunchStats:
    """Kernel and launch-call durations in the steady state, and the innermost operator the
    launching thread was in during each ``host-bound`` gap of at least ``min_gap`` (the gaps table
    has a source for exactly those)."""
    kernels = trace.gpu.filter(pl.col("kind") == "kernel")
    launches = trace.runtime.filter(pl.col("name").is_in(_KERNEL_LAUNCHES))
    if steady.windows:  # kernels on the GPU's clock, launch calls on the host's
        kernels = kernels.filter(within(kernels.get_column("ts"), steady.device_windows))
        launches = launches.filter(within(launches.get_column("ts"), steady.windows))
    steps = len(steady.steady_steps)
    kernel_median = kernels.get_column("dur").median()
    launch_median = launches.get_column("dur").median()
    launch_gaps = gaps.filter(
        (pl.col("cause_kind") == CauseKind.LAUNCH.value)
        & pl.col("pid").is_not_null()
        & pl.col("cause").str.starts_with("dispatching ")
    )
    if steady.windows and launch_gaps.height:
        launch_gaps = launch_gaps.filter(within(launch_gaps.get_column("start"), steady.device_windows))
    dispatching: tuple[tuple[str, int, int], ...] = ()
    if launch_gaps.height:
        points = launch_gaps.with_row_index("key").select(
            pl.col("key").cast(pl.Int64),
            "pid",
            "tid",
            t=(pl.col("start") + pl.col("end")) // 2,
            duration="duration",
        )
        ops = enclosing_ops(trace, points.drop("duration"))
        ranked = (
            points.join(ops, on="key", how="inner")
            .group_by("innermost")
            .agg(ns=pl.col("duration").sum(), gaps=pl.len())
            .sort(["ns", "innermost"], descending=[True, False])
            .head(top)
        )
        dispatching = tuple((row[0], row[1], row[2]) for row in ranked.iter_rows())
    return LaunchStats(
        kernels=kernels.height,
        kernels_per_step=kernels.height / steps if steps else None,
        median_kernel_ns=int(kernel_median) if isinstance(kernel_median, (int, float)) else 0,
        median_launch_ns=int(launch_median) if isinstance(launch_median, (int, float)) else 0,
        dispatching=dispatching,
    )
