"""Tie host moments to the user's source line and to the operators that enclose them.

Python frames (``with_stack=True``) enclose operators by time on the same thread. The user's line
is the innermost frame whose file is the user's own (see :func:`taxonomy.is_user_file`). 2020-21
traces have no frames but carry a ``Call stack`` string on operators: its first user entry is used.
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceinsight.analysis.intervals import meeting
from traceinsight.load import Trace, taxonomy


def _user_frame_locations(names: pl.Series, user_code: Collection[str]) -> pl.DataFrame:
    """Map each distinct frame name to ``file:line`` when it is user code (others dropped)."""
    rows: list[tuple[str, str]] = []
    for name in names.unique().to_list():
        frame = taxonomy.parse_frame(name)
        if frame is not None and taxonomy.is_user_file(frame.file, user_code):
            rows.append((name, frame.location))
    return pl.DataFrame(rows, schema={"name": pl.String, "source": pl.String}, orient="row")


def _first_user_entry(stack: str, user_code: Collection[str]) -> str | None:
    """The innermost user frame of a 2021 ``Call stack`` ("a.py(3): f;b.py(9): g", innermost first)."""
    for entry in stack.split(";"):
        frame = taxonomy.parse_frame(entry.strip())
        if frame is not None and taxonomy.is_user_file(frame.file, user_code):
            return frame.location
    return None


def _instants(points: pl.DataFrame) -> pl.DataFrame:
    """Each point's time ``t`` as a window ``[t, t + 1)``: meeting it means containing ``t``."""
    return points.select(start="t", end=pl.col("t") + 1)


def source_at(trace: Trace, points: pl.DataFrame, user_code: Collection[str] = ()) -> pl.DataFrame:
    """For rows ``key, pid, tid, t`` return ``key, source``: the user's line active at time t.

    ``user_code`` names packages whose frames count as the user's (see :func:`taxonomy.is_user_file`).

    Frames containing ``t`` on the same pid/tid are found with an inequality join; the latest-starting
    (innermost) user frame wins. Without frames, the innermost enclosing operator's call stack is used.
    """
    empty = pl.DataFrame(schema={"key": points.schema["key"], "source": pl.String})
    if points.is_empty():
        return empty
    found = empty
    instants = _instants(points)
    if trace.python.height:
        user = _user_frame_locations(trace.python.get_column("name"), user_code)
        frames = meeting(
            trace.python.join(user, on="name", how="inner").select(
                "pid", "tid", f_ts="ts", f_end="end", source="source"
            ),
            "f_ts",
            "f_end",
            instants,
        )
        if frames.height:
            found = (
                points.join_where(frames, pl.col("t") >= pl.col("f_ts"), pl.col("t") <= pl.col("f_end"))
                .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
                .sort("f_ts")
                .group_by("key")
                .agg(pl.col("source").last())
            )
    if found.height < points.height:
        stacks = pl.concat(
            [
                meeting(
                    table.filter(pl.col("call_stack").is_not_null()).select(
                        "pid", "tid", "ts", "end", "call_stack"
                    ),
                    "ts",
                    "end",
                    instants,
                )
                for table in (trace.cpu_ops, trace.annotations)
            ]
        )
        if stacks.height:
            missing = points.join(found, on="key", how="anti")
            by_stack = (
                missing.join_where(
                    stacks.rename({"ts": "s_ts", "end": "s_end"}),
                    pl.col("t") >= pl.col("s_ts"),
                    pl.col("t") <= pl.col("s_end"),
                )
                .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
                .sort("s_ts")
                .group_by("key")
                .agg(pl.col("call_stack").last())
            )
            if by_stack.height:
                locations = {
                    stack: _first_user_entry(stack, user_code)
                    for stack in by_stack.get_column("call_stack").unique()
                }
                by_stack = by_stack.select(
                    "key",
                    source=pl.col("call_stack").replace_strict(locations, return_dtype=pl.String),
                )
                found = pl.concat([found, by_stack.filter(pl.col("source").is_not_null())])
    return found


def enclosing_ops(trace: Trace, points: pl.DataFrame) -> pl.DataFrame:
    """For rows ``key, pid, tid, t`` return ``key, op (outermost), innermost, op_chain``.

    Every cpu op on the same thread whose interval contains t, ordered by start (outermost first).
    """
    schema = pl.Schema(
        [
            ("key", points.schema["key"]),
            ("op", pl.String()),
            ("innermost", pl.String()),
            ("op_chain", pl.String()),
        ]
    )
    if points.is_empty() or trace.cpu_ops.is_empty():
        return pl.DataFrame(schema=schema)
    ops = meeting(
        trace.cpu_ops.select("pid", "tid", o_ts="ts", o_end="end", o_name="name"),
        "o_ts",
        "o_end",
        _instants(points),
    )
    return (
        points.join_where(ops, pl.col("t") >= pl.col("o_ts"), pl.col("t") <= pl.col("o_end"))
        .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
        .sort("o_ts", pl.col("o_end"), descending=[False, True])
        .group_by("key")
        .agg(
            op=pl.col("o_name").first(),
            innermost=pl.col("o_name").last(),
            op_chain=pl.col("o_name").str.join(" > "),
        )
    )
