"""Idle gaps on each GPU and why the GPU waited in each.

A gap is a stretch between merged busy blocks on one device. Every gap gets exactly one cause
(:class:`~traceinsight.analysis.causes.CauseKind`), so the causes add up to the idle time.

First: was the work that ends the gap already queued when the GPU went idle? Its launching call
(joined on correlation) tells. If that call returned before the gap began, the GPU had the work and
waited on something of its own (another stream, an event, a CUDA graph dependency): ``queued``.
Work whose launching call the trace does not hold, numbered (correlation id) below every call it
does hold, was launched before the host record began (the profiler starts mid-run with work still
queued from the step before): a gap that starts after that waited with its work queued too, since
the thread's later calls (a copy the host sat in, say) cannot have launched it.
A process that launches kernels on several GPUs (naive model parallelism: the model's layers split
across devices; its forward launched by the main thread, its backward by autograd's thread per
device) adds one more question for a gap of at least ``min_gap_us``: did another of its GPUs work
through ``cause_coverage`` of the gap while this one waited for it? It did when the work ending
the gap was queued, or when for ``cause_coverage`` of the gap a thread of the process was blocked
in a sync (before that work was launched) or the work was launched and waiting: ``other-gpu``, a
pipeline bubble (the host is not late; the stages run one after the other).
Otherwise the host was late, and what the launching thread did during the gap is the cause, in
this order (gaps of at least ``min_gap_us``):

0. ``graph-capture`` — the thread was capturing a CUDA/HIP graph (between ``cudaStreamBeginCapture``
   and ``cudaStreamEndCapture``, :mod:`.capture`) for ``cause_coverage`` of the gap: what it
   launched went into the graph, so the GPU had nothing to run, by design;
1. ``dataloader`` — the thread spent at least ``cause_coverage`` of the gap in DataLoader ``__next__``;
2. ``sync`` — a blocking call on the thread returned within ``sync_drain_slack_us`` of the gap's
   start after waiting at least ``cause_coverage`` of the gap's length: the host waited for the GPU
   to drain its queue, so no work was queued ahead (a sync that barely waited did not cause the
   gap: the host work after it did). A copy call that waits inside itself (``cudaMemcpyAsync`` of a
   device-to-host copy into pageable memory: ``.item()``, ``.cpu()``) is such a call. When the
   call waited for a host-to-device copy (pageable ``.to('cuda')``), the cause is ``copy`` instead;
3. ``copy`` — the thread was inside a copy call (``cudaMemcpy*``) for ``cause_coverage`` of the gap;
4. ``communication`` — the innermost covering operator is a collective (``c10d::``, ``record_param_comms``);
   ``allocator`` — the thread's allocator calls (``cudaMalloc``, ``cudaFree``, ``hipMalloc``,
   ``hipFree``) together cover ``cause_coverage`` of the gap, whatever operator they are in;
   ``host-bound`` — the thread sat in one kernel launch call (``cudaLaunchKernel``, ``hipLaunchKernel``
   ...) for ``cause_coverage`` of the gap: a slow launch (a kernel's first launch loads its GPU code,
   milliseconds where a launch takes microseconds), not the work of the operator around it;
5. ``cpu_op`` — the innermost operator or annotation covering ``cause_coverage`` of the gap: the host
   was doing its own work in it (CPU compute, data preparation, a first call's initialisation). When
   that operator itself launched the work that ends a gap shorter than ``dispatch_max_us``, the gap
   is the operator's dispatch cost: ``host-bound``;
6. ``host-bound`` — none of these, but the thread made calls or ran ops during the gap (launching,
   Python between launches); ``untraced`` — it recorded nothing at all, or, in a gap of at least
   ``dispatch_max_us``, its events cover less than ``1 - cause_coverage`` of it: silence is not launch
   overhead (the innermost Python frame open across the gap is named, where there is one).

Gaps shorter than ``min_gap_us`` are split only by the first question: ``host-bound`` when the host
was late (launch overhead between kernels), ``queued`` otherwise. ``unknown``: no launching thread.
"""

from __future__ import annotations

import itertools
from collections.abc import Collection
from typing import Final

import numpy as np
import polars as pl

from traceinsight.analysis.capture import capture_windows
from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.intervals import (
    gaps_between,
    meeting,
    merge_intervals,
    outermost_first,
    overlap_ns,
)
from traceinsight.analysis.results import IdleGap, from_columns
from traceinsight.analysis.sources import FrameIndex, source_at
from traceinsight.arrays import series
from traceinsight.load import Trace, taxonomy
from traceinsight.model import fields_of
from traceinsight.thresholds import Thresholds

__all__ = ["all_gaps", "classify_gaps", "mark_waiting", "name_graph_breaks", "reported_gaps", "split_at"]

#: Columns of :func:`classify_gaps`' table.
GAP_SCHEMA = pl.Schema(
    {
        "device": pl.Int64,
        "start": pl.Int64,
        "end": pl.Int64,
        "duration": pl.Int64,
        "cause_kind": pl.String,
        "cause": pl.String,
        "source": pl.String,
        "source_kind": pl.String,
        "pid": pl.Int64,
        "tid": pl.Int64,
        "sync_key": pl.Int64,
        "other_device": pl.Int64,
        "source_line_kind": pl.String,
        "source_function": pl.String,
    }
)


def all_gaps(busy: pl.DataFrame) -> pl.DataFrame:
    """Every idle stretch between busy blocks → ``device, start, end, duration``."""
    return gaps_between(busy, by="device")


def split_at(gaps: pl.DataFrame, cuts: list[int]) -> pl.DataFrame:
    """``gaps`` (``device, start, end, duration``) cut at each of ``cuts`` strictly inside them: a
    request server's gaps at each request's start and the previous one's done, so that waiting for
    the next request and the host's work in a request are classified apart."""
    if gaps.is_empty() or not cuts:
        return gaps
    points = np.unique(np.asarray(cuts, dtype=np.int64))
    starts, ends = gaps.get_column("start").to_numpy(), gaps.get_column("end").to_numpy()
    first = np.searchsorted(points, starts, side="right")
    last = np.searchsorted(points, ends, side="left")
    whole = gaps.filter(series(last <= first, dtype=pl.Boolean))
    pieces: list[tuple[int, int, int]] = []
    for row in np.flatnonzero(last > first).tolist():
        device = int(gaps.item(row, "device"))
        edges = [int(starts[row]), *points[first[row] : last[row]].tolist(), int(ends[row])]
        pieces += [(device, a, b) for a, b in itertools.pairwise(edges)]
    cut = pl.DataFrame(pieces, schema={"device": pl.Int64, "start": pl.Int64, "end": pl.Int64}, orient="row")
    return (
        pl.concat([whole, cut.with_columns(duration=pl.col("end") - pl.col("start"))], how="diagonal_relaxed")
        .select(gaps.columns)
        .cast(gaps.schema)
        .sort("device", "start")
    )


#: The cause of a gap between two requests.
WAITING_TEXT: Final = "waiting for the next request: the server had nothing to do"


def mark_waiting(classified: pl.DataFrame, between: list[tuple[int, int]]) -> pl.DataFrame:
    """Gaps lying inside one of ``between`` (one request's done to the next one's start) are the
    server waiting for work: ``waiting-for-work``, whatever the host did meanwhile."""
    if classified.is_empty() or not between:
        return classified
    starts = np.asarray([a for a, _ in between], dtype=np.int64)
    ends = np.asarray([b for _, b in between], dtype=np.int64)
    order = np.argsort(starts)
    starts, ends = starts[order], ends[order]
    at = np.searchsorted(starts, classified.get_column("start").to_numpy(), side="right") - 1
    inside = (at >= 0) & (classified.get_column("end").to_numpy() <= ends[np.maximum(at, 0)])
    waiting = series(inside, dtype=pl.Boolean)
    return classified.with_columns(
        cause_kind=pl.when(waiting).then(pl.lit(CauseKind.WAITING.value)).otherwise(pl.col("cause_kind")),
        cause=pl.when(waiting).then(pl.lit(WAITING_TEXT)).otherwise(pl.col("cause")),
        sync_key=pl.when(waiting).then(None).otherwise(pl.col("sync_key")),
        **{
            name: pl.when(waiting).then(None).otherwise(pl.col(name))
            for name in ("source", "source_kind", "source_line_kind", "source_function")
        },
    )


#: A compiled region of torch.compile (one graph; a graph break starts the next).
_COMPILED_REGION = "Torch-Compiled Region"
#: How near a gap's edges a compiled region must end and the next begin to be the break it is.
_BREAK_SLACK_NS = 50_000


def name_graph_breaks(trace: Trace, classified: pl.DataFrame, limits: Thresholds) -> pl.DataFrame:
    """Host-side gaps (of at least ``min_gap_us``) between one torch.compile region's end and the
    next one's start on the launching thread: a graph break, the host running eager code between
    compiled graphs. Their cause says so, naming both regions; the cause kind stays."""
    regions = trace.annotations.filter(pl.col("name").str.starts_with(_COMPILED_REGION)).select(
        "pid", "tid", "ts", "end", "name"
    )
    host_side = [CauseKind.HOST_OP.value, CauseKind.LAUNCH.value, CauseKind.UNTRACED.value]
    if regions.height < 2 or classified.is_empty():
        return classified
    gaps = (
        classified.with_row_index("row")
        .filter(
            pl.col("cause_kind").is_in(host_side)
            & (pl.col("duration") >= round(limits.min_gap_us * 1000))
            & pl.col("pid").is_not_null()
        )
        .select("row", "pid", "tid", "start", "end")
    )
    if gaps.is_empty():
        return classified
    before = gaps.sort("end").join_asof(
        regions.select("pid", "tid", r_end="end", before="name").sort("r_end"),
        left_on="end",
        right_on="r_end",
        by=["pid", "tid"],
        strategy="backward",
        check_sortedness=False,
    )
    both = (
        before.filter(pl.col("r_end") >= pl.col("start") - _BREAK_SLACK_NS)
        .sort("start")
        .join_asof(
            regions.select("pid", "tid", r_ts="ts", after="name").sort("r_ts"),
            left_on="start",
            right_on="r_ts",
            by=["pid", "tid"],
            strategy="forward",
            check_sortedness=False,
        )
        .filter((pl.col("r_ts") <= pl.col("end") + _BREAK_SLACK_NS) & (pl.col("r_ts") >= pl.col("r_end")))
        # ``Torch-Compiled Region: 1/0``: frame 1, the code resumed after a break in frame 0; back
        # to a lower frame is the next call of the compiled function (a new step), not a break
        .filter(_frame_of("after") > _frame_of("before"))
        .select("row", "before", "after")
    )
    if both.is_empty():
        return classified
    return (
        classified.with_row_index("row")
        .join(both, on="row", how="left", maintain_order="left")
        .with_columns(
            cause=pl.when(pl.col("after").is_not_null())
            .then(
                pl.format(
                    "a graph break between compiled regions ({} → {}): the host ran eager code, {}",
                    "before",
                    "after",
                    "cause",
                )
            )
            .otherwise(pl.col("cause"))
        )
        .select(classified.columns)
    )


def _frame_of(column: str) -> pl.Expr:
    """The frame number of a ``Torch-Compiled Region: F/C`` name (null when it has none)."""
    return pl.col(column).str.extract(r": (\d+)/\d+", 1).cast(pl.Int64, strict=False)


def _main_thread(trace: Trace) -> tuple[int | None, int | None]:
    """The thread that made the most runtime calls: the fallback launcher."""
    if trace.runtime.is_empty():
        return None, None
    counts = trace.runtime.group_by("pid", "tid").len()
    top = counts.sort(["len", "pid", "tid"], descending=[True, False, False], nulls_last=True).row(0)
    return top[0], top[1]


def _launchers(trace: Trace) -> pl.DataFrame:
    """For each GPU activity start (device, ts): the thread that launched it, when its call ended,
    and whether the call replayed a CUDA/HIP graph (``in_graph``)."""
    # The call's name is reduced to ``in_graph`` before the join, and the first call of a start is
    # its lowest id within the group (not a sort of the whole joined table): on a 0.5 GB DDP trace
    # the join carried 213,000 names, and the sort was most of this step's time.
    first = pl.col("correlation").arg_min()
    return (
        trace.gpu.select("device", "ts", "correlation")
        .join(
            trace.runtime.select(
                "correlation",
                "pid",
                "tid",
                l_ts="ts",
                l_end="end",
                in_graph=pl.col("name").is_in(list(taxonomy.GRAPH_LAUNCH_CALLS)),
            ),
            on="correlation",
            how="inner",
        )
        .group_by("device", "ts")
        .agg(
            pl.col("pid").get(first),
            pl.col("tid").get(first),
            pl.col("l_ts").min(),
            pl.col("l_end").min(),
            pl.col("in_graph").get(first),
        )
    )


def _launched_before_record(trace: Trace) -> pl.DataFrame:
    """Starts of GPU work launched before the host record began → ``device, ts, recorded_from``.

    CUDA and HIP number a process's calls in order (the correlation id), so work numbered below the
    first call a process recorded was launched before that call began. The process is not known
    (the launching call is missing), so the work must be below every process's first call, and it
    was launched by ``recorded_from``, the latest of those first calls' starts."""
    schema = pl.Schema({"device": pl.Int64, "ts": pl.Int64, "recorded_from": pl.Int64})
    numbered = pl.col("correlation") > 0
    first = trace.runtime.select(pl.col("correlation").filter(numbered).min()).item()
    if first is None:
        return pl.DataFrame(schema=schema)
    early = trace.gpu.select("device", "ts", "correlation").filter(numbered & (pl.col("correlation") < first))
    if early.is_empty():  # the usual case: every launch was recorded
        return pl.DataFrame(schema=schema)
    recorded_from = (
        trace.runtime.select("pid", "correlation", "ts")
        .filter(numbered)
        .group_by("pid")
        .agg(at=pl.col("ts").get(pl.col("correlation").arg_min()))
        .get_column("at")
        .max()
    )
    return early.select("device", "ts", recorded_from=pl.lit(recorded_from, pl.Int64)).unique(
        ["device", "ts"]
    )


#: What a host event is to the gap classification (:func:`_host_activity`'s ``kind``).
_HOST_KIND: Final = pl.Enum(["capture", "dataloader", "sync", "op", "copy", "runtime", "alloc"])


def _host_activity(trace: Trace, calls: pl.DataFrame, windows: pl.DataFrame) -> pl.DataFrame:
    """Host events that can meet a gap window → ``h_pid, h_tid, h_ts, h_end, name, kind, key``
    (``kind``: :data:`_HOST_KIND`).

    Each table is cut down to the events that meet a window first (:func:`.intervals.meeting`),
    and only those are filtered and labelled: the tables can hold millions of rows, the windows
    meet a fraction of them."""
    no_key = pl.lit(None, pl.Int64)

    def near(table: pl.DataFrame) -> pl.DataFrame:
        return meeting(table.select("pid", "tid", "ts", "end", "name"), "ts", "end", windows)

    annotations = near(trace.annotations)
    dataloader = annotations.filter(
        pl.col("name").str.starts_with(taxonomy.DATALOADER_PREFIX) & pl.col("name").str.ends_with("__next__")
    )
    copy_call = pl.any_horizontal(pl.col("name").str.starts_with(p) for p in taxonomy.COPY_CALL_PREFIXES)
    allocator_call = pl.col("name").is_in(list(taxonomy.ALLOCATOR_CALLS))
    runtime = near(trace.runtime).filter(~pl.col("name").is_in(list(taxonomy.BLOCKING_CALLS)))
    ops = pl.concat(
        [
            near(trace.cpu_ops),
            annotations.filter(
                ~pl.col("name").str.starts_with("ProfilerStep#")
                & ~pl.col("name").str.starts_with(taxonomy.DATALOADER_PREFIX)
            ),
        ]
    )
    captures = meeting(
        capture_windows(trace).select("pid", "tid", ts="start", end="end", name=pl.lit("graph capture")),
        "ts",
        "end",
        windows,
    )

    def kind(name: str) -> pl.Expr:
        return pl.lit(name, _HOST_KIND)

    frames = [
        captures.with_columns(kind=kind("capture"), key=no_key),
        dataloader.with_columns(kind=kind("dataloader"), key=no_key),
        meeting(
            calls.select("pid", "tid", "ts", "end", name="call", kind=kind("sync"), key="key"),
            "ts",
            "end",
            windows,
        ),
        ops.with_columns(kind=kind("op"), key=no_key),
        runtime.filter(copy_call).with_columns(kind=kind("copy"), key=no_key),
        runtime.filter(~copy_call & ~allocator_call).with_columns(kind=kind("runtime"), key=no_key),
        runtime.filter(allocator_call).with_columns(kind=kind("alloc"), key=no_key),
    ]
    return pl.concat(frames).rename({"pid": "h_pid", "tid": "h_tid", "ts": "h_ts", "end": "h_end"})


def _classify_late(trace: Trace, late: pl.DataFrame, calls: pl.DataFrame, limits: Thresholds) -> pl.DataFrame:
    """Cause of each long gap whose next work the host launched late → ``gap, cause_kind, cause, sync_key``."""
    slack = round(limits.sync_drain_slack_us * 1000)
    windows = late.select(start=pl.col("start") - slack, end="end")
    # The filters that keep many rows (the thread's own events, the covering ops, the recorded
    # activity) take only the columns they use: a filter copies each column it keeps, and on an
    # LLM decode trace ``touching`` has half a million rows (a copy of all its columns was 70 MB
    # at the analysis's memory peak). The events' names stay out of the join (``h_row`` stands for
    # them) and are gathered for the one event each gap keeps: carrying them made the join 1.6x
    # slower on an LLM decode trace (0.24 vs 0.15 s of CPU at 0.5 GB).
    host = _host_activity(trace, calls, windows).with_row_index("h_row")
    names = host.get_column("name")

    def named(chosen: pl.DataFrame, row: str, name: str) -> pl.DataFrame:
        """``chosen`` with the name of the event at its ``row`` as ``name``, in place of ``row``."""
        return chosen.select(pl.exclude(row), names.gather(chosen.get_column(row)).alias(name))

    touching = (
        late.select("gap", "pid", "tid", "start", "end", "l_ts", "l_end")
        .join_where(
            host.drop("name"),
            pl.col("h_ts") < pl.col("end"),
            pl.col("h_end") >= pl.col("start") - slack,
        )
        .select(
            "gap", "start", "end", "l_ts", "l_end", "h_ts", "h_end", "h_row", "kind", "key",
            covered=overlap_ns("start", "end", "h_ts", "h_end"),
            same_thread=(pl.col("h_pid") == pl.col("pid")) & (pl.col("h_tid") == pl.col("tid")),
        )
        .filter("same_thread")
    )  # fmt: skip
    covers = pl.col("covered") >= (pl.col("end") - pl.col("start")) * limits.cause_coverage
    capturing = (
        touching.lazy()
        .filter(pl.col("kind") == "capture")
        .group_by("gap")
        .agg(capture_covered=pl.col("covered").sum())
    )
    dataloader = named(
        touching.lazy()
        .filter(pl.col("kind") == "dataloader")
        # the range covering most of the gap (of nested ones, the outer: the loop's own call)
        .sort(["covered", "h_ts", "h_end", "h_row"], descending=[True, False, True, False])
        .group_by("gap")
        .agg(dl_covered=pl.col("covered").sum(), dl_row=pl.col("h_row").first())
        .collect(engine="in-memory"),
        "dl_row",
        "dl_name",
    )
    drained = (
        touching.lazy()
        .filter(
            (pl.col("kind") == "sync")
            & (pl.col("h_end") >= pl.col("start") - slack)
            & (pl.col("h_end") <= pl.col("start") + slack)
            & (pl.col("h_end") - pl.col("h_ts") >= (pl.col("end") - pl.col("start")) * limits.cause_coverage)
        )
        .sort("h_end", "h_row")  # the last to end; of those ending together, the last recorded
        .group_by("gap")
        .agg(sync_key=pl.col("key").last())
    )
    # A runtime call (not the launch ending the gap) the host sat in for most of the gap: a slow
    # call (a first launch loading its module), named in the host-bound cause's words.
    in_runtime = named(
        touching.lazy()
        .filter((pl.col("kind") == "runtime") & covers)
        .sort("covered", "h_row", descending=[True, True])  # on a tie, the last recorded
        .group_by("gap")
        .agg(runtime_row=pl.col("h_row").first(), runtime_ns=pl.col("covered").first())
        .collect(engine="in-memory"),
        "runtime_row",
        "runtime_call",
    )
    in_copy = named(
        touching.lazy()
        .filter((pl.col("kind") == "copy") & covers)
        .sort(**outermost_first("h_ts", "h_end", "h_row"))  # the outermost (the join keeps no order)
        .group_by("gap")
        .agg(copy_row=pl.col("h_row").first())
        .collect(engine="in-memory"),
        "copy_row",
        "copy_call",
    )
    # The allocator's driver calls on the thread, together covering most of the gap: its time is
    # the allocator's (the cache emptied or fragmented), not the work of the operator around them.
    in_allocator = named(
        touching.lazy()
        .filter(pl.col("kind") == "alloc")
        .sort("covered", "h_row", descending=[True, True])
        .group_by("gap")
        .agg(alloc_row=pl.col("h_row").first(), alloc_covered=pl.col("covered").sum(), alloc_calls=pl.len())
        .collect(engine="in-memory"),
        "alloc_row",
        "alloc_call",
    )
    innermost_op = named(
        touching.lazy()
        .select("gap", "start", "end", "h_ts", "h_end", "h_row", "kind", "covered")
        .filter((pl.col("kind") == "op") & covers)
        # The innermost op that still covers the gap; between ops that start and end together (aten::to
        # and the aten::_to_copy it calls) the later row, the callee (a parent is recorded first). The
        # row breaks the tie: without it the sort may order them either way from one run to the next.
        .sort("h_ts", "covered", "h_row", descending=[True, True, True])
        .group_by("gap")
        .agg(op_row=pl.col("h_row").first(), op_ts=pl.col("h_ts").first(), op_end=pl.col("h_end").first())
        .collect(engine="in-memory"),
        "op_row",
        "op_name",
    )
    ending_launch = (pl.col("kind") == "runtime") & (pl.col("h_ts") >= pl.col("l_ts")).fill_null(False)
    recorded = (
        touching.lazy()
        .select("gap", "l_ts", "h_ts", "kind", "covered")
        .filter((pl.col("covered") > 0) & ~pl.col("kind").is_in(["dataloader", "capture"]) & ~ending_launch)
        .group_by("gap")
        .agg(activity=pl.len(), recorded_ns=pl.col("covered").sum())
    )
    # The innermost Python frame open on the thread across the whole gap: where the host was while
    # it recorded nothing (torch's frames name the function, not the line running).
    frames = trace.python.select("pid", "tid", f_ts="ts", f_end="end", frame="name")
    open_frame = (
        late.lazy()
        .select("gap", "pid", "tid", "start", "end")
        .join(frames.lazy(), on=["pid", "tid"], how="inner")
        .filter((pl.col("f_ts") <= pl.col("start")) & (pl.col("f_end") >= pl.col("end")))
        .sort("f_ts", "f_end", "frame", descending=[True, False, False])
        .group_by("gap")
        .agg(frame=pl.col("frame").first())
    )
    # Most of a long gap with nothing recorded on the thread: silence, not launch overhead (that is
    # many short gaps between launches). The sum of what the recorded events cover counts nested
    # ones twice, so it errs towards calling the gap recorded.
    silent = (pl.col("duration") >= round(limits.dispatch_max_us * 1000)) & (
        pl.col("recorded_ns").fill_null(0) < pl.col("duration") * (1 - limits.cause_coverage)
    )
    sync_facts = calls.lazy().select(
        sync_key="key",
        sync_call="call",
        sync_op="op",
        waited_copy="copy",
        sync_is_copy=pl.col("kind") == "copy",
    )
    blocked_facts = calls.lazy().select(blocked_key="key", blocked_call="call", blocked_op="op")
    # Waiting for another GPU: blocked in syncs, then the work queued behind the other GPU's.
    queued_ns = pl.col("end") - pl.col("l_end").clip(pl.col("start"), pl.col("end")).fill_null(pl.col("end"))
    other_gpu = pl.col("other_busy").fill_null(0) >= pl.col("duration") * limits.cause_coverage
    waited_other = other_gpu & (
        pl.col("blocked_ns").fill_null(0) + queued_ns >= pl.col("duration") * limits.cause_coverage
    )
    h2d = pl.col("waited_copy").str.starts_with("Memcpy HtoD").fill_null(False)
    # The covering operator launched the work that ends the gap: the gap is its dispatch cost.
    dispatching = (
        (pl.col("l_ts") >= pl.col("op_ts"))
        & (pl.col("l_ts") <= pl.col("op_end"))
        & (pl.col("duration") < round(limits.dispatch_max_us * 1000))
    ).fill_null(False)
    kind = (
        pl.when(pl.col("capture_covered").fill_null(0) >= pl.col("duration") * limits.cause_coverage)
        .then(pl.lit(CauseKind.CAPTURE.value))
        .when(pl.col("dl_covered").fill_null(0) >= pl.col("duration") * limits.cause_coverage)
        .then(pl.lit(CauseKind.DATALOADER.value))
        .when(pl.col("sync_key").is_not_null() & h2d)
        .then(pl.lit(CauseKind.COPY.value))
        .when(pl.col("sync_key").is_not_null())
        .then(pl.lit(CauseKind.SYNC.value))
        .when(waited_other)
        .then(pl.lit(CauseKind.OTHER_GPU.value))
        .when(pl.col("copy_call").is_not_null())
        .then(pl.lit(CauseKind.COPY.value))
        .when(pl.col("op_name").str.contains(taxonomy.COMMUNICATION_OP_PATTERN).fill_null(False))
        .then(pl.lit(CauseKind.COMMUNICATION.value))
        .when(pl.col("alloc_covered").fill_null(0) >= pl.col("duration") * limits.cause_coverage)
        .then(pl.lit(CauseKind.ALLOCATOR.value))
        # A launch call the host sat in for most of the gap, inside the operator launching the work:
        # the launch was slow (a kernel's first launch loads its GPU code), not the operator's work.
        .when(pl.col("slow_launch").fill_null(False))
        .then(pl.lit(CauseKind.LAUNCH.value))
        .when(pl.col("op_name").is_not_null() & ~dispatching)
        .then(pl.lit(CauseKind.HOST_OP.value))
        .when(pl.col("activity").is_null() | silent)
        .then(pl.lit(CauseKind.UNTRACED.value))
        .otherwise(pl.lit(CauseKind.LAUNCH.value))
    )
    sync_label = (
        pl.when(pl.col("sync_is_copy").fill_null(False) & pl.col("sync_op").is_not_null())
        .then(pl.format("{} waiting for its {} in {}", "sync_call", "waited_copy", "sync_op"))
        .when(pl.col("sync_is_copy").fill_null(False))
        .then(pl.format("{} waiting for its {}", "sync_call", "waited_copy"))
        .when(pl.col("waited_copy").is_not_null() & pl.col("sync_op").is_not_null())
        .then(pl.format("{} after {} in {}", "sync_call", "waited_copy", "sync_op"))
        .when(pl.col("waited_copy").is_not_null())
        .then(pl.format("{} after {}", "sync_call", "waited_copy"))
        .when(pl.col("sync_op").is_not_null())
        .then(pl.format("{} in {}", "sync_call", "sync_op"))
        .otherwise(pl.col("sync_call"))
    )
    return (
        late.lazy()
        .select(
            "gap",
            "start",
            "end",
            "duration",
            "l_ts",
            "l_end",
            "other_device",
            "other_busy",
            "blocked_ns",
            "blocked_key",
        )
        .join(capturing, on="gap", how="left")
        .join(dataloader.lazy(), on="gap", how="left")
        .join(drained, on="gap", how="left")
        .join(blocked_facts, on="blocked_key", how="left")
        .join(in_copy.lazy(), on="gap", how="left")
        .join(in_runtime.lazy(), on="gap", how="left")
        .join(in_allocator.lazy(), on="gap", how="left")
        .join(innermost_op.lazy(), on="gap", how="left")
        .join(recorded, on="gap", how="left")
        .join(open_frame, on="gap", how="left")
        .join(sync_facts, on="sync_key", how="left")
        .with_columns(slow_launch=pl.col("runtime_call").is_in(list(taxonomy.KERNEL_LAUNCH_CALLS)))
        .with_columns(cause_kind=kind)
        .with_columns(
            sync_key=pl.when(pl.col("cause_kind").is_in([CauseKind.SYNC.value, CauseKind.COPY.value]))
            .then(pl.col("sync_key"))
            .otherwise(None),
            cause=pl.when(pl.col("cause_kind") == CauseKind.CAPTURE.value)
            .then(pl.lit("capturing a graph: the launches were recorded into it, not run"))
            .when(pl.col("cause_kind") == CauseKind.DATALOADER.value)
            .then(pl.col("dl_name"))
            .when(pl.col("sync_key").is_not_null())
            .then(sync_label)
            .when((pl.col("cause_kind") == CauseKind.OTHER_GPU.value) & pl.col("blocked_call").is_not_null())
            .then(
                pl.format(
                    "the host waited in {} while GPU {} worked: a pipeline bubble",
                    pl.when(pl.col("blocked_op").is_not_null())
                    .then(pl.format("{} in {}", "blocked_call", "blocked_op"))
                    .otherwise(pl.col("blocked_call")),
                    "other_device",
                )
            )
            .when(pl.col("cause_kind") == CauseKind.OTHER_GPU.value)
            .then(pl.format("the next work waited behind GPU {}'s: a pipeline bubble", "other_device"))
            .when(pl.col("cause_kind") == CauseKind.COPY.value)
            .then(pl.col("copy_call"))
            .when(pl.col("cause_kind").is_in([CauseKind.COMMUNICATION.value, CauseKind.HOST_OP.value]))
            .then(pl.col("op_name"))
            .when(pl.col("cause_kind") == CauseKind.ALLOCATOR.value)
            .then(
                pl.format(
                    "{}{} in {}: the caching allocator asked the driver for memory",
                    "alloc_call",
                    pl.when(pl.col("alloc_calls") > 1)
                    .then(pl.format(" and {} more allocator calls", pl.col("alloc_calls") - 1))
                    .otherwise(pl.lit("")),
                    pl.col("op_name").fill_null("no operator"),
                )
            )
            .when((pl.col("cause_kind") == CauseKind.UNTRACED.value) & pl.col("frame").is_not_null())
            .then(
                pl.format(
                    "nothing recorded on the host, inside {} (untraced Python, a sleep, I/O, another thread)",
                    "frame",
                )
            )
            .when(pl.col("slow_launch").fill_null(False) & pl.col("op_name").is_not_null())
            .then(
                pl.format(
                    "the host sat in {} inside {} for most of the gap: a slow launch (a kernel's first "
                    "launch loads its GPU code: start-up, not the loop's pace)",
                    "runtime_call",
                    "op_name",
                )
            )
            .when(pl.col("op_name").is_not_null())
            .then(pl.format("dispatching {}: the host took this long to launch its next kernel", "op_name"))
            .when(pl.col("runtime_call").is_not_null())
            .then(
                pl.format(
                    "the host sat in {} for most of the gap: a slow runtime call (a first launch loads its module)",
                    "runtime_call",
                )
            )
            .when(pl.col("cause_kind") == CauseKind.UNTRACED.value)
            .then(
                pl.lit("nothing recorded on the host (untraced Python, a sleep, I/O, a lock, another thread)")
            )
            .otherwise(pl.lit("the host was launching work or running Python between launches")),
        )
        .select("gap", "cause_kind", "cause", "sync_key")
        .collect(engine="in-memory")
    )


_OTHER_SCHEMA = pl.Schema(
    {
        "gap": pl.Int64,
        "other_device": pl.Int64,
        "other_busy": pl.Int64,
        "blocked_ns": pl.Int64,
        "blocked_key": pl.Int64,
    }
)


def _other_gpu_busy(trace: Trace, gaps: pl.DataFrame, calls: pl.DataFrame) -> pl.DataFrame:
    """For each gap (``gap, device, start, end, pid, l_end``) whose launching process launched
    kernels on more than one device: the busiest other device of that process during the gap, and
    how long a thread of the process was blocked in syncs in the gap before its work was launched
    (the most of any one thread; the key of its longest call) →
    ``gap, other_device, other_busy, blocked_ns, blocked_key`` (ns)."""
    if gaps.is_empty() or trace.gpu.get_column("device").n_unique() < 2:  # one GPU: no other to wait for
        return pl.DataFrame(schema=_OTHER_SCHEMA)
    process_devices = (
        trace.gpu.select("kind", "correlation", "device")
        .filter(pl.col("kind") == "kernel")
        .select("correlation", "device")
        .join(trace.runtime.select("correlation", "pid"), on="correlation", how="inner")
        .select("pid", "device")
        .unique()
    )
    several = process_devices.group_by("pid").len().filter(pl.col("len") > 1).select("pid")
    candidates = gaps.join(several, on="pid", how="semi")
    if candidates.is_empty():  # the usual case: one GPU per process
        return pl.DataFrame(schema=_OTHER_SCHEMA)
    others = candidates.join(
        process_devices.rename({"device": "other_device"}), on="pid", how="inner"
    ).filter(pl.col("other_device") != pl.col("device"))
    busy = merge_intervals(
        trace.gpu.select("device", "ts", "end").filter(
            pl.col("device").is_in(others.get_column("other_device").unique().implode())
        ),
        by="device",
    )
    busy = meeting(busy.rename({"start": "ts"}), "ts", "end", others.select("start", "end"))
    busiest = (
        others.select("gap", "other_device", "start", "end")
        .join_where(
            busy.select(b_device="device", b_start="ts", b_end="end"),
            pl.col("b_start") < pl.col("end"),
            pl.col("b_end") > pl.col("start"),
        )
        .filter(pl.col("b_device") == pl.col("other_device"))
        .group_by("gap", "other_device")
        .agg(other_busy=overlap_ns("start", "end", "b_start", "b_end").sum())
        .sort(["gap", "other_busy", "other_device"], descending=[False, True, False])
        .unique("gap", keep="first", maintain_order=True)
    )
    # Blocked before the launch: the gap up to when its work was launched (the whole gap without one).
    until = candidates.select(
        "gap", "pid", "start", launched=pl.min_horizontal("end", pl.col("l_end").fill_null(pl.col("end")))
    ).filter(pl.col("launched") > pl.col("start"))
    blocked = (
        until.join_where(
            calls.select(c_pid="pid", c_tid="tid", c_ts="ts", c_end="end", c_key="key"),
            pl.col("c_ts") < pl.col("launched"),
            pl.col("c_end") > pl.col("start"),
        )
        .filter(pl.col("c_pid") == pl.col("pid"))
        .with_columns(ns=overlap_ns("start", "launched", "c_ts", "c_end"))
        .sort("ns", "c_key")  # the call blocked longest; of those blocked as long, the last
        .group_by("gap", "c_tid")
        .agg(blocked_ns=pl.col("ns").sum(), blocked_key=pl.col("c_key").last())
        .sort(["gap", "blocked_ns", "c_tid"], descending=[False, True, False])
        .unique("gap", keep="first", maintain_order=True)
        .select("gap", "blocked_ns", "blocked_key")
    )
    return busiest.join(blocked, on="gap", how="left").select(list(_OTHER_SCHEMA)).cast(_OTHER_SCHEMA)


def classify_gaps(
    trace: Trace,
    gaps: pl.DataFrame,
    calls: pl.DataFrame,
    limits: Thresholds,
    user_code: Collection[str] = (),
    *,
    frame_index: FrameIndex | None = None,
) -> pl.DataFrame:
    """Every gap with its cause (see the module doc) → :data:`GAP_SCHEMA`, in device/start order.

    ``source`` (the user's line, else a library line: ``source_kind``) is found for gaps of at least
    ``min_gap_us``; shorter ones have none. ``frame_index``: the trace's
    :class:`~traceinsight.analysis.sources.FrameIndex` when the caller keeps one.
    """
    if gaps.is_empty():
        return pl.DataFrame(schema=GAP_SCHEMA)
    min_ns = round(limits.min_gap_us * 1000)
    main_pid, main_tid = _main_thread(trace)
    table = (
        gaps.lazy()
        .join(_launchers(trace).lazy(), left_on=["device", "end"], right_on=["device", "ts"], how="left")
        .join(
            _launched_before_record(trace).lazy(),
            left_on=["device", "end"],
            right_on=["device", "ts"],
            how="left",
        )
        .with_columns(
            early=(pl.col("pid").is_null() & (pl.col("recorded_from") <= pl.col("start"))).fill_null(False)
        )
        .with_columns(
            queued=(pl.col("l_end") <= pl.col("start")).fill_null(False) | pl.col("early"),
            long=pl.col("duration") >= min_ns,
        )
        .with_columns(
            pl.col("pid").fill_null(pl.lit(main_pid, pl.Int64)),
            pl.col("tid").fill_null(pl.lit(main_tid, pl.Int64)),
        )
        .sort("device", "start")
        .with_row_index("gap")
        .with_columns(pl.col("gap").cast(pl.Int64))
        .collect(engine="in-memory")
    )
    other = _other_gpu_busy(
        trace,
        table.filter(pl.col("long") & pl.col("pid").is_not_null()).select(
            "gap", "device", "start", "end", "pid", "l_end"
        ),
        calls,
    )
    table = table.join(other, on="gap", how="left", maintain_order="left")
    bubble = (
        pl.col("long")
        & (pl.col("other_busy") >= pl.col("duration") * limits.cause_coverage).fill_null(False)
        & pl.col("queued")
        & ~pl.col("early")
    )
    late = table.filter(pl.col("long") & ~pl.col("queued") & pl.col("pid").is_not_null())
    classified = _classify_late(trace, late, calls, limits) if late.height else None
    queued_text = pl.lit(
        "the next work was already queued: the GPU waited on another stream, an event or a graph"
    )
    simple = (
        pl.when(bubble)
        .then(pl.lit(CauseKind.OTHER_GPU.value))
        .when(pl.col("queued"))
        .then(pl.lit(CauseKind.QUEUED.value))
        .when(pl.col("pid").is_null())
        .then(pl.lit(CauseKind.UNKNOWN.value))
        .otherwise(pl.lit(CauseKind.LAUNCH.value))
    )
    simple_text = (
        pl.when(bubble)
        .then(pl.format("the next work was queued behind GPU {}'s: a pipeline bubble", "other_device"))
        .when(pl.col("early"))
        .then(
            pl.lit(
                "the next work was queued before the trace recorded the host (its launch is not in "
                "the trace): the GPU waited on another stream, an event or a graph"
            )
        )
        .when(pl.col("queued") & pl.col("in_graph").fill_null(False))
        .then(pl.lit(QUEUED_IN_GRAPH))
        .when(pl.col("queued"))
        .then(queued_text)
        .when(pl.col("pid").is_null())
        .then(pl.lit("no host thread tied to the next GPU work"))
        .otherwise(pl.lit("launch overhead: the host issued the next work after the GPU ran out"))
    )
    table = table.with_columns(cause_kind=simple, cause=simple_text, sync_key=pl.lit(None, pl.Int64))
    if classified is not None:
        table = table.update(classified, on="gap", how="left")
    long_rows = table.filter(pl.col("long") & pl.col("pid").is_not_null())
    points = long_rows.select(key="gap", pid="pid", tid="tid", t=((pl.col("start") + pl.col("end")) // 2))
    line_columns = ("source", "source_kind", "source_line_kind", "source_function")
    sources = source_at(trace, points, user_code, frame_index=frame_index).select(
        gap="key", **{f"mid_{name}": name for name in line_columns}
    )
    sync_sources = calls.select(sync_key="key", **{f"sync_{name}": name for name in line_columns})
    use_sync = pl.col("sync_source").is_not_null()
    # The joins keep the table's device/start order (each gap's start is unique on its device), so
    # the table is not sorted again (0.07 s of CPU on a 0.5 GB DDP trace).
    return (
        table.lazy()
        .join(sources.lazy(), on="gap", how="left", maintain_order="left")
        .join(sync_sources.lazy(), on="sync_key", how="left", maintain_order="left")
        .with_columns(
            other_device=pl.when(pl.col("cause_kind") == CauseKind.OTHER_GPU.value).then(
                pl.col("other_device")
            ),
            **{
                name: pl.when(use_sync).then(pl.col(f"sync_{name}")).otherwise(pl.col(f"mid_{name}"))
                for name in line_columns
            },
        )
        .select(list(GAP_SCHEMA))
        .cast(GAP_SCHEMA)
        .collect(engine="in-memory")
    )


#: The cause of a ``queued`` gap whose next work a graph replay (``cudaGraphLaunch``) had queued.
QUEUED_IN_GRAPH: Final = (
    "the next work was already queued in a CUDA graph replay: a node of the graph waited on a "
    "dependency (an event from another stream or rank, a host node)"
)


def reported_gaps(classified: pl.DataFrame, limits: Thresholds, origin_ns: int) -> tuple[IdleGap, ...]:
    """Gaps of at least ``min_gap_us``, longest first, as results (``start`` from ``origin_ns``)."""
    min_ns = round(limits.min_gap_us * 1000)
    ordered = classified.filter(pl.col("duration") >= min_ns).sort(
        ["duration", "device", "start"], descending=[True, False, False]
    )
    # Column by column, not row dicts (:func:`~.results.from_columns`): tens of thousands of gaps
    # on an LLM decode trace.
    columns = ordered.select(
        "device",
        pl.col("start") - origin_ns,
        "duration",
        *(field.name for field in fields_of(IdleGap)[3:]),
    ).get_columns()
    return from_columns(IdleGap, [column.to_list() for column in columns])
