"""Interval helpers against brute force over random small cases."""

from __future__ import annotations

import random

import polars as pl
import pytest

from traceinsight.analysis.intervals import meeting


def _frame(rows: list[tuple[int, int]], a: str, b: str) -> pl.DataFrame:
    return pl.DataFrame(rows, schema={a: pl.Int64, b: pl.Int64}, orient="row")


@pytest.mark.parametrize("seed", range(200))
def test_meeting_keeps_exactly_the_rows_an_inequality_join_would_match(seed: int) -> None:
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
