"""Launch calls inside ``Optimizer.step`` ranges: found by a search over ranges that do not overlap
on a thread, by a join where they do; both equal to each call checked against each range."""

from __future__ import annotations

import random

import polars as pl
import pytest

from traceinsight.analysis.optimizer import _inside


def _ranges(rng: random.Random, nested: bool) -> list[tuple[int, int, int, int]]:
    ranges = []
    for pid, tid in ((1, 1), (1, 2), (2, 1)):
        at = 0
        for _ in range(40):
            start = at + rng.randint(0, 30)
            end = start + rng.randint(0, 60)  # some ranges hold no time
            ranges.append((pid, tid, start, end))
            at = end
            if nested and rng.random() < 0.3:
                ranges.append((pid, tid, start + 1, start + rng.randint(1, 80)))  # inside, or past the end
    return ranges


@pytest.mark.parametrize("nested", [False, True])
@pytest.mark.parametrize("seed", range(5))
def test_calls_inside_ranges_equal_each_call_checked_against_each_range(nested: bool, seed: int) -> None:
    rng = random.Random(seed)
    ranges = _ranges(rng, nested)
    calls = [
        (rng.choice((1, 2)), rng.choice((1, 2)), rng.randint(0, 3_000), correlation, rng.randint(1, 9))
        for correlation in range(2_000)
    ]
    launches = pl.DataFrame(
        calls,
        schema={"pid": pl.Int64, "tid": pl.Int64, "ts": pl.Int64, "correlation": pl.Int64, "dur": pl.Int64},
        orient="row",
    )
    table = pl.DataFrame(
        ranges, schema={"pid": pl.Int64, "tid": pl.Int64, "ts": pl.Int64, "end": pl.Int64}, orient="row"
    )
    holding: dict[int, set[tuple[int, int]]] = {}
    for pid, tid, ts, correlation, _ in calls:
        for r_pid, r_tid, start, end in ranges:
            if (pid, tid) == (r_pid, r_tid) and start <= ts < end:
                holding.setdefault(correlation, set()).add((start, end))
    found = _inside(launches, table)
    assert sorted(found.get_column("correlation").to_list()) == sorted(holding)
    for correlation, start, end in found.select("correlation", "r_ts", "r_end").iter_rows():
        assert (start, end) in holding[correlation]
    if not nested:  # one range holds each call
        assert all(len(held) == 1 for held in holding.values())
    assert len(holding) > 100
