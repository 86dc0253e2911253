"""Shapes that look like something else (issue 29, item 4): each recognised for what it is.

Hand-built traces modelled on real ones (the structure of HTA's MTIA test traces, TraceLens's vLLM
capture trace), run through the CLI into every output; the figures a report must show are computed
here from the raw events.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from tracebuild import PID, TID, annotation, cpu_op, launch, memcpy, read_events, runtime, write_trace
from typer.testing import CliRunner

from traceinsight.commands import app

runner = CliRunner()


def _outputs(path: Path, tmp_path: Path) -> tuple[str, dict[str, Any], str, str]:
    """The terminal summary, the JSON, the HTML page and the Markdown of ``analyze path``."""
    out = tmp_path / "out"
    out.mkdir(exist_ok=True)
    result = runner.invoke(
        app,
        ["analyze", str(path), "--json", str(out / "r.json"), "-o", str(out / "r.html"), "--markdown",
         str(out / "r.md"), "--force"],
        env={"COLUMNS": "200"},
        catch_exceptions=False,
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    return (
        result.stdout,
        json.loads((out / "r.json").read_text()),
        (out / "r.html").read_text(),
        (out / "r.md").read_text(),
    )


# --- an accelerator this tool cannot read ------------------------------------------------------------

MTIA = 17


def _mtia_event(cat: str, name: str, ts: float, dur: float, **args: Any) -> dict[str, Any]:
    on_device = cat == "mtia_ccp_events"
    return {
        "ph": "X",
        "cat": cat,
        "name": name,
        "pid": MTIA if on_device else PID,
        "tid": 3774 if on_device else TID,
        "ts": ts,
        "dur": dur,
        "args": args,
    }


def _mtia_trace(path: Path) -> Path:
    """Three inference steps on an MTIA card, as Kineto's MTIA profilers write them: device work as
    ``mtia_ccp_events`` on the "MTIA 17" row (streams as threads), runtime calls as ``mtia_runtime``
    on the host, ``.item()`` each step (which waits on the MTIA), no CUDA activity at all."""
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": MTIA, "tid": 0, "args": {"name": f"MTIA {MTIA}"}},
        {"ph": "M", "name": "process_labels", "pid": MTIA, "tid": 0, "args": {"labels": f"MTIA {MTIA}"}},
        {"ph": "M", "name": "thread_name", "pid": MTIA, "tid": 3774, "args": {"name": "Stream 108"}},
    ]
    for step in range(3):
        t = 1_000.0 + step * 10_000
        correlation = 21_600_000 + step * 10
        events += [
            annotation(f"ProfilerStep#{step}", t, 9_000),
            cpu_op("aten::linear", t + 100, 2_000),
            _mtia_event("mtia_runtime", "runFunction - job_prep_and_submit_for_execution", t + 200, 300,
                        correlation=correlation, device=MTIA),
            _mtia_event("mtia_ccp_events", "pe_exe", t + 600, 4_000, stream=108, column="0", row="0"),
            _mtia_event("mtia_ccp_events", "dma_request", t + 4_700, 6, stream=108,
                        direction="DEVICE_TO_HOST", size=4),
            cpu_op("aten::item", t + 2_200, 2_600),
            cpu_op("aten::_local_scalar_dense", t + 2_210, 2_580),
            _mtia_event("mtia_runtime", "synchronizeStream", t + 2_300, 2_450, correlation=correlation + 1,
                        device=MTIA, stream_id=108),
        ]  # fmt: skip
    return write_trace(
        path, events, deviceProperties=[{"id": MTIA, "name": "ARTEMIS", "runtimeMajorVersion": 1}]
    )


def test_an_mtia_trace_is_named_as_an_accelerator_trace_in_every_output(tmp_path: Path) -> None:
    """An MTIA trace was called "no GPU activity" (and, without deviceProperties, "this run had no
    GPU: only host (CPU) activity"), and its `.item()` a sync that "would" wait on a GPU. Every
    output says it is an MTIA trace this tool cannot read, with its event counts."""
    path = _mtia_trace(tmp_path / "mtia.json")
    _, raw = read_events(path)
    counts = Counter(e.get("cat") for e in raw)
    device, host = counts["mtia_ccp_events"], counts["mtia_runtime"]
    assert (device, host) == (6, 6)
    events = f"{device:,} mtia_ccp_events and {host:,} mtia_runtime events"
    terminal, report, page, markdown = _outputs(path, tmp_path)

    warning = next(w for w in report["warnings"] if w["kind"] == "unreadable-accelerator")
    assert (
        f"This is an MTIA accelerator trace ({events}), which traceinsight cannot read" in warning["message"]
    )
    assert "not a CPU-only run" in warning["message"]
    assert report["warnings"][0] == warning  # the first thing every output says
    flat = " ".join(terminal.split())
    assert f"This is an MTIA accelerator trace ({events})" in flat
    assert "MTIA accelerator trace" in page and events in page
    assert "MTIA accelerator trace" in markdown.replace("\\", "")
    for text in (flat, page, markdown.replace("\\", "")):
        assert "had no GPU" not in text and "only host (CPU) activity" not in text
    # `.item()` did wait here, on the MTIA: not a sync that "would" wait on a GPU
    assert not [f for f in report["findings"] if f["rule"] in {"latent-sync", "sync-in-forward"}]
    assert "Host syncs" not in flat  # its waits are MTIA calls: none could be counted


def test_an_mtia_trace_without_device_properties_is_not_a_run_without_a_gpu(tmp_path: Path) -> None:
    """HTA's MTIA training trace lists no deviceProperties (``[]``): the scorecard said "This run
    had no GPU: the profiler saw no CUDA device, so only host (CPU) activity was recorded"."""
    path = _mtia_trace(tmp_path / "mtia.json")
    document = json.loads(path.read_text())
    document["deviceProperties"] = []
    document["distributedInfo"] = {"backend": "mtia:hccl,cpu:gloo", "rank": 0, "world_size": 1}
    path.write_text(json.dumps(document))
    terminal, report, _, _ = _outputs(path, tmp_path)
    flat = " ".join(terminal.split())
    assert "had no GPU" not in flat and "only host (CPU) activity" not in flat
    assert "the accelerator here is MTIA" in flat
    assert report["warnings"][0]["kind"] == "unreadable-accelerator"


# --- CUDA graph capture ------------------------------------------------------------------------------


def _capture_trace(path: Path, dropped_outside: int = 0) -> Path:
    """vLLM capturing one CUDA graph at start-up, shaped like TraceLens's vllm_decode_full capture
    trace: inside ``capture_32_FULL``, an eager warm-up run (kernels that run, a device sync), then
    ``cudaStreamBeginCapture``, 420 kernel launches recorded into the graph (no kernel follows
    them), ``cudaStreamEndCapture``, the graph's instantiation, and one input copy and kernel after.
    ``dropped_outside``: launches after the capture whose kernels the profiler lost."""
    events: list[dict[str, Any]] = [annotation("capture_32_FULL", 600, 58_400)]
    for index in range(6):  # the warm-up run: real kernels
        events += launch(1_100 + index * 40, 1_180 + index * 40, 3)
    events.append(runtime("cudaDeviceSynchronize", 1_400, 30))
    events.append(runtime("cudaStreamBeginCapture", 2_800, 2.5))
    for index in range(420):
        t = 2_900 + index * 130
        events.append(cpu_op("aten::mm", t, 100))
        events.append(runtime("cudaLaunchKernel", t + 20, 8))  # recorded into the graph: no kernel
    events.append(runtime("cudaStreamEndCapture", 57_760, 6.5))
    events.append(runtime("cudaGraphInstantiateWithFlags", 57_814, 817))
    correlation = 900_000
    events.append(runtime("cudaMemcpyAsync", 58_897, 16.6, correlation=correlation))
    events.append(memcpy(58_922, 2.6, "Memcpy HtoD (Pinned -> Device)", correlation=correlation))
    events += launch(58_950, 58_969, 4)
    for index in range(dropped_outside):
        events.append(runtime("cudaLaunchKernel", 59_100 + index * 20, 8))
    events += launch(59_100 + dropped_outside * 20 + 20, 59_100 + dropped_outside * 20 + 40, 4)
    return write_trace(path, events)


def _raw_capture(path: Path) -> dict[str, Any]:
    """What the warning must say, from the raw events: the capture's host time, the trace's span,
    the launches between begin and end with no GPU activity of their correlation."""
    _, raw = read_events(path)
    timed = [e for e in raw if e.get("ph") == "X"]
    begin = next(e for e in timed if e["name"] == "cudaStreamBeginCapture")
    end = next(e for e in timed if e["name"] == "cudaStreamEndCapture")
    start_ns, end_ns = round(begin["ts"] * 1000), round((end["ts"] + end["dur"]) * 1000)
    ran = {e["args"]["correlation"] for e in timed if e["cat"] in ("kernel", "gpu_memcpy")}
    launches = [e for e in timed if e["name"] == "cudaLaunchKernel"]
    inside = [
        e for e in launches if start_ns <= e["ts"] * 1000 < end_ns and e["args"]["correlation"] not in ran
    ]
    first = min(round(e["ts"] * 1000) for e in timed)
    last = max(round((e["ts"] + e["dur"]) * 1000) for e in timed)
    gpu = sorted((round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in timed if e["cat"] in
                 ("kernel", "gpu_memcpy"))  # fmt: skip
    busy_before = max(stop for start, stop in gpu if start < start_ns)
    after = min(start for start, _ in gpu if start > start_ns)
    return {
        "captured_ns": end_ns - start_ns,
        "span_ns": last - first,
        "inside": len(inside),
        "launches": len(launches),
        "missing": sum(1 for e in launches if e["args"]["correlation"] not in ran),
        "gap": (busy_before, after),
    }


def test_a_graph_capture_is_named_with_its_share_and_gets_no_idle_card(tmp_path: Path) -> None:
    """The capture trace got a "high" low-gpu-utilization card (move the work into the Dataset) and
    "421 of 428 kernel launches have no kernel: the profiler dropped GPU events". Now: a warning
    with the capture's share of the trace and what to profile instead, its idle as graph capture,
    no dropped-events warning and no idle card."""
    from traceinsight.formatting import format_duration

    path = _capture_trace(tmp_path / "capture.json")
    expected = _raw_capture(path)
    assert expected["inside"] == 420
    terminal, report, _, markdown = _outputs(path, tmp_path)
    kinds = [w["kind"] for w in report["warnings"]]
    assert "dropped-gpu-events" not in kinds
    warning = next(w for w in report["warnings"] if w["kind"] == "graph-capture")
    share = expected["captured_ns"] / expected["span_ns"]
    assert (
        f"1 graph capture (in capture_32_FULL) takes {format_duration(expected['captured_ns'])} of the "
        f"{format_duration(expected['span_ns'])} recorded ({share:.0%})" in warning["message"]
    )
    assert f"The {expected['inside']:,} kernel launches inside went into a graph" in warning["message"]
    assert "profile the replay" in warning["advice"] and "cudaGraphLaunch" in warning["advice"]
    assert not [f for f in report["findings"] if f["rule"] == "low-gpu-utilization"]
    gap_start, gap_end = expected["gap"]
    gap = next(g for g in report["idle_gaps"] if g["cause_kind"] == "graph-capture")
    assert round(gap["duration_us"] * 1000) == gap_end - gap_start
    assert "graph capture" in " ".join(terminal.split()) and "graph capture" in markdown


def test_launches_without_kernels_outside_a_capture_still_count_as_dropped(tmp_path: Path) -> None:
    path = _capture_trace(tmp_path / "capture.json", dropped_outside=30)
    expected = _raw_capture(path)
    _, report, _, _ = _outputs(path, tmp_path)
    dropped = next(w for w in report["warnings"] if w["kind"] == "dropped-gpu-events")
    outside = expected["missing"] - expected["inside"]
    assert outside == 30
    assert dropped["message"].startswith(
        f"{outside} of {expected['launches'] - expected['inside']} kernel launches have no kernel"
    )


def test_captures_begun_before_the_trace_come_in_thread_start_and_end_order(tmp_path: Path) -> None:
    """Four end calls on a thread whose captures began before the trace: each capture runs from the
    thread's first recorded call to its end call, so all four start together; they come ordered
    by their ends (as the raw events give them), not in the order a hash left them (was:
    1032, 1045, 1011, 1019 µs)."""
    from traceinsight.analysis.capture import capture_windows
    from traceinsight.load import load_trace

    events = [runtime("cudaGetDevice", 990, 1, tid=300)]
    events += [
        runtime("cudaStreamEndCapture", 1000 + i * 2, d, tid=300) for i, d in enumerate([45, 30, 15, 5])
    ]
    windows = capture_windows(load_trace(write_trace(tmp_path / "t.json", events)))
    ends = sorted(round((e["ts"] + e["dur"]) * 1000) for e in events if e["name"] == "cudaStreamEndCapture")
    assert windows.rows() == [(PID, 300, 990_000, end) for end in ends]


@pytest.mark.parametrize("written", ["outer first", "inner first"])
def test_each_capture_is_named_by_its_own_innermost_range(tmp_path: Path, written: str) -> None:
    """Two captures begun before the trace (both start at the thread's first call), each inside
    ranges that start together: each is named by the innermost range holding it (the first to
    end), from the raw events, whichever the file holds first. Was: the two captures counted as one
    (they share a start), named by whichever range the sort left first."""
    from traceinsight.analysis.capture import graph_capture
    from traceinsight.load import load_trace

    calls = [runtime("cudaGetDevice", 990, 1, tid=300)]
    calls += [
        runtime("cudaStreamEndCapture", 1000, 11, tid=300),
        runtime("cudaStreamEndCapture", 1020, 25, tid=300),
    ]
    ranges = [annotation(f"capture_{n}", 980, dur, tid=300) for n, dur in ((1, 40), (2, 70), (3, 90))]
    events = calls + (ranges if written == "outer first" else ranges[::-1])
    captures = [(990, e["ts"] + e["dur"]) for e in calls[1:]]  # each from the thread's first call
    innermost = [
        min((r for r in ranges if r["ts"] <= start and r["ts"] + r["dur"] >= end), key=lambda r: r["dur"])
        for start, end in captures
    ]
    found = graph_capture(load_trace(write_trace(tmp_path / "t.json", events)))
    assert found is not None
    assert found.captures == 2
    assert found.ranges == tuple(sorted(r["name"] for r in innermost)) == ("capture_1", "capture_2")


# --- Kineto's 2026 output ----------------------------------------------------------------------------

SYNC_ROW_OFFSET = 1_000_000  # kineto PR 1356: Stream Sync events on tid = stream + 1,000,000


def _kineto_2026_trace(path: Path) -> Path:
    """Three steps as torch 2.12+ writes them (kineto PRs 1356, 1393, 1530): kernels on stream 7;
    each step's ``cudaStreamSynchronize`` mirrored by a ``Stream Sync`` event on the virtual row
    "stream 7 (sync)" (tid 1,000,007), whose CPU-side times overlap the still-running kernels; a
    ``record_function`` range drawn on the GPU row as ``gpu_user_annotation`` (1 ns before the first
    kernel to 1 ns after the last); CUPTI PM-sampling counters (``"ph": "C"``) on the "GPU 0
    Counters" process every 20 µs."""
    stream, device = 7, 0
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "thread_name", "pid": device, "tid": stream + SYNC_ROW_OFFSET,
         "args": {"name": f"stream {stream} (sync)"}},
        {"ph": "M", "name": "thread_sort_index", "pid": device, "tid": stream + SYNC_ROW_OFFSET,
         "args": {"sort_index": stream}},
    ]  # fmt: skip
    for step in range(3):
        t = 1_000 + step * 2_000
        events.append(annotation(f"ProfilerStep#{step}", t, 1_900))
        kernels = [launch(t + 10 + k * 20, t + 100 + k * 300, 250, stream=stream) for k in range(3)]
        for pair in kernels:
            events += pair
        first, last = kernels[0][1], kernels[-1][1]
        events.append(
            {"ph": "X", "cat": "gpu_user_annotation", "name": "## forward ##", "pid": device, "tid": stream,
             "ts": first["ts"] - 0.001, "dur": last["ts"] + last["dur"] - first["ts"] + 0.002,
             "args": {"External id": 10 + step}}
        )  # fmt: skip
        sync_at, returned = t + 80, t + 100 + 3 * 300 - 50 + 5
        correlation = 700_000 + step
        events.append(runtime("cudaStreamSynchronize", sync_at, returned - sync_at, correlation=correlation))
        events.append(
            {"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": device, "tid": stream + SYNC_ROW_OFFSET,
             "ts": sync_at + 1, "dur": returned - sync_at - 2,
             "args": {"cuda_sync_kind": "Stream Sync", "stream": stream, "correlation": correlation,
                      "device": device, "context": 1}}
        )  # fmt: skip
    for index in range(400):
        events.append(
            {"ph": "C", "cat": "hardware_counters", "name": "sm__throughput.avg.pct_of_peak_sustained_elapsed",
             "pid": f"GPU {device} Counters", "tid": 0, "ts": 900 + index * 20, "args": {"": 37.5 + index % 7}}
        )  # fmt: skip
    return write_trace(path, events, baseTimeNanoseconds=1_780_000_000_000_000_000)


def test_kineto_2026_rows_and_counters_are_never_busy_time_or_streams(tmp_path: Path) -> None:
    """The virtual "stream 7 (sync)" row is not a stream of work, the GPU annotation and the PM
    counters are not busy time: busy, idle and streams are the kernels' alone (from the raw events)."""
    from tracebuild import union_length

    from traceinsight.analysis import analyze
    from traceinsight.load import load_trace

    path = _kineto_2026_trace(tmp_path / "k2026.json")
    _, raw = read_events(path)
    kernels = [
        (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in raw if e.get("cat") == "kernel"
    ]
    span = max(end for _, end in kernels) - min(start for start, _ in kernels)
    trace = load_trace(path)
    assert trace.gpu.get_column("stream").unique().to_list() == [7]
    assert trace.cuda_sync.get_column("stream").unique().to_list() == [7]  # not the row's 1,000,007
    assert trace.gpu_annotations.height == 3
    result = analyze(trace)
    (device,) = result.devices
    assert device.device == 0
    assert device.busy_ns == union_length(kernels)
    assert device.idle_ns == span - union_length(kernels)
    assert sum(k.count for k in result.kernels.kernels) == len(kernels)
    assert not result.copies
    # each step's sync is one host wait, tied to its runtime call
    assert [h.call for h in result.sync_hotspots] == ["cudaStreamSynchronize"]
    assert result.sync_hotspots[0].count == 3


def test_a_trace_listing_gpus_without_their_activity_is_not_a_run_without_a_gpu(tmp_path: Path) -> None:
    """no_distributed_info lists GPUs in deviceProperties but its profiler recorded CPU activity
    only: the card said ".item() would make the host wait ... (this run had no GPU)" and "no GPU, so
    it did not wait", neither of which the trace shows. It names the listed GPUs and says the
    activity was not recorded, on every output."""
    path = Path(__file__).parent.parent / "sample_traces" / "no_distributed_info.json.gz"
    document, raw = read_events(path)
    listed = len(document["deviceProperties"])
    assert listed > 0
    assert not [e for e in raw if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    terminal, report, page, markdown = _outputs(path, tmp_path)
    gpus = f"{listed} GPU{'s' if listed > 1 else ''}"
    flat = " ".join(terminal.split())
    assert f"the trace lists {gpus}" in flat
    assert "had no GPU" not in flat and "no GPU, so it did not wait" not in flat
    for text in (markdown, page, json.dumps(report)):
        assert "had no GPU" not in text and "did not wait" not in text
    assert f"it lists {gpus}" in page
    titles = [finding["title"] for finding in report["findings"]]
    assert titles and all("(GPU activity not recorded)" in title for title in titles)
