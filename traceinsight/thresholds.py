"""Every tunable number of the analyses and rules, in one documented dataclass."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Limits that decide what counts as a gap, a stall, a problem. Times in microseconds."""

    #: An idle stretch on a GPU shorter than this is not reported as a gap.
    min_gap_us: float = 50.0
    #: A cause (DataLoader, sync, op) must cover at least this share of a gap to be named its cause.
    cause_coverage: float = 0.5
    #: A sync that returned this long (or less) before a gap began still drained the queue for it.
    sync_drain_slack_us: float = 50.0
    #: A copy's host call followed this soon by a blocking sync counts as blocking the host.
    copy_sync_window_us: float = 50.0
    #: GPU busy share below which `low-gpu-utilization` fires.
    low_utilization: float = 0.5
    #: GPUs active for less than this are too short to judge utilization on.
    min_span_us: float = 1000.0
    #: `dataloader-stall` fires when DataLoader-caused idle is at least this share of the GPU span.
    dataloader_idle_share: float = 0.05
    #: `blocking-h2d` fires when HtoD overlap is below this ratio ...
    h2d_overlap_ratio: float = 0.5
    #: ... and the unoverlapped HtoD copy time is at least this share of the GPU span.
    h2d_exposed_share: float = 0.005
    #: `sync-in-loop` needs at least this many occurrences when the trace has no step markers.
    sync_min_repeats: int = 3
    #: Share of the GPU span at which a finding is high (and a tenth of it medium) severity.
    high_severity_share: float = 0.10
