"""Tie host moments to the user's source line and to the operators that enclose them.

Python frames (``with_stack=True``) enclose operators by time on the same thread. The user's line
is the innermost frame whose file is the user's own (see :func:`taxonomy.is_user_file`), else the
innermost third-party library frame, marked as such. 2020-21 traces have no frames but carry a
``Call stack`` string on operators: its first user (else library) entry is used.
"""

from __future__ import annotations

import sys
from collections.abc import Collection

import polars as pl

from traceinsight.analysis.intervals import meeting
from traceinsight.load import Trace, taxonomy

#: Packages whose frames are never shown as "library code" in place of the user's line: the
#: framework itself and the Python machinery a script runs in.
_FRAMEWORK_PACKAGES = frozenset(
    {"torch", "torchvision", "torchaudio", "functorch", "triton", "traceinsight", "runpy"}
)

#: ``source_kind`` values.
USER, LIBRARY = "user", "library"


def frame_kind(file: str, user_code: Collection[str]) -> str | None:
    """``user`` for the user's own file, ``library`` for third-party code (vllm, transformers ...),
    None for the framework, the standard library and built-ins."""
    if taxonomy.is_user_file(file, user_code):
        return USER
    package = taxonomy.top_package(file)
    if package is None or file.startswith("<") or package in _FRAMEWORK_PACKAGES:
        return None
    if (
        package in sys.stdlib_module_names
        or "/lib/python3" in file.replace("\\", "/").split("site-packages")[0]
    ):
        return None
    return LIBRARY


def _frame_locations(names: pl.Series, user_code: Collection[str]) -> pl.DataFrame:
    """Map each distinct frame name to ``source`` (``file:line``) and ``rank`` (2 user, 1 library);
    framework and standard-library frames are dropped."""
    rows: list[tuple[str, str, int]] = []
    for name in names.unique().to_list():
        frame = taxonomy.parse_frame(name)
        if frame is None:
            continue
        kind = frame_kind(frame.file, user_code)
        if kind is not None:
            rows.append((name, frame.location, 2 if kind == USER else 1))
    return pl.DataFrame(rows, schema={"name": pl.String, "source": pl.String, "rank": pl.Int8}, orient="row")


def _first_entry(stack: str, user_code: Collection[str]) -> tuple[str, int] | None:
    """The innermost user frame of a 2021 ``Call stack`` ("a.py(3): f;b.py(9): g", innermost first),
    else its innermost library frame, with its rank (2 user, 1 library)."""
    library: tuple[str, int] | None = None
    for entry in stack.split(";"):
        frame = taxonomy.parse_frame(entry.strip())
        if frame is None:
            continue
        kind = frame_kind(frame.file, user_code)
        if kind == USER:
            return frame.location, 2
        if kind == LIBRARY and library is None:
            library = (frame.location, 1)
    return library


def _instants(points: pl.DataFrame) -> pl.DataFrame:
    """Each point's time ``t`` as a window ``[t, t + 1)``: meeting it means containing ``t``."""
    return points.select(start="t", end=pl.col("t") + 1)


def source_at(trace: Trace, points: pl.DataFrame, user_code: Collection[str] = ()) -> pl.DataFrame:
    """For rows ``key, pid, tid, t`` return ``key, source, source_kind``: the line active at time t.

    Frames containing ``t`` on the same pid/tid are found with an inequality join; the innermost
    (latest-starting) frame of the user's own code wins (``source_kind`` ``user``). When every frame
    there is library code, the innermost third-party frame is named instead (``library``: vllm,
    transformers ...; never torch or the standard library), so a report always points somewhere a
    user can look. ``user_code`` names packages whose frames count as the user's (``--user-code``).
    Without frames, the innermost enclosing operator's 2020-21 ``Call stack`` is used the same way.
    """
    empty = pl.DataFrame(
        schema=pl.Schema({"key": points.schema["key"], "source": pl.String(), "source_kind": pl.String()})
    )
    if points.is_empty():
        return empty
    found = empty
    instants = _instants(points)
    kind = pl.when(pl.col("rank") == 2).then(pl.lit(USER)).otherwise(pl.lit(LIBRARY))
    if trace.python.height:
        located = _frame_locations(trace.python.get_column("name"), user_code)
        # Only the columns used are joined, filtered and sorted: each of those copies what it keeps,
        # and an LLM decode trace has a million frames (tens of MB at the analysis's memory peak).
        frames = meeting(
            trace.python.select("pid", "tid", "ts", "end", "name")
            .join(located, on="name", how="inner")
            .select("pid", "tid", "rank", f_ts="ts", f_end="end", source="source"),
            "f_ts",
            "f_end",
            instants,
        )
        if frames.height:
            found = (
                points.join_where(frames, pl.col("t") >= pl.col("f_ts"), pl.col("t") <= pl.col("f_end"))
                .select(
                    "key",
                    "rank",
                    "f_ts",
                    "source",
                    same_thread=(pl.col("pid") == pl.col("pid_right"))
                    & (pl.col("tid") == pl.col("tid_right")),
                )
                .filter("same_thread")
                .sort("rank", "f_ts")
                .group_by("key")
                .agg(pl.col("source").last(), pl.col("rank").last())
                .select("key", "source", source_kind=kind)
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
                entries = {
                    stack: _first_entry(stack, user_code)
                    for stack in by_stack.get_column("call_stack").unique()
                }
                located = pl.DataFrame(
                    [(stack, entry[0], entry[1]) for stack, entry in entries.items() if entry is not None],
                    schema={"call_stack": pl.String, "source": pl.String, "rank": pl.Int8},
                    orient="row",
                )
                by_stack = by_stack.join(located, on="call_stack", how="inner").select(
                    "key", "source", source_kind=kind
                )
                found = pl.concat([found, by_stack])
    return found


def enclosing_ops(trace: Trace, points: pl.DataFrame) -> pl.DataFrame:
    """For rows ``key, pid, tid, t`` return ``key, op (outermost), innermost, op_chain``.

    Every cpu op on the same thread whose interval contains t, ordered by start (outermost first);
    ops with the same start and end (``aten::to`` and the ``aten::_to_copy`` it calls, within a
    µs) in file order, which Kineto writes parent first.
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
        trace.cpu_ops.select("pid", "tid", o_ts="ts", o_end="end", o_name="name").with_row_index("o_row"),
        "o_ts",
        "o_end",
        _instants(points),
    )
    return (
        points.join_where(ops, pl.col("t") >= pl.col("o_ts"), pl.col("t") <= pl.col("o_end"))
        .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
        .sort("o_ts", "o_end", "o_row", descending=[False, True, False])
        .group_by("key")
        .agg(
            op=pl.col("o_name").first(),
            innermost=pl.col("o_name").last(),
            op_chain=pl.col("o_name").str.join(" > "),
        )
    )


def module_at(trace: Trace, points: pl.DataFrame) -> pl.DataFrame:
    """For rows ``key, pid, tid, t`` return ``key, module``: the innermost ``nn.Module`` whose forward
    was running at time t (from ``nn.Module: Name_N`` Python frames), e.g. ``BertModel``."""
    empty = pl.DataFrame(schema={"key": points.schema["key"], "module": pl.String})
    modules = trace.python.filter(pl.col("name").str.starts_with(taxonomy.MODULE_FRAME_PREFIX))
    if points.is_empty() or modules.is_empty():
        return empty
    frames = meeting(
        modules.select("pid", "tid", m_ts="ts", m_end="end", frame="name"), "m_ts", "m_end", _instants(points)
    )
    if frames.is_empty():
        return empty
    names = {name: taxonomy.module_name(name) for name in frames.get_column("frame").unique().to_list()}
    return (
        points.join_where(frames, pl.col("t") >= pl.col("m_ts"), pl.col("t") <= pl.col("m_end"))
        .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
        .sort("m_ts")
        .group_by("key")
        .agg(pl.col("frame").last())
        .select("key", module=pl.col("frame").replace_strict(names, return_dtype=pl.String))
    )
