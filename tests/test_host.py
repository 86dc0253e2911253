"""The host-side view: self time against a plain stack walk over the raw JSON."""

from __future__ import annotations

from collections import defaultdict

import polars as pl
import pytest
from tracebuild import SAMPLES, read_events, sample_report

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
    for (op, _, inclusive), self_ns in zip(host.top_ops, host.top_ops_self, strict=True):
        assert self_ns == expected_self[op]
        assert inclusive == expected_total[op]
    ranked = sorted(expected_self.items(), key=lambda item: (-item[1], item[0]))[: len(host.top_ops)]
    assert [op for op, _, _ in host.top_ops] == [op for op, _ in ranked]


def test_a_chain_of_wrappers_is_one_row_of_self_time() -> None:
    """alexnet's 30 s CUDA start-up sits in aten::to > aten::_to_copy > aten::empty_strided: by self
    time it is one operator's, not three rows of the same 30 s."""
    host = sample_report("a100_alexnet_cuda_sync.json.gz").analysis.host
    first = host.top_ops[0][0]
    assert first == "aten::empty_strided"
    names = [op for op, _, _ in host.top_ops[:3]]
    assert "aten::to" not in names and "aten::_to_copy" not in names
