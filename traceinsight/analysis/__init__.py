"""Pure analyses over a loaded :class:`~traceinsight.load.Trace`, gathered in :class:`Analysis`."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

from traceinsight.analysis import copies, gpu_time, host, idle_gaps, syncs
from traceinsight.analysis.kernels import TopKernels, top_kernels
from traceinsight.analysis.results import (
    CopyGroup,
    DeviceTime,
    HostSummary,
    IdleGap,
    StepTime,
    SyncCall,
    SyncHotspot,
)
from traceinsight.analysis.timeline import Timeline, timeline
from traceinsight.load import Trace, TraceMeta
from traceinsight.thresholds import Thresholds

__all__ = ["Analysis", "analyze"]


@dataclass(frozen=True, slots=True)
class Analysis:
    """Every measurement of one trace. Times in integer nanoseconds."""

    meta: TraceMeta
    thresholds: Thresholds
    has_gpu: bool
    iterations: int | None  # ProfilerStep spans, else Optimizer.step ranges, else None
    steps_marked: bool  # True when iterations come from ProfilerStep#N spans
    devices: tuple[DeviceTime, ...]
    steps: tuple[StepTime, ...]
    idle_gaps: tuple[IdleGap, ...]
    copies: tuple[CopyGroup, ...]
    overlap: dict[str, float | None]
    syncs: tuple[SyncCall, ...]
    sync_hotspots: tuple[SyncHotspot, ...]
    host: HostSummary
    timeline: Timeline  # downsampled busy blocks and sync marks per device, for charts
    kernels: TopKernels  # kernels by total time

    @property
    def span_ns(self) -> int:
        """Summed GPU span over devices (the denominator for shares of time)."""
        return sum(device.span_ns for device in self.devices)


def analyze(trace: Trace, thresholds: Thresholds | None = None, user_code: Collection[str] = ()) -> Analysis:
    """Run every analysis on ``trace``; frames of ``user_code`` packages count as the user's."""
    limits = thresholds or Thresholds()
    busy = gpu_time.busy_intervals(trace)
    kernels = gpu_time.kernel_intervals(trace)
    gaps = idle_gaps.all_gaps(busy)
    calls = syncs.blocking_calls(trace, round(limits.copy_sync_window_us * 1000), user_code)
    iterations = gpu_time.iteration_count(trace)
    long_gaps = idle_gaps.idle_gaps(trace, gaps, calls, limits, user_code)
    idle_after = syncs.idle_after_calls(
        calls, gaps, syncs.launch_devices(trace), round(limits.sync_drain_slack_us * 1000)
    )
    copy_groups = copies.copy_groups(trace, calls, kernels, limits)
    return Analysis(
        meta=trace.meta,
        thresholds=limits,
        has_gpu=trace.has_gpu_activity,
        iterations=iterations,
        steps_marked=gpu_time.step_windows(trace).height > 0,
        devices=gpu_time.device_times(trace, busy, kernels),
        steps=gpu_time.step_times(trace, busy, long_gaps),
        idle_gaps=long_gaps,
        copies=copy_groups,
        overlap=copies.overlap_ratios(copy_groups),
        syncs=syncs.sync_calls(calls),
        sync_hotspots=syncs.sync_hotspots(calls, idle_after, iterations),
        host=host.host_summary(trace),
        timeline=timeline(trace, max_blocks=2000, busy=busy),
        kernels=top_kernels(trace, top=20),
    )
