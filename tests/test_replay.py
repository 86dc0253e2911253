"""The step replay: it reproduces what was recorded, and a fix saves what the timeline says it must."""

from __future__ import annotations

import os
import random
from pathlib import Path

import numpy as np
import pytest
from loops import Loop, item_loop
from tracebuild import SAMPLES, kernel, read_events, runtime, sample_report, write_trace

import traceinsight.analysis.replay as replay_module
from traceinsight.analysis import Analysis, analyze
from traceinsight.analysis.replay import LAUNCH_QUEUE, Fix, _compressed, _scan, _simulate, _Window
from traceinsight.analysis.shared import launch_calls
from traceinsight.load import load_trace
from traceinsight.rules import evaluate

GPU_CATS = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}
RUNTIME_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}


def analysis_of(tmp_path: Path, events: list[dict[str, object]]) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events)))


def test_first_launch_calls_are_the_first_call_of_each_launched_correlation(tmp_path: Path) -> None:
    """Per correlation id some GPU activity carries, the first runtime call in file order; calls
    whose id no activity carries are left out (300 calls on 120 ids, seeded)."""
    rng = random.Random(5)
    calls = [
        runtime("cudaLaunchKernel", 1000 + i * 10, 3, correlation=rng.randrange(120)) for i in range(300)
    ]
    launched = set(rng.sample(range(140), 70))  # some ids only on the GPU, some only on the host
    kernels = [
        kernel(5000 + c * 10, 4, correlation=c) for c in sorted(launched) for _ in range(rng.randrange(1, 3))
    ]
    events = calls + kernels
    rng.shuffle(events)
    expected: dict[int, int] = {}
    for event in events:
        correlation = event["args"]["correlation"]
        if event["cat"] == "cuda_runtime" and correlation in launched:
            expected.setdefault(correlation, round(event["ts"] * 1000))
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    got = launch_calls(trace)
    assert dict(zip(got.get_column("correlation"), got.get_column("l_ts"), strict=True)) == expected
    assert got.height == len(expected) > 30


# --- the recurrence ---------------------------------------------------------------------------


def _scan_by_loop(
    queued: list[int], duration: list[int], advance: list[int], carry: int
) -> tuple[list[int], int]:
    """The recurrence of :func:`_scan`, one activity at a time."""
    frontier = carry
    ends = []
    for q, d, a in zip(queued, duration, advance, strict=True):
        end = max(q + d, frontier + a)
        ends.append(end)
        frontier = max(frontier, end)
    return ends, frontier


@pytest.mark.parametrize("seed", range(20))
def test_scan_equals_the_plain_recurrence(seed: int) -> None:
    rng = random.Random(seed)
    n = rng.randint(1, 60)
    queued = sorted(rng.randint(0, 10_000) for _ in range(n))
    duration = [rng.randint(1, 500) for _ in range(n)]
    # advances: a duration (late work), more (a kept gap), less (overlap) or negative (nested)
    advance = [d + rng.choice([0, 0, rng.randint(1, 300), -rng.randint(1, 600)]) for d in duration]
    carry = rng.choice([-(10**15), rng.randint(0, 2_000)])
    ends, frontier = _scan(np.array(queued), np.array(duration), np.array(advance), carry)
    expected_ends, expected_frontier = _scan_by_loop(queued, duration, advance, carry)
    assert ends.tolist() == expected_ends
    assert frontier == expected_frontier


@pytest.mark.parametrize("walk", ["c", "python", "c given floats"])
def test_a_launch_waits_for_room_in_the_launch_queue(walk: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """(With latencies as floats, which the C walk does not read, the Python walk replays it.)"""
    if walk == "python":
        monkeypatch.setattr(replay_module, "_replay", None)
    elif replay_module._replay is None and not os.environ.get("CI"):
        pytest.skip("the C walk was not built here")
    count = LAUNCH_QUEUE + 100
    window = _Window(
        start=0,
        end=3_000_000,  # the host works until 3 ms after launching everything in the first 1.1 µs
        launch=np.arange(count, dtype=np.int64),
        latency=np.zeros(count, dtype=np.float64 if walk == "c given floats" else np.int64),
        duration=np.full(count, 1_000, dtype=np.int64),
        advance=np.full(count, 1_000, dtype=np.int64),
        stream=np.zeros(count, dtype=np.int64),
        correlation=np.arange(count, dtype=np.int64),
        carry={},
        call_key=np.zeros(0, dtype=np.int64),
        call_start=np.zeros(0, dtype=np.int64),
        call_end=np.zeros(0, dtype=np.int64),
        call_overhead=np.zeros(0, dtype=np.int64),
        call_skipped=(),
    )
    # Launch i cannot happen before work i - 1024 starts at (i - 1024) µs: the last launch is held
    # until 99 µs, so everything the host does after it (until 3 ms) moves that much later.
    last = count - 1
    held = (last - LAUNCH_QUEUE) * 1_000 - last
    assert _simulate(window, Fix()) == 3_000_000 + held


# --- the recorded steps, reproduced -----------------------------------------------------------


def _exact_ns(value: float) -> int:
    return round(value * 1000)


def _analysis(name: str) -> Analysis:
    analysis: Analysis = sample_report(name).analysis
    return analysis


INTEGER_TIME_SAMPLES = [
    "v100_resnet50_workers0.pt.trace.json.gz",
    "v100_resnet50_workers4.pt.trace.json.gz",
    "a100_recsys_rank0.json.gz",
    "gp100_mlp_pageable_sync.json.gz",
    "two_ranks/rank-0.json.gz",
    "a100_ddp_nccl.json.gz",
]


@pytest.mark.parametrize("name", INTEGER_TIME_SAMPLES)
def test_replay_without_a_fix_is_the_recorded_time(name: str) -> None:
    """Recorded: per steady window, the later of its end and the end of the GPU work launched in it
    (computed here from the raw JSON). The replay with no fix must land on it (within 1%)."""
    analysis = _analysis(name)
    raw = read_events(SAMPLES / name)[1]
    launch_ts = {
        event["args"]["correlation"]: _exact_ns(event["ts"])
        for event in raw
        if event.get("cat") in RUNTIME_CATS and "correlation" in event.get("args", {})
    }
    work = [
        (
            launch_ts.get(event["args"].get("correlation"), _exact_ns(event["ts"])),
            _exact_ns(event["ts"] + event["dur"]),
        )
        for event in raw
        if event.get("cat") in GPU_CATS and event.get("ph") == "X"
    ]
    recorded = 0
    for start, end in analysis.steady.windows:
        ends = [finish for launched, finish in work if start <= launched < end]
        recorded += max([end, *ends]) - start
    assert analysis.replay.recorded_ns == recorded
    assert analysis.replay.step_time_ns() == pytest.approx(recorded, rel=0.01)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(SAMPLES)) for p in SAMPLES.rglob("*.json*")))
def test_replay_without_a_fix_reproduces_every_sample(path: str) -> None:
    replay = _analysis(path).replay
    if replay.available:
        assert replay.step_time_ns() == pytest.approx(replay.recorded_ns, rel=0.01)


# --- the model both ways ----------------------------------------------------------------------


def test_a_sync_that_drains_a_full_queue_saves_the_idle_after_it(tmp_path: Path) -> None:
    # 20 kernels of 100 µs launched every 5 µs: the GPU is the bottleneck; .item() then waits for
    # it, and the GPU idles while Python prepares the next step.
    loop = item_loop(kernel_us=100, launch_every_us=5, prep_us=300)
    analysis = analysis_of(tmp_path, loop.events)
    finding = next(f for f in evaluate(analysis) if f.rule == "sync-in-loop")
    idle_after = loop.idle_after_syncs() * 1000
    assert idle_after > 6 * 300_000
    assert finding.savings_total_ns == pytest.approx(idle_after, rel=0.05)
    assert not finding.minor and finding.severity == "high"  # ~13% of each step
    assert finding.source == "train.py:52"
    assert finding.title.startswith("`.item()`") and "train.py:52" in finding.title


def test_the_same_sync_in_a_host_bound_loop_saves_almost_nothing(tmp_path: Path) -> None:
    # 20 kernels of 5 µs launched every 50 µs: the GPU has drained long before .item(); the idle
    # after it comes from the host preparing the next step, which the sync does not change.
    loop = item_loop(kernel_us=5, launch_every_us=50, prep_us=300)
    analysis = analysis_of(tmp_path, loop.events)
    idle_after = loop.idle_after_syncs() * 1000
    assert idle_after > 6 * 300_000
    syncs = [f for f in evaluate(analysis) if f.rule == "sync-in-loop"]
    assert all(f.savings_total_ns < 0.05 * idle_after for f in syncs)
    assert all(f.minor for f in syncs)  # no card: below the noise floor
    # and the idle after it is not blamed on the sync
    assert all(gap.cause_kind != "sync" for gap in analysis.idle_gaps)


def test_a_shortened_dataloader_wait_saves_its_length_minus_the_hand_over(tmp_path: Path) -> None:
    from loops import dataloader_loop

    loop = dataloader_loop(wait_us=5000, kernels=10, kernel_us=100)
    analysis = analysis_of(tmp_path, loop.events)
    finding = next(f for f in evaluate(analysis) if f.rule == "dataloader-stall")
    handover = analysis.thresholds.dataloader_handover_us
    # After the fix each step is the hand-over plus 100 µs of launches (the GPU's 1 ms fits under
    # it): the step shrinks by the wait minus the hand-over.
    assert finding.savings_per_step_ns == pytest.approx((5000 - handover) * 1000, rel=0.02)


# --- blocking copies into pageable memory: host waits inside cudaMemcpyAsync -------------------------


def _raw_waits(events: list[dict[str, object]]) -> tuple[list[dict[str, object]], list[dict[str, object]]]:
    """(copy calls into pageable memory, the stream syncs) of a hand-built loop, from the raw events."""
    copies = {e["args"]["correlation"] for e in events if e.get("name") == "Memcpy DtoH (Device -> Pageable)"}  # type: ignore[index]
    calls = [e for e in events if e.get("name") == "cudaMemcpyAsync" and e["args"]["correlation"] in copies]  # type: ignore[index]
    syncs = [e for e in events if e.get("name") == "cudaStreamSynchronize"]
    return calls, syncs


def _idle_around(loop: Loop, returns: list[float]) -> tuple[float, float]:
    """From the loop's GPU activity (µs): the GPU idle after each return until the next activity
    (waits followed by GPU work only), and the whole idle stretch around each return (from the GPU's
    last work before it to the next)."""
    after = around = 0.0
    for returned in returns:
        following = [start for start, _ in loop.gpu if start >= returned]
        if not following:
            continue
        busy_until = max(end for start, end in loop.gpu if start <= returned)
        after += min(following) - max(returned, busy_until)
        around += min(following) - busy_until
    return after, around


def _tail(loop: Loop) -> float:
    """The last step's host time after the GPU's last work (µs)."""
    return loop.steps[-1][1] - max(end for _, end in loop.gpu)


def test_a_copy_into_pageable_memory_that_waits_inside_the_call_is_a_host_wait(tmp_path: Path) -> None:
    """`.item()` into pageable memory with no sync after it waits inside cudaMemcpyAsync: the sync
    hot spot is those calls (count and blocked time = the raw calls' durations), the GPU idle after
    each is caused by it, and the replay without the waits gives that idle back. Before, no sync
    was seen at all (the calls were not blocking calls)."""
    from loops import blocking_item_loop

    loop = blocking_item_loop()
    analysis = analysis_of(tmp_path, loop.events)
    calls, syncs = _raw_waits(loop.events)
    assert len(calls) == 6 and not syncs
    (hotspot,) = analysis.sync_hotspots
    assert (hotspot.call, hotspot.then_call, hotspot.op) == ("cudaMemcpyAsync", None, "aten::item")
    assert hotspot.count == len(calls)
    assert hotspot.blocked_ns == sum(round(e["dur"] * 1000) for e in calls)  # type: ignore[operator]
    assert len(analysis.steady.steady_steps) == len(loop.steps)
    # the idle stretch around each return, to the next GPU work: the gaps these waits caused
    after, around = _idle_around(loop, [e["ts"] + e["dur"] for e in calls])  # type: ignore[operator]
    assert hotspot.idle_after_ns == pytest.approx(after * 1000, abs=1)
    assert hotspot.idle_caused_ns == pytest.approx(around * 1000, abs=1)
    assert {gap.cause_kind for gap in analysis.idle_gaps if gap.sync_key in hotspot.keys} == {"sync"}
    # the replay without the waits: the GPU keeps its queue, so every idle stretch they caused is
    # given back, and the host's tail after the GPU's last work
    finding = next(f for f in evaluate(analysis) if f.rule == "sync-in-loop")
    assert finding.savings_total_ns == pytest.approx((around + _tail(loop)) * 1000, rel=0.01)
    assert finding.title.startswith("`.item()` at train.py:61")
    evidence = dict(finding.evidence)
    assert evidence["call"] == "cudaMemcpyAsync"
    steps = len(loop.steps)
    blocked = sum(e["dur"] for e in calls) / steps  # type: ignore[misc]
    assert evidence["host blocked"].startswith(f"{blocked / 1000:.2f} ms per step")


def test_a_copy_call_and_the_sync_after_it_are_one_wait(tmp_path: Path) -> None:
    """The `.item()` pair of real traces: cudaMemcpyAsync waits for the queue, then a
    cudaStreamSynchronize barely waits. One wait per step, its blocked time both calls'."""
    from loops import blocking_item_loop

    loop = blocking_item_loop(sync_after=True)
    analysis = analysis_of(tmp_path, loop.events)
    calls, syncs = _raw_waits(loop.events)
    assert len(calls) == len(syncs) == 6
    (hotspot,) = analysis.sync_hotspots
    assert (hotspot.call, hotspot.then_call) == ("cudaMemcpyAsync", "cudaStreamSynchronize")
    assert hotspot.count == hotspot.steady_count == len(calls)
    assert hotspot.blocked_ns == sum(round(e["dur"] * 1000) for e in calls + syncs)  # type: ignore[operator]
    assert len(hotspot.keys) == len(calls) + len(syncs)
    after, around = _idle_around(loop, [e["ts"] + e["dur"] for e in syncs])  # type: ignore[operator]
    assert hotspot.idle_after_ns == pytest.approx(after * 1000, abs=1)  # after the pair, not twice
    assert hotspot.idle_caused_ns == pytest.approx(around * 1000, abs=1)
    # each call still counts under its own name
    assert {call.call: call.count for call in analysis.syncs} == {
        "cudaMemcpyAsync": 6,
        "cudaStreamSynchronize": 6,
    }
    finding = next(f for f in evaluate(analysis) if f.rule == "sync-in-loop")
    assert finding.savings_total_ns == pytest.approx((around + _tail(loop)) * 1000, rel=0.01)
    assert dict(finding.evidence)["how often"].startswith("every step (6 in the steady state")


def test_the_replay_times_the_steps_the_step_time_is_over(tmp_path: Path) -> None:
    """A host that runs ahead, with a start-up first step (a 30 ms kernel in it): the steady steps'
    time begins when that step's work was done (8.4 ms × 5 after it), not when the second host range
    began (0.39 ms in), so a saving per step is over the steps the step time is over. From the raw
    events: each step's kernels by their launch's correlation, its done = the later of its range's
    end and theirs (was: 50.01 ms recorded for 42 ms of steps)."""
    from loops import ahead_loop

    loop = ahead_loop()
    first = next(e for e in loop.events if e["cat"] == "kernel")
    for event in loop.events:  # the first kernel takes 30 ms longer; everything after it waits
        if event["cat"] == "kernel" and event["ts"] > first["ts"]:
            event["ts"] += 30_000
    first["dur"] += 30_000
    analysis = analysis_of(tmp_path, loop.events)
    assert [step.steady for step in analysis.steady.steps] == [False] + [True] * 5
    launched = {e["args"]["correlation"]: e["ts"] for e in loop.events if e["cat"] == "cuda_runtime"}
    done = []
    for start, end in loop.steps:
        ends = [
            e["ts"] + e["dur"]
            for e in loop.events
            if e["cat"] == "kernel" and start <= launched[e["args"]["correlation"]] < end
        ]
        done.append(max([end, *ends, *done[-1:]]))
    steady_time = _exact_ns(done[-1]) - _exact_ns(done[0])
    assert steady_time == 5 * 8_400_000
    assert analysis.replay.recorded_ns == steady_time
    assert analysis.replay.step_time_ns() == pytest.approx(steady_time, rel=0.01)
    assert analysis.steady.window_ns == steady_time


# --- two ways of computing one replay -----------------------------------------------------------


def _random_fix(window: _Window, rng: random.Random) -> Fix:
    keys, correlations = window.call_key.tolist(), window.correlation.tolist()
    length = max(1, window.end - window.start)
    return Fix(
        remove_calls=frozenset(rng.sample(keys, min(len(keys), rng.randint(0, 5)))),
        shorten=tuple(
            (window.start + at, window.start + at + rng.randint(0, length // 4), rng.randint(0, length // 8))
            for at in rng.sample(range(length), 3)
        ),
        side_stream=frozenset(rng.sample(correlations, min(len(correlations), 3))),
        durations=tuple(
            (c, rng.randint(0, 10_000)) for c in rng.sample(correlations, min(len(correlations), 4))
        ),
        faster=frozenset(rng.sample(correlations, min(len(correlations), 10))),
        speedup=rng.choice([1.0, 2.0, 3.3]),
    )


@pytest.mark.parametrize("name", ["a100_recsys_rank0.json.gz", "gp100_mlp_pageable_sync.json.gz"])
def test_short_batches_by_loop_equal_every_batch_by_scan(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stream's short batches are replayed in a loop, longer ones with ``_scan``: all one way or
    all the other, every window gives the same time, with the rules' fixes and random ones."""
    windows = _analysis(name).replay.windows
    rng = random.Random(7)
    fixes = [Fix(), *(_random_fix(window, rng) for window in windows for _ in range(4))]
    times = {}
    monkeypatch.setattr(replay_module, "_replay", None)  # the Python walk, whose batches these are
    for short in (0, 10**9):
        monkeypatch.setattr(replay_module, "_SHORT_BATCH", short)
        times[short] = [_simulate(window, fix) for window in windows for fix in fixes]
    assert times[0] == times[10**9]
    assert len(set(times[0])) > 1  # the fixes changed something


needs_c_walk = pytest.mark.skipif(
    replay_module._replay is None and not os.environ.get("CI"), reason="the C walk was not built here"
)


@needs_c_walk
@pytest.mark.parametrize(
    "name", ["a100_recsys_rank0.json.gz", "gp100_mlp_pageable_sync.json.gz", "h100_bert_small_stacks.json.gz"]
)
def test_the_walk_in_c_equals_the_walk_in_python(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The C walk (:mod:`traceinsight.analysis._replay`) gives every window the time the Python walk
    gives it, with the rules' fixes and random ones (calls removed, ranges shortened, copies moved
    to a side stream, work retimed or made faster)."""
    assert replay_module._replay is not None, "CI is set but traceinsight.analysis._replay was not built"
    analysis = _analysis(name)
    windows = analysis.replay.windows
    rng = random.Random(11)
    fixes = [Fix(), *(_random_fix(window, rng) for window in windows for _ in range(6))]
    native = [_simulate(window, fix) for window in windows for fix in fixes]
    monkeypatch.setattr(replay_module, "_replay", None)
    assert [_simulate(window, fix) for window in windows for fix in fixes] == native
    assert len(set(native)) > 1  # the fixes changed something


@needs_c_walk
def test_the_walk_in_c_checks_every_index() -> None:
    """Arrays that do not fit together are a ValueError, never a read or write outside them."""
    assert replay_module._replay is not None
    walk = replay_module._replay.walk

    def arrays(**change: np.ndarray) -> list[np.ndarray]:
        int64 = lambda *values: np.array(values, dtype=np.int64)  # noqa: E731
        given = {
            "order": int64(0, 1), "lane_start": int64(0, 2), "lane_slot": int64(0), "queued": int64(0, 5),
            "length": int64(3, 3), "ahead": int64(3, 3), "launch": int64(0, 5), "uptos": int64(2),
            "cuts": int64(2), "point": int64(10), "kind": int64(2), "value": int64(0), "extra": int64(0),
            "recorded_end": int64(0), "removed": int64(0), "floor": int64(0),
            "skipped": np.zeros(1, dtype=np.uint8), "frontier": int64(0), "present": np.zeros(1, dtype=np.uint8),
            "starts": int64(0, 0), "ends": int64(0, 0),
        }  # fmt: skip
        given.update(change)
        return list(given.values())

    good = arrays()
    assert walk(*good, 1024) == 0
    assert good[-1].tolist() == [3, 8] and good[-2].tolist() == [
        0,
        5,
    ]  # ends, starts: each queued + its length
    bad = {
        "order": np.array([0, 2], dtype=np.int64),  # a row past the work
        "lane_slot": np.array([1], dtype=np.int64),  # a slot past the slots
        "lane_start": np.array([0, 3], dtype=np.int64),  # a lane past the work
        "cuts": np.array([3], dtype=np.int64),  # more of a lane's work than it has
        "uptos": np.array([3], dtype=np.int64),  # more launches than the work
        "skipped": np.zeros(2, dtype=np.uint8),  # flags for slots that are not there
        "ends": np.zeros(1, dtype=np.int64),  # too short to be written
        "queued": np.zeros(2, dtype=np.int32),  # not int64
    }
    for name, value in bad.items():
        with pytest.raises(ValueError):
            walk(*arrays(**{name: value}), 1024)
    readonly = np.zeros(2, dtype=np.int64)
    readonly.setflags(write=False)
    with pytest.raises((ValueError, BufferError, TypeError)):
        walk(*arrays(ends=readonly), 1024)


def test_launches_inside_a_shortened_range_spread_over_its_new_length() -> None:
    """``_compressed`` against the rule written out per range: a launch at ``start + x`` of a range
    cut from ``end - start`` to ``length`` moves earlier by ``removed * (1 - x / (end - start))``."""
    rng = random.Random(3)
    launch = np.sort(np.array([rng.randint(0, 100_000) for _ in range(500)], dtype=np.int64))
    kept, at = [], 0
    while at < 100_000:
        start = at + rng.randint(0, 5_000)
        end = start + rng.randint(0, 8_000)
        kept.append((start, end, rng.randint(0, end - start)))
        at = end
    expected = []
    for time in launch.tolist():
        moved = time
        for start, end, length in kept:
            if start <= time < end:
                moved = time + round((end - start - length) * (1 - (time - start) / (end - start)))
        expected.append(moved)
    assert _compressed(launch, kept).tolist() == expected
