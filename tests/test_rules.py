"""Every rule on hand-built traces: it fires on the pattern with a replayed saving, stays quiet (or
minor) without it, and one problem is one finding."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from loops import copy_loop, dataloader_loop, item_loop
from tracebuild import (
    SAMPLES,
    annotation,
    cpu_op,
    kernel,
    launch,
    memcpy,
    runtime,
    sample_report,
    write_trace,
)

from traceinsight.analysis import Analysis, analyze
from traceinsight.analysis.causes import CauseKind
from traceinsight.load import load_trace
from traceinsight.rules import REGISTRY, evaluate
from traceinsight.rules.findings import Finding


def analysis_of(tmp_path: Path, events: list[dict[str, Any]]) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events)))


def findings(tmp_path: Path, events: list[dict[str, Any]]) -> tuple[Finding, ...]:
    return evaluate(analysis_of(tmp_path, events))


def cards(tmp_path: Path, events: list[dict[str, Any]]) -> set[str]:
    """Rules with a finding above the noise floor."""
    return {f.rule for f in findings(tmp_path, events) if not f.minor}


def test_the_built_in_rules_are_registered() -> None:
    evaluate(analyze(load_trace(SAMPLES / "a100_triton.json.gz")))
    assert set(REGISTRY) == {
        "sync-in-loop",
        "sync-in-forward",
        "latent-sync",
        "pageable-memcpy",
        "blocking-h2d",
        "host-preprocessing",
        "dataloader-stall",
        "launch-bound",
        "amp-opportunity",
        "tf32-opportunity",
        "low-compute-efficiency",
        "exposed-communication",
        "optimizer-not-fused",
        "memory-pressure",
        "low-gpu-utilization",
        "pipeline-bubble",
    }


def test_each_rule_id_is_written_once() -> None:
    """The id is the decorator's: no rule spells it again for its findings (a second spelling is a
    second place to get it wrong), and each finding a rule yields carries its rule's id."""
    import ast

    import traceinsight.rules

    evaluate(analyze(load_trace(SAMPLES / "a100_triton.json.gz")))  # registers the rules
    spelled: dict[str, int] = dict.fromkeys(REGISTRY, 0)
    for module in Path(traceinsight.rules.__file__).parent.glob("*.py"):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Constant) and node.value in spelled:
                spelled[node.value] += 1
    assert spelled == dict.fromkeys(REGISTRY, 1)
    analysis = analyze(load_trace(SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz"))
    fired = {rule_id: {f.rule for f in function(analysis)} for rule_id, function in REGISTRY.items()}
    assert {rule_id: ids for rule_id, ids in fired.items() if ids} == {
        rule_id: {rule_id}
        for rule_id in ("dataloader-stall", "pageable-memcpy", "amp-opportunity", "optimizer-not-fused")
    }


def test_a_gpu_bound_loop_without_problems_has_no_findings(tmp_path: Path) -> None:
    loop = copy_loop(
        kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_us=20, copy_stream=9, prep_us=0
    )
    assert findings(tmp_path, loop.events) == ()


# --- sync-in-loop -------------------------------------------------------------------------------


def test_sync_in_loop_names_the_line_and_the_call(tmp_path: Path) -> None:
    found = findings(tmp_path, item_loop().events)
    sync = next(f for f in found if f.rule == "sync-in-loop")
    assert sync.title == "`.item()` at train.py:52 makes the host wait for the GPU every step"
    assert sync.source_line_kind == "call"  # run's call site: the line is the call's
    assert sync.op == "aten::item"
    evidence = dict(sync.evidence)
    assert evidence["operator chain"] == "aten::item > aten::_local_scalar_dense"
    assert evidence["waits for"] == "Memcpy DtoH (Device -> Pageable)"


def test_a_sync_in_most_steps_gets_its_card_counted_as_it_is(tmp_path: Path) -> None:
    """A sync in 4 of 5 steady steps (its line moved in one, as a recording start or the window's
    end cuts one off) got no card: every step was asked. More than half of the steps is enough; the
    card says how often, counted from the raw events here."""
    loop = item_loop(steps=6)
    moved = 3  # the third step's item() is on another line
    frames = [e for e in loop.events if e.get("cat") == "python_function"]
    start, end = loop.steps[moved]
    (inside,) = [e for e in frames if start <= e["ts"] < end]
    inside["name"] = "train.py(60): train_step"
    analysis = analysis_of(tmp_path, loop.events)
    steady = [step.step for step in analysis.steady.steady_steps]  # ProfilerStep#N's N
    with_line = sum(
        any(
            e["name"].startswith("train.py(52)") and loop.steps[n][0] <= e["ts"] < loop.steps[n][1]
            for e in frames
        )
        for n in steady
    )
    assert 2 * with_line > len(steady) > with_line  # most steps, not every one
    sync = next(f for f in evaluate(analysis) if f.rule == "sync-in-loop" and "train.py:52" in f.title)
    assert f"in {with_line} of {len(steady)} steps" in sync.title
    assert not any(f.rule == "sync-in-loop" and "train.py:60" in f.title for f in evaluate(analysis))


def test_three_syncs_in_one_step_are_not_a_sync_in_most_steps(tmp_path: Path) -> None:
    """The "most steps" rule counted occurrences: three ``.item()`` at one line inside one of five steady
    steps passed as most steps and got a card. The steps are counted now, from the raw events."""
    import copy

    loop = item_loop(steps=5)
    frames = [e for e in loop.events if e.get("cat") == "python_function"]
    kept = 3  # only this step's item() stays on line 52; the others move to lines of their own
    for index, (start, end) in enumerate(loop.steps):
        (inside,) = [e for e in frames if start <= e["ts"] < end]
        if index != kept:
            inside["name"] = f"train.py({60 + index}): train_step"
    start, end = loop.steps[kept]
    first = [e for e in loop.events if e.get("pid") == 100 and start <= e["ts"] < end and e.get("cat") in
             ("python_function", "cpu_op", "cuda_runtime") and not e["name"].startswith("cudaLaunch")]  # fmt: skip
    copy_event = next(
        e for e in loop.events if e.get("cat") == "gpu_memcpy" and start <= e["ts"] < end + 3000
    )
    gpu_free = max(e["ts"] + e["dur"] for e in loop.events if e.get("pid") == 0)
    for repeat in (1, 2):  # two more item() at line 52 in the host time after the first one
        shift = first[-1]["ts"] + first[-1]["dur"] + 60 * repeat - first[0]["ts"]
        correlation = 900_000 + repeat
        for event in [*first, copy_event]:
            twin = copy.deepcopy(event)
            twin["ts"] = (
                max(event["ts"] + shift, gpu_free + 10 * repeat)
                if event is copy_event
                else event["ts"] + shift
            )
            if twin["name"] == "cudaStreamSynchronize":
                twin["dur"] = 4
            elif twin.get("cat") in ("python_function", "cpu_op"):
                twin["dur"] = 8
            if twin["name"] in ("cudaMemcpyAsync", "Memcpy DtoH (Device -> Pageable)"):
                twin["args"]["correlation"] = correlation
            loop.events.append(twin)
    analysis = analysis_of(tmp_path, loop.events)
    steady = [step.step for step in analysis.steady.steady_steps]
    at_52 = [e for e in loop.events if e.get("name") == "train.py(52): train_step"]
    in_steps = {n for n in steady for e in at_52 if loop.steps[n][0] <= e["ts"] < loop.steps[n][1]}
    in_steady = [e for e in at_52 if any(loop.steps[n][0] <= e["ts"] < loop.steps[n][1] for n in steady)]
    assert len(in_steady) == 3 and len(in_steps) == 1 and len(steady) == 5  # 3 > 5 / 2, yet in one step
    assert not [f.title for f in evaluate(analysis) if "train.py:52" in f.title]
    (hotspot,) = [h for h in analysis.sync_hotspots if h.source == "train.py:52"]
    assert (hotspot.steady_count, hotspot.steady_steps_with) == (3, 1)


def test_sync_in_loop_quiet_when_the_sync_happens_once(tmp_path: Path) -> None:
    events = copy_loop(kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_stream=9).events
    events.append(runtime("cudaDeviceSynchronize", 400, 10))
    assert "sync-in-loop" not in {f.rule for f in findings(tmp_path, events)}


def test_sync_in_loop_quiet_when_the_gpu_never_idles_after(tmp_path: Path) -> None:
    loop = copy_loop(kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_stream=9, prep_us=0)
    # a stream sync every step that returns at once: it waited for nothing, the GPU kept working
    for start, _ in loop.steps:
        loop.events.append(runtime("cudaStreamSynchronize", start + 300, 2))
    assert "sync-in-loop" not in {f.rule for f in findings(tmp_path, loop.events)}


# --- copies: one finding per fix --------------------------------------------------------------


def test_a_pageable_copy_its_sync_and_the_idle_after_are_one_finding(tmp_path: Path) -> None:
    loop = copy_loop(kind="Memcpy HtoD (Pageable -> Device)")
    found = [f for f in findings(tmp_path, loop.events) if not f.minor]
    copies = [f for f in found if f.rule == "pageable-memcpy"]
    assert len(copies) == 1
    assert "sync-in-loop" not in {f.rule for f in found}  # the sync is the copy's evidence
    assert "blocking-h2d" not in {f.rule for f in found}
    copy = copies[0]
    assert "train.py:44" in copy.title and "every step" in copy.title
    evidence = dict(copy.evidence)
    assert evidence["Memcpy HtoD (Pageable -> Device)"].startswith("every step, 1.0 MiB per step, ")
    assert evidence["host waits after them"].startswith("every step: cudaStreamSynchronize")
    assert copy.savings_total_ns > 0


def test_pageable_memcpy_quiet_for_pinned_copies(tmp_path: Path) -> None:
    loop = copy_loop(kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_stream=9)
    assert "pageable-memcpy" not in {f.rule for f in findings(tmp_path, loop.events)}


def test_pinned_copies_on_the_compute_stream_are_prefetched_in_the_replay(tmp_path: Path) -> None:
    # 200 µs pinned copies queued without a wait but on the compute stream, in a GPU-bound loop:
    # moved to a side stream they run under the kernels, and each step loses their 200 µs.
    loop = copy_loop(kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_us=200, prep_us=0)
    found = findings(tmp_path, loop.events)
    h2d = next(f for f in found if f.rule == "blocking-h2d")
    assert h2d.savings_per_step_ns == pytest.approx(200_000, rel=0.05)
    assert "pageable-memcpy" not in {f.rule for f in found}


def test_blocking_h2d_quiet_when_copies_overlap_kernels(tmp_path: Path) -> None:
    loop = copy_loop(kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_stream=9)
    assert "blocking-h2d" not in {f.rule for f in findings(tmp_path, loop.events)}


# --- dataloader-stall ---------------------------------------------------------------------------


def test_dataloader_stall_fires_when_the_gpu_waits_for_batches(tmp_path: Path) -> None:
    found = findings(tmp_path, dataloader_loop(wait_us=5000).events)
    stall = next(f for f in found if f.rule == "dataloader-stall")
    assert stall.severity == "high" and not stall.minor
    assert stall.title.startswith("The GPU waits for the DataLoader") and "train.py:40" in stall.title
    assert "loaded in the training process" in stall.title


def test_dataloader_stall_quiet_for_a_fast_loader(tmp_path: Path) -> None:
    assert "dataloader-stall" not in {f.rule for f in findings(tmp_path, dataloader_loop(wait_us=5).events)}


# --- low-gpu-utilization ------------------------------------------------------------------------


def test_low_gpu_utilization_names_where_the_idle_went(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    for step in range(4):  # 10 kernels of 20 µs, one every 100 µs: the host works between them
        start = step * 1000
        events.append(annotation(f"ProfilerStep#{step}", start, 1000))
        for k in range(10):
            # 80 µs of the host's own work (a CPU op that launches nothing) before each launch
            events.append(cpu_op("aten::index_select_cpu", start + k * 100 - 80, 82))
            events += launch(start + k * 100 + 5, start + k * 100 + 15, 20)
    low = next(f for f in findings(tmp_path, events) if f.rule == "low-gpu-utilization")
    # per step: 200 µs of compute in a 1000 µs window
    assert low.title.startswith("GPU 0 computes only 20% of each step and is idle 80%")
    assert "host busy in an operator" in low.title
    assert "aten::index_select_cpu" in dict(low.evidence)["the host was in"]


def test_low_gpu_utilization_quiet_when_busy(tmp_path: Path) -> None:
    events = [kernel(i * 100, 95) for i in range(100)]
    assert "low-gpu-utilization" not in {f.rule for f in findings(tmp_path, events)}


# --- the noise floor ------------------------------------------------------------------------------


def test_a_tiny_copy_is_a_minor_finding_not_a_card(tmp_path: Path) -> None:
    loop = copy_loop(kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_stream=9, prep_us=0)
    # one 16-byte pageable copy per step, queued in the middle of a busy GPU
    for index, (start, _) in enumerate(loop.steps):
        correlation = 900_000 + index
        loop.events.append(runtime("cudaMemcpyAsync", start + 100, 2, correlation=correlation))
        loop.events.append(
            memcpy(
                start + 300,
                1,
                "Memcpy HtoD (Pageable -> Device)",
                nbytes=16,
                correlation=correlation,
                stream=9,
            )
        )
    page = [f for f in findings(tmp_path, loop.events) if f.rule == "pageable-memcpy"]
    assert len(page) == 1 and page[0].minor


def test_cards_come_before_minor_findings_and_by_saving(tmp_path: Path) -> None:
    loop = item_loop(kernel_us=5, launch_every_us=50)
    found = findings(tmp_path, loop.events)
    flags = [f.minor for f in found]
    assert flags == sorted(flags)
    major = [f.savings_total_ns for f in found if not f.minor]
    assert major == sorted(major, reverse=True)


# --- why the GPU waited: one cause per gap ------------------------------------------------------


@pytest.mark.parametrize(
    "cause",
    ["dataloader", "sync", "copy", "communication", "cpu_op", "host-bound", "untraced", "queued"],
)
def test_gap_causes(tmp_path: Path, cause: str) -> None:
    """A 100 µs kernel, a gap of about 890 µs, then a kernel: what the host did decides the cause."""
    events = launch(0, 10, 100)  # the GPU runs 10-110
    correlation = 77_777
    launched_at = 995.0
    if cause == "dataloader":
        events.append(annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 110, 880))
    elif cause in ("sync", "copy"):
        # the host waits from 20 until the GPU drains at 110, then launches at 210
        if cause == "copy":
            events.append(runtime("cudaMemcpyAsync", 15, 4, correlation=60_001))
            events.append(memcpy(100, 8, "Memcpy HtoD (Pageable -> Device)", correlation=60_001))
        events.append(runtime("cudaStreamSynchronize", 20, 91))
        launched_at = 200
    elif cause == "communication":
        events.append(cpu_op("c10d::allreduce_", 115, 870))
    elif cause == "cpu_op":
        events.append(cpu_op("aten::nonzero_numpy_preprocess", 115, 870))
    elif cause == "host-bound":
        # an operator that itself launches the kernel ending a short gap: its dispatch cost
        events.append(cpu_op("aten::addmm", 105, 100))
        launched_at = 190
    elif cause == "untraced":
        launched_at = 995  # nothing recorded on the thread between 110 and the launch
    elif cause == "queued":
        launched_at = 50  # launched long before the GPU went idle: held by something on the GPU
    gpu_start = max(launched_at + 10, 1000.0) if cause != "host-bound" else 200.0
    if cause in ("sync", "copy"):
        gpu_start = 210.0
    events.append(runtime("cudaLaunchKernel", launched_at, 3, correlation=correlation))
    events.append(kernel(gpu_start, 100, correlation=correlation))
    analysis = analysis_of(tmp_path, events)
    gap = max(analysis.idle_gaps, key=lambda g: g.duration_ns)
    assert gap.cause_kind == cause == CauseKind(cause).value


def test_a_long_stretch_inside_an_operator_that_launches_is_host_work(tmp_path: Path) -> None:
    events = launch(0, 10, 100)
    events.append(cpu_op("aten::cudnn_convolution", 105, 5000))  # autotune: 5 ms on the host
    events.append(runtime("cudaLaunchKernel", 5090, 3, correlation=88_888))
    events.append(kernel(5100, 100, correlation=88_888))
    gap = analysis_of(tmp_path, events).idle_gaps[0]
    assert gap.cause_kind == "cpu_op" and gap.cause == "aten::cudnn_convolution"


def test_a_sync_that_barely_waited_is_not_the_cause(tmp_path: Path) -> None:
    events = launch(0, 10, 100)
    events.append(runtime("cudaDeviceSynchronize", 108, 3))  # returns at 111 having waited 3 µs
    events.append(cpu_op("aten::clear_cache", 120, 800))  # then 800 µs of host work
    events.append(runtime("cudaLaunchKernel", 990, 3, correlation=99_999))
    events.append(kernel(1000, 100, correlation=99_999))
    gap = analysis_of(tmp_path, events).idle_gaps[0]
    assert gap.cause_kind == "cpu_op" and gap.cause == "aten::clear_cache"


# --- words a user reads -------------------------------------------------------------------------

INTERNAL = (
    "cpu_op",
    "host-bound",
    "untraced",
    "outside-steady-state",
    "before-first-work",
    "after-last-work",
)


@pytest.mark.parametrize("path", sorted(str(p.relative_to(SAMPLES)) for p in SAMPLES.rglob("*.json*")))
def test_no_finding_shows_an_internal_key(path: str) -> None:
    for finding in sample_report(path).findings:
        words = [finding.title, finding.why, finding.advice.summary, finding.saving_note or ""]
        words += [label for label, _ in finding.evidence]
        for text in words:
            assert not any(key in text for key in INTERNAL), (finding.rule, text)
        assert finding.advice.before.strip() and finding.advice.after.strip()
        assert not finding.advice.before.lstrip().startswith("#"), "a placeholder, not code"


# --- runs without a GPU -----------------------------------------------------------------------------


def test_a_cpu_run_spending_its_steps_in_the_dataloader_gets_a_finding(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    for step in range(5):  # 10 ms steps, 6 ms of them in a serial DataLoader
        start = step * 10_000
        events.append(annotation(f"ProfilerStep#{step}", start, 10_000))
        events.append(annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start, 6_000))
        events.append(cpu_op("aten::addmm", start + 6_100, 3_800))
    document_path = tmp_path / "cpu.json"
    from tracebuild import write_trace as write

    write(document_path, events, deviceProperties=[])
    result = analyze(load_trace(document_path))
    stall = next(f for f in evaluate(result) if f.rule == "dataloader-stall")
    assert stall.title.startswith("Each step waits 6.00 ms for the DataLoader (60% of the step)")
    # the host is the whole step: each wait minus the 1 ms hand-over comes back
    assert stall.savings_per_step_ns == 5_000_000 and not stall.minor


def test_one_slow_batch_does_not_set_the_dataloader_cards_figure_nor_its_saving(tmp_path: Path) -> None:
    """Five 10 ms steps waiting 6 ms each, and one of 24 ms waiting 20 ms (not an outlier: under 3x
    the median step): the card said the mean (8.80 ms per step, saving 7.8 ms). The median step
    waits 6 ms and frees 5 ms (its wait minus the 1 ms hand-over); a `run` trace that recorded the
    fetch as its range says so in the note."""
    events: list[dict[str, Any]] = []
    start = 0
    waits = [6_000, 6_000, 20_000, 6_000, 6_000, 6_000]
    for step, wait in enumerate(waits):
        length = wait + 4_000
        events.append(annotation(f"ProfilerStep#{step}", start, length))
        events.append(annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", start, wait))
        events.append(cpu_op("aten::addmm", start + wait + 100, 3_800))
        start += length
    path = write_trace(
        tmp_path / "cpu.json",
        events,
        deviceProperties=[],
        traceinsight={"stacks": "user", "loaderFetch": "range only"},
    )
    result = analyze(load_trace(path))
    stall = next(f for f in evaluate(result) if f.rule == "dataloader-stall")
    steady = len(result.steady.steady_steps)
    assert steady >= 5
    kept = sorted(waits[-steady:])
    median = (kept[(steady - 1) // 2] + kept[steady // 2]) / 2 * 1000
    assert stall.title.startswith(f"Each step waits {median / 1e6:.2f} ms for the DataLoader")
    frees = sum(wait - 1_000 for wait in waits[-steady:]) * 1000
    assert stall.savings_per_step_ns == min(median - 1e6, frees / steady)
    assert "recorded each fetch as its range alone" in (stall.saving_note or "")


def test_a_cpu_run_with_a_fast_loader_gets_none(tmp_path: Path) -> None:
    events: list[dict[str, Any]] = []
    for step in range(5):
        start = step * 10_000
        events.append(annotation(f"ProfilerStep#{step}", start, 10_000))
        events.append(annotation("enumerate(DataLoader)#_MultiProcessingDataLoaderIter.__next__", start, 100))
        events.append(cpu_op("aten::addmm", start + 200, 9_700))
    path = write_trace(tmp_path / "cpu.json", events, deviceProperties=[])
    assert "dataloader-stall" not in {f.rule for f in evaluate(analyze(load_trace(path)))}


def test_pageable_memcpy_claims_only_the_idle_its_own_waits_caused(tmp_path: Path) -> None:
    """Each step: a pageable `.to('cuda')` whose sync drains the GPU (193 µs of idle after it),
    then the host sits in a copy to pageable memory while the GPU idles 290 µs. Both gaps are copy
    idle; only the first is the `.to('cuda')`'s (the card once gave the device's copy idle)."""
    events: list[dict[str, Any]] = []
    steps = 4
    for step in range(steps):
        b = step * 1000.0
        h2d, d2h = 50_000 + 10 * step, 60_000 + 10 * step
        events += launch(b, b + 10, 300)  # the GPU computes 10-310
        events += [
            runtime("cudaMemcpyAsync", b + 5, 15, correlation=h2d),  # staged, returns at 20
            memcpy(b + 310, 2, "Memcpy HtoD (Pageable -> Device)", correlation=h2d),
            runtime("cudaStreamSynchronize", b + 21, 293),  # waits for the queue: returns at 314
            runtime("cudaLaunchKernel", b + 500, 3, correlation=h2d + 1),
            kernel(b + 505, 95, correlation=h2d + 1),  # gap 312-505: the sync's
            runtime("cudaMemcpyAsync", b + 605, 295, correlation=d2h),  # the host sits in it
            memcpy(b + 890, 2, "Memcpy DtoH (Device -> Pageable)", correlation=d2h),  # gap 600-890
            annotation(f"ProfilerStep#{step}", b, 1000),
        ]
    analysis = analysis_of(tmp_path, events)
    copy_gaps = [g for g in analysis.idle_gaps if g.cause_kind == "copy"]
    tied = [g.duration_ns for g in copy_gaps if g.sync_key is not None]
    assert tied == [193_000] * steps and len(copy_gaps) == 2 * steps
    (finding,) = (f for f in evaluate(analysis) if f.rule == "pageable-memcpy")
    shown = dict(finding.evidence)["GPU idle right after the waits"]
    assert shown.startswith("0.19 ms per step (")  # 193 µs, not the 483 µs of copy idle per step


# --- per-step host preprocessing ------------------------------------------------------------------


def test_per_step_host_preprocessing_is_a_card_with_its_share(tmp_path: Path) -> None:
    """A video model decodes and resizes each clip on the host (217 ms) before the step's first GPU
    work (165 ms): one card naming it with its share of the step, the top one, and no "setup
    captured" warning (the wait repeats every step). The figures from the raw events: each step's
    kernels (tied to it by their launch's correlation) and when the step before was done."""
    from statistics import median

    from loops import preprocessing_loop

    from traceinsight.formatting import format_duration, format_share

    loop = preprocessing_loop()
    events = loop.events
    launched = {e["args"]["correlation"]: e["ts"] for e in events if e["cat"] == "cuda_runtime"}
    kernels = [
        (launched[e["args"]["correlation"]], e["ts"], e["ts"] + e["dur"])
        for e in events
        if e["cat"] == "kernel"
    ]
    leads, times, previous = [], [], None
    for start, end in loop.steps:
        mine = [(ts, stop) for at, ts, stop in kernels if start <= at < end]
        begin = start if previous is None else previous
        done = max([end] + [stop for _, stop in mine])
        first = min(ts for ts, _ in mine)
        assert not [k for k in kernels if begin < k[2] and k[1] < first]  # the GPU is idle until then
        leads.append(first - begin)
        times.append(done - begin)
        previous = done
    per_step = round(sum(leads) / len(leads) * 1000)
    share = per_step / round(median(times) * 1000)
    assert 0.56 < share < 0.58  # 217 of 382 ms, as built
    result = analysis_of(tmp_path, events)
    findings = [f for f in evaluate(result) if not f.minor]
    card = findings[0]
    assert card.rule == "host-preprocessing"
    assert f"{format_duration(per_step)} per step ({format_share(share)} of the step)" in card.title
    assert "video.py:31" in card.title
    assert "aten::upsample_bilinear2d" in dict(card.evidence)["the host was in"]
    assert card.saving_share is not None and card.saving_share <= share
    assert "setup-captured" not in {w.kind for w in result.warnings}


def test_an_op_starting_and_ending_with_the_op_it_calls_is_the_top_level_one(tmp_path: Path) -> None:
    """The host's preprocessing in ``aten::to`` and the ``aten::_to_copy`` it calls, starting and
    ending together (a parent is recorded first): the operators named are the caller's, with all
    the time in the steps' leads (from the raw events), never the callee's. (The sort that left
    this tie to chance kept the rows' order on these shapes too: a guard of the rule.)"""
    from loops import preprocessing_loop
    from tracebuild import cpu_op

    loop = preprocessing_loop(steps=8, prep_us=2_000, kernels=3, kernel_us=500)
    events: list[dict[str, Any]] = []
    for event in loop.events:
        if event["name"] == "aten::upsample_bilinear2d":
            for k in range(10):
                at = event["ts"] + k * 150
                events += [cpu_op("aten::to", at, 100), cpu_op("aten::_to_copy", at, 100)]
        else:
            events.append(event)
    first_launch = {}
    for event in events:
        if event["name"] == "cudaLaunchKernel":
            step = next(i for i, (start, end) in enumerate(loop.steps) if start <= event["ts"] < end)
            first_launch.setdefault(step, event["ts"])
    inside = sum(
        min(e["ts"] + e["dur"], first_launch[i]) - max(e["ts"], start)
        for e in events
        if e["name"] == "aten::to"
        for i, (start, _) in enumerate(loop.steps)
        if e["ts"] < first_launch[i] and e["ts"] + e["dur"] > start
    )
    assert analysis_of(tmp_path, events).step_leads.ops == (("aten::to", round(inside * 1000)),)


def test_steps_with_leads_as_long_are_named_by_the_first_one_s_line(tmp_path: Path) -> None:
    """Sixty steps whose host works exactly as long before its first launch (from the raw events),
    each in another line: the line named is the first step's, not whichever a sort left first. (The
    unstable sort it replaced kept this order on these shapes too: a guard of the rule.)"""
    from loops import preprocessing_loop

    loop = preprocessing_loop(steps=60, prep_us=2_000, kernels=3, kernel_us=500)
    step = 0
    for event in loop.events:
        if event["cat"] == "python_function":
            event["name"] = f"video.py({31 + step}): load_clip"
            step += 1
    leads = {
        min(e["ts"] for e in loop.events if e["name"] == "cudaLaunchKernel" and start <= e["ts"] < end)
        - start
        for start, end in loop.steps
    }
    assert len(leads) == 1
    assert analysis_of(tmp_path, loop.events).step_leads.source == "video.py:31"


def test_a_wait_before_the_first_gpu_work_that_every_step_has_is_not_setup(tmp_path: Path) -> None:
    """Two steps that decode for 100 and 60 ms before 10 ms of GPU work each: the time before the
    GPU's first work is 100 of 180 ms, which alone reads as set-up caught by the profile. Every step
    has it, so it is per-step host preprocessing: a card (160 ms of 180, from the raw events), no
    "setup captured" warning (was: the warning, and no card)."""
    from loops import preprocessing_loop

    loop = preprocessing_loop(steps=2, prep_us=(100_000, 60_000), kernel_us=1_000)
    kernels = sorted((e["ts"], e["ts"] + e["dur"]) for e in loop.events if e["cat"] == "kernel")
    first, last = kernels[0][0], kernels[-1][1]
    (_, end0), (_, end1) = loop.steps
    assert first / end1 >= 0.5  # what "setup captured" is judged on: time before the first work
    leads = first + (kernels[10][0] - end0)  # each step's wait before its own first kernel
    result = analysis_of(tmp_path, loop.events)
    assert "setup-captured" not in {w.kind for w in result.warnings}
    card = next(f for f in evaluate(result) if f.rule == "host-preprocessing")
    assert card.saving_share is not None
    assert dict(card.evidence)["GPU idle before each step's first work"].startswith(
        f"{leads / 2 / 1000:.2f} ms per step ({leads / end1:.0%} of the step)"
    )
    assert last <= end1
