"""The host-side view: threads, busiest operators (self time), DataLoader time. Works without GPU activity.

Self time is an operator's duration minus the durations of the operators it calls directly, so a
chain of wrappers (``aten::to`` → ``aten::_to_copy`` → ``aten::copy_``) counts its time once, in the
operator that did the work.

How the direct caller is found without a loop: on each thread, operators sorted by start (longer
first on ties) nest like a stack. An operator's depth is how many operators started before it
(counting itself) minus how many before it ended by its start, less one; its caller is the latest
operator before it at one depth less (an as-of join on the order, by depth). Operators that overlap without
nesting (a recording glitch) are counted as if they nested.
"""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.results import HostSummary
from traceinsight.load import Trace, taxonomy


def self_times(ops: pl.DataFrame) -> pl.DataFrame:
    """Per operator row → ``name, dur, self, top`` (self = dur minus direct callees' durations;
    top = its direct caller has another name, so its duration counts in the name's total)."""
    if ops.is_empty():
        return pl.DataFrame(schema={"name": pl.String, "dur": pl.Int64, "self": pl.Int64, "top": pl.Boolean})
    ordered = (
        ops.select("pid", "tid", "ts", "end", "dur", "name")
        .drop_nulls(["ts", "end"])
        .sort(["pid", "tid", "ts", "end"], descending=[False, False, False, True], maintain_order=True)
        .with_row_index("order")
        .with_columns(pl.col("order").cast(pl.Int64))
    )
    thread = ["pid", "tid"]
    started = pl.int_range(1, pl.len() + 1).over(thread)
    ends = ordered.select(*thread, "end").sort(*thread, "end")
    ended_before = (
        ordered.select(*thread, "order", "ts")
        .join_asof(
            ends.with_columns(ended=pl.int_range(1, pl.len() + 1).over(thread)).rename({"end": "ts"}),
            on="ts",
            by=thread,
            strategy="backward",
            check_sortedness=False,
        )
        .select("order", ended=pl.col("ended").fill_null(0))
    )
    # The last end ≤ ts counts every end at or before the start, which includes zero-length
    # operators starting at that same instant that come at or after this one in the order (they
    # sort last among equal starts): those have not ended before it, so they are taken back out.
    zero = (pl.col("end") == pl.col("ts")).cast(pl.Int64)
    same_start = [*thread, "ts"]
    with_depth = (
        ordered.with_columns(started=started)
        .join(ended_before, on="order")
        .with_columns(
            zero_after=zero.sum().over(same_start) - (zero.cum_sum().over(same_start) - 1).clip(lower_bound=0)
        )
        .with_columns(depth=pl.col("started") - (pl.col("ended") - pl.col("zero_after")) - 1)
    )
    parents = with_depth.select(*thread, "order", parent_depth=pl.col("depth")).rename({"order": "parent"})
    linked = (
        with_depth.with_columns(parent_depth=pl.col("depth") - 1)
        .sort("order")
        .join_asof(
            parents.sort("parent"),
            left_on="order",
            right_on="parent",
            by=[*thread, "parent_depth"],
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
    )
    callees = linked.group_by("parent").agg(callees=pl.col("dur").sum())
    caller_names = linked.select(parent="order", caller="name")
    return (
        linked.join(callees, left_on="order", right_on="parent", how="left")
        .join(caller_names, on="parent", how="left")
        .select(
            "name",
            "dur",
            (pl.col("dur") - pl.col("callees").fill_null(0)).clip(lower_bound=0).alias("self"),
            # counted in the total unless a call of the same name encloses it (recursion)
            (pl.col("caller") != pl.col("name")).fill_null(True).alias("top"),
        )
    )


def host_summary(trace: Trace, top: int = 10) -> HostSummary:
    """The operators with the most self time (with their count and inclusive time, a call inside a
    call of the same name counted once), DataLoader time, threads."""
    ops = trace.cpu_ops
    timed = self_times(ops)
    ranked = (
        timed.lazy()
        .group_by("name")
        .agg(
            pl.col("self").sum().alias("self"),
            count=pl.len(),
            total=pl.col("dur").filter(pl.col("top")).sum(),
        )
        .sort(["self", "name"], descending=[True, False])
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
        top_ops=tuple(
            (row[0], row[1], row[2]) for row in ranked.select("name", "count", "total").iter_rows()
        ),
        dataloader_ns=int(dataloader.get_column("dur").sum()),
        dataloader_count=dataloader.height,
        python_frames=trace.python.height,
        top_ops_self=tuple(int(value) for value in ranked.get_column("self")),
    )
