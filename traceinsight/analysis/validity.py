"""Is this trace a fair sample of the training loop? Warnings shown at the top of every output.

Each warning has a stable ``kind`` (scripts key on it), a sentence saying what was seen and what it
does to the numbers, and what to do about it.
"""

from __future__ import annotations

from dataclasses import dataclass

import polars as pl

from traceinsight.analysis.launches import first_launch_calls
from traceinsight.analysis.steady import SteadyState
from traceinsight.formatting import format_duration
from traceinsight.load import RunProfile, Trace

__all__ = ["TraceWarning", "trace_warnings"]

#: Host calls that launch GPU work (each should have GPU activity with its correlation).
_LAUNCH_CALLS = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel",
)
_GRAPH_LAUNCHES = ("cudaGraphLaunch", "hipGraphLaunch", "cuGraphLaunch")
#: Float timestamps of adjacent GPU events overlap by a few ns; more than this is a recording issue.
_OVERLAP_TOLERANCE_NS = 1_000
_WAIT_ADVICE = (
    "profile after the first steps: `traceinsight run --wait 2 train.py`, or "
    "`torch.profiler.schedule(wait=1, warmup=1, active=3)` with `prof.step()` each iteration"
)


@dataclass(frozen=True, slots=True)
class TraceWarning:
    """Something about the trace that limits what its numbers say."""

    kind: str
    message: str
    advice: str


#: For a trace of `traceinsight run` without steps: `--wait` cannot help, marking steps does.
_MARK_STEPS_ADVICE = (
    "call `traceinsight.step()` at the end of each iteration of your loop: `traceinsight run` then "
    "records steps after the start-up, with your code's lines"
)


def _step_warnings(steady: SteadyState, run: RunProfile | None = None) -> list[TraceWarning]:
    warnings: list[TraceWarning] = []
    if steady.source == "none":
        if steady.startup_end_ns is not None:
            warnings.append(
                TraceWarning(
                    "startup-captured",
                    f"Start-up was captured: {steady.startup_evidence}. Everything before it is left "
                    "out of the findings (shown as idle outside the steady state).",
                    _WAIT_ADVICE if run is None else _MARK_STEPS_ADVICE,
                )
            )
        warnings.append(
            TraceWarning(
                "no-steps",
                "The trace has no step markers (ProfilerStep or optimizer steps), so it is judged "
                "as one window and figures cannot be given per step.",
                "mark each iteration: `traceinsight run` marks every `optimizer.step()`, and "
                "`traceinsight.step()` in a loop without one; with your own profiler, call "
                "`prof.step()` once per iteration",
            )
        )
        return warnings
    skipped = [step for step in steady.steps if not step.steady]
    startup = [step for step in skipped if step.reason and step.reason.startswith("start-up")]
    outliers = [step for step in skipped if step.reason and step.reason.startswith("outlier")]
    cut = [step for step in skipped if step not in startup and step not in outliers]
    for step in startup:
        warnings.append(
            TraceWarning(
                "startup-captured",
                f"Start-up was captured: step {step.step} is not steady ({step.reason}: cuDNN autotune, "
                "torch.compile, memory allocation). It is left out of the findings.",
                _WAIT_ADVICE,
            )
        )
    if outliers:
        names = ", ".join(str(step.step) for step in outliers)
        reasons = "; ".join(f"step {step.step}: {step.reason}" for step in outliers)
        warnings.append(
            TraceWarning(
                "outlier-steps",
                f"Step{'s' if len(outliers) > 1 else ''} {names} took far longer than the others "
                f"({reasons}) and {'are' if len(outliers) > 1 else 'is'} left out of the findings.",
                "look at what ran in that step (a checkpoint, an evaluation, garbage collection, a "
                "data stall); profile more steps to see whether it repeats",
            )
        )
    if cut:
        names = ", ".join(str(step.step) for step in cut)
        warnings.append(
            TraceWarning(
                "cut-short-steps",
                f"Step{'s' if len(cut) > 1 else ''} {names} launched no GPU work (cut short when the "
                "profiler started or stopped) and {} left out.".format("are" if len(cut) > 1 else "is"),
                "nothing to do: the other steps are used",
            )
        )
    return warnings


def _gpu_warnings(trace: Trace) -> list[TraceWarning]:
    warnings: list[TraceWarning] = []
    gpu_correlations = trace.gpu.select("correlation").drop_nulls().unique()
    launches = trace.runtime.filter(pl.col("name").is_in(_LAUNCH_CALLS) & pl.col("correlation").is_not_null())
    if launches.height and trace.gpu.height:
        missing = launches.join(gpu_correlations, on="correlation", how="anti")
        if missing.height >= 10 and missing.height >= 0.01 * launches.height:
            warnings.append(
                TraceWarning(
                    "dropped-gpu-events",
                    f"{missing.height:,} of {launches.height:,} kernel launches have no kernel in the "
                    "trace: the profiler dropped GPU events (often at the start of the window, or when "
                    "its buffer filled), so GPU busy time is under-counted there.",
                    "record fewer steps per window (`--active`), or skip the first step",
                )
            )
    graphs = trace.runtime.filter(pl.col("name").is_in(_GRAPH_LAUNCHES)).height
    if graphs:
        warnings.append(
            TraceWarning(
                "cuda-graphs",
                f"The trace replays CUDA graphs ({graphs:,} graph launches): the kernels inside a "
                "graph share one launch, so what the host did is tied to the graph, not to each kernel.",
                "nothing to do; to see per-kernel launches, profile once without graphs",
            )
        )
    activities = trace.gpu.filter(pl.col("device").is_not_null())
    if activities.height:
        overlapping = (
            activities.sort("device", "stream", "ts")
            .with_columns(prev_end=pl.col("end").cum_max().shift(1).over("device", "stream"))
            .filter(pl.col("ts") < pl.col("prev_end") - _OVERLAP_TOLERANCE_NS)
            .height
        )
        if overlapping:
            warnings.append(
                TraceWarning(
                    "stream-overlap",
                    f"{overlapping:,} GPU {'activity overlaps' if overlapping == 1 else 'activities overlap'} "
                    "earlier work on the same stream by more "
                    "than 1 µs, which a stream cannot do: a clock or recording problem. Busy time "
                    "counts the overlap once.",
                    "re-record the trace; if it repeats, report it to PyTorch with the torch and driver versions",
                )
            )
        launched = activities.select("ts", "correlation").join(
            first_launch_calls(trace, l_ts="ts"),
            on="correlation",
            how="inner",
        )
        early = launched.filter(pl.col("ts") < pl.col("l_ts") - _OVERLAP_TOLERANCE_NS)
        if early.height:
            worst = early.select((pl.col("l_ts") - pl.col("ts")).max()).item()
            warnings.append(
                TraceWarning(
                    "clock-skew",
                    f"{early.height:,} GPU activities start before the host call that launched them "
                    f"(by up to {format_duration(worst)}): the CPU and GPU clocks disagree, so gap "
                    "causes near them may be off.",
                    "re-record the trace; a newer driver or torch usually aligns the clocks",
                )
            )
    return warnings


def _load_warnings(trace: Trace) -> list[TraceWarning]:
    notes = dict(trace.meta.load_notes)
    warnings = []
    dropped = notes.get("dropped-time", 0)
    if dropped:
        warnings.append(
            TraceWarning(
                "dropped-time",
                f"{dropped:,} event{'s' if dropped != 1 else ''} had impossible times (beyond what "
                "a profile can hold) and {} left out.".format("were" if dropped != 1 else "was"),
                "check what wrote the file; a trace written by torch.profiler never has them",
            )
        )
    repaired = notes.get("repaired-name", 0)
    if repaired:
        warnings.append(
            TraceWarning(
                "repaired-name",
                f"{repaired:,} Python frame name{'s' if repaired != 1 else ''} written by torch "
                "without escaping (quotes or newlines) {} repaired so the file could be read.".format(
                    "were" if repaired != 1 else "was"
                ),
                "nothing to do: a known torch bug in the Python tracer's output",
            )
        )
    return warnings


def _recording_warnings(trace: Trace, steady: SteadyState) -> list[TraceWarning]:
    """A trace of `traceinsight run` whose recorded steps ran more than a tenth slower than the
    same script's steps just before recording: what recording cost them is in the host times."""
    run = trace.meta.recorded_by_run
    if run is None or not run.unprofiled_step_ns or not steady.step_ns:
        return []
    before, recorded = run.unprofiled_step_ns, steady.step_ns
    if recorded <= before * (1 + _RECORDING_COST_SHARE):
        return []
    frames = " and the frames of your code (--stacks user)" if run.stacks == "user" else ""
    steps = run.unprofiled_steps or 0
    return [
        TraceWarning(
            "recording-cost",
            f"Recorded steps took {format_duration(recorded)} (median), {recorded / before - 1:.0%} more "
            f"than the {steps} step{'s' if steps != 1 else ''} just before recording "
            f"({format_duration(before)}): recording operators, shapes{frames} slowed the host, and "
            "the host times here include that cost.",
            "compare with `traceinsight run --stacks none` (no frames, no lines) to see the host "
            "times with less of it; GPU kernel times are not affected",
        )
    ]


#: Recorded steps this much slower than the unrecorded ones get a warning.
_RECORDING_COST_SHARE = 0.10


def _setup_warnings(trace: Trace, steady: SteadyState) -> list[TraceWarning]:
    """Steps that are mostly time before the GPU's first work (or after its last): set-up, not training."""
    steps = steady.steady_steps
    if not steps or trace.gpu.is_empty():
        return []
    first = trace.gpu.get_column("ts").min()
    last = trace.gpu.get_column("end").max()
    if not isinstance(first, int) or not isinstance(last, int):
        return []
    total = sum(step.duration_ns for step in steps)
    edges = sum(
        max(0, min(step.end_ns, first) - step.start_ns) + max(0, step.end_ns - max(step.start_ns, last))
        for step in steps
    )
    if total and edges >= 0.5 * total:
        return [
            TraceWarning(
                "setup-captured",
                f"{edges / total:.0%} of the profiled step time passes before the GPU's first work or "
                "after its last: the profile caught set-up (compilation, loading, a first call) rather "
                "than training steps.",
                _WAIT_ADVICE,
            )
        ]
    return []


def trace_warnings(trace: Trace, steady: SteadyState) -> tuple[TraceWarning, ...]:
    """Every warning about ``trace`` (see the module doc), load problems first."""
    return tuple(
        _load_warnings(trace)
        + _step_warnings(steady, trace.meta.recorded_by_run)
        + _recording_warnings(trace, steady)
        + _setup_warnings(trace, steady)
        + _gpu_warnings(trace)
    )
