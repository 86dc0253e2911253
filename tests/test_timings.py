"""The opt-in timing hook the benchmarks read (one stderr line per stage, nothing without it), and
when the HTML renderer is prepared beside the stages."""

from __future__ import annotations

import gzip
import io
import re
import time
from pathlib import Path

import pytest
from rich.console import Console
from tracebuild import SAMPLES

import traceinsight.api
import traceinsight.commands.common
from traceinsight.commands.common import analyze_and_write
from traceinsight.commands.options import Reading, Wanted
from traceinsight.errors import TraceFormatError

LINE = re.compile(r"^traceinsight timing: (\S+) ([0-9]+\.[0-9]{3}) s$")


def _run(tmp_path: Path) -> None:
    analyze_and_write(
        SAMPLES / "a100_triton.json.gz",
        Wanted(html=tmp_path / "r.html", json=str(tmp_path / "r.json"), markdown=str(tmp_path / "r.md")),
        Reading(),
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


@pytest.mark.parametrize("trace", ["a100_triton.json.gz", "truncated"])
def test_the_renderer_is_prepared_after_the_trace_loaded(
    trace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The renderer's imports start once the load is done (they took a core from the load), and a
    trace that does not load costs none of them."""
    events: list[str] = []
    load_trace = traceinsight.api.load_trace

    def load(*args: object, **kwargs: object) -> object:
        events.append("load starts")
        try:
            return load_trace(*args, **kwargs)  # type: ignore[arg-type]
        finally:
            events.append("load ends")

    monkeypatch.setattr(traceinsight.api, "load_trace", load)
    monkeypatch.setattr(
        traceinsight.commands.common, "prepare_beside", lambda module: events.append("prepare")
    )
    path = SAMPLES / trace
    if trace == "truncated":
        path = tmp_path / "truncated.json"
        path.write_bytes(gzip.decompress((SAMPLES / "a100_triton.json.gz").read_bytes())[:5000])
        with pytest.raises(TraceFormatError):
            analyze_and_write(
                path, Wanted(html=tmp_path / "r.html"), Reading(), console=Console(file=io.StringIO())
            )
        assert events == ["load starts", "load ends"]
        return
    analyze_and_write(path, Wanted(html=tmp_path / "r.html"), Reading(), console=Console(file=io.StringIO()))
    deadline = time.monotonic() + 10  # the stand-in runs in the thread the command started
    while "prepare" not in events and time.monotonic() < deadline:
        time.sleep(0.01)
    assert events == ["load starts", "load ends", "prepare"]
