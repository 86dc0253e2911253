"""Interval arithmetic on polars frames: unions and overlaps, no Python loops over events."""

from __future__ import annotations

import polars as pl


def merge_intervals(frame: pl.DataFrame, by: str) -> pl.DataFrame:
    """Union of ``[ts, end)`` intervals per ``by`` value → columns ``by, start, end``.

    Sort by start within each group; an interval opens a new merged block when it starts after the
    running maximum of all earlier ends (cumulative max), so nested and chained intervals collapse.
    A block then starts at its first row's start and ends at the running maximum on its last row
    (every earlier block ended before it opened); with nulls, blocks are grouped instead.
    """
    if frame.is_empty():
        return pl.DataFrame(schema={by: frame.schema[by], "start": pl.Int64, "end": pl.Int64})
    ordered = frame.select(by, "ts", "end").sort(by, "ts")
    if any(ordered.get_column(name).null_count() for name in (by, "ts", "end")):
        running_end = pl.col("end").cum_max().shift(1).over(by)
        blocks = ordered.with_columns(
            block=(running_end.is_null() | (pl.col("ts") > running_end)).cum_sum().over(by)
        )
        return (
            blocks.group_by(by, "block")
            .agg(start=pl.col("ts").min(), end=pl.col("end").max())
            .drop("block")
            .sort(by, "start")
        )
    reach = pl.col("end").cum_max().over(by)
    opens = (pl.col(by) != pl.col(by).shift(1)).fill_null(True) | (pl.col("ts") > reach.shift(1))
    return (
        ordered.with_columns(opens=opens, reach=reach)
        .with_columns(start=pl.when("opens").then(pl.col("ts")).forward_fill())
        .filter(pl.col("opens").shift(-1).fill_null(True))
        .select(by, "start", end="reach")
    )


def gaps_between(merged: pl.DataFrame, by: str) -> pl.DataFrame:
    """The idle stretches between consecutive merged blocks → ``by, start, end, duration``."""
    return (
        merged.sort(by, "start")
        .with_columns(next_start=pl.col("start").shift(-1).over(by))
        .filter(pl.col("next_start").is_not_null() & (pl.col("next_start") > pl.col("end")))
        .select(by, start=pl.col("end"), end=pl.col("next_start"))
        .with_columns(duration=pl.col("end") - pl.col("start"))
    )


def overlap_ns(a_start: str, a_end: str, b_start: str, b_end: str) -> pl.Expr:
    """Length of the intersection of two intervals (0 when disjoint)."""
    return (pl.min_horizontal(a_end, b_end) - pl.max_horizontal(a_start, b_start)).clip(lower_bound=0)


def meeting(frame: pl.DataFrame, ts: str, end: str, windows: pl.DataFrame) -> pl.DataFrame:
    """Rows of ``frame`` whose ``[ts, end]`` meets some window ``[start, end)`` of ``windows``
    (``ts < window end`` and ``end >= window start``), in their order.

    A cheap exact prefilter for an inequality join against a few windows: the windows are merged
    into disjoint blocks, and each row is checked against the first block ending after its ``ts``
    (binary search), so the join then sees only rows that can match. A reversed window (end before
    start) is widened to its span: the rows kept are then a superset, which the join narrows.
    """
    if frame.is_empty() or windows.is_empty():
        return frame.clear()
    blocks = merge_intervals(
        windows.select(
            one=pl.lit(0), ts=pl.min_horizontal("start", "end"), end=pl.max_horizontal("start", "end")
        ),
        "one",
    )
    block_start, block_end = blocks.get_column("start"), blocks.get_column("end")
    index = block_end.search_sorted(frame.get_column(ts), side="right")
    inside = index < blocks.height
    met = inside & (block_start.gather(index.clip(upper_bound=blocks.height - 1)) <= frame.get_column(end))
    return frame.filter(met)


def within(times: pl.Series, windows: tuple[tuple[int, int], ...]) -> pl.Series:
    """For each time, whether it falls in one of ``windows`` (disjoint ``[start, end)``, sorted)."""
    if not windows:
        return pl.Series(times.name, [False] * times.len(), dtype=pl.Boolean)
    starts = pl.Series([start for start, _ in windows], dtype=pl.Int64)
    ends = pl.Series([end for _, end in windows], dtype=pl.Int64)
    index = starts.search_sorted(times, side="right").cast(pl.Int64) - 1
    ahead = index >= 0
    return (ahead & (times < ends.gather(index.clip(lower_bound=0)))).fill_null(False)
