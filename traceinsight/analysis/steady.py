"""Steps and the steady state: which stretch of the trace the findings may speak for.

A profile often holds more than the training loop at its usual pace: the first step (cuDNN
autotune, ``torch.compile``, the caching allocator growing), an outlier step (a checkpoint, a
garbage collection), a step cut short when the profiler stopped, or, in a trace without steps, the
whole start-up. Findings and savings are computed on the steady-state steps only; the rest is
reported as idle "outside the steady state" and named in a warning.

Steps come from ``ProfilerStep#N`` host ranges, else from the windows between the ends of
consecutive ``Optimizer.step#`` ranges. Rules (``Thresholds``):

- a step in which the host launched no GPU work, in a trace with GPU work, was cut short;
- the first step is start-up when it is ``startup_step_factor`` × the median of the others or more;
- any other step is an outlier at ``outlier_step_factor`` × the median of all steps or more
  (in both cases also at least ``outlier_min_excess_us`` longer than that median).

Without steps, the start-up ends with the last annotation named like a warm-up, or with the last
"first call" of an operator that took ``first_call_factor`` × its name's median or more (and at
least ``first_call_min_us``) before the operator settled: cuDNN autotune, lazy initialisation.
"""

from __future__ import annotations

from dataclasses import dataclass
from statistics import median

import polars as pl

from traceinsight.formatting import format_duration
from traceinsight.load import Trace, taxonomy
from traceinsight.thresholds import Thresholds

__all__ = ["SteadyState", "Step", "steady_state", "step_windows"]


@dataclass(frozen=True, slots=True)
class Step:
    """One training step: a host window, and whether it is part of the steady state."""

    step: int
    """``ProfilerStep#N``'s N, or the optimizer step's index in the trace."""
    start_ns: int
    end_ns: int
    steady: bool
    #: Why the step is left out of the steady state, in plain words (None when steady).
    reason: str | None = None

    @property
    def duration_ns(self) -> int:
        """Length of the host window."""
        return self.end_ns - self.start_ns


@dataclass(frozen=True, slots=True)
class SteadyState:
    """Which parts of the trace are the steady state."""

    #: Where steps come from: ``ProfilerStep``, ``optimizer`` (Optimizer.step ranges) or ``none``.
    source: str
    steps: tuple[Step, ...]
    #: Disjoint host-time windows of the steady state, in order: runs of consecutive steady steps,
    #: or, without steps, one window from the end of the start-up to the end of the trace.
    windows: tuple[tuple[int, int], ...]
    #: Without steps: when the detected start-up ended (None if none was detected).
    startup_end_ns: int | None = None
    #: What showed the start-up, in plain words (first calls, warm-up ranges).
    startup_evidence: str | None = None

    @property
    def steady_steps(self) -> tuple[Step, ...]:
        """The steps findings are computed on."""
        return tuple(step for step in self.steps if step.steady)

    @property
    def step_ns(self) -> int | None:
        """Median steady step time (None without steps)."""
        steady = [step.duration_ns for step in self.steady_steps]
        return round(median(steady)) if steady else None

    @property
    def window_ns(self) -> int:
        """Total length of the steady-state windows."""
        return sum(end - start for start, end in self.windows)


def step_windows(trace: Trace) -> tuple[str, pl.DataFrame]:
    """The trace's steps → (source, frame ``step, start, end``), sorted by start.

    ``ProfilerStep#N`` ranges when there are any (one per number); else the windows between the ends
    of consecutive ``Optimizer.step#`` ranges of the most frequent optimizer (n ranges → n − 1 steps).
    """
    profiler = (
        trace.annotations.filter(pl.col("name").str.starts_with("ProfilerStep#"))
        .select(
            step=pl.col("name").str.extract(taxonomy.STEP_PATTERN.pattern, 1).cast(pl.Int64),
            start=pl.col("ts"),
            end=pl.col("end"),
        )
        .drop_nulls("step")
        .unique("step", keep="first")
        .sort("start", "step")
    )
    if profiler.height:
        return "ProfilerStep", profiler
    optimizer = trace.annotations.filter(pl.col("name").str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX))
    if optimizer.height >= 2:
        name = (
            optimizer.group_by("name").len().sort(["len", "name"], descending=[True, False]).item(0, "name")
        )
        ends = optimizer.filter(pl.col("name") == name).get_column("end").sort()
        windows = pl.DataFrame(
            {"start": ends.head(-1), "end": ends.tail(-1)}, schema={"start": pl.Int64, "end": pl.Int64}
        ).filter(pl.col("end") > pl.col("start"))
        if windows.height:
            return "optimizer", windows.with_row_index("step").with_columns(pl.col("step").cast(pl.Int64))
    return "none", pl.DataFrame(schema={"step": pl.Int64, "start": pl.Int64, "end": pl.Int64})


def _launching_steps(trace: Trace, windows: pl.DataFrame) -> set[int]:
    """Steps in whose window the host launched GPU work (a runtime call tied to a GPU activity)."""
    launches = (
        trace.runtime.select("correlation", "ts")
        .join(trace.gpu.select("correlation").unique(), on="correlation", how="semi")
        .select("ts")
        .sort("ts")
    )
    if launches.is_empty():
        return set()
    times = launches.get_column("ts")
    first = times.search_sorted(windows.get_column("start"), side="left")
    last = times.search_sorted(windows.get_column("end"), side="left")
    return {step for step, a, b in zip(windows.get_column("step"), first, last, strict=True) if b > a}


def _judge_steps(trace: Trace, windows: pl.DataFrame, limits: Thresholds) -> tuple[Step, ...]:
    rows = list(windows.iter_rows(named=True))
    reasons: dict[int, str] = {}
    if trace.has_gpu_activity:
        launching = _launching_steps(trace, windows)
        for row in rows:
            if row["step"] not in launching:
                reasons[row["step"]] = "no GPU work was launched in it (cut short by the profiler)"
    kept = [row for row in rows if row["step"] not in reasons]
    excess = round(limits.outlier_min_excess_us * 1000)
    if len(kept) >= 2:
        first, rest = kept[0], kept[1:]
        durations = [row["end"] - row["start"] for row in kept]
        others = median(durations[1:])
        length = first["end"] - first["start"]
        if length >= limits.startup_step_factor * others and length - others >= excess:
            reasons[first["step"]] = (
                f"start-up: the first step took {format_duration(length)}, "
                f"{length / others:.1f}× the median of the others"
            )
        middle = median(durations)
        for row in rest:
            length = row["end"] - row["start"]
            if length >= limits.outlier_step_factor * middle and length - middle >= excess:
                reasons[row["step"]] = (
                    f"outlier: it took {format_duration(length)}, {length / middle:.1f}× the median step"
                )
    if rows and len(reasons) == len(rows):
        reasons.clear()  # nothing would be left: judge the steps as they are
    return tuple(
        Step(row["step"], row["start"], row["end"], row["step"] not in reasons, reasons.get(row["step"]))
        for row in rows
    )


def _runs(steps: tuple[Step, ...]) -> tuple[tuple[int, int], ...]:
    """Consecutive steady steps merged into windows (a non-steady step splits them).

    The few µs between one ``ProfilerStep`` range and the next belong to the loop, so a window runs
    from its first step's start to its last step's end.
    """
    windows: list[tuple[int, int]] = []
    previous_steady = False
    for step in sorted(steps, key=lambda item: item.start_ns):
        if not step.steady:
            previous_steady = False
            continue
        if previous_steady:
            windows[-1] = (windows[-1][0], max(windows[-1][1], step.end_ns))
        else:
            windows.append((step.start_ns, step.end_ns))
        previous_steady = True
    return tuple(windows)


def _trace_extent(trace: Trace) -> tuple[int, int] | None:
    """First start and last end over host and GPU events."""
    starts, ends = [], []
    for table in (trace.gpu, trace.runtime, trace.cpu_ops, trace.annotations, trace.python):
        if table.height:
            starts.append(table.get_column("ts").min())
            ends.append(table.get_column("end").max())
    values_start = [int(value) for value in starts if isinstance(value, int)]
    values_end = [int(value) for value in ends if isinstance(value, int)]
    if not values_start or not values_end:
        return None
    return min(values_start), max(values_end)


def _startup_without_steps(trace: Trace, limits: Thresholds) -> tuple[int | None, str | None]:
    """When the start-up of a trace without steps ended, and what showed it."""
    ends: list[tuple[int, str]] = []
    warmups = trace.annotations.filter(pl.col("name").str.contains(taxonomy.WARMUP_ANNOTATION_PATTERN))
    if warmups.height:
        row = warmups.sort("end").row(-1, named=True)
        ends.append((row["end"], f"a range named {row['name']!r} ends at that point"))
    min_ns = round(limits.first_call_min_us * 1000)
    ops = trace.cpu_ops.select("name", "ts", "end", "dur")
    stats = (
        ops.group_by("name").agg(calls=pl.len(), typical=pl.col("dur").median()).filter(pl.col("calls") >= 3)
    )
    slow = ops.join(stats, on="name", how="inner").with_columns(
        outlier=(pl.col("dur") >= pl.col("typical") * limits.first_call_factor) & (pl.col("dur") >= min_ns)
    )
    settled = slow.filter(~pl.col("outlier")).group_by("name").agg(settled=pl.col("ts").median())
    first_calls = (
        slow.filter(pl.col("outlier"))
        .join(settled, on="name", how="inner")
        .filter(pl.col("ts") < pl.col("settled"))
        .sort("end")
    )
    if first_calls.height:
        row = first_calls.row(-1, named=True)
        ends.append(
            (
                row["end"],
                f"the first call of {row['name']} took {format_duration(row['dur'])} "
                f"(usually {format_duration(row['typical'])})",
            )
        )
    if not ends:
        return None, None
    end, evidence = max(ends)
    return end, evidence


def steady_state(trace: Trace, limits: Thresholds | None = None) -> SteadyState:
    """Steps, which of them are steady, and the steady-state windows (see the module doc)."""
    limits = limits or Thresholds()
    source, windows = step_windows(trace)
    if source != "none":
        steps = _judge_steps(trace, windows, limits)
        return SteadyState(source=source, steps=steps, windows=_runs(steps))
    extent = _trace_extent(trace)
    if extent is None:
        return SteadyState(source="none", steps=(), windows=())
    startup_end, evidence = _startup_without_steps(trace, limits)
    start, end = extent
    if startup_end is not None and start < startup_end < end:
        return SteadyState("none", (), ((startup_end, end),), startup_end, evidence)
    return SteadyState("none", (), ((start, end),))


def iteration_count(trace: Trace) -> int | None:
    """Training iterations: ProfilerStep spans, else ``Optimizer.step#`` ranges, else unknown."""
    source, windows = step_windows(trace)
    if source == "ProfilerStep":
        return windows.height
    optimizer_steps = trace.annotations.filter(
        pl.col("name").str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX)
    ).height
    return optimizer_steps or None
