"""Is this trace a fair sample of the training loop? Warnings shown at the top of every output.

Each warning has a stable ``kind`` (scripts key on it), a sentence saying what was seen and what it
does to the numbers, and what to do about it.
"""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.capture import capture_windows, graph_capture, launches_in
from traceinsight.analysis.shared import launch_calls
from traceinsight.analysis.steady import SteadySteps, StepRange
from traceinsight.formatting import format_duration
from traceinsight.load import RunProfile, Trace, taxonomy
from traceinsight.model import Model

__all__ = [
    "FIRST_CALLS_ONLY",
    "GPU_RECORDS_LOST",
    "NO_GPU_WORK",
    "WAIT_COMMAND",
    "TraceWarning",
    "trace_warnings",
    "unrecorded_gpu",
]

#: Float timestamps of adjacent GPU events overlap by a few ns; more than this is a recording issue.
_OVERLAP_TOLERANCE_NS = 1_000
#: The command the start-up advice gives, for a script it does not know (a report of
#: ``traceinsight run`` names the script it ran instead: :func:`traceinsight.results.report_for`).
WAIT_COMMAND = "traceinsight run --wait 2 train.py"
_WAIT_ADVICE = (
    f"profile after the first steps: `{WAIT_COMMAND}`, or "
    "`torch.profiler.schedule(wait=1, warmup=1, active=3)` with `prof.step()` each iteration"
)


class TraceWarning(Model, frozen=True):
    """Something about the trace that limits what its numbers say."""

    kind: str
    message: str
    advice: str


#: For a trace of `traceinsight run` without steps: `--wait` cannot help, marking steps does.
_MARK_STEPS_ADVICE = (
    "call `traceinsight.step()` at the end of each iteration of your loop: `traceinsight run` then "
    "records steps after the start-up, with your code's lines"
)


def _step_warnings(steady: SteadySteps, run: RunProfile | None = None) -> list[TraceWarning]:
    warnings: list[TraceWarning] = []
    if steady.source == "request":
        waiting = (
            f"; the {format_duration(steady.waiting_ns)} between them is waiting for work, outside "
            "every figure"
            if steady.waiting_ns
            else ""
        )
        if steady.request_from_pattern:
            taken = (
                f"No step markers and no repeating range: the host's work repeats {len(steady.steps)} times, "
                f"each beginning with `{steady.request_name}` and followed by a silence with nothing recorded "
                f"on the host and the GPU idle; each is taken as a step (a request){waiting}. A request's "
                "saving is within the request: the next one does not arrive sooner."
            )
            advice = (
                "if the host prepares the next input in those silences (untraced Python), that time is the "
                "host's, not waiting: wrap each request in `record_function`, or call `prof.step()` once per "
                "request"
            )
        else:
            taken = (
                f"No step markers: each of the {len(steady.steps)} `{steady.request_name}` ranges is taken "
                f"as a step (a request){waiting}. A request's saving is within the request: the next "
                "one does not arrive sooner."
            )
            advice = "nothing to do; to mark steps yourself, call `prof.step()` once per request"
        warnings.append(TraceWarning("steps-from-requests", taken, advice))
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
    warnings.extend(_one_step_warning(steady, run))
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


def _capture_warning(trace: Trace, windows: pl.DataFrame) -> list[TraceWarning]:
    """A trace that captures CUDA/HIP graphs: how much of it, and what to profile instead."""
    capture = graph_capture(trace, windows)
    if capture is None:
        return []
    share = capture.captured_ns / capture.span_ns if capture.span_ns else 0.0
    inside = f" (in {', '.join(capture.ranges[:3])})" if capture.ranges else ""
    count = f"{capture.captures:,} graph capture{'s' if capture.captures != 1 else ''}"
    return [
        TraceWarning(
            "graph-capture",
            f"The trace records {capture.api} graph capture: {count}{inside} "
            f"take{'s' if capture.captures == 1 else ''} {format_duration(capture.captured_ns)} "
            f"of the {format_duration(capture.span_ns)} recorded ({share:.0%}). The "
            f"{capture.captured_launches:,} kernel launches inside went into a graph and did not run, so "
            "the GPU is idle there by design: that idle is not a finding, and it is not the speed of "
            "the graphs when they run.",
            "profile the replay, not the capture: start the profiler after the graphs are captured "
            "(vLLM and SGLang capture at start-up) and record steady decode steps, where "
            "cudaGraphLaunch replays them",
        )
    ]


def _gpu_warnings(trace: Trace, first_calls: pl.DataFrame | None) -> list[TraceWarning]:
    warnings: list[TraceWarning] = []
    gpu_correlations = trace.gpu.select("correlation").drop_nulls().unique()
    launches = trace.runtime.filter(
        pl.col("name").is_in(taxonomy.KERNEL_LAUNCH_CALLS) & pl.col("correlation").is_not_null()
    )
    windows = capture_windows(trace)
    if launches.height and trace.gpu.height:
        missing = launches.join(gpu_correlations, on="correlation", how="anti")
        # launches inside a graph capture are recorded into the graph: missing by design
        captured = launches_in(windows, missing)
        missing = missing.filter(~captured)
        should_run = launches.height - int(captured.sum())
        if missing.height >= 10 and missing.height >= 0.01 * should_run:
            warnings.append(
                TraceWarning(
                    "dropped-gpu-events",
                    f"{missing.height:,} of {should_run:,} kernel launches have no kernel in the "
                    "trace: the profiler dropped GPU events (often at the start of the window, or when "
                    "its buffer filled), so GPU busy time is under-counted there.",
                    f"record fewer steps per window (`--active`), or skip the first step; {_BUFFER_ADVICE}",
                )
            )
    warnings += _capture_warning(trace, windows)
    graphs = trace.runtime.filter(pl.col("name").is_in(list(taxonomy.GRAPH_LAUNCH_CALLS))).height
    if graphs:
        warnings.append(
            TraceWarning(
                "cuda-graphs",
                f"The trace replays CUDA graphs ({graphs:,} graph launches): the kernels inside a "
                "graph share one launch, so what the host did is tied to the graph, not to each kernel.",
                "nothing to do; to see per-kernel launches, profile once without graphs",
            )
        )
    activities = trace.gpu.select("device", "stream", "ts", "end", "correlation").filter(
        pl.col("device").is_not_null()
    )
    if activities.height:
        overlapping = (
            activities.lazy()
            .sort("device", "stream", "ts")
            .with_columns(prev_end=pl.col("end").cum_max().shift(1).over("device", "stream"))
            .filter(pl.col("ts") < pl.col("prev_end") - _OVERLAP_TOLERANCE_NS)
            .collect(engine="in-memory")
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
        early = (
            activities.lazy()
            .select("ts", "correlation")
            .join(
                (launch_calls(trace) if first_calls is None else first_calls)
                .lazy()
                .select("correlation", "l_ts"),
                on="correlation",
                how="inner",
            )
            .filter(pl.col("ts") < pl.col("l_ts") - _OVERLAP_TOLERANCE_NS)
            .collect(engine="in-memory")
        )
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


#: A trace whose launches have no GPU activity at all: the GPU's records were lost, not off.
GPU_RECORDS_LOST = "gpu-records-lost"
#: A trace with CUDA/HIP calls but no launch and no GPU activity: recording was on, nothing ran.
NO_GPU_WORK = "no-gpu-work"
_BUFFER_ADVICE = (
    "or give the profiler a larger buffer (ACTIVITIES_MAX_GPU_BUFFER_SIZE_MB in a Kineto config file "
    "named by KINETO_CONFIG)"
)


def _unrecorded_gpu_warnings(trace: Trace) -> list[TraceWarning]:
    """A trace without GPU activity whose host called CUDA/HIP: not "profiling was off".

    Launches (kernel or graph launches, outside graph capture) with no kernel at all mean the
    profiler lost the GPU's records (its buffer filled, the process ended before the flush): GPU
    figures are unknown. Runtime calls without any launch mean recording was on and no GPU work ran
    in the window. A trace with no CUDA/HIP call at all is the one recorded without
    ``ProfilerActivity.CUDA`` (the header and scorecard say so)."""
    if trace.has_gpu_activity or trace.runtime.is_empty() or trace.meta.foreign_accelerator is not None:
        return []
    names = (*taxonomy.KERNEL_LAUNCH_CALLS, *sorted(taxonomy.GRAPH_LAUNCH_CALLS))
    launches = trace.runtime.filter(pl.col("name").is_in(names))
    if launches.height:
        launches = launches.filter(~launches_in(capture_windows(trace), launches))
    if launches.height:
        counts = launches.group_by("name").len().sort("len", "name", descending=[True, False])
        which = ", ".join(f"{count:,} {name}" for name, count in counts.iter_rows())
        return [
            TraceWarning(
                GPU_RECORDS_LOST,
                f"The host launched GPU work ({which}) but the trace holds no kernel, copy or "
                "memset: the profiler lost the GPU's records (its buffer filled, or the process "
                "ended before they were written). CUDA activity was recorded; GPU busy, idle and "
                "savings are unknown, and nothing below claims them.",
                f"record a shorter window (fewer steps, `--active 1`), fewer activities (no "
                f"record_shapes, with_stack or profile_memory), {_BUFFER_ADVICE}",
            )
        ]
    return [
        TraceWarning(
            NO_GPU_WORK,
            f"CUDA activity was recorded ({trace.runtime.height:,} runtime calls) but no kernel, copy "
            "or memset ran in the window: the profiled code did no GPU work while recording.",
            "profile the steps that run on the GPU (check that the model and the batch are on it, "
            "and that the window covers training steps)",
        )
    ]


def unrecorded_gpu(warnings: tuple[TraceWarning, ...]) -> str | None:
    """Why a trace without GPU activity has none, when its warnings tell: :data:`GPU_RECORDS_LOST`
    or :data:`NO_GPU_WORK`; None otherwise (no GPU, or recorded without ``ProfilerActivity.CUDA``)."""
    return next((w.kind for w in warnings if w.kind in (GPU_RECORDS_LOST, NO_GPU_WORK)), None)


#: A window whose kernels are at least this share first launches (their name never ran before)
#: and whose slow launch calls (``_SLOW_LAUNCH_NS`` or more: loading GPU code) take at least
#: ``_COLD_SHARE`` of it holds only first calls.
_FIRST_CALL_SHARE = 0.8
_SLOW_LAUNCH_NS = 1_000_000
_COLD_SHARE = 0.25
#: The warning of a window of first calls: no finding claims a saving on it.
FIRST_CALLS_ONLY = "first-calls-only"


def _first_calls_warning(trace: Trace, steady: SteadySteps) -> list[TraceWarning]:
    """A window (no steps, or one step) whose kernels are nearly all first launches (no kernel of
    that name ran before it in the trace) and whose time goes largely to slow launch calls (a
    kernel's first launch loads its GPU code: milliseconds where a launch takes microseconds): a
    cold pass. It claims nothing about the loop's pace."""
    if len(steady.steady_steps) > 1 or trace.gpu.is_empty():
        return []
    windows = steady.device_windows
    if not windows:
        return []
    kernels = (
        trace.gpu.filter(pl.col("kind") == "kernel")
        .select("name", "ts")
        .sort("ts")
        .with_columns(first=pl.col("ts") == pl.col("ts").min().over("name"))
    )
    inside = pl.any_horizontal((pl.col("ts") >= start) & (pl.col("ts") < end) for start, end in windows)
    window = kernels.filter(inside)
    if window.is_empty():
        return []
    first = int(window.get_column("first").sum())
    if first < _FIRST_CALL_SHARE * window.height:
        return []
    slow = trace.runtime.filter(
        pl.col("name").is_in(taxonomy.KERNEL_LAUNCH_CALLS) & (pl.col("dur") >= _SLOW_LAUNCH_NS) & inside
    )
    slow_ns = int(slow.get_column("dur").sum())
    if slow_ns < _COLD_SHARE * sum(end - start for start, end in windows):
        return []
    return [
        TraceWarning(
            FIRST_CALLS_ONLY,
            f"The window analyzed holds only first calls: {first:,} of its {window.height:,} kernels "
            f"are the first of their name in the trace, and {slow.height:,} first launch"
            f"{'es' if slow.height != 1 else ''} took {format_duration(slow_ns)} loading GPU code. That "
            "is a cold pass (loading kernels, autotuning, each operator's first-call set-up), not the "
            "loop's pace: no finding claims a saving.",
            "profile warm steps: run a few iterations before recording "
            "(`torch.profiler.schedule(wait=1, warmup=1, active=3)`), or `traceinsight run --wait 2`",
        )
    ]


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


#: The one-step box's advice in a trace of `traceinsight run`: more steps in the window. Never
#: ``--wait 2``: when the memory budget ended the window, or the script runs few steps, skipping
#: more of them leaves no trace at all (a 2-step script).
_MORE_STEPS_ADVICE = (
    "record more steps: raise `--active` (5 by default), and `--max-memory` when the memory budget "
    "ended the window (`traceinsight run` says so when it does)"
)


def _one_step_warning(steady: SteadySteps, run: RunProfile | None = None) -> list[TraceWarning]:
    """The findings rest on a single steady step: nothing shows whether what it finds repeats, and
    when it is the first step recorded it also carries a first pass's costs (mi250_rocm_toy: a 6.5 ms
    first kernel launch in a 9.3 ms step). A trace of `traceinsight run` (``run``) is advised in its
    own terms (:data:`_MORE_STEPS_ADVICE`)."""
    if len(steady.steady_steps) != 1:
        return []
    only = steady.steady_steps[0]
    first = bool(steady.steps) and steady.steps[0].step == only.step
    return [
        TraceWarning(
            "one-step",
            f"Everything below rests on one step (step {only.step}"
            + (
                ", the first one recorded): one step cannot tell the loop's pace from a first pass's "
                "costs (loading kernels, allocating memory, autotuning), nor show that what it finds "
                "repeats."
                if first
                else "): nothing shows that what it finds repeats in other steps."
            ),
            _WAIT_ADVICE if run is None else _MORE_STEPS_ADVICE,
        )
    ]


def _recording_baseline(run: RunProfile) -> tuple[int, str] | None:
    """The steady unrecorded steps' median wall time and what they were, or None when the run has
    no such steps. The first steps are left out: the one after the window also wrote the trace,
    and the first ones before it are often start-up (first calls, allocation, autotuning); a
    baseline of those said "538 % slower" of a steady loop. Steps after the window come first
    (only ``run``'s own report has them); then those before it; at least
    :data:`_BASELINE_STEADY_STEPS` must be left."""
    for steps, where, skipped in (
        (run.after_window_ns, "after the window", "the first one, which wrote the trace"),
        (run.unprofiled_each_ns, "before the window", "the first one, often start-up"),
    ):
        steady = sorted(steps[1:])
        if len(steady) >= _BASELINE_STEADY_STEPS:
            return steady[len(steady) // 2], (
                f"the median of the {len(steady)} unrecorded steps {where} ({skipped} left out)"
            )
    return None


def _recording_warnings(trace: Trace, steady: SteadySteps) -> list[TraceWarning]:
    """A trace of `traceinsight run` whose recorded steps ran more than a tenth slower than the
    same script's steady unrecorded steps (:func:`_recording_baseline`): what recording cost them
    is in the host times."""
    run = trace.meta.recorded_by_run
    baseline = None if run is None else _recording_baseline(run)
    if run is None or baseline is None or not steady.step_ns:
        return []
    (before, what), recorded = baseline, steady.step_ns
    if recorded <= before * (1 + _RECORDING_COST_SHARE):
        return []
    frames = " and the frames of your code (--stacks user)" if run.stacks == "user" else ""
    return [
        TraceWarning(
            "recording-cost",
            f"Recorded steps took {format_duration(recorded)} (median), {recorded / before - 1:.0%} more "
            f"than unrecorded ones: {format_duration(before)}, {what}. Recording operators, "
            f"shapes{frames} slowed the host, and the host times here include that cost.",
            "compare with `traceinsight run --stacks none` (no frames, no lines) to see the host "
            "times with less of it; GPU kernel times are not affected"
            if run.stacks != "none"
            # --stacks none is in use: what is left is the profiler's own cost per operator
            else "the host times include the profiler's own cost per operator (--stacks none already "
            "records no frames); GPU kernel times are not affected",
        )
    ]


#: Steady unrecorded steps (after leaving out the first) a recording-cost baseline needs.
_BASELINE_STEADY_STEPS = 2

#: Recorded steps this much slower than the unrecorded ones get a warning.
_RECORDING_COST_SHARE = 0.10


def _repeats_every_step(steps: tuple[StepRange, ...]) -> bool:
    """Every steady step (two or more) waits before its own first GPU work at least half as long as
    the one that waits longest: the host prepares each step (per-step host preprocessing, named by
    its own finding), not a set-up caught once."""
    leads = [step.gpu_start_ns - step.begin_ns for step in steps if step.gpu_start_ns is not None]
    return len(steps) >= 2 and len(leads) == len(steps) and min(leads) >= 0.5 * max(leads) > 0


def _setup_warnings(trace: Trace, steady: SteadySteps) -> list[TraceWarning]:
    """Steps that are mostly time before the GPU's first work (or after its last): set-up, not
    training, unless every step spends that time (per-step host preprocessing)."""
    steps = steady.steady_steps
    if not steps or trace.gpu.is_empty():
        return []
    first = trace.gpu.get_column("ts").min()
    last = trace.gpu.get_column("end").max()
    if not isinstance(first, int) or not isinstance(last, int):
        return []
    total = sum(step.duration_ns for step in steps)
    edges = sum(
        max(0, min(step.done_ns, first) - step.begin_ns) + max(0, step.done_ns - max(step.begin_ns, last))
        for step in steps
    )
    if total and edges >= 0.5 * total and not _repeats_every_step(steps):
        one = (
            " With one step the trace cannot tell set-up from host work every step does (decoding, "
            "preprocessing): profile more steps to tell."
            if len(steps) == 1
            else ""
        )
        return [
            TraceWarning(
                "setup-captured",
                f"{edges / total:.0%} of the profiled step time passes before the GPU's first work or "
                "after its last: the profile caught set-up (compilation, loading, a first call) rather "
                f"than training steps.{one}",
                _WAIT_ADVICE,
            )
        ]
    return []


def _accelerator_warnings(trace: Trace) -> list[TraceWarning]:
    """An accelerator this tool cannot read (MTIA, ...), in a trace without CUDA/ROCm GPU work: say
    so, so that no output reads the trace as a CPU-only run."""
    foreign = trace.meta.foreign_accelerator
    if foreign is None or trace.has_gpu_activity:
        return []
    return [
        TraceWarning(
            "unreadable-accelerator",
            f"This is an {foreign.name} accelerator trace ({foreign.events}), which traceinsight cannot "
            "read: it measures CUDA and ROCm GPUs. It is not a CPU-only run: only the host side is "
            "measured here, and nothing below says how busy the accelerator was or why it waited.",
            "read the accelerator's side with a tool that knows its trace (Holistic Trace Analysis "
            "reads MTIA traces) or open the file in Perfetto (ui.perfetto.dev)",
        )
    ]


def trace_warnings(
    trace: Trace, steady: SteadySteps, launches: pl.DataFrame | None = None
) -> tuple[TraceWarning, ...]:
    """Every warning about ``trace`` (see the module doc): an accelerator it cannot read first,
    then load problems. ``launches`` is :func:`~traceinsight.analysis.shared.launch_calls` when
    the caller has it."""
    return tuple(
        _accelerator_warnings(trace)
        + _unrecorded_gpu_warnings(trace)
        + _load_warnings(trace)
        + _step_warnings(steady, trace.meta.recorded_by_run)
        + _recording_warnings(trace, steady)
        + _setup_warnings(trace, steady)
        + _first_calls_warning(trace, steady)
        + _gpu_warnings(trace, launches)
    )
