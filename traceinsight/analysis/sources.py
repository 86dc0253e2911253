"""Tie host moments to the user's source line and to the operators that enclose them.

Python frames (``with_stack=True``) enclose operators by time on the same thread. The user's line
is the innermost frame whose file is the user's own (see :func:`taxonomy.is_user_file`), else the
innermost third-party library frame, marked as such. 2020-21 traces have no frames but carry a
``Call stack`` string on operators: its first user (else library) entry is used.

What a frame's line is (``source_line_kind``) depends on who wrote the frame:

- ``call``: the line of the call the frame was making. ``traceinsight run``'s call-site frames
  (``"Call site": 1``) and the 2020-21 ``Call stack`` entries are named so.
- ``def``: the function's first line (``co_firstlineno``). torch's own tracer names every frame it
  sees entered this way, and so do ``run``'s function frames (``"Call site": 0``): the frame says
  which function was running, not which of its lines.
- ``recording-start``: the line a function was on when recording began. torch's tracer names the
  frames already running at its start so (a training loop's frame shows its ``prof.step()`` line
  for the whole window). They are found as torch records them: per thread, a chain of frames
  (each the parent of the next, the first without one) that starts before any operator, runtime
  call or built-in call of the trace was recorded.
- ``entry``: torch names a frame by its def line, but a generator resumed mid-body by the line of
  its ``yield`` (``torch/utils/_pytree.py(917): tree_iter``, then ``(931)``, ``(923)``). When one
  caller's frame (one ``Python parent id``) entered a function of one file and name at several
  lines, those lines are one generator resumed or several functions of that name called in turn
  (vllm's ``update_state`` methods): the trace cannot say which, so no line of them is a known def
  line. Every such frame is named by the lowest line of the set (linked through any caller that
  entered two of them), the same for all: one name for one generator, and never "defined at" a
  ``yield``. Same-named functions entered under different callers (several ``forward`` methods,
  each under its own ``_call_impl``) are told apart and keep their def lines.
- None: a frame without torch's ``Python id`` and without ``run``'s mark (an older ``run`` trace,
  another tool): its line may be either.

A sync inside framework code that reads GPU values by design (``torch.optim.LBFGS``'s line
search, :data:`taxonomy.DESIGNED_SYNCS`) is named (``framework_call``) when that code runs below the
chosen line: the line calls it, the sync is the framework's.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Collection
from typing import Final, Protocol

import polars as pl

from traceinsight.analysis.intervals import joined_where, meeting, outermost_first
from traceinsight.load import Trace, taxonomy

#: Packages whose frames are never shown as "library code" in place of the user's line: the
#: framework itself and the Python machinery a script runs in.
_FRAMEWORK_PACKAGES = frozenset(
    {"torch", "torchvision", "torchaudio", "functorch", "triton", "traceinsight", "runpy"}
)

#: ``source_kind`` values.
USER, LIBRARY = "user", "library"
#: ``source_line_kind`` values (see the module doc).
CALL, DEF, RECORDING_START, ENTRY = (kind.value for kind in taxonomy.LineKind)

#: The columns :func:`source_at` returns besides ``key``.
SOURCE_COLUMNS: pl.Schema = pl.Schema(
    {
        "source": pl.String(),
        "source_kind": pl.String(),
        "source_line_kind": pl.String(),
        "source_function": pl.String(),
        "framework_call": pl.String(),
    }
)
#: A frame's rank when choosing the line: the user's own code, then library code; framework code
#: that syncs by design is never the line but is named beside it.
_USER_RANK, _LIBRARY_RANK, _DESIGNED_RANK = 2, 1, 0


class Located(Protocol):
    """A result that names a source line (an idle gap, a sync hot spot, a latent sync)."""

    @property
    def source(self) -> str | None:
        """``file:line``."""

    @property
    def source_kind(self) -> str | None:
        """``user`` or ``library``."""

    @property
    def source_line_kind(self) -> str | None:
        """``call``, ``def``, ``recording-start`` or None (not said)."""

    @property
    def source_function(self) -> str | None:
        """The function the line is in."""


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
    """Map each distinct frame name to ``source`` (``file:line``), ``function`` and ``rank`` (2 user,
    1 library, 0 framework code that syncs by design, named in ``framework_call``); other framework and
    standard-library frames are dropped."""
    rows: list[tuple[str, str, str, int, str | None]] = []
    for name in names.unique().to_list():
        frame = taxonomy.parse_frame(name)
        if frame is None:
            continue
        kind = frame_kind(frame.file, user_code)
        if kind is not None:
            rows.append(
                (name, frame.location, frame.function, _USER_RANK if kind == USER else _LIBRARY_RANK, None)
            )
        designed = taxonomy.designed_sync(frame.file, frame.function) if kind != USER else None
        if designed is not None:  # a library's frame may be both a line to name and such code
            rows.append((name, frame.location, frame.function, _DESIGNED_RANK, designed))
    return pl.DataFrame(
        rows,
        schema={
            "name": pl.String,
            "source": pl.String,
            "function": pl.String,
            "rank": pl.Int8,
            "framework_call": pl.String,
        },
        orient="row",
    )


def recording_start_frames(trace: Trace) -> pl.DataFrame:
    """``pid, tid, python_id`` of the frames torch's tracer found running when it started (their
    line is where each function was then, not a call's): per thread, the chain of frames that
    starts the thread's record (the first without a parent, each next one the child of the one
    before), all begun before any operator, annotation, runtime call or built-in call was recorded
    (torch records them first, in one pass, before it traces anything)."""
    empty = pl.DataFrame(schema={"pid": pl.Int64, "tid": pl.Int64, "python_id": pl.Int64})
    python = trace.python
    if python.is_empty():
        return empty
    firsts = [table.get_column("ts").min() for table in (trace.cpu_ops, trace.annotations, trace.runtime)]
    bound = min((first for first in firsts if isinstance(first, int)), default=None)
    candidates = python.filter(pl.col("python_id").is_not_null())
    if bound is not None:
        candidates = candidates.filter(pl.col("ts") < bound)
    builtin = candidates.filter(pl.col("name").str.starts_with("<built-in")).get_column("ts").min()
    if isinstance(builtin, int):
        candidates = candidates.filter(pl.col("ts") < builtin)
    if candidates.is_empty():
        return empty
    previous = pl.col("python_id").shift(1).over("pid", "tid")
    linked = (
        pl.when(previous.is_null())
        .then(pl.col("parent_id").is_null())
        .otherwise(pl.col("parent_id") == previous)
        .fill_null(False)
    )
    return (
        candidates.lazy()
        .select("pid", "tid", "ts", "python_id", "parent_id", "name")
        .sort("pid", "tid", "ts", "python_id")
        .with_columns(chain=linked.cast(pl.Int8).cum_min().over("pid", "tid"))
        .filter(pl.col("chain") == 1)
        .select("pid", "tid", "python_id")
        .collect(engine="in-memory")
    )


def entered_lines(trace: Trace, located: pl.DataFrame, at_start: pl.DataFrame) -> pl.DataFrame:
    """``name, entry_source``: for each frame name whose function (same file, same name) torch's
    tracer saw entered at several lines under one caller, the lowest line of those linked so
    (``file:line``); see the module doc (``entry``). ``located``: :func:`_frame_locations`'s table;
    ``at_start``: the frames of :func:`recording_start_frames` (their lines are not entries).

    Lines are linked when one caller's frame (``Python parent id``) entered the function at both,
    and transitively; frames ``run`` wrote (``call_site``), frames without a ``Python id`` or a
    parent, and frames running when recording began are left out."""
    empty = pl.DataFrame(schema={"name": pl.String, "entry_source": pl.String})
    candidates: dict[str, tuple[str, str, int]] = {}
    lines_of: dict[tuple[str, str], set[int]] = {}
    for name in located.get_column("name").unique().to_list():
        frame = taxonomy.parse_frame(name)
        if frame is None:
            continue
        candidates[name] = (frame.file, frame.function, frame.line)
        lines_of.setdefault((frame.file, frame.function), set()).add(frame.line)
    several = {name: key for name, key in candidates.items() if len(lines_of[key[:2]]) > 1}
    if not several or trace.python.is_empty():
        return empty
    frames = (
        trace.python.lazy()
        .filter(
            pl.col("name").is_in(list(several))
            & pl.col("python_id").is_not_null()
            & pl.col("parent_id").is_not_null()
            & pl.col("call_site").is_null()
        )
        .select("pid", "tid", "python_id", "parent_id", "name")
        .join(at_start.lazy().select("pid", "tid", "python_id"), on=["pid", "tid", "python_id"], how="anti")
        .unique(["pid", "tid", "parent_id", "name"])
        .collect(engine="in-memory")
    )
    # one caller's distinct names of the function (same file and function, several lines)
    parent: dict[tuple[str, str, int], tuple[str, str, int]] = {}

    def root(node: tuple[str, str, int]) -> tuple[str, str, int]:
        while parent.get(node, node) != node:
            node = parent[node]
        return node

    callers: dict[tuple[int, int, int, str, str], int] = {}
    for pid, tid, caller, name in frames.select("pid", "tid", "parent_id", "name").iter_rows():
        file, function, line = several[name]
        node = (file, function, line)
        seen = callers.setdefault((pid, tid, caller, file, function), line)
        if seen != line:
            first, second = root((file, function, seen)), root(node)
            if first != second:
                low, high = sorted((first, second), key=lambda item: item[2])
                parent[high] = low
                parent.setdefault(low, low)
    rows = [
        (name, f"{low[0]}:{low[2]}")
        for name, node in several.items()
        if node in parent
        for low in [root(node)]
    ]
    return pl.DataFrame(rows, schema=empty.schema, orient="row") if rows else empty


class FrameIndex:
    """What :func:`source_at` needs of a trace whatever its points, made on first use and then kept:
    each distinct frame name's location and rank (:func:`_frame_locations`, with ``user_code``) and
    the frames running when the tracer started (:func:`recording_start_frames`).

    An analysis looks lines up three times on the main thread (the blocking calls, the gaps, the
    step leads) and, on a trace without GPU work, once beside it (the latent syncs); each lookup
    made both again: on a small trace about a quarter of a lookup's polars queries, and a Python
    pass over every distinct frame name. Made by whichever thread asks first (a lock)."""

    def __init__(self, trace: Trace, user_code: Collection[str] = ()) -> None:
        self.trace = trace
        self.user_code = user_code
        self._lock = threading.Lock()
        self._tables: tuple[pl.DataFrame, pl.DataFrame] | None = None

    def tables(self) -> tuple[pl.DataFrame, pl.DataFrame]:
        """``located`` (``name, source, function, rank, framework_call, entry_source``: the last
        from :func:`entered_lines`, null for most names) and ``at_start`` (``pid, tid, python_id,
        at_start``: the frames of :func:`recording_start_frames`)."""
        with self._lock:
            if self._tables is None:
                located = _frame_locations(self.trace.python.get_column("name"), self.user_code)
                at_start = recording_start_frames(self.trace).with_columns(at_start=pl.lit(True))
                located = located.join(
                    entered_lines(self.trace, located, at_start), on="name", how="left", maintain_order="left"
                )
                self._tables = (located, at_start)
            return self._tables


#: What a frame tells of its line (:data:`SOURCE_COLUMNS` before they are named so).
_LINE_COLUMNS: Final = ("source", "function", "framework_call", "line_kind")


def _line_kind() -> pl.Expr:
    """Each Python frame's ``source_line_kind`` (see the module doc), as an expression over
    ``trace.python`` joined with :func:`recording_start_frames` (column ``at_start``)."""
    return (
        pl.when(pl.col("call_site") == 1)
        .then(pl.lit(CALL))
        .when(pl.col("call_site") == 0)
        .then(pl.lit(DEF))
        .when(pl.col("python_id").is_null())
        .then(pl.lit(None, pl.String))
        .when(pl.col("at_start"))
        .then(pl.lit(RECORDING_START))
        # a module's code begins at line 1: a `<module>` frame named at another line was already
        # running when recording began, and the line is where it was then, not a definition
        .when((pl.col("function") == "<module>") & ~pl.col("source").str.ends_with(":1").fill_null(False))
        .then(pl.lit(RECORDING_START))
        .otherwise(pl.lit(DEF))
    )


def _first_entry(stack: str, user_code: Collection[str]) -> tuple[str, str, int] | None:
    """The innermost user frame of a 2021 ``Call stack`` ("a.py(3): f;b.py(9): g", innermost first),
    else its innermost library frame: its location, function and rank (2 user, 1 library)."""
    library: tuple[str, str, int] | None = None
    for entry in stack.split(";"):
        frame = taxonomy.parse_frame(entry.strip())
        if frame is None:
            continue
        kind = frame_kind(frame.file, user_code)
        if kind == USER:
            return frame.location, frame.function, _USER_RANK
        if kind == LIBRARY and library is None:
            library = (frame.location, frame.function, _LIBRARY_RANK)
    return library


def _instants(points: pl.DataFrame) -> pl.DataFrame:
    """Each point's time ``t`` as a window ``[t, t + 1)``: meeting it means containing ``t``."""
    return points.select(start="t", end=pl.col("t") + 1)


def _designed_ranges(trace: Trace, instants: pl.DataFrame) -> pl.DataFrame:
    """Host ranges torch records around framework code that syncs by design
    (:data:`taxonomy.DESIGNED_SYNC_ANNOTATIONS`), meeting ``instants``: ``pid, tid, rank, f_ts,
    f_end, source, function, framework_call, line_kind`` like the frames they stand in for."""
    names = taxonomy.DESIGNED_SYNC_ANNOTATIONS
    ranges = trace.annotations.filter(pl.col("name").is_in(list(names)))
    if ranges.is_empty():
        return pl.DataFrame()
    return meeting(
        ranges.select(
            "pid",
            "tid",
            rank=pl.lit(_DESIGNED_RANK, pl.Int8),
            f_ts="ts",
            f_end="end",
            source=pl.lit(None, pl.String),
            function=pl.lit(None, pl.String),
            framework_call=pl.col("name").replace_strict(names, return_dtype=pl.String),
            line_kind=pl.lit(None, pl.String),
        ),
        "f_ts",
        "f_end",
        instants,
    )


def source_at(
    trace: Trace,
    points: pl.DataFrame,
    user_code: Collection[str] = (),
    *,
    frame_index: FrameIndex | None = None,
) -> pl.DataFrame:
    """For rows ``key, pid, tid, t`` return ``key`` and :data:`SOURCE_COLUMNS`: the line active at
    time t, what kind of line it is, its function, and the framework code below it that syncs by
    design (if any).

    Frames containing ``t`` on the same pid/tid are found with an inequality join; the innermost
    frame of the user's own code wins (``source_kind`` ``user``; the innermost: the latest to start,
    then the first to end, then the last recorded, :func:`.intervals.outermost_first`). When every frame
    there is library code, the innermost third-party frame is named instead (``library``: vllm,
    transformers ...; never torch or the standard library), so a report always points somewhere a
    user can look. ``user_code`` names packages whose frames count as the user's (``--user-code``).
    Without frames, the innermost enclosing operator's 2020-21 ``Call stack`` is used the same way.
    ``framework_call`` is the outermost frame (or torch range, such as ``Optimizer.step#LBFGS.step``) of
    :data:`taxonomy.DESIGNED_SYNCS` containing t that began inside the chosen line's frame.
    ``frame_index``: the trace's :class:`FrameIndex` (with the same ``user_code``) when the caller keeps
    one for several lookups.
    """
    if frame_index is not None and (
        frame_index.trace is not trace or frozenset(frame_index.user_code) != frozenset(user_code)
    ):
        raise ValueError("source_at: frames were indexed for another trace or other user code")
    empty = pl.DataFrame(schema=pl.Schema({"key": points.schema["key"], **SOURCE_COLUMNS}))
    if points.is_empty():
        return empty
    found = empty
    instants = _instants(points)
    kind = pl.when(pl.col("rank") == _USER_RANK).then(pl.lit(USER)).otherwise(pl.lit(LIBRARY))
    if trace.python.height or trace.annotations.height:
        located, at_start = (frame_index or FrameIndex(trace, user_code)).tables()
        # Only the columns used are joined, filtered and sorted: each of those copies what it keeps,
        # and an LLM decode trace has a million frames (tens of MB at the analysis's memory peak).
        # The frames meeting a point are found first (a binary search per frame), and only those
        # joined with their names' locations: on an LLM decode trace that is a fraction of the
        # million frames (the join on names was a fifth of this step's time).
        frames = (
            meeting(
                trace.python.select("pid", "tid", "ts", "end", "name", "python_id", "call_site"),
                "ts",
                "end",
                instants,
            )
            .lazy()
            .join(located.lazy(), on="name", how="inner", maintain_order="left")
            .join(at_start.lazy(), on=["pid", "tid", "python_id"], how="left", maintain_order="left")
            .with_columns(pl.col("at_start").fill_null(False))
            .select(
                "pid",
                "tid",
                "rank",
                f_ts="ts",
                f_end="end",
                function="function",
                framework_call="framework_call",
                line_kind=_line_kind(),
                entry_source="entry_source",
                source="source",
            )
            # a frame named at one of several lines its function was entered at under one caller:
            # the lowest of them, for every such frame, and no def line claimed (module doc: entry)
            .with_columns(
                pl.when((pl.col("line_kind") == DEF) & pl.col("entry_source").is_not_null())
                .then(pl.col("entry_source"))
                .otherwise(pl.col("source"))
                .alias("source"),
                pl.when((pl.col("line_kind") == DEF) & pl.col("entry_source").is_not_null())
                .then(pl.lit(ENTRY))
                .otherwise(pl.col("line_kind"))
                .alias("line_kind"),
            )
            .select(
                "pid", "tid", "rank", "f_ts", "f_end", "source", "function", "framework_call", "line_kind"
            )
            .collect(engine="in-memory")
        )
        designed = _designed_ranges(trace, instants)
        if designed.height:
            frames = pl.concat([frames, designed])
        if frames.height:
            # Each frame's row (the trace's order) breaks ties on start and end.
            met = (
                joined_where(
                    points.lazy(),
                    frames.with_row_index("f_row").lazy(),
                    pl.col("t") >= pl.col("f_ts"),
                    pl.col("t") <= pl.col("f_end"),
                )
                .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
                .select("key", "rank", "f_ts", "f_end", "f_row", *_LINE_COLUMNS)
                .collect(engine="in-memory")
                .lazy()
            )
            # The innermost of the highest rank: the last (:func:`.intervals.outermost_first`).
            lines = (
                met.filter(pl.col("rank") > _DESIGNED_RANK)
                .sort(**outermost_first("f_ts", "f_end", "f_row", first_by=("rank",)))
                .group_by("key")
                .agg(
                    pl.col("source").last(),
                    pl.col("rank").last(),
                    pl.col("function").last(),
                    pl.col("line_kind").last(),
                    line_from=pl.col("f_ts").last(),
                )
                .collect(engine="in-memory")
                .lazy()
            )
            below = (
                met.filter(pl.col("rank") == _DESIGNED_RANK)
                .join(lines.select("key", "line_from"), on="key", how="left")
                .filter(pl.col("line_from").is_null() | (pl.col("f_ts") >= pl.col("line_from")))
                .sort(**outermost_first("f_ts", "f_end", "f_row"))
                .group_by("key")
                .agg(pl.col("framework_call").first())
            )
            found = (
                lines.join(below, on="key", how="full", coalesce=True)
                .select(
                    "key",
                    "source",
                    source_kind=pl.when(pl.col("source").is_not_null()).then(kind),
                    source_line_kind="line_kind",
                    source_function="function",
                    framework_call="framework_call",
                )
                .cast(SOURCE_COLUMNS)
                .collect(engine="in-memory")
            )
    if found.filter(pl.col("source").is_not_null()).height < points.height:
        # Ranges first, then operators: of a range and an operator that start and end together,
        # the operator is the inner one (rows break such ties below, the later the inner).
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
                for table in (trace.annotations, trace.cpu_ops)
            ]
        )
        if stacks.height:
            missing = points.join(found.filter(pl.col("source").is_not_null()), on="key", how="anti")
            by_stack = (
                joined_where(
                    missing.lazy(),
                    stacks.with_row_index("s_row").lazy().rename({"ts": "s_ts", "end": "s_end"}),
                    pl.col("t") >= pl.col("s_ts"),
                    pl.col("t") <= pl.col("s_end"),
                )
                .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
                .sort(**outermost_first("s_ts", "s_end", "s_row"))  # the innermost last
                .group_by("key")
                .agg(pl.col("call_stack").last())
                .collect(engine="in-memory")
            )
            if by_stack.height:
                entries = {
                    stack: _first_entry(stack, user_code)
                    for stack in by_stack.get_column("call_stack").unique()
                }
                stack_lines = pl.DataFrame(
                    [(stack, *entry) for stack, entry in entries.items() if entry is not None],
                    schema={
                        "call_stack": pl.String,
                        "source": pl.String,
                        "function": pl.String,
                        "rank": pl.Int8,
                    },
                    orient="row",
                )
                by_stack = (
                    by_stack.lazy()
                    .join(stack_lines.lazy(), on="call_stack", how="inner")
                    .join(found.lazy().select("key", "framework_call"), on="key", how="left")
                    .select(
                        "key",
                        "source",
                        source_kind=kind,
                        source_line_kind=pl.lit(CALL),
                        source_function="function",
                        framework_call="framework_call",
                    )
                    .cast(SOURCE_COLUMNS)
                    .collect(engine="in-memory")
                )
                found = pl.concat([found.join(by_stack, on="key", how="anti"), by_stack])
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
        joined_where(points.lazy(), ops.lazy(), pl.col("t") >= pl.col("o_ts"), pl.col("t") <= pl.col("o_end"))
        .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
        .sort(**outermost_first("o_ts", "o_end", "o_row"))
        .group_by("key")
        .agg(
            op=pl.col("o_name").first(),
            innermost=pl.col("o_name").last(),
            op_chain=pl.col("o_name").str.join(" > "),
        )
        .collect(engine="in-memory")
    )


def module_at(trace: Trace, points: pl.DataFrame) -> pl.DataFrame:
    """For rows ``key, pid, tid, t`` return ``key, module``: the innermost ``nn.Module`` whose forward
    was running at time t (from ``nn.Module: Name_N`` Python frames), e.g. ``BertModel``."""
    empty = pl.DataFrame(schema={"key": points.schema["key"], "module": pl.String})
    modules = trace.python.filter(pl.col("name").str.starts_with(taxonomy.MODULE_FRAME_PREFIX))
    if points.is_empty() or modules.is_empty():
        return empty
    frames = meeting(  # in the trace's order: its row breaks ties on start and end
        modules.select("pid", "tid", m_ts="ts", m_end="end", frame="name"), "m_ts", "m_end", _instants(points)
    ).with_row_index("m_row")
    if frames.is_empty():
        return empty
    names = {name: taxonomy.module_name(name) for name in frames.get_column("frame").unique().to_list()}
    return (
        joined_where(
            points.lazy(), frames.lazy(), pl.col("t") >= pl.col("m_ts"), pl.col("t") <= pl.col("m_end")
        )
        .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
        .sort(**outermost_first("m_ts", "m_end", "m_row"))
        .group_by("key")
        .agg(pl.col("frame").last())
        .select("key", module=pl.col("frame").replace_strict(names, return_dtype=pl.String))
        .collect(engine="in-memory")
    )
