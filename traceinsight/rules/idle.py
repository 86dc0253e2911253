"""Where the GPU's idle time goes: ``dataloader-stall`` and ``low-gpu-utilization``.

``low-gpu-utilization`` speaks for the idle no other finding explains (the host busy in operators,
launching, work held by a dependency, nothing recorded), names its largest causes with their share
of the step, and advises on the largest. Its saving is that idle: an upper bound.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.causes import CAUSE_LABELS, CauseKind
from traceinsight.analysis.replay import Fix
from traceinsight.analysis.results import IdleGap
from traceinsight.formatting import format_duration
from traceinsight.rules import advice, rule
from traceinsight.rules.common import (
    make_finding,
    saving_from_total,
    saving_of,
    source_evidence,
    usage_amount,
    where,
)
from traceinsight.rules.findings import Advice, Finding
from traceinsight.rules.launching import launch_idle

#: Causes other findings explain (and fix), or that are not the loop's: low-gpu-utilization leaves
#: their idle out of its saving.
_EXPLAINED = frozenset(
    {
        CauseKind.DATALOADER,
        CauseKind.SYNC,
        CauseKind.COPY,
        CauseKind.OUTSIDE_STEADY,
        CauseKind.BEFORE_FIRST,
        CauseKind.AFTER_LAST,
    }
)

_ADVICE: dict[CauseKind, Advice] = {
    CauseKind.HOST_OP: advice.HOST_WORK,
    CauseKind.LAUNCH: advice.LAUNCH_BOUND,
    CauseKind.QUEUED: advice.DEPENDENCY,
    CauseKind.UNTRACED: advice.UNTRACED,
    CauseKind.UNKNOWN: advice.UNTRACED,
    CauseKind.COMMUNICATION: advice.COMMUNICATION,
}


def _steady_gaps(analysis: Analysis, device: int, kind: CauseKind) -> list[IdleGap]:
    """Reported gaps of one cause on one device that overlap the steady state."""
    windows = analysis.steady.windows
    cause = kind.value
    return [
        gap
        for gap in analysis.idle_gaps
        if gap.device == device
        and gap.cause_kind == cause
        and any(gap.start_ns < end and gap.end_ns > start for start, end in windows)
    ]


def _within(
    spans: tuple[tuple[int, int], ...], windows: tuple[tuple[int, int], ...]
) -> list[tuple[int, int]]:
    """``spans`` merged where they overlap and cut to ``windows`` (both ``[start, end)``)."""
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end))
        else:
            merged.append((start, end))
    return [
        (max(start, w_start), min(end, w_end))
        for start, end in merged
        for w_start, w_end in windows
        if start < w_end and end > w_start
    ]


def _cpu_dataloader_stall(analysis: Analysis) -> Iterator[Finding]:
    """Without GPU work: steady steps that spend ``dataloader_idle_share`` or more in ``__next__``.

    The host is the whole step there, so each wait minus the hand-over is what loading ahead gives
    back; on a GPU the same wait would leave the GPU idle.
    """
    limits = analysis.thresholds
    steps = analysis.steady.steady_steps
    # Clipped to the steady steps and merged: a wait running past its step's end, or nested in
    # another, is counted once and only inside the steps (a card once said 107% of the step).
    waits = _within(analysis.fix_inputs.dataloader_waits, tuple((s.start_ns, s.end_ns) for s in steps))
    window = sum(step.duration_ns for step in steps)
    waited = sum(end - start for start, end in waits)
    if not steps or not waits or waited < limits.dataloader_idle_share * window:
        return
    handover = round(limits.dataloader_handover_us * 1000)
    saving = saving_from_total(analysis, sum(max(0, end - start - handover) for start, end in waits))
    share = waited / window
    serial = any("_SingleProcessDataLoaderIter" in name for name in analysis.fix_inputs.dataloader_iterators)
    yield make_finding(
        analysis,
        "dataloader-stall",
        saving,
        title=f"Each step waits {format_duration(round(waited / len(steps)))} for the DataLoader "
        f"({share:.0%} of the step): "
        + ("batches are loaded in the training process" if serial else "its workers do not keep up"),
        evidence=(
            (
                "time in DataLoader __next__",
                f"{format_duration(waited)} in {len(waits)} calls ({share:.0%} of the steps)",
            ),
            ("steady steps", str(len(steps))),
            ("on a GPU", "the GPU would sit idle for all of it: nothing is queued while the batch is made"),
        ),
        advice=advice.WORKERS,
        why="The loop asks for the next batch only when it needs it; while the batch is decoded and "
        "collated in the training process, the step makes no progress.",
        note=f"each batch ready, handed over in {format_duration(handover)}",
    )


@rule("dataloader-stall")
def dataloader_stall(analysis: Analysis) -> Iterator[Finding]:
    """GPU idle while the launching thread waits in DataLoader ``__next__``, in the steady state
    (without GPU work: the share of each step spent there)."""
    limits = analysis.thresholds
    if not analysis.has_gpu:
        yield from _cpu_dataloader_stall(analysis)
        return
    waits = analysis.fix_inputs.dataloader_waits
    for device in analysis.devices:
        idle = dict(device.idle_by_cause_ns).get(CauseKind.DATALOADER.value, 0)
        usage = analysis.device_usage(device.device)
        window = usage.window_ns if usage else 0
        if not waits or not window or idle < limits.dataloader_idle_share * window:
            continue
        handover = round(limits.dataloader_handover_us * 1000)
        saving = saving_of(
            analysis, Fix(shorten=tuple((start, end, min(end - start, handover)) for start, end in waits))
        )
        stalls = _steady_gaps(analysis, device.device, CauseKind.DATALOADER)
        longest = max(stalls, key=lambda gap: gap.duration_ns) if stalls else None
        iterator = longest.cause if longest else "DataLoader __next__"
        serial = "_SingleProcessDataLoaderIter" in iterator
        source = longest.source if longest else None
        source_kind = longest.source_kind if longest else None
        place = where(source, source_kind)
        per_step = saving_from_total(analysis, idle)
        amount = per_step.words()
        yield make_finding(
            analysis,
            "dataloader-stall",
            saving,
            title=f"The GPU waits for the DataLoader {amount}"
            + (f" at {place}" if place else "")
            + (": batches are loaded in the training process" if serial else ": its workers do not keep up"),
            evidence=(
                ("GPU idle waiting for batches", amount),
                (
                    "waits in the steady state",
                    f"{len(waits)} (longest gap {format_duration(longest.duration_ns) if longest else '—'})",
                ),
                ("iterator", iterator),
                ("source", source_evidence(source, source_kind, analysis.meta.recorded_by_run)),
            ),
            advice=advice.WORKERS,
            why="The training loop asks for the next batch only after queuing the last step; while the "
            "batch is decoded and collated on the host nothing new reaches the GPU.",
            source=source,
            device=device.device,
            source_kind=source_kind,
            note=f"replayed with each batch ready, handed over in {format_duration(handover)}",
        )


def _top_ops(gaps: list[IdleGap]) -> list[tuple[str, int]]:
    by_op: dict[str, int] = defaultdict(int)
    for gap in gaps:
        by_op[gap.cause] += gap.duration_ns
    return sorted(by_op.items(), key=lambda item: (-item[1], item[0]))[:3]


@rule("low-gpu-utilization")
def low_gpu_utilization(analysis: Analysis) -> Iterator[Finding]:
    """A GPU computing less than ``low_utilization`` of the steady steps, and where the rest went.

    Compute is the share taken: communication kernels keep a GPU "busy" while it waits for its
    peers. Its saving is the idle no other finding explains (an upper bound).
    """
    limits = analysis.thresholds
    for device in analysis.devices:
        usage = analysis.device_usage(device.device)
        if usage is None:
            continue
        window = usage.window_ns
        if window < limits.min_span_us * 1000 or usage.compute_ns >= limits.low_utilization * window:
            continue
        explained = _EXPLAINED | ({CauseKind.LAUNCH} if launch_idle(analysis, usage) is not None else set())
        unexplained = [(kind, ns) for kind, ns in usage.idle if kind not in explained]
        rest = sum(ns for _, ns in unexplained)
        if not unexplained or rest < 0.05 * window:
            continue  # other findings explain the idle
        top_kind = unexplained[0][0]
        idle_ns = sum(ns for _, ns in usage.idle)
        listed = ", ".join(
            f"{ns / window:.0%} {CAUSE_LABELS[kind]}" for kind, ns in usage.idle[:3] if ns >= 0.01 * window
        )
        title = f"GPU {device.device} computes only {usage.compute_ns / window:.0%} of {usage.of_what}"
        if usage.communication_ns >= 0.05 * window:
            title += f", communicates {usage.communication_ns / window:.0%}"
        title += f" and is idle {idle_ns / window:.0%}: {listed}"
        evidence: list[tuple[str, str]] = [
            ("compute", usage_amount(usage, usage.compute_ns)),
            ("communication", usage_amount(usage, usage.communication_ns)),
            ("copies (not under compute)", usage_amount(usage, usage.copy_ns)),
        ]
        evidence += [(f"idle: {CAUSE_LABELS[kind]}", usage_amount(usage, ns)) for kind, ns in usage.idle]
        source = source_kind = None
        if top_kind is CauseKind.HOST_OP:
            ops = _top_ops(_steady_gaps(analysis, device.device, CauseKind.HOST_OP))
            if ops:
                evidence.append(
                    ("the host was in", "; ".join(f"{name} ({format_duration(ns)})" for name, ns in ops))
                )
        top_gaps = _steady_gaps(analysis, device.device, top_kind)
        if top_gaps:
            longest = max(top_gaps, key=lambda gap: gap.duration_ns)
            source, source_kind = longest.source, longest.source_kind
            evidence.append(("longest such gap", f"{format_duration(longest.duration_ns)}: {longest.cause}"))
            evidence.append(("source", source_evidence(source, source_kind, analysis.meta.recorded_by_run)))
        saving = saving_from_total(analysis, rest)
        yield make_finding(
            analysis,
            "low-gpu-utilization",
            saving,
            title=title,
            evidence=(evidence),
            advice=_ADVICE.get(top_kind, advice.LAUNCH_BOUND),
            why=f"Most of the idle no other finding explains is {CAUSE_LABELS[top_kind]}: each gap is a "
            "moment the GPU had nothing to run.",
            source=source,
            device=device.device,
            source_kind=source_kind,
            note="an upper bound: the idle no other finding explains",
        )
