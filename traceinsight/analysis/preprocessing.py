"""The host's time at the start of each step, before it launched the step's first GPU work.

Per steady step that launched GPU work: its host range's start, the first launch call of its work
(the runtime call of the first correlation id some GPU activity carries), and the part of that
stretch the host spent waiting (DataLoader ``__next__``, blocking calls) rather than working. The
rest is the step's preparation on the host: decoding, resizing, augmenting, collating a batch. What
it cost the GPU is in each step's ``lead_by_cause_ns`` (:func:`.gpu_time.step_times`); this module
says what the host did meanwhile, for ``host-preprocessing``'s evidence and replay.
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceinsight.analysis.intervals import joined_where, meeting, merge_intervals, overlap_ns
from traceinsight.analysis.shared import launch_calls
from traceinsight.analysis.sources import FrameIndex, source_at
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace
from traceinsight.model import Model

__all__ = ["StepLeads", "step_leads"]


class StepLeads(Model, frozen=True):
    """The host's time in each steady step before it launched the step's first GPU work."""

    #: Per steady step that launched GPU work: (host start, first launch, time in between the host
    #: waited: DataLoader ``__next__`` and blocking calls, which their own fixes change), in ns.
    leads: tuple[tuple[int, int, int], ...] = ()
    #: Top-level operators the launching thread ran in those stretches: (name, ns), most first.
    ops: tuple[tuple[str, int], ...] = ()
    #: The line active in the middle of the longest stretch (see :func:`.sources.source_at`).
    source: str | None = None
    source_kind: str | None = None
    #: What ``source``'s line is and the function it is in (see :data:`.sources.SOURCE_COLUMNS`).
    source_line_kind: str | None = None
    source_function: str | None = None
    #: Of the stretches, the time inside an operator that then launched the step's first work
    #: itself (summed over steps, ns): that operator's own set-up (a first call), not preparing.
    in_launching_op_ns: int = 0


def _in_launching_op(trace: Trace, ranges: pl.DataFrame) -> int:
    """Per range (``pid, tid, start, end``: a step's start to its first launch), the time inside the
    outermost operator on its thread that was still running at the launch, summed (ns)."""
    ops = trace.cpu_ops.select(o_pid="pid", o_tid="tid", o_ts="ts", o_end="end")
    if ops.is_empty() or ranges.is_empty():
        return 0
    inside = (
        joined_where(
            ranges.lazy(),
            ops.lazy(),
            pl.col("o_ts") < pl.col("end"),
            pl.col("o_end") >= pl.col("end"),
        )
        .filter((pl.col("pid") == pl.col("o_pid")) & (pl.col("tid") == pl.col("o_tid")))
        .group_by("start")
        .agg(ns=(pl.col("end") - pl.max_horizontal("start", "o_ts")).max())
        .collect(engine="in-memory")
    )
    return int(inside.get_column("ns").sum()) if inside.height else 0


def _top_level_ops(trace: Trace, ranges: pl.DataFrame, top: int) -> tuple[tuple[str, int], ...]:
    """Operators on each range's thread not inside another operator there, by time inside the
    ranges (``pid, tid, start, end``), most first."""
    ops = meeting(trace.cpu_ops.select("pid", "tid", "ts", "end", "name"), "ts", "end", ranges)
    if ops.is_empty():
        return ()
    # By thread, outermost first (:func:`.intervals.outermost_first`); ``ops`` is in the trace's
    # order, which a stable sort keeps for ties: a caller that starts and ends with its callee is
    # the outer (and the stable sort took 0.28-0.34 s where the other took 0.55 on 3 M operators).
    outer = (
        ops.lazy()
        .sort("pid", "tid", "ts", "end", descending=[False, False, False, True], maintain_order=True)
        .with_columns(reach=pl.col("end").cum_max().shift(1).over("pid", "tid"))
        .filter(pl.col("reach").is_null() | (pl.col("ts") >= pl.col("reach")))
    )
    timed = (
        joined_where(
            ranges.lazy(),
            outer.select(o_pid="pid", o_tid="tid", o_ts="ts", o_end="end", name="name"),
            pl.col("o_ts") < pl.col("end"),
            pl.col("o_end") > pl.col("start"),
        )
        .filter((pl.col("pid") == pl.col("o_pid")) & (pl.col("tid") == pl.col("o_tid")))
        .group_by("name")
        .agg(ns=overlap_ns("start", "end", "o_ts", "o_end").sum())
        .filter(pl.col("ns") > 0)
        .sort(["ns", "name"], descending=[True, False])
        .head(top)
        .collect(engine="in-memory")
    )
    return tuple((str(name), int(ns)) for name, ns in timed.iter_rows())


def step_leads(
    trace: Trace,
    steady: SteadySteps,
    calls: pl.DataFrame,
    waits: tuple[tuple[int, int], ...],
    user_code: Collection[str] = (),
    top: int = 3,
    launches: pl.DataFrame | None = None,
    *,
    frame_index: FrameIndex | None = None,
) -> StepLeads:
    """Each steady step's stretch before its first launch, what the host waited and did in it.

    ``calls`` are the blocking calls (``ts, end``), ``waits`` the DataLoader ``__next__`` ranges,
    ``launches`` :func:`~traceinsight.analysis.shared.launch_calls` and ``frame_index`` the trace's
    :class:`~traceinsight.analysis.sources.FrameIndex` when the caller has them."""
    steps = pl.DataFrame(
        {
            "start": [step.start_ns for step in steady.steady_steps],
            "end": [step.end_ns for step in steady.steady_steps],
        },
        schema={"start": pl.Int64, "end": pl.Int64},
    ).sort("start")
    launches = launch_calls(trace) if launches is None else launches
    if steps.is_empty() or launches.is_empty():
        return StepLeads()
    leads = (
        steps.lazy()
        .join_asof(
            launches.lazy().select(first="l_ts", pid="pid", tid="tid").sort("first"),
            left_on="start",
            right_on="first",
            strategy="forward",
        )
        .filter(pl.col("first") < pl.col("end"))
        .select("start", "first", "pid", "tid")
        .collect(engine="in-memory")
    )
    if leads.is_empty():
        return StepLeads()
    loader = pl.DataFrame(
        {"ts": [start for start, _ in waits], "end": [end for _, end in waits]},
        schema={"ts": pl.Int64, "end": pl.Int64},
    )
    waited = merge_intervals(
        pl.concat([loader, calls.select("ts", "end")]).with_columns(one=pl.lit(0)), "one"
    )
    kept = (
        joined_where(
            leads.lazy(),
            waited.lazy().select(w_start="start", w_end="end"),
            pl.col("w_start") < pl.col("first"),
            pl.col("w_end") > pl.col("start"),
        )
        .group_by("start")
        .agg(kept=overlap_ns("start", "first", "w_start", "w_end").sum())
    )
    table = (
        leads.lazy()
        .join(kept, on="start", how="left")
        .with_columns(pl.col("kept").fill_null(0))
        .sort("start")
        .collect(engine="in-memory")
    )
    ranges = table.select("pid", "tid", "start", end="first")
    # the longest stretch; of stretches as long, the first step's (arg_max: the first maximum)
    longest = table.row(table.select((pl.col("first") - pl.col("start")).arg_max()).item(), named=True)
    point = pl.DataFrame(
        {
            "key": [0],
            "pid": [longest["pid"]],
            "tid": [longest["tid"]],
            "t": [(longest["start"] + longest["first"]) // 2],
        },
        schema={"key": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64},
    )
    found = source_at(trace, point, user_code, frame_index=frame_index)
    row = found.row(0, named=True) if found.height else {}
    return StepLeads(
        leads=tuple(
            (int(a), int(b), int(c)) for a, b, c in table.select("start", "first", "kept").iter_rows()
        ),
        ops=_top_level_ops(trace, ranges, top),
        in_launching_op_ns=_in_launching_op(trace, ranges),
        source=row.get("source"),
        source_kind=row.get("source_kind"),
        source_line_kind=row.get("source_line_kind"),
        source_function=row.get("source_function"),
    )
