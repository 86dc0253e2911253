"""The scorecard: headline figures with a plain-language verdict, shared by every renderer."""

from __future__ import annotations

from dataclasses import dataclass

from traceinsight.report import Report


@dataclass(frozen=True, slots=True)
class Score:
    """One headline figure. ``level`` is good / warn / bad / info (drives colour)."""

    label: str
    value: str
    verdict: str
    level: str


def _pct(value: float) -> str:
    return f"{value:.0%}"


def no_gpu_statement(report: Report) -> str:
    """Plain words for a trace without GPU activity: did the run have no GPU, or just not use it?"""
    if report.analysis.meta.gpus_listed == 0:
        return (
            "This run had no GPU: the profiler saw no CUDA device, so only host (CPU) activity was "
            "recorded. The host-side view is below."
        )
    return "No kernels, copies or memsets in this trace: the host-side view is below."


def scorecard(report: Report) -> tuple[Score, ...]:
    """GPU busy and idle, copy overlap, host syncs per step, step time — with verdicts."""
    analysis = report.analysis
    limits = analysis.thresholds
    scores: list[Score] = []
    if not analysis.has_gpu:
        scores.append(Score("GPU activity", "none", no_gpu_statement(report), "info"))
    else:
        span = analysis.span_ns
        busy = sum(device.busy_ns for device in analysis.devices)
        share = busy / span if span else 0.0
        level = "good" if share >= 0.8 else "warn" if share >= limits.low_utilization else "bad"
        verdict = {
            "good": "The GPU is kept busy.",
            "warn": "The GPU waits a noticeable part of the time.",
            "bad": "The GPU is idle most of the time: see the findings below.",
        }[level]
        scores.append(Score("GPU busy", _pct(share), verdict, level))
        scores.append(
            Score(
                "GPU idle",
                _pct(1 - share),
                f"{(span - busy) / 1e6:,.1f} ms idle of {span / 1e6:,.1f} ms.",
                level,
            )
        )
        for direction, label in (("HtoD", "H2D overlap"), ("DtoH", "D2H overlap")):
            ratio = analysis.overlap.get(direction)
            if ratio is None:
                scores.append(Score(label, "—", "No such copies.", "info"))
            else:
                good = ratio >= limits.h2d_overlap_ratio
                scores.append(
                    Score(
                        label,
                        _pct(ratio),
                        "Copies run under compute." if good else "Copies mostly run while kernels wait.",
                        "good" if good else "warn",
                    )
                )
    sync_count = sum(call.count for call in analysis.syncs)
    if analysis.iterations:
        per_step = sync_count / analysis.iterations
        if per_step == 0:
            level, verdict = "good", "No host waits in the loop."
        elif per_step < 1:
            level, verdict = "good", "Fewer than one per step: not a wait inside the loop."
        else:
            level = "warn" if per_step <= 2 else "bad"
            verdict = "Each sync stops the host from queueing ahead."
        scores.append(Score("Host syncs / step", f"{per_step:.3g}", verdict, level))
    else:
        scores.append(
            Score(
                "Host syncs",
                str(sync_count),
                "No step markers: counted over the whole trace.",
                "info" if not sync_count else "warn",
            )
        )
    steps = [step for step in analysis.steps]
    if steps:
        windows = {step.step: step.span_ns for step in steps}
        mean = sum(windows.values()) / len(windows)
        scores.append(
            Score("Step time", f"{mean / 1e6:,.2f} ms", f"Mean of {len(windows)} profiled steps.", "info")
        )
    return tuple(scores)
