"""What every renderer says, worded once: the header facts, where the GPU time goes, a saving.

The terminal summary, the HTML page and (later) Markdown take their words from here, so the
same trace reads the same everywhere.
"""

from __future__ import annotations

from traceinsight.formatting import format_duration, format_share, format_size
from traceinsight.load.tables import gpus_in_words
from traceinsight.model import Model
from traceinsight.render import shown_details
from traceinsight.results.trace import Finding, Result, Usage
from traceinsight.results.vocabulary import (
    BUSY_LABELS,
    CAUSE_LABELS,
    GPU_RECORDS_LOST,
    NO_GPU_WORK,
    BusyClass,
    PaceSetter,
    total_usage,
    unrecorded_gpu,
)

__all__ = [
    "MEMORY_COLUMNS",
    "TimeRow",
    "allocator_fact",
    "header_facts",
    "memory_rows",
    "no_findings_text",
    "pace_fact",
    "saving_text",
    "steps_fact",
    "time_split",
]

#: The columns of :func:`memory_rows`.
MEMORY_COLUMNS = ("device", "peak allocated", "peak reserved", "device memory", "peak share", "records")


def memory_rows(result: Result) -> list[tuple[str, ...]]:
    """One row per device with ``[memory]`` records (see :data:`MEMORY_COLUMNS`); none without."""
    rows: list[tuple[str, ...]] = []
    for device in result.memory.devices:
        allocated = format_size(device.peak_allocated_bytes)
        rows.append(
            (
                device.device,
                f"≥ {allocated}" if device.allocated_is_lower_bound else allocated,
                "—" if device.peak_reserved_bytes is None else format_size(device.peak_reserved_bytes),
                "—" if device.total_memory_bytes is None else format_size(device.total_memory_bytes),
                format_share(device.peak_share),
                f"{device.records:,}",
            )
        )
    return rows


def allocator_fact(result: Result) -> str | None:
    """``cudaMalloc 5, cudaFree 11 in the steady state: 52.91 ms of host time (in 3 of 4 steady
    steps)``; None when the steady state holds no allocator call."""
    churn = result.memory.allocator_calls
    if not churn.count:
        return None
    names = ", ".join(f"{call.call} {call.count:,}" for call in churn.by_name)
    steps = (
        f" (in {churn.steps_with_calls} of {churn.steady_steps} steady steps)" if churn.steady_steps else ""
    )
    return f"{names} in the steady state: {format_duration(churn.host_ns)} of host time{steps}"


def steps_fact(result: Result) -> str:
    """``6 ProfilerStep steps, all steady, median 176.27 ms`` and the like."""
    steady, details = result.steady_state, shown_details(result)
    step_ns = steady.step_time_ns
    if steady.steps_from == "none":
        if result.trace.iterations:
            return f"{result.trace.iterations} optimizer step, too few to time: the trace is judged as one window"
        return "no step markers: the trace is judged as one window"
    kind = (
        "ProfilerStep ranges"
        if steady.steps_from == "ProfilerStep"
        else f"requests: the host's repeating pattern, each beginning with {details.request_name}, no step markers"
        if steady.steps_from == "request" and details.request_from_pattern
        else f"requests: repeating {details.request_name} ranges, no step markers"
        if steady.steps_from == "request"
        else "between Optimizer.step calls"
    )
    count, kept = details.steps_found, steady.steady_steps
    if details.waiting_ns:
        median_text = f", median {format_duration(step_ns)}" if step_ns else ""
        kind += f"{median_text}; {format_duration(details.waiting_ns)} waiting for work between them"
        return f"{count} ({kind}), {kept} steady"
    median = f", median {format_duration(step_ns)}" if step_ns else ""
    if kept == count:
        return f"{count} ({kind}){', all steady' if count > 1 else ''}{median}"
    left_out = ", ".join(f"{step}" for step in details.steps_left_out)
    return f"{count} ({kind}), {kept} steady (left out: step {left_out}){median}"


def _no_gpus(result: Result) -> str:
    """The header's GPU line for a trace without GPU activity."""
    foreign = shown_details(result).foreign_accelerator
    if foreign is not None:
        return f"none: the accelerator is {foreign.name}, which traceinsight cannot read ({foreign.events})"
    unrecorded = unrecorded_gpu(result.warnings)
    if unrecorded == GPU_RECORDS_LOST:
        return "records lost: work was launched, but no GPU activity is in the trace (see the warnings)"
    if unrecorded == NO_GPU_WORK:
        return "no GPU work ran while recording (CUDA activity was recorded)"
    listed = gpus_in_words(result.trace.gpus_listed)
    if listed is not None:
        return f"none recorded ({listed} listed; the profiler recorded only CPU activity)"
    return "none (no GPU activity in this trace)"


def pace_fact(result: Result) -> str | None:
    """Which side sets the step's pace, when one side's own time is clearly the longer (see
    :mod:`traceinsight.analysis.pace`); None when neither does or there are no steps."""
    pace, step = result.steady_state.pace, result.steady_state.step_time_ns
    if pace.set_by is None or pace.host_ns is None or pace.gpu_ns is None or not step:
        return None
    host, gpu, each = format_duration(pace.host_ns), format_duration(pace.gpu_ns), format_duration(step)
    if pace.set_by is PaceSetter.GPU:
        return (
            f"the GPU sets it: its work takes {gpu} of each {each} step, the host's own {host} "
            "(the host runs ahead, or waits for the GPU)"
        )
    return (
        f"the host sets it: its own work takes {host} of each {each} step, the GPU's {gpu} "
        "(the GPU waits for the host)"
    )


def header_facts(result: Result) -> list[tuple[str, str]]:
    """(label, value) pairs for the top of every output."""
    trace, details = result.trace, shown_details(result)
    facts: list[tuple[str, str]] = [
        (
            "Trace",
            f"{trace.name}: {trace.events:,} event{'' if trace.events == 1 else 's'}, format {trace.era}",
        )
    ]
    if result.run is not None:
        run = result.run
        facts.append(("Command", run.command))
        when = run.started + (f", torch {run.torch_version}" if run.torch_version else "")
        facts.append(("Run", f"{when}, {run.elapsed_s:,.1f} s, exit status {run.exit_status}"))
    gpus = []
    for device in details.gpus:
        parts = [
            part
            for part in (
                device.architecture,
                f"{device.sm_count} {'CUs' if device.amd else 'SMs'}" if device.sm_count else None,
                format_size(device.total_memory_bytes) if device.total_memory_bytes else None,
            )
            if part
        ]
        listed = f", listed as device {device.listed_as}" if device.listed_as is not None else ""
        gpus.append(
            f"{device.index}: {device.name or ('AMD GPU, name not recorded' if device.amd else 'name not recorded')}"
            + (f" ({', '.join(parts)}{listed})" if parts else f" ({listed[2:]})" if listed else "")
        )
    if not gpus and result.devices:
        gpus = [f"{device.device}: name not recorded" for device in result.devices]
    # "GPU 2: …" for one, so that an index is not read as a count
    facts.append(("GPU" if len(gpus) == 1 else "GPUs", "; ".join(gpus) if gpus else _no_gpus(result)))
    if trace.world_size is not None or trace.backend is not None:
        world = f" of {trace.world_size}" if trace.world_size is not None else ""
        backend = f" ({trace.backend})" if trace.backend else ""
        facts.append(("Rank", f"{trace.rank}{world}{backend}"))
    else:
        facts.append(("Rank", "single process (no distributed info in the trace)"))
    facts.append(("Steps", steps_fact(result)))
    pace = pace_fact(result)
    if pace is not None:
        facts.append(("Pace", pace))
    span = details.gpu_span_ns
    if span is not None:
        facts.append(
            (
                "GPU span",
                f"{format_duration(span.end_ns - span.start_ns)}, from {format_duration(span.start_ns)} to "
                f"{format_duration(span.end_ns)} after the trace's first event (times in tables count from there)",
            )
        )
    versions = [
        f"CUDA runtime {trace.cuda_runtime_version}" if trace.cuda_runtime_version else "",
        f"CUDA driver {trace.cuda_driver_version}" if trace.cuda_driver_version else "",
        f"HIP runtime {trace.hip_runtime_version}" if trace.hip_runtime_version else "",
    ]
    if any(versions):
        facts.append(("Versions", ", ".join(v for v in versions if v)))
    return facts


class TimeRow(Model, frozen=True):
    """One line of "where the GPU time goes": a busy class or an idle cause."""

    label: str
    #: ``busy`` or ``idle``.
    kind: str
    #: The busy class or cause value (``compute``, ``dataloader`` ...): colours and JSON keys.
    key: str
    ns: int
    per_step_ns: int | None
    share: float


def time_split(usage: Usage) -> list[TimeRow]:
    """Busy classes then idle causes for one device's steady state; the rows add up to the window."""
    rows = [
        TimeRow(f"busy: {BUSY_LABELS[kind]}", "busy", kind.value, ns, usage.per_step(ns), usage.share(ns))
        for kind, ns in (
            (BusyClass.COMPUTE, usage.compute_ns),
            (BusyClass.COMMUNICATION, usage.communication_ns),
            (BusyClass.COPY, usage.copy_ns),
        )
        if ns
    ]
    rows += [
        TimeRow(f"idle: {CAUSE_LABELS[kind]}", "idle", kind.value, ns, usage.per_step(ns), usage.share(ns))
        for kind, ns in usage.idle
    ]
    return rows


def saving_text(finding: Finding) -> str:
    """``about 2.08 ms per step (1% of the step)`` or ``about 0.91 ms in all (1% of the time analyzed)``."""
    if not finding.saving_known:
        return "an amount this trace cannot tell"
    share = f" ({format_share(finding.saving_share)} of the step)" if finding.saving_share is not None else ""
    if finding.savings_per_step_ns is not None:
        return f"about {format_duration(finding.savings_per_step_ns)} per step{share}"
    share = (
        f" ({format_share(finding.saving_share)} of the time analyzed)"
        if finding.saving_share is not None
        else ""
    )
    return f"about {format_duration(finding.savings_total_ns)} in all{share}"


def no_findings_text(result: Result) -> str:
    """What to say when no finding is above the noise floor: where the idle went, never a bare "no"."""
    foreign = shown_details(result).foreign_accelerator
    if foreign is not None and not result.trace.has_gpu_activity:
        return (
            f"No findings: traceinsight cannot read {foreign.name} activity, so it has no accelerator "
            "time to judge (see the warning at the top)."
        )
    usage = total_usage(shown_details(result).usage)
    window, total = usage.window_ns, usage.idle_ns
    if not window or total < 0.2 * window:
        return "No findings: nothing in the steady state keeps the GPU waiting above the noise floor."
    top, top_ns = usage.idle[0]
    return (
        f"No finding to act on, but the GPU is idle {format_share(total / window)} of {usage.of_what}, mostly "
        f"{CAUSE_LABELS[top]} ({format_share(top_ns / window)}): see where the time goes above"
        + (" and the warnings at the top." if result.warnings else ".")
    )
