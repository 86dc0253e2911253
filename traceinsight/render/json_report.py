"""The JSON output: a stable contract for scripts. Times in microseconds (floats), sizes in bytes.

Top-level keys (never renamed; new keys may be added): ``schema``, ``trace``, ``devices``, ``steps``,
``idle_gaps``, ``memcpy``, ``overlap``, ``syncs``, ``sync_hotspots``, ``findings``, ``host``.
``start_us`` values are relative to the trace's earliest event (``trace.origin_us``).
"""

from __future__ import annotations

import json
from typing import Any

from traceinsight import __version__
from traceinsight.report import Report

SCHEMA_VERSION = 1


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def report_dict(report: Report) -> dict[str, Any]:
    """The whole report as plain JSON-ready data."""
    analysis = report.analysis
    meta = analysis.meta
    origin = meta.origin_ns
    return {
        "schema": SCHEMA_VERSION,
        "tool": {"name": "traceinsight", "version": __version__},
        "trace": {
            "path": meta.path,
            "name": report.trace_name,
            "era": meta.era,
            "events": meta.event_count,
            "rank": meta.rank,
            "world_size": meta.world_size,
            "backend": meta.backend,
            "origin_us": _us(origin),
            "base_time_ns": meta.base_time_ns,
            "cuda_runtime_version": meta.cuda_runtime_version,
            "cuda_driver_version": meta.cuda_driver_version,
            "hip_runtime_version": meta.hip_runtime_version,
            "has_gpu_activity": analysis.has_gpu,
            "gpus_listed": meta.gpus_listed,
            "iterations": analysis.iterations,
            "steps_marked": analysis.steps_marked,
        },
        "run": None
        if report.run is None
        else {
            "command": report.run.command,
            "script": report.run.script,
            "started": report.run.started,
            "torch_version": report.run.torch_version,
            "elapsed_s": round(report.run.elapsed_s, 3),
            "exit_status": report.run.exit_status,
            "failure": report.run.failure,
            "steps_recorded": report.run.steps_recorded,
        },
        "devices": [
            {
                "device": device.device,
                "name": device.name,
                "span_us": _us(device.span_ns),
                "busy_us": _us(device.busy_ns),
                "idle_us": _us(device.idle_ns),
                "kernel_us": _us(device.kernel_ns),
                "copy_us": _us(device.copy_ns),
                "utilization": round(device.utilization, 4),
            }
            for device in analysis.devices
        ],
        "steps": [
            {
                "step": step.step,
                "device": step.device,
                "start_us": _us(step.start_ns - origin),
                "span_us": _us(step.span_ns),
                "busy_us": _us(step.busy_ns),
                "idle_us": _us(step.idle_ns),
                "copy_us": _us(step.copy_ns),
                "idle_by_cause_us": {cause: _us(ns) for cause, ns in step.idle_by_cause_ns},
            }
            for step in analysis.steps
        ],
        "idle_gaps": [
            {
                "device": gap.device,
                "start_us": _us(gap.start_ns - origin),
                "duration_us": _us(gap.duration_ns),
                "cause_kind": gap.cause_kind,
                "cause": gap.cause,
                "source": gap.source,
            }
            for gap in analysis.idle_gaps
        ],
        "memcpy": [
            {
                "device": group.device,
                "kind": group.kind,
                "direction": group.direction,
                "src": group.src,
                "dst": group.dst,
                "count": group.count,
                "bytes": group.bytes,
                "duration_us": _us(group.duration_ns),
                "overlapped_us": _us(group.overlapped_ns),
                "bandwidth_gbps": None if group.bandwidth_gbps is None else round(group.bandwidth_gbps, 3),
                "host_blocked": group.host_blocked,
            }
            for group in analysis.copies
        ],
        "overlap": {
            direction: None if ratio is None else round(ratio, 4)
            for direction, ratio in analysis.overlap.items()
        },
        "syncs": [
            {"call": call.call, "count": call.count, "blocked_us": _us(call.blocked_ns)}
            for call in analysis.syncs
        ],
        "sync_hotspots": [
            {
                "call": hotspot.call,
                "op": hotspot.op,
                "op_chain": hotspot.op_chain,
                "source": hotspot.source,
                "copy": hotspot.copy,
                "count": hotspot.count,
                "per_step": None if hotspot.per_step is None else round(hotspot.per_step, 4),
                "blocked_us": _us(hotspot.blocked_ns),
                "idle_after_us": _us(hotspot.idle_after_ns),
            }
            for hotspot in analysis.sync_hotspots
        ],
        "findings": [
            {
                "rule": finding.rule,
                "severity": finding.severity,
                "title": finding.title,
                "evidence": {label: value for label, value in finding.evidence},
                "savings_us": _us(finding.savings_ns),
                "advice": {
                    "summary": finding.advice.summary,
                    "before": finding.advice.before,
                    "after": finding.advice.after,
                },
                "why": finding.why,
                "op": finding.op,
                "source": finding.source,
                "device": finding.device,
            }
            for finding in report.findings
        ],
        "host": {
            "threads": analysis.host.threads,
            "cpu_ops": analysis.host.cpu_ops,
            "python_frames": analysis.host.python_frames,
            "dataloader_us": _us(analysis.host.dataloader_ns),
            "dataloader_count": analysis.host.dataloader_count,
            "top_ops": [
                {"name": name, "count": count, "total_us": _us(total)}
                for name, count, total in analysis.host.top_ops
            ],
        },
    }


class JsonRenderer:
    """Renders :func:`report_dict` as indented JSON."""

    def render(self, report: Report) -> str:
        """The report as a JSON document (UTF-8, keys in contract order)."""
        return json.dumps(report_dict(report), indent=2, ensure_ascii=False) + "\n"
