"""Idle gaps on each GPU and what the host was doing during them.

A gap is a stretch between merged busy blocks on one device. Its cause is read from the host
thread that launched the GPU work which ends the gap (joined on correlation), in this order:

1. ``dataloader`` — that thread spent at least ``cause_coverage`` of the gap in DataLoader ``__next__``;
2. ``sync`` — a blocking call on that thread returned within ``sync_drain_slack_us`` of the gap's
   start: the host waited for the GPU to drain its queue, so no work was queued ahead;
3. ``cpu_op`` — the innermost operator or annotation covering at least ``cause_coverage`` of the gap;
4. ``host-bound`` — none of these, but the thread made runtime calls or ran ops during the gap: it was
   busy launching, or in Python between launches;
5. ``untraced`` — the thread recorded nothing at all during the gap (Python code without
   ``with_stack``, a lock, waiting on another thread); ``unknown`` — no launching thread found.
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceinsight.analysis.intervals import gaps_between, meeting, overlap_ns
from traceinsight.analysis.results import IdleGap
from traceinsight.analysis.sources import source_at
from traceinsight.load import Trace, taxonomy
from traceinsight.thresholds import Thresholds


def all_gaps(busy: pl.DataFrame) -> pl.DataFrame:
    """Every idle stretch between busy blocks → ``device, start, end, duration``."""
    return gaps_between(busy, by="device")


def _main_thread(trace: Trace) -> tuple[int | None, int | None]:
    """The thread that made the most runtime calls: the fallback launcher."""
    if trace.runtime.is_empty():
        return None, None
    top = trace.runtime.group_by("pid", "tid").len().sort("len", descending=True).row(0)
    return top[0], top[1]


def idle_gaps(
    trace: Trace,
    gaps: pl.DataFrame,
    calls: pl.DataFrame,
    thresholds: Thresholds,
    user_code: Collection[str] = (),
) -> tuple[IdleGap, ...]:
    """Gaps of at least ``min_gap_us``, longest first, each with its cause and source line."""
    min_ns = round(thresholds.min_gap_us * 1000)
    long_gaps = gaps.filter(pl.col("duration") >= min_ns)
    if long_gaps.is_empty():
        return ()
    launchers = (
        trace.gpu.select("device", "ts", "correlation")
        .join(trace.runtime.select("correlation", "pid", "tid"), on="correlation", how="inner")
        .sort("correlation")
        .group_by("device", "ts")
        .agg(pl.col("pid").first(), pl.col("tid").first())
    )
    main_pid, main_tid = _main_thread(trace)
    table = (
        long_gaps.join(launchers, left_on=["device", "end"], right_on=["device", "ts"], how="left")
        .with_columns(
            pl.col("pid").fill_null(pl.lit(main_pid, pl.Int64)),
            pl.col("tid").fill_null(pl.lit(main_tid, pl.Int64)),
        )
        .with_row_index("gap")
        .with_columns(pl.col("gap").cast(pl.Int64))
    )
    slack = round(thresholds.sync_drain_slack_us * 1000)

    dataloader = trace.annotations.filter(
        pl.col("name").str.starts_with(taxonomy.DATALOADER_PREFIX) & pl.col("name").str.ends_with("__next__")
    )
    windows = table.select(start=pl.col("start") - slack, end="end")
    host = pl.concat(
        [
            meeting(frame, "ts", "end", windows)
            for frame in (
                dataloader.select(
                    "pid", "tid", "ts", "end", "name", kind=pl.lit("dataloader"), key=pl.lit(None, pl.Int64)
                ),
                calls.select("pid", "tid", "ts", "end", name="call", kind=pl.lit("sync"), key="key"),
                trace.cpu_ops.select(
                    "pid", "tid", "ts", "end", "name", kind=pl.lit("op"), key=pl.lit(None, pl.Int64)
                ),
                trace.annotations.filter(
                    ~pl.col("name").str.starts_with("ProfilerStep#")
                    & ~pl.col("name").str.starts_with(taxonomy.DATALOADER_PREFIX)
                ).select("pid", "tid", "ts", "end", "name", kind=pl.lit("op"), key=pl.lit(None, pl.Int64)),
                trace.runtime.filter(~pl.col("name").is_in(list(taxonomy.BLOCKING_CALLS))).select(
                    "pid", "tid", "ts", "end", "name", kind=pl.lit("runtime"), key=pl.lit(None, pl.Int64)
                ),
            )
        ]
    ).rename({"pid": "h_pid", "tid": "h_tid", "ts": "h_ts", "end": "h_end"})
    touching = (
        table.select("gap", "pid", "tid", "start", "end")
        .join_where(
            host,
            pl.col("h_ts") < pl.col("end"),
            pl.col("h_end") >= pl.col("start") - slack,
        )
        .filter((pl.col("h_pid") == pl.col("pid")) & (pl.col("h_tid") == pl.col("tid")))
        .with_columns(covered=overlap_ns("start", "end", "h_ts", "h_end"))
    )
    coverage = pl.col("covered") >= (pl.col("end") - pl.col("start")) * thresholds.cause_coverage
    dl = (
        touching.filter(pl.col("kind") == "dataloader")
        .group_by("gap")
        .agg(dl_covered=pl.col("covered").sum(), dl_name=pl.col("name").first())
    )
    drained = (
        touching.filter(
            (pl.col("kind") == "sync")
            & (pl.col("h_end") >= pl.col("start") - slack)
            & (pl.col("h_end") <= pl.col("start") + slack)
        )
        .sort("h_end")
        .group_by("gap")
        .agg(sync_key=pl.col("key").last())
    )
    busiest_op = (
        touching.filter((pl.col("kind") == "op") & coverage)
        .sort("h_ts", "covered", descending=[True, True])  # innermost op that still covers the gap
        .group_by("gap")
        .agg(op_name=pl.col("name").first())
    )
    recorded = (
        touching.filter((pl.col("covered") > 0) & (pl.col("kind") != "dataloader"))
        .group_by("gap")
        .agg(activity=pl.len())
    )
    sync_labels = calls.select(
        sync_key="key",
        sync_label=pl.when(pl.col("op").is_not_null())
        .then(pl.format("{} in {}", "call", "op"))
        .otherwise(pl.col("call")),
        sync_source="source",
    )
    classified = (
        table.join(dl, on="gap", how="left")
        .join(drained, on="gap", how="left")
        .join(busiest_op, on="gap", how="left")
        .join(recorded, on="gap", how="left")
        .join(sync_labels, on="sync_key", how="left")
        .with_columns(dl_covered=pl.col("dl_covered").fill_null(0))
        .with_columns(
            cause_kind=pl.when(pl.col("pid").is_null())
            .then(pl.lit("unknown"))
            .when(pl.col("dl_covered") >= pl.col("duration") * thresholds.cause_coverage)
            .then(pl.lit("dataloader"))
            .when(pl.col("sync_key").is_not_null())
            .then(pl.lit("sync"))
            .when(pl.col("op_name").is_not_null())
            .then(pl.lit("cpu_op"))
            .when(pl.col("activity").is_null())
            .then(pl.lit("untraced"))
            .otherwise(pl.lit("host-bound"))
        )
        .with_columns(
            cause=pl.when(pl.col("cause_kind") == "dataloader")
            .then(pl.col("dl_name"))
            .when(pl.col("cause_kind") == "sync")
            .then(pl.col("sync_label"))
            .when(pl.col("cause_kind") == "cpu_op")
            .then(pl.col("op_name"))
            .when(pl.col("cause_kind") == "host-bound")
            .then(pl.lit("host busy launching / in Python between launches"))
            .when(pl.col("cause_kind") == "untraced")
            .then(pl.lit("launching thread recorded nothing (Python without stacks, a lock, another thread)"))
            .otherwise(pl.lit("no host thread tied to the next GPU work"))
        )
    )
    points = classified.select(
        key="gap", pid="pid", tid="tid", t=((pl.col("start") + pl.col("end")) // 2)
    ).filter(pl.col("pid").is_not_null())
    sources = source_at(trace, points, user_code).rename({"key": "gap", "source": "mid_source"})
    classified = classified.join(sources, on="gap", how="left").with_columns(
        source=pl.when(pl.col("cause_kind") == "sync")
        .then(pl.coalesce("sync_source", "mid_source"))
        .otherwise(pl.col("mid_source"))
    )
    ordered = classified.sort(["duration", "device", "start"], descending=[True, False, False])
    return tuple(
        IdleGap(
            device=row["device"],
            start_ns=row["start"],
            end_ns=row["end"],
            cause_kind=row["cause_kind"],
            cause=row["cause"],
            source=row["source"],
            pid=row["pid"],
            tid=row["tid"],
        )
        for row in ordered.iter_rows(named=True)
    )
