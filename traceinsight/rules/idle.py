"""Where the GPU's idle time goes: ``dataloader-stall``, ``host-preprocessing`` and
``low-gpu-utilization``.

``host-preprocessing`` speaks for the idle at the start of every step, before the step's own first
GPU work, while the host prepares it (decoding, resizing, augmenting a batch in operators or in
Python the profiler does not record). A DataLoader wait there has a finding of its own; idle whose
gap began with a sync that drained the queue counts too (the sync's card claims it as well: removing
either shortens the step, and the replay gives each fix its own saving).

``low-gpu-utilization`` speaks for the idle no other finding explains (the host busy in operators,
launching, work held by a dependency, nothing recorded), names its largest causes with their share
of the step, and advises on the largest. Its saving is that idle: an upper bound.
"""

from __future__ import annotations

import re
import statistics
from collections import defaultdict
from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.causes import CAUSE_LABELS, CauseKind
from traceinsight.analysis.idle_gaps import QUEUED_IN_GRAPH
from traceinsight.analysis.replay import Fix
from traceinsight.analysis.results import IdleGap
from traceinsight.formatting import format_duration
from traceinsight.load import taxonomy
from traceinsight.load.taxonomy import LOADER_FETCH_RANGE_ONLY
from traceinsight.rules import advice
from traceinsight.rules.common import (
    Saving,
    beyond,
    how_often,
    located_evidence,
    make_finding,
    per_step,
    place,
    saving_from_total,
    saving_of,
    usage_amount,
)
from traceinsight.rules.communication import communication_advice
from traceinsight.rules.findings import Advice, Finding
from traceinsight.rules.launching import device_pattern, launch_idle, pattern_words, pauses_words
from traceinsight.rules.memory import churning
from traceinsight.rules.registry import rule

#: Causes other findings explain (and fix), or that are not the loop's: low-gpu-utilization leaves
#: their idle out of its saving.
_EXPLAINED = frozenset(
    {
        CauseKind.DATALOADER,
        CauseKind.SYNC,
        CauseKind.COPY,
        CauseKind.OTHER_GPU,
        CauseKind.OUTSIDE_STEADY,
        CauseKind.WAITING,
        CauseKind.BEFORE_FIRST,
        CauseKind.AFTER_LAST,
        CauseKind.CAPTURE,  # by design: the warning says so, and what to profile instead
    }
)

_ADVICE: dict[CauseKind, Advice] = {
    CauseKind.HOST_OP: advice.HOST_WORK,
    CauseKind.ALLOCATOR: advice.ALLOCATOR_CHURN,
    CauseKind.LAUNCH: advice.HOST_PAUSES,
    CauseKind.QUEUED: advice.DEPENDENCY,
    CauseKind.UNTRACED: advice.UNTRACED,
    CauseKind.UNKNOWN: advice.UNTRACED,
}


#: Idle before a step's own first GPU work that is the host preparing the step: not a DataLoader
#: wait (its own finding), the host in a collective, nor the GPU waiting on itself.
_PREPARING = frozenset(
    {
        CauseKind.HOST_OP,
        CauseKind.ALLOCATOR,
        CauseKind.LAUNCH,
        CauseKind.UNTRACED,
        CauseKind.UNKNOWN,
        CauseKind.BEFORE_FIRST,
        CauseKind.SYNC,
        CauseKind.COPY,
    }
)


def preprocessing_leads(analysis: Analysis, device: int) -> list[tuple[int, int, int]] | None:
    """Per steady step on ``device``: (window start, its own first GPU work, GPU idle in between
    while the host prepared the step); None unless every steady step has one of at least
    ``min_gap_us`` (one step is judged by :func:`_preprocessing_share_met`'s stricter share)."""
    steps = [step for step in analysis.steps if step.device == device and step.steady]
    origin = analysis.meta.origin_ns
    leads = [
        (
            step.start_ns + origin,
            step.first_work_ns,
            sum(ns for kind, ns in step.lead_by_cause_ns if CauseKind(kind) in _PREPARING),
        )
        for step in steps
        if step.first_work_ns is not None
    ]
    floor = round(analysis.thresholds.min_gap_us * 1000)
    if not steps or len(leads) < len(steps) or min(idle for *_, idle in leads) < floor:
        return None
    return leads


def _preprocessing_share_met(analysis: Analysis, device: int) -> list[tuple[int, int, int]] | None:
    """:func:`preprocessing_leads` when they reach ``host_preprocessing_share`` of the steady steps
    (``host_preprocessing_one_step_share`` of a single steady step: strong evidence, since nothing
    shows it repeats)."""
    leads = preprocessing_leads(analysis, device)
    usage = analysis.device_usage(device)
    if leads is None or usage is None or not usage.window_ns:
        return None
    limits = analysis.thresholds
    idle = sum(ns for *_, ns in leads)
    if len(leads) > 1:
        return leads if idle >= limits.host_preprocessing_share * usage.window_ns else None
    # one step: the time in an operator that launched the first work itself is its own first
    # call's set-up (aten::ones' first launch), not the host preparing the step
    preparing = idle - analysis.step_leads.in_launching_op_ns
    return leads if preparing >= limits.host_preprocessing_one_step_share * usage.window_ns else None


def _steady_gaps(analysis: Analysis, device: int, kind: CauseKind) -> list[IdleGap]:
    """Reported gaps of one cause on one device that overlap the steady state (GPU's clock)."""
    windows = analysis.steady.device_windows
    cause = kind.value
    origin = analysis.meta.origin_ns
    return [
        gap
        for gap in analysis.idle_gaps
        if gap.device == device
        and gap.cause_kind == cause
        and any(gap.start_ns + origin < end and gap.end_ns + origin > start for start, end in windows)
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
    back; on a GPU the same wait would leave the GPU idle. The step's figure is the median step's
    (one slow batch does not pull it up), and so is the saving: the median step's saving times the
    steps, never more than the waits of all steps free.
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
    per_step_waits = [
        [end - start for start, end in waits if step.start_ns <= start < step.end_ns] for step in steps
    ]
    median_wait = round(statistics.median(sum(step) for step in per_step_waits))
    median_saving = statistics.median(
        sum(max(0, wait - handover) for wait in step) for step in per_step_waits
    )
    freed = sum(max(0, end - start - handover) for start, end in waits)
    # One step, the median one, for every figure of the card: its wait, its step time, its saving.
    # The title's share was of the median step, the evidence's of all steps together and the
    # saving's of the mean step: one stall read 83 %, 76 % and 69 %.
    median_step = round(statistics.median(step.duration_ns for step in steps))
    # shown: the median step's saving; in all (JSON's total): that times the steps, never more
    # than the waits of all steps free
    total = min(round(median_saving * len(steps)), freed)
    saving = Saving(total, round(median_saving), median_saving / median_step)
    share = median_wait / median_step
    serial = any("_SingleProcessDataLoaderIter" in name for name in analysis.fix_inputs.dataloader_iterators)
    yield make_finding(
        analysis,
        saving,
        title=f"Each step waits {format_duration(median_wait)} for the DataLoader "
        f"({share:.0%} of the step): "
        + ("batches are loaded in the training process" if serial else "its workers do not keep up"),
        evidence=(
            (
                "time in DataLoader __next__",
                f"median {format_duration(median_wait)} per step, {share:.0%} of the median step "
                f"({format_duration(median_step)}); all steps together: {waited / window:.0%} of their "
                f"time (mean {format_duration(round(waited / len(steps)))} per step), "
                f"{how_often(analysis, len(waits))}",
            ),
            ("steady steps", str(len(steps))),
            ("on a GPU", "the GPU would sit idle for all of it: nothing is queued while the batch is made"),
        ),
        advice=advice.WORKERS,
        why="The loop asks for the next batch only when it needs it; while the batch is decoded and "
        "collated in the training process, the step makes no progress.",
        note=f"each batch ready, handed over in {format_duration(handover)}; counted on the median step: "
        "its wait less the hand-over, a share of its step time as the title's is" + _fetch_note(analysis),
    )


def _fetch_note(analysis: Analysis) -> str:
    """What `run` did not record inside the fetch, when it says so (the trace's ``loaderFetch``)."""
    run = analysis.meta.recorded_by_run
    if run is None or run.loader_fetch != LOADER_FETCH_RANGE_ONLY:
        return ""
    return (
        ". `traceinsight run` recorded each fetch as its range alone, without the operators the "
        "Dataset ran (recording them slowed the fetch)"
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
        at = place(longest) if longest else None
        amount = saving_from_total(analysis, idle, window).words()
        note = f"replayed with each batch ready, handed over in {format_duration(handover)}"
        extra = beyond(saving.total_ns, idle)
        if extra is not None:
            note += (
                ". More than the GPU idle while the host waited: with the batch ready the host also "
                "launches the step's work earlier, and later idle waiting for its launches goes too "
                f"(the other {per_step(analysis, extra)})"
            )
        yield make_finding(
            analysis,
            saving,
            title=f"The GPU waits for the DataLoader {amount}"
            + (f" {at}" if at else "")
            + (": batches are loaded in the training process" if serial else ": its workers do not keep up"),
            evidence=(
                ("GPU idle waiting for batches", amount),
                (
                    "waits in the steady state",
                    f"{len(waits)} (longest gap {format_duration(longest.duration_ns) if longest else '—'})",
                ),
                ("iterator", iterator),
                ("source", located_evidence(longest, analysis.meta.recorded_by_run)),
            ),
            advice=advice.WORKERS,
            why="The training loop asks for the next batch only after queuing the last step; while the "
            "batch is decoded and collated on the host nothing new reaches the GPU.",
            device=device.device,
            located=longest,
            note=note,
        )


def _mostly_in_graphs(analysis: Analysis, device: int) -> bool:
    """Whether most of the device's steady ``queued`` idle waited inside CUDA graph replays."""
    gaps = _steady_gaps(analysis, device, CauseKind.QUEUED)
    in_graphs = sum(gap.duration_ns for gap in gaps if gap.cause == QUEUED_IN_GRAPH)
    return in_graphs * 2 > sum(gap.duration_ns for gap in gaps)


def _host_work_advice(analysis: Analysis, ops: list[tuple[str, int]]) -> Advice:
    """Advice for the host's own work in ``ops`` (largest first): DDP's buffer broadcast when the
    host flattens tensors for it (DataParallel: move to DDP), DDP's forward work when the host is
    in DDP's forward range itself, else move the work off the step."""
    top = ops[0][0]
    if top in taxonomy.COALESCING_OPS:
        if analysis.multi_gpu_processes > 0:
            return advice.DDP
        if analysis.communication.ddp:
            return advice.DDP_BUFFERS
    if re.match(taxonomy.DDP_RANGE_PATTERN, top):
        return advice.DDP_FORWARD
    return advice.HOST_WORK


@rule("host-preprocessing")
def host_preprocessing(analysis: Analysis) -> Iterator[Finding]:
    """Every steady step keeps the GPU idle before its own first work while the host prepares it:
    per-step host preprocessing, at least ``host_preprocessing_share`` of the steps."""
    limits = analysis.thresholds
    for device in analysis.devices:
        leads = _preprocessing_share_met(analysis, device.device)
        if leads is None:
            continue
        total = sum(idle for *_, idle in leads)
        handover = round(limits.dataloader_handover_us * 1000)
        fix = Fix(
            shorten=tuple(
                (start, first, min(first - start, kept + handover))
                for start, first, kept in analysis.step_leads.leads
            )
        )
        amount = saving_from_total(analysis, total).words()
        lengths = sorted(idle for *_, idle in leads)
        found = analysis.step_leads
        ops = found.ops
        at = place(found)
        evidence: list[tuple[str, str]] = [
            ("GPU idle before each step's first work", amount),
            (
                "steps",
                "one steady step only: it cannot show that every step waits so (it may be set-up "
                "caught once); profile more steps to tell"
                if len(leads) == 1
                else f"every one of the {len(leads)} steady steps "
                + (
                    f"({format_duration(lengths[0])} each)"
                    if format_duration(lengths[0]) == format_duration(lengths[-1])
                    else f"(from {format_duration(lengths[0])} to {format_duration(lengths[-1])})"
                ),
            ),
            (
                "the host was in",
                "; ".join(f"{name} ({format_duration(round(ns / len(leads)))} per step)" for name, ns in ops)
                if ops
                else "no operator: Python the profiler did not record (decoding, augmenting a batch)",
            ),
            ("source", located_evidence(found, analysis.meta.recorded_by_run)),
        ]
        yield make_finding(
            analysis,
            saving_of(analysis, fix),
            title=f"Per-step host preprocessing{f' {at}' if at else ''}: the GPU waits {amount} "
            "while the host prepares each step before its first GPU work",
            evidence=evidence,
            advice=advice.PREPROCESSING,
            why="Each step begins with work on the host (decoding, resizing, augmenting, collating a "
            "batch) before it launches anything, and nothing is queued on the GPU meanwhile. Done "
            "ahead by DataLoader workers while the GPU runs the step before, it costs the step only "
            "the hand-over.",
            device=device.device,
            located=found,
            note=f"replayed with each step's preparation done ahead, handed over in {format_duration(handover)}"
            + ("; from one step: profile more to see that it repeats" if len(leads) == 1 else ""),
        )


def _top_ops(analysis: Analysis, gaps: list[IdleGap]) -> list[tuple[str, int]]:
    """The three operators with the most idle in ``gaps``, counting only its part in the steady
    state (a gap can begin before it)."""
    by_op: dict[str, int] = defaultdict(int)
    origin = analysis.meta.origin_ns
    for gap in gaps:
        by_op[gap.cause] += sum(
            max(0, min(gap.end_ns + origin, end) - max(gap.start_ns + origin, start))
            for start, end in analysis.steady.device_windows
        )
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
        # launch-bound speaks for the launch pattern's short gaps; the host's long pauses stay here.
        claimed = {CauseKind.LAUNCH: launch_idle(analysis, usage) or 0}
        # the allocator's gaps are memory-pressure's when it fires (its churn card replays them)
        explained = _EXPLAINED | (
            {CauseKind.ALLOCATOR} if churning(analysis, analysis.memory.allocator_calls) else frozenset()
        )
        unexplained = sorted(
            (
                (kind, ns - claimed.get(kind, 0))
                for kind, ns in usage.idle
                if kind not in explained and ns > claimed.get(kind, 0)
            ),
            key=lambda item: (-item[1], item[0].value),
        )
        rest = sum(ns for _, ns in unexplained)
        leads = _preprocessing_share_met(analysis, device.device)
        if leads is not None:  # host-preprocessing explains the idle before each step's first work
            rest -= sum(
                ns
                for step in analysis.steps
                if step.device == device.device and step.steady
                for kind, ns in step.lead_by_cause_ns
                if CauseKind(kind) in _PREPARING and CauseKind(kind) not in explained
            )
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
        longest = None
        fix_advice = _ADVICE.get(top_kind, advice.HOST_PAUSES)
        if top_kind is CauseKind.QUEUED and _mostly_in_graphs(analysis, device.device):
            fix_advice = advice.DEPENDENCY_IN_GRAPH
        if top_kind is CauseKind.COMMUNICATION:
            fix_advice = communication_advice(analysis, device.device)
        if top_kind is CauseKind.HOST_OP:
            ops = _top_ops(analysis, _steady_gaps(analysis, device.device, CauseKind.HOST_OP))
            if ops:
                evidence.append(
                    ("the host was in", "; ".join(f"{name} ({per_step(analysis, ns)})" for name, ns in ops))
                )
                fix_advice = _host_work_advice(analysis, ops)
        why = f"Most of the idle no other finding explains is {CAUSE_LABELS[top_kind]}"
        pattern = device_pattern(analysis, device.device)
        launch_left = dict(unexplained).get(CauseKind.LAUNCH, 0)
        if pattern is not None and (top_kind is CauseKind.LAUNCH or launch_left >= 0.05 * window):
            # Launch overhead is many short gaps; a few long ones are the host's own pauses.
            pauses = claimed[CauseKind.LAUNCH] > 0 or pattern.long_ns > pattern.short_ns
            if pauses and pattern.long_gaps:
                evidence.append(("gaps between launches", pauses_words(pattern)))
                if top_kind is CauseKind.LAUNCH:
                    why = "Most of the idle no other finding explains is the host pausing between launches"
            elif not pauses:
                evidence.append(("gaps between launches", pattern_words(analysis, usage, pattern)))
                if top_kind is CauseKind.LAUNCH:
                    fix_advice = advice.launch_bound(analysis.launching.compiled)
        top_gaps = _steady_gaps(analysis, device.device, top_kind)
        if top_gaps:
            longest = max(top_gaps, key=lambda gap: gap.duration_ns)
            evidence.append(("longest such gap", f"{format_duration(longest.duration_ns)}: {longest.cause}"))
            evidence.append(("source", located_evidence(longest, analysis.meta.recorded_by_run)))
        saving = saving_from_total(analysis, rest, window)
        yield make_finding(
            analysis,
            saving,
            title=title,
            evidence=(evidence),
            advice=fix_advice,
            why=f"{why}: each gap is a moment the GPU had nothing to run.",
            device=device.device,
            located=longest,
            note="an upper bound: the idle no other finding explains",
        )
