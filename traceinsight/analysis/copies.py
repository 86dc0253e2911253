"""Host↔device copies: volume, time, bandwidth, overlap with compute, whether the host blocked."""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.intervals import joined_where, overlap_ns
from traceinsight.analysis.results import CopyGroup
from traceinsight.load import Trace, taxonomy
from traceinsight.thresholds import Thresholds

#: Copies smaller than this are left out of a copy rate: their few µs of set-up outweigh the transfer.
RATE_MIN_BYTES = 1 << 20


def copy_groups(
    trace: Trace, calls: pl.DataFrame, kernels: pl.DataFrame, thresholds: Thresholds
) -> tuple[CopyGroup, ...]:
    """Copies grouped by device and copy name.

    Overlap: each copy is intersected with ``kernels``, the union of kernel intervals on its device (any
    stream), so a copy hidden behind compute counts fully and one on an idle GPU counts zero.
    Blocked host: the copy's host call (same correlation) is synchronous, or either side is pageable
    memory, or a blocking call on the same thread starts within ``copy_sync_window_us`` of its return.
    """
    copies = trace.gpu.filter(pl.col("kind") == "memcpy").with_row_index("copy")
    if copies.is_empty():
        return ()
    kernel_blocks = kernels.lazy().select(k_device="device", k_start="start", k_end="end")
    overlapped = (
        joined_where(
            copies.lazy().select("copy", "device", "ts", "end"),
            kernel_blocks,
            pl.col("k_start") < pl.col("end"),
            pl.col("k_end") > pl.col("ts"),
        )
        .filter(pl.col("device") == pl.col("k_device"))
        .group_by("copy")
        .agg(overlapped=overlap_ns("ts", "end", "k_start", "k_end").sum())
    )
    window = round(thresholds.copy_sync_window_us * 1000)
    host_calls = (
        copies.lazy()
        .select("copy", "correlation")
        .join(
            trace.runtime.lazy().select("correlation", "pid", "tid", call="name", call_end="end"),
            on="correlation",
            how="inner",
        )
        .drop_nulls(["pid", "tid"])
        .sort("call_end")
        .collect(engine="in-memory")
    )
    sync_starts = (
        calls.lazy()
        .filter(pl.col("kind") == "sync")
        .select("pid", "tid", sync_ts="ts")
        .drop_nulls(["pid", "tid"])
        .sort("sync_ts")
        .collect(engine="in-memory")
    )
    if host_calls.height and sync_starts.height:
        followed = (
            host_calls.lazy()
            .join_asof(
                sync_starts.lazy(),
                left_on="call_end",
                right_on="sync_ts",
                by=["pid", "tid"],
                strategy="forward",
                tolerance=window,
                check_sortedness=False,  # sorted by call_end above; polars cannot check with `by`
            )
            .select("copy", "call", followed=pl.col("sync_ts").is_not_null())
        )
    else:
        followed = host_calls.lazy().select("copy", "call", followed=pl.lit(False))
    names = copies.get_column("name").unique().to_list()
    kinds = {name: taxonomy.parse_copy_name(name) for name in names}
    parts = pl.DataFrame(
        {
            "name": names,
            "direction": [kinds[n].direction for n in names],
            "src": [kinds[n].src for n in names],
            "dst": [kinds[n].dst for n in names],
        },
        schema={"name": pl.String, "direction": pl.String, "src": pl.String, "dst": pl.String},
    )
    table = (
        copies.lazy()
        .join(overlapped, on="copy", how="left")
        .join(followed, on="copy", how="left")
        .join(parts.lazy(), on="name", how="left")
        .with_columns(
            overlapped=pl.col("overlapped").fill_null(0),
            blocked=(
                pl.col("call").is_in(list(taxonomy.SYNCHRONOUS_COPY_CALLS)).fill_null(False)
                | (pl.col("src") == "Pageable").fill_null(False)
                | (pl.col("dst") == "Pageable").fill_null(False)
                | pl.col("followed").fill_null(False)
            ),
        )
        .group_by("device", pl.col("name").alias("kind"), "direction", "src", "dst")
        .agg(
            count=pl.len(),
            bytes=pl.col("bytes").sum().fill_null(0),
            duration_ns=pl.col("dur").sum(),
            overlapped_ns=pl.col("overlapped").sum(),
            host_blocked=pl.col("blocked").sum(),
        )
        .sort(["duration_ns", "device", "kind"], descending=[True, False, False])
        .collect(engine="in-memory")
    )
    # The table's columns are the group's fields, but for its bandwidth.
    return tuple(
        CopyGroup(
            **row,
            bandwidth_gbps=round(row["bytes"] / row["duration_ns"], 3) if row["duration_ns"] else None,
        )
        for row in table.iter_rows(named=True)
    )


def overlap_ratios(groups: tuple[CopyGroup, ...]) -> dict[str, float | None]:
    """Overlapped time / copy time for HtoD and DtoH (None when there are no such copies)."""
    ratios: dict[str, float | None] = {}
    for direction in ("HtoD", "DtoH"):
        chosen = [group for group in groups if group.direction == direction]
        total = sum(group.duration_ns for group in chosen)
        overlapped = sum(group.overlapped_ns for group in chosen)
        ratios[direction] = overlapped / total if chosen and total else (None if not chosen else 0.0)
    return ratios


def pinned_h2d_rate(trace: Trace) -> float | None:
    """What the trace's own pinned host-to-device copies of at least ``RATE_MIN_BYTES`` moved per ns
    on the GPU (bytes / ns = GB/s), all of them together; None without such copies."""
    copies = trace.gpu.filter(
        (pl.col("kind") == "memcpy")
        & pl.col("name").str.starts_with("Memcpy HtoD")
        & (pl.col("bytes") >= RATE_MIN_BYTES)
        & (pl.col("dur") > 0)
    )
    names = [
        name
        for name in copies.get_column("name").unique().to_list()
        if taxonomy.parse_copy_name(name).src == "Pinned"
    ]
    pinned = copies.filter(pl.col("name").is_in(names))
    if pinned.is_empty():
        return None
    return float(pinned.get_column("bytes").sum()) / float(pinned.get_column("dur").sum())
