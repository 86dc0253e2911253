"""Host-blocking calls: where they come from and what GPU idle follows them."""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceinsight.analysis.intervals import overlap_ns, within
from traceinsight.analysis.results import SyncCall, SyncHotspot
from traceinsight.analysis.sources import enclosing_ops, module_at, source_at
from traceinsight.analysis.steady import SteadyState
from traceinsight.load import Trace, taxonomy


def launch_devices(trace: Trace) -> pl.DataFrame:
    """Which devices each host process launched work on → ``pid, device``."""
    return (
        trace.gpu.select("correlation", "device")
        .join(trace.runtime.select("correlation", "pid"), on="correlation", how="inner")
        .select("pid", "device")
        .unique()
    )


def _copy_before(trace: Trace, calls: pl.DataFrame, window_ns: int) -> pl.DataFrame:
    """The copy each blocking call waits for → ``key, copy`` (the copy's name).

    A synchronous copy call is its own copy (same correlation); otherwise the copy whose host call
    on the same thread returned at most ``window_ns`` before the blocking call began (the
    ``cudaMemcpyAsync`` + ``cudaStreamSynchronize`` pair of ``.item()``, ``.cpu()`` or ``.to()``).
    """
    copies = trace.gpu.filter(pl.col("kind") == "memcpy").select("correlation", copy="name")
    launches = (
        trace.runtime.filter(pl.col("name").str.starts_with(taxonomy.COPY_CALL_PREFIXES[0]))
        .select("pid", "tid", "correlation", c_end="end")
        .vstack(
            trace.runtime.filter(
                pl.any_horizontal(pl.col("name").str.starts_with(p) for p in taxonomy.COPY_CALL_PREFIXES[1:])
            ).select("pid", "tid", "correlation", c_end="end")
        )
        .join(copies, on="correlation", how="inner")
        .drop_nulls(["pid", "tid"])
        .sort("c_end")
    )
    own = (
        calls.select("key", "correlation")
        .join(copies, on="correlation", how="inner")
        .select("key", own="copy")
    )
    if launches.is_empty():
        return own.rename({"own": "copy"})
    before = (
        calls.select("key", "pid", "tid", "ts")
        .drop_nulls(["pid", "tid"])
        .sort("ts")
        .join_asof(
            launches.select("pid", "tid", "c_end", "copy"),
            left_on="ts",
            right_on="c_end",
            by=["pid", "tid"],
            strategy="backward",
            tolerance=window_ns,
            check_sortedness=False,  # both sorted above; polars cannot check with `by`
        )
        .select("key", "copy")
    )
    return (
        before.join(own, on="key", how="full", coalesce=True)
        .select("key", copy=pl.coalesce("own", "copy"))
        .drop_nulls("copy")
    )


def blocking_calls(
    trace: Trace, copy_window_ns: int = 50_000, user_code: Collection[str] = ()
) -> pl.DataFrame:
    """Every host-blocking runtime call with its operators, source line and the copy it waits for.

    Columns: ``key, call, pid, tid, ts, end, dur, op, op_chain, innermost``, the columns of
    :data:`~traceinsight.analysis.sources.SOURCE_COLUMNS` (``source, source_kind, ...``),
    ``module, copy``. The op
    chain is found by time containment on the call's thread (this works in every trace era); when no
    operator encloses the call, the call's ``External id`` is matched to an operator's, unless it
    merely repeats the call's own correlation (as 2022-23 traces write it).
    """
    calls = (
        trace.runtime.filter(pl.col("name").is_in(list(taxonomy.BLOCKING_CALLS)))
        .sort("ts")
        .with_row_index("key")
        .with_columns(pl.col("key").cast(pl.Int64))
    )
    points = calls.select("key", "pid", "tid", t="ts")
    ops = enclosing_ops(trace, points)
    sources = source_at(trace, points, user_code)
    wanted = calls.filter(pl.col("external_id") != pl.col("correlation")).select("key", "external_id")
    by_external = wanted.join(
        trace.cpu_ops.select("external_id", ext_op="name")
        .join(wanted.select("external_id"), on="external_id", how="semi")
        .unique("external_id", keep="first", maintain_order=True),
        on="external_id",
        how="inner",
    ).select("key", "ext_op")
    return (
        calls.select("key", call="name", pid="pid", tid="tid", ts="ts", end="end", dur="dur")
        .join(ops, on="key", how="left")
        .join(by_external, on="key", how="left")
        .with_columns(
            op=pl.coalesce("op", "ext_op"),
            innermost=pl.coalesce("innermost", "ext_op"),
            op_chain=pl.coalesce("op_chain", "ext_op"),
        )
        .drop("ext_op")
        .join(sources, on="key", how="left")
        .join(module_at(trace, points), on="key", how="left")
        .join(_copy_before(trace, calls, copy_window_ns), on="key", how="left")
        .sort("key")
    )


def idle_after_calls(
    calls: pl.DataFrame, all_gaps: pl.DataFrame, devices: pl.DataFrame, slack_ns: int
) -> pl.DataFrame:
    """GPU idle from each call's return until the next activity on a device its process uses.

    A gap counts when it contains the return (or began at most ``slack_ns`` after it): idle after =
    gap end − max(gap start, call end). → ``key, idle_after``.
    """
    if calls.is_empty() or all_gaps.is_empty():
        return pl.DataFrame(schema={"key": pl.Int64, "idle_after": pl.Int64})
    candidates = calls.select("key", "pid", c_end="end").join(devices, on="pid", how="inner")
    return (
        candidates.join_where(
            all_gaps.select(g_device="device", g_start="start", g_end="end"),
            pl.col("g_start") <= pl.col("c_end") + slack_ns,
            pl.col("g_end") > pl.col("c_end"),
        )
        .filter(pl.col("device") == pl.col("g_device"))
        .with_columns(idle_after=pl.col("g_end") - pl.max_horizontal("g_start", "c_end"))
        .group_by("key")
        .agg(pl.col("idle_after").max())
    )


def sync_calls(calls: pl.DataFrame) -> tuple[SyncCall, ...]:
    """Count and blocked time per blocking call name, most blocked first."""
    table = (
        calls.group_by("call")
        .agg(count=pl.len(), blocked=pl.col("dur").sum())
        .sort(["blocked", "call"], descending=[True, False])
    )
    return tuple(
        SyncCall(call=row["call"], count=row["count"], blocked_ns=row["blocked"])
        for row in table.iter_rows(named=True)
    )


def sync_hotspots(
    calls: pl.DataFrame,
    idle_after: pl.DataFrame,
    iterations: int | None,
    gaps: pl.DataFrame | None = None,
    steady: SteadyState | None = None,
) -> tuple[SyncHotspot, ...]:
    """Blocking calls grouped by (call, op, source, copy waited for, framework code that syncs by
    design), ranked by blocked + idle-after time.

    With ``gaps`` (classified, :func:`~traceinsight.analysis.idle_gaps.classify_gaps`) and ``steady``,
    each hot spot also gets the idle its calls caused inside the steady state and its call count there.
    """
    if calls.is_empty():
        return ()
    windows = steady.windows if steady is not None else ()
    in_steady = within(calls.get_column("ts"), windows)
    caused = pl.DataFrame(schema={"key": pl.Int64, "caused": pl.Int64})
    if gaps is not None and gaps.height and windows:
        window_frame = pl.DataFrame(
            {"w_start": [start for start, _ in windows], "w_end": [end for _, end in windows]},
            schema={"w_start": pl.Int64, "w_end": pl.Int64},
        )
        caused = (
            gaps.filter(pl.col("sync_key").is_not_null())
            .join_where(window_frame, pl.col("w_start") < pl.col("end"), pl.col("w_end") > pl.col("start"))
            .group_by(key="sync_key")
            .agg(caused=overlap_ns("start", "end", "w_start", "w_end").sum())
        )
    table = (
        calls.with_columns(steady=in_steady)
        .join(idle_after, on="key", how="left")
        .join(caused, on="key", how="left")
        .with_columns(pl.col("idle_after").fill_null(0), pl.col("caused").fill_null(0))
        .group_by("call", "op", "source", "copy", "framework_call", maintain_order=True)
        .agg(
            op_chain=pl.col("op_chain").mode().sort().first(),
            source_kind=pl.col("source_kind").first(),
            source_line_kind=pl.col("source_line_kind").first(),
            source_function=pl.col("source_function").first(),
            module=pl.col("module").drop_nulls().mode().sort().first(),
            count=pl.len(),
            blocked=pl.col("dur").sum(),
            idle_after=pl.col("idle_after").sum(),
            keys=pl.col("key"),
            steady_count=pl.col("steady").sum(),
            steady_blocked=pl.col("dur").filter(pl.col("steady")).sum(),
            caused=pl.col("caused").sum(),
        )
        .with_columns(rank=pl.col("blocked") + pl.col("idle_after"))
        .sort(["rank", "count", "call"], descending=[True, True, False], nulls_last=True)
    )
    return tuple(
        SyncHotspot(
            call=row["call"],
            op=row["op"],
            op_chain=row["op_chain"],
            source=row["source"],
            copy=row["copy"],
            count=row["count"],
            per_step=row["count"] / iterations if iterations else None,
            blocked_ns=row["blocked"],
            idle_after_ns=row["idle_after"],
            source_kind=row["source_kind"],
            keys=tuple(row["keys"]),
            steady_count=row["steady_count"],
            idle_caused_ns=row["caused"],
            module=row["module"],
            steady_blocked_ns=row["steady_blocked"],
            source_line_kind=row["source_line_kind"],
            source_function=row["source_function"],
            framework_call=row["framework_call"],
        )
        for row in table.iter_rows(named=True)
    )
