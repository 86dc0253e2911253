"""The production loaders equal the plain reference loader on every real sample, table by table
and end to end.

``load_trace`` takes the native scanner when it was built (see ``test_load_native.py``); here both
that default and the pure-Python loader (``TRACEINSIGHT_NATIVE=0``: msgspec) are held to the
reference.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from tracebuild import assert_same_trace

from traceinsight.analysis import analyze
from traceinsight.errors import TraceFormatError, TraceUnreadable
from traceinsight.load import (
    Trace,
    choose_loader,
    fallback,
    load_pure,
    load_trace,
    load_trace_reference,
    native,
)
from traceinsight.load.progress import terminal_progress
from traceinsight.load.source import open_trace
from traceinsight.load.tables import trace_for
from traceinsight.results import Report, result_of
from traceinsight.results.codec import document_of
from traceinsight.rules import evaluate

SAMPLES = Path(__file__).resolve().parent.parent / "sample_traces"
ALL_SAMPLES = sorted(SAMPLES.rglob("*.json*"))


def _report(trace: Trace) -> dict[str, object]:
    analysis = analyze(trace)
    return document_of(result_of(Report(analysis=analysis, findings=evaluate(analysis))))  # type: ignore[no-any-return]


@pytest.mark.parametrize("native", ["1", "0"], ids=["default", "pure-python"])
@pytest.mark.parametrize("path", ALL_SAMPLES, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_fast_path_equals_reference_tables_and_report(
    path: Path, native: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", native)
    reference = load_trace_reference(path)
    fast = load_trace(path)
    assert_same_trace(fast, reference)
    assert _report(fast) == _report(reference)


def test_the_loader_is_chosen_by_the_build_and_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "0")
    assert choose_loader() is load_pure
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "1")
    assert choose_loader() is (native.load_native if native.AVAILABLE else load_pure)


@pytest.mark.parametrize("form", ["gzip", "plain"])
def test_progress_grows_and_ends_once_with_all_events(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, form: str
) -> None:
    """Progress per run of the C scanner (1 MB runs here), gunzipped or mapped."""
    if not native.AVAILABLE:
        pytest.skip("the C scanner was not built here")
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", "1")
    monkeypatch.setattr(native, "BLOCK_BYTES", 1 << 20)
    path = SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz"
    if form == "plain":
        path = tmp_path / "plain.json"
        path.write_bytes(gzip.decompress((SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz").read_bytes()))
    calls: list[tuple[int, int, int]] = []
    trace = load_trace(path, progress=lambda done, total, events: calls.append((done, total, events)))
    size = path.stat().st_size
    assert len(calls) > 2
    assert [done for done, _, _ in calls] == sorted(done for done, _, _ in calls)
    assert all(done < size for done, _, _ in calls[:-1])
    assert [events for _, _, events in calls] == sorted(events for _, _, events in calls)
    assert calls[-1] == (size, size, trace.meta.event_count)


@pytest.mark.parametrize("path", ALL_SAMPLES, ids=lambda p: str(p.relative_to(SAMPLES)))
def test_the_pure_loader_reads_every_sample_with_msgspec(path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The typed msgspec decode, not the reference builder it falls back to for odd values, reads
    every real trace (else the pure-Python loader would be the slow reference in disguise)."""

    def refuse(*_: object) -> None:
        raise AssertionError("the reference's builder was used")

    reference = load_trace_reference(path)
    monkeypatch.setattr(fallback.reference, "build_tables", refuse)
    with open_trace(path) as source:
        document, part = load_pure(source, None)
    assert_same_trace(trace_for(path, document, part), reference)


def test_terminal_progress_is_silent_without_a_terminal() -> None:
    with terminal_progress() as progress:  # pytest captures stderr: not a TTY
        assert progress is None


def test_progress_callback_reports_bytes_and_events() -> None:
    path = SAMPLES / "a100_alexnet_cuda_sync.json.gz"
    calls: list[tuple[int, int, int]] = []
    trace = load_trace(path, progress=lambda done, total, events: calls.append((done, total, events)))
    assert calls[-1] == (path.stat().st_size, path.stat().st_size, trace.meta.event_count)


@pytest.mark.parametrize("native", ["1", "0"])
def test_truncated_gzip_is_reported_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", native)
    whole = (SAMPLES / "a100_alexnet_cuda_sync.json.gz").read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(whole[: len(whole) // 2])
    with pytest.raises(TraceUnreadable, match="gzip stream ends early"):
        load_trace(cut)


@pytest.mark.parametrize("native", ["1", "0"])
def test_truncated_json_is_reported_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, native: str
) -> None:
    monkeypatch.setenv("TRACEINSIGHT_NATIVE", native)
    text = gzip.decompress((SAMPLES / "a100_alexnet_cuda_sync.json.gz").read_bytes())
    cut = tmp_path / "cut.json"
    cut.write_bytes(text[: len(text) // 2])
    with pytest.raises(TraceFormatError, match="not valid JSON"):
        load_trace(cut)


def test_unusual_value_types_follow_the_reference(tmp_path: Path) -> None:
    path = tmp_path / "odd.json"
    path.write_text(
        '{"traceEvents": ['
        '{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": "stream 7", "ts": 10, "dur": 2.0004,'
        ' "args": {"correlation": 5.0, "device": "0", "External id": "0x1f"}},'
        '{"ph": "X", "cat": "cpu_op", "name": 3, "pid": 1, "tid": 1, "ts": 9.9995, "dur": -1},'
        '{"ph": "X", "cat": null, "name": "x", "pid": 1, "tid": 1, "ts": "late"},'
        '{"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1,'
        ' "ts": 9, "dur": 1,'
        ' "args": {"correlation": 5, "External id": true}}'
        "]}"
    )
    assert_same_trace(load_trace(path), load_trace_reference(path))
    assert load_trace(path).gpu.get_column("stream").to_list() == [7]
