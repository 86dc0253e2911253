"""The JSON renderer writes long lists of flat rows itself: byte for byte what json.dumps writes."""

from __future__ import annotations

import dataclasses
import json
import random
from pathlib import Path
from typing import Any

import pytest

from traceinsight.analysis.results import IdleGap
from traceinsight.load import load_trace
from traceinsight.render import json_report
from traceinsight.render.json_report import JsonRenderer, report_dict
from traceinsight.report import Report, report_for

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
def test_rendered_json_is_what_json_dumps_writes(seed: int, monkeypatch: pytest.MonkeyPatch) -> None:
    rng = random.Random(seed)
    document = _document(rng, rng.choice([0, 1, 101, 500]))
    expected = json.dumps(document, indent=2, ensure_ascii=False) + "\n"
    monkeypatch.setattr(json_report, "report_dict", lambda report, **_: json.loads(json.dumps(document)))
    monkeypatch.setattr(json_report, "_gap_rows", lambda report: None)  # the rows of a real report
    assert JsonRenderer().render(None) == expected  # type: ignore[arg-type]
    # the fast path ran where it should, and only there
    assert (json_report._flat_rows(document["idle_gaps"]) is not None) == bool(document["idle_gaps"])
    assert json_report._flat_rows(document["nested"]) is None


@pytest.mark.parametrize("value", [float("nan"), float("inf"), float("-inf")])
@pytest.mark.parametrize("rows", [1, 101])
def test_a_non_finite_number_is_never_written(
    value: float, rows: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The JSON is strict: ``NaN`` and ``Infinity``, which json.dumps writes and strict parsers
    refuse, are a bug raised, never written (by the fast rows path nor by the standard encoder)."""
    document = {"schema": 2, "idle_gaps": [{"device": 0, "start_us": 1.0} for _ in range(rows)]}
    document["idle_gaps"][-1]["start_us"] = value
    monkeypatch.setattr(json_report, "report_dict", lambda report, **_: document)
    monkeypatch.setattr(json_report, "_gap_rows", lambda report: None)
    with pytest.raises(ValueError, match="not JSON compliant"):
        JsonRenderer().render(None)  # type: ignore[arg-type]


def test_gap_times_are_written_as_json_dumps_writes_their_floats() -> None:
    """A time's text from integer arithmetic is what ``json.dumps`` writes of ``_us(ns)`` (the
    float), up to 10^15 ns from the trace's start either way."""
    rng = random.Random(7)
    limit = json_report._EXACT_NS - 1
    values = [0, 1, -1, 9, 10, 99, 100, 999, 1000, 1001, 1010, 1100, 1500, -500, -999, -1000, -1001]
    values += [limit, -limit, 10**12 + 1, 123_456_789_012_345]
    values += [rng.randrange(-limit, limit) for _ in range(3000)] + [
        rng.randrange(-(10**7), 10**7) for _ in range(3000)
    ]
    texts = json_report._us_texts(values).to_list()
    assert texts == [json.dumps(json_report._us(value)) for value in values]


def _with_gaps(report: Report, gaps: list[IdleGap]) -> Report:
    return dataclasses.replace(report, analysis=dataclasses.replace(report.analysis, idle_gaps=tuple(gaps)))


@pytest.fixture(scope="module")
def real_report() -> Report:
    return report_for(load_trace(SAMPLES / "b200_eager_stacks.json.gz"))


def test_gap_rows_of_a_real_trace_are_what_json_dumps_writes(real_report: Report) -> None:
    assert len(real_report.analysis.idle_gaps) > 100
    assert json_report._gap_rows(real_report) is not None
    expected = json.dumps(report_dict(real_report), indent=2, ensure_ascii=False) + "\n"
    assert JsonRenderer().render(real_report) == expected


@pytest.mark.parametrize("far", [False, True])
def test_gap_rows_with_odd_names_and_far_times_are_what_json_dumps_writes(
    far: bool, real_report: Report
) -> None:
    """Names with quotes, controls and non-ASCII, sources missing, times before the trace's start;
    a gap 10^15 ns away sends the rows back to the general writer, with the same text."""
    rng = random.Random(3)
    origin = real_report.analysis.meta.origin_ns
    names = [s for s in TRICKY if isinstance(s, str)]
    gaps = []
    for _ in range(300):
        start = origin + rng.randrange(-(10**6), 10**10)
        gaps.append(
            IdleGap(
                device=rng.choice([0, 1, 7]),
                start_ns=start,
                end_ns=start + rng.randrange(0, 10**9),
                cause_kind=rng.choice(names),
                cause=rng.choice(names),
                source=rng.choice([None, *names]),
                pid=None,
                tid=None,
                source_kind=rng.choice([None, "user", "library"]),
            )
        )
    if far:
        gaps[150] = dataclasses.replace(gaps[150], end_ns=gaps[150].start_ns + json_report._EXACT_NS)
    report = _with_gaps(real_report, gaps)
    assert (json_report._gap_rows(report) is None) == far
    assert (
        JsonRenderer().render(report) == json.dumps(report_dict(report), indent=2, ensure_ascii=False) + "\n"
    )
