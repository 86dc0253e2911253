"""Host-blocking calls: where they come from and what GPU idle follows them."""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceinsight.analysis.intervals import overlap_ns, within
from traceinsight.analysis.results import SyncCall, SyncHotspot, share_of
from traceinsight.analysis.sources import FrameIndex, enclosing_ops, module_at, source_at
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace, taxonomy


def launch_devices(trace: Trace) -> pl.DataFrame:
    """Which devices each host process launched work on → ``pid, device``."""
    return (
        trace.gpu.select("correlation", "device")
        .join(trace.runtime.select("correlation", "pid"), on="correlation", how="inner")
        .select("pid", "device")
        .unique()
    )


def _copy_calls(trace: Trace) -> pl.DataFrame:
    """Host calls that start a copy → ``pid, tid, correlation, c_end, copy`` (the copy's name)."""
    copies = trace.gpu.lazy().filter(pl.col("kind") == "memcpy").select("correlation", copy="name")
    runtime = trace.runtime.lazy()
    return (
        pl.concat(
            [
                runtime.filter(pl.col("name").str.starts_with(taxonomy.COPY_CALL_PREFIXES[0])),
                runtime.filter(
                    pl.any_horizontal(
                        pl.col("name").str.starts_with(p) for p in taxonomy.COPY_CALL_PREFIXES[1:]
                    )
                ),
            ]
        )
        .select("pid", "tid", "correlation", c_end="end")
        .join(copies, on="correlation", how="inner")
        .drop_nulls(["pid", "tid"])
        .sort("c_end")
        .collect(engine="in-memory")
    )


def _copy_before(calls: pl.DataFrame, launches: pl.DataFrame, window_ns: int) -> pl.DataFrame:
    """The copy each blocking call waits for → ``key, copy, copy_correlation``.

    A copy call (synchronous, or one into pageable memory) waits for its own copy (same
    correlation); any other call for the copy whose host call on the same thread returned at most
    ``window_ns`` before it began (the ``cudaMemcpyAsync`` + ``cudaStreamSynchronize`` pair of
    ``.item()``, ``.cpu()`` or ``.to()``).
    """
    schema = pl.Schema({"key": pl.Int64, "copy": pl.String, "copy_correlation": pl.Int64})
    own = (
        calls.lazy()
        .select("key", "correlation")
        .join(
            launches.lazy().select("correlation", "copy").unique("correlation"), on="correlation", how="inner"
        )
        .select("key", own="copy", own_correlation="correlation")
    )
    if launches.is_empty():
        return (
            own.select("key", copy="own", copy_correlation="own_correlation")
            .cast(schema)
            .collect(engine="in-memory")
        )
    before = (
        calls.lazy()
        .select("key", "pid", "tid", "ts")
        .drop_nulls(["pid", "tid"])
        .sort("ts")
        .join_asof(
            launches.lazy().select("pid", "tid", "c_end", "copy", copy_correlation="correlation"),
            left_on="ts",
            right_on="c_end",
            by=["pid", "tid"],
            strategy="backward",
            tolerance=window_ns,
            check_sortedness=False,  # both sorted above; polars cannot check with `by`
        )
        .select("key", "copy", "copy_correlation")
    )
    return (
        before.join(own, on="key", how="full", coalesce=True)
        .select(
            "key",
            copy=pl.coalesce("own", "copy"),
            copy_correlation=pl.when(pl.col("own").is_not_null())
            .then(pl.col("own_correlation"))
            .otherwise(pl.col("copy_correlation")),
        )
        .drop_nulls("copy")
        .cast(schema)
        .collect(engine="in-memory")
    )


def blocking_calls(
    trace: Trace,
    copy_window_ns: int = 50_000,
    user_code: Collection[str] = (),
    *,
    frame_index: FrameIndex | None = None,
) -> pl.DataFrame:
    """Every host-blocking runtime call with its operators, source line and the copy it waits for.

    Blocking calls are the synchronizing and synchronous-copy calls of
    :data:`~traceinsight.load.taxonomy.BLOCKING_CALLS`, and copy calls that wait for their own copy
    inside the call (a device-to-host copy into pageable memory,
    :func:`~traceinsight.load.taxonomy.waits_inside_copy_call`): ``kind`` is ``sync`` or ``copy``.

    Columns: ``key, call, kind, pid, tid, ts, end, dur, correlation, op, op_chain, innermost,
    the columns of :data:`~traceinsight.analysis.sources.SOURCE_COLUMNS` (``source,
    source_kind, ...``), ``module, copy, wait``. ``wait`` is the key of the host wait the call is part
    of: a copy call and the ``cudaStreamSynchronize`` right after it (``copy_window_ns``) are one
    wait, keyed by the copy call; any other call is a wait of its own. The op chain is found by
    time containment on the call's thread (this works in every trace era); when no operator
    encloses the call, the call's ``External id`` is matched to an operator's, unless it merely
    repeats the call's own correlation (as 2022-23 traces write it). ``frame_index``: the trace's
    :class:`~traceinsight.analysis.sources.FrameIndex` when the caller keeps one.
    """
    launches = _copy_calls(trace)
    waiting_names = [
        name for name in launches.get_column("copy").unique() if taxonomy.waits_inside_copy_call(name)
    ]
    waiting_copies = launches.filter(pl.col("copy").is_in(waiting_names)).select("correlation")
    runtime = trace.runtime.lazy()
    calls = (
        pl.concat(
            [
                runtime.filter(pl.col("name").is_in(list(taxonomy.BLOCKING_CALLS))).with_columns(
                    kind=pl.lit("sync")
                ),
                runtime.filter(~pl.col("name").is_in(list(taxonomy.BLOCKING_CALLS)))
                .join(waiting_copies.lazy(), on="correlation", how="semi")
                .with_columns(kind=pl.lit("copy")),
            ]
        )
        .sort("ts", "correlation")
        .with_row_index("key")
        .with_columns(pl.col("key").cast(pl.Int64))
        .collect(engine="in-memory")
    )
    points = calls.select("key", "pid", "tid", t="ts")
    ops = enclosing_ops(trace, points)
    sources = source_at(trace, points, user_code, frame_index=frame_index)
    wanted = calls.lazy().filter(pl.col("external_id") != pl.col("correlation")).select("key", "external_id")
    by_external = wanted.join(
        trace.cpu_ops.lazy()
        .select("external_id", ext_op="name")
        .join(wanted.select("external_id"), on="external_id", how="semi")
        .unique("external_id", keep="first", maintain_order=True),
        on="external_id",
        how="inner",
    ).select("key", "ext_op")
    copies = _copy_before(calls, launches, copy_window_ns)
    # a sync right after a copy call that itself waited: the pair is one wait, the copy call's
    copy_waits = (
        calls.lazy()
        .filter(pl.col("kind") == "copy")
        .select("pid", copy_correlation="correlation", copy_key="key")
    )
    return (
        calls.lazy()
        .select(
            "key", "kind", "correlation", call="name", pid="pid", tid="tid", ts="ts", end="end", dur="dur"
        )
        .join(ops.lazy(), on="key", how="left")
        .join(by_external, on="key", how="left")
        .with_columns(
            op=pl.coalesce("op", "ext_op"),
            innermost=pl.coalesce("innermost", "ext_op"),
            op_chain=pl.coalesce("op_chain", "ext_op"),
        )
        .drop("ext_op")
        .join(sources.lazy(), on="key", how="left")
        .join(module_at(trace, points).lazy(), on="key", how="left")
        .join(copies.lazy(), on="key", how="left")
        .join(copy_waits, on=["pid", "copy_correlation"], how="left", nulls_equal=False)
        .with_columns(
            wait=pl.when(pl.col("kind") == "sync")
            .then(pl.coalesce("copy_key", "key"))
            .otherwise(pl.col("key"))
        )
        .drop("copy_correlation", "copy_key")
        .sort("key")
        .collect(engine="in-memory")
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
    """Count and blocked time per blocking call name, most blocked first (a copy call and the sync
    after it count once each, under their own names)."""
    table = (
        calls.group_by("call")
        .agg(count=pl.len(), blocked=pl.col("dur").sum())
        .sort(["blocked", "call"], descending=[True, False])
    )
    return tuple(
        SyncCall(call=row["call"], count=row["count"], blocked_ns=row["blocked"])
        for row in table.iter_rows(named=True)
    )


def steady_step_syncs(calls: pl.DataFrame, steady: SteadySteps) -> tuple[int, ...]:
    """Each steady step's host syncs, in the steps' order: the waits (as
    :func:`sync_hotspots` counts them, a copy call and the sync right after it one wait) whose
    first call starts inside the step's host range and the steady state's windows. Their sum is
    the hot spots' ``steady_count`` summed (a wait inside the steady state is inside one of its
    steps' host ranges). Empty without steady steps."""
    steps = steady.steady_steps
    if not steps:
        return ()
    if calls.is_empty():
        return (0,) * len(steps)
    firsts = (
        calls.sort("key").group_by("wait", maintain_order=True).agg(pl.col("ts").first()).get_column("ts")
    )
    firsts = firsts.filter(within(firsts, steady.windows)).cast(pl.Int64).sort()
    # Disjoint host ranges [start, end): each wait counted in the one that holds it.
    low = firsts.search_sorted(pl.Series([step.start_ns for step in steps], dtype=pl.Int64), side="left")
    high = firsts.search_sorted(pl.Series([step.end_ns for step in steps], dtype=pl.Int64), side="left")
    return tuple(int(count) for count in (high.cast(pl.Int64) - low.cast(pl.Int64)).to_list())


def sync_hotspots(
    calls: pl.DataFrame,
    idle_after: pl.DataFrame,
    iterations: int | None,
    gaps: pl.DataFrame | None = None,
    steady: SteadySteps | None = None,
) -> tuple[SyncHotspot, ...]:
    """Host waits grouped by (call, call after it, op, source, copy waited for, framework code that
    syncs by design), ranked by blocked + idle-after time.

    A wait is one blocking call, or a copy call and the sync right after it (``wait`` of
    :func:`blocking_calls`): its blocked time is both calls' durations, its idle after that of its
    last call. With ``gaps`` (classified, :func:`~traceinsight.analysis.idle_gaps.classify_gaps`)
    and ``steady``, each hot spot also gets the idle its calls caused inside the steady state and
    its wait count there.
    """
    if calls.is_empty():
        return ()
    # The calls are host events (host windows); the idle they caused is GPU time (device windows).
    windows = steady.windows if steady is not None else ()
    device_windows = steady.device_windows if steady is not None else ()
    in_steady = within(calls.get_column("ts"), windows)
    caused = pl.DataFrame(schema={"key": pl.Int64, "caused": pl.Int64})
    if gaps is not None and gaps.height and device_windows:
        window_frame = pl.DataFrame(
            {
                "w_start": [start for start, _ in device_windows],
                "w_end": [end for _, end in device_windows],
            },
            schema={"w_start": pl.Int64, "w_end": pl.Int64},
        )
        caused = (
            gaps.filter(pl.col("sync_key").is_not_null())
            .join_where(window_frame, pl.col("w_start") < pl.col("end"), pl.col("w_end") > pl.col("start"))
            .group_by(key="sync_key")
            .agg(caused=overlap_ns("start", "end", "w_start", "w_end").sum())
        )
    step = (
        steady.steady_step_of(calls.get_column("ts"))
        if steady is not None
        else pl.Series("ts", [None] * calls.height, dtype=pl.Int64)
    )
    waits = (
        calls.with_columns(steady=in_steady, step=step)
        .join(idle_after, on="key", how="left")
        .join(caused, on="key", how="left")
        .with_columns(pl.col("idle_after").fill_null(0), pl.col("caused").fill_null(0))
        .sort("key")
        .group_by("wait", maintain_order=True)
        .agg(
            call=pl.col("call").first(),
            then_call=pl.col("call").get(1, null_on_oob=True),
            op=pl.col("op").first(),
            op_chain=pl.col("op_chain").first(),
            source=pl.col("source").first(),
            source_kind=pl.col("source_kind").first(),
            source_line_kind=pl.col("source_line_kind").first(),
            source_function=pl.col("source_function").first(),
            framework_call=pl.col("framework_call").first(),
            module=pl.col("module").first(),
            copy=pl.col("copy").first(),
            dur=pl.col("dur").sum(),
            idle_after=pl.col("idle_after").get(pl.col("end").arg_max()),
            caused=pl.col("caused").sum(),
            keys=pl.col("key"),
            steady=pl.col("steady").first(),
            step=pl.col("step").first(),
        )
    )
    table = (
        waits.group_by("call", "then_call", "op", "source", "copy", "framework_call", maintain_order=True)
        .agg(
            op_chain=pl.col("op_chain").mode().sort().first(),
            source_kind=pl.col("source_kind").first(),
            source_line_kind=pl.col("source_line_kind").first(),
            source_function=pl.col("source_function").first(),
            module=pl.col("module").drop_nulls().mode().sort().first(),
            count=pl.len(),
            blocked_ns=pl.col("dur").sum(),
            idle_after_ns=pl.col("idle_after").sum(),
            keys=pl.col("keys").list.explode(keep_nulls=False, empty_as_null=False),
            steady_count=pl.col("steady").sum(),
            steady_steps_with=pl.col("step").drop_nulls().n_unique(),
            steady_blocked_ns=pl.col("dur").filter(pl.col("steady")).sum(),
            idle_caused_ns=pl.col("caused").sum(),
        )
        .sort(
            pl.col("blocked_ns") + pl.col("idle_after_ns"),
            "count",
            "call",
            descending=[True, True, False],
            nulls_last=True,
        )
    )
    has_steps = steady is not None and bool(steady.steady_steps)  # else: nothing to count in
    # The table's columns are the hot spot's fields, but for the three made here.
    return tuple(
        SyncHotspot(
            **row
            | {
                "per_step": share_of(row["count"] / iterations) if iterations else None,
                "keys": tuple(sorted(row["keys"])),
                "steady_steps_with": row["steady_steps_with"] if has_steps else None,
            }
        )
        for row in table.iter_rows(named=True)
    )
