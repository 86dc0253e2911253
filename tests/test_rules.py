"""Every rule on tiny hand-built traces: it fires on the pattern and stays quiet without it."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from tracebuild import annotation, cpu_op, frame, kernel, launch, memcpy, runtime, write_trace

from traceinsight.analysis import analyze
from traceinsight.load import load_trace
from traceinsight.rules import REGISTRY, evaluate
from traceinsight.rules.findings import Finding

STEP_US = 1000


def findings(tmp_path: Path, events: list[dict[str, Any]]) -> tuple[Finding, ...]:
    return evaluate(analyze(load_trace(write_trace(tmp_path / "t.json", events))))


def rules(tmp_path: Path, events: list[dict[str, Any]]) -> set[str]:
    return {f.rule for f in findings(tmp_path, events)}


def busy_steps(
    steps: int = 4,
    *,
    gap_after: float = 0.0,
    item_sync: bool = False,
    pageable_copy: bool = False,
    dataloader_us: float = 0.0,
) -> list[dict[str, Any]]:
    """``steps`` ProfilerSteps of back-to-back kernels, with optional per-step problems."""
    events: list[dict[str, Any]] = []
    t = 0.0
    for step in range(steps):
        start = t
        if dataloader_us:
            events.append(
                annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, dataloader_us)
            )
            t += dataloader_us
        if pageable_copy:
            events.append(cpu_op("aten::to", t, 30))
            events.append(cpu_op("aten::copy_", t + 1, 28))
            events.append(runtime("cudaMemcpyAsync", t + 2, 20, correlation=90_000 + step))
            events.append(
                memcpy(
                    t + 5, 15, "Memcpy HtoD (Pageable -> Device)", nbytes=1 << 20, correlation=90_000 + step
                )
            )
            t += 30
        for k in range(8):  # the host keeps ahead: every kernel starts when the previous ends
            events += launch(t + k, t + 10 + k * 100, 100)
        t += 10 + 800
        if item_sync:
            events.append(frame("train.py(47): train_step", t - 5, 40, python_id=step * 10 + 1))
            events.append(cpu_op("aten::item", t, 20))
            events.append(cpu_op("aten::_local_scalar_dense", t + 1, 18))
            events.append(runtime("cudaStreamSynchronize", t + 2, 10))
            t += 20 + gap_after
        events.append(annotation(f"ProfilerStep#{step}", start, t - start))
    return events


def test_every_rule_is_registered() -> None:
    evaluate(analyze(load_trace(Path(__file__).parent.parent / "sample_traces" / "a100_triton.json.gz")))
    assert set(REGISTRY) >= {
        "sync-in-loop",
        "pageable-memcpy",
        "blocking-h2d",
        "dataloader-stall",
        "low-gpu-utilization",
    }


def test_healthy_synthetic_trace_has_no_findings(tmp_path: Path) -> None:
    assert findings(tmp_path, busy_steps()) == ()


def test_sync_in_loop_fires_for_a_per_step_item(tmp_path: Path) -> None:
    found = findings(tmp_path, busy_steps(item_sync=True, gap_after=300))
    sync = next(f for f in found if f.rule == "sync-in-loop")
    assert sync.source == "train.py:47"
    assert sync.op == "aten::item"
    # the GPU idles from the sync's return to the next step's first kernel: 300 µs gap + 10 µs
    # launch lead + the sync's own tail (it returns 8 µs after the step's last op started) → per step
    assert sync.savings_ns > 0
    assert ".item()" in sync.title


def test_sync_in_loop_quiet_when_the_sync_happens_once(tmp_path: Path) -> None:
    events = busy_steps()
    events.append(runtime("cudaDeviceSynchronize", 5000, 10))
    assert "sync-in-loop" not in rules(tmp_path, events)


def test_sync_in_loop_quiet_when_the_gpu_never_idles_after(tmp_path: Path) -> None:
    events = busy_steps()
    # a sync every step that returns while the GPU is still busy (queued work remains)
    for step in range(4):
        events.append(runtime("cudaStreamSynchronize", step * 810 + 100, 5))
    assert "sync-in-loop" not in rules(tmp_path, events)


def test_pageable_memcpy_fires_on_pageable_h2d(tmp_path: Path) -> None:
    found = findings(tmp_path, busy_steps(pageable_copy=True))
    page = next(f for f in found if f.rule == "pageable-memcpy")
    assert "4 copies" in page.title


def test_pageable_memcpy_quiet_for_pinned_copies(tmp_path: Path) -> None:
    events = busy_steps()
    events.append(memcpy(100, 15, "Memcpy HtoD (Pinned -> Device)", stream=8))
    assert "pageable-memcpy" not in rules(tmp_path, events)


def test_pageable_memcpy_quiet_for_tiny_dtoh_reads(tmp_path: Path) -> None:
    events = busy_steps()
    events.append(memcpy(4000, 2, "Memcpy DtoH (Device -> Pageable)", nbytes=4))
    assert "pageable-memcpy" not in rules(tmp_path, events)


def test_blocking_h2d_fires_when_copies_run_alone(tmp_path: Path) -> None:
    events = busy_steps(steps=2)
    for i in range(5):  # 5 × 200 µs of copies on an idle GPU after the steps
        events.append(memcpy(3000 + i * 300, 200, "Memcpy HtoD (Pinned -> Device)"))
    found = findings(tmp_path, events)
    h2d = next(f for f in found if f.rule == "blocking-h2d")
    assert h2d.savings_ns == 5 * 200_000


def test_blocking_h2d_quiet_when_copies_overlap_kernels(tmp_path: Path) -> None:
    events = busy_steps(steps=2)
    for i in range(5):  # copies on a side stream underneath the kernels
        events.append(memcpy(20 + i * 100, 50, "Memcpy HtoD (Pinned -> Device)", stream=9))
    assert "blocking-h2d" not in rules(tmp_path, events)


def test_dataloader_stall_fires_when_the_gpu_waits_for_batches(tmp_path: Path) -> None:
    found = findings(tmp_path, busy_steps(dataloader_us=2000))
    stall = next(f for f in found if f.rule == "dataloader-stall")
    assert stall.severity == "high"
    # 3 stalls between steps (the first precedes all GPU work) of 2000 µs + 10 µs launch lead each
    assert stall.savings_ns == 3 * (2000 + 10) * 1000


def test_dataloader_stall_quiet_for_a_fast_loader(tmp_path: Path) -> None:
    assert "dataloader-stall" not in rules(tmp_path, busy_steps(dataloader_us=1))


def test_low_gpu_utilization_fires_and_names_the_cause(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    for i in range(10):  # 100 µs kernels every 1000 µs; host idle in between (host-bound)
        events += launch(i * 1000 - 5, i * 1000, 100)
    found = findings(tmp_path, events)
    low = next(f for f in found if f.rule == "low-gpu-utilization")
    assert f"{1000 / 9100:.0%}" in low.title  # 10 × 100 µs busy over a 9,100 µs span
    assert low.savings_ns == 9 * 900 * 1000
    assert "host-bound" in low.title  # the launches fall inside the gaps


def test_low_gpu_utilization_quiet_when_busy(tmp_path: Path) -> None:
    events = [kernel(i * 100, 95) for i in range(100)]
    assert "low-gpu-utilization" not in rules(tmp_path, events)


@pytest.mark.parametrize("cause", ["dataloader", "sync", "cpu_op", "host-bound", "untraced"])
def test_gap_causes(tmp_path: Path, cause: str) -> None:
    events = launch(0, 10, 100)
    correlation = 77_777
    if cause == "dataloader":
        events.append(annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 110, 880))
    elif cause == "sync":
        events.append(runtime("cudaStreamSynchronize", 20, 95))  # returns as the GPU drains
    elif cause == "cpu_op":
        events.append(cpu_op("aten::nonzero_numpy_preprocess", 115, 870))
    launched_at = 50 if cause == "untraced" else 995  # untraced: nothing recorded on the thread in the gap
    events.append(runtime("cudaLaunchKernel", launched_at, 3, correlation=correlation))
    events.append(kernel(1000, 100, correlation=correlation))
    gap = analyze(load_trace(write_trace(tmp_path / "t.json", events))).idle_gaps[0]
    assert gap.duration_ns == 890_000
    assert gap.cause_kind == cause
