"""A stored result draws its report: ``details`` holds what the summary, the page and the Markdown
show beyond the figures, each equal to a plain recomputation from the raw events; ``traceinsight
analyze RESULT.json`` writes the outputs the live run wrote, byte for byte, for a trace's result
and for a diff's."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys
from collections import defaultdict
from decimal import Decimal
from pathlib import Path
from typing import Any

import pytest
from reference_split import GPU_KINDS
from tracebuild import SAMPLES

import traceinsight
from traceinsight.results import Result

GP100 = SAMPLES / "gp100_mlp_pageable_sync.json.gz"
WORKERS0 = SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz"
WORKERS4 = SAMPLES / "v100_resnet50_workers4.pt.trace.json.gz"


def _events(path: Path) -> list[dict[str, Any]]:
    """The trace's events, times read from their decimal text (as the loader reads them)."""
    value = json.loads(gzip.decompress(path.read_bytes()), parse_float=Decimal)
    events: list[dict[str, Any]] = value["traceEvents"]
    return events


def _ns(value: Any) -> int:
    return round(Decimal(value) * 1000)


@pytest.mark.parametrize("path", [GP100, WORKERS4, SAMPLES / "a100_ddp_nccl.json.gz"], ids=lambda p: p.name)
def test_the_details_are_the_traces_own(path: Path) -> None:
    """Kernel launches, distinct kernels and each device's kernel time, the GPU span from the
    trace's first event, each device's usage adding up to its window: from the raw events."""
    result = traceinsight.analyze(str(path))
    assert isinstance(result, Result)
    details = Result.from_json(result.to_json()).details
    assert details is not None and details == result.details
    events = _events(path)
    kernels: dict[int, list[tuple[str, int]]] = defaultdict(list)
    gpu: list[tuple[int, int]] = []
    for event in events:
        kind = GPU_KINDS.get(event.get("cat", ""))
        if kind is None or event.get("ph") != "X":
            continue
        device = int(event.get("args", {}).get("device", event.get("pid")))
        start, length = _ns(event["ts"]), _ns(event.get("dur", 0))
        gpu.append((start, start + length))
        if kind == "kernel":
            kernels[device].append((event["name"], length))
    assert details.kernel_launches == sum(len(rows) for rows in kernels.values())
    assert details.kernels_distinct == sum(len({name for name, _ in rows}) for rows in kernels.values())
    assert {total.device: total.kernel_ns for total in details.kernel_totals} == {
        device: sum(length for _, length in rows) for device, rows in kernels.items()
    }
    origin = min(_ns(event["ts"]) for event in events if event.get("ph") == "X")  # the trace's first event
    assert details.gpu_span_ns is not None
    assert (details.gpu_span_ns.start_ns, details.gpu_span_ns.end_ns) == (
        min(start for start, _ in gpu) - origin,
        max(end for _, end in gpu) - origin,
    )
    assert details.usage
    for usage in details.usage:
        busy = usage.compute_ns + usage.communication_ns + usage.copy_ns
        assert busy + sum(ns for _, ns in usage.idle) == usage.window_ns
    assert details.timeline is not None
    assert {device.device for device in details.timeline.devices} == set(kernels)


def _analyze(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "traceinsight", *args],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        env={
            "COLUMNS": "120",
            "PATH": "/usr/bin:/bin",
            "PYTHONPATH": str(Path(traceinsight.__file__).parent.parent),
        },
        check=False,
    )


def _summary(text: str) -> list[str]:
    """The terminal summary without the lines naming the files written."""
    return [
        line for line in text.splitlines() if not line.startswith(("JSON:", "Markdown:", "report:", "page:"))
    ]


@pytest.mark.parametrize(
    "command",
    [
        ("analyze", str(WORKERS4)),
        ("diff", str(WORKERS0), str(WORKERS4)),
    ],
    ids=["trace", "diff"],
)
def test_analyze_writes_a_stored_results_outputs_again(tmp_path: Path, command: tuple[str, ...]) -> None:
    """The CI artifact (``--json``) turned into the page and the Markdown later, without the trace:
    the same bytes as the live run's, the same terminal summary and exit status."""
    live = _analyze(tmp_path, *command, "--json", "result.json", "-o", "live.html", "--markdown", "live.md")
    assert live.returncode == 0, live.stderr
    again = _analyze(tmp_path, "analyze", "result.json", "-o", "again.html", "--markdown", "again.md")
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again.html").read_bytes() == (tmp_path / "live.html").read_bytes()
    assert (tmp_path / "again.md").read_bytes() == (tmp_path / "live.md").read_bytes()
    assert _summary(again.stdout) == _summary(live.stdout)


def test_a_stored_results_gate_is_the_live_ones(tmp_path: Path) -> None:
    """``--max-syncs-per-step`` judges a stored trace result as it judges the trace (exit 1 and the
    same line); a stored diff is not judged by a trace's budgets: one line, exit 2."""
    live = _analyze(
        tmp_path, "analyze", str(GP100), "--no-html", "--json", "gp100.json", "--max-syncs-per-step", "0"
    )
    again = _analyze(tmp_path, "analyze", "gp100.json", "--no-html", "--max-syncs-per-step", "0")
    assert live.returncode == again.returncode == 1
    gate = [line for line in live.stderr.splitlines() if "gate" in line]
    assert gate and gate == [line for line in again.stderr.splitlines() if "gate" in line]
    diff = _analyze(tmp_path, "diff", str(GP100), str(GP100), "--no-html", "--json", "diff.json")
    assert diff.returncode == 0, diff.stderr
    refused = _analyze(tmp_path, "analyze", "diff.json", "--no-html", "--max-idle", "0.5")
    assert refused.returncode == 2
    assert refused.stderr.strip().count("\n") == 0 and "diff.json" in refused.stderr


def test_what_only_an_analysis_uses_is_said_to_be_left_unused(tmp_path: Path) -> None:
    """A stored result's figures are as they were analyzed: thresholds other than its own and
    ``--user-code`` change nothing, and one note says so (none when nothing is left unused); a
    job's options given with one trace, likewise. The outputs are those written without them."""
    live = _analyze(tmp_path, "analyze", str(GP100), "--json", "gp.json", "-o", "live.html")
    assert live.returncode == 0, live.stderr
    plain = _analyze(tmp_path, "analyze", "gp.json", "-o", "plain.html")
    assert plain.returncode == 0 and "note" not in plain.stderr, plain.stderr
    given = _analyze(
        tmp_path, "analyze", "gp.json", "-o", "given.html", "--min-gap-us", "7", "--user-code", "mylab"
    )
    assert given.returncode == 0, given.stderr
    notes = [line for line in given.stderr.splitlines() if "note:" in line]
    assert len(notes) == 1
    assert "the thresholds and --user-code given here apply when a trace is analyzed" in notes[0]
    assert (tmp_path / "given.html").read_bytes() == (tmp_path / "plain.html").read_bytes()
    assert (tmp_path / "plain.html").read_bytes() == (tmp_path / "live.html").read_bytes()

    job_only = _analyze(tmp_path, "analyze", str(GP100), "--no-html", "--workers", "2", "--per-rank", "ranks")
    assert job_only.returncode == 0, job_only.stderr
    assert "note: --per-rank and --workers are for a job" in job_only.stderr
    assert not (tmp_path / "ranks").exists()
    assert _summary(job_only.stdout) == _summary(live.stdout)


def test_a_runs_result_keeps_its_run_and_draws_it() -> None:
    """``run``'s context is the result's ``run`` itself (one type, no copy): written with the keys
    it always had, read back equal, drawn the same; what only the live run needs is not written."""
    from traceinsight.load.tables import StepUsage
    from traceinsight.render.html import HtmlRenderer
    from traceinsight.results import RunContext

    live = traceinsight.analyze(str(GP100))
    assert isinstance(live, Result)
    run = RunContext(
        "traceinsight run -m train --epochs 1", "train", "2026-12-05T11:00:00+01:00", "2.13.0", 12.345, 1,
        "ValueError: bad shape at train.py:47", 3, script_is_module=True, cores=2,
        step_usage=(StepUsage(2_000_000, 1_500_000, 100_000, 1.5), StepUsage(1_000_000, 900_000, None, None)),
        after_window_ns=(1_000_000,),
    )  # fmt: skip
    live = live.replace(run=run)
    document = json.loads(live.to_json())["run"]
    assert list(document) == [
        "command", "script", "started", "torch_version", "elapsed_s", "exit_status", "failure", "steps_recorded",
        "cores", "step_usage",
    ]  # fmt: skip
    assert document["step_usage"] == [[2000.0, 1500.0, 100.0, 1.5], [1000.0, 900.0, None, None]]
    stored = Result.from_json(live.to_json())
    assert stored == live and stored.run is not None and stored.run.step_usage == run.step_usage
    assert HtmlRenderer().render(stored) == HtmlRenderer().render(live)
    assert "ValueError: bad shape at train.py:47" in HtmlRenderer().render(stored)


def test_a_stored_diffs_words_are_the_codes_own(tmp_path: Path) -> None:
    """A diff's verdicts and basis are shown as they are, so a stored one may hold only the words
    the code writes: an edited verdict carrying a link, an image and Rich markup is refused in one
    line (it reached the Markdown table and the terminal as live markup)."""
    done = _analyze(tmp_path, "diff", str(GP100), str(GP100), "--no-html", "--json", "d.json")
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "d.json").read_text())
    assert {metric["verdict"] for metric in document["metrics"]} - {None} <= {
        "faster", "slower", "lower", "higher", "no change", "cannot tell",
    }  # fmt: skip
    for key, value in (
        ("verdict", 'faster | <img src="https://e.x/i.png"> [click](https://e.x) [red]t[/red]'),
        ("basis", "**bold**"),
    ):
        edited = json.loads((tmp_path / "d.json").read_text())
        if key == "verdict":
            edited["metrics"][0]["verdict"] = value
        else:
            edited["basis"] = value
        (tmp_path / "edited.json").write_text(json.dumps(edited))
        refused = _analyze(tmp_path, "analyze", "edited.json", "--markdown", "e.md", "-o", "e.html")
        assert refused.returncode == 2, refused.stdout
        assert refused.stderr.strip().count("\n") == 0 and key in refused.stderr
        assert not (tmp_path / "e.md").exists() and not (tmp_path / "e.html").exists()


def test_a_result_without_details_writes_nothing(tmp_path: Path) -> None:
    """A trace's result written before results kept their ``details`` cannot draw its report: one
    line, exit 2, and no file written (its JSON was written before the summary failed)."""
    done = _analyze(tmp_path, "analyze", str(GP100), "--no-html", "--json", "r.json")
    assert done.returncode == 0, done.stderr
    document = json.loads((tmp_path / "r.json").read_text())
    del document["details"]
    (tmp_path / "old.json").write_text(json.dumps(document))
    refused = _analyze(tmp_path, "analyze", "old.json", "--json", "again.json", "--markdown", "s.md")
    assert refused.returncode == 2 and "'details'" in refused.stderr
    assert refused.stderr.strip().count("\n") == 0
    assert not (tmp_path / "again.json").exists() and not (tmp_path / "s.md").exists()


def test_a_stored_timeline_holds_no_more_blocks_than_an_analysis_draws() -> None:
    """A device's timeline holds at most 2,000 blocks (what a chart can show); an edited stored
    result with 200,000 took 7 s to read and wrote a 5.8 MB page: refused in one line now."""
    from traceinsight.errors import TraceFormatError

    live = traceinsight.analyze(str(GP100))
    assert isinstance(live, Result) and live.details is not None and live.details.timeline is not None
    document = json.loads(live.to_json())
    device = document["details"]["timeline"]["devices"][0]
    assert 0 < len(device["blocks"]) <= 2000
    device["blocks"] = [device["blocks"][0]] * 2001
    with pytest.raises(TraceFormatError, match=r"blocks is a list, not a list of at most 2,000"):
        Result.from_json(json.dumps(document))


def test_a_stored_step_usage_is_read_under_its_checks(tmp_path: Path) -> None:
    """A stored result's step usage (``trace.step_usage``, ``run.step_usage``) is what the diff's
    starved reading weighs: a negative time or more steps than ``run`` writes is refused in one
    line, as any other edited figure; what ``run`` writes reads back equal."""
    live = _analyze(tmp_path, "analyze", str(GP100), "--no-html", "--json", "gp.json")
    assert live.returncode == 0, live.stderr
    document = json.loads((tmp_path / "gp.json").read_text())
    document["trace"]["step_usage"] = [[1500.0, 600.0, 30.5, 2.0], [1400.0, 500.0, None, None]]
    result = Result.from_json(json.dumps(document))
    assert [(u.wall_ns, u.cpu_ns, u.cpu_wait_ns, u.load_1m) for u in result.trace.step_usage] == [
        (1_500_000, 600_000, 30_500, 2.0),
        (1_400_000, 500_000, None, None),
    ]
    for edited in ([[-1.0, 600.0, 30.5, 2.0]], [[1500.0, -600.0, None, None]], [[1.0, 1.0, 1.0, 1.0]] * 1001):
        document["trace"]["step_usage"] = edited
        with pytest.raises(traceinsight.errors.TraceFormatError) as refused:
            Result.from_json(json.dumps(document))
        assert "trace.step_usage" in str(refused.value) and "\n" not in str(refused.value)
