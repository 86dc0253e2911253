"""A result's JSON writes long lists of flat rows itself: byte for byte what json.dumps writes."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import pytest

from traceinsight.load import load_trace
from traceinsight.model import replace
from traceinsight.results import Result, result_for, writer
from traceinsight.results import trace as contract
from traceinsight.results.codec import document_of, us

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"

TRICKY: list[Any] = [
    None, True, False, 0, -1, 2**70, 1.5, -0.0, 0.0, 1e16, 1e-7, 123456.789,
    "", "plain", "ünïcødé ✓", 'quote " and \\ back',
    "control \x00\x01\n\t\x1f", "\u2028 line separator", "a, b: c",
]  # fmt: skip


def _document(rng: random.Random, rows: int) -> dict[str, Any]:
    keys = ["device", "start_us", "cause", "source", "ünï key", 'k"ey']
    return {
        "schema": 2,
        "trace": {"name": "x.json"},
        "idle_gaps": [{key: rng.choice(TRICKY) for key in keys} for _ in range(rows)],
        "nested": [{"a": {"b": 1}} for _ in range(rows)],  # not flat: the standard encoder writes it
        "numbers": list(range(rows)),  # not objects
        "empty": [],
    }


@pytest.mark.parametrize("seed", range(10))
def test_spliced_json_is_what_json_dumps_writes(seed: int) -> None:
    rng = random.Random(seed)
    document = _document(rng, rng.choice([0, 1, 101, 500]))
    expected = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    assert writer.spliced_json(json.loads(json.dumps(document)), {}) == expected
    # the fast path ran where it should, and only there
    assert (writer._flat_rows(document["idle_gaps"]) is not None) == bool(document["idle_gaps"])
    assert writer._flat_rows(document["nested"]) is None


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("rows", [1, 101])
def test_a_non_finite_number_is_never_written(value: float, rows: int) -> None:
    """The JSON is strict: ``NaN`` and ``Infinity``, which json.dumps writes and strict parsers
    refuse, are a bug raised, never written (by the fast rows path nor by the standard encoder)."""
    document = {"schema": 2, "idle_gaps": [{"device": 0, "start_us": 1.0} for _ in range(rows)]}
    document["idle_gaps"][-1]["start_us"] = value
    with pytest.raises(ValueError, match="not JSON compliant"):
        writer.spliced_json(document, {})


def test_gap_times_are_written_as_json_dumps_writes_their_floats() -> None:
    """A time's text from integer arithmetic is what ``json.dumps`` writes of ``us(ns)`` (the
    float), up to 10^15 ns from the trace's start either way."""
    rng = random.Random(7)
    limit = writer._EXACT_NS - 1
    values = [0, 1, -1, 9, 10, 99, 100, 999, 1000, 1001, 1010, 1100, 1500, -500, -999, -1000, -1001]
    values += [limit, -limit, 10**12 + 1, 123_456_789_012_345]
    values += [rng.randrange(-limit, limit) for _ in range(3000)] + [
        rng.randrange(-(10**7), 10**7) for _ in range(3000)
    ]
    texts = writer._us_texts(values).to_list()
    assert texts == [json.dumps(us(value)) for value in values]


@pytest.fixture(scope="module")
def real_result() -> Result:
    return result_for(load_trace(SAMPLES / "b200_eager_stacks.json.gz"))


def _dumped(result: Result) -> str:
    return json.dumps(document_of(result), indent=2, ensure_ascii=False) + "\n"


def test_gap_rows_of_a_real_trace_are_what_json_dumps_writes(real_result: Result) -> None:
    assert len(real_result.idle_gaps) > 100
    assert writer._gap_rows(real_result.idle_gaps) is not None
    assert real_result.to_json() == _dumped(real_result)


@pytest.mark.parametrize("far", [False, True])
def test_gap_rows_with_odd_names_and_far_times_are_what_json_dumps_writes(
    far: bool, real_result: Result
) -> None:
    """Names with quotes, controls and non-ASCII, sources missing, times before the trace's start;
    a gap 10^15 ns away sends the rows back to the general writer, with the same text."""
    rng = random.Random(3)
    names = [s for s in TRICKY if isinstance(s, str)]
    gaps = []
    for _ in range(300):
        gaps.append(
            contract.IdleGap(
                device=rng.choice([0, 1, 7]),
                start_ns=rng.randrange(-(10**6), 10**10),
                duration_ns=rng.randrange(0, 10**9),
                cause_kind=rng.choice(names),
                cause=rng.choice(names),
                source=rng.choice([None, *names]),
                source_kind=rng.choice([None, "user", "library"]),
            )
        )
    if far:
        gaps[150] = replace(gaps[150], duration_ns=writer._EXACT_NS)
    result = real_result.replace(idle_gaps=tuple(gaps))
    assert (writer._gap_rows(result.idle_gaps) is None) == far
    assert result.to_json() == _dumped(result)
