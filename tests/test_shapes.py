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

from tracebuild import PID, TID, annotation, cpu_op, read_events, write_trace
from typer.testing import CliRunner

from traceinsight.cli import app

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
