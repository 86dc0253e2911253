"""GPU time, FLOPs and achieved FLOP/s by ``nn.Module`` and by ``record_function`` region, as trees.

**Scopes.** A module call is an ``nn.Module: Name_N`` Python frame (torch's tracer with
``with_stack=True``, or ``traceinsight run``'s own); a region is a ``user_annotation`` range other
than ``ProfilerStep#N`` (``record_function`` ranges, the DataLoader's and the optimizer's). Scopes
nest by time on their thread; a scope's **path** joins the names from the outermost down
(``Model_0/Block_3/Linear_0``), and calls with one path are summed.

**Attribution.** A kernel counts for the innermost scope holding its launch call (same thread) and,
inclusively, for every scope around it; an operator's FLOPs (:mod:`.flops`) likewise, by the
operator's start. Kernels launched outside every module (autograd's backward thread, the optimizer)
are shown apart (``outside``), except backward time linked to its forward module (below).

**Backward.** autograd gives each operator a ``Sequence number``; a backward operator (``Fwd thread
id`` > 0: ``AddmmBackward0`` and the ``autograd::engine::evaluate_function:`` range around it)
carries the number of the forward operator that made its graph node. That forward operator is the
last one with the number on the forward side (of the same process) started before the backward one
(the operators around a node's maker record the next number to be given, so the maker is the last
with its number; torch's ``fwdbwd`` flow arrows link the same pair). A kernel launched outside every
module, under a backward operator (the innermost on its thread), counts as **backward** time of the
innermost module around that forward operator (and, inclusively, of every module around it), and
an operator's FLOPs likewise: ``backward_ns`` / ``backward_flops``, apart from the forward
``gpu_ns`` / ``flops``. Kernels of backward operators whose forward operator ran outside every
module, and all kernels without a backward operator around their launch, stay ``outside``.

**Idle inside.** Per call: from the first of its kernels' starts to the last one's end, the time
its kernels do not cover; summed over calls.

Only the steady state counts (kernels in the steady device windows, scopes starting in the steady
host windows), and figures are per steady step where there are steps.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from traceinsight.analysis.flops import Flops
from traceinsight.analysis.intervals import within
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace
from traceinsight.model import Model

__all__ = ["MODULE_PREFIX", "NO_SCOPES", "ScopeTime", "ScopeTimes", "scope_times"]

#: The name torch (and ``run``) gives a module's frame: ``nn.Module: Linear_0``.
MODULE_PREFIX: Final = "nn.Module: "
#: Scopes kept per kind (the largest by GPU time, then host time): a bound on the result's size.
MAX_SCOPES: Final = 500
#: Deepest path kept (deeper scopes count for their ancestor at this depth).
MAX_DEPTH: Final = 32


class ScopeTime(Model, frozen=True):
    """One module or region path over the steady state (totals; per step via :class:`ScopeTimes`)."""

    path: str
    """Names from the outermost scope down, joined by ``/``."""
    name: str
    depth: int
    calls: int
    host_ns: int
    """The calls' host time (their durations summed)."""
    gpu_ns: int
    """Kernel time launched under it (inclusive of scopes inside it)."""
    idle_ns: int
    """Within each call's GPU span, the time its kernels did not cover (summed)."""
    flops: int
    """Counted FLOPs of the operators it ran (inclusive)."""
    backward_ns: int = 0
    """Kernel time of the backward operators linked to its forward operators (inclusive; module
    trees only, see the module doc); not in ``gpu_ns``."""
    backward_flops: int = 0
    """Counted FLOPs of those backward operators (inclusive); not in ``flops``."""

    @property
    def achieved_flops_per_s(self) -> float | None:
        """FLOPs over its GPU time (None without GPU time)."""
        return self.flops / self.gpu_ns * 1e9 if self.gpu_ns else None

    @property
    def parent(self) -> str | None:
        """The enclosing path (None at the top)."""
        return self.path.rsplit("/", 1)[0] if "/" in self.path else None


class ScopeTimes(Model, frozen=True):
    """Module and region trees of the steady state."""

    #: Steady steps the totals are over (0: no steps, one window).
    steps: int
    modules: tuple[ScopeTime, ...]
    regions: tuple[ScopeTime, ...]
    #: Steady kernel time launched outside every module (backward, optimizer, ...), and in all.
    outside_modules_gpu_ns: int
    kernel_ns: int
    #: The part of ``outside_modules_gpu_ns`` counted as modules' backward time.
    backward_linked_gpu_ns: int = 0

    def per_step(self, ns: int) -> float:
        """``ns`` per steady step (the total without steps)."""
        return ns / self.steps if self.steps else float(ns)


NO_SCOPES: Final = ScopeTimes(steps=0, modules=(), regions=(), outside_modules_gpu_ns=0, kernel_ns=0)


def _spans_with_paths(spans: pl.DataFrame) -> pl.DataFrame:
    """``spans`` (pid, tid, ts, end, label) → with ``span`` (row), ``parent`` (-1 at the top) and
    ``path``, by a stack walk over each thread's spans in start order (the outer first)."""
    ordered = spans.sort("pid", "tid", "ts", pl.col("end"), descending=[False, False, False, True])
    parents: list[int] = []
    paths: list[str] = []
    stack: list[tuple[int, int, str]] = []  # (row, end, path)
    thread: tuple[object, object] | None = None
    for row, (pid, tid, ts, end, label) in enumerate(
        ordered.select("pid", "tid", "ts", "end", "label").iter_rows()
    ):
        if (pid, tid) != thread:
            stack, thread = [], (pid, tid)
        while stack and stack[-1][1] <= ts:
            stack.pop()
        if stack and len(stack) >= MAX_DEPTH:
            parents.append(stack[-1][0])
            paths.append(stack[-1][2])
            stack.append((row, min(end, stack[-1][1]), stack[-1][2]))
            continue
        path = f"{stack[-1][2]}/{label}" if stack else label
        parents.append(stack[-1][0] if stack else -1)
        paths.append(path)
        stack.append((row, end, path))
    return ordered.with_columns(
        span=pl.int_range(pl.len(), dtype=pl.Int64),
        parent=pl.Series(parents, dtype=pl.Int64),
        path=pl.Series(paths, dtype=pl.String),
    )


def _innermost(points: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """Each point (pid, tid, at) with ``span``: the innermost span holding it on its thread (null:
    none). The latest span started at or before the point holds it, or one of its ancestors does:
    climbed one level at a time, each level one join."""
    starts = spans.select("pid", "tid", "span", start="ts").sort("start")
    found = points.sort("at").join_asof(
        starts, left_on="at", right_on="start", by=["pid", "tid"], strategy="backward", check_sortedness=False
    )
    ends = spans.select("span", "end", "parent")
    for _ in range(MAX_DEPTH + 1):
        found = found.drop("end", "parent", strict=False).join(ends, on="span", how="left")
        outside = pl.col("span").is_not_null() & (pl.col("end") <= pl.col("at"))
        if not found.select(outside.any()).item():
            break
        found = found.with_columns(
            span=pl.when(outside)
            .then(pl.when(pl.col("parent") >= 0).then(pl.col("parent")))
            .otherwise(pl.col("span"))
        )
    return found.drop("end", "parent", strict=False)


def _backward_ops(cpu_ops: pl.DataFrame) -> pl.DataFrame:
    """autograd's backward operators (``Fwd thread id`` > 0) as spans (pid, tid, ts, end), each with
    the point of its forward operator (``fwd_pid``, ``fwd_tid``, ``fwd_ts``): the last operator of
    the forward side with its ``Sequence number`` in its process started before it. Empty without
    sequence numbers or without a forward operator found."""
    ops = cpu_ops.filter(pl.col("sequence_number").is_not_null() & pl.col("end").is_not_null()).select(
        "pid", "tid", "ts", "end", "sequence_number", "fwd_thread_id"
    )
    is_backward = pl.col("fwd_thread_id").fill_null(0) > 0
    backward = ops.filter(is_backward)
    if backward.is_empty():
        return backward.select("pid", "tid", "ts", "end", fwd_pid="pid", fwd_tid="tid", fwd_ts="ts")
    forward = (
        ops.filter(~is_backward)
        .select("pid", "sequence_number", fwd_tid="tid", fwd_ts="ts")
        .with_columns(fwd_pid="pid")
        .sort("fwd_ts")
    )
    return (
        backward.sort("ts")
        .join_asof(
            forward,
            left_on="ts",
            right_on="fwd_ts",
            by=["pid", "sequence_number"],
            strategy="backward",
            check_sortedness=False,
        )
        .filter(pl.col("fwd_ts").is_not_null())
        .select("pid", "tid", "ts", "end", "fwd_pid", "fwd_tid", "fwd_ts")
    )


def _backward_spans(points: pl.DataFrame, ops: pl.DataFrame, spans: pl.DataFrame) -> pl.DataFrame:
    """``points`` (pid, tid, at, and figures) outside every span, each with ``span``: the innermost
    module span around the forward operator of the innermost backward operator holding it (null:
    none). ``ops``: the backward operators as spans (:func:`_spans_with_paths`)."""
    held = _innermost(points, ops).filter(pl.col("span").is_not_null())
    forward = held.join(ops.select("span", "fwd_pid", "fwd_tid", "fwd_ts"), on="span", how="inner")
    return _innermost(
        forward.drop("span", "pid", "tid", "at").rename({"fwd_pid": "pid", "fwd_tid": "tid", "fwd_ts": "at"}),
        spans,
    )


def _tree(
    spans: pl.DataFrame,
    kernels: pl.DataFrame,
    flop_ops: pl.DataFrame,
    windows: tuple[tuple[int, int], ...],
    backward: pl.DataFrame | None = None,
) -> tuple[tuple[ScopeTime, ...], int, int]:
    """The scopes of ``spans`` by path, with kernel time, idle inside and FLOPs (and, given
    ``backward`` (:func:`_backward_ops`), the backward time and FLOPs linked to them); the kernel
    time launched outside every span, and the part of it linked as backward time."""
    if spans.is_empty():
        return (), int(kernels.get_column("dur").sum() or 0), 0
    spans = _spans_with_paths(spans)
    k = _innermost(kernels.rename({"call_ts": "at"}), spans)
    outside = int(k.filter(pl.col("span").is_null()).get_column("dur").sum() or 0)
    f = (
        _innermost(flop_ops.rename({"ts": "at"}), spans)
        if flop_ops.height
        else flop_ops.rename({"ts": "at"}).with_columns(span=pl.lit(None, dtype=pl.Int64))
    )
    direct_k = (
        k.filter(pl.col("span").is_not_null())
        .group_by("span")
        .agg(gpu=pl.col("dur").sum(), first=pl.col("ts").min(), last=(pl.col("ts") + pl.col("dur")).max())
    )
    direct_f = f.filter(pl.col("span").is_not_null()).group_by("span").agg(flops=pl.col("flops").sum())
    # The inclusive sums below index rows by position: every join keeps the spans' order.
    table = spans.join(direct_k, on="span", how="left", maintain_order="left").join(
        direct_f, on="span", how="left", maintain_order="left"
    )
    linked = 0
    if backward is not None and backward.height:
        ops = _spans_with_paths(backward.with_columns(label=pl.lit("")))  # once, for kernels and FLOPs
        bk = _backward_spans(
            k.filter(pl.col("span").is_null()).drop("span").select("pid", "tid", "at", "dur"), ops, spans
        ).filter(pl.col("span").is_not_null())
        linked = int(bk.get_column("dur").sum() or 0)
        bf = _backward_spans(
            f.filter(pl.col("span").is_null()).drop("span").select("pid", "tid", "at", "flops"),
            ops,
            spans,
        ).filter(pl.col("span").is_not_null())
        table = table.join(
            bk.group_by("span").agg(backward=pl.col("dur").sum()),
            on="span",
            how="left",
            maintain_order="left",
        ).join(
            bf.group_by("span").agg(backward_flops=pl.col("flops").sum()),
            on="span",
            how="left",
            maintain_order="left",
        )
    else:
        table = table.with_columns(
            backward=pl.lit(None, dtype=pl.Int64), backward_flops=pl.lit(None, dtype=pl.Int64)
        )
    # Inclusive sums: children before parents (a child starts after its parent: reverse order).
    parent = table.get_column("parent").to_list()
    gpu = [int(v or 0) for v in table.get_column("gpu").to_list()]
    flops = [int(v or 0) for v in table.get_column("flops").to_list()]
    back = [int(v or 0) for v in table.get_column("backward").to_list()]
    back_flops = [int(v or 0) for v in table.get_column("backward_flops").to_list()]
    first = table.get_column("first").to_list()
    last = table.get_column("last").to_list()
    for row in range(len(parent) - 1, -1, -1):
        up = parent[row]
        if up < 0:
            continue
        gpu[up] += gpu[row]
        flops[up] += flops[row]
        back[up] += back[row]
        back_flops[up] += back_flops[row]
        if first[row] is not None:
            first[up] = first[row] if first[up] is None else min(first[up], first[row])
            last[up] = last[row] if last[up] is None else max(last[up], last[row])
    idle = [
        max((b - a) - g, 0) if a is not None and b is not None else 0
        for a, b, g in zip(first, last, gpu, strict=True)
    ]
    table = table.with_columns(
        gpu=pl.Series(gpu, dtype=pl.Int64),
        flops=pl.Series(flops, dtype=pl.Int64),
        backward=pl.Series(back, dtype=pl.Int64),
        backward_flops=pl.Series(back_flops, dtype=pl.Int64),
        idle=pl.Series(idle, dtype=pl.Int64),
        host=pl.col("end") - pl.col("ts"),
    )
    if windows:
        table = table.filter(within(table.get_column("ts"), windows))
    grouped = (
        table.group_by("path")
        .agg(
            name=pl.col("label").first(),
            calls=pl.len(),
            host_ns=pl.col("host").sum(),
            gpu_ns=pl.col("gpu").sum(),
            idle_ns=pl.col("idle").sum(),
            flops=pl.col("flops").sum(),
            backward_ns=pl.col("backward").sum(),
            backward_flops=pl.col("backward_flops").sum(),
        )
        .sort("gpu_ns", "host_ns", "path", descending=[True, True, False])
        .head(MAX_SCOPES)
        .sort("path")
        .with_columns(depth=pl.col("path").str.count_matches("/", literal=True))
    )
    return (
        tuple(ScopeTime(**row) for row in grouped.iter_rows(named=True)),  # its columns: the fields
        outside,
        linked,
    )


def scope_times(trace: Trace, steady: SteadySteps, flops: Flops) -> ScopeTimes:
    """The module and region trees of the steady state (see the module doc); ``flops``: the
    trace's :func:`~.flops.flop_stats` (its kernel table and counted operators)."""
    python = trace.python
    module_frames = python.filter(pl.col("name").str.starts_with(MODULE_PREFIX) & pl.col("end").is_not_null())
    regions = trace.annotations.filter(
        ~pl.col("name").str.starts_with("ProfilerStep#") & pl.col("end").is_not_null()
    )
    if module_frames.is_empty() and regions.is_empty():
        return NO_SCOPES
    steady_kernels = flops.kernel_table.select("correlation", "ts", "dur")
    if steady_kernels.is_empty():
        steady_kernels = trace.gpu.filter(pl.col("kind") == "kernel").select("correlation", "ts", "dur")
        if steady.device_windows:
            steady_kernels = steady_kernels.filter(
                within(steady_kernels.get_column("ts"), steady.device_windows)
            )
    calls = (
        trace.runtime.filter(pl.col("correlation").is_not_null())
        .select("pid", "tid", "correlation", call_ts="ts")
        .unique("correlation", keep="first")
    )
    kernels = steady_kernels.join(calls, on="correlation", how="inner").select(
        "pid", "tid", "call_ts", "ts", "dur"
    )
    flop_ops = flops.operator_table.select("pid", "tid", "ts", "flops")
    windows = steady.windows
    if windows and flop_ops.height:
        flop_ops = flop_ops.filter(within(flop_ops.get_column("ts"), windows))
    module_tree, outside, linked = _tree(
        module_frames.select("pid", "tid", "ts", "end", label=pl.col("name").str.strip_prefix(MODULE_PREFIX)),
        kernels,
        flop_ops,
        windows,
        _backward_ops(trace.cpu_ops) if module_frames.height else None,
    )
    region_tree, _, _ = _tree(
        regions.select("pid", "tid", "ts", "end", label=pl.col("name").str.replace_all("/", "∕")),
        kernels,
        flop_ops,
        windows,
    )
    return ScopeTimes(
        steps=len(steady.steady_steps),
        modules=module_tree,
        regions=region_tree,
        outside_modules_gpu_ns=outside if module_tree else 0,
        kernel_ns=int(kernels.get_column("dur").sum() or 0),
        backward_linked_gpu_ns=linked if module_tree else 0,
    )
