"""The opt-in timing hook the benchmarks read: one stderr line per stage, nothing without it."""

from __future__ import annotations

import io
import re
from pathlib import Path

import pytest
from rich.console import Console
from tracebuild import SAMPLES

from traceinsight.pipeline import analyze_and_write

LINE = re.compile(r"^traceinsight timing: (\S+) ([0-9]+\.[0-9]{3}) s$")


def _run(tmp_path: Path) -> None:
    analyze_and_write(
        SAMPLES / "a100_triton.json.gz",
        html=tmp_path / "r.html",
        json_out=str(tmp_path / "r.json"),
        markdown=str(tmp_path / "r.md"),
        console=Console(file=io.StringIO()),
    )


def test_timings_name_every_stage_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("TRACEINSIGHT_TIMINGS", "1")
    _run(tmp_path)
    lines = capsys.readouterr().err.splitlines()
    matched = [LINE.match(line) for line in lines]
    assert all(matched), lines
    assert [m[1] for m in matched if m] == ["load", "analysis", "JSON", "Markdown", "HTML", "terminal"]


def test_no_timings_without_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("TRACEINSIGHT_TIMINGS", raising=False)
    _run(tmp_path)
    assert "timing" not in capsys.readouterr().err
