"""``memory-pressure``: a GPU nearly full at its peak, and the allocator called every step."""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.memory import AllocatorCalls, MemoryDevice
from traceinsight.analysis.replay import Fix
from traceinsight.formatting import format_duration, format_share, format_size
from traceinsight.rules import advice
from traceinsight.rules.common import in_saving_unit, make_finding, per_step, saving_from_total, saving_of
from traceinsight.rules.findings import Finding, Severity
from traceinsight.rules.registry import rule


def churning(analysis: Analysis, churn: AllocatorCalls) -> bool:
    """Allocator calls in at least ``allocator_churn_step_share`` of the steady steps (two at
    least); with fewer than two steady steps, at least ``allocator_churn_min_calls`` calls."""
    limits = analysis.thresholds
    if churn.steady_steps >= 2:
        return (
            churn.steps_with_calls >= 2
            and churn.steps_with_calls / churn.steady_steps >= limits.allocator_churn_step_share
        )
    return churn.count >= limits.allocator_churn_min_calls


def _near_limit(analysis: Analysis, device: MemoryDevice) -> Finding:
    share = device.peak_share or 0.0
    total = device.total_memory_bytes or 0
    which = "reserved" if (device.peak_reserved_bytes or 0) >= device.peak_allocated_bytes else "allocated"
    bound = " (at least: the trace recorded no totals)" if device.allocated_is_lower_bound else ""
    evidence = [
        (
            "peak allocated by tensors",
            f"{format_size(device.peak_allocated_bytes)}{bound}, "
            f"at {format_duration(device.peak_allocated_at_ns)} into the trace",
        ),
        (
            "peak reserved by the caching allocator",
            format_size(device.peak_reserved_bytes)
            if device.peak_reserved_bytes is not None
            else "not recorded",
        ),
        ("device memory (deviceProperties)", format_size(total)),
        ("peak share of the device", format_share(share)),
    ]
    return make_finding(
        analysis,
        saving_from_total(analysis, 0),
        title=f"{device.device} reached {share:.0%} of its memory: {format_size(device.peak_bytes)} "
        f"{which} of {format_size(total)}",
        evidence=evidence,
        advice=advice.NEAR_MEMORY_LIMIT,
        why="With no room to grow, an allocation the cache cannot serve makes the allocator free its "
        "cached blocks and retry (cudaFree waits for the GPU), and a slightly larger input fails "
        "with out-of-memory.",
        device=device.device_id,
        note="not a time saving: headroom against out-of-memory errors and allocator retries",
    ).with_(saving_known=False, severity=Severity.MEDIUM)


def _churn(analysis: Analysis, churn: AllocatorCalls) -> Finding:
    names = ", ".join(f"{call.call} {call.count:,}" for call in churn.by_name)
    place = (
        f"in {churn.steps_with_calls} of {churn.steady_steps} steady steps"
        if churn.steady_steps
        else "in the steady state"
    )
    evidence = [
        ("allocator calls in the steady state", f"{churn.count:,} ({names})"),
        ("host time in them", in_saving_unit(analysis, churn.host_ns)),
    ]
    if churn.steady_steps:
        evidence.append(
            ("steady steps with allocator calls", f"{churn.steps_with_calls} of {churn.steady_steps}")
        )
    replayable = analysis.replay.available
    fix = Fix(shorten=tuple((start, end, 0) for start, end in churn.ranges))
    saving = saving_of(analysis, fix) if replayable else saving_from_total(analysis, 0)
    finding = make_finding(
        analysis,
        saving,
        title=f"The allocator calls {' and '.join(call.call for call in churn.by_name)} {place}: "
        f"{churn.count:,} calls, {per_step(analysis, churn.host_ns)} of host time",
        evidence=evidence,
        advice=advice.ALLOCATOR_CHURN,
        why="Each cudaMalloc/cudaFree is a slow driver call, and cudaFree waits for the whole GPU "
        "first: the host stops queueing work while the caching allocator rebuilds what it let go of.",
        note="the replay without the allocator calls' host time (blocks served from the cache)",
    )
    return finding if replayable else finding.with_(saving_known=False)


@rule("memory-pressure")
def memory_pressure(analysis: Analysis) -> Iterator[Finding]:
    """A GPU's peak reserved/allocated memory at ``memory_pressure_share`` of its total or more;
    allocator calls in the steady steps (see :func:`churning`)."""
    limits = analysis.thresholds
    for device in analysis.memory.devices:
        share = device.peak_share
        if share is not None and share >= limits.memory_pressure_share:
            yield _near_limit(analysis, device)
    if churning(analysis, analysis.memory.allocator_calls):
        yield _churn(analysis, analysis.memory.allocator_calls)
