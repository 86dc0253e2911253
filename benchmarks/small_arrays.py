"""What numpy's array operations would cost as polars Series operations (issue 34's small target).

A job on a small trace imports numpy (about 0.3x the small floor, the import alone) for the array
work of the loader and the analyses: on a small trace some 500-900 calls of numpy functions, on
arrays of tens to thousands of values. This prints, for each operation they use, the median time
of the numpy call and of the polars Series operation that would stand in for it, on 300 values
and on 10^6; then ``intervals.meeting`` as written (numpy) against the same rule in Series
operations (the rows each keeps are checked equal) on a small and a large shape. Seeded data; no
trace needed. Usage::

    python benchmarks/small_arrays.py            # about 10 s
    python benchmarks/small_arrays.py --repeat 5000
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import polars as pl

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from traceinsight.analysis import intervals


def _median_us(call: Callable[[], Any], repeat: int) -> float:
    call()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


def _operations(size: int) -> dict[str, tuple[Callable[[], Any], Callable[[], Any]]]:
    """Each operation as (numpy, polars Series) on ``size`` seeded values."""
    rng = np.random.default_rng(size)
    a = np.sort(rng.integers(0, 10**9, size))
    b = rng.integers(0, 10**9, size)
    rows = np.arange(0, size, 3)
    mask = b > 5 * 10**8  # unsorted: no run of rows to slice
    sa, sb, srows, smask = pl.Series(a), pl.Series(b), pl.Series(rows), pl.Series(mask)
    return {
        "searchsorted": (
            lambda: np.searchsorted(a, b, side="right"),
            lambda: sa.search_sorted(sb, side="right"),
        ),
        "gather": (lambda: a[rows], lambda: sa.gather(srows)),
        "filter": (lambda: a[mask], lambda: sa.filter(smask)),
        "compare": (lambda: a > b, lambda: sa > sb),
        "where": (lambda: np.where(mask, a, b), lambda: sa.zip_with(smask, sb)),
        "cumulative max": (lambda: np.maximum.accumulate(b), lambda: sb.cum_max()),
        "cumulative sum": (lambda: np.cumsum(b), lambda: sb.cum_sum()),
        "shift by one": (lambda: np.concatenate(([0], b[:-1])), lambda: sb.shift(1)),
        "stable argsort": (lambda: np.argsort(b, kind="stable"), lambda: sb.arg_sort()),
        "flatnonzero": (lambda: np.flatnonzero(mask), lambda: smask.arg_true()),
    }


def _meeting_series(frame: pl.DataFrame, ts: str, end: str, windows: pl.DataFrame) -> pl.DataFrame:
    """``intervals.meeting`` on integer columns without nulls, in polars Series operations."""
    starts, ends = windows.get_column("start"), windows.get_column("end")
    ordered = starts <= ends
    low, high = starts.zip_with(ordered, ends), ends.zip_with(ordered, starts)
    order = low.arg_sort()
    low, reach = low.gather(order), high.gather(order).cum_max()
    opens = (low > reach.shift(1)).fill_null(True)
    opening, closing = low.filter(opens), reach.filter(opens.shift(-1).fill_null(True))
    at = closing.search_sorted(frame.get_column(ts), side="right")
    met = (at < closing.len()) & (
        opening.gather(at.clip(upper_bound=closing.len() - 1)) <= frame.get_column(end)
    )
    return frame.filter(met)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeat", type=int, default=2000, help="calls per figure on 300 values")
    args = parser.parse_args()
    print(f"polars {pl.__version__}, numpy {np.__version__}; median µs per call")
    for size, repeat in ((300, args.repeat), (10**6, max(args.repeat // 200, 5))):
        print(f"\n{size:,} int64 values | numpy | polars Series | polars ÷ numpy")
        for name, (numpy_call, series_call) in _operations(size).items():
            numpy_us, series_us = _median_us(numpy_call, repeat), _median_us(series_call, repeat)
            print(f"  {name} | {numpy_us:,.1f} | {series_us:,.1f} | {series_us / numpy_us:.1f}")
    print("\nintervals.meeting (numpy, as written) against the same rule in Series operations")
    rng = np.random.default_rng(34)
    # rows over 10^9 ns; windows of up to 10^7 ns for the small shape, 10^4 for the large (some reversed)
    for rows, count, width, repeat in ((300, 20, 10**7, args.repeat // 4), (10**6, 35_000, 10**4, 5)):
        ts = np.sort(rng.integers(0, 10**9, rows))
        frame = pl.DataFrame({"ts": ts, "end": ts + rng.integers(0, 10**5, rows)})
        start = rng.integers(0, 10**9, count)
        windows = pl.DataFrame({"start": start, "end": start + rng.integers(-(10**3), width, count)})
        kept = intervals.meeting(frame, "ts", "end", windows)
        if not kept.equals(_meeting_series(frame, "ts", "end", windows)):
            print("  the two keep different rows", file=sys.stderr)
            return 1
        numpy_us = _median_us(partial(intervals.meeting, frame, "ts", "end", windows), repeat)
        series_us = _median_us(partial(_meeting_series, frame, "ts", "end", windows), repeat)
        print(
            f"  {rows:,} rows, {count:,} windows ({kept.height:,} kept): numpy {numpy_us:,.0f} µs,"
            f" Series {series_us:,.0f} µs ({series_us / numpy_us:.1f}x)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
