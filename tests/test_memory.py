"""``memory-pressure`` (issue 10): the ``[memory]`` records and allocator calls, from the loader's
table to the rule, the outputs and ``run --memory``. Expected figures are computed here from the
events (hand-built or read with plain json), never taken from the analysis under test."""

from __future__ import annotations

import gzip
import itertools
import json
from pathlib import Path
from typing import Any

import pytest
from tracebuild import SAMPLES, annotation, kernel, memory_record, runtime, sample_report, write_trace

from traceinsight.analysis import Analysis, analyze
from traceinsight.load import load_trace
from traceinsight.render.html import HtmlRenderer
from traceinsight.render.terminal import TerminalRenderer
from traceinsight.results import Report, result_of
from traceinsight.results.codec import document_of
from traceinsight.rules import evaluate
from traceinsight.rules.findings import Finding
from traceinsight.thresholds import Thresholds

GIB = 1 << 30
MIB = 1 << 20
_correlation = itertools.count(900_000)
STEP_US = 1000
CALL_US = 100


def training_loop(
    *, steps: int = 4, churn_steps: set[int] | None = None, reserved: int = 8 * GIB, base: int = 6 * GIB
) -> list[dict[str, Any]]:
    """ProfilerStep windows of 1 ms: four launches of 150 µs kernels; in ``churn_steps`` a 100 µs
    cudaMalloc before them and a 100 µs cudaFree after the GPU work. Each step allocates 512 MiB
    on top of ``base`` and frees it; the allocator holds ``reserved``."""
    churn = set(range(steps)) if churn_steps is None else churn_steps
    events: list[dict[str, Any]] = []
    for step in range(steps):
        start = step * STEP_US
        events.append(annotation(f"ProfilerStep#{step}", start, STEP_US - 10))
        host = start + 5
        if step in churn:
            events.append(runtime("cudaMalloc", host, CALL_US))
            host += CALL_US + 5
        for k in range(4):
            correlation = next(_correlation)
            events.append(runtime("cudaLaunchKernel", host + k * 5, 3, correlation=correlation))
            events.append(kernel(host + 20 + k * 150, 150, correlation=correlation))
        if step in churn:
            events.append(runtime("cudaFree", start + 800, CALL_US))
        events.append(memory_record(start + 6, 512 * MIB, allocated=base + 512 * MIB, reserved=reserved))
        events.append(memory_record(start + 900, -512 * MIB, allocated=base, reserved=reserved))
    return events


def gpu(total: int = 16 * GIB) -> list[dict[str, Any]]:
    return [{"id": 0, "name": "Test GPU", "totalGlobalMem": total, "computeMajor": 8, "computeMinor": 0}]


def analysis_of(tmp_path: Path, events: list[dict[str, Any]], **top: Any) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events, **top)))


def memory_findings(analysis: Analysis) -> list[Finding]:
    return [finding for finding in evaluate(analysis) if finding.rule == "memory-pressure"]


def raw_events(path: Path) -> list[dict[str, Any]]:
    raw = path.read_bytes()
    value = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    events = value if isinstance(value, list) else value["traceEvents"]
    return [event for event in events if isinstance(event, dict)]


def raw_records(path: Path) -> list[dict[str, Any]]:
    """The file's ``[memory]`` records in time order (stable), as plain dicts."""
    records = [e for e in raw_events(path) if e.get("ph") == "i" and e.get("name") == "[memory]"]
    return sorted(records, key=lambda e: e["ts"])


# --- the loader's table ------------------------------------------------------------------------


def test_the_memory_table_holds_every_record_with_its_values(tmp_path: Path) -> None:
    events = training_loop(steps=2)
    events.append({"ph": "i", "name": "[OutOfMemory]", "ts": 5, "args": {"Bytes": 7}})  # not a record
    events.append({"ph": "X", "cat": "cpu_op", "name": "[memory]", "ts": 5, "dur": 1})  # not an instant
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    expected = [
        (round(e["ts"] * 1000), e["args"]["Bytes"], e["args"]["Total Allocated"], e["args"]["Total Reserved"])
        for e in events
        if e.get("name") == "[memory]" and e["ph"] == "i"
    ]
    rows = trace.memory.select("ts", "bytes", "total_allocated", "total_reserved").rows()
    assert rows == expected
    assert trace.memory.get_column("device_type").to_list() == [1] * len(expected)
    # The records do not move the trace's origin (the first X event's start).
    assert trace.meta.origin_ns == 0


@pytest.mark.parametrize(
    "name", ["v100_resnet50_workers0.pt.trace.json.gz", "h100_qwen_inference_stacks.json.gz"]
)
def test_every_record_of_a_real_trace_is_loaded(name: str) -> None:
    path = SAMPLES / name
    records = [e for e in raw_events(path) if e.get("ph") == "i" and e.get("name") == "[memory]"]
    trace = load_trace(path)
    assert trace.memory.height == len(records)
    assert sorted(trace.memory.get_column("bytes").to_list()) == sorted(e["args"]["Bytes"] for e in records)


# --- the analysis --------------------------------------------------------------------------------


def test_peaks_total_and_a_bounded_series_that_keeps_the_peak(tmp_path: Path) -> None:
    events = training_loop(steps=40, reserved=9 * GIB)
    path = write_trace(tmp_path / "t.json", events, deviceProperties=gpu(16 * GIB))
    analysis = analyze(load_trace(path), Thresholds(memory_series_points=10))
    (device,) = analysis.memory.devices
    records = [e for e in events if e.get("name") == "[memory]"]
    assert device.device == "GPU 0"
    assert device.records == len(records) == 80
    assert (
        device.peak_allocated_bytes
        == max(e["args"]["Total Allocated"] for e in records)
        == 6 * GIB + 512 * MIB
    )
    assert device.peak_reserved_bytes == 9 * GIB
    assert device.total_memory_bytes == 16 * GIB
    assert device.peak_share == pytest.approx(9 / 16)
    assert not device.allocated_is_lower_bound
    assert len(device.series) <= 10
    assert max(sample.allocated_bytes or 0 for sample in device.series) == device.peak_allocated_bytes
    times = [sample.at_ns for sample in device.series]
    assert times == sorted(times) and times[0] == round(records[0]["ts"] * 1000)


def test_without_totals_the_allocated_series_is_a_lower_bound_from_the_bytes(tmp_path: Path) -> None:
    sizes = [-100, 300, -50, 500, -600]  # the first frees memory allocated before the trace began
    events = [kernel(0, 10)] + [memory_record(10 + i, size) for i, size in enumerate(sizes)]
    (device,) = analysis_of(tmp_path, events).memory.devices
    running = list(itertools.accumulate(sizes))  # -100, 200, 150, 650, 50
    at_least = max(running) - min(0, min(running))  # at least 100 bytes were held at the start
    assert device.allocated_is_lower_bound
    assert device.peak_allocated_bytes == at_least == 750
    assert device.peak_reserved_bytes is None
    assert device.peak_allocated_at_ns == (13 * 1000)


def test_cpu_records_have_no_total_and_their_own_row(tmp_path: Path) -> None:
    events = [
        *training_loop(steps=2),
        memory_record(3, 64, allocated=64, reserved=0, device=-1, device_type=0),
        memory_record(4, -64, allocated=0, reserved=0, device=-1, device_type=0),
    ]
    analysis = analysis_of(tmp_path, events, deviceProperties=gpu())
    labels = [(d.device, d.peak_allocated_bytes, d.total_memory_bytes) for d in analysis.memory.devices]
    assert labels == [("CPU", 64, None), ("GPU 0", 6 * GIB + 512 * MIB, 16 * GIB)]


# --- the rule: near the limit ------------------------------------------------------------------


def test_memory_pressure_fires_when_the_reserved_peak_nears_the_device_memory(tmp_path: Path) -> None:
    reserved = 15 * GIB + 512 * MIB
    analysis = analysis_of(
        tmp_path, training_loop(churn_steps=set(), reserved=reserved), deviceProperties=gpu(16 * GIB)
    )
    (finding,) = memory_findings(analysis)
    share = reserved / (16 * GIB)  # 96.9 %
    assert f"{share:.0%}" in finding.title and "GPU 0" in finding.title
    evidence = dict(finding.evidence)
    assert evidence["peak reserved by the caching allocator"] == "15.5 GiB"
    assert evidence["device memory (deviceProperties)"] == "16.0 GiB"
    assert evidence["peak share of the device"] == f"{share:.0%}"
    assert not finding.saving_known and finding.severity == "medium" and finding.device == 0
    assert "checkpoint" in finding.advice.after and "expandable_segments" in finding.advice.after


def test_memory_pressure_quiet_with_headroom(tmp_path: Path) -> None:
    analysis = analysis_of(
        tmp_path, training_loop(churn_steps=set(), reserved=12 * GIB), deviceProperties=gpu(16 * GIB)
    )
    assert analysis.memory.devices[0].peak_share == pytest.approx(0.75)
    assert memory_findings(analysis) == []


def test_memory_pressure_quiet_without_a_device_total(tmp_path: Path) -> None:
    """Without totalGlobalMem (or on the CPU) nothing tells how close the limit is."""
    analysis = analysis_of(tmp_path, training_loop(churn_steps=set(), reserved=15 * GIB + 512 * MIB))
    assert analysis.memory.devices[0].total_memory_bytes is None
    assert memory_findings(analysis) == []


# --- the rule: allocator churn -------------------------------------------------------------------


def test_allocator_calls_every_step_are_churn_with_a_replayed_saving(tmp_path: Path) -> None:
    steps = 4
    analysis = analysis_of(tmp_path, training_loop(steps=steps), deviceProperties=gpu())
    assert len(analysis.steady.steady_steps) == steps  # equal steps: all steady
    (finding,) = memory_findings(analysis)
    evidence = dict(finding.evidence)
    assert (
        evidence["allocator calls in the steady state"]
        == f"{2 * steps} (cudaFree {steps}, cudaMalloc {steps})"
    )
    assert evidence["steady steps with allocator calls"] == f"{steps} of {steps}"
    # in the saving's unit: per step, beside the saving per step
    assert evidence["host time in them"].startswith(f"{2 * CALL_US / 1000:.2f} ms per step (")
    # Each step is host-bound (its GPU work ends before the cudaFree): without the two calls the
    # host ends each step 200 µs earlier and the GPU follows the earlier launches.
    assert finding.saving_known
    assert finding.savings_total_ns == steps * 2 * CALL_US * 1000
    assert finding.savings_per_step_ns == 2 * CALL_US * 1000
    assert "empty_cache" in finding.advice.before and "expandable_segments" in finding.advice.after


def test_allocator_calls_only_while_the_cache_warms_up_are_quiet(tmp_path: Path) -> None:
    analysis = analysis_of(tmp_path, training_loop(steps=4, churn_steps={0}), deviceProperties=gpu())
    churn = analysis.memory.allocator_calls
    assert (churn.steps_with_calls, churn.steady_steps) == (1, 4)
    assert memory_findings(analysis) == []


def test_memory_pressure_quiet_on_every_other_sample() -> None:
    firing = {
        path.name
        for path in sorted(SAMPLES.rglob("*.json*"))
        if any(f.rule == "memory-pressure" for f in sample_report(str(path.relative_to(SAMPLES))).findings)
    }
    assert firing == {"a100_alexnet_cuda_sync.json.gz"}


def test_real_peaks_against_the_device_memory() -> None:
    """Qwen inference on an H100: totals recorded; ResNet-50 on a V100 (2021): only Bytes."""
    qwen = SAMPLES / "h100_qwen_inference_stacks.json.gz"
    records = [e["args"] for e in raw_records(qwen) if e["args"]["Device Type"] == 1]
    (props,) = json.loads(gzip.decompress(qwen.read_bytes()))["deviceProperties"]
    gpu_memory = sample_report(qwen.name).analysis.memory.devices[-1]
    assert gpu_memory.device == "GPU 0"
    assert gpu_memory.peak_allocated_bytes == max(r["Total Allocated"] for r in records)
    assert gpu_memory.peak_reserved_bytes == max(r["Total Reserved"] for r in records)
    assert gpu_memory.total_memory_bytes == props["totalGlobalMem"]

    resnet = SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz"
    running = list(
        itertools.accumulate(e["args"]["Bytes"] for e in raw_records(resnet) if e["args"]["Device Type"] == 1)
    )
    gpu_memory = sample_report(resnet.name).analysis.memory.devices[-1]
    assert gpu_memory.allocated_is_lower_bound
    assert gpu_memory.peak_allocated_bytes == max(running) - min(0, min(running))
    assert gpu_memory.peak_share is not None and gpu_memory.peak_share < 0.1


# --- the outputs ----------------------------------------------------------------------------------


def test_outputs_show_memory_only_when_the_trace_has_records() -> None:
    qwen = sample_report("h100_qwen_inference_stacks.json.gz")
    records = [e["args"] for e in raw_records(SAMPLES / "h100_qwen_inference_stacks.json.gz")]
    section = document_of(result_of(qwen))["memory"]
    assert [d["device"] for d in section["devices"]] == ["CPU", "GPU 0"]
    gpu_section = section["devices"][1]
    assert gpu_section["peak_reserved_bytes"] == max(
        r["Total Reserved"] for r in records if r["Device Type"] == 1
    )
    assert 0 < len(gpu_section["series"]) <= Thresholds().memory_series_points
    assert max(point[1] for point in gpu_section["series"]) == gpu_section["peak_allocated_bytes"]
    page = HtmlRenderer().render(result_of(qwen))
    assert 'id="memory"' in page and 'id="memory-title"' in page  # the section and its chart
    text = TerminalRenderer(width=120).render(result_of(qwen))
    assert "Memory (peaks over the whole trace)" in text
    assert any(line.split("│")[0].strip() == "GPU 0" for line in text.splitlines() if "79.2 GiB" in line)

    ddp = sample_report("a100_ddp_nccl.json.gz")
    assert document_of(result_of(ddp))["memory"]["devices"] == []
    assert 'id="memory"' not in HtmlRenderer().render(result_of(ddp))
    assert "Memory (peaks" not in TerminalRenderer(width=120).render(result_of(ddp))


def test_the_json_memory_section_is_plain_data_on_a_hand_built_trace(tmp_path: Path) -> None:
    analysis = analysis_of(tmp_path, training_loop(steps=2), deviceProperties=gpu())
    section = document_of(result_of(Report(analysis=analysis, findings=evaluate(analysis))))["memory"]
    (device,) = section["devices"]
    assert device["peak_allocated_bytes"] == 6 * GIB + 512 * MIB
    assert device["total_memory_bytes"] == 16 * GIB
    assert device["peak_share"] == round(8 / 16, 4)
    assert section["allocator_calls"]["count"] == 4 and section["allocator_calls"]["steps_with_calls"] == 2


# --- run --memory ---------------------------------------------------------------------------------


def test_run_with_memory_on_cpu_leads_to_the_memory_section_and_chart(tmp_path: Path) -> None:
    """On CPU the records are the CPU allocator's (no device total: the near-limit part cannot
    fire); each step's 1 MiB buffer shows in the peak and the chart is drawn."""
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from traceinsight.commands import app

    script = Path(__file__).parent / "run_scripts" / "allocates_each_step.py"
    trace, page, result_json = tmp_path / "run.pt.trace.json.gz", tmp_path / "run.html", tmp_path / "run.json"
    result = CliRunner().invoke(
        app,
        ["run", "--memory", "--trace", str(trace), "-o", str(page), "--json", str(result_json), str(script)],
    )
    assert result.exit_code == 0, result.output
    records = [e["args"] for e in raw_records(trace)]
    assert records and {r["Device Type"] for r in records} == {0}
    assert any(r["Bytes"] == MIB for r in records) and any(r["Bytes"] == -MIB for r in records)
    (cpu,) = json.loads(result_json.read_text(encoding="utf-8"))["memory"]["devices"]
    assert cpu["device"] == "CPU" and cpu["total_memory_bytes"] is None
    assert cpu["peak_allocated_bytes"] == max(r["Total Allocated"] for r in records) >= MIB
    assert 'id="memory-title"' in page.read_text(encoding="utf-8")
    assert "Memory (peaks over the whole trace)" in result.stderr  # run prints its summary there


def test_the_readme_rules_table_has_a_memory_pressure_row() -> None:
    readme = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")
    (row,) = [line for line in readme.splitlines() if line.startswith("| `memory-pressure` |")]
    limits = Thresholds()
    assert f"≥ {limits.memory_pressure_share:.0%}".replace("%", " %") in row
    assert f"≥ {limits.allocator_churn_step_share:.0%}".replace("%", " %") in row
    assert f"≥ {limits.allocator_churn_min_calls} calls" in row


def test_a_window_reusing_freed_pages_is_counted_by_what_it_holds(monkeypatch: pytest.MonkeyPatch) -> None:
    """A recording that reuses pages the script freed grows RSS by less than it holds (the audit's
    LBFGS window: +0.72 GB of RSS, then +3.5 GB when torch stopped): its cost counts the bytes it
    holds, and the stop's share of them (measured 1.68-1.77 × on LBFGS over LSTMCell)."""
    from traceinsight.capture import memory

    now = {"rss": 1 << 30, "heap": 100 << 20}
    monkeypatch.setattr(memory, "rss", lambda: now["rss"])
    monkeypatch.setattr(memory, "heap_in_use", lambda: now["heap"])
    guard = memory.MemoryGuard(2 << 30, lambda: None)
    guard._baseline, guard._heap_baseline = now["rss"], now["heap"]
    now["rss"] += 200 << 20  # RSS: +200 MiB
    now["heap"] += 600 << 20  # held: +600 MiB, on pages the script had freed
    assert guard.cost_now() >= (600 << 20) + 1.68 * (600 << 20)
    now["rss"] += 2000 << 20  # RSS past what is held (fragmentation): RSS counts
    assert guard.cost_now() >= (2200 << 20) + 1.68 * (600 << 20)
