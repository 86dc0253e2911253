"""The work done for one rank: load its trace, analyze it as ``analyze`` does one trace, keep a
small summary.

:func:`analyze_rank` is a plain module-level function of one picklable :class:`RankTask`, so the
same call runs in-process, in a local process pool and on a ``dask.distributed`` worker
(``client.map``). It maps the single-trace analysis (:func:`~traceinsight.results.report.report_for`)
over the rank's trace, and hands the rank's :class:`~traceinsight.results.trace.Result` to the
task's ``each`` function where it was made (the command's per-rank reports: this layer writes
nothing). It returns a :class:`~traceinsight.results.job.RankResult` of a few kilobytes (figures,
findings, the start and end of each collective), never the events; the trace's tables are freed,
and the heap trimmed, before it returns, so a worker's memory is that of the largest rank it has
read.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import Final

import numpy as np
import polars as pl

from traceinsight.analysis.intervals import merge_intervals
from traceinsight.analysis.usage import Usage, total_usage
from traceinsight.load import SizeLimit, Trace, load_trace, taxonomy
from traceinsight.model import Model, replace
from traceinsight.process import give_back_freed_memory
from traceinsight.results.contract import result_of, utilization_of
from traceinsight.results.job import Collective, FindingBrief, PerStep, Rank, RankResult, TopFinding
from traceinsight.results.report import report_for
from traceinsight.results.trace import Result
from traceinsight.thresholds import Thresholds

__all__ = ["RankReports", "RankTask", "analyze_rank", "collective_kind", "rank_result"]

#: What a job does with each rank's result where it was made: given the result and the rank, it
#: returns (name, path) pairs kept in :attr:`RankResult.staged` (a module-level function, or a
#: ``functools.partial`` of one, so that it pickles to a worker).
RankReports = Callable[[Result, int], tuple[tuple[str, str], ...]]

_KERNEL_KIND: Final = re.compile(r"(?i)(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")


class RankTask(Model, frozen=True):
    """What a worker needs to analyze one rank (paths must be readable where the worker runs)."""

    path: str
    name_rank: int | None
    order: int
    thresholds: Thresholds
    user_code: tuple[str, ...] = ()
    max_bytes: int | None = None
    """``--max-size`` (None: the default gzip-ratio rule)."""
    each: RankReports | None = None
    """What to do with the rank's result where it was made (the command's own reports of each
    rank, staged for it to put in place once the job's checks pass: :attr:`RankResult.staged`)."""
    shown_path: str | None = None
    """The trace's path as the user gave it, for the outputs (default: ``path``)."""
    force: bool = False
    """``--force``: read a gzip that expands past the ratio real traces reach."""


def collective_kind(name: str) -> str:
    """``ncclDevKernel_AllReduce_Sum_f32_RING_LL(...)`` → ``AllReduce``; other names up to ``(``."""
    match = _KERNEL_KIND.search(name)
    if match is not None:
        return match.group(1)
    return name.split("(", 1)[0][:80]


def _clock_offset(trace: Trace) -> int:
    """What turns the trace's times into the job's common clock: traces written relative to
    ``baseTimeNanoseconds`` get it added back; older ones are already since the epoch."""
    meta = trace.meta
    return meta.base_time_ns if meta.era == "kineto-base-ns" and meta.base_time_ns is not None else 0


#: At most this many exposed stretches are kept per collective: past it the closest are joined
#: (the compute between them counted as exposed), so a rank's summary stays a few kilobytes.
MAX_EXPOSED_STRETCHES: Final = 16


def _exposed(start: int, end: int, blocks: tuple[np.ndarray, np.ndarray] | None) -> tuple[int, ...]:
    """``[start, end)`` less the compute ``blocks`` (merged, sorted: their starts and ends),
    flattened ``(s0, e0, s1, e1, …)``: where the collective ran with no compute under it."""
    stretches: list[list[int]] = []
    at = start
    if blocks is not None:
        starts, ends = blocks
        first = max(0, int(np.searchsorted(starts, start, side="right")) - 1)
        last = int(np.searchsorted(starts, end, side="left"))
        for block_start, block_end in zip(
            starts[first:last].tolist(), ends[first:last].tolist(), strict=True
        ):
            if block_end > at:
                if block_start > at:
                    stretches.append([at, block_start])
                at = max(at, block_end)
    if at < end:
        stretches.append([at, end])
    while len(stretches) > MAX_EXPOSED_STRETCHES:  # join the two closest stretches
        gap = min(range(len(stretches) - 1), key=lambda i: (stretches[i + 1][0] - stretches[i][1], i))
        stretches[gap][1] = stretches.pop(gap + 1)[1]
    return tuple(value for stretch in stretches for value in stretch)


def collectives(trace: Trace) -> tuple[str, tuple[Collective, ...]]:
    """The rank's collectives in start order: its GPU communication kernels, else (CPU-only or
    gloo jobs) its host ``c10d::`` operators. A kernel keeps where it ran with no compute kernel
    under it on its device (:attr:`Collective.exposed_ns`)."""
    offset = _clock_offset(trace)
    communication = (pl.col("kind") == "kernel") & pl.col("name").str.contains(
        taxonomy.COMMUNICATION_KERNEL_PATTERN
    )
    kernels = trace.gpu.filter(communication)
    source = "gpu"
    compute: dict[int | None, tuple[np.ndarray, np.ndarray]] = {}
    if kernels.is_empty():
        kernels = trace.cpu_ops.filter(pl.col("name").str.starts_with("c10d::")).with_columns(
            seq=pl.lit(None, pl.Int64), process_group=pl.lit(None, pl.String), device=pl.lit(None, pl.Int64)
        )
        source = "host" if kernels.height else "none"
    else:
        devices = kernels.get_column("device").unique().to_list()
        merged = merge_intervals(
            trace.gpu.filter(
                (pl.col("kind") == "kernel") & ~communication & pl.col("device").is_in(devices)
            ).select("device", "ts", "end"),
            by="device",
        )
        for (device,), blocks in merged.partition_by("device", as_dict=True).items():
            compute[device] = (blocks.get_column("start").to_numpy(), blocks.get_column("end").to_numpy())
    rows = (
        kernels.sort("ts", "end", "name")
        .select("name", "ts", "end", "process_group", "seq", "device")
        .iter_rows()
    )
    found = []
    for name, ts, end, group, seq, device in rows:
        exposed = _exposed(ts, end, compute.get(device)) if source == "gpu" else ()
        found.append(
            Collective(
                collective_kind(name), ts + offset, end + offset, group, seq,
                tuple(value + offset for value in exposed),
            )
        )  # fmt: skip
    return source, tuple(found)


def _communication_total(trace: Trace, windows: tuple[tuple[int, int], ...]) -> int:
    """Union of communication kernels per device, inside the steady windows on the GPU's clock
    (everywhere without)."""
    merged = merge_intervals(
        trace.gpu.filter(
            (pl.col("kind") == "kernel") & pl.col("name").str.contains(taxonomy.COMMUNICATION_KERNEL_PATTERN)
        ),
        by="device",
    )
    total = 0
    for start, end in merged.select("start", "end").iter_rows():
        if not windows:
            total += end - start
        for window_start, window_end in windows:
            total += max(0, min(end, window_end) - max(start, window_start))
    return total


def _has_distributed_info(trace: Trace) -> bool:
    return trace.meta.world_size is not None or trace.meta.backend is not None


def analyze_rank(task: RankTask) -> RankResult:
    """Analyze one rank's trace and keep its summary (see the module's docstring)."""
    trace = load_trace(Path(task.path), limit=SizeLimit(task.max_bytes, force=task.force))
    if task.shown_path is not None:  # the rank's own report names its trace as the user did
        trace = replace(trace, meta=replace(trace.meta, path=task.shown_path))
    if _has_distributed_info(trace):
        rank, rank_from = trace.meta.rank, "distributedInfo"
    elif task.name_rank is not None:
        rank, rank_from = task.name_rank, "file name"
    else:
        rank, rank_from = task.order, "order"
    report = report_for(trace, task.thresholds, task.user_code)
    analysis = report.analysis
    source, found = collectives(trace)
    communication = _communication_total(trace, analysis.steady.device_windows)
    offset = _clock_offset(trace)
    steady = analysis.steady
    steps_ns = tuple(
        (step.step, step.begin_ns + offset, step.done_ns + offset) for step in steady.steady_steps
    ) or tuple((-1, start + offset, end + offset) for start, end in steady.device_windows)
    del trace
    staged = task.each(result_of(report), rank) if task.each is not None else ()
    result = rank_result(
        rank=rank,
        rank_from=rank_from,
        path=task.shown_path if task.shown_path is not None else task.path,
        world_size=analysis.meta.world_size,
        backend=analysis.meta.backend,
        usage=total_usage(analysis.usage),
        has_usage=bool(analysis.usage),
        step_ns=analysis.steady.step_ns,
        communication_total_ns=communication,
        steady_syncs=sum(hotspot.steady_count for hotspot in analysis.sync_hotspots),
        findings=tuple(
            FindingBrief(f.rule, f.severity, f.title, f.savings_total_ns, f.minor, f.source)
            for f in report.findings
        ),
        collectives=found,
        collectives_from=source,
        warnings=tuple(warning.kind for warning in analysis.warnings),
        staged=staged,
        steps_ns=steps_ns,
    )
    del report, analysis
    give_back_freed_memory()
    return result


def rank_result(
    *,
    rank: int,
    rank_from: str,
    path: str,
    world_size: int | None,
    backend: str | None,
    usage: Usage,
    has_usage: bool,
    step_ns: int | None,
    communication_total_ns: int,
    steady_syncs: int,
    findings: tuple[FindingBrief, ...],
    collectives: tuple[Collective, ...],
    collectives_from: str,
    warnings: tuple[str, ...],
    staged: tuple[tuple[str, str], ...] = (),
    steps_ns: tuple[tuple[int, int, int], ...] = (),
) -> RankResult:
    """A rank's result from its own figures: its entry in the job (:class:`Rank`: the same
    utilization as its own ``analyze --json``, its times per steady step, its first finding that
    is not minor), and what the combine needs besides. ``usage``: the rank's steady state over every
    device (``has_usage``: whether it had one to judge); ``communication_total_ns``: its
    communication kernels' union in the steady state, overlapped or not; ``steady_syncs``: its host
    blocking calls there; ``findings``: every finding, ranked by saving."""
    steps = usage.steps

    def per_step(ns: int) -> int:
        return round(ns / steps) if steps else ns

    top = next((finding for finding in findings if not finding.minor), None)
    entry = Rank(
        rank=rank,
        rank_from=rank_from,
        path=path,
        steps=steps,
        step_time_ns=step_ns,
        utilization=utilization_of(usage, has_usage),
        per_step=PerStep(
            compute_ns=per_step(usage.compute_ns),
            communication_ns=per_step(communication_total_ns),
            communication_exposed_ns=per_step(usage.communication_ns),
            copy_exposed_ns=per_step(usage.copy_ns),
            idle_ns=per_step(usage.idle_ns),
            idle_by_cause_ns={kind.value: per_step(ns) for kind, ns in usage.idle},
        ),
        syncs_per_step=round(steady_syncs / steps, 4) if steps else None,
        collectives=None,
        top_finding=None
        if top is None
        else TopFinding(rule=top.rule, title=top.title, savings_total_ns=top.savings_ns),
        warnings=warnings,
        busy_ns=usage.busy_ns,
    )
    return RankResult(
        entry=entry,
        world_size=world_size,
        backend=backend,
        usage=usage,
        steady_syncs=steady_syncs,
        findings=findings,
        collectives=collectives,
        collectives_from=collectives_from,
        staged=staged,
        steps_ns=steps_ns,
    )
