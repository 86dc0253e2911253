"""An analysis as its :class:`~.trace.Result`: what each figure of the JSON contract is.

Times stay integer nanoseconds (the JSON writes them as µs); ``start`` times are taken from the
trace's earliest event; shares and rates are rounded as the JSON has always written them (shares
to 4 decimals, bandwidths to 3), so that a result read back from its JSON equals this one.
"""

from __future__ import annotations

from dataclasses import fields
from operator import attrgetter, sub
from typing import Any, TypeVar

from traceinsight.analysis.results import from_columns
from traceinsight.analysis.usage import Usage, total_usage
from traceinsight.results import trace as t
from traceinsight.results.codec import us
from traceinsight.results.flops import flops_of, scopes_of
from traceinsight.results.report import Report
from traceinsight.rules.findings import Severity

__all__ = ["result_of", "utilization_of"]


_Entry = TypeVar("_Entry")


def _mirrored(entry: type[_Entry], source: Any) -> _Entry:
    """``entry`` made from the fields of ``source`` that it shares by name (an analysis result
    whose contract entry keeps every field as it is)."""
    return entry(**{item.name: getattr(source, item.name) for item in fields(entry)})  # type: ignore[arg-type]


def _share(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def _causes(pairs: tuple[tuple[str, int], ...]) -> dict[str, int]:
    return dict(pairs)


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


def _memory(report: Report) -> t.Memory:
    memory = report.analysis.memory
    churn = memory.churn
    return t.Memory(
        devices=tuple(
            t.MemoryDevice(
                device=device.label,
                device_type=device.device_type,
                device_id=device.device_id,
                records=device.records,
                peak_allocated_bytes=device.peak_allocated_bytes,
                peak_allocated_at_ns=device.peak_allocated_at_ns,
                allocated_is_lower_bound=device.allocated_is_lower_bound,
                peak_reserved_bytes=device.peak_reserved_bytes,
                total_memory_bytes=device.total_memory_bytes,
                peak_share=_share(device.peak_share),
                series=tuple(
                    t.MemorySample(at, allocated, reserved) for at, allocated, reserved in device.series
                ),
            )
            for device in memory.devices
        ),
        allocator_calls=t.AllocatorCalls(
            count=churn.calls,
            host_ns=churn.call_ns,
            by_name=tuple(
                t.AllocatorCall(call=name, count=count, host_ns=ns) for name, count, ns in churn.by_name
            ),
            steady_steps=churn.steady_steps,
            steps_with_calls=churn.steps_with_calls,
        ),
    )


def _gaps(report: Report) -> tuple[t.IdleGap, ...]:
    """Every reported gap, its start from the trace's earliest event. Column by column
    (:func:`~traceinsight.analysis.results.from_columns`): an LLM decode trace reports tens of
    thousands."""
    gaps = report.analysis.idle_gaps
    origin = report.analysis.meta.origin_ns

    def column(name: str) -> list[Any]:
        return list(map(attrgetter(name), gaps))

    starts, ends = column("start_ns"), column("end_ns")
    columns = (
        column("device"),
        [start - origin for start in starts],
        list(map(sub, ends, starts)),
        column("cause_kind"),
        column("cause"),
        column("source"),
        column("source_kind"),
        column("source_line_kind"),
        column("source_function"),
    )
    return from_columns(t.IdleGap, columns)


def _findings(report: Report) -> tuple[t.Finding, ...]:
    return tuple(
        t.Finding(
            rule=finding.rule,
            severity=Severity(finding.severity),
            title=finding.title,
            evidence=tuple(dict(finding.evidence).items()),  # the JSON's object keeps one row per label
            savings_ns=finding.savings_ns,
            advice=t.Advice(
                summary=finding.advice.summary, before=finding.advice.before, after=finding.advice.after
            ),
            why=finding.why,
            op=finding.op,
            source=finding.source,
            device=finding.device,
            minor=finding.minor,
            saving_per_step_ns=finding.saving_per_step_ns,
            saving_share=_share(finding.saving_share),
            saving_note=finding.saving_note,
            saving_known=finding.saving_known,
            source_kind=finding.source_kind,
            source_line_kind=finding.source_line_kind,
            source_function=finding.source_function,
            framework_call=finding.framework_call,
        )
        for finding in report.findings
    )


def result_of(report: Report) -> t.Result:
    """The result of ``report``'s analysis: the JSON contract, typed (see :mod:`.trace`)."""
    analysis = report.analysis
    meta = analysis.meta
    origin = meta.origin_ns
    steady = analysis.steady
    pace = analysis.pace
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
        ),
        run=None
        if run is None
        else t.RunInfo(
            command=run.command,
            script=run.script,
            started=run.started,
            torch_version=run.torch_version,
            elapsed_s=round(run.elapsed_s, 3),
            exit_status=run.exit_status,
            failure=run.failure,
            steps_recorded=run.steps_recorded,
        ),
        warnings=tuple(
            t.TraceWarning(kind=warning.kind, message=warning.message, advice=warning.advice)
            for warning in analysis.warnings
        ),
        steady_state=t.SteadyState(
            steps_from=steady.source,
            step_time_ns=steady.step_ns,
            host_step_time_ns=steady.host_step_ns,
            pace=t.Pace(
                set_by=None if pace.setter is None else pace.setter.value,
                host_ns=pace.host_ns,
                gpu_ns=pace.gpu_ns,
            ),
            steady_steps=len(steady.steady_steps),
            windows_ns=tuple(t.Window(start - origin, end - origin) for start, end in steady.windows),
            gpu_windows_ns=tuple(
                t.Window(start - origin, end - origin) for start, end in steady.device_windows
            ),
            startup_end_ns=None if steady.startup_end_ns is None else steady.startup_end_ns - origin,
            startup_evidence=steady.startup_evidence,
        ),
        utilization=utilization_of(total_usage(analysis.usage), bool(analysis.usage)),
        devices=tuple(
            t.Device(
                device=device.device,
                name=device.name,
                span_ns=device.span_ns,
                busy_ns=device.busy_ns,
                idle_ns=device.idle_ns,
                kernel_ns=device.kernel_ns,
                copy_ns=device.copy_ns,
                utilization=round(device.utilization, 4),
                compute_ns=device.compute_ns,
                communication_ns=device.communication_ns,
                copy_exposed_ns=device.copy_exposed_ns,
                idle_by_cause_ns=_causes(device.idle_by_cause_ns),
            )
            for device in analysis.devices
        ),
        steps=tuple(
            t.Step(
                step=step.step,
                device=step.device,
                start_ns=step.start_ns - origin,
                span_ns=step.span_ns,
                host_start_ns=step.host_start_ns - origin,
                host_span_ns=step.host_end_ns - step.host_start_ns,
                busy_ns=step.busy_ns,
                idle_ns=step.idle_ns,
                copy_ns=step.copy_ns,
                idle_by_cause_ns=_causes(step.idle_by_cause_ns),
                compute_ns=step.compute_ns,
                communication_ns=step.communication_ns,
                copy_exposed_ns=step.copy_exposed_ns,
                steady=step.steady,
                not_steady_because=step.reason,
            )
            for step in analysis.steps
        ),
        idle_gaps=_gaps(report),
        memcpy=tuple(
            t.CopyGroup(
                device=group.device,
                kind=group.kind,
                direction=group.direction,
                src=group.src,
                dst=group.dst,
                count=group.count,
                bytes=group.bytes,
                duration_ns=group.duration_ns,
                overlapped_ns=group.overlapped_ns,
                bandwidth_gbps=None if group.bandwidth_gbps is None else round(group.bandwidth_gbps, 3),
                host_blocked=group.host_blocked,
            )
            for group in analysis.copies
        ),
        overlap={direction: _share(ratio) for direction, ratio in analysis.overlap.items()},
        syncs=tuple(
            t.SyncCall(call=call.call, count=call.count, blocked_ns=call.blocked_ns)
            for call in analysis.syncs
        ),
        sync_hotspots=tuple(
            t.SyncHotspot(
                call=hotspot.call,
                op=hotspot.op,
                op_chain=hotspot.op_chain,
                source=hotspot.source,
                copy=hotspot.copy,
                count=hotspot.count,
                per_step=_share(hotspot.per_step),
                blocked_ns=hotspot.blocked_ns,
                idle_after_ns=hotspot.idle_after_ns,
                source_kind=hotspot.source_kind,
                steady_count=hotspot.steady_count,
                idle_caused_ns=hotspot.idle_caused_ns,
                then_call=hotspot.then_call,
                source_line_kind=hotspot.source_line_kind,
                source_function=hotspot.source_function,
                framework_call=hotspot.framework_call,
            )
            for hotspot in analysis.sync_hotspots
        ),
        latent_syncs=tuple(_mirrored(t.LatentSync, latent) for latent in analysis.latent_syncs),
        findings=_findings(report),
        kernels=tuple(
            t.Kernel(
                device=stat.device,
                name=stat.name,
                count=stat.count,
                total_ns=stat.total_ns,
                mean_ns=stat.mean_ns,
                max_ns=stat.max_ns,
            )
            for stat in analysis.kernels.kernels
        ),
        host=t.Host(
            threads=analysis.host.threads,
            cpu_ops=analysis.host.cpu_ops,
            python_frames=analysis.host.python_frames,
            dataloader_ns=analysis.host.dataloader_ns,
            dataloader_count=analysis.host.dataloader_count,
            top_ops=tuple(
                t.HostOp(name=name, count=count, total_ns=total, self_ns=own)
                for (name, count, total), own in zip(
                    analysis.host.top_ops, analysis.host.top_ops_self, strict=True
                )
            ),
        ),
        memory=_memory(report),
        flops=flops_of(analysis.flops),
        scopes=scopes_of(analysis.scopes),
        report=report,
    )
