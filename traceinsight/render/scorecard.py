"""The scorecard: headline figures with a plain-language verdict, shared by every renderer."""

from __future__ import annotations

from typing import Final

from traceinsight.formatting import format_duration, format_share
from traceinsight.load.tables import gpus_in_words
from traceinsight.model import Model
from traceinsight.render import shown_details
from traceinsight.render.flops_view import flops_scores
from traceinsight.results.trace import Result
from traceinsight.results.vocabulary import (
    GPU_RECORDS_LOST,
    NO_GPU_WORK,
    CauseKind,
    cause_label,
    total_usage,
    unrecorded_gpu,
)


class Score(Model, frozen=True):
    """One headline figure. ``level`` is good / warn / bad / info (drives colour)."""

    label: str
    value: str
    verdict: str
    level: str


def no_gpu_statement(result: Result) -> str:
    """Plain words for a trace without GPU activity: did the run use an accelerator this tool
    cannot read, have no GPU, or just not use it?"""
    foreign = shown_details(result).foreign_accelerator
    if foreign is not None:
        return (
            f"No CUDA or ROCm GPU work: the accelerator here is {foreign.name}, whose activity "
            "traceinsight cannot read. Only the host side is measured below."
        )
    if result.trace.gpus_listed == 0:
        return (
            "This run had no GPU: the profiler saw no CUDA device, so only host (CPU) activity was "
            "recorded. The host-side view is below."
        )
    unrecorded = unrecorded_gpu(result.warnings)
    if unrecorded == GPU_RECORDS_LOST:
        return (
            "GPU records were lost: the host launched GPU work, but no kernel, copy or memset is in "
            "the trace (see the warning at the top). GPU figures are unknown; the host-side view is below."
        )
    if unrecorded == NO_GPU_WORK:
        return (
            "No GPU work ran while recording: CUDA activity was recorded, but no kernel, copy or "
            "memset. The host-side view is below."
        )
    listed = gpus_in_words(result.trace.gpus_listed)
    if listed is not None:
        return (
            f"GPU activity was not recorded: the trace lists {listed}, but the profiler recorded only "
            "host (CPU) activity. Profile with ProfilerActivity.CUDA to measure the GPU; the "
            "host-side view is below."
        )
    return "No kernels, copies or memsets in this trace: the host-side view is below."


def scorecard(result: Result) -> tuple[Score, ...]:
    """GPU busy and idle over the steady state, communication, copy overlap, host syncs per step,
    step time — with verdicts. Shares are of the step time when the trace has steps."""
    details = shown_details(result)
    limits = details.thresholds
    has_gpu = result.trace.has_gpu_activity
    unprofiled = gpus_in_words(result.trace.gpus_listed)
    scores: list[Score] = []
    if not has_gpu:
        scores.append(Score("GPU activity", "none", no_gpu_statement(result), "info"))
    else:
        usage = total_usage(details.usage)
        window, busy, communication = usage.window_ns, usage.busy_ns, usage.communication_ns
        share = busy / window if window else 0.0
        useful = (busy - communication) / window if window else 0.0
        level = "good" if useful >= 0.8 else "warn" if useful >= limits.low_utilization else "bad"
        verdict = {
            "good": "The GPU is kept busy.",
            "warn": "The GPU waits a noticeable part of the time.",
            "bad": "The GPU is idle most of the time: see the findings below.",
        }[level]
        if usage.idle and usage.idle[0][0] is CauseKind.CAPTURE and usage.idle[0][1] >= 0.5 * window:
            level, verdict = "info", "Idle by design while graphs are captured: see the warning at the top."
        scores.append(Score("GPU busy", format_share(share), f"Of {usage.of_what}. {verdict}", level))
        if usage.idle:
            top, top_ns = usage.idle[0]
            idle_verdict = f"Mostly {cause_label(top.value)} ({format_share(top_ns / window)})."
        else:
            idle_verdict = "The GPU never waited."
        scores.append(
            Score("GPU idle", format_share(usage.idle_ns / window if window else 0.0), idle_verdict, level)
        )
        if communication:
            scores.append(
                Score(
                    "Communication",
                    format_share(communication / window),
                    "Kernels moving data between ranks while no compute ran.",
                    "warn" if communication >= 0.1 * window else "info",
                )
            )
        for direction, label in (("HtoD", "H2D overlap"), ("DtoH", "D2H overlap")):
            ratio = result.overlap.get(direction)
            if ratio is None:
                scores.append(Score(label, "—", "No such copies.", "info"))
            else:
                good = ratio >= limits.h2d_overlap_ratio
                scores.append(
                    Score(
                        label,
                        format_share(ratio),
                        "Copies run under compute." if good else "Copies mostly run while kernels wait.",
                        "good" if good else "warn",
                    )
                )
    steady_steps = result.steady_state.steady_steps
    steady_syncs = sum(hotspot.steady_count for hotspot in result.sync_hotspots)
    would_wait = [sync for sync in result.latent_syncs if sync.cpu_value is None]
    latent = sum(sync.steady_count for sync in would_wait)
    cpu_reads = _cpu_reads(result)
    if not has_gpu and details.foreign_accelerator is not None:
        pass  # the accelerator's own waits are not CUDA calls: none could be counted
    elif not has_gpu and latent and steady_steps:
        scores.append(
            Score(
                "Host syncs / step",
                f"{latent / steady_steps:.3g} on a GPU",
                (
                    "Not measured (GPU activity was not recorded), but these operators make the host "
                    f"wait on a GPU: see the findings.{cpu_reads}"
                    if unprofiled
                    else "None on this run (no GPU), but these operators would make the host wait on "
                    f"one: see the findings.{cpu_reads}"
                ),
                "warn",
            )
        )
    elif not has_gpu and would_wait and not steady_steps:
        total = sum(sync.count for sync in would_wait)
        absent = "Not measured (GPU activity was not recorded)" if unprofiled else "None on this run (no GPU)"
        scores.append(
            Score(
                "Host syncs",
                f"{total} on a GPU",
                f"No step markers: counted over the whole trace. {absent}, but these operators "
                f"would make the host wait on one: see the findings.{cpu_reads}",
                "warn",
            )
        )
    elif steady_steps:
        per_step = steady_syncs / steady_steps
        if per_step == 0:
            level, verdict = "good", "No host waits in the loop."
        elif per_step < 1:
            level, verdict = "good", "Fewer than one per step: not a wait inside the loop."
        else:
            level = "warn" if per_step <= 2 else "bad"
            verdict = "Each sync stops the host from queueing ahead."
            unexplained = _unexplained(result, limits.minor_share, steady_steps)
            if unexplained is not None:
                level, verdict = unexplained
        scores.append(Score("Host syncs / step", f"{per_step:.3g}", verdict + cpu_reads, level))
    else:
        sync_count = sum(hotspot.count for hotspot in result.sync_hotspots)  # waits, a copy + sync once
        level, verdict = (
            "info" if not sync_count else "warn",
            "No step markers: counted over the whole trace.",
        )
        unexplained = _unexplained(result, limits.minor_share, 0) if sync_count else None
        if unexplained is not None:
            level, verdict = unexplained[0], f"{verdict} {unexplained[1]}"
        scores.append(Score("Host syncs", str(sync_count), verdict, level))
    step_ns = result.steady_state.step_time_ns
    if step_ns:
        scores.append(
            Score(
                "Step time",
                format_duration(step_ns),
                f"Median of {steady_steps} steady step{'s' if steady_steps != 1 else ''}.",
                "info",
            )
        )
    # FLOPs and MFU (traces with recorded shapes only), read from the result's ``flops``.
    scores.extend(Score(*row) for row in flops_scores(result.flops))
    return tuple(scores)


#: The rules whose findings are about host syncs (a sync's own, or a copy's that waits).
_SYNC_RULES: Final = frozenset({"sync-in-loop", "sync-in-forward", "pageable-memcpy", "blocking-h2d"})


def _unexplained(result: Result, floor: float, steps: int) -> tuple[str, str] | None:
    """The level and verdict of host syncs no finding is about (None when one is): how much GPU
    idle they cause, which is why none is a finding (a red card with nothing under it told the
    reader to look for what is not there). ``floor``: the minor findings' share of the step;
    ``steps``: steady steps (0: the figures are over the whole trace)."""
    if any(finding.rule in _SYNC_RULES for finding in result.findings):
        return None
    # per GPU: a hot spot's idle is summed over every GPU it stalls
    gpus = max(1, len(result.devices))
    caused = sum(hotspot.idle_caused_ns for hotspot in result.sync_hotspots) / gpus
    reference = result.steady_state.step_time_ns if steps else result.utilization.window_ns
    share = caused / steps / reference if steps and reference else caused / reference if reference else 0.0
    amount = (
        format_duration(round(caused / steps)) + " per step"
        if steps
        else format_duration(round(caused)) + " in all"
    )
    level = "warn" if share >= floor else "info"
    gpu = "each GPU" if gpus > 1 else "the GPU"
    idle = f"they leave {gpu} idle {amount} ({format_share(share)} of {'the step' if steps else 'the time'})"
    if share < floor:
        return level, f"No finding is about them: {idle}, too little to act on."
    return level, f"No finding is about them, yet {idle}: see the sync hot spots below."


def _cpu_reads(result: Result) -> str:
    """`` N reads of CPU values …`` when a run without a GPU read CPU values (not syncs on a GPU)."""
    kept = [sync for sync in result.latent_syncs if sync.cpu_value is not None]
    if not kept:
        return ""
    count = sum(sync.count for sync in kept)
    kinds = sorted({sync.cpu_value for sync in kept if sync.cpu_value})
    return (
        f" Not counted: {count} read{'s' if count != 1 else ''} of CPU values ({', '.join(kinds)}), "
        "which stay on the CPU with a GPU too."
    )
