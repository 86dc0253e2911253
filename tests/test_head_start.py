"""The scanner's head start (:mod:`traceinsight.load.head_start`): scans begun before the loader
runs are taken only where they are exactly the scans it would make, so the tables are the
reference loader's with or without one; anything unexpected means no head start, never an error.

Real samples (gunzipped: a head start is for plain files), cut into runs of 64 kB on both sides
so that a ~1 MB trace has many runs and the head start's are a few of them.
"""

from __future__ import annotations

import gzip
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from tracebuild import assert_same_trace
from typer.testing import CliRunner

from traceinsight.errors import TraceFormatError
from traceinsight.load import head_start, load_trace, load_trace_reference, native, scanner
from traceinsight.load.head_start import HeadStart, begin

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
RUN_BYTES = 64 << 10

needs_native = pytest.mark.skipif(not native.AVAILABLE, reason="the C scanner was not built")
pytestmark = needs_native


def _plain(tmp_path: Path, sample: str, name: str = "trace.json") -> Path:
    path = tmp_path / name
    path.write_bytes(gzip.decompress((SAMPLES / sample).read_bytes()))
    return path


class Taken:
    """What the loader asked the head start for: (begin, end, whether it had that scan)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.asked: list[tuple[int, int, bool]] = []
        take = HeadStart.take

        def spy(start: HeadStart, begin: int, end: int, *rest: Any) -> Any:
            future = take(start, begin, end, *rest)
            self.asked.append((begin, end, future is not None))
            return future

        monkeypatch.setattr(HeadStart, "take", spy)

    @property
    def taken(self) -> int:
        return sum(had for _, _, had in self.asked)


@pytest.fixture
def small_runs(monkeypatch: pytest.MonkeyPatch) -> Iterator[Taken]:
    """Any file started; runs of ``RUN_BYTES`` on both sides (so they are cut alike)."""
    monkeypatch.setattr(head_start, "MIN_BYTES", 0)
    monkeypatch.setattr(head_start, "BLOCK_BYTES", RUN_BYTES // 2)
    monkeypatch.setattr(native, "BLOCK_BYTES", RUN_BYTES // 2)
    yield Taken(monkeypatch)


@pytest.mark.parametrize(
    "sample",
    [
        "h100_bert_small_stacks.json.gz",
        "b200_eager_stacks.json.gz",
        "v100_resnet50_workers0.pt.trace.json.gz",
    ],
)
def test_the_head_start_s_scans_are_taken_and_the_tables_are_the_reference_s(
    tmp_path: Path, small_runs: Taken, sample: str
) -> None:
    path = _plain(tmp_path, sample)
    started = begin(path)
    assert started is not None
    loaded = load_trace(path, head_start=started)
    runs = len(small_runs.asked)
    assert runs > head_start.RUNS  # the loader scanned the rest itself
    assert [had for _, _, had in small_runs.asked] == [True] * head_start.RUNS + [False] * (
        runs - head_start.RUNS
    )
    # the runs asked for tile the events array: each begins where the previous ended
    assert all(a[1] == b[0] for a, b in zip(small_runs.asked, small_runs.asked[1:], strict=False))
    assert small_runs.asked[-1][1] == path.stat().st_size  # the last run goes to the end
    assert_same_trace(loaded, load_trace_reference(path))


def test_scans_cut_otherwise_are_not_taken(
    tmp_path: Path, small_runs: Taken, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The loader cuts runs half as long again: no head-start scan is the one it wants."""
    monkeypatch.setattr(native, "BLOCK_BYTES", RUN_BYTES)
    path = _plain(tmp_path, "h100_bert_small_stacks.json.gz")
    started = begin(path)
    assert started is not None
    loaded = load_trace(path, head_start=started)
    assert small_runs.asked and small_runs.taken == 0
    assert_same_trace(loaded, load_trace_reference(path))


@pytest.mark.parametrize("how", ["replaced", "rewritten in place"])
def test_a_file_changed_after_the_head_start_is_read_afresh(
    tmp_path: Path, small_runs: Taken, how: str
) -> None:
    """Another file at the path (a new inode), or the same file rewritten (its modification time):
    the mapping is not adopted, nothing is taken, the tables are the new text's."""
    path = _plain(tmp_path, "h100_bert_small_stacks.json.gz")
    started = begin(path)
    assert started is not None
    other = _plain(tmp_path, "b200_eager_stacks.json.gz", "other.json")
    if how == "replaced":
        os.replace(other, path)
    else:
        stat = path.stat()
        with path.open("r+b") as file:  # same inode
            file.truncate(0)
            file.write(other.read_bytes())
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    loaded = load_trace(path, head_start=started)
    assert small_runs.taken == 0
    assert_same_trace(loaded, load_trace_reference(path))


def test_an_error_in_a_head_start_run_is_the_same_one_line_error(tmp_path: Path, small_runs: Taken) -> None:
    """Invalid JSON in the second run: the message (and its byte offset) is the loader's own."""
    path = _plain(tmp_path, "h100_bert_small_stacks.json.gz")
    text = bytearray(path.read_bytes())
    at = text.index(b'"ph"', RUN_BYTES + RUN_BYTES // 2)
    text[at] = ord("}")
    path.write_bytes(bytes(text))
    with pytest.raises(TraceFormatError) as plain:
        load_trace(path)
    started = begin(path)
    assert started is not None
    with pytest.raises(TraceFormatError) as early:
        load_trace(path, head_start=started)
    # the bad run was one of the head start's
    assert any(had and begin <= at < end for begin, end, had in small_runs.asked)
    assert str(early.value) == str(plain.value) and early.value.at == plain.value.at


def test_no_head_start_where_it_does_not_apply(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Small, gzip, events not each on a line of their own, not a trace, a folder, a FIFO, a missing
    path: None, at once (a FIFO is never opened: nothing waits for a writer)."""
    small = _plain(tmp_path, "h100_bert_small_stacks.json.gz", "small.json")
    assert small.stat().st_size < head_start.MIN_BYTES
    assert begin(small) is None
    monkeypatch.setattr(head_start, "MIN_BYTES", 0)
    assert begin(small) is not None  # the others are refused for what they are, not their size
    (tmp_path / "trace.json.gz").write_bytes(gzip.compress(small.read_bytes()))
    assert begin(tmp_path / "trace.json.gz") is None
    (tmp_path / "one_line.json").write_text('{"traceEvents": [{"ph": "X", "ts": 1, "dur": 2}]}')
    assert begin(tmp_path / "one_line.json") is None
    (tmp_path / "not.json").write_bytes(b"\x00\x01 not a trace" * 1000)
    assert begin(tmp_path / "not.json") is None
    assert begin(tmp_path) is None
    assert begin(tmp_path / "absent.json") is None
    if hasattr(os, "mkfifo"):
        os.mkfifo(tmp_path / "fifo.json")
        outcome: list[object] = []
        thread = threading.Thread(target=lambda: outcome.append(begin(tmp_path / "fifo.json")), daemon=True)
        thread.start()
        thread.join(timeout=10)
        assert outcome == [None]
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "0")  # the pure-Python loader asked for: no scans
    assert begin(small) is None


def test_analyze_scans_ahead_and_writes_the_same_result(tmp_path: Path, small_runs: Taken) -> None:
    """The command starts the scans before it loads its libraries and hands them to the load: the
    JSON is the one written without a head start."""
    from traceinsight.commands import app

    path = _plain(tmp_path, "b200_eager_stacks.json.gz")
    runner = CliRunner()
    early = runner.invoke(app, ["analyze", str(path), "--no-html", "--json", str(tmp_path / "early.json")])
    assert early.exit_code == 0, early.output
    assert small_runs.taken == head_start.RUNS
    head_start.MIN_BYTES = 1 << 62  # type: ignore[misc]  # (undone by the fixture's monkeypatch)
    plain = runner.invoke(app, ["analyze", str(path), "--no-html", "--json", str(tmp_path / "plain.json")])
    assert plain.exit_code == 0, plain.output
    assert small_runs.taken == head_start.RUNS  # none more
    assert (tmp_path / "early.json").read_text() == (tmp_path / "plain.json").read_text()


class _SlowScanner:
    """The C scanner, each scan of the head start's made 0.1 s longer: its later scans are still
    queued when the loader has taken them all."""

    def __init__(self, scanner: Any) -> None:
        self._scanner = scanner
        self.events_start = scanner.events_start

    def scan(self, *args: Any) -> Any:
        time.sleep(0.1)
        return self._scanner.scan(*args)


def test_scans_taken_before_they_ran_are_not_dropped(
    tmp_path: Path, small_runs: Taken, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once the loader has taken every scan, the head start lets go of the rest of itself: the
    scans it handed over must run all the same (a cancelled one was a CancelledError)."""
    monkeypatch.setattr(head_start, "C_SCANNER", _SlowScanner(scanner.C_SCANNER))
    path = _plain(tmp_path, "h100_bert_small_stacks.json.gz")
    started = begin(path)
    assert started is not None
    loaded = load_trace(path, head_start=started)
    assert small_runs.taken == head_start.RUNS
    assert_same_trace(loaded, load_trace_reference(path))


def test_a_cut_that_was_not_between_events_is_read_again_without_it(
    tmp_path: Path, small_runs: Taken, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events one after another on a line, each holding a list whose item starts a line indented
    like an event: the cuts fall inside events, the loader finds out from the first runs (the
    head start's) and reads the file again one scan after another, the tables the reference's."""
    events = [
        f'{{"ph": "X", "cat": "kernel", "name": "k{i % 7}", "pid": 1, "tid": 1, "ts": {1000 + 10 * i}, '
        f'"dur": 2, "args": {{"list": [\n  {{"x": 1}}], "External id": {i}}}}}'
        for i in range(3000)
    ]
    path = tmp_path / "trace.json"
    path.write_text('{"traceEvents": [\n  ' + ", ".join(events) + "\n]}")
    assert path.stat().st_size > 4 * RUN_BYTES
    started = begin(path)
    assert started is not None
    loads: list[tuple[int, bool]] = []
    load = native._load

    def spy(source: Any, progress: Any, workers: int, head: HeadStart | None) -> Any:
        loads.append((workers, head is not None))
        return load(source, progress, workers, head)

    monkeypatch.setattr(native, "_load", spy)
    loaded = load_trace(path, head_start=started)
    assert small_runs.taken >= 1
    assert loads == [(native.SCAN_THREADS, True), (1, False)]  # cut, then one scan after another
    assert_same_trace(loaded, load_trace_reference(path))
