"""Interval helpers against brute force over random small cases."""

from __future__ import annotations

import random

import polars as pl
import pytest

import traceinsight.analysis.intervals as intervals_module
from traceinsight.analysis.intervals import joined_where, meeting, merge_intervals, within

#: Each search both ways: numpy's (Int64 columns without nulls) and polars' (the rest).
BOTH_WAYS = pytest.mark.parametrize("numpy", [True, False], ids=["numpy", "polars"])


def _one_way(numpy: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if not numpy:
        monkeypatch.setattr(intervals_module, "plain_ints", lambda *columns: False)


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
    monkeypatch.setattr(intervals_module, "plain_ints", lambda *columns: False)
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


def _window_sums(
    blocks: list[tuple[int, int, int]], windows: list[tuple[int, int, int, int]]
) -> dict[tuple[int, int], int]:
    """Per (step, device) window: the blocks' time inside it, by brute force over every pair; a
    window meets a block that starts before it ends and ends after it starts (its time clipped at 0)."""
    found: dict[tuple[int, int], int] = {}
    for step, device, start, end in windows:
        met = [(s, e) for d, s, e in blocks if d == device and s < end and e > start]
        if met:  # a window given twice counts twice, as the join's rows do
            overlap = sum(max(0, min(e, end) - max(s, start)) for s, e in met)
            found[(step, device)] = found.get((step, device), 0) + overlap
    return found


def _random_case(seed: int) -> tuple[pl.DataFrame, list[tuple[int, int, int, int]]]:
    pick = random.Random(seed)
    raw = [
        (pick.randrange(3), start, start + pick.randint(0, 80))
        for start in (pick.randint(0, 1000) for _ in range(pick.randint(0, 40)))
    ]
    blocks = merge_intervals(
        pl.DataFrame(raw, schema={"device": pl.Int64, "ts": pl.Int64, "end": pl.Int64}, orient="row"),
        "device",
    )
    windows = [
        (step, device, start, start + pick.randint(-30, 400))  # some end before they begin
        for step in range(pick.randint(1, 6))
        for start in [pick.randint(-50, 1100)]
        for device in range(4)  # device 3 has no blocks
    ]
    return blocks, windows


def _grid(windows: list[tuple[int, int, int, int]]) -> pl.DataFrame:
    schema = {"step": pl.Int64, "device": pl.Int64, "start": pl.Int64, "end": pl.Int64}
    return pl.DataFrame(windows, schema=schema, orient="row")


@pytest.mark.parametrize("seed", range(150))
def test_the_steps_blocks_time_without_a_join_is_every_pairs_overlap(seed: int) -> None:
    from traceinsight.analysis.gpu_time import _inside_blocks

    blocks, windows = _random_case(seed)
    expected = _window_sums([tuple(row) for row in blocks.iter_rows()], windows)
    assert _inside_blocks(blocks, _grid(windows)) == expected


def test_blocks_on_a_windows_edges_count_as_the_join_counts_them() -> None:
    from traceinsight.analysis.gpu_time import _inside_blocks

    # Touching blocks, a zero-length one between them, blocks ending exactly where a window
    # begins or beginning exactly where one ends, a zero-length window, one given twice.
    blocks = [(0, 0, 10), (0, 10, 10), (0, 10, 20), (0, 30, 40), (1, 5, 5)]
    windows = [
        (0, 0, 10, 30),
        (1, 0, 0, 10),
        (2, 0, 20, 30),
        (3, 0, 15, 15),
        (4, 0, 40, 50),
        (5, 1, 0, 10),
        (6, 0, 5, 35),
        (6, 0, 5, 35),
    ]
    frame = pl.DataFrame(
        blocks, schema={"device": pl.Int64, "start": pl.Int64, "end": pl.Int64}, orient="row"
    )
    expected = _window_sums(blocks, windows)
    assert expected == {(0, 0): 10, (1, 0): 10, (3, 0): 0, (5, 1): 0, (6, 0): 40}
    assert _inside_blocks(frame, _grid(windows)) == expected


@pytest.mark.parametrize("seed", range(100))
def test_the_steps_idle_by_cause_without_a_join_is_every_pairs_overlap(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    import traceinsight.analysis.gpu_time as gpu_time
    from traceinsight.analysis.gpu_time import _gaps_inside

    def no_join(*arguments: object) -> None:
        raise AssertionError("disjoint gaps of one cause went to the join")

    monkeypatch.setattr(gpu_time, "_gaps_joined", no_join)
    blocks, windows = _random_case(seed)
    pick = random.Random(seed)
    gaps = blocks.with_columns(
        cause_kind=pl.Series([pick.choice(["sync", "launch", "dataloader"]) for _ in range(blocks.height)])
    )
    expected = {
        (step, device, kind): ns
        for kind in ("sync", "launch", "dataloader")
        for (step, device), ns in _window_sums(
            [(d, s, e) for d, s, e, k in gaps.iter_rows() if k == kind], windows
        ).items()
    }
    assert _gaps_inside(_grid(windows), gaps) == expected


def test_blocks_that_overlap_or_hold_nulls_are_left_to_the_join() -> None:
    from traceinsight.analysis.gpu_time import _gaps_inside, _inside_blocks

    windows = [(0, 0, 0, 100)]
    overlapping = pl.DataFrame({"device": [0, 0], "start": [0, 5], "end": [10, 20]})
    assert _inside_blocks(overlapping, _grid(windows)) is None
    with_null = pl.DataFrame({"device": [0, None], "start": [0, 30], "end": [10, 40]})
    assert _inside_blocks(with_null, _grid(windows)) is None
    # Gaps of one cause that overlap: the join's sums, each pair's overlap counted.
    gaps = overlapping.with_columns(cause_kind=pl.lit("sync"))
    assert _gaps_inside(_grid(windows), gaps) == {(0, 0, "sync"): 25}
    untyped = gaps.with_columns(cause_kind=pl.Series([None, "sync"], dtype=pl.String))
    assert _gaps_inside(_grid(windows), untyped) == {(0, 0, None): 10, (0, 0, "sync"): 15}


@pytest.mark.parametrize("seed", range(20))
def test_joined_where_pairs_exactly_what_brute_force_pairs_and_is_not_fused_with_a_later_equality(
    seed: int,
) -> None:
    rng = random.Random(seed)
    copies = [
        (c, rng.randrange(2), t, t + rng.randrange(1, 40)) for c, t in enumerate(rng.sample(range(500), 15))
    ]
    blocks = [(rng.randrange(2), t, t + rng.randrange(1, 60)) for t in rng.sample(range(500), 12)]
    left = pl.LazyFrame(copies, schema=["copy", "device", "ts", "end"], orient="row")
    right = pl.LazyFrame(blocks, schema=["k_device", "k_start", "k_end"], orient="row")
    query = joined_where(
        left, right, pl.col("k_start") < pl.col("end"), pl.col("k_end") > pl.col("ts")
    ).filter(pl.col("device") == pl.col("k_device"))
    expected = sorted(
        (c, b)
        for c, device, ts, end in copies
        for b, (k_device, k_start, k_end) in enumerate(blocks)
        if k_start < end and k_end > ts and device == k_device
    )
    got = query.collect().select("copy", "k_start").rows()
    assert sorted((c, next(i for i, b in enumerate(blocks) if b[1] == s)) for c, s in got) == expected
    # The inequality join ran on its own: what the query still plans is a filter of its result. In
    # one query, polars fuses the join and the equality into a hash join on device (every pair of a
    # device checked): the blow-up the helper is there to prevent.
    assert "JOIN" not in query.explain()
    fused = left.join_where(right, pl.col("k_start") < pl.col("end")).filter(
        pl.col("device") == pl.col("k_device")
    )
    assert "JOIN" in fused.explain()
