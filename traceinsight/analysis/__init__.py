"""Pure analyses over a loaded :class:`~traceinsight.load.Trace`, gathered in :class:`Analysis`.

A table the analyses build in several steps is one polars query (``lazy()`` … ``collect(engine=
"in-memory")``), not an eager step each: every eager step is a query of its own, and on a small trace
each costs about 0.1-0.2 ms whatever its size. On four small samples an analysis makes 358-392 queries,
not 649-721: in-process and warm, 5-15 % less time (the larger plans cost polars more to optimize, so the
gain is mostly the Python around each query). One exception: an inequality join runs as a query of
its own (:func:`~.intervals.joined_where`), because polars fuses it with an equality filter that
follows into a hash join on the equality.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import NamedTuple

import polars as pl

from traceinsight.analysis import copies, gpu_time, host, idle_gaps, syncs
from traceinsight.analysis.collectives import CommunicationStats, communication_stats
from traceinsight.analysis.flops import NO_FLOPS, Flops, flop_stats, with_mfu
from traceinsight.analysis.intervals import joined_where, overlap_ns, within
from traceinsight.analysis.kernels import TopKernels, top_kernels
from traceinsight.analysis.latent import LatentSync, latent_syncs
from traceinsight.analysis.launching import LaunchStats, launch_stats
from traceinsight.analysis.memory import Memory, memory_usage
from traceinsight.analysis.modules import NO_SCOPES, ScopeTimes, scope_times
from traceinsight.analysis.optimizer import OptimizerStats, optimizer_stats
from traceinsight.analysis.pace import Pace, step_pace
from traceinsight.analysis.precision import PrecisionMix, precision_mix
from traceinsight.analysis.preprocessing import StepLeads, step_leads
from traceinsight.analysis.replay import Replay, prepare_replay
from traceinsight.analysis.results import (
    CopyGroup,
    Device,
    H2DCopy,
    Host,
    IdleGap,
    Step,
    SyncCall,
    SyncHotspot,
)
from traceinsight.analysis.shared import DEFAULT_LAUNCH_COST_NS, Shared, launch_cost_ns, shared_tables
from traceinsight.analysis.sources import FrameIndex
from traceinsight.analysis.steady import SteadySteps, iteration_count, steady_state
from traceinsight.analysis.timeline import Timeline, timeline
from traceinsight.analysis.usage import Usage
from traceinsight.analysis.validity import TraceWarning, trace_warnings
from traceinsight.cores import second_core
from traceinsight.load import Trace, TraceMeta, taxonomy
from traceinsight.model import Model, field
from traceinsight.process import Beside
from traceinsight.thresholds import Thresholds

__all__ = ["Analysis", "FixInputs", "analyze"]


class FixInputs(Model, frozen=True):
    """Host ranges inside the steady state that the rules' fixes change in the replay."""

    #: DataLoader ``__next__`` ranges (start, end) on threads that launch GPU work.
    dataloader_waits: tuple[tuple[int, int], ...] = ()
    #: The iterators they come from (``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``).
    dataloader_iterators: tuple[str, ...] = ()
    #: Host-to-device copies issued in the steady state, in the order of their host calls.
    h2d_copies: tuple[H2DCopy, ...] = ()
    #: Median duration of a kernel launch call: what a non-blocking copy call costs (ns).
    launch_cost_ns: int = DEFAULT_LAUNCH_COST_NS
    #: The trace's own pinned host-to-device copies' rate (bytes per ns = GB/s; None without such
    #: copies large enough to measure: :func:`traceinsight.analysis.copies.pinned_h2d_rate`).
    pinned_h2d_gb_per_s: float | None = None


class Analysis(Model, frozen=True):
    """Every measurement of one trace. Times in integer nanoseconds."""

    meta: TraceMeta
    thresholds: Thresholds
    has_gpu: bool
    iterations: int | None  # ProfilerStep spans, else Optimizer.step ranges, else None
    steps_marked: bool  # True when iterations come from ProfilerStep#N spans
    devices: tuple[Device, ...]
    steps: tuple[Step, ...]
    idle_gaps: tuple[IdleGap, ...]
    copies: tuple[CopyGroup, ...]
    overlap: dict[str, float | None]
    syncs: tuple[SyncCall, ...]
    sync_hotspots: tuple[SyncHotspot, ...]
    host: Host
    timeline: Timeline  # downsampled busy blocks and sync marks per device, for charts
    kernels: TopKernels  # kernels by total time
    steady: SteadySteps  # the steps, which are steady, and the steady-state windows
    warnings: tuple[TraceWarning, ...]  # what limits what the numbers say, for the top of every output
    replay: Replay  # the steady steps, ready to replay a fix
    fix_inputs: FixInputs  # host ranges the fixes change
    usage: tuple[Usage, ...]  # per device: how the steady state was spent
    precision: tuple[PrecisionMix, ...]  # per device: fp32 GEMM/conv vs tensor-core kernel time
    launching: LaunchStats  # kernels per step, kernel vs launch times, operators dispatching in gaps
    optimizer: OptimizerStats  # optimizer.step() and zero_grad() kernels
    latent_syncs: tuple[LatentSync, ...]  # without GPU work: ops that would wait for a GPU
    memory: Memory  # per device: peak memory vs the total, over time; allocator calls in steps
    #: Processes that launched work on more than one GPU (``nn.DataParallel``'s single process).
    multi_gpu_processes: int
    #: Collectives per device and kind in the steady state, and the wrapper that issued them.
    communication: CommunicationStats
    #: The host's and the GPU's own time per steady step, and which side sets the pace.
    pace: Pace
    #: The host's time in each steady step before its first launch, and what it did there.
    step_leads: StepLeads
    #: Every gap with its cause (:data:`~.idle_gaps.GAP_SCHEMA`; the shorter than ``min_gap_us``
    #: without a source), when asked for (:func:`analyze`'s ``every_gap``); None otherwise: on a
    #: long trace it holds a row per pause between kernels.
    every_gap: pl.DataFrame | None = field(default=None, compare=False)
    #: FLOPs counted from recorded shapes in the steady state, per kernel and class, and MFU per
    #: device (:mod:`.flops`; empty without shapes).
    flops: Flops = NO_FLOPS
    #: GPU time, idle inside and FLOPs by ``nn.Module`` and by ``record_function`` region, as
    #: trees over the steady state (:mod:`.modules`).
    scopes: ScopeTimes = NO_SCOPES
    #: Each steady step's host syncs (waits), in the steps' order (:func:`.syncs.steady_step_syncs`).
    step_syncs: tuple[int, ...] = ()

    @property
    def span_ns(self) -> int:
        """Summed GPU span over devices."""
        return sum(device.span_ns for device in self.devices)

    @property
    def step_ns(self) -> int | None:
        """Median steady step time (None without steps)."""
        return self.steady.step_ns

    @property
    def reference_ns(self) -> int:
        """What shares of time are taken of: the steady steps' mean step time (their windows on
        the GPU's clock over their count: the steps a saving per step is taken over); without
        steps, the steady window on the GPU (the longest over devices), else the host's steady
        window (0: nothing)."""
        steps = len(self.steady.steady_steps)
        if self.steady.step_ns and steps:
            return round(self.steady.window_ns / steps)
        return max((usage.window_ns for usage in self.usage), default=0) or self.steady.window_ns

    def device_usage(self, device: int) -> Usage | None:
        """How ``device`` spent the steady state."""
        return next((usage for usage in self.usage if usage.device == device), None)


def _fix_inputs(
    trace: Trace, steady: SteadySteps, kernels: pl.DataFrame, launch_cost: int | None = None
) -> FixInputs:
    """The host ranges inside the steady windows that the replayed fixes change (``launch_cost``:
    :func:`~traceinsight.analysis.shared.launch_cost_ns`, when the caller has it)."""
    if not steady.windows:
        return FixInputs()
    launching = (
        trace.runtime.lazy()
        .select("correlation", "pid", "tid")
        .join(trace.gpu.lazy().select("correlation").unique(), on="correlation", how="semi")
        .select("pid", "tid")
        .unique()
        .collect(engine="in-memory")
    )
    if launching.is_empty():
        # No GPU work: the threads that run the steps are the ones that matter (all, if unmarked).
        launching = trace.annotations.filter(
            pl.col("name").str.starts_with("ProfilerStep#")
            | pl.col("name").str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX)
        ).select("pid", "tid")
        if launching.is_empty():
            launching = trace.annotations.select("pid", "tid")
        launching = launching.unique()
    ranges = trace.annotations
    waits = (
        ranges.filter(within(ranges.get_column("ts"), steady.windows))
        .lazy()
        .filter(
            pl.col("name").str.starts_with(taxonomy.DATALOADER_PREFIX)
            & pl.col("name").str.ends_with("__next__")
        )
        .join(launching.lazy(), on=["pid", "tid"], how="semi")
        .sort("ts")
        .collect(engine="in-memory")
    )
    h2d = (
        trace.gpu.lazy()
        .filter((pl.col("kind") == "memcpy") & pl.col("name").str.starts_with("Memcpy HtoD"))
        .select("correlation", "name", "device", "bytes", "dur", copy_ts="ts", copy_end="end")
    )
    calls = trace.runtime.select("ts", "end", "correlation")
    copy_calls = (
        calls.filter(within(calls.get_column("ts"), steady.windows))
        .lazy()
        .join(h2d, on="correlation", how="inner")
        .sort("ts", "correlation")
        .unique("correlation", keep="first", maintain_order=True)
        .with_row_index("copy")
        .collect(engine="in-memory")
    )
    under = (
        joined_where(
            copy_calls.lazy().select("copy", "device", "copy_ts", "copy_end"),
            kernels.lazy().select(k_device="device", k_start="start", k_end="end"),
            pl.col("k_start") < pl.col("copy_end"),
            pl.col("k_end") > pl.col("copy_ts"),
        )
        .filter(pl.col("device") == pl.col("k_device"))
        .group_by("copy")
        .agg(overlapped=overlap_ns("copy_ts", "copy_end", "k_start", "k_end").sum())
    )
    h2d_copies = (  # the columns of H2DCopy's fields
        copy_calls.lazy()
        .join(under, on="copy", how="left")
        .sort("copy")
        .select(
            "correlation",
            "device",
            call_start_ns="ts",
            call_end_ns="end",
            kind="name",
            bytes=pl.col("bytes").fill_null(0),
            duration_ns="dur",
            overlapped_ns=pl.col("overlapped").fill_null(0),
        )
        .collect(engine="in-memory")
    )
    return FixInputs(
        dataloader_waits=tuple(waits.select("ts", "end").iter_rows()),
        dataloader_iterators=tuple(sorted(waits.get_column("name").unique().to_list())),
        h2d_copies=tuple(H2DCopy(**row) for row in h2d_copies.iter_rows(named=True)),
        launch_cost_ns=launch_cost_ns(trace) if launch_cost is None else launch_cost,
        pinned_h2d_gb_per_s=copies.pinned_h2d_rate(trace),
    )


def analyze(
    trace: Trace,
    thresholds: Thresholds | None = None,
    user_code: Collection[str] = (),
    *,
    every_gap: bool = False,
) -> Analysis:
    """Run every analysis on ``trace``; frames of ``user_code`` packages count as the user's.
    ``every_gap`` keeps the table of every gap (:attr:`Analysis.every_gap`)."""
    beside = Beside(thread=second_core())
    try:
        analysis = _analyze(trace, thresholds or Thresholds(), user_code, beside, every_gap=every_gap)
    finally:
        beside.close()
    return analysis


class _SteadyOnly(NamedTuple):
    """The analyses that need no more than the trace and its steady state, run beside (the
    optimizer's and the collectives' statistics, which need no more either, run on the main thread
    meanwhile: it finished its own work first, about 0.3 s before these on a 0.5 GB DDP trace)."""

    warnings: tuple[TraceWarning, ...]
    kernels: TopKernels
    precision: tuple[PrecisionMix, ...]
    latent_syncs: tuple[LatentSync, ...]
    memory: Memory
    flops: Flops


def _steady_only(
    trace: Trace,
    steady: SteadySteps,
    limits: Thresholds,
    user_code: Collection[str],
    common: Shared,
    frame_index: FrameIndex,
) -> _SteadyOnly:
    return _SteadyOnly(
        warnings=trace_warnings(trace, steady, common.launch_calls),
        kernels=top_kernels(trace, top=50),
        precision=precision_mix(trace, steady, classes=common.gpu),
        latent_syncs=latent_syncs(trace, steady, user_code, frame_index=frame_index),
        memory=memory_usage(trace, steady, limits.memory_series_points),
        flops=flop_stats(trace, steady, classes=common.gpu, top=200),
    )


def _analyze(
    trace: Trace, limits: Thresholds, user_code: Collection[str], beside: Beside, *, every_gap: bool = False
) -> Analysis:
    host_later = beside.start(host.host_summary, trace)
    common = shared_tables(trace)
    busy = gpu_time.busy_intervals(trace)
    kernels = gpu_time.kernel_intervals(trace)
    compute = gpu_time.compute_intervals(trace, common.gpu)
    steady = steady_state(trace, limits, common.launch_calls)
    frame_index = FrameIndex(trace, user_code)  # made by the first line looked up, kept for the others
    steady_later = beside.start(_steady_only, trace, steady, limits, user_code, common, frame_index)
    calls = syncs.blocking_calls(
        trace, round(limits.copy_sync_window_us * 1000), user_code, frame_index=frame_index
    )
    iterations = iteration_count(trace)
    gaps = idle_gaps.all_gaps(busy)
    between = list(steady.between_requests)
    gaps = idle_gaps.split_at(gaps, [edge for interval in between for edge in interval])
    launched = syncs.launch_devices(trace)
    optimizer = optimizer_stats(trace, steady)
    communication = communication_stats(trace, steady, common.gpu)
    # What runs beside ends here, before the gaps are classified: the classification and the copy
    # groups are one of the analysis's two memory peaks, and nothing may add to it.
    host_ops, steady_only = host_later(), steady_later()
    classified = idle_gaps.classify_gaps(trace, gaps, calls, limits, user_code, frame_index=frame_index)
    classified = idle_gaps.mark_waiting(classified, between)
    classified = idle_gaps.name_graph_breaks(trace, classified, limits)
    idle_after = syncs.idle_after_calls(calls, gaps, launched, round(limits.sync_drain_slack_us * 1000))
    copy_groups = copies.copy_groups(trace, calls, kernels, limits)
    # The analyses that remain run half beside, half here (on a 0.5 GB DDP trace each half is about
    # 0.4 s of CPU that polars keeps on little more than one core). The halves together are the
    # other peak (the replay's preparation with the step times, then the launch statistics with
    # the fixes' inputs): on 0.5 GB DDP, in-process, 425-432 MiB against the classification's
    # 382-404, so each keeps to the columns it reads and the step windows join nothing.
    replay_later = beside.start(
        prepare_replay, trace, calls, steady, common.launch_calls, common.launch_cost_ns
    )
    launching_later = beside.start(launch_stats, trace, steady, classified, limits)
    timeline_later = beside.start(
        timeline, trace, max_blocks=2000, busy=busy, launched=launched, steady=steady, classes=common.gpu
    )
    devices = gpu_time.device_times(trace, busy, kernels, compute, classified, steady)
    steps = gpu_time.step_times(trace, busy, kernels, compute, classified, steady)
    fixes = _fix_inputs(trace, steady, kernels, common.launch_cost_ns)
    leads = step_leads(
        trace,
        steady,
        calls,
        fixes.dataloader_waits,
        user_code,
        launches=common.launch_calls,
        frame_index=frame_index,
    )
    usage = gpu_time.steady_usage(devices, steps, busy, kernels, compute, classified, steady)
    return Analysis(
        meta=trace.meta,
        thresholds=limits,
        has_gpu=trace.has_gpu_activity,
        iterations=iterations,
        steps_marked=steady.source == "ProfilerStep",
        devices=devices,
        steps=steps,
        idle_gaps=idle_gaps.reported_gaps(classified, limits, trace.meta.origin_ns),
        copies=copy_groups,
        overlap=copies.overlap_ratios(copy_groups),
        syncs=syncs.sync_calls(calls),
        sync_hotspots=syncs.sync_hotspots(calls, idle_after, iterations, classified, steady),
        step_syncs=syncs.steady_step_syncs(calls, steady),
        host=host_ops,
        timeline=timeline_later(),
        kernels=steady_only.kernels,
        steady=steady,
        warnings=steady_only.warnings,
        replay=replay_later(),
        fix_inputs=fixes,
        usage=usage,
        precision=steady_only.precision,
        launching=launching_later(),
        optimizer=optimizer,
        latent_syncs=steady_only.latent_syncs,
        memory=steady_only.memory,
        multi_gpu_processes=launched.group_by("pid").len().filter(pl.col("len") > 1).height,
        communication=communication,
        pace=step_pace(steady, steps, calls, limits.pace_difference),
        step_leads=leads,
        every_gap=classified if every_gap else None,
        flops=with_mfu(steady_only.flops, trace, [(u.device, u.window_ns, u.busy_ns) for u in usage]),
        scopes=scope_times(trace, steady, steady_only.flops),
    )
