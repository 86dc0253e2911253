"""Syncs waiting to happen: in a trace without GPU work, the operators that would make the host
wait for a GPU (``.item()``, ``if tensor:``, ``nonzero``, boolean-mask indexing ...), with the
line and the module that run them, so a CPU run already says where a GPU run will stall.

Only values that would be on the GPU once the model is count. Two kinds read CPU values whatever
the device, and are kept apart (:attr:`LatentSync.cpu_value`), never reported as would-be syncs:

- **data loading**: everything inside the DataLoader's ``__next__`` (``enumerate(DataLoader)#…``:
  the sampler, the Dataset's ``__getitem__``, its transforms, collate) runs on CPU tensors, in the
  main process or in workers (torchvision's FakeData calls ``.item()``, Normalize an ``if``);
- **optimizer step counters**: the ``.item()`` of an ``Optimizer.step#`` range of an optimizer
  whose step counters stay on the CPU (:data:`taxonomy.CPU_STEP_COUNTER_OPTIMIZERS`: Adam, AdamW
  …; with ``capturable``/``fused`` they call no ``.item()`` at all), unless it runs in the user's
  own code called from the step (an LBFGS closure, a hand-written optimizer).

What runs at one line is one would-be sync, however many operators it takes: ``print(loss)``
formats the tensor with a boolean-mask selection, several ``if``s and an ``.item()``, all one fix.
A line whose operators run inside a tensor's ``__repr__``/``__format__`` frame
(:data:`taxonomy.TENSOR_FORMAT_FRAME_PATTERN`) is a tensor's formatting, counted once per format.
"""

from __future__ import annotations

from collections.abc import Collection

import polars as pl

from traceinsight.analysis.intervals import meeting, outermost_first, within
from traceinsight.analysis.results import COUNT
from traceinsight.analysis.sources import USER, FrameIndex, enclosing_ops, frame_kind, module_at, source_at
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model, field

__all__ = ["DATA_LOADING", "STEP_COUNTER", "LatentSync", "latent_syncs"]

#: :attr:`LatentSync.cpu_value` of reads inside the DataLoader's fetch.
DATA_LOADING = "data loading"
#: :attr:`LatentSync.cpu_value` of an optimizer's CPU step counters.
STEP_COUNTER = "optimizer step counters"


class LatentSync(Model, frozen=True, kw_only=True):
    """One would-be sync: what one line (or, without frames, one operator) runs that reads a value."""

    op: str
    """The operator seen most often there (``aten::item`` …)."""
    ops: tuple[str, ...] = ()
    """Every such operator the line runs, most frequent first."""
    op_chain: str | None = None
    source: str | None = None
    source_kind: str | None = None
    module: str | None = None
    """The ``nn.Module`` whose forward runs it (data-dependent control flow), if any."""
    count: int = field(default=0, metadata=COUNT)
    """Occurrences in the trace: of the line's formatting (one ``print(loss)``), else of its most
    frequent operator; for CPU-value reads (:attr:`cpu_value`), every read."""
    steady_count: int = field(default=0, metadata=COUNT)
    """Occurrences inside the steady-state steps."""
    steady_steps_with: int | None = field(default=None, metadata=COUNT)
    """Steady steps the line reads a value in at least once (None: a result stored before it)."""
    formatting: bool = False
    """True when the line formats a tensor (``print(loss)``, ``f"{loss}"``): its reads are that."""
    cpu_value: str | None = None
    """Set when the value read is on the CPU whatever the device (:data:`DATA_LOADING`,
    :data:`STEP_COUNTER`): not a would-be sync."""
    cpu_detail: str | None = None
    """Which: the DataLoader range or the optimizer (``Adam``), for :attr:`cpu_value`."""
    source_line_kind: str | None = None
    """What ``source``'s line is: ``call`` (the call's line), ``def`` (the first line of
    ``source_function``: torch's stack names a function so), ``recording-start`` (the line
    ``source_function`` was on when recording began), None when the trace does not say (see
    :mod:`traceinsight.analysis.sources`)."""
    source_function: str | None = None
    """The function ``source`` is in (``log_metrics``), when frames name it."""
    framework_call: str | None = None
    """Framework code the line calls that reads GPU values on the host by design
    (``torch.optim.LBFGS``: :data:`traceinsight.load.taxonomy.DESIGNED_SYNCS`), when the calls
    happen inside it."""


def latent_syncs(
    trace: Trace,
    steady: SteadySteps,
    user_code: Collection[str] = (),
    *,
    frame_index: FrameIndex | None = None,
) -> tuple[LatentSync, ...]:
    """Operators of :data:`taxonomy.LATENT_SYNC_OPS` not inside another one, grouped by line,
    module and framework code that syncs by design (by operator where no line is known), the
    CPU-resident reads apart (see the module doc); only for traces without GPU work (with a GPU,
    the real syncs are measured instead), and not for an accelerator this tool cannot read (MTIA,
    ...): there the operators did wait, on it. ``frame_index``: the trace's
    :class:`~traceinsight.analysis.sources.FrameIndex` when the caller keeps one."""
    if trace.has_gpu_activity or trace.meta.foreign_accelerator is not None:
        return ()
    ops = trace.cpu_ops.filter(pl.col("name").is_in(list(taxonomy.LATENT_SYNC_OPS))).with_row_index("key")
    if ops.is_empty():
        return ()
    ops = ops.with_columns(pl.col("key").cast(pl.Int64))
    nested = (
        ops.select("key", "pid", "tid", "ts", "end")
        .join_where(
            ops.select(o_key="key", o_pid="pid", o_tid="tid", o_ts="ts", o_end="end"),
            pl.col("o_ts") <= pl.col("ts"),
            pl.col("o_end") >= pl.col("end"),
            pl.col("o_key") != pl.col("key"),
        )
        .filter(
            (pl.col("pid") == pl.col("o_pid"))
            & (pl.col("tid") == pl.col("o_tid"))
            # two reads over the same span (``aten::item`` and its ``_local_scalar_dense`` within
            # the same µs) each hold the other: the earlier in the file is the outer one
            & (
                (pl.col("o_ts") < pl.col("ts"))
                | (pl.col("o_end") > pl.col("end"))
                | (pl.col("o_key") < pl.col("key"))
            )
        )
        .select("key")
        .unique()
    )
    outermost = ops.join(nested, on="key", how="anti")
    outermost = outermost.with_columns(
        steady=within(outermost.get_column("ts"), steady.windows) if steady.windows else pl.lit(True),
        step=steady.steady_step_of(outermost.get_column("ts")),
    )
    points = outermost.select("key", "pid", "tid", t=pl.col("ts") + 1)
    chains = enclosing_ops(trace, points).select("key", "op_chain")
    rows = (
        outermost.select("key", "steady", "step", op="name")
        .join(chains, on="key", how="left")
        .join(source_at(trace, points, user_code, frame_index=frame_index), on="key", how="left")
        .join(module_at(trace, points), on="key", how="left")
        .join(_format_frames(trace, points), on="key", how="left")
        .join(_cpu_values(trace, points, user_code), on="key", how="left")
    )
    rows = rows.with_columns(unplaced_op=pl.when(pl.col("source").is_null()).then(pl.col("op")))
    groups = [
        _one_line(group, cpu_value, source, module, framework_call, unplaced_op, bool(steady.steady_steps))
        for (cpu_value, source, module, framework_call, unplaced_op), group in rows.group_by(
            "cpu_value", "source", "module", "framework_call", "unplaced_op", maintain_order=True
        )
    ]
    groups.sort(key=lambda sync: (sync.cpu_value is not None, -sync.steady_count, -sync.count, sync.op))
    return tuple(groups)


def _one_line(
    group: pl.DataFrame,
    cpu_value: object,
    source: object,
    module: object,
    framework_call: object,
    op: object,
    counted: bool,
) -> LatentSync:
    """The would-be sync of one line's rows (see :attr:`LatentSync.count`); ``counted``: the trace
    has steady steps to count the line's in."""
    by_op = (
        group.group_by("op")
        .agg(
            count=pl.len(),
            steady=pl.col("steady").sum(),
            chain=pl.col("op_chain").drop_nulls().mode().sort().first(),
        )
        .sort(["count", "op"], descending=[True, False])
    )
    formats = group.filter(pl.col("format_ts").is_not_null())
    direct = (
        group.filter(pl.col("format_ts").is_null())
        .group_by("op")
        .agg(count=pl.len(), steady=pl.col("steady").sum())
    )
    if cpu_value is not None:  # not one line's action: every read counts
        count, steady_count = group.height, int(group.get_column("steady").sum())
    else:
        count = max(
            formats.get_column("format_ts").n_unique(), max(direct.get_column("count").to_list(), default=0)
        )
        steady_count = max(
            formats.filter("steady").get_column("format_ts").n_unique(),
            max(direct.get_column("steady").to_list(), default=0),
        )
    first = by_op.row(0, named=True)
    details = group.get_column("cpu_detail").drop_nulls()
    return LatentSync(
        op=str(op) if op is not None else str(first["op"]),
        op_chain=first["chain"],
        source=None if source is None else str(source),
        source_kind=next(iter(group.get_column("source_kind").drop_nulls().to_list()), None),
        module=None if module is None else str(module),
        count=count,
        steady_count=steady_count,
        # None without steady steps (a trace that marks none): nothing to count in
        steady_steps_with=group.filter("steady").get_column("step").drop_nulls().n_unique()
        if counted
        else None,
        ops=tuple(by_op.get_column("op").to_list()),
        formatting=formats.height > 0,
        cpu_value=None if cpu_value is None else str(cpu_value),
        cpu_detail=str(details.mode().sort().first()) if details.len() else None,
        source_line_kind=next(iter(group.get_column("source_line_kind").drop_nulls().to_list()), None),
        source_function=next(iter(group.get_column("source_function").drop_nulls().to_list()), None),
        framework_call=None if framework_call is None else str(framework_call),
    )


def _format_frames(trace: Trace, points: pl.DataFrame) -> pl.DataFrame:
    """``key, format_ts``: the start of the outermost tensor ``__repr__``/``__format__`` frame around
    each point (same thread; ``print(loss)`` formats its values with ``__format__`` inside
    ``__repr__``), null outside one."""
    empty = pl.DataFrame(schema={"key": points.schema["key"], "format_ts": pl.Int64})
    frames = trace.python.filter(pl.col("name").str.contains(taxonomy.TENSOR_FORMAT_FRAME_PATTERN))
    if frames.is_empty():
        return empty
    return _innermost_around(frames, points, "format_ts", outermost=True)


def _innermost_around(
    ranges: pl.DataFrame, points: pl.DataFrame, column: str, *, outermost: bool = False
) -> pl.DataFrame:
    """``key, <column>``: the start of the innermost (or outermost) range of ``ranges`` containing
    each point on its thread (points inside none are left out)."""
    found = meeting(
        ranges.select("pid", "tid", r_ts="ts", r_end="end"),
        "r_ts",
        "r_end",
        points.select(start="t", end=pl.col("t") + 1),
    )
    if found.is_empty():
        return pl.DataFrame(schema={"key": points.schema["key"], column: pl.Int64})
    return (
        points.join_where(found, pl.col("t") >= pl.col("r_ts"), pl.col("t") <= pl.col("r_end"))
        .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
        .group_by("key")
        .agg((pl.col("r_ts").min() if outermost else pl.col("r_ts").max()).alias(column))
    )


def _cpu_values(trace: Trace, points: pl.DataFrame, user_code: Collection[str]) -> pl.DataFrame:
    """``key, cpu_value, cpu_detail`` for the points that read CPU values (see the module doc)."""
    schema = pl.Schema({"key": points.schema["key"], "cpu_value": pl.String(), "cpu_detail": pl.String()})
    annotations = trace.annotations
    name = pl.col("name")
    loading = annotations.filter(
        name.str.starts_with(taxonomy.DATALOADER_PREFIX) & name.str.ends_with("__next__")
    )
    in_loading = _innermost_around(loading, points, "loader_ts") if loading.height else None
    counters = annotations.filter(
        name.str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX)
        & _optimizer(name).is_in(list(taxonomy.CPU_STEP_COUNTER_OPTIMIZERS))
    )
    parts: list[pl.DataFrame] = []
    if in_loading is not None and in_loading.height:
        parts.append(
            in_loading.select(
                "key", cpu_value=pl.lit(DATA_LOADING), cpu_detail=pl.lit("the DataLoader's fetch")
            )
        )
    if counters.height:
        in_step = (
            _innermost_named(counters, points)
            .rename({"r_ts": "step_ts", "name": "step"})
            .join(in_loading.select("key") if in_loading is not None else pl.DataFrame(schema={"key": pl.Int64}),
                  on="key", how="anti")
        )  # fmt: skip
        user_frames = _user_frames(trace, user_code)
        if in_step.height and user_frames.height:
            # the innermost user frame around the point started inside the step: the user's code
            in_user = _innermost_around(user_frames, points, "user_ts")
            in_step = in_step.join(in_user, on="key", how="left").filter(
                pl.col("user_ts").is_null() | (pl.col("user_ts") < pl.col("step_ts"))
            )
        if in_step.height:
            parts.append(
                in_step.select(
                    "key",
                    cpu_value=pl.lit(STEP_COUNTER),
                    cpu_detail=_optimizer(pl.col("step")),
                )
            )
    if not parts:
        return pl.DataFrame(schema=schema)
    return pl.concat(parts, how="vertical_relaxed").unique("key", keep="first").cast(schema)


def _optimizer(name: pl.Expr) -> pl.Expr:
    """``Optimizer.step#AdamW.step`` → ``AdamW`` (:func:`taxonomy.optimizer_of_step` as an expression)."""
    return name.str.strip_prefix(taxonomy.OPTIMIZER_STEP_PREFIX).str.strip_suffix(".step")


def _innermost_named(ranges: pl.DataFrame, points: pl.DataFrame) -> pl.DataFrame:
    """``key, r_ts, name``: the innermost of ``ranges`` containing each point on its thread."""
    found = meeting(  # in the trace's order: its row breaks ties on start and end
        ranges.select("pid", "tid", "name", r_ts="ts", r_end="end"),
        "r_ts",
        "r_end",
        points.select(start="t", end=pl.col("t") + 1),
    ).with_row_index("r_row")
    if found.is_empty():
        return pl.DataFrame(schema={"key": points.schema["key"], "r_ts": pl.Int64, "name": pl.String})
    return (
        points.join_where(found, pl.col("t") >= pl.col("r_ts"), pl.col("t") <= pl.col("r_end"))
        .filter((pl.col("pid") == pl.col("pid_right")) & (pl.col("tid") == pl.col("tid_right")))
        .sort(**outermost_first("r_ts", "r_end", "r_row"))
        .group_by("key")
        .agg(pl.col("r_ts").last(), pl.col("name").last())
    )


def _user_frames(trace: Trace, user_code: Collection[str]) -> pl.DataFrame:
    """Python frames of the user's own files (``pid, tid, ts, end``)."""
    names = trace.python.get_column("name").unique().to_list()
    mine = [
        name
        for name in names
        if (frame := taxonomy.parse_frame(name)) is not None and frame_kind(frame.file, user_code) == USER
    ]
    return trace.python.filter(pl.col("name").is_in(mine)).select("pid", "tid", "ts", "end")
