"""An analysis as its :class:`~.trace.Result`: what each figure of the JSON contract is.

Times stay integer nanoseconds (the JSON writes them as µs); ``start`` times are taken from the
trace's earliest event; shares and rates are rounded as the JSON has always written them (shares
to 4 decimals, bandwidths to 3), so that a result read back from its JSON equals this one.
"""

from __future__ import annotations

from traceinsight.analysis.usage import Usage, total_usage
from traceinsight.results import trace as t
from traceinsight.results.codec import us
from traceinsight.results.flops import scopes_of
from traceinsight.results.report import Report

__all__ = ["result_of", "utilization_of"]


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def utilization_of(usage: Usage, judged: bool) -> t.Utilization:
    """``utilization``: the time judged, busy by class, idle by cause (``judged``: whether the
    trace had a steady state on a GPU; ``of`` is null when not)."""
    window = usage.window_ns

    def share(ns: int) -> float | None:
        return round(ns / window, 4) if window else None

    return t.Utilization(
        of=usage.of_what if judged else None,
        window_ns=window,
        busy_share=share(usage.busy_ns),
        compute_share=share(usage.compute_ns),
        communication_share=share(usage.communication_ns),
        copy_share=share(usage.copy_ns),
        idle_share=share(usage.idle_ns),
        idle_by_cause_ns={kind.value: ns for kind, ns in usage.idle},
    )


def result_of(report: Report) -> t.Result:
    """The result of ``report``'s analysis: the JSON contract, typed (see :mod:`.trace`)."""
    analysis = report.analysis
    meta = analysis.meta
    origin = meta.origin_ns
    steady = analysis.steady
    run = report.run
    return t.Result(
        trace=t.TraceInfo(
            path=meta.path,
            name=report.trace_name,
            era=meta.era,
            events=meta.event_count,
            rank=meta.rank,
            world_size=meta.world_size,
            backend=meta.backend,
            origin_us=us(origin),
            base_time_ns=meta.base_time_ns,
            cuda_runtime_version=meta.cuda_runtime_version,
            cuda_driver_version=meta.cuda_driver_version,
            hip_runtime_version=meta.hip_runtime_version,
            has_gpu_activity=analysis.has_gpu,
            gpus_listed=meta.gpus_listed,
            iterations=analysis.iterations,
            steps_marked=analysis.steps_marked,
            step_usage=() if meta.recorded_by_run is None else meta.recorded_by_run.step_usage,
        ),
        run=run,
        warnings=tuple(analysis.warnings),
        steady_state=t.SteadyState(
            steps_from=steady.source,
            step_time_ns=steady.step_ns,
            host_step_time_ns=steady.host_step_ns,
            pace=analysis.pace,
            steady_steps=len(steady.steady_steps),
            windows_ns=tuple(t.Window(start - origin, end - origin) for start, end in steady.windows),
            gpu_windows_ns=tuple(
                t.Window(start - origin, end - origin) for start, end in steady.device_windows
            ),
            startup_end_ns=None if steady.startup_end_ns is None else steady.startup_end_ns - origin,
            startup_evidence=steady.startup_evidence,
            step_times_ns=tuple(step.duration_ns for step in steady.steady_steps),
            step_syncs=analysis.step_syncs,
        ),
        utilization=utilization_of(total_usage(analysis.usage), bool(analysis.usage)),
        devices=analysis.devices,
        steps=analysis.steps,
        idle_gaps=analysis.idle_gaps,
        memcpy=analysis.copies,
        overlap={direction: _share(ratio) for direction, ratio in analysis.overlap.items()},
        syncs=analysis.syncs,
        sync_hotspots=analysis.sync_hotspots,
        latent_syncs=analysis.latent_syncs,
        findings=report.findings,
        kernels=analysis.kernels.kernels,
        host=analysis.host,
        memory=analysis.memory,
        flops=analysis.flops,
        scopes=scopes_of(analysis.scopes),
        details=details_of(report),
        source_root=report.source_root,
        report=report,
    )


def details_of(report: Report) -> t.Details:
    """``details``: what the summary, the page and the Markdown show beyond the other figures."""
    analysis = report.analysis
    meta = analysis.meta
    origin = meta.origin_ns
    steady = analysis.steady
    devices = analysis.devices
    kernels = analysis.kernels
    return t.Details(
        gpus=meta.devices,
        foreign_accelerator=meta.foreign_accelerator,
        gpu_span_ns=t.Window(
            min(device.first_ns for device in devices) - origin,
            max(device.last_ns for device in devices) - origin,
        )
        if devices
        else None,
        thresholds=analysis.thresholds,
        usage=analysis.usage,
        steps_found=len(steady.steps),
        steps_left_out=tuple(step.step for step in steady.steps if not step.steady),
        request_name=steady.request_name,
        request_from_pattern=steady.request_from_pattern,
        waiting_ns=steady.waiting_ns,
        kernel_launches=kernels.kernel_count,
        kernels_distinct=kernels.distinct,
        kernel_totals=tuple(t.KernelTotal(device, ns) for device, ns in kernels.total_ns_by_device),
        timeline=analysis.timeline,
    )
