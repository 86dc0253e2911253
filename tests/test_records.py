"""The result types' kind (:mod:`traceinsight.model`): what a frozen dataclass gave them, they
keep (equality, hashing and repr without the live-only fields, the codec's metadata, ``replace``
running ``__post_init__`` again, plain data, pickling); records made a column at a time
(:func:`traceinsight.analysis.results.from_columns`) are the results their constructor makes, row by
row; the reported gaps of a real trace are its classified gaps as the constructor makes them."""

from __future__ import annotations

import dataclasses
import pickle
import random
from unittest import mock

import msgspec
import pytest
from rich.pretty import pretty_repr
from tracebuild import SAMPLES

import traceinsight
from traceinsight.analysis import analyze
from traceinsight.analysis.results import IdleGap, from_columns
from traceinsight.load import load_trace
from traceinsight.model import Model, as_dict, field, fields_of, replace
from traceinsight.thresholds import Thresholds


class _Sample(Model, frozen=True):
    count: int
    name: str
    note: str | None = None
    share: float = 0.5


@dataclasses.dataclass(frozen=True)
class _Plain:
    """The same fields as a frozen dataclass: what equality, hashing and repr must agree with."""

    count: int
    name: str
    note: str | None = None
    share: float = 0.5


class _Live(Model, frozen=True, kw_only=True):
    count: int
    parts: tuple[_Sample, ...] = ()
    by_name: dict[str, int] = field(default_factory=dict, metadata={"key": "names"})
    seen_ns: int = field(default=0, compare=False, repr=False, metadata={"local": True})


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
        with pytest.raises(AttributeError):
            record.count = 1  # type: ignore[misc]


def test_records_by_column_refuse_what_the_constructor_would_not_make_alike() -> None:
    columns = _columns(3, seed=1)
    with pytest.raises(TypeError, match="one column per field"):
        from_columns(_Sample, columns[:3])  # a default left out: the constructor would fill it
    with pytest.raises(ValueError, match="different lengths"):
        from_columns(_Sample, [*columns[:3], columns[3][:2]])


def test_a_result_type_compares_hashes_and_shows_itself_as_a_frozen_dataclass_would() -> None:
    rows = list(
        zip(*_columns(50, seed=9), strict=True)
    )  # (no NaN: 3.13's dataclasses compare it unlike 3.12's)
    for row, other in zip(rows, [*rows[1:], rows[0]], strict=True):
        ours, theirs = _Sample(*row), _Plain(*row)
        assert repr(ours) == repr(theirs).replace("_Plain", "_Sample")
        assert (ours == _Sample(*row)) == (theirs == _Plain(*row))
        assert (ours == _Sample(*other)) == (theirs == _Plain(*other))
        if ours == _Sample(*row):
            assert hash(ours) == hash(_Sample(*row))
    assert _Sample(1, "x") != _Plain(1, "x")
    assert (
        _Live(count=1) == mock.ANY and _Live(count=1) == mock.ANY
    )  # another type decides, as with dataclasses


def test_a_live_only_field_is_left_out_of_equality_hashing_and_repr_and_kept_in_the_metadata() -> None:
    one = _Live(count=2, parts=(_Sample(1, "a"),), seen_ns=5)
    other = _Live(count=2, parts=(_Sample(1, "a"),), seen_ns=9)
    assert one == other and one.seen_ns == 5
    assert one != replace(one, count=3)
    assert (
        repr(one) == "_Live(count=2, parts=(_Sample(count=1, name='a', note=None, share=0.5),), by_name={})"
    )
    unhashable = one.by_name  # a dict field: as a dataclass, the result cannot be hashed
    assert isinstance(unhashable, dict)
    with pytest.raises(TypeError, match="unhashable"):
        hash(one)
    declared = {item.name: item for item in fields_of(_Live)}
    assert [item.name for item in fields_of(one)] == ["count", "parts", "by_name", "seen_ns"]
    assert declared["seen_ns"].metadata == {"local": True} and not declared["seen_ns"].compare
    assert declared["by_name"].metadata == {"key": "names"} and declared["by_name"].has_default
    assert not declared["count"].has_default and declared["parts"].default == ()
    assert _Live(count=1).by_name is not _Live(count=1).by_name  # a factory, called each time
    with pytest.raises(ValueError, match="not both"):
        field(default=0, default_factory=int)


def test_rich_shows_what_repr_shows() -> None:
    """rich draws a Struct from its ``__rich_repr__`` (every field): a live-only field stays out of
    it too, and a class's own one-line ``repr`` (a result's) is what rich shows of it."""
    one = _Live(count=2, parts=(_Sample(1, "a"),), seen_ns=5)
    assert pretty_repr(one) == pretty_repr(_Live(count=2, parts=(_Sample(1, "a"),), seen_ns=6))
    assert "seen_ns" not in pretty_repr(one) and "count=2" in pretty_repr(one)
    result = traceinsight.analyze(SAMPLES / "a100_triton.json.gz")
    assert pretty_repr(result) == repr(result) and len(repr(result)) < 200


def test_a_subclass_of_a_frozen_result_type_hashes_without_its_live_only_fields() -> None:
    class Base(Model, frozen=True):
        count: int
        seen_ns: int = field(default=0, compare=False)

    class Longer(Base):  # frozen as its base is
        extra: int = 0

    assert Longer(1, 1) == Longer(1, 2) and hash(Longer(1, 1)) == hash(Longer(1, 2))
    with pytest.raises(AttributeError):
        Longer(1).count = 2  # type: ignore[misc]


def test_replace_runs_the_checks_again_and_plain_data_and_pickling_keep_every_field() -> None:
    class Checked(Model, frozen=True):
        count: int

        def __post_init__(self) -> None:
            if self.count < 0:
                raise ValueError("negative")

    with pytest.raises(ValueError, match="negative"):
        replace(Checked(1), count=-1)
    one = _Live(count=2, parts=(_Sample(1, "a"),), by_name={"a": 1}, seen_ns=5)
    assert as_dict(one) == {
        "count": 2,
        "parts": ({"count": 1, "name": "a", "note": None, "share": 0.5},),
        "by_name": {"a": 1},
        "seen_ns": 5,
    }
    assert as_dict(one)["by_name"] is not one.by_name
    again = pickle.loads(pickle.dumps(one))
    assert again == one and again.seen_ns == 5
    with pytest.raises(AttributeError):
        one.count = 3  # type: ignore[misc]
    assert isinstance(one, msgspec.Struct)


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
