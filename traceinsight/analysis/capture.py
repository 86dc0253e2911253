"""CUDA/HIP graph capture: stretches of the host where launches are recorded into a graph, not run.

Between ``cudaStreamBeginCapture`` and ``cudaStreamEndCapture`` (``hip*``, ``cu*`` alike) on a
thread, the work launched onto the captured stream goes into a graph: no GPU activity follows those
launches, by design. The graph runs later, replayed by ``cudaGraphLaunch``. vLLM, SGLang and
``torch.cuda.graphs`` capture at start-up, often inside ``record_function`` ranges named like
``capture_<batch>_<mode>``; a trace of that start-up shows the GPU idle while the host captures.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from traceinsight.analysis.intervals import merge_intervals, outermost_first
from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model

__all__ = ["CAPTURE_SCHEMA", "GraphCapture", "capture_windows", "graph_capture"]

#: One capture on its thread: from the start of the begin call to the end of the end call (ns).
CAPTURE_SCHEMA: Final = pl.Schema({"pid": pl.Int64, "tid": pl.Int64, "start": pl.Int64, "end": pl.Int64})


def _named(prefixes: tuple[str, ...]) -> pl.Expr:
    return pl.any_horizontal(pl.col("name").str.starts_with(prefix) for prefix in prefixes)


def capture_windows(trace: Trace) -> pl.DataFrame:
    """Every capture → :data:`CAPTURE_SCHEMA`, by thread, start and end.

    Each begin call is paired with the first end call on its thread that ends after it starts. An
    end call without a begin (the capture began before the trace) starts at the thread's first
    recorded call; a begin without an end (the trace stopped during the capture) lasts until the
    thread's last recorded call ends."""
    runtime = trace.runtime.lazy().drop_nulls(["pid", "tid"])
    begins = (
        runtime.filter(_named(taxonomy.GRAPH_CAPTURE_BEGIN_PREFIXES))
        .select("pid", "tid", start="ts")
        .collect(engine="in-memory")
    )
    ends = (
        runtime.filter(_named(taxonomy.GRAPH_CAPTURE_END_PREFIXES))
        .select("pid", "tid", stop="end")
        .collect(engine="in-memory")
    )
    if begins.is_empty() and ends.is_empty():
        return pl.DataFrame(schema=CAPTURE_SCHEMA)
    bounds = (  # one row a thread, grouped once for both halves below
        runtime.group_by("pid", "tid")
        .agg(first=pl.col("ts").min(), last=pl.col("end").max())
        .collect(engine="in-memory")
        .lazy()
    )
    paired = (
        begins.lazy()
        .sort("start")
        .join_asof(
            ends.lazy().sort("stop"),
            left_on="start",
            right_on="stop",
            by=["pid", "tid"],
            strategy="forward",
            check_sortedness=False,  # both sorted above; polars cannot check with `by`
        )
        .join(bounds, on=["pid", "tid"], how="left")
        .select("pid", "tid", "start", end=pl.coalesce("stop", "last"))
    )
    unpaired = (
        ends.lazy()
        .join(paired.select("pid", "tid", stop="end"), on=["pid", "tid", "stop"], how="anti")
        .join(bounds, on=["pid", "tid"], how="left")
        .select("pid", "tid", start="first", end="stop")
    )
    return (
        pl.concat([paired, unpaired])
        .cast(CAPTURE_SCHEMA)
        .unique()
        .sort("pid", "tid", "start", "end")
        .collect(engine="in-memory")
    )


class GraphCapture(Model, frozen=True):
    """What the trace's graph captures hold."""

    #: Captures (begin/end pairs) in the trace.
    captures: int
    #: Host time inside captures (the union over threads, ns).
    captured_ns: int
    #: The trace's recorded span: first event to last (host and GPU, ns).
    span_ns: int
    #: Kernel launches inside captures (on the capturing thread) with no GPU activity: recorded into
    #: a graph, not run.
    captured_launches: int
    #: Names of the host ranges that enclose the captures (``capture_32_FULL``), most common first.
    ranges: tuple[str, ...]
    #: ``CUDA`` or ``HIP``: whose graphs they are.
    api: str = "CUDA"


def launches_in(windows: pl.DataFrame, launches: pl.DataFrame) -> pl.Series:
    """Whether each launch call (``pid, tid, ts``) starts inside a capture on its thread."""
    if windows.is_empty() or launches.is_empty():
        return pl.Series([False] * launches.height, dtype=pl.Boolean)
    inside = (
        launches.select("pid", "tid", "ts")
        .with_row_index("row")
        .join(windows, on=["pid", "tid"], how="inner")
        .filter((pl.col("ts") >= pl.col("start")) & (pl.col("ts") < pl.col("end")))
        .get_column("row")
        .unique()
    )
    return pl.Series(range(launches.height)).is_in(inside.implode())


def graph_capture(trace: Trace, windows: pl.DataFrame | None = None) -> GraphCapture | None:
    """The trace's graph captures (None without any)."""
    windows = capture_windows(trace) if windows is None else windows
    if windows.is_empty():
        return None
    launches = trace.runtime.filter(
        pl.col("name").is_in(taxonomy.KERNEL_LAUNCH_CALLS) & pl.col("pid").is_not_null()
    ).join(trace.gpu.select("correlation").drop_nulls().unique(), on="correlation", how="anti")
    captured = int(launches_in(windows, launches).sum())
    starts = [t.get_column("ts").min() for t in (trace.runtime, trace.cpu_ops, trace.annotations, trace.gpu)]
    ends = [t.get_column("end").max() for t in (trace.runtime, trace.cpu_ops, trace.annotations, trace.gpu)]
    first = min((value for value in starts if isinstance(value, int)), default=0)
    last = max((value for value in ends if isinstance(value, int)), default=0)
    enclosing = (
        trace.annotations.select("pid", "tid", a_ts="ts", a_end="end", a_name="name")
        .with_row_index("a_row")
        .join(windows, on=["pid", "tid"], how="inner")
        .filter(
            (pl.col("a_ts") <= pl.col("start"))
            & (pl.col("a_end") >= pl.col("end"))
            & ~pl.col("a_name").str.starts_with("ProfilerStep#")
        )
        .sort(**outermost_first("a_ts", "a_end", "a_row"))
        .unique(["pid", "tid", "start", "end"], keep="last")  # each capture's innermost range
        .group_by("a_name")
        .len()
        .sort(["len", "a_name"], descending=[True, False])
    )
    return GraphCapture(
        captures=windows.height,
        captured_ns=int(
            merge_intervals(windows.select(one=pl.lit(0), ts="start", end="end"), "one")
            .select((pl.col("end") - pl.col("start")).sum())
            .item()
        ),
        span_ns=max(0, last - first),
        captured_launches=captured,
        ranges=tuple(enclosing.get_column("a_name").to_list()),
        api="HIP"
        if trace.runtime.get_column("name").str.starts_with("hipStreamBeginCapture").any()
        else "CUDA",
    )
