"""The kernels that take the most GPU time, per device."""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.results import COUNT, DURATION
from traceinsight.load import Trace
from traceinsight.model import Model, field

__all__ = ["Kernel", "TopKernels", "top_kernels"]


class Kernel(Model, frozen=True, kw_only=True):
    """All launches of one kernel name on one device, by total time."""

    device: int
    name: str
    count: int = field(metadata=COUNT)
    #: Summed kernel durations (kernels on different streams may run at the same time).
    total_ns: int = field(metadata=DURATION)
    #: Average duration of one launch (total // count).
    mean_ns: int = 0
    max_ns: int = 0


class TopKernels(Model, frozen=True):
    """The ``top`` kernels by summed duration, and totals over every kernel of the trace."""

    kernels: tuple[Kernel, ...]
    #: Kernel launches in the trace, all devices.
    kernel_count: int
    #: Distinct (device, name) pairs in the trace.
    distinct: int
    #: Summed duration of every kernel per device, as (device, ns) pairs: the denominator for shares.
    total_ns_by_device: tuple[tuple[int, int], ...]


def top_kernels(trace: Trace, top: int = 20) -> TopKernels:
    """Kernels grouped by device and name, ranked by summed duration (ties by name)."""
    kernels = trace.gpu.select("kind", "device", "name", "dur").filter(
        (pl.col("kind") == "kernel") & pl.col("device").is_not_null()
    )
    if kernels.is_empty():
        return TopKernels((), 0, 0, ())
    grouped = kernels.group_by("device", "name").agg(
        count=pl.len(), total=pl.col("dur").sum(), longest=pl.col("dur").max()
    )
    ranked = grouped.sort(["total", "device", "name"], descending=[True, False, False]).head(top)
    totals = kernels.group_by("device").agg(total=pl.col("dur").sum()).sort("device")
    return TopKernels(
        kernels=tuple(
            Kernel(
                device=row[0],
                name=row[1],
                count=row[2],
                total_ns=row[3],
                mean_ns=row[3] // row[2] if row[2] else 0,
                max_ns=row[4],
            )
            for row in ranked.select("device", "name", "count", "total", "longest").iter_rows()
        ),
        kernel_count=kernels.height,
        distinct=grouped.height,
        total_ns_by_device=tuple((row[0], row[1]) for row in totals.iter_rows()),
    )
