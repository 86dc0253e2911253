"""The host-side view: threads, busiest operators (self time), DataLoader time. Works without GPU activity.

Self time is an operator's duration minus the durations of the operators it calls directly, so a
chain of wrappers (``aten::to`` → ``aten::_to_copy`` → ``aten::copy_``) counts its time once, in the
operator that did the work.

How the direct caller is found without a loop: on each thread, operators sorted by start (longer
first on ties) nest like a stack. An operator's depth is how many operators started before it
(counting itself) minus how many before it ended by its start, less one; its caller is the latest
operator before it at one depth less (an as-of join on the order, by depth). Operators that overlap without
nesting (a recording glitch) are counted as if they nested.

The walk itself runs in C when the package was built with a compiler (:mod:`._nesting`, the same
rule in one pass without the GIL: ~20× faster and without the joins' memory on a million
operators); the polars form below is what runs without it, and the tests hold the two equal.
"""

from __future__ import annotations

import numpy as np
import polars as pl

from traceinsight.analysis.results import Host, HostOp
from traceinsight.arrays import series
from traceinsight.load import Trace, taxonomy

try:
    from traceinsight.analysis import _nesting  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler
    _nesting = None


def self_times(ops: pl.DataFrame, *, native: bool = True) -> pl.DataFrame:
    """Per operator row → ``name, dur, self, top`` (self = dur minus direct callees' durations;
    top = its direct caller has another name, so its duration counts in the name's total), rows
    in no particular order. ``native=False`` takes the polars form even where the C walk is built
    (tests)."""
    empty = pl.DataFrame(schema={"name": pl.String, "dur": pl.Int64, "self": pl.Int64, "top": pl.Boolean})
    timed = ops.select("pid", "tid", "ts", "end", "dur", "name")
    if timed.get_column("ts").null_count() or timed.get_column("end").null_count():
        timed = timed.drop_nulls(["ts", "end"])  # a copy: only when there is something to drop
    if timed.is_empty():
        return empty
    if native and _nesting is not None:
        return _walked(timed)
    # The order is worked out on the integer columns alone; names and durations are gathered into
    # it once at the end (an operator table can hold millions of rows). Threads, and runs of one start on a thread, are adjacent in this order: counts within them are
    # running values read at a run's first row (forward fill), never windows over many small groups.
    order = pl.int_range(pl.len(), dtype=pl.Int64)
    new_thread = (
        (pl.col("pid") != pl.col("pid").shift(1)) | (pl.col("tid") != pl.col("tid").shift(1))
    ).fill_null(True)
    new_start = (new_thread | (pl.col("ts") != pl.col("ts").shift(1))).fill_null(True)
    ordered = (
        timed.select("pid", "tid", "ts", "end")
        .with_row_index("position")
        .sort(["pid", "tid", "ts", "end"], descending=[False, False, False, True], maintain_order=True)
        .with_columns(
            order=order,
            thread=new_thread.cum_sum().cast(pl.Int64),
            started=order - pl.when(new_thread).then(order).forward_fill() + 1,
            first_of_start=new_start,
            last_of_start=new_start.shift(-1).fill_null(True),
        )
        .drop("pid", "tid")
    )
    positions = ordered.get_column("position")
    first_in_thread = (pl.col("thread") != pl.col("thread").shift(1)).fill_null(True)
    ends = (
        ordered.select("thread", ts="end")
        .sort("thread", "ts")
        .with_columns(ended=order - pl.when(first_in_thread).then(order).forward_fill() + 1)
    )
    ended = (
        ordered.select("thread", "ts")
        .join_asof(ends, on="ts", by="thread", strategy="backward", check_sortedness=False)
        .get_column("ended")
        .fill_null(0)
    )
    del ends
    # The last end ≤ ts counts every end at or before the start, which includes zero-length
    # operators starting at that same instant that come at or after this one in the order (they
    # sort last among equal starts): those have not ended before it, so they are taken back out.
    zero = (pl.col("end") == pl.col("ts")).cast(pl.Int64)
    zeros_through = zero.cum_sum()
    zeros_before = pl.when("first_of_start").then(zeros_through - zero).forward_fill()
    zeros_through_start = pl.when("last_of_start").then(zeros_through).backward_fill()
    zero_after = zeros_through_start - zeros_before - (zeros_through - zeros_before - 1).clip(lower_bound=0)
    with_depth = ordered.with_columns(ended=ended).select(
        "thread", "order", depth=pl.col("started") - (pl.col("ended") - zero_after) - 1
    )
    del ordered, ended
    # One integer key per (thread, depth): the caller is the latest row before at (thread, depth - 1).
    low, high = with_depth.select(low=pl.col("depth").min(), high=pl.col("depth").max()).row(0)
    span = high - low + 2
    key = pl.col("thread") * span + pl.col("depth") - low + 1
    parent = (
        with_depth.select("order", caller_key=key - 1)
        .join_asof(
            with_depth.select(caller_key=key, parent="order"),
            left_on="order",
            right_on="parent",
            by="caller_key",
            strategy="backward",
            allow_exact_matches=False,
            check_sortedness=False,
        )
        .get_column("parent")
    )
    del with_depth
    # ``order`` is the row number, so a caller's row is found by position.
    names = timed.get_column("name").gather(positions)
    durations = timed.get_column("dur").gather(positions)
    callees = (
        pl.DataFrame({"parent": parent, "dur": durations})
        .drop_nulls("parent")
        .group_by("parent")
        .agg(pl.col("dur").sum())
    )
    spent = pl.zeros(len(positions), dtype=pl.Int64, eager=True).scatter(
        callees.get_column("parent"), callees.get_column("dur")
    )
    return pl.DataFrame(
        {
            "name": names,
            "dur": durations,
            "self": (durations - spent).clip(lower_bound=0),
            # counted in the total unless a call of the same name encloses it (recursion)
            "top": (names.gather(parent) != names).fill_null(True),
        }
    )


def _walked(timed: pl.DataFrame) -> pl.DataFrame:
    """:func:`self_times` by the C walk (``timed``: operators with a start and an end), in the rows'
    own order: only the walk's order is sorted out (a permutation, not a sorted copy of the rows),
    the integer columns are gathered into it one by one, and the results put back."""
    # The order and the threads by numpy, whose arrays go back to the system when freed (polars'
    # sort keys stayed in its allocator: this step's peak on a 0.5 GB DDP trace was +90 MB, now
    # +45 MB). A stable sort by thread (a null pid or tid first), then start, then end descending
    # (``~end``), as polars' ``arg_sort_by(..., maintain_order=True)`` orders them.
    (pid_known, pid), (tid_known, tid) = (
        (column.is_not_null().to_numpy(), column.fill_null(0).to_numpy())
        for column in (timed.get_column("pid"), timed.get_column("tid"))
    )
    ts, end = timed.get_column("ts").to_numpy(), timed.get_column("end").to_numpy()
    positions = np.lexsort((np.invert(end), ts, tid, tid_known, pid, pid_known))
    # A thread starts where pid or tid changes, and at every row where either is null (as polars'
    # ``(pid != pid.shift()) | (tid != tid.shift())``, its nulls taken as a change).
    pid, tid = pid[positions], tid[positions]
    whole = (pid_known & tid_known)[positions]
    new_thread = np.ones(len(positions), dtype=bool)
    new_thread[1:] = (pid[1:] != pid[:-1]) | (tid[1:] != tid[:-1]) | ~whole[1:] | ~whole[:-1]
    del pid, tid, whole, pid_known, tid_known
    arrays = [np.cumsum(new_thread, dtype=np.int64)]
    del new_thread
    arrays += [
        np.ascontiguousarray(ts[positions], dtype=np.int64),
        np.ascontiguousarray(end[positions], dtype=np.int64),
    ]
    arrays.append(np.ascontiguousarray(timed.get_column("dur").to_numpy()[positions], dtype=np.int64))
    parent = np.empty(len(positions), dtype=np.int64)
    own = np.empty(len(positions), dtype=np.int64)
    _nesting.self_times(*arrays, parent, own)
    del arrays
    self_ns = np.empty_like(own)
    self_ns[positions] = own
    del own
    called = parent >= 0
    caller = np.full(len(positions), -1, dtype=np.int64)
    caller[positions[called]] = positions[parent[called]]
    del parent, called, positions
    names = timed.get_column("name")
    callers = series(caller).set(series(caller < 0), None)
    return pl.DataFrame(
        {
            "name": names,
            "dur": timed.get_column("dur"),
            "self": series(self_ns, dtype=pl.Int64),
            "top": (names.gather(callers) != names).fill_null(True),
        }
    )


def host_summary(trace: Trace, top: int = 10) -> Host:
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
    return Host(
        threads=threads,
        cpu_ops=ops.height,
        python_frames=trace.python.height,
        dataloader_ns=int(dataloader.get_column("dur").sum()),
        dataloader_count=dataloader.height,
        top_ops=tuple(
            HostOp(name=name, count=count, total_ns=total, self_ns=int(own))
            for name, count, total, own in ranked.select("name", "count", "total", "self").iter_rows()
        ),
    )
