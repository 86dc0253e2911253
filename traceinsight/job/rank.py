"""The work done for one rank: load its trace, analyze it as ``analyze`` would, keep a small summary.

:func:`analyze_rank` is a plain module-level function of one picklable :class:`RankTask`, so the
same call runs in-process, in a local process pool and on a ``dask.distributed`` worker
(``client.map``). It returns a :class:`RankResult` of a few kilobytes (figures, findings, the
start and end of each collective), never the events; the trace's tables are freed, and the heap
trimmed, before it returns, so a worker's memory is that of the largest rank it has read.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import polars as pl

from traceinsight.analysis.intervals import merge_intervals
from traceinsight.analysis.usage import Usage, total_usage
from traceinsight.load import SizeLimit, Trace, load_trace, taxonomy
from traceinsight.report import Report, report_for
from traceinsight.thresholds import Thresholds

__all__ = ["Collective", "FindingBrief", "RankResult", "RankTask", "analyze_rank", "collective_kind"]

_KERNEL_KIND: Final = re.compile(r"(?i)(?:nccl|rccl)(?:Dev)?Kernel_([A-Za-z]+)")


@dataclass(frozen=True, slots=True)
class RankTask:
    """What a worker needs to analyze one rank (paths must be readable where the worker runs)."""

    path: str
    name_rank: int | None
    order: int
    thresholds: Thresholds
    user_code: tuple[str, ...] = ()
    max_bytes: int | None = None
    """``--max-size`` (None: the default gzip-ratio rule)."""
    per_rank_dir: str | None = None
    """Stage this rank's own JSON and HTML report in this (private) folder, for the command to put
    in place as ``rank-<N>.json/.html`` once the job's checks pass (:attr:`RankResult.staged`)."""
    source_root: str | None = None
    shown_path: str | None = None
    """The trace's path as the user gave it, for the outputs (default: ``path``)."""
    force: bool = False
    """``--force``: read a gzip that expands past the ratio real traces reach."""


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective as this rank ran it: its kind (``AllReduce``, ``SendRecv``, ``c10d::allreduce_``)
    and its start and end on the job's common clock (ns since the epoch where the trace says so)."""

    kind: str
    start_ns: int
    end_ns: int
    #: The process group it ran in and its sequence number there (``Process Group Name`` and
    #: ``Seq`` on communication kernels since 2026): None where the trace does not say.
    process_group: str | None = None
    seq: int | None = None


@dataclass(frozen=True, slots=True)
class FindingBrief:
    """What the job report keeps of one of a rank's findings."""

    rule: str
    severity: str
    title: str
    savings_ns: int
    minor: bool


@dataclass(frozen=True, slots=True)
class RankResult:
    """One rank's figures: the same numbers its own ``analyze`` shows, and its collectives."""

    rank: int
    #: Where the rank number came from: ``distributedInfo``, ``file name`` or ``order``.
    rank_from: str
    #: The trace's path as the user gave it (control characters replaced).
    path: str
    world_size: int | None
    backend: str | None
    #: The rank's steady state, over every device (:func:`~traceinsight.analysis.usage.total_usage`).
    usage: Usage
    #: Whether the trace had any steady state to judge (the JSON's ``utilization.of`` is null if not).
    has_usage: bool
    #: Median steady step time: the spacing of when the steps' work was done (None without steps).
    step_ns: int | None
    #: Communication kernel time (union) inside the steady state, overlapped by compute or not.
    communication_total_ns: int
    #: Host blocking calls inside the steady state.
    steady_syncs: int
    findings: tuple[FindingBrief, ...]
    #: The rank's collectives in order: GPU communication kernels, else host ``c10d::`` operators.
    collectives: tuple[Collective, ...]
    #: ``gpu`` (communication kernels) or ``host`` (``c10d::`` operators) or ``none``.
    collectives_from: str
    warnings: tuple[str, ...]
    #: This rank's own reports, staged by the worker: (file name, staged path) pairs.
    staged: tuple[tuple[str, str], ...] = ()

    @property
    def steps(self) -> int:
        """Steady steps (0 without steps)."""
        return self.usage.steps

    @property
    def name(self) -> str:
        """The trace file's name."""
        return Path(self.path).name

    def per_step(self, ns: int) -> int:
        """``ns`` per steady step, or ``ns`` itself without steps."""
        return round(ns / self.steps) if self.steps else ns

    @property
    def syncs_per_step(self) -> float | None:
        """Host blocking calls per steady step (None without steps)."""
        return self.steady_syncs / self.steps if self.steps else None

    @property
    def top_finding(self) -> FindingBrief | None:
        """The first finding that is not minor (findings come ranked by saving)."""
        return next((finding for finding in self.findings if not finding.minor), None)


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


def collectives(trace: Trace) -> tuple[str, tuple[Collective, ...]]:
    """The rank's collectives in start order: its GPU communication kernels, else (CPU-only or
    gloo jobs) its host ``c10d::`` operators."""
    offset = _clock_offset(trace)
    kernels = trace.gpu.filter(
        (pl.col("kind") == "kernel") & pl.col("name").str.contains(taxonomy.COMMUNICATION_KERNEL_PATTERN)
    )
    source = "gpu"
    if kernels.is_empty():
        kernels = trace.cpu_ops.filter(pl.col("name").str.starts_with("c10d::")).with_columns(
            seq=pl.lit(None, pl.Int64), process_group=pl.lit(None, pl.String)
        )
        source = "host" if kernels.height else "none"
    rows = kernels.sort("ts", "end", "name").select("name", "ts", "end", "process_group", "seq").iter_rows()
    found = tuple(
        Collective(collective_kind(name), ts + offset, end + offset, group, seq)
        for name, ts, end, group, seq in rows
    )
    return source, found


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


def _stage_own_reports(report: Report, rank: int, task: RankTask) -> tuple[tuple[str, str], ...]:
    """This rank's own report, ``rank-<N>.json`` and ``rank-<N>.html``, staged in
    ``task.per_rank_dir`` (the command puts them in place): (name, staged path) pairs."""
    from traceinsight.outputs import stage
    from traceinsight.pipeline import render_html
    from traceinsight.render.json_report import JsonRenderer

    assert task.per_rank_dir is not None
    folder = Path(task.per_rank_dir)
    source_root = Path(task.source_root) if task.source_root is not None else None
    staged = []
    for name, text in (
        (f"rank-{rank}.json", JsonRenderer().render(report)),
        (f"rank-{rank}.html", render_html(report, source_root)),
    ):
        staged.append((name, str(stage(folder, name, text))))
    return tuple(staged)


def _has_distributed_info(trace: Trace) -> bool:
    return trace.meta.world_size is not None or trace.meta.backend is not None


def analyze_rank(task: RankTask) -> RankResult:
    """Analyze one rank's trace and keep its summary (see the module's docstring)."""
    from traceinsight.pipeline import give_back_freed_memory

    trace = load_trace(Path(task.path), limit=SizeLimit(task.max_bytes, force=task.force))
    if task.shown_path is not None:  # the rank's own report names its trace as the user did
        trace = dataclasses.replace(trace, meta=dataclasses.replace(trace.meta, path=task.shown_path))
    give_back_freed_memory()
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
    del trace
    staged = _stage_own_reports(report, rank, task) if task.per_rank_dir is not None else ()
    result = RankResult(
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
            FindingBrief(f.rule, f.severity, f.title, f.savings_ns, f.minor) for f in report.findings
        ),
        collectives=found,
        collectives_from=source,
        warnings=tuple(warning.kind for warning in analysis.warnings),
        staged=staged,
    )
    del report, analysis
    give_back_freed_memory()
    return result
