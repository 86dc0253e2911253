"""The host-side view: self time against a plain stack walk over the raw JSON."""

from __future__ import annotations

import os
import random
from collections import defaultdict
from collections.abc import Sequence

import polars as pl
import pytest
from tracebuild import SAMPLES, read_events, sample_report

from traceinsight.analysis import host
from traceinsight.analysis.host import self_times
from traceinsight.load import load_trace


def plain_self_times(name: str) -> tuple[dict[str, int], dict[str, int]]:
    """(self, total) per operator name: a stack per thread over ops sorted by start (longer first);
    total counts a call unless its direct caller has the same name."""
    _, raw = read_events(SAMPLES / name)
    ops = [e for e in raw if e.get("cat") == "cpu_op" and e.get("ph") == "X"]
    by_thread: dict[tuple[int, int], list[dict[str, object]]] = defaultdict(list)
    for event in ops:
        by_thread[(event["pid"], event["tid"])].append(event)
    own: dict[str, int] = defaultdict(int)
    total: dict[str, int] = defaultdict(int)
    for events in by_thread.values():
        events.sort(key=lambda e: (e["ts"], -(e["ts"] + e["dur"])))
        stack: list[dict[str, object]] = []
        callees: dict[int, int] = defaultdict(int)
        for event in events:
            start = round(event["ts"] * 1000)
            while stack and round((stack[-1]["ts"] + stack[-1]["dur"]) * 1000) <= start:
                stack.pop()
            duration = round(event["dur"] * 1000)
            if stack:
                callees[id(stack[-1])] += duration
            if not stack or stack[-1]["name"] != event["name"]:
                total[event["name"]] += duration
            stack.append(event)
        for event in events:
            own[event["name"]] += max(0, round(event["dur"] * 1000) - callees[id(event)])
    return dict(own), dict(total)


@pytest.mark.parametrize(
    "name", ["a100_recsys_rank0.json.gz", "two_ranks/rank-0.json.gz", "a100_alexnet_cuda_sync.json.gz"]
)
def test_self_time_equals_a_plain_stack_walk(name: str) -> None:
    expected_self, expected_total = plain_self_times(name)
    timed = self_times(load_trace(SAMPLES / name).cpu_ops)
    own = dict(timed.group_by("name").agg(pl.col("self").sum()).iter_rows())
    assert own == expected_self
    host = sample_report(name).analysis.host
    for op in host.top_ops:
        assert op.self_ns == expected_self[op.name]
        assert op.total_ns == expected_total[op.name]
    ranked = sorted(expected_self.items(), key=lambda item: (-item[1], item[0]))[: len(host.top_ops)]
    assert [op.name for op in host.top_ops] == [name for name, _ in ranked]


def test_a_chain_of_wrappers_is_one_row_of_self_time() -> None:
    """alexnet's 30 s CUDA start-up sits in aten::to > aten::_to_copy > aten::empty_strided: by self
    time it is one operator's, not three rows of the same 30 s."""
    host = sample_report("a100_alexnet_cuda_sync.json.gz").analysis.host
    first = host.top_ops[0].name
    assert first == "aten::empty_strided"
    names = [op.name for op in host.top_ops[:3]]
    assert "aten::to" not in names and "aten::_to_copy" not in names


def _nested_ops(
    rng: random.Random, start: int, end: int, depth: int, out: list[tuple[int, int, str]]
) -> None:
    """Properly nested operators inside [start, end]: children touch, repeat a parent's span, or
    last zero time (zero-length ones often at the same instant as a sibling's start)."""
    if depth == 0:
        return
    cursor = start
    while cursor < end and rng.random() < 0.8:
        length = rng.choice([0, 0, end - cursor, rng.randint(0, end - cursor)])
        name = rng.choice(["aten::add", "aten::to", "aten::copy_"])
        out.append((cursor, cursor + length, name))
        _nested_ops(rng, cursor, cursor + length, depth - 1, out)
        cursor += length + rng.choice([0, 0, 1, 3])


def _stack_walk(rows: list[tuple[int, int, int, int, str]]) -> list[tuple[str, int, int, bool]]:
    """(name, dur, self, top) per row by a stack per thread, as in :func:`plain_self_times`."""
    by_thread: dict[tuple[int, int], list[tuple[int, int, str]]] = defaultdict(list)
    for pid, tid, ts, end, name in rows:
        by_thread[(pid, tid)].append((ts, end, name))
    result = []
    for events in by_thread.values():
        events.sort(key=lambda e: (e[0], -e[1]))
        stack: list[int] = []
        callees = [0] * len(events)
        top = [True] * len(events)
        for index, (ts, end, name) in enumerate(events):
            while stack and events[stack[-1]][1] <= ts:
                stack.pop()
            if stack:
                callees[stack[-1]] += end - ts
                top[index] = events[stack[-1]][2] != name
            stack.append(index)
        for index, (ts, end, name) in enumerate(events):
            result.append((name, end - ts, max(0, end - ts - callees[index]), top[index]))
    return sorted(result)


def _ops_frame(rows: Sequence[tuple[int, int, int | None, int | None, str]]) -> pl.DataFrame:
    """Operators (pid, tid, ts, end, name); a row without times has no duration either."""
    return pl.DataFrame(
        [
            (pid, tid, ts, end, None if ts is None or end is None else end - ts, name)
            for pid, tid, ts, end, name in rows
        ],
        schema={
            "pid": pl.Int64,
            "tid": pl.Int64,
            "ts": pl.Int64,
            "end": pl.Int64,
            "dur": pl.Int64,
            "name": pl.String,
        },
        orient="row",
    )


@pytest.mark.parametrize("native", [True, False], ids=["C walk", "polars"])
@pytest.mark.parametrize("seed", range(20))
def test_self_time_of_random_nested_ops_equals_a_stack_walk(seed: int, native: bool) -> None:
    """Zero-length operators, equal starts, identical spans, recursion, several threads, and a row
    without times (left out)."""
    rng = random.Random(seed)
    rows: list[tuple[int, int, int, int, str]] = []
    for pid, tid in [(1, 1), (1, 2), (2, 1)][: rng.randint(1, 3)]:
        spans: list[tuple[int, int, str]] = []
        _nested_ops(rng, 0, 1_000, 5, spans)
        rows += [(pid, tid, ts, end, name) for ts, end, name in spans]
    rng.shuffle(rows)
    untimed: list[tuple[int, int, int | None, int | None, str]] = (
        [(1, 1, None, None, "aten::untimed")] if seed % 2 else []
    )  # left out
    ops = _ops_frame([*rows, *untimed])
    timed = self_times(ops, native=native)
    assert sorted(timed.iter_rows()) == _stack_walk(rows)


@pytest.mark.skipif(
    host._nesting is None and not os.environ.get("CI"), reason="the C walk was not built here"
)
@pytest.mark.parametrize("seed", range(30))
def test_the_c_walk_gives_the_polars_rows_on_overlaps_that_do_not_nest(seed: int) -> None:
    """Recording glitches (operators that overlap without nesting), equal starts and ends, zero
    lengths, many threads: the C walk gives the polars form's rows."""
    assert host._nesting is not None, "CI is set but traceinsight.analysis._nesting was not built"
    rng = random.Random(seed)
    rows = []
    for _ in range(rng.randint(1, 400)):
        ts = rng.randint(0, 60)
        rows.append((rng.randint(1, 2), rng.randint(1, 3), ts, ts + rng.choice([0, 0, 1, 5, rng.randint(0, 60)]),
                     rng.choice(["a", "b", "c"])))  # fmt: skip
    ops = _ops_frame(rows)
    assert sorted(self_times(ops).rows()) == sorted(self_times(ops, native=False).rows())


@pytest.mark.skipif(
    host._nesting is None and not os.environ.get("CI"), reason="the C walk was not built here"
)
@pytest.mark.parametrize("seed", range(20))
def test_the_c_walk_gives_the_polars_rows_with_threads_missing_a_pid_or_tid(seed: int) -> None:
    """A null pid or tid (a damaged trace): ordered first, and each such row its own thread in both
    forms; and the ids a null could be taken for (0, Int64's least value)."""
    assert host._nesting is not None, "CI is set but traceinsight.analysis._nesting was not built"
    rng = random.Random(seed)
    ids = [None, 0, 1, -(2**63)]
    rows = []
    for _ in range(rng.randint(1, 300)):
        ts = rng.randint(0, 40)
        rows.append((rng.choice(ids), rng.choice(ids), ts, ts + rng.choice([0, 1, 5, rng.randint(0, 40)]),
                     rng.choice(["a", "b"])))  # fmt: skip
    ops = _ops_frame(rows)  # type: ignore[arg-type]
    assert sorted(self_times(ops).rows()) == sorted(self_times(ops, native=False).rows())


@pytest.mark.skipif(
    host._nesting is None and not os.environ.get("CI"), reason="the C walk was not built here"
)
@pytest.mark.parametrize(
    "name",
    [
        "a100_recsys_rank0.json.gz",
        "v100_ddp_ns_timestamps.pt.trace.json.gz",
        "b200_eager_stacks.json.gz",
        "mi300_vllm_graph_replay.json.gz",
    ],
)
def test_the_c_walk_gives_the_polars_rows_on_real_traces(name: str) -> None:
    ops = load_trace(SAMPLES / name).cpu_ops
    assert sorted(self_times(ops).rows()) == sorted(self_times(ops, native=False).rows())
