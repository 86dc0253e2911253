"""The JSON renderer writes long lists of flat rows itself: byte for byte what json.dumps writes."""

from __future__ import annotations

import json
import random
from typing import Any

import pytest

from traceinsight.render import json_report
from traceinsight.render.json_report import JsonRenderer

TRICKY: list[Any] = [
    None, True, False, 0, -1, 2**70, 1.5, -0.0, 0.0, 1e16, 1e-7, 123456.789,
    float("nan"), float("inf"), float("-inf"), "", "plain", "ünïcødé ✓", 'quote " and \\ back',
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
    monkeypatch.setattr(json_report, "report_dict", lambda report: json.loads(json.dumps(document)))
    assert JsonRenderer().render(None) == expected  # type: ignore[arg-type]
    # the fast path ran where it should, and only there
    assert (json_report._flat_rows(document["idle_gaps"]) is not None) == bool(document["idle_gaps"])
    assert json_report._flat_rows(document["nested"]) is None
