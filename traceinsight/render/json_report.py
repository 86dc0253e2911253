"""The JSON output: a stable contract for scripts. Times in microseconds (floats), sizes in bytes.

Top-level keys (never renamed; new keys may be added): ``schema``, ``trace``, ``run``, ``warnings``,
``steady_state``, ``utilization``, ``devices``, ``steps``, ``idle_gaps``, ``memcpy``, ``overlap``,
``syncs``, ``sync_hotspots``, ``findings``, ``host``, ``memory``. ``start_us`` values are relative to the
trace's earliest event (``trace.origin_us``).

Schema 2 (this version) added ``warnings``, ``steady_state``, ``utilization``, the busy classes and
idle split of ``devices`` and ``steps``, and per finding ``minor``, ``savings_per_step_us``,
``saving_share``, ``saving_note``, ``source_kind``; ``savings_us`` is now the step replay's
saving, and ``cause_kind`` has the values of :class:`~traceinsight.analysis.causes.CauseKind`.
Later additions within schema 2: ``kernels``, ``memory`` (per device: peaks in bytes, the device's
total, ``series`` of ``[start_us, allocated, reserved]``; ``allocator_calls`` in the steady state);
the ``cause_kind`` value ``other-gpu`` (a GPU waiting for another GPU of its process: a pipeline
bubble) and the finding rule ``pipeline-bubble``;
beside each ``source`` (idle gaps, sync hot spots, findings) ``source_line_kind`` (what the line is:
``call``, the call's line; ``def``, the first line of ``source_function``, as torch's stack names
it; ``recording-start``, the line ``source_function`` was on when recording began; null when the
trace does not say) and ``source_function``; on sync hot spots and findings ``framework_call``
(framework code the calls happen in that reads values on the host by design, such as
``torch.optim.LBFGS``). ``source`` keeps its meaning: the frame's ``file:line``;
``latent_syncs`` (in a trace without GPU work: per line, the operators that would make the host
wait for a GPU, and apart, with ``cpu_value`` set, the reads of values that stay on the CPU with a
GPU too: ``data loading``, ``optimizer step counters``; empty with GPU work).
"""

from __future__ import annotations

import json
import uuid
from json.encoder import encode_basestring
from typing import Any, Final

import polars as pl

from traceinsight import __version__
from traceinsight.analysis.usage import Usage, total_usage
from traceinsight.report import Report

SCHEMA_VERSION = 2


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _causes(pairs: tuple[tuple[str, int], ...]) -> dict[str, float]:
    return {cause: _us(ns) for cause, ns in pairs}


def _utilization(report: Report) -> dict[str, Any]:
    """The steady state over every device: the time judged, busy by class, idle by cause."""
    return usage_dict(total_usage(report.analysis.usage), bool(report.analysis.usage))


def usage_dict(usage: Usage, judged: bool) -> dict[str, Any]:
    """``utilization`` of the JSON: the time judged, busy by class, idle by cause (``judged``:
    whether the trace had a steady state on a GPU; ``of`` is null when not)."""
    window = usage.window_ns

    def share(ns: int) -> float | None:
        return round(ns / window, 4) if window else None

    return {
        "of": usage.of_what if judged else None,
        "window_us": _us(window),
        "busy_share": share(usage.busy_ns),
        "compute_share": share(usage.compute_ns),
        "communication_share": share(usage.communication_ns),
        "copy_share": share(usage.copy_ns),
        "idle_share": share(usage.idle_ns),
        "idle_by_cause_us": {kind.value: _us(ns) for kind, ns in usage.idle},
    }


def _memory(report: Report) -> dict[str, Any]:
    """Peak memory per device (bytes) and its series; the allocator's calls in the steady state."""
    memory = report.analysis.memory
    churn = memory.churn
    return {
        "devices": [
            {
                "device": device.label,
                "device_type": device.device_type,
                "device_id": device.device_id,
                "records": device.records,
                "peak_allocated_bytes": device.peak_allocated_bytes,
                "peak_allocated_at_us": _us(device.peak_allocated_at_ns),
                "allocated_is_lower_bound": device.allocated_is_lower_bound,
                "peak_reserved_bytes": device.peak_reserved_bytes,
                "total_memory_bytes": device.total_memory_bytes,
                "peak_share": None if device.peak_share is None else round(device.peak_share, 4),
                "series": [[_us(t), allocated, reserved] for t, allocated, reserved in device.series],
            }
            for device in memory.devices
        ],
        "allocator_calls": {
            "count": churn.calls,
            "host_us": _us(churn.call_ns),
            "by_name": [
                {"call": name, "count": count, "host_us": _us(ns)} for name, count, ns in churn.by_name
            ],
            "steady_steps": churn.steady_steps,
            "steps_with_calls": churn.steps_with_calls,
        },
    }


def report_dict(report: Report, *, gaps: bool = True) -> dict[str, Any]:
    """The whole report as plain JSON-ready data (``gaps=False``: ``idle_gaps`` left empty, for a
    caller that writes them itself, see :func:`_gap_rows`)."""
    analysis = report.analysis
    meta = analysis.meta
    origin = meta.origin_ns
    steady = analysis.steady
    pace = analysis.pace
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
        "warnings": [
            {"kind": warning.kind, "message": warning.message, "advice": warning.advice}
            for warning in analysis.warnings
        ],
        "steady_state": {
            "steps_from": steady.source,
            "step_time_us": None if steady.step_ns is None else _us(steady.step_ns),
            "host_step_time_us": None if steady.host_step_ns is None else _us(steady.host_step_ns),
            "pace": {
                "set_by": None if pace.setter is None else pace.setter.value,
                "host_us": None if pace.host_ns is None else _us(pace.host_ns),
                "gpu_us": None if pace.gpu_ns is None else _us(pace.gpu_ns),
            },
            "steady_steps": len(steady.steady_steps),
            "windows_us": [[_us(start - origin), _us(end - origin)] for start, end in steady.windows],
            "gpu_windows_us": [
                [_us(start - origin), _us(end - origin)] for start, end in steady.device_windows
            ],
            "startup_end_us": None if steady.startup_end_ns is None else _us(steady.startup_end_ns - origin),
            "startup_evidence": steady.startup_evidence,
        },
        "utilization": _utilization(report),
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
                "compute_us": _us(device.compute_ns),
                "communication_us": _us(device.communication_ns),
                "copy_exposed_us": _us(device.copy_exposed_ns),
                "idle_by_cause_us": _causes(device.idle_by_cause_ns),
            }
            for device in analysis.devices
        ],
        "steps": [
            {
                "step": step.step,
                "device": step.device,
                "start_us": _us(step.start_ns - origin),
                "span_us": _us(step.span_ns),
                "host_start_us": _us(step.host_start_ns - origin),
                "host_span_us": _us(step.host_end_ns - step.host_start_ns),
                "busy_us": _us(step.busy_ns),
                "idle_us": _us(step.idle_ns),
                "copy_us": _us(step.copy_ns),
                "idle_by_cause_us": _causes(step.idle_by_cause_ns),
                "compute_us": _us(step.compute_ns),
                "communication_us": _us(step.communication_ns),
                "copy_exposed_us": _us(step.copy_exposed_ns),
                "steady": step.steady,
                "not_steady_because": step.reason,
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
                "source_kind": gap.source_kind,
                "source_line_kind": gap.source_line_kind,
                "source_function": gap.source_function,
            }
            for gap in (analysis.idle_gaps if gaps else ())
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
                "source_kind": hotspot.source_kind,
                "steady_count": hotspot.steady_count,
                "idle_caused_us": _us(hotspot.idle_caused_ns),
                "then_call": hotspot.then_call,
                "source_line_kind": hotspot.source_line_kind,
                "source_function": hotspot.source_function,
                "framework_call": hotspot.framework_call,
            }
            for hotspot in analysis.sync_hotspots
        ],
        "latent_syncs": [
            {
                "op": latent.op,
                "ops": list(latent.ops),
                "op_chain": latent.op_chain,
                "source": latent.source,
                "source_kind": latent.source_kind,
                "module": latent.module,
                "count": latent.count,
                "steady_count": latent.steady_count,
                "formatting": latent.formatting,
                "cpu_value": latent.cpu_value,
                "cpu_detail": latent.cpu_detail,
                "source_line_kind": latent.source_line_kind,
                "source_function": latent.source_function,
                "framework_call": latent.framework_call,
            }
            for latent in analysis.latent_syncs
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
                "minor": finding.minor,
                "savings_per_step_us": None
                if finding.saving_per_step_ns is None
                else _us(finding.saving_per_step_ns),
                "saving_share": None if finding.saving_share is None else round(finding.saving_share, 4),
                "saving_note": finding.saving_note,
                "saving_known": finding.saving_known,
                "source_kind": finding.source_kind,
                "source_line_kind": finding.source_line_kind,
                "source_function": finding.source_function,
                "framework_call": finding.framework_call,
            }
            for finding in report.findings
        ],
        "kernels": [
            {
                "device": stat.device,
                "name": stat.name,
                "count": stat.count,
                "total_us": _us(stat.total_ns),
                "mean_us": _us(stat.mean_ns),
                "max_us": _us(stat.max_ns),
            }
            for stat in analysis.kernels.kernels
        ],
        "host": {
            "threads": analysis.host.threads,
            "cpu_ops": analysis.host.cpu_ops,
            "python_frames": analysis.host.python_frames,
            "dataloader_us": _us(analysis.host.dataloader_ns),
            "dataloader_count": analysis.host.dataloader_count,
            "top_ops": [
                {"name": name, "count": count, "total_us": _us(total), "self_us": _us(own)}
                for (name, count, total), own in zip(
                    analysis.host.top_ops, analysis.host.top_ops_self, strict=True
                )
            ],
        },
        "memory": _memory(report),
    }


def _scalar(value: object) -> str | None:
    """``value`` as ``json.dumps(value, ensure_ascii=False)`` writes it, for None, bools, ints,
    floats and strings; None for anything else."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value - value != 0:  # NaN or an infinity: strict parsers refuse what json writes for them
            raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
        return float.__repr__(value)
    if isinstance(value, str):
        return encode_basestring(value)
    return None


def _encoded_column(values: list[Any]) -> list[str] | None:
    """Each value as :func:`_scalar` writes it (None if one is not a scalar)."""
    out: list[str] = []
    strings: dict[str, str] = {}  # causes, sources and kinds repeat from row to row
    for value in values:
        kind = type(value)
        if kind is str:
            text = strings.get(value)
            if text is None:
                text = strings[value] = encode_basestring(value)
        elif kind is int:
            text = int.__repr__(value)
        elif kind is float and value - value == 0:  # finite
            text = float.__repr__(value)
        else:
            scalar = _scalar(value)
            if scalar is None:
                return None
            text = scalar
        out.append(text)
    return out


def _flat_rows(rows: list[Any]) -> str | None:
    """A top-level list of flat objects (the same string keys in the same order, scalar values) as
    ``json.dumps(..., indent=2)`` writes it at depth 1, or None when it is not one.

    The standard encoder indents in Python, several calls per value; an LLM decode trace reports
    tens of thousands of gaps. Here each column is encoded in one pass and each row is one
    ``%`` format of a template with the keys already written.
    """
    if not rows or not isinstance(rows[0], dict) or not rows[0]:
        return None
    keys = tuple(rows[0])
    if not all(isinstance(key, str) for key in keys):
        return None
    if not all(isinstance(row, dict) and tuple(row) == keys for row in rows):
        return None
    columns = []
    for key in keys:
        column = _encoded_column([row[key] for row in rows])
        if column is None:
            return None
        columns.append(column)
    fields = ",\n".join(f"      {encode_basestring(key).replace('%', '%%')}: %s" for key in keys)
    template = "    {\n" + fields + "\n    }"
    return "[\n" + ",\n".join(template % values for values in zip(*columns, strict=True)) + "\n  ]"


#: Below this many ns in magnitude (10^12 µs, 11.6 days), ``_us(ns)``'s float is the one nearest
#: ``ns / 1000`` and has at most 15 significant digits, so its repr is that decimal, trailing zeros
#: cut (at least one fraction digit): what :func:`_us_texts` writes without floats.
_EXACT_NS: Final = 10**15


def _us_texts(ns: list[int]) -> pl.Series:
    """Each ``_scalar(_us(value))`` of ``ns`` (every ``abs(value) < _EXACT_NS``), by integer
    arithmetic on the whole column."""
    values = pl.lit(pl.Series(ns, dtype=pl.Int64))
    magnitude = values.abs()
    fraction = (magnitude % 1000).cast(pl.String).str.zfill(3).str.strip_chars_end("0")
    whole = (magnitude // 1000).cast(pl.String)
    text = pl.concat_str(whole, pl.lit("."), pl.when(fraction == "").then(pl.lit("0")).otherwise(fraction))
    return pl.select(pl.when(values < 0).then(pl.lit("-") + text).otherwise(text)).to_series()


def _encoded(values: list[Any]) -> pl.Series:
    """Each value of a column of strings, Nones and ints as :func:`_scalar` writes it (each distinct
    value encoded once)."""
    texts = {value: _scalar(value) for value in set(values)}
    return pl.Series([texts[value] for value in values], dtype=pl.String)


def _gap_rows(report: Report) -> str | None:
    """``report_dict(report)["idle_gaps"]`` as :func:`_flat_rows` writes it, or None where that
    path must (fewer than 101 gaps, a time too far from the trace's start for :func:`_us_texts`).

    An LLM decode trace reports tens of thousands of gaps: here each column is taken from the gaps
    once and turned into text by polars (times by integer arithmetic, strings once per distinct
    value), with no dict per gap."""
    gaps = report.analysis.idle_gaps
    if len(gaps) <= 100:
        return None
    origin = report.analysis.meta.origin_ns
    starts = [gap.start_ns - origin for gap in gaps]
    durations = [gap.end_ns - gap.start_ns for gap in gaps]
    if max(map(abs, starts)) >= _EXACT_NS or max(map(abs, durations)) >= _EXACT_NS:
        return None
    columns = {
        "device": _encoded([gap.device for gap in gaps]),
        "start_us": _us_texts(starts),
        "duration_us": _us_texts(durations),
        "cause_kind": _encoded([gap.cause_kind for gap in gaps]),
        "cause": _encoded([gap.cause for gap in gaps]),
        "source": _encoded([gap.source for gap in gaps]),
        "source_kind": _encoded([gap.source_kind for gap in gaps]),
        "source_line_kind": _encoded([gap.source_line_kind for gap in gaps]),
        "source_function": _encoded([gap.source_function for gap in gaps]),
    }
    if any(column.null_count() for column in columns.values()):  # a value _scalar does not write
        return None
    fields = [[pl.lit(f"      {encode_basestring(key)}: "), pl.col(key)] for key in columns]
    parts = [pl.lit("    {\n"), *fields[0]]
    for field in fields[1:]:
        parts += [pl.lit(",\n"), *field]
    parts.append(pl.lit("\n    }"))
    rows = pl.DataFrame(columns).select(pl.concat_str(parts).str.join(",\n")).item()
    return f"[\n{rows}\n  ]"


class JsonRenderer:
    """Renders :func:`report_dict` as indented JSON."""

    def render(self, report: Report) -> str:
        """The report as a JSON document (UTF-8, keys in contract order).

        Byte for byte ``json.dumps(report_dict(report), indent=2, ensure_ascii=False)``, and as
        strict (a NaN or an infinity is a bug, raised, never written as ``NaN``); the idle
        gaps (:func:`_gap_rows`) and the other long lists of flat objects (:func:`_flat_rows`) are
        written apart and put in place of a marker.
        """
        gap_rows = _gap_rows(report)
        document = report_dict(report, gaps=gap_rows is None)
        written = {} if gap_rows is None else {"idle_gaps": gap_rows}
        for key, value in document.items():
            if isinstance(value, list) and len(value) > 100 and (text := _flat_rows(value)) is not None:
                written[key] = text
        spliced: dict[str, str] = {}
        for key, text in written.items():
            marker = f"traceinsight-{uuid.uuid4().hex}"
            document[key] = marker
            spliced[json.dumps(marker)] = text
        out = json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False)
        for marker, text in spliced.items():
            out = out.replace(marker, text, 1)
        return out + "\n"
