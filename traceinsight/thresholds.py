"""Every tunable number of the analyses and rules, in one documented frozen class."""

from __future__ import annotations

from msgspec.structs import force_setattr

from traceinsight.model import Model, fields_of


class Thresholds(Model, frozen=True):
    """Limits that decide what counts as a gap, a stall, a problem. Times in microseconds."""

    #: An idle stretch on a GPU shorter than this is not reported as a gap.
    min_gap_us: float = 50.0
    #: A cause (DataLoader, sync, op) must cover at least this share of a gap to be named its cause.
    cause_coverage: float = 0.5
    #: A gap inside an operator that then launches the work ending it is that operator's dispatch
    #: cost (launch overhead) when shorter than this (µs); longer, it is the host's own work in it.
    dispatch_max_us: float = 1000.0
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
    #: Share of the step time (or steady window) a finding's saving must reach to be high severity
    #: (a third of it: medium; less: low).
    high_severity_share: float = 0.10
    #: A finding saving less than this share of the step time ...
    minor_share: float = 0.01
    #: ... and less than this in all (µs) is listed among the minor findings, not as a card.
    minor_total_us: float = 100.0
    #: The first step is start-up when it takes this many times the median of the others.
    startup_step_factor: float = 2.0
    #: Any other step is an outlier at this many times the median step.
    outlier_step_factor: float = 3.0
    #: A start-up or outlier step must also be this much (µs) longer than the median.
    outlier_min_excess_us: float = 1000.0
    #: Without steps: an operator's call is start-up when it takes this many times its median ...
    first_call_factor: float = 10.0
    #: ... and at least this long (µs), before the operator's usual calls.
    first_call_min_us: float = 10_000.0
    #: `launch-bound` fires when idle in short gaps from the host launching is at least this share
    #: of the step ...
    launch_bound_share: float = 0.10
    #: ... a ``host-bound`` gap being short (the time to dispatch and launch the next kernel) when
    #: under this (µs): longer, it is a pause of the host's own, which no CUDA graph removes ...
    launch_gap_max_us: float = 1000.0
    #: ... and there are at least this many such gaps per steady step (in the window without steps).
    launch_bound_min_gaps: int = 8
    #: `amp-opportunity` / `tf32-opportunity` fire when fp32 GEMM/convolution kernels take at least
    #: this share of the kernel time on a GPU with tensor cores ...
    fp32_matmul_share: float = 0.20
    #: ... and their fix is replayed with those kernels this many times faster (tensor cores run
    #: fp16/bf16 and TF32 matmuls 2-8× faster than fp32 on CUDA cores: 2 is the cautious end).
    tensor_core_speedup: float = 2.0
    #: `low-compute-efficiency` fires when a GPU is busy at least this share of the steady window ...
    busy_for_efficiency: float = 0.8
    #: ... and its counted FLOPs ran below this share of the datasheet peak while busy ...
    low_efficiency: float = 0.3
    #: ... and its saving is bounded by every counted kernel at this share of the peak (dense GEMMs
    #: reach 60-80 % of it; half is the cautious end).
    efficiency_target: float = 0.5
    #: `pipeline-bubble` fires when a GPU waits for another GPU of its process this share of the step.
    pipeline_bubble_share: float = 0.05
    #: A pageable host-to-device copy's fix is replayed at the trace's own pinned copies' rate, or,
    #: in a trace without pinned copies of 1 MiB or more, at this rate (GB/s): what a pinned copy
    #: reaches over PCIe 3.0 x16 (CUDA's bandwidthTest: 12-13 GB/s; PCIe 4.0 doubles it), the
    #: cautious end.
    pinned_h2d_gb_per_s: float = 12.0
    #: `exposed-communication` fires when communication runs without compute this share of the step.
    exposed_communication_share: float = 0.10
    #: Collectives of one kind are the per-parameter pattern (named, with bucketing advice) at this
    #: many per steady step (in the window without steps) in a training trace ...
    collectives_per_step_many: int = 50
    #: ... when their median kernel is shorter than this (µs): latency-bound, far below a bucket.
    collective_small_us: float = 100.0
    #: `memory-pressure` fires when the peak reserved (or allocated) memory of a GPU reaches this
    #: share of its total memory (the TensorBoard plugin's 90 %) ...
    memory_pressure_share: float = 0.9
    #: ... or when allocator calls (cudaMalloc/cudaFree) happen in at least this share of the
    #: steady steps (at least 2 of them) ...
    allocator_churn_step_share: float = 0.5
    #: ... or, in a trace without steps, at least this many times in the steady window.
    allocator_churn_min_calls: int = 4
    #: Points per device in the memory-over-time series (each the maximum of its time bucket).
    memory_series_points: int = 600
    #: `optimizer-not-fused` fires at this many kernels per optimizer step, none multi-tensor ...
    optimizer_kernels_per_step: int = 50
    #: ... and `zero_grad` at this many zeroing kernels per call.
    zero_grad_kernels: int = 10
    #: The DataLoader fix is replayed as a hand-over of this long (µs) per batch: with workers,
    #: ``__next__`` took 0.08–1.4 ms on the kineto ResNet-50 sample (4 workers).
    dataloader_handover_us: float = 1000.0
    #: The host or the GPU sets the pace of the steps when its own time per step is this share
    #: above the other's (see :mod:`traceinsight.analysis.pace`).
    pace_difference: float = 0.20
    #: `host-preprocessing` fires when the GPU waits for the host's work before each step's first
    #: GPU work at least this share of the steady steps (and in every steady step).
    host_preprocessing_share: float = 0.10
    #: With one steady step (nothing shows the wait repeats) it fires at this share of the step.
    host_preprocessing_one_step_share: float = 0.30

    def __post_init__(self) -> None:
        # ``min_gap_us=200``, ``min-gap-us = 20`` in a project file: a float where the threshold is
        # one, however it was given (a result's JSON writes the thresholds an analysis ran with).
        declared = type(self).__annotations__
        for item in fields_of(self):
            value = getattr(self, item.name)
            if declared.get(item.name) == "float" and type(value) is int:
                force_setattr(self, item.name, float(value))
