"""Interval helpers against brute force over random small cases."""

from __future__ import annotations

import random

import polars as pl
import pytest

import traceinsight.analysis.intervals as intervals_module
from traceinsight.analysis.intervals import meeting, merge_intervals, within

#: Each search both ways: numpy's (Int64 columns without nulls) and polars' (the rest).
BOTH_WAYS = pytest.mark.parametrize("numpy", [True, False], ids=["numpy", "polars"])


def _one_way(numpy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not numpy:
        monkeypatch.setattr(intervals_module, "_plain", lambda *columns: False)


def _frame(rows: list[tuple[int, int]], a: str, b: str) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={a: pl.Int64, b: pl.Int64}, orient="row")


@BOTH_WAYS
@pytest.mark.parametrize("seed", range(200))
def test_meeting_keeps_exactly_the_rows_an_inequality_join_would_match(
    seed: int, numpy: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    _one_way(numpy, monkeypatch)
    rng = random.Random(seed)
    starts = [rng.randrange(0, 1000) for _ in range(rng.randrange(0, 6))]
    reversed_ok = rng.random() < 0.3
    windows = _frame([(s, s + rng.randrange(-5 if reversed_ok else 0, 80)) for s in starts], "start", "end")
    spans = [
        (t, t + rng.randrange(0, 50)) for t in (rng.randrange(0, 1100) for _ in range(rng.randrange(0, 60)))
    ]
    frame = _frame(spans, "ts", "end").with_row_index("row")
    kept = meeting(frame, "ts", "end", windows).get_column("row").to_list()
    matched = [
        i for i, (t, e) in enumerate(spans) if any(t < we and e >= ws for ws, we in windows.iter_rows())
    ]
    assert kept == sorted(kept)
    if any(we < ws for ws, we in windows.iter_rows()):
        assert set(matched) <= set(kept)  # reversed windows: a superset, narrowed by the join
    else:
        assert kept == matched


@BOTH_WAYS
@pytest.mark.parametrize("seed", range(100))
def test_within_is_inside_one_window(seed: int, numpy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each time against disjoint sorted ``[start, end)`` windows, brute force."""
    _one_way(numpy, monkeypatch)
    rng = random.Random(seed)
    windows, at = [], rng.randrange(-50, 50)
    for _ in range(rng.randrange(0, 6)):
        start = at + rng.randrange(0, 30)
        windows.append((start, start + rng.randrange(0, 40)))
        at = windows[-1][1]
    times = [rng.randrange(-60, 300) for _ in range(rng.randrange(0, 50))]
    inside = within(pl.Series("t", times, dtype=pl.Int64), tuple(windows))
    assert inside.dtype == pl.Boolean
    assert inside.to_list() == [any(s <= t < e for s, e in windows) for t in times]


@pytest.mark.parametrize("seed", range(50))
def test_within_unsorted_windows_give_what_they_gave(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    """Windows out of order (which the callers never pass) are searched by polars, as before."""
    rng = random.Random(seed)
    windows = tuple(
        (s, s + rng.randrange(0, 30)) for s in (rng.randrange(0, 200) for _ in range(rng.randrange(2, 7)))
    )
    times = pl.Series("t", [rng.randrange(-10, 250) for _ in range(40)], dtype=pl.Int64)
    given = within(times, windows).to_list()
    monkeypatch.setattr(intervals_module, "_plain", lambda *columns: False)
    assert within(times, windows).to_list() == given


def test_within_a_time_that_is_null_is_in_no_window() -> None:
    inside = within(pl.Series("t", [5, None, 25], dtype=pl.Int64), ((0, 10), (20, 30)))
    assert inside.to_list() == [True, False, True]


def _plain_union(spans: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """(group, start, end) blocks: per group, sort by start and extend while the next starts at or
    before the furthest end so far."""
    blocks: list[tuple[int, int, int]] = []
    for group in sorted({g for g, _, _ in spans}):
        current: list[int] | None = None
        for start, end in sorted((s, e) for g, s, e in spans if g == group):
            if current is not None and start <= current[1]:
                current[1] = max(current[1], end)
                continue
            if current is not None:
                blocks.append((group, current[0], current[1]))
            current = [start, end]
        if current is not None:
            blocks.append((group, current[0], current[1]))
    return blocks


@pytest.mark.parametrize("seed", range(30))
def test_merged_blocks_equal_a_plain_union(seed: int) -> None:
    """Nested, chained, touching, zero-length and tied intervals on several devices."""
    rng = random.Random(seed)
    spans = []
    for _ in range(rng.randint(1, 80)):
        start = rng.randint(0, 200)
        spans.append((rng.randint(0, 3), start, start + rng.choice([0, 0, 1, 5, rng.randint(0, 50)])))
    frame = pl.DataFrame(spans, schema={"device": pl.Int64, "ts": pl.Int64, "end": pl.Int64}, orient="row")
    merged = merge_intervals(frame, "device")
    assert list(merged.iter_rows()) == _plain_union(spans)
