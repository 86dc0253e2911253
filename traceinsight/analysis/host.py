"""The host-side view: threads, busiest operators, DataLoader time. Works without GPU activity."""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.results import HostSummary
from traceinsight.load import Trace, taxonomy


def host_summary(trace: Trace, top: int = 10) -> HostSummary:
    """Operator counts and total time (inclusive) for the busiest names, and DataLoader time."""
    ops = trace.cpu_ops
    ranked = (
        ops.lazy()
        .group_by("name")
        .agg(count=pl.len(), total=pl.col("dur").sum())
        .sort(["total", "name"], descending=[True, False])
        .head(top)
        .collect(engine="streaming")  # in morsels: a fraction of the memory of one big hash table
    )
    dataloader = trace.annotations.filter(
        pl.col("name").str.starts_with(taxonomy.DATALOADER_PREFIX) & pl.col("name").str.ends_with("__next__")
    )
    threads = (
        pl.concat([ops.lazy().select("pid", "tid"), trace.runtime.lazy().select("pid", "tid")])
        .unique()
        .collect(engine="streaming")
        .height
    )
    return HostSummary(
        threads=threads,
        cpu_ops=ops.height,
        top_ops=tuple((row[0], row[1], row[2]) for row in ranked.iter_rows()),
        dataloader_ns=int(dataloader.get_column("dur").sum()),
        dataloader_count=dataloader.height,
        python_frames=trace.python.height,
    )
