"""The step replay: what a fix would give back, as a change in step time.

A finding's saving is not the idle time next to it (a sync in a host-bound loop is followed by
idle that removing the sync would not give back). It is the difference between two replays of the
steady-state steps, one as recorded and one with the fix applied, in one model:

- **Host.** The launching threads' own time is kept as recorded: Python, operators, launch calls.
  Only what a fix removes changes: a blocking call that no longer waits takes no time (a copy call
  that waited inside itself, into pageable memory, takes what queueing a copy takes: the median
  kernel launch call, at most its recorded time); a shortened range (a DataLoader ``__next__``, a
  pageable copy call, an unfused ``optimizer.step()``) takes its new length, the launches inside it
  spread over that length in proportion. Everything the host
  does after such a point happens that much earlier: it runs ahead.
- **GPU.** Each kernel, copy and memset runs for its own recorded duration, in launch order on its
  stream. Work the host launched late ends at the later of (its launch + launch latency + its
  duration) and (the stream's busy frontier + its duration). Work that was already queued keeps
  where it ended relative to the frontier as recorded: a gap the GPU left on its own (another
  stream, an event, a CUDA graph held it) stays, and work that overlapped (a graph's branches on one
  stream) still overlaps. The launch latency is the one recorded where the GPU was waiting for the
  work, else the typical one.
- **Blocking calls that stay** wait until the GPU activities launched before them have ended in the
  replay, on every stream the call waited for as recorded (a stream still busy when the call
  returned was not waited for: ``cudaStreamSynchronize`` of a copy stream leaves the compute stream
  running), then return with the overhead they had after the GPU finished.
- **The launch queue.** The host can be at most ``LAUNCH_QUEUE`` launches ahead of the GPU: a launch
  waits until the work that many launches before it has started.
- **Step time** of a window of steps = the later of the host's end of the window and the end of
  the GPU work launched in it, from the window's start on the GPU's clock: when the step before the
  window was done (:mod:`.steady`), so that a window's recorded time is the steady steps' step times
  summed, and a saving per step is over the same steps as the step time. A trace without steps is
  measured as its report measures it, on the GPU: from the later of the window's start and the GPU's
  first work to the end of the GPU's last work. The host's time after that (the teardown: freeing
  memory, the final synchronize) is no part of it, so a fix that only shortens it saves nothing. A
  saving is the baseline replay minus the fixed replay; it is never more than the baseline.

The walk over a window's host points runs in C when the package was built with a compiler
(:mod:`._replay`): a window of 10^5 launches has thousands of host points, each a short batch of
work per stream, and the rules replay it once per fix. Without it, :func:`_walk` does the same in
Python (a loop for short batches, numpy for long ones), with the same ends and starts.

Cross-stream dependencies are not modelled beyond the gaps kept above. The GPU work itself is
unchanged unless the fix says so: kernels ``faster`` by a factor, or copies given a new duration
(``durations``: a pageable copy at pinned speed).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import polars as pl

from traceinsight.analysis.shared import launch_calls, launch_cost_ns
from traceinsight.analysis.steady import SteadySteps
from traceinsight.arrays import distinct, member
from traceinsight.load import Trace
from traceinsight.model import Model, field

try:
    from traceinsight.analysis import _replay  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler
    _replay = None

__all__ = ["LAUNCH_QUEUE", "Fix", "Replay", "prepare_replay"]

#: Launches the host may be ahead of the GPU (CUDA's pending-launch queue holds about 1024).
LAUNCH_QUEUE = 1024
#: A stream's frontier before any work (far in the past, safe to add durations to).
_NEVER = np.iinfo(np.int64).min // 4
#: Batches of at most this many activities on a stream are replayed in a loop, longer ones with
#: :func:`_scan` (the same ends: one recurrence, two ways of computing it).
_SHORT_BATCH = 16
#: Launch latency assumed when no launch was waited for (ns).
_DEFAULT_LATENCY_NS = 10_000


class Fix(Model, frozen=True):
    """A change to replay: calls that stop waiting, host ranges that get shorter, copies moved off
    the compute stream."""

    #: Blocking calls (keys of ``blocking_calls``) that no longer wait: they take no time.
    remove_calls: frozenset[int] = frozenset()
    #: Host ranges ``(start, end, new length)`` in ns, e.g. a DataLoader wait handed over at once.
    shorten: tuple[tuple[int, int, int], ...] = ()
    #: Correlations of copies that move to a stream of their own (prefetched under compute).
    side_stream: frozenset[int] = frozenset()
    #: Correlations of GPU work that runs ``speedup`` times faster (tensor cores: AMP, TF32).
    faster: frozenset[int] = frozenset()
    speedup: float = 1.0
    #: ``(correlation, new duration ns)`` of GPU work that takes a new time (a pageable copy at the
    #: speed of a pinned one).
    durations: tuple[tuple[int, int], ...] = ()

    @property
    def empty(self) -> bool:
        """True when the fix changes nothing."""
        return not (
            self.remove_calls
            or self.shorten
            or self.side_stream
            or self.durations
            or (self.faster and self.speedup != 1)
        )


class _Window(Model, frozen=True, eq=False):
    """One steady-state window's events, as arrays in launch order (times relative to ``start``)."""

    start: int
    end: int
    #: GPU work launched in the window.
    launch: np.ndarray
    latency: np.ndarray
    duration: np.ndarray
    #: How far each activity moves its stream's busy frontier when it follows it (see ``_scan``).
    advance: np.ndarray
    stream: np.ndarray
    correlation: np.ndarray
    #: Per stream: when work launched before the window keeps it busy until (relative ns).
    carry: dict[int, int]
    #: Blocking calls on launching threads: key, start, end, overhead after the GPU finished.
    call_key: np.ndarray
    call_start: np.ndarray
    call_end: np.ndarray
    call_overhead: np.ndarray
    #: Per call: the streams it did not wait for (still busy when it returned, as recorded).
    call_skipped: tuple[frozenset[int], ...]
    #: None for a window of steps (its time ends with the later of the host and the GPU); for a
    #: trace without steps, where its time on the GPU begins (relative ns): the window's start, or
    #: the GPU's first work when that comes later. Its time then ends with the GPU's last work.
    gpu_from: int | None = None
    #: Per call: what it takes when a fix removes its wait (a copy call still queues its copy).
    call_floor: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    #: Where the window's time begins on the GPU's clock, relative to ``start``: when the step
    #: before it was done (its first step's device window begins there; may be negative).
    begin: int = 0


class Replay(Model, frozen=True, eq=False):
    """The steady-state windows, ready to replay with or without a fix."""

    windows: tuple[_Window, ...] = ()
    #: Steady steps the windows hold (1 for a trace without steps).
    steps: int = 1
    #: Recorded time of the windows: the later of the host's and the GPU's end, summed (ns).
    recorded_ns: int = 0
    _cache: dict[Fix, int] = field(default_factory=dict)

    @property
    def available(self) -> bool:
        """True when there is GPU work to replay."""
        return any(window.launch.size for window in self.windows)

    def step_time_ns(self, fix: Fix | None = None) -> int:
        """Replayed time of all windows (ns), with ``fix`` applied."""
        fix = fix or Fix()
        cached = self._cache.get(fix)
        if cached is None:
            cached = sum(_simulate(window, fix) for window in self.windows)
            self._cache[fix] = cached
        return cached

    def saving_ns(self, fix: Fix) -> int:
        """What ``fix`` gives back over the windows (ns, never negative)."""
        if fix.empty or not self.available:
            return 0
        return max(0, self.step_time_ns() - self.step_time_ns(fix))

    def gpu_ns(self, correlations: frozenset[int]) -> int:
        """The recorded GPU time of the work with these correlations, in the windows (ns)."""
        if not correlations:
            return 0
        wanted = np.fromiter(correlations, dtype=np.int64)
        return sum(int(window.duration[member(window.correlation, wanted)].sum()) for window in self.windows)

    def saving_per_step_ns(self, fix: Fix) -> int:
        """What ``fix`` gives back per steady step (ns)."""
        return round(self.saving_ns(fix) / max(self.steps, 1))


def _scan(
    queued_at: np.ndarray, duration: np.ndarray, advance: np.ndarray, carry: int
) -> tuple[np.ndarray, int]:
    """Ends of one stream's work in launch order, and the stream's busy frontier after it.

    ``end_i = max(q_i + d_i, F_{i-1} + a_i)`` and ``F_i = max(F_{i-1}, end_i)``, with ``F`` the
    frontier (``carry`` before the first) and ``a_i`` how far the activity ended past the frontier as
    recorded (its duration where the host launched it late). Since ``F_i = max(F_{i-1} + max(a_i, 0),
    q_i + d_i)`` is a max-plus recurrence, a cumulative maximum solves it: with ``A_i`` the prefix
    sum of ``max(a, 0)``, ``F_i = A_i + max(carry, max_{j<=i}(q_j + d_j - A_j))``.
    """
    prefix = np.cumsum(np.maximum(advance, 0))
    frontier = prefix + np.maximum(np.maximum.accumulate(queued_at + duration - prefix), carry)
    before = np.concatenate(([carry], frontier[:-1]))
    return np.maximum(queued_at + duration, before + advance), int(frontier[-1])


def _simulate(window: _Window, fix: Fix) -> int:
    """Replayed length of one window with ``fix`` applied (see the module doc)."""
    streams = window.stream.copy()
    advance = window.advance
    duration = window.duration
    if fix.faster and fix.speedup != 1:
        quicker = member(window.correlation, np.fromiter(fix.faster, dtype=np.int64))
        shortened = np.where(quicker, np.round(duration / fix.speedup).astype(np.int64), duration)
        advance = advance - (duration - shortened)  # it ends that much earlier after the frontier
        duration = shortened
    if fix.durations:
        retimed = _retimed(window.correlation, duration, dict(fix.durations))
        advance = advance - (duration - retimed)
        duration = retimed
    if fix.side_stream:
        moved = member(window.correlation, np.fromiter(fix.side_stream, dtype=np.int64))
        streams[moved] = -1 - streams[moved]  # a copy stream beside each stream
        advance = np.where(moved, duration, advance)
    stream_end: dict[int, int] = dict(window.carry)
    count = window.launch.size
    starts = np.zeros(count, dtype=np.int64)
    ends = np.zeros(count, dtype=np.int64)
    kept = _kept_ranges(window, fix)
    anchors = [*_anchors(window, kept), (window.end - window.start, "end", 0, 0, 0)]
    launch = _compressed(window.launch, kept)
    queued = launch + window.latency
    # Where each anchor's batch of launches ends: the launches before its point (all at the end).
    points = np.fromiter((anchor[0] for anchor in anchors[:-1]), dtype=np.int64, count=len(anchors) - 1)
    uptos = [*np.searchsorted(window.launch, points, side="left").tolist(), count]
    # Each stream's work in launch order, and how much of it each batch ends with.
    lanes = []
    for stream in distinct(streams).tolist():
        mine = np.flatnonzero(streams == stream)
        lanes.append((stream, mine, np.searchsorted(mine, uptos)))
    work = _Work(queued, duration, advance, launch, starts, ends)
    skipped = dict(zip(window.call_key.tolist(), window.call_skipped, strict=True))
    floors = dict(zip(window.call_key.tolist(), window.call_floor.tolist(), strict=False))
    native = _replay is not None and all(
        column.dtype == np.int64 for column in (queued, duration, advance, launch)
    )  # the C walk reads int64 only
    walk = _walk_native if native else _walk
    shift = walk(anchors, uptos, lanes, work, stream_end, fix, skipped, floors)
    if window.gpu_from is not None:
        first = int(starts.min()) if count else None
        return _gpu_time(window.gpu_from, window.carry, int(ends.max()) if count else None, first)
    host_end = window.end - window.start + shift
    return max(host_end, int(ends.max()) if count else 0, window.begin) - window.begin


#: The C walk's code of each kind of host point (the window's end: 2).
_KIND_CODES = {"call": 0, "shorten": 1}
#: A stream's work for the walk: its stream, its rows in launch order, and how many of them come
#: before each host point's batch ends.
_Lane = tuple[int, np.ndarray, np.ndarray]


class _Work(Model, frozen=True, eq=False):
    """A window's GPU work as replayed, per row in launch order (int64 arrays)."""

    #: When it is queued (its launch, moved by the fix, plus the launch latency), its duration and
    #: how far it moves its stream's frontier (see ``_scan``), and its launch.
    queued: np.ndarray
    duration: np.ndarray
    advance: np.ndarray
    launch: np.ndarray
    #: Filled by the walk: when it starts and ends in the replay.
    starts: np.ndarray
    ends: np.ndarray


def _walk(
    anchors: list[_Anchor],
    uptos: list[int],
    lanes: list[_Lane],
    work: _Work,
    stream_end: dict[int, int],
    fix: Fix,
    skipped: dict[int, frozenset[int]],
    floors: dict[int, int],
) -> int:
    """Replay the work between the host points (``anchors``, the window's end last), filling
    ``work.starts`` and ``work.ends`` and moving ``stream_end``; returns the host's shift at the end."""
    launch, starts, ends = work.launch, work.starts, work.ends
    streams = [
        (stream, mine, work.queued[mine], work.duration[mine], work.advance[mine], cuts.tolist())
        for stream, mine, cuts in lanes
    ]
    done_to = [0] * len(lanes)  # how much of each stream's work has been replayed
    shift = 0
    processed = 0
    for number, (point, kind, value, extra, recorded_end) in enumerate(anchors):
        upto = uptos[number]
        if upto > processed:
            for lane, (stream, mine, queued_at, length, ahead, cuts) in enumerate(streams):
                low, high = done_to[lane], cuts[number]
                if high == low:
                    continue
                frontier = stream_end.get(stream, _NEVER)
                if high - low <= _SHORT_BATCH:  # numpy's cost per call is more than a loop's here
                    for at in range(low, high):
                        end = max(queued_at.item(at) + shift + length.item(at), frontier + ahead.item(at))
                        ends[mine[at]] = end
                        starts[mine[at]] = end - length.item(at)
                        frontier = max(frontier, end)
                else:
                    result, frontier = _scan(
                        queued_at[low:high] + shift, length[low:high], ahead[low:high], frontier
                    )
                    ends[mine[low:high]] = result
                    starts[mine[low:high]] = result - length[low:high]
                stream_end[stream] = frontier
                done_to[lane] = high
            # The launch queue: launch i cannot return before work i - LAUNCH_QUEUE has started.
            first_held = max(processed, LAUNCH_QUEUE)
            if upto - first_held > _SHORT_BATCH:
                late_by = starts[first_held - LAUNCH_QUEUE : upto - LAUNCH_QUEUE] - (
                    launch[first_held:upto] + shift
                )
                shift += max(0, int(late_by.max()))
            elif upto > first_held:
                late = max(starts.item(at - LAUNCH_QUEUE) - launch.item(at) for at in range(first_held, upto))
                shift += max(0, late - shift)
            processed = upto
        if kind == "call":
            call_start = point + shift
            # A call the fix removes returns at once; one that stays waits for the GPU to finish.
            if value in fix.remove_calls:
                returned = call_start + floors.get(value, 0)
            else:
                ignore = skipped[value]
                done = max((end for stream, end in stream_end.items() if stream not in ignore), default=0)
                returned = max(call_start, done) + extra
            shift = returned - recorded_end
        elif kind == "shorten":
            shift -= value
    return shift


def _walk_native(
    anchors: list[_Anchor],
    uptos: list[int],
    lanes: list[_Lane],
    work: _Work,
    stream_end: dict[int, int],
    fix: Fix,
    skipped: dict[int, frozenset[int]],
    floors: dict[int, int],
) -> int:
    """:func:`_walk` in C (:mod:`._replay`): the same ends, starts and shift."""
    slots = list(stream_end)
    slots += [stream for stream, _, _ in lanes if stream not in stream_end]
    slot_of = {stream: slot for slot, stream in enumerate(slots)}
    frontier = np.array([stream_end.get(stream, _NEVER) for stream in slots], dtype=np.int64)
    present = np.array([stream in stream_end for stream in slots], dtype=np.uint8)
    sizes = [mine.size for _, mine, _ in lanes]
    order = np.concatenate([mine for _, mine, _ in lanes]) if lanes else np.zeros(0, dtype=np.int64)
    lane_start = np.concatenate(([0], np.cumsum(sizes, dtype=np.int64))).astype(np.int64)
    lane_slot = np.array([slot_of[stream] for stream, _, _ in lanes], dtype=np.int64)
    cuts = (
        np.concatenate([cut for _, _, cut in lanes]).astype(np.int64)
        if lanes
        else np.zeros(0, dtype=np.int64)
    )
    # Per host point: its kind, the time a range removes, whether the fix removes a call's wait
    # and what such a call takes, and the slots a call that stays did not wait for (one row of
    # flags per set of streams: calls share a few).
    point, names, keys, extra, recorded_end = zip(*anchors, strict=True)
    kind, value, removed, floor, flags = [], [], [], [], []
    no_wait = bytes(len(slots))
    rows: dict[frozenset[int], bytes] = {}
    for name, key in zip(names, keys, strict=True):
        kind.append(_KIND_CODES.get(name, 2))
        value.append(key if name == "shorten" else 0)
        gone = name == "call" and key in fix.remove_calls
        removed.append(gone)
        floor.append(floors.get(key, 0) if gone else 0)
        if name == "call" and not gone:
            ignore = skipped[key]
            row = rows.get(ignore)
            if row is None:
                row = rows[ignore] = bytes(stream in ignore for stream in slots)
            flags.append(row)
        else:
            flags.append(no_wait)
    int64 = np.int64
    shift: int = _replay.walk(
        order, lane_start, lane_slot, work.queued, work.duration, work.advance, work.launch,
        np.asarray(uptos, dtype=int64), cuts, np.array(point, dtype=int64), np.array(kind, dtype=int64),
        np.array(value, dtype=int64), np.array(extra, dtype=int64), np.array(recorded_end, dtype=int64),
        np.array(removed, dtype=int64), np.array(floor, dtype=int64),
        np.frombuffer(b"".join(flags), dtype=np.uint8), frontier, present, work.starts, work.ends, LAUNCH_QUEUE,
    )  # fmt: skip
    stream_end.update((stream, int(frontier[slot])) for slot, stream in enumerate(slots) if present[slot])
    return shift


def _retimed(correlation: np.ndarray, duration: np.ndarray, new_duration: dict[int, int]) -> np.ndarray:
    """``duration`` with the work whose correlation ``new_duration`` names taking its new time."""
    keys = np.fromiter(new_duration, dtype=np.int64, count=len(new_duration))
    order = np.argsort(keys)
    keys = keys[order]
    values = np.fromiter(new_duration.values(), dtype=np.int64, count=len(new_duration))[order]
    at = np.minimum(np.searchsorted(keys, correlation), keys.size - 1)
    return np.where(keys[at] == correlation, values[at], duration)


def _covering(kept: list[tuple[int, int, int]], times: np.ndarray) -> np.ndarray:
    """For each time, the index of the kept range holding it (``start <= time < end``), else -1.
    The ranges are in time order and do not overlap, so only the last one starting at or before a
    time can hold it."""
    if not kept:
        return np.full(times.size, -1, dtype=np.int64)
    bounds = np.asarray(kept, dtype=np.int64)
    at = np.searchsorted(bounds[:, 0], times, side="right") - 1
    inside = (at >= 0) & (times < bounds[np.maximum(at, 0), 1])
    return np.where(inside, at, -1)


def _gpu_time(gpu_from: int, carry: dict[int, int], last_end: int | None, first_start: int | None) -> int:
    """A window without steps on the GPU: from ``gpu_from`` (or its first work, when a fix moved
    that earlier) to the end of its last work, work carried in from before the window included."""
    ends = [end for end in (last_end, *carry.values()) if end is not None]
    if not ends:
        return 0
    begin = gpu_from if first_start is None else min(gpu_from, first_start)
    return max(0, max(ends) - begin)


#: A host point of the replay: (time, kind, key or time removed, overhead, recorded end).
_Anchor = tuple[int, str, int, int, int]


def _kept_ranges(window: _Window, fix: Fix) -> list[tuple[int, int, int]]:
    """The fix's shortened ranges starting in ``window`` (relative start, end, new length), in time
    order, without those nested in an earlier one."""
    ranges = sorted(
        (start - window.start, end - window.start, min(length, end - start))
        for start, end, length in fix.shorten
        if window.start <= start < window.end
    )
    kept: list[tuple[int, int, int]] = []
    for start, end, length in ranges:
        if kept and start < kept[-1][1]:
            continue  # nested in the previous range
        kept.append((start, end, max(0, length)))
    return kept


def _compressed(launch: np.ndarray, kept: list[tuple[int, int, int]]) -> np.ndarray:
    """Launch times with each shortened range's launches spread over its new length in proportion.

    The ``shorten`` anchor at a range's start moves everything after it earlier by the time
    removed; a launch at ``start + x`` inside the range then lands at ``start + x * length /
    (end - start)`` (a copy call's own launch, at its start, stays at its start), not before it."""
    at = _covering(kept, launch)
    inside = at >= 0
    if not inside.any():
        return launch
    start, end, length = np.asarray(kept, dtype=np.int64)[at[inside]].T
    adjusted = launch.copy()
    removed = end - start - length
    adjusted[inside] += np.round(removed * (1 - (launch[inside] - start) / (end - start))).astype(np.int64)
    return adjusted


def _anchors(window: _Window, kept: list[tuple[int, int, int]]) -> list[_Anchor]:
    """Host points in time order: blocking calls (``call``: key, overhead after the GPU finished,
    recorded end) and shortened ranges (``shorten``: the time removed). Calls inside a shortened
    range go with it."""
    shortened: list[_Anchor] = [(start, "shorten", end - start - length, 0, 0) for start, end, length in kept]
    outside = _covering(kept, window.call_start) < 0
    calls: list[_Anchor] = [
        (start, "call", key, overhead, end)
        for key, start, end, overhead in zip(
            window.call_key[outside].tolist(),
            window.call_start[outside].tolist(),
            window.call_end[outside].tolist(),
            window.call_overhead[outside].tolist(),
            strict=True,
        )
    ]
    return sorted(shortened + calls, key=lambda anchor: (anchor[0], anchor[1]))


def prepare_replay(
    trace: Trace,
    calls: pl.DataFrame,
    steady: SteadySteps,
    launches: pl.DataFrame | None = None,
    launch_cost: int | None = None,
) -> Replay:
    """Collect the steady-state windows' GPU work and blocking calls into arrays for replaying
    (``launches``: :func:`~traceinsight.analysis.shared.launch_calls`, when the caller has it)."""
    if not steady.windows or trace.gpu.is_empty():
        return Replay(steps=max(len(steady.steady_steps), 1))
    launches = launch_calls(trace) if launches is None else launches
    work = (
        trace.gpu.lazy()
        .select("device", "stream", "ts", "dur", "end", "correlation")
        .filter(pl.col("device").is_not_null())
        .join(launches.lazy(), on="correlation", how="left")
        .with_columns(pl.col("stream").fill_null(-1))
        .sort("device", "stream", "ts", "end")
        .with_columns(prev_end=pl.col("end").cum_max().shift(1).over("device", "stream"))
        .with_columns(
            fixed=pl.col("l_ts").is_null(),
            queued=(pl.col("l_end") <= pl.col("prev_end")).fill_null(False),
            observed_latency=(pl.col("ts") - pl.col("l_ts")).clip(lower_bound=0),
        )
        .collect(engine="in-memory")
    )
    launch_cost = launch_cost_ns(trace) if launch_cost is None else launch_cost
    typical = work.filter(~pl.col("queued") & ~pl.col("fixed")).get_column("observed_latency").median()
    latency_ns = int(typical) if isinstance(typical, (int, float)) else _DEFAULT_LATENCY_NS
    work = work.with_columns(
        launch=pl.coalesce("l_ts", "ts"),
        latency=pl.when(pl.col("fixed"))
        .then(0)
        .when(pl.col("queued"))
        .then(pl.min_horizontal("observed_latency", pl.lit(latency_ns)))
        .otherwise(pl.col("observed_latency")),
        advance=pl.when(pl.col("queued") & pl.col("prev_end").is_not_null())
        .then(pl.col("end") - pl.col("prev_end"))
        .otherwise(pl.col("dur")),
        # ``work`` is sorted by device and stream: a stream's dense rank counts the changes.
        stream_id=(
            (pl.col("device") != pl.col("device").shift(1)) | (pl.col("stream") != pl.col("stream").shift(1))
        )
        .fill_null(True)
        .cum_sum()
        .cast(pl.Int64),
    ).select("launch", "latency", "dur", "advance", "stream_id", "correlation", "ts", "end", "pid", "tid")
    launching = work.drop_nulls("pid").select("pid", "tid").unique()
    first = work.get_column("ts").min()
    # Without steps the window is measured on the GPU, from its first work (see the module doc).
    first_work = int(first) if steady.source == "none" and isinstance(first, int) else None
    windows = []
    for (start, end), (begin, _) in zip(steady.windows, steady.device_windows, strict=True):
        # Only the columns the window's arrays and its recorded waits read: a filter and a sort
        # each copy every column they keep. A graph replay's kernels tie on launch and
        # correlation: a stable sort keeps them in the work's order (device, stream, start).
        mine = (
            work.lazy()
            .select("launch", "latency", "dur", "advance", "stream_id", "correlation", "end")
            .filter((pl.col("launch") >= start) & (pl.col("launch") < end))
            .sort("launch", "correlation", maintain_order=True)
            .collect(engine="in-memory")
        )
        before = (
            work.lazy()
            .filter((pl.col("launch") < start) & (pl.col("end") > start))
            .group_by("stream_id")
            .agg(pl.col("end").max())
            .collect(engine="in-memory")
        )
        carry = {int(stream): int(last) - start for stream, last in before.iter_rows()}
        window_calls = (
            calls.lazy()
            .filter((pl.col("ts") >= start) & (pl.col("ts") < end))
            .join(launching.lazy(), on=["pid", "tid"], how="semi")
            .sort("ts")
            .collect(engine="in-memory")
        )
        overheads, skipped = _recorded_waits(mine, carry, window_calls, start)
        windows.append(
            _Window(
                start=start,
                end=end,
                begin=begin - start,
                launch=mine.get_column("launch").to_numpy() - start,
                latency=mine.get_column("latency").to_numpy(),
                duration=mine.get_column("dur").to_numpy(),
                advance=mine.get_column("advance").to_numpy(),
                stream=mine.get_column("stream_id").to_numpy(),
                correlation=mine.get_column("correlation").fill_null(-1).to_numpy(),
                carry=carry,
                call_key=window_calls.get_column("key").to_numpy(),
                call_start=window_calls.get_column("ts").to_numpy() - start,
                call_end=window_calls.get_column("end").to_numpy() - start,
                call_overhead=np.asarray(overheads, dtype=np.int64),
                call_skipped=skipped,
                gpu_from=None if first_work is None else max(0, first_work - start),
                call_floor=window_calls.select(
                    pl.when(pl.col("kind") == "copy")
                    .then(pl.col("dur").clip(upper_bound=launch_cost))
                    .otherwise(0)
                )
                .to_series()
                .to_numpy(),
            )
        )
    recorded = sum(_recorded_time(window, _recorded_ends(work, window)) for window in windows)
    return Replay(windows=tuple(windows), steps=max(len(steady.steady_steps), 1), recorded_ns=recorded)


def _recorded_time(window: _Window, ends: np.ndarray) -> int:
    """A window's recorded time, measured as the replay measures it (see the module doc)."""
    if window.gpu_from is not None:
        return _gpu_time(window.gpu_from, window.carry, int(ends.max()) if ends.size else None, None)
    return max(window.end - window.start, int(ends.size and ends.max()), window.begin) - window.begin


def _recorded_waits(
    work: pl.DataFrame, carry: dict[int, int], calls: pl.DataFrame, start: int
) -> tuple[list[int], tuple[frozenset[int], ...]]:
    """For each blocking call, as recorded: the streams it did not wait for, and its overhead after
    the GPU work it waited for had ended.

    A stream's frontier at the call is the end of the work launched on it before the call (or of
    work from before the window); a stream whose frontier is past the call's return was not waited
    for. The overhead is the call's return minus the later of its start and the frontier of the
    streams it waited for.
    """
    frontiers: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    # Three columns grouped, not the window's all: each group is a copy of the columns it holds.
    for (stream,), group in work.select("stream_id", "launch", "end").group_by(["stream_id"]):
        ordered = group.sort("launch")
        frontiers[int(stream)] = (
            ordered.get_column("launch").to_numpy() - start,
            np.maximum.accumulate(ordered.get_column("end").to_numpy() - start),
        )
    streams = sorted(set(frontiers) | set(carry))
    call_ts = calls.get_column("ts").to_numpy() - start
    call_end = calls.get_column("end").to_numpy() - start
    # Per stream (rows) and call (columns): the stream's frontier at the call, where it has one.
    at_call = np.zeros((len(streams), call_ts.size), dtype=np.int64)
    known = np.zeros((len(streams), call_ts.size), dtype=bool)
    for row, stream in enumerate(streams):
        before = carry.get(stream)
        if stream in frontiers:
            launches, running = frontiers[stream]
            upto = np.searchsorted(launches, call_ts, side="left")
            reached = running[np.maximum(upto - 1, 0)]
            if before is None:
                at_call[row], known[row] = reached, upto > 0
            else:
                at_call[row], known[row] = np.where(upto > 0, np.maximum(reached, before), before), True
        elif before is not None:
            at_call[row], known[row] = before, True
    ignored = known & (at_call > call_end)
    waited_for = known & ~ignored
    lowest = np.iinfo(np.int64).min
    waited = np.where(
        waited_for.any(axis=0), np.where(waited_for, at_call, lowest).max(axis=0, initial=lowest), call_ts
    )
    overheads = np.minimum(np.maximum(0, call_end - np.maximum(call_ts, waited)), call_end - call_ts)
    skipped: list[frozenset[int]] = [frozenset()] * call_ts.size
    sets: dict[tuple[int, ...], frozenset[int]] = {}
    for call in np.flatnonzero(ignored.any(axis=0)).tolist():
        rows = tuple(np.flatnonzero(ignored[:, call]).tolist())
        skipped[call] = sets.setdefault(rows, frozenset(streams[row] for row in rows))
    return overheads.tolist(), tuple(skipped)


def _recorded_ends(work: pl.DataFrame, window: _Window) -> np.ndarray:
    """Recorded end times (relative to the window) of the work launched in ``window``."""
    mine = work.select("launch", "end").filter(
        (pl.col("launch") >= window.start) & (pl.col("launch") < window.end)
    )
    return mine.get_column("end").to_numpy() - window.start


def union(fixes: Iterable[Fix]) -> Fix:
    """One fix doing everything the given fixes do."""
    remove: set[int] = set()
    shorten: list[tuple[int, int, int]] = []
    side: set[int] = set()
    faster: set[int] = set()
    speedup = 1.0
    durations: dict[int, int] = {}
    for fix in fixes:
        remove |= fix.remove_calls
        shorten.extend(fix.shorten)
        side |= fix.side_stream
        faster |= fix.faster
        speedup = max(speedup, fix.speedup)
        for correlation, duration in fix.durations:
            durations[correlation] = min(duration, durations.get(correlation, duration))
    return Fix(
        frozenset(remove),
        tuple(sorted(set(shorten))),
        frozenset(side),
        frozenset(faster),
        speedup,
        tuple(sorted(durations.items())),
    )
