"""Frozen results made a column at a time (:func:`traceinsight.analysis.results.from_columns`) are
the results their constructor makes, row by row; the reported gaps of a real trace are its
classified gaps as the constructor makes them."""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass

import pytest
from tracebuild import SAMPLES

from traceinsight.analysis import analyze
from traceinsight.analysis.results import IdleGap, from_columns
from traceinsight.load import load_trace
from traceinsight.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class _Sample:
    count: int
    name: str
    note: str | None = None
    share: float = 0.5


def _columns(rows: int, seed: int) -> list[list[object]]:
    pick = random.Random(seed)
    return [
        [pick.randrange(-(10**12), 10**12) for _ in range(rows)],
        [pick.choice(["launch", "sync", "dataloader", ""]) for _ in range(rows)],
        [pick.choice([None, "train.py:12", "model.py:7"]) for _ in range(rows)],
        [pick.random() for _ in range(rows)],
    ]


@pytest.mark.parametrize("rows", [0, 1, 7, 1000])
def test_records_made_by_column_equal_the_constructors(rows: int) -> None:
    columns = _columns(rows, seed=rows)
    made = from_columns(_Sample, columns)
    expected = tuple(_Sample(*row) for row in zip(*columns, strict=True))
    assert type(made) is tuple and len(made) == rows
    assert made == expected
    assert [hash(record) for record in made] == [hash(record) for record in expected]
    assert [repr(record) for record in made] == [repr(record) for record in expected]
    for record in made[:3]:
        with pytest.raises(dataclasses.FrozenInstanceError):
            record.count = 1  # type: ignore[misc]


def test_records_by_column_refuse_what_the_constructor_would_not_make_alike() -> None:
    columns = _columns(3, seed=1)
    with pytest.raises(TypeError, match="one column per field"):
        from_columns(_Sample, columns[:3])  # a default left out: the constructor would fill it
    with pytest.raises(ValueError, match="different lengths"):
        from_columns(_Sample, [*columns[:3], columns[3][:2]])

    @dataclass(frozen=True, slots=True)
    class Checked:
        count: int

        def __post_init__(self) -> None:
            if self.count < 0:
                raise ValueError("negative")

    with pytest.raises(TypeError, match="__post_init__"):
        from_columns(Checked, [[-1]])

    @dataclass(frozen=True)
    class Unslotted:
        count: int

    with pytest.raises(TypeError, match="slotted"):
        from_columns(Unslotted, [[1]])

    @dataclass(frozen=True, slots=True)
    class Derived:
        count: int
        total: int = dataclasses.field(init=False, default=0)

    with pytest.raises(TypeError, match="positional"):
        from_columns(Derived, [[1], [2]])  # the constructor takes no total

    @dataclass(frozen=True, slots=True, kw_only=True)
    class Named:
        count: int

    with pytest.raises(TypeError, match="positional"):
        from_columns(Named, [[1]])  # Named(1) is refused


def test_records_of_an_unslotted_subclass_of_a_slotted_class_are_refused() -> None:
    @dataclass(frozen=True)
    class Loose(_Sample):
        extra: int = 0

    with pytest.raises(TypeError, match="slotted"):
        from_columns(Loose, [*_columns(2, seed=4), [1, 2]])


def test_records_of_a_subclass_fill_the_base_classs_slots_too() -> None:
    @dataclass(frozen=True, slots=True)
    class Longer(_Sample):
        extra: int = 0

    columns = [*_columns(5, seed=3), list(range(5))]
    assert from_columns(Longer, columns) == tuple(Longer(*row) for row in zip(*columns, strict=True))


def test_the_reported_gaps_are_the_long_classified_gaps_longest_first() -> None:
    # An LLM decode trace: hundreds of reported gaps among thousands of shorter ones.
    trace = load_trace(SAMPLES / "b200_eager_stacks.json.gz")
    analysis = analyze(trace, every_gap=True)
    assert analysis.every_gap is not None
    min_ns = round(Thresholds().min_gap_us * 1000)
    rows = [row for row in analysis.every_gap.iter_rows(named=True) if row["duration"] >= min_ns]
    rows.sort(key=lambda row: (-row["duration"], row["device"], row["start"]))
    # The result's gaps: start from the trace's first event, a duration.
    origin = analysis.meta.origin_ns
    expected = tuple(
        IdleGap(
            device=row["device"],
            start_ns=row["start"] - origin,
            duration_ns=row["end"] - row["start"],
            cause_kind=row["cause_kind"],
            cause=row["cause"],
            source=row["source"],
            source_kind=row["source_kind"],
            sync_key=row["sync_key"],
            other_device=row["other_device"],
            source_line_kind=row["source_line_kind"],
            source_function=row["source_function"],
        )
        for row in rows
    )
    assert len(expected) > 500
    assert analysis.idle_gaps == expected
    # The typed result holds the analysis's gaps themselves (one model, declared once).
    from traceinsight.results import result_for

    assert result_for(trace, Thresholds()).idle_gaps == expected
