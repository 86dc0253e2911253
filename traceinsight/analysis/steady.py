"""Steps and the steady state: which stretch of the trace the findings may speak for.

A profile often holds more than the training loop at its usual pace: the first step (cuDNN
autotune, ``torch.compile``, the caching allocator growing), an outlier step (a checkpoint, a
garbage collection), a step cut short when the profiler stopped, or, in a trace without steps, the
whole start-up. Findings and savings are computed on the steady-state steps only; the rest is
reported as idle "outside the steady state" and named in a warning.

Steps come from ``ProfilerStep#N`` host ranges, else from the windows between the ends of
consecutive ``Optimizer.step#`` ranges, else from requests: a ``record_function`` range that repeats
(``handle_request``, at least ``_MIN_REQUESTS`` times, never overlapping itself) and holds at least
half of the trace's launches (of such names, the one holding the most, then the longest: the
outermost). A request server's requests do not follow each other: the time between one request's
done and the next one's start is the server waiting for work, outside every step (each request is
its own window; nothing the host does in one request makes the next one arrive sooner). With no
such range, the host's repeating top-level pattern is tried (:func:`pattern_requests`: silences with
nothing recorded and the GPU idle cut the launching thread's work into pieces that each begin with
the same operator and hold no training), only when the evidence is that strong. A step ends when its work ends: each GPU activity belongs to
the step whose host range holds the runtime call that launched it (correlation id), and to
``ProfilerStep#N`` where a ``gpu_user_annotation`` of that name covers it on a GPU row. A step is
*done* at the later of its host range's end and the end of the last GPU work it launched, and never
before the step before it was done:

    done_i = max(host end_i, GPU end_i, done_{i-1})

Its step time is the spacing of those ends, ``done_i - done_{i-1}`` (the first step's from its host
start): the GPU's pace when the host runs ahead of it (a ``ProfilerStep`` range then covers a sliver
of the GPU's work), the host's when the GPU waits for it. So every step has two windows: its host
range, which decides which host events are its own (syncs, DataLoader waits, copy calls, launches),
and its device window ``[done_{i-1}, done_i]`` (the first from its host start), which carries the
GPU's busy and idle time. The device windows tile the time from the first step's start to the last
step's done without overlap.

Rules (``Thresholds``), on the step times:

- a step in which the host launched no GPU work, in a trace with GPU work, was cut short;
- the first step is start-up when it is ``startup_step_factor`` × the median of the others or more;
- any other step is an outlier at ``outlier_step_factor`` × the median of all steps or more
  (in both cases also at least ``outlier_min_excess_us`` longer than that median).

Without steps, the start-up ends with the last annotation named like a warm-up, or with the last
"first call" of an operator that took ``first_call_factor`` × its name's median or more (and at
least ``first_call_min_us``) before the operator settled: cuDNN autotune, lazy initialisation.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from statistics import median
from typing import Any

import polars as pl

from traceinsight.analysis.intervals import within
from traceinsight.analysis.shared import launch_calls
from traceinsight.formatting import format_duration
from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model, field
from traceinsight.thresholds import Thresholds

__all__ = ["SteadySteps", "StepRange", "owned_work", "steady_state", "step_windows"]


class StepRange(Model, frozen=True):
    """One training step: its host range, when its work was done, and whether it is steady."""

    step: int
    """``ProfilerStep#N``'s N, or the optimizer step's index in the trace."""
    #: The host range (``ProfilerStep#N``, or between two ``Optimizer.step`` ends).
    start_ns: int
    end_ns: int
    steady: bool
    #: Why the step is left out of the steady state, in plain words (None when steady).
    reason: str | None = None
    #: Where the step's time begins: when the step before it was done (the first step: its host
    #: start). ``None`` stands for ``start_ns``.
    begin: int | None = None
    #: When the step's work was done: the later of its host end and the end of the last GPU work
    #: it launched, never before ``begin`` (see the module doc). ``None`` stands for ``end_ns``.
    done: int | None = None
    #: End of the last GPU work launched in the step (None: it launched none the trace holds).
    gpu_end_ns: int | None = None
    #: Start of the first GPU work launched in the step (None: it launched none the trace holds).
    gpu_start_ns: int | None = None

    @property
    def begin_ns(self) -> int:
        """Start of the step's device window: the previous step's done, or this one's host start."""
        return self.start_ns if self.begin is None else self.begin

    @property
    def done_ns(self) -> int:
        """End of the step's device window: when both its host range and its GPU work had ended."""
        return self.end_ns if self.done is None else self.done

    @property
    def duration_ns(self) -> int:
        """The step time: ``done - begin`` (the spacing of the steps' ends)."""
        return self.done_ns - self.begin_ns

    @property
    def host_ns(self) -> int:
        """Length of the host range."""
        return self.end_ns - self.start_ns


class SteadySteps(Model, frozen=True):
    """Which parts of the trace are the steady state."""

    #: Where steps come from: ``ProfilerStep``, ``optimizer`` (Optimizer.step ranges) or ``none``.
    source: str
    steps: tuple[StepRange, ...]
    #: Disjoint host-time windows of the steady state, in order: runs of consecutive steady steps'
    #: host ranges, or, without steps, one window from the end of the start-up to the end of the
    #: trace. Host events (syncs, DataLoader waits, copy calls, launches) are judged in these.
    windows: tuple[tuple[int, int], ...]
    #: Without steps: when the detected start-up ended (None if none was detected).
    startup_end_ns: int | None = None
    #: What showed the start-up, in plain words (first calls, warm-up ranges).
    startup_evidence: str | None = None
    #: The same runs on the GPU's clock: from the first step's begin to the last step's done.
    #: GPU busy and idle time is judged in these. Empty: the same as ``windows`` (no steps).
    gpu_windows: tuple[tuple[int, int], ...] = ()
    #: (step, device) → start of the first GPU activity the step launched on the device (the host
    #: range holds its launch call; see :func:`owned_work`). Empty without steps.
    first_work: Mapping[tuple[int, int], int] = field(default_factory=dict, compare=False, repr=False)
    #: With ``source == "request"``: the repeating range taken as a request (``handle_request``),
    #: or with :attr:`request_from_pattern` the operator each request of the host's pattern begins
    #: with (``tokenize``).
    request_name: str | None = None
    #: The requests are the host's repeating top-level pattern (:func:`pattern_requests`), not
    #: ``record_function`` ranges.
    request_from_pattern: bool = False

    @property
    def between_requests(self) -> tuple[tuple[int, int], ...]:
        """Requests only: from each steady request's done to the next steady one's start, where
        the next one starts later (the server waiting for work; outside every window)."""
        if self.source != "request":
            return ()
        steps = sorted(self.steps, key=lambda step: step.start_ns)
        return tuple(
            (before.done_ns, after.start_ns)
            for before, after in itertools.pairwise(steps)
            if before.steady and after.steady and after.start_ns > before.done_ns
        )

    @property
    def waiting_ns(self) -> int:
        """Requests only: :attr:`between_requests` summed."""
        return sum(end - start for start, end in self.between_requests)

    @property
    def steady_steps(self) -> tuple[StepRange, ...]:
        """The steps findings are computed on."""
        return tuple(step for step in self.steps if step.steady)

    @property
    def step_ns(self) -> int | None:
        """Median steady step time (None without steps)."""
        steady = [step.duration_ns for step in self.steady_steps]
        return round(median(steady)) if steady else None

    @property
    def host_step_ns(self) -> int | None:
        """Median length of the steady steps' host ranges (None without steps)."""
        steady = [step.host_ns for step in self.steady_steps]
        return round(median(steady)) if steady else None

    def steady_step_of(self, times: pl.Series) -> pl.Series:
        """For each host time in the steady state, which steady step it falls in (an index over the
        steady steps in order of their host starts: the ranges :attr:`windows` merges); null
        elsewhere. What tells "in 4 of 5 steps" from "4 times in one step"."""
        inside = within(times, self.windows)
        starts = pl.Series(sorted(step.start_ns for step in self.steady_steps), dtype=pl.Int64)
        if not starts.len():
            return pl.Series(times.name, [None] * times.len(), dtype=pl.Int64)
        index = starts.search_sorted(times, side="right").cast(pl.Int64) - 1
        return pl.select(pl.when(inside & (index >= 0)).then(index)).to_series().alias(times.name)

    @property
    def device_windows(self) -> tuple[tuple[int, int], ...]:
        """Windows of the steady state on the GPU's clock (``windows`` without steps)."""
        return self.gpu_windows or self.windows

    @property
    def window_ns(self) -> int:
        """Total length of the steady-state windows on the GPU's clock: the steady steps' times."""
        return sum(end - start for start, end in self.device_windows)


def step_windows(trace: Trace, requests: bool = True) -> tuple[str, pl.DataFrame]:
    """The trace's steps → (source, frame ``step, start, end``), sorted by start.

    ``ProfilerStep#N`` ranges when there are any (one per number); else the windows between the ends
    of consecutive ``Optimizer.step#`` ranges of the most frequent optimizer (n ranges → n − 1 steps).
    """
    profiler = (
        trace.annotations.lazy()
        .filter(pl.col("name").str.starts_with("ProfilerStep#"))
        .select(
            step=pl.col("name").str.extract(taxonomy.STEP_PATTERN.pattern, 1).cast(pl.Int64),
            start=pl.col("ts"),
            end=pl.col("end"),
        )
        .drop_nulls("step")
        .unique("step", keep="first")
        .sort("start", "step")
        .collect(engine="in-memory")
    )
    if profiler.height:
        return "ProfilerStep", _without_the_switch_into_recording(trace, profiler)
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
    found = (request_ranges(trace) or pattern_requests(trace)) if requests else None
    if found is not None:
        return "request", found[1]
    return "none", pl.DataFrame(schema={"step": pl.Int64, "start": pl.Int64, "end": pl.Int64})


def _without_the_switch_into_recording(trace: Trace, steps: pl.DataFrame) -> pl.DataFrame:
    """``steps`` (``ProfilerStep#N`` ranges) with the first one starting at its first recorded event,
    in a trace of ``traceinsight run`` that records frames (``--stacks user`` or ``all``: the frames
    running when recording began are recorded from its start, so nothing of the script's precedes
    the first event). torch opens the first step's range before ``run`` has switched its own
    recording on (its frame tracer, the memory guard): that time was the user's first step's, which
    then read as not steady at 2.6-12.9 × the median, with advice to skip it (issue 52: step 3
    opened 7.8 ms before its first event, step 4 0.08 ms)."""
    run = trace.meta.recorded_by_run
    if run is None or run.stacks not in ("user", "all"):
        return steps
    start, end = steps.item(0, "start"), steps.item(0, "end")
    firsts = [
        table.filter((pl.col("ts") >= start) & (pl.col("ts") < end)).get_column("ts").min()
        for table in (
            trace.cpu_ops,
            trace.python,
            trace.runtime,
            trace.annotations.filter(~pl.col("name").str.starts_with("ProfilerStep#")),
        )
    ]
    first = min((value for value in firsts if isinstance(value, int)), default=None)
    if first is None or first <= start:
        return steps
    return steps.with_columns(
        start=pl.when(pl.int_range(pl.len()) == 0).then(first).otherwise(pl.col("start"))
    )


#: A range repeating at least this often can be a request (fewer: a one-off, or too few to judge).
_MIN_REQUESTS = 3
#: Ranges that are never requests: the loop's and the libraries' own markers.
_NOT_REQUESTS = ("ProfilerStep#", taxonomy.DATALOADER_PREFIX, "Optimizer.", "##", "[")
#: Repeating names tried as requests, the longest in all first (each costs one join).
_REQUEST_CANDIDATES = 16


def request_ranges(trace: Trace) -> tuple[str, pl.DataFrame] | None:
    """The repeating ``record_function`` range a trace without step markers does its work in
    (``handle_request``) → (its name, frame ``step, start, end`` in start order); None when none
    qualifies (see the module doc)."""
    if trace.annotations.is_empty() or trace.gpu.is_empty():
        return None
    ranges = trace.annotations.filter(
        ~pl.any_horizontal(pl.col("name").str.starts_with(prefix) for prefix in _NOT_REQUESTS)
        & ~pl.col("name").str.contains(taxonomy.WARMUP_ANNOTATION_PATTERN)
    ).select("name", "pid", "tid", "ts", "end")
    repeated = ranges.group_by("name").agg(count=pl.len()).filter(pl.col("count") >= _MIN_REQUESTS)
    if repeated.is_empty():
        return None
    ranges = ranges.join(repeated.select("name"), on="name", how="semi").sort("name", "ts", "end")
    # never overlapping itself: each starts at or after the one before it ended
    overlapping = (
        ranges.with_columns(previous_end=pl.col("end").shift(1).over("name"))
        .filter(pl.col("ts") < pl.col("previous_end"))
        .get_column("name")
        .unique()
    )
    ranges = ranges.filter(~pl.col("name").is_in(overlapping.implode()))
    longest = (
        ranges.group_by("name")
        .agg(total=(pl.col("end") - pl.col("ts")).sum())
        .sort("total", "name", descending=[True, False])
        .head(_REQUEST_CANDIDATES)
    )
    ranges = ranges.join(longest.select("name"), on="name", how="semi")
    launches = launch_calls(trace).select("pid", "tid", "l_ts").sort("l_ts")
    if ranges.is_empty() or launches.is_empty():
        return None
    # per name (a nested name would hide its parent in one join), the launches its ranges hold
    counts = []
    for (name,) in ranges.select("name").unique().iter_rows():
        mine = ranges.filter(pl.col("name") == name).sort("ts")
        inside = (
            launches.join_asof(
                mine.select("pid", "tid", "ts", r_end="end"),
                left_on="l_ts",
                right_on="ts",
                by=["pid", "tid"],
                strategy="backward",
                check_sortedness=False,  # both sorted by time; the check cannot see it per group
            )
            .filter(pl.col("l_ts") < pl.col("r_end"))
            .height
        )
        total = int((mine.get_column("end") - mine.get_column("ts")).sum())
        counts.append((inside, total, name))
    inside, _, name = min(counts, key=lambda item: (-item[0], -item[1], item[2]))
    if inside < 0.5 * launches.height:
        return None
    chosen = ranges.filter(pl.col("name") == name).sort("ts")
    return name, chosen.select(
        step=pl.int_range(pl.len(), dtype=pl.Int64), start=pl.col("ts"), end=pl.col("end")
    )


#: A host pattern is taken as requests only when it repeats at least this often.
_MIN_PATTERN_REQUESTS = 4
#: The shortest silence between two requests of a host pattern (ns): nothing recorded on the
#: launching thread and the GPU idle throughout.
_MIN_WAIT_NS = 1_000_000
#: Operators of training (backward, the optimizer): a loop doing them is not serving requests, and
#: a silence between its iterations is its own untraced work, not waiting.
_TRAINING_OPS = ("autograd::engine", "Backward", "Optimizer.")


def pattern_requests(trace: Trace) -> tuple[str, pl.DataFrame] | None:
    """Requests from the repeating pattern of the host's top-level work, for a trace with no step
    markers and no repeating ``record_function`` range → (the first operator of every request,
    frame ``step, start, end`` in start order); None unless the evidence is strong.

    On the thread that launched the most GPU work, the host's recorded activity (operators,
    runtime calls, annotations) is cut at every silence of at least :data:`_MIN_WAIT_NS` in which
    nothing is recorded on that thread and no GPU activity runs on any device. The pieces are the
    requests when there are at least :data:`_MIN_PATTERN_REQUESTS`, each launches GPU work, each
    begins with an operator of the same name (``tokenize``: the request's own first host work), and
    none holds training's operators (backward, the optimizer: a training loop's silences are its
    own untraced work). A silence is then the server waiting for the next request."""
    if trace.gpu.is_empty():
        return None
    launches = launch_calls(trace)
    if launches.is_empty():
        return None
    pid, tid = (
        launches.group_by("pid", "tid")
        .len()
        .sort("len", "pid", "tid", descending=[True, False, False])
        .row(0)[:2]
    )
    on_thread = (pl.col("pid") == pid) & (pl.col("tid") == tid)
    ops = (
        trace.cpu_ops.filter(on_thread)
        .select("name", "ts", "end")
        .sort("ts", pl.col("end"), descending=[False, True])
    )
    host = (
        pl.concat(
            [
                table.filter(on_thread).select("ts", "end")
                for table in (trace.cpu_ops, trace.runtime, trace.annotations)
            ]
        )
        .sort("ts")
        .with_columns(reach=pl.col("end").cum_max())
        .with_columns(silence=pl.col("ts") - pl.col("reach").shift(1))
    )
    cuts = host.filter(pl.col("silence") >= _MIN_WAIT_NS).select(
        start=pl.col("ts") - pl.col("silence"), end=pl.col("ts")
    )
    if cuts.height + 1 < _MIN_PATTERN_REQUESTS:
        return None
    # the GPU idle throughout each silence: no activity that started before its end reaches past its start
    gpu = trace.gpu.select("ts", "end").sort("ts").with_columns(reach=pl.col("end").cum_max())
    busy = cuts.sort("end").join_asof(
        gpu.select("ts", "reach"), left_on="end", right_on="ts", strategy="backward"
    )
    if busy.filter(pl.col("reach") > pl.col("start")).height:
        return None
    bounds = cuts.sort("start")
    starts = [host.item(0, "ts"), *bounds.get_column("end").to_list()]
    ends = [*bounds.get_column("start").to_list(), host.get_column("reach").max()]
    segments = pl.DataFrame(
        {"step": range(len(starts)), "start": starts, "end": ends},
        schema={"step": pl.Int64, "start": pl.Int64, "end": pl.Int64},
    )
    firsts = ops.join_asof(
        segments.select(s_start="start", s_step="step"), left_on="ts", right_on="s_start", strategy="backward"
    )
    first_names = firsts.group_by("s_step").agg(pl.col("name").first())
    names = set(first_names.get_column("name").to_list())
    if first_names.height != segments.height or len(names) != 1:
        return None
    launched = (
        launches.filter(on_thread)
        .sort("l_ts")
        .join_asof(segments.select("start", "step"), left_on="l_ts", right_on="start", strategy="backward")
        .get_column("step")
        .n_unique()
    )
    training = (
        trace.cpu_ops.filter(
            on_thread
            & pl.any_horizontal(pl.col("name").str.contains(name, literal=True) for name in _TRAINING_OPS)
        ).height
        + trace.annotations.filter(pl.col("name").str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX)).height
    )
    if launched != segments.height or training:
        return None
    return names.pop(), segments


def owned_work(trace: Trace, ranges: pl.DataFrame, launches: pl.DataFrame | None = None) -> pl.DataFrame:
    """GPU activities with the step whose host range launched them → ``step, device, ts, end``.

    ``ranges`` holds ``step, start, end`` (host ranges). An activity belongs to the range that holds
    the first runtime call of its correlation id; activities launched outside every range (or
    whose launch the trace does not hold) belong to none and are left out. ``launches`` is
    :func:`~traceinsight.analysis.shared.launch_calls` of the trace when the caller has it."""
    calls = (launch_calls(trace) if launches is None else launches).lazy().select("correlation", "l_ts")
    work = (
        trace.gpu.lazy()
        .select("correlation", "device", "ts", "end")
        .join(calls, on="correlation", how="inner")
        .select("l_ts", "device", "ts", "end")
        .sort("l_ts")
    )
    return (
        work.join_asof(
            ranges.lazy().select("step", w_start="start", w_end="end").sort("w_start"),
            left_on="l_ts",
            right_on="w_start",
            strategy="backward",
        )
        .filter(pl.col("l_ts") < pl.col("w_end"))
        .select("step", "device", "ts", "end")
        .collect(engine="in-memory")
    )


#: Per step: (GPU activities launched in it, start of the first, end of the last; None: none).
_Owned = dict[int, tuple[int, int | None, int | None]]


#: (step, device) → start of the first GPU activity the step launched on the device.
_FirstWork = dict[tuple[int, int], int]


def _gpu_ends(
    trace: Trace, source: str, windows: pl.DataFrame, launches: pl.DataFrame | None
) -> tuple[_Owned, _FirstWork]:
    """Per step: GPU activities launched in its host range, the first's start, the last's end; and
    per step and device, the first's start.

    See :func:`owned_work`; a ``ProfilerStep#N`` ``gpu_user_annotation`` on a GPU row (Kineto draws
    it over the work launched in the step) counts to step N's end too, but never past the start of
    work a later step launched on that device: the kineto of torch 2.11 drew one step's range over
    the work of the next three (an H200, 20 small kernels a step), which made those steps zero long."""
    work = owned_work(trace, windows, launches)
    owned = work.group_by("step").agg(
        count=pl.len(), gpu_start=pl.col("ts").min(), gpu_end=pl.col("end").max()
    )
    ends: _Owned = {step: (count, first, last) for step, count, first, last in owned.iter_rows()}
    firsts = work.group_by("device", "step").agg(first=pl.col("ts").min())
    first_work = {(step, device): first for device, step, first in firsts.iter_rows()}
    if source == "ProfilerStep" and trace.gpu_annotations.height:
        # Never past the device's last activity: float times put a range's end a ns beyond it.
        last = trace.gpu.group_by("device").agg(last=pl.col("end").max())
        # Per device and step: where the work of the steps after it starts (null: none after).
        later = (
            firsts.lazy()
            .sort("device", "step", descending=[False, True])
            .select("device", "step", later=pl.col("first").cum_min().shift(1).over("device"))
        )
        drawn = (
            trace.gpu_annotations.lazy()
            .select(
                "device",
                step=pl.col("name").str.extract(taxonomy.STEP_PATTERN.pattern, 1).cast(pl.Int64),
                end="end",
            )
            .join(last.lazy(), on="device", how="inner")
            .join(later, on=["device", "step"], how="left")
            .select("step", end=pl.min_horizontal("end", "last", "later"))
            .drop_nulls()
            .group_by("step")
            .agg(pl.col("end").max())
            .collect(engine="in-memory")
        )
        for step, end in drawn.iter_rows():
            count, first, gpu_end = ends.get(step, (0, None, None))
            ends[step] = (count, first, end if gpu_end is None else max(gpu_end, end))
    return ends, first_work


def _done_times(rows: list[dict[str, Any]], ends: _Owned, requests: bool = False) -> list[tuple[int, int]]:
    """(begin, done) of each step in start order (see the module doc); a request begins at the
    later of its start and the previous one's done (the time between is waiting for work)."""
    result: list[tuple[int, int]] = []
    previous: int | None = None
    for row in rows:
        gpu_end = ends.get(row["step"], (0, None, None))[2]
        done = row["end"] if gpu_end is None else max(row["end"], gpu_end)
        begin = row["start"] if previous is None else max(previous, row["start"]) if requests else previous
        done = max(done, begin)
        result.append((begin, done))
        previous = done
    return result


def _judge_steps(
    trace: Trace, source: str, windows: pl.DataFrame, limits: Thresholds, launches: pl.DataFrame | None
) -> tuple[tuple[StepRange, ...], _FirstWork]:
    rows = list(windows.sort("start", "step").iter_rows(named=True))
    ends, first_work = _gpu_ends(trace, source, windows, launches) if trace.has_gpu_activity else ({}, {})
    times = _done_times(rows, ends, requests=source == "request")
    length_of = {row["step"]: done - begin for row, (begin, done) in zip(rows, times, strict=True)}
    reasons: dict[int, str] = {}
    if trace.has_gpu_activity:
        for row in rows:
            if not ends.get(row["step"], (0, None, None))[0]:
                reasons[row["step"]] = "no GPU work was launched in it (cut short by the profiler)"
    kept = [row for row in rows if row["step"] not in reasons]
    excess = round(limits.outlier_min_excess_us * 1000)
    if len(kept) >= 2:
        first, rest = kept[0], kept[1:]
        durations = [length_of[row["step"]] for row in kept]
        others = median(durations[1:])
        length = durations[0]
        if others and length >= limits.startup_step_factor * others and length - others >= excess:
            reasons[first["step"]] = (
                f"start-up: the first step took {format_duration(length)}, "
                f"{length / others:.1f}× the median of the others"
            )
        middle = median(durations)
        for row in rest:
            length = length_of[row["step"]]
            if middle and length >= limits.outlier_step_factor * middle and length - middle >= excess:
                reasons[row["step"]] = (
                    f"outlier: it took {format_duration(length)}, {length / middle:.1f}× the median step"
                )
    if rows and len(reasons) == len(rows):
        reasons.clear()  # nothing would be left: judge the steps as they are
    steps = tuple(
        StepRange(
            row["step"],
            row["start"],
            row["end"],
            row["step"] not in reasons,
            reasons.get(row["step"]),
            begin=begin,
            done=done,
            gpu_end_ns=ends.get(row["step"], (0, None, None))[2],
            gpu_start_ns=ends.get(row["step"], (0, None, None))[1],
        )
        for row, (begin, done) in zip(rows, times, strict=True)
    )
    return steps, first_work


def _runs(
    steps: tuple[StepRange, ...], device: bool = False, apart: bool = False
) -> tuple[tuple[int, int], ...]:
    """Consecutive steady steps merged into windows (a non-steady step splits them): their host
    ranges, or with ``device`` their device windows (begin to done).

    The few µs between one ``ProfilerStep`` range and the next belong to the loop, so a window runs
    from its first step's start to its last step's end. With ``apart`` (requests) each step is a
    window of its own: the time between two requests is no request's.
    """
    windows: list[tuple[int, int]] = []
    previous_steady = False
    for step in sorted(steps, key=lambda item: item.start_ns):
        if not step.steady:
            previous_steady = False
            continue
        start, end = (step.begin_ns, step.done_ns) if device else (step.start_ns, step.end_ns)
        if previous_steady and not (apart and start > windows[-1][1]):
            windows[-1] = (windows[-1][0], max(windows[-1][1], end))
        else:
            windows.append((start, end))
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


def _not_waiting(trace: Trace, calls: pl.DataFrame) -> pl.DataFrame:
    """Operator calls (``pid, tid, ts, end, dur``) without those that spent half their time or more
    in a blocking call (a ``hipMemcpyWithStream`` waiting for GPU work queued before it, perhaps
    before the profiler started): a long wait for the GPU is not the operator's first-call set-up."""
    blocking = trace.runtime.filter(pl.col("name").is_in(list(taxonomy.BLOCKING_CALLS))).select(
        b_pid="pid", b_tid="tid", b_ts="ts", b_end="end"
    )
    if blocking.is_empty() or calls.is_empty():
        return calls
    indexed = calls.with_row_index("call")
    waited = (
        indexed.join_where(blocking, pl.col("b_ts") < pl.col("end"), pl.col("b_end") > pl.col("ts"))
        .filter((pl.col("b_pid") == pl.col("pid")) & (pl.col("b_tid") == pl.col("tid")))
        .group_by("call", "dur")
        .agg(ns=(pl.min_horizontal("end", "b_end") - pl.max_horizontal("ts", "b_ts")).sum())
        .filter(pl.col("ns") * 2 >= pl.col("dur"))
        .select("call")
    )
    return indexed.join(waited, on="call", how="anti").drop("call")


def _startup_without_steps(trace: Trace, limits: Thresholds) -> tuple[int | None, str | None]:
    """When the start-up of a trace without steps ended, and what showed it."""
    ends: list[tuple[int, str]] = []
    warmups = trace.annotations.filter(pl.col("name").str.contains(taxonomy.WARMUP_ANNOTATION_PATTERN))
    if warmups.height:
        row = warmups.sort("end", "ts", "name").row(-1, named=True)  # the last to end (ties: by start, name)
        ends.append((row["end"], f"a range named {row['name']!r} ends at that point"))
    min_ns = round(limits.first_call_min_us * 1000)
    ops = trace.cpu_ops.select("name", "pid", "tid", "ts", "end", "dur")
    stats = (
        ops.group_by("name").agg(calls=pl.len(), typical=pl.col("dur").median()).filter(pl.col("calls") >= 3)
    )
    slow = ops.join(stats, on="name", how="inner").with_columns(
        outlier=(pl.col("dur") >= pl.col("typical") * limits.first_call_factor) & (pl.col("dur") >= min_ns)
    )
    settled = slow.filter(~pl.col("outlier")).group_by("name").agg(settled=pl.col("ts").median())
    first_calls = (
        _not_waiting(trace, slow.filter(pl.col("outlier")))
        .join(settled, on="name", how="inner")
        .filter(pl.col("ts") < pl.col("settled"))
        .sort("end", "ts", "name")  # the last to end (ties: by start, then name; the joins keep no order)
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


def steady_state(
    trace: Trace, limits: Thresholds | None = None, launches: pl.DataFrame | None = None
) -> SteadySteps:
    """Steps, which of them are steady, and the steady-state windows (see the module doc).
    ``launches`` is :func:`~traceinsight.analysis.shared.launch_calls` when the caller has it."""
    limits = limits or Thresholds()
    source, windows = step_windows(trace, requests=False)
    request = request_ranges(trace) if source == "none" else None
    pattern = request is None and source == "none"
    if pattern:
        request = pattern_requests(trace)
    if request is not None:
        source, windows = "request", request[1]
    if source != "none":
        steps, first_work = _judge_steps(trace, source, windows, limits, launches)
        requests = source == "request"
        return SteadySteps(
            source=source,
            steps=steps,
            windows=_runs(steps, apart=requests),
            gpu_windows=_runs(steps, device=True, apart=requests),
            first_work=first_work,
            request_name=request[0] if request is not None else None,
            request_from_pattern=pattern and request is not None,
        )
    extent = _trace_extent(trace)
    if extent is None:
        return SteadySteps(source="none", steps=(), windows=())
    startup_end, evidence = _startup_without_steps(trace, limits)
    start, end = extent
    if startup_end is not None and start < startup_end < end:
        return SteadySteps("none", (), ((startup_end, end),), startup_end, evidence)
    return SteadySteps("none", (), ((start, end),))


def iteration_count(trace: Trace) -> int | None:
    """Training iterations: ProfilerStep spans, else ``Optimizer.step#`` ranges, else unknown."""
    source, windows = step_windows(trace)
    if source == "ProfilerStep":
        return windows.height
    optimizer_steps = trace.annotations.filter(
        pl.col("name").str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX)
    ).height
    return optimizer_steps or None
