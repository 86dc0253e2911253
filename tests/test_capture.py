"""`traceinsight run` on the shapes of issue 15, with real torch on CPU, each in seconds.

Bounded capture (start-up window without stacks/shapes, ``--stacks``, ``--max-memory``), the
script's own profiler, exit status and failure in the report, ``--help``, torchrun ranks and the
launcher as a target. What needs a real process (the memory guard's interrupt, a profiler that
crashed the process, torchrun) runs as one. Traces are read with gzip + json, not the package.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") and importlib.util.find_spec("torch") is None:
    raise ImportError(
        "torch is not installed but CI is set: `traceinsight run` must be tested with real torch"
    )
torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from traceinsight.capture.distributed import launcher_module, rank_path, worker_launch_args  # noqa: E402
from traceinsight.capture.export import _copy_fixed  # noqa: E402
from traceinsight.capture.frames import FRAME_MARK, SITE_MARK  # noqa: E402
from traceinsight.capture.memory import parse_size  # noqa: E402
from traceinsight.commands import app  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "run_scripts"
REPO = Path(__file__).resolve().parent.parent
runner = CliRunner()


def events_of(trace: Path) -> list[dict[str, Any]]:
    """A trace's events, read with the standard library (plain or gzip JSON)."""
    opener = gzip.open if trace.name.endswith(".gz") else open
    with opener(trace, "rt", encoding="utf-8") as stream:  # type: ignore[operator]
        events: list[dict[str, Any]] = json.load(stream)["traceEvents"]
    return events


def run_cli(tmp_path: Path, *words: str) -> tuple[Any, Path, Path, Path]:
    """``traceinsight run --trace T -o R --json J WORDS`` in this process."""
    trace, report, findings = tmp_path / "t.pt.trace.json.gz", tmp_path / "r.html", tmp_path / "f.json"
    result = runner.invoke(
        app, ["run", "--trace", str(trace), "-o", str(report), "--json", str(findings), *words]
    )
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result, trace, report, findings


def traceinsight_process(*words: str, cwd: Path, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    """``python -m traceinsight WORDS`` in a fresh process."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(name, None)
    return subprocess.run(
        [sys.executable, "-m", "traceinsight", *words],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )  # fmt: skip


# --- bounded capture -----------------------------------------------------------------------------


def test_start_up_window_records_neither_stacks_nor_shapes(tmp_path: Path) -> None:
    # Without steps the start-up recording is the trace: it shows what that window records.
    result, trace, _, _ = run_cli(tmp_path, str(SCRIPTS / "no_steps.py"))
    assert result.exit_code == 0, result.stderr
    events = events_of(trace)
    assert [e for e in events if e.get("cat") == "python_function"] == []
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert ops and not any("Input Dims" in e.get("args", {}) for e in ops)
    assert "without Python frames" in result.stderr


def frames_by_name(trace: Path) -> dict[str, int]:
    counts: dict[str, int] = {}
    for event in events_of(trace):
        if event.get("cat") == "python_function":
            counts[event["name"]] = counts.get(event["name"], 0) + 1
    return counts


def test_stacks_user_records_only_the_scripts_own_frames(tmp_path: Path) -> None:
    script = SCRIPTS / "frames_and_memory.py"
    result, trace, _, _ = run_cli(tmp_path, str(script))
    assert result.exit_code == 0, result.stderr
    frames = frames_by_name(trace)
    first_line = next(
        number for number, line in enumerate(script.read_text().splitlines(), 1) if "def scaled_input" in line
    )
    # Two calls per step, five active steps; every frame is the script's (no torch, json or ours),
    # or a module's forward (named as torch's tracer names them).
    assert frames[f"frames_and_memory.py({first_line}): scaled_input"] == 2 * 5
    assert all(name.startswith(("frames_and_memory.py(", "nn.Module: ")) for name in frames), sorted(frames)
    assert not any(FRAME_MARK in e.get("name", "") for e in events_of(trace))
    ops = [e for e in events_of(trace) if e.get("cat") == "cpu_op"]
    assert any("Input Dims" in e.get("args", {}) for e in ops)  # active steps keep shapes


def test_stacks_user_names_the_line_of_each_call_and_the_module(tmp_path: Path) -> None:
    """A finding names the line that made it, not its function's first line: the call sites of the
    user's calls into torch are frames of their own, and a tensor's bool() (a call the profile hook
    never sees) stays with the line of its if."""
    script = REPO / "examples" / "tensor_branch.py"
    result, trace, _, findings = run_cli(tmp_path, str(script))
    assert result.exit_code == 0, result.stderr
    lines = script.read_text().splitlines()
    branch = next(number for number, line in enumerate(lines, 1) if line.strip().startswith("if h.sum() > 0"))
    forward = next(number for number, line in enumerate(lines, 1) if line.strip().startswith("def forward("))
    frames = frames_by_name(trace)
    assert f"tensor_branch.py({forward}): forward" in frames  # the frame, by its first line
    assert f"tensor_branch.py({branch}): forward" in frames  # the call site, by its line
    assert any(name.startswith("nn.Module: GatedBlock_") for name in frames)
    document = json.loads(findings.read_text())
    (finding,) = [f for f in document["findings"] if f["rule"] == "sync-in-forward"]
    assert finding["source"] == f"tensor_branch.py:{branch}"
    assert "GatedBlock's forward" in finding["title"]


def test_syncs_made_by_no_call_on_their_line_get_a_card_at_their_line(tmp_path: Path) -> None:
    """``running += float(loss)`` and ``if loss > 100:`` (the commonest syncs in a loop) read the
    tensor through its slots, which no profile event shows: their operators fell in the range of
    ``optimizer.step()``'s line or on ``<module>``'s first line, and got no card. Each line of a
    user frame that calls into torch now has its range while a step is recorded."""
    script = SCRIPTS / "syncs_without_calls.py"
    result, trace, _, findings = run_cli(tmp_path, str(script))
    assert result.exit_code == 0, result.stderr
    lines = script.read_text().splitlines()
    marked = {
        kind: next(number for number, line in enumerate(lines, 1) if line.endswith(f"# sync: {kind}"))
        for kind in ("float", "if", "int")
    }
    frames = frames_by_name(trace)
    for number in marked.values():
        assert f"syncs_without_calls.py({number}): <module>" in frames
    document = json.loads(findings.read_text())
    steps = document["steady_state"]["steady_steps"]
    assert steps >= 2
    cards = {f["source"]: f for f in document["findings"] if f["rule"] in ("latent-sync", "sync-in-loop")}
    for kind, number in marked.items():
        card = cards.get(f"syncs_without_calls.py:{number}")
        assert card is not None, (kind, sorted(cards))
        assert "every step" in card["title"], card["title"]


def test_workers_forked_while_frames_are_traced_do_not_trace(tmp_path: Path) -> None:
    # A worker is forked in every step, the active ones (3-7) included.
    ours = traceinsight_process(
        "run",
        "--trace",
        "t.pt.trace.json.gz",
        "-o",
        "r.html",
        str(SCRIPTS / "fork_in_window.py"),
        cwd=tmp_path,
    )
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == "workers with a profile function in steps: []\n"
    frames = frames_by_name(tmp_path / "t.pt.trace.json.gz")
    assert any(name.startswith("fork_in_window.py(") for name in frames), frames


def test_stacks_all_and_none(tmp_path: Path) -> None:
    script = str(SCRIPTS / "frames_and_memory.py")
    (tmp_path / "all").mkdir()
    (tmp_path / "none").mkdir()
    result, trace, _, _ = run_cli(tmp_path / "all", "--stacks", "all", script)
    assert result.exit_code == 0, result.stderr
    frames = frames_by_name(trace)
    assert any(name.startswith("json/") for name in frames)  # torch's tracer records every frame
    assert any(name.startswith("torch/") for name in frames)
    result, trace, _, _ = run_cli(tmp_path / "none", "--stacks", "none", script)
    assert result.exit_code == 0, result.stderr
    assert frames_by_name(trace) == {}


def test_stacks_must_be_one_of_three(tmp_path: Path) -> None:
    result, trace, _, _ = run_cli(tmp_path, "--stacks", "some", str(SCRIPTS / "no_steps.py"))
    assert result.exit_code == 2
    assert "--stacks must be one of user, all, none" in result.stderr
    assert not trace.exists()


def run_with_budget(tmp_path: Path, budget: str, growth: str) -> tuple[str, list[str]]:
    """``run --max-memory BUDGET frames_and_memory.py GROWTH`` in a process: stderr, ProfilerSteps."""
    ours = traceinsight_process(
        "run", "--trace", "t.pt.trace.json.gz", "-o", "r.html", "--max-memory", budget,
        str(SCRIPTS / "frames_and_memory.py"), growth, cwd=tmp_path,
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout == "done\n"  # the script ran to its end
    events = events_of(tmp_path / "t.pt.trace.json.gz")
    return ours.stderr, [e["name"] for e in events if e["name"].startswith("ProfilerStep#")]


def test_memory_budget_ends_the_window_at_the_step_before_it_would_pass(tmp_path: Path) -> None:
    """20 MB kept per step: one step costs 20 MB of RSS plus the stop's share of the 20 MB it holds
    (under the 64 MB budget), two would pass it. The window ends at that boundary with complete
    steps only (it was stopped inside a step, leaving "0 complete steps and part of the next")."""
    stderr, steps = run_with_budget(tmp_path, "64M", "grow=20")
    assert steps == ["ProfilerStep#3"], stderr
    assert "recorded 1 step of the 5 asked for: one more would pass the memory budget (64 MiB" in stderr
    assert "the trace holds 1 complete step of the 5 asked for: one more step would have passed" in stderr
    assert "part of the next" not in stderr
    assert (tmp_path / "r.html").is_file()


def test_memory_budget_drops_a_start_up_window_that_is_too_big(tmp_path: Path) -> None:
    """Said when it happens (it was said at the end of the run, after the trace was written)."""
    stderr, steps = run_with_budget(tmp_path, "100M", "early=200")
    lines = stderr.splitlines()
    dropped = "start-up recording (step 0) passed the memory budget (--max-memory) and was dropped"
    assert [n for n, line in enumerate(lines) if dropped in line] == [
        next(n for n, line in enumerate(lines) if dropped in line)
    ]
    assert next(n for n, line in enumerate(lines) if dropped in line) < next(
        n for n, line in enumerate(lines) if "recorded 5 steps" in line
    )
    assert steps == [f"ProfilerStep#{n}" for n in range(3, 8)]


def test_the_stop_of_a_window_that_ended_with_the_script_is_not_a_memory_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The script ends inside the window, and stopping the profiler costs more than the budget: the
    guard once counted that against the window, stopped it a second time ("disableProfiler called
    but no active profiling session") and said recording was stopped early. It is not watched."""
    original = torch.profiler.profile.stop
    calls: list[int] = []

    def costly_stop(self: Any) -> None:
        if self.step_num == 0:  # the start-up recording (no schedule), dropped at the first step
            original(self)
            return
        calls.append(1)
        held = bytearray(200 << 20)  # touched: resident
        held[::4096] = b"\x01" * len(held[::4096])
        time.sleep(0.4)  # the guard polls every 50 ms
        original(self)
        del held

    monkeypatch.setattr(torch.profiler.profile, "stop", costly_stop)
    monkeypatch.setenv("PROBE_RECORD", str(tmp_path / "record.json"))
    result, trace, _, _ = run_cli(tmp_path, "--max-memory", "64M", str(SCRIPTS / "probe.py"), "steps=5")
    assert result.exit_code == 0, result.stderr
    assert calls == [1]  # the window stopped once
    assert "memory budget" not in result.stderr and "stopped" not in result.stderr, result.stderr
    assert "the trace holds 2 complete steps of the 5 asked for" in result.stderr
    names = [e["name"] for e in events_of(trace) if e["name"].startswith("ProfilerStep#")]
    assert names == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("2G", 2 << 30),
        ("512M", 512 << 20),
        ("1.5GB", int(1.5 * (1 << 30))),
        ("800MiB", 800 << 20),
        ("4096", 4096),
    ],
)
def test_sizes(text: str, expected: int) -> None:
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "-1G", "0"])
def test_bad_sizes(text: str) -> None:
    with pytest.raises(ValueError):
        parse_size(text)


def test_bad_max_memory_is_one_line(tmp_path: Path) -> None:
    result, _, _, _ = run_cli(tmp_path, "--max-memory", "lots", str(SCRIPTS / "no_steps.py"))
    assert result.exit_code == 2
    assert "--max-memory 'lots' is not a size" in result.stderr


# --- the export ----------------------------------------------------------------------------------


def test_export_escapes_bare_quotes_and_turns_user_ranges_into_frames(tmp_path: Path) -> None:
    kineto = (
        '{\n  "traceEvents": [\n'
        '  {\n    "ph": "X", "cat": "python_function",\n    "name": "a.py(1):     """",\n    "pid": 1, "tid": 1,\n'
        '    "ts": 1, "dur": 2\n  },\n'
        '  {\n    "ph": "X",\n    "cat": "user_annotation",\n    "name": "'
        + FRAME_MARK
        + 'train.py(3): step",\n'
        '    "pid": 1, "tid": 1, "ts": 1, "dur": 1\n  },\n'
        '  {\n    "ph": "X", "cat": "user_annotation",\n    "name": "C:\\dir\\",\n    "pid": 1, "tid": 1,\n'
        '    "ts": 1, "dur": 1\n  },\n'
        '  {\n    "ph": "X", "cat": "user_annotation",\n    "name": "ProfilerStep#3",\n    "pid": 1, "tid": 1,\n'
        '    "ts": 0, "dur": 9\n  }\n  ]\n}\n'
    ).encode()
    source, out = tmp_path / "raw.json", tmp_path / "out.json"
    source.write_bytes(kineto)
    with pytest.raises(json.JSONDecodeError):
        json.loads(kineto)
    with source.open("rb") as reading, out.open("wb") as writing:
        repaired, frames = _copy_fixed(reading, writing, len(kineto), None)
    assert (repaired, frames) == (2, 1)
    events = json.loads(out.read_text())["traceEvents"]
    assert [(e["cat"], e["name"]) for e in events] == [
        ("python_function", 'a.py(1):     """'),
        ("python_function", "train.py(3): step"),
        ("user_annotation", "C:\\dir\\"),  # backslashes as older kinetos leave them on Linux
        ("user_annotation", "ProfilerStep#3"),
    ]


def test_export_reads_the_layout_of_torch_2_1_to_2_12(tmp_path: Path) -> None:
    """The kineto of torch 2.1-2.12 writes several keys per line (``"ph": "X", "cat": "…", "name":
    "…", "pid": …``) and opens the file with a blank line: the frames stayed ``traceinsight.frame:``
    operators (no source line in any finding), the run's record was left out and the instant events'
    names swallowed their ``ph`` (seen on an H200 with torch 2.11). Each event below is written as
    that kineto writes it (libkineto/src/output_json.cpp)."""
    kineto = (
        '\n  {\n    "schemaVersion": 1,\n    "deviceProperties": [\n    ],\n'
        '  "displayTimeUnit": "ms",\n  "baseTimeNanoseconds": 1,\n  "traceEvents": [\n'
        '  {\n    "name": "process_name", "ph": "M", "ts": 1.000, "pid": 1, "tid": 0,\n'
        '    "args": {\n      "name": "python"\n    }\n  },\n'
        '  {\n    "ph": "X", "cat": "cpu_op", "name": "'
        + FRAME_MARK
        + 'train.py(3): step", "pid": 1, "tid": 1,\n'
        '    "ts": 1.000, "dur": 5.000,\n    "args": {\n      "External id": 7\n    }\n  },\n'
        '  {\n    "ph": "X", "cat": "user_annotation", "name": "'
        + SITE_MARK
        + 'train.py(9): step", "pid": 1, '
        '"tid": 1,\n    "ts": 2.000, "dur": 1.000\n  },\n'
        '  {\n    "ph": "X", "cat": "python_function", "name": "a.py(1):     """", "pid": 1, "tid": 1,\n'
        '    "ts": 1.000, "dur": 2.000\n  },\n'
        '  {\n    "ph": "i", "cat": "cpu_instant_event", "s": "t", "name": "say "hi"",\n    "pid": 1, "tid": 1,\n'
        '    "ts": 3.000,\n    "args": {\n      \n    }\n  },\n'
        '  {\n    "ph": "f", "id": 1, "pid": 1, "tid": 1, "ts": 2.000,\n    "cat": "fwdbwd", "name": "fwdbwd", '
        '"bp": "e"\n  },\n'
        '  {\n    "name": "Iteration Start: PyTorch Profiler", "ph": "i", "s": "g",\n'
        '    "pid": "Traces", "tid": "Trace PyTorch Profiler", "ts": 0.500\n  },\n'
        '  {\n    "name": "Record Window End", "ph": "i", "s": "g",\n    "pid": "", "tid": "", "ts": 9.000\n  }\n'
        '  ],\n  "traceName": "/tmp/raw.json"\n}'
    ).encode()
    out = tmp_path / "out.json"
    with (tmp_path / "raw.json").open("w+b") as reading, out.open("wb") as writing:
        reading.write(kineto)
        reading.seek(0)
        repaired, frames = _copy_fixed(reading, writing, len(kineto), None, {"stacks": "user"}, "out.json")
    assert (repaired, frames) == (2, 2)
    document = json.loads(out.read_text())
    assert document["traceinsight"] == {"stacks": "user"} and document["traceName"] == "out.json"
    got = [
        (e["ph"], e.get("cat"), e["name"], e.get("s"), e.get("args", {}).get("Call site"))
        for e in document["traceEvents"]
    ]
    assert got == [
        ("M", None, "process_name", None, None),
        ("X", "python_function", "train.py(3): step", None, 0),
        ("X", "python_function", "train.py(9): step", None, 1),
        ("X", "python_function", 'a.py(1):     """', None, None),
        ("i", "cpu_instant_event", 'say "hi"', "t", None),
        ("f", "fwdbwd", "fwdbwd", None, None),
        ("i", None, "Iteration Start: PyTorch Profiler", "g", None),
        ("i", None, "Record Window End", "g", None),
    ]
    assert document["traceEvents"][0]["args"] == {"name": "python"}
    assert document["traceEvents"][1]["args"] == {"Call site": 0, "External id": 7}


INJECTED = 'inj", "distributedInfo": {"rank": 5, "world_size": 9, "backend": "INJECTED"}, "z": "'


@pytest.mark.parametrize(
    "ending",
    [
        '  ],"traceName": "/tmp/' + INJECTED + '/raw.json" }',  # torch 2.13
        '  ],\n  "traceName": "/tmp/' + INJECTED + '/raw.json"\n}',  # torch 2.1-2.12
        '  ],"traceName": "/tmp/a\nb"c/raw.json" }',  # a newline and a quote in the folder's name
    ],
)
def test_export_never_splices_torchs_unescaped_trace_name_into_the_trace(ending: str, tmp_path: Path) -> None:
    """torch writes its temporary file's path as ``traceName`` unescaped: a folder named with a
    quote made the trace invalid JSON (no report, exit 0), or put keys of its name's choosing in
    the trace (the report then showed "rank 5, world size 9, backend INJECTED")."""
    kineto = (
        '{\n  "schemaVersion": 1,\n  "traceEvents": [\n  {\n    "ph": "X",\n    "cat": "cpu_op",\n'
        '    "name": "aten::add",\n    "pid": 1,\n    "tid": 1,\n    "ts": 1.0,\n    "dur": 2.0\n  }\n'
        + ending
    ).encode()
    out = tmp_path / "out.json"
    with (tmp_path / "raw.json").open("w+b") as reading, out.open("wb") as writing:
        reading.write(kineto)
        reading.seek(0)
        _copy_fixed(reading, writing, len(kineto), None, {"stacks": "user"}, 'my "run".json')
    document = json.loads(out.read_text())
    assert set(document) == {"traceinsight", "schemaVersion", "traceEvents", "traceName"}
    assert document["traceName"] == 'my "run".json'
    assert [event["name"] for event in document["traceEvents"]] == ["aten::add"]


@pytest.mark.usefixtures("probe_record")
def test_run_in_a_folder_named_with_a_quote_writes_a_readable_trace_and_its_report(tmp_path: Path) -> None:
    folder = tmp_path / INJECTED
    folder.mkdir()
    result, trace, report, findings = run_cli(folder, str(SCRIPTS / "probe.py"), "steps=6")
    assert result.exit_code == 0, result.stderr
    assert report.is_file() and findings.is_file()
    with gzip.open(trace, "rt", encoding="utf-8") as stream:
        document = json.load(stream)
    assert "distributedInfo" not in document and "z" not in document
    assert document["traceName"] == trace.name
    assert "INJECTED" not in report.read_text(encoding="utf-8")


def test_the_export_of_a_real_torch_2_11_gpu_run_makes_its_frames_and_leaves_the_rest(tmp_path: Path) -> None:
    """torch 2.11's export of `run examples/item_every_step.py` on an H200 (tests/data/README.md):
    every ``traceinsight.frame:``/``site:`` range becomes a frame, every other event is left as it
    was, and the sync's hot spot names the example's ``loss.item()`` line (it named the script's
    ``<module>`` range, with no source)."""
    from traceinsight.analysis import analyze
    from traceinsight.load import load_trace

    raw = gzip.decompress(
        (REPO / "tests" / "data" / "torch2.11_h200_item_every_step.raw.json.gz").read_bytes()
    )
    before = json.loads(raw)["traceEvents"]
    marked = {i for i, e in enumerate(before) if str(e.get("name", "")).startswith((FRAME_MARK, SITE_MARK))}
    assert marked and all(before[i]["cat"] == "cpu_op" for i in marked)  # as torch 2.11 writes them
    out = tmp_path / "item_every_step.pt.trace.json"
    with (tmp_path / "raw.json").open("w+b") as reading, out.open("wb") as writing:
        reading.write(raw)
        reading.seek(0)
        repaired, frames = _copy_fixed(reading, writing, len(raw), None, {"stacks": "user"}, out.name)
    assert (repaired, frames) == (0, len(marked))
    after = json.loads(out.read_text())["traceEvents"]
    assert len(after) == len(before)
    for index, (was, now) in enumerate(zip(before, after, strict=True)):
        if index in marked:
            flag = int(was["name"].startswith(SITE_MARK))
            was = {**was, "cat": "python_function", "name": was["name"].partition(": ")[2],
                   "args": {"Call site": flag, **was["args"]}}  # fmt: skip
        assert now == was
    line = next(
        number
        for number, text in enumerate((REPO / "examples" / "item_every_step.py").read_text().splitlines(), 1)
        if "loss.item()" in text and not text.lstrip().startswith(("#", '"', "`"))
    )
    hotspot = next(h for h in analyze(load_trace(out)).sync_hotspots if h.call == "cudaStreamSynchronize")
    assert (hotspot.op, hotspot.source) == ("aten::item", f"item_every_step.py:{line}")


# --- the script's own profiler ---------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["plain", "scheduled", "repeating"])
def test_the_scripts_own_profiler_runs_and_run_reports_on_its_trace(kind: str, tmp_path: Path) -> None:
    """With a repeating schedule the script's last file holds a window cut short when its profiler
    stopped: the report is made from the last complete one (it was made from the last one)."""
    out = tmp_path / "own"
    out.mkdir()
    ours = traceinsight_process(
        "run", "--json", "f.json", str(SCRIPTS / "own_profiler.py"), kind, str(out), cwd=tmp_path
    )
    assert ours.returncode == 0, ours.stderr  # was SIGSEGV (139)
    assert ours.stdout == "profiled itself\n"
    own_traces = sorted(out.iterdir())  # tensorboard_trace_handler names them by time
    steps = [
        sum(1 for e in events_of(path) if e["name"].startswith("Optimizer.step#")) for path in own_traces
    ]
    if kind == "repeating":
        assert steps == [2, 2, 1]  # two complete windows of 2 training steps, then one cut short
    else:
        assert len(own_traces) == 1, own_traces
    chosen = own_traces[-2] if kind == "repeating" else own_traces[-1]
    findings = json.loads((tmp_path / "f.json").read_text())
    assert tmp_path / findings["trace"]["path"] == chosen  # as typed: relative to the current folder
    assert "stepped aside" in ours.stderr and str(chosen.relative_to(tmp_path)) in ours.stderr
    # Nothing of ours but the report and the JSON: no stray trace.
    ours_left = sorted(p.name for p in tmp_path.iterdir() if p.name != "own")
    assert [name for name in ours_left if name.endswith(".json.gz")] == []
    assert [name for name in ours_left if name.endswith(".report.html")] != []


# --- exit status, failure, --help ------------------------------------------------------------------


@pytest.fixture
def probe_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """probe.py writes how it was started where PROBE_RECORD says."""
    monkeypatch.setenv("PROBE_RECORD", str(tmp_path / "record.json"))


@pytest.mark.usefixtures("probe_record")
def test_failing_script_keeps_its_status_and_the_report_states_the_failure(tmp_path: Path) -> None:
    script = SCRIPTS / "probe.py"
    result, _, _, findings = run_cli(tmp_path, str(script), "steps=10", "end=raise")
    assert result.exit_code == 1
    line = next(n for n, text in enumerate(script.read_text().splitlines(), 1) if "failed on purpose" in text)
    run = json.loads(findings.read_text())["run"]
    assert run["failure"].startswith("ValueError: the probe failed on purpose at ")
    assert run["failure"].endswith(f"probe.py:{line}")
    assert run["exit_status"] == 1
    assert run["steps_recorded"] == 5
    assert run["script"] == str(script)
    assert run["torch_version"] == torch.__version__
    assert run["elapsed_s"] > 0
    assert re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d[+-]\d\d:\d\d$", run["started"])


@pytest.mark.usefixtures("probe_record")
def test_too_few_steps_is_a_message_not_exit_2(tmp_path: Path) -> None:
    result, trace, report, _ = run_cli(tmp_path, str(SCRIPTS / "probe.py"), "steps=2")
    assert result.exit_code == 0
    assert "ran 2 steps but recording starts after 3" in result.stderr
    assert not trace.exists() and not report.exists()


@pytest.mark.parametrize(("words", "status"), [(["--help"], 0), (["--epochs", "x"], 2)])
def test_exit_before_the_first_step_leaves_no_files(words: list[str], status: int, tmp_path: Path) -> None:
    alone = subprocess.run(
        [sys.executable, str(SCRIPTS / "parses_arguments.py"), *words],
        capture_output=True,
        text=True,
        timeout=60,
    )
    ours = traceinsight_process("run", str(SCRIPTS / "parses_arguments.py"), *words, cwd=tmp_path)
    assert ours.returncode == alone.returncode == status
    assert ours.stdout == alone.stdout
    assert alone.stderr in ours.stderr
    assert sorted(tmp_path.iterdir()) == []
    assert "before its first step: nothing written" in ours.stderr


@pytest.mark.usefixtures("probe_record")
def test_progress_lines_say_steps_size_and_time(tmp_path: Path) -> None:
    result, trace, _, _ = run_cli(tmp_path, str(SCRIPTS / "probe.py"), "steps=10")
    assert result.exit_code == 0
    assert "traceinsight: recorded 5 steps; writing the trace…" in result.stderr
    written = re.search(
        r"trace written: (\S+) \(([\d.]+) MB, ([\d.]+) MB of JSON, in ([\d.]+) s\)", result.stderr
    )
    assert written is not None, result.stderr
    assert written[1] == str(trace)
    assert float(written[2]) == pytest.approx(trace.stat().st_size / 1e6, abs=0.051)


# --- torchrun ------------------------------------------------------------------------------------


def test_rank_paths() -> None:
    assert rank_path(Path("a/t.pt.trace.json.gz"), 1) == Path("a/t.rank1.pt.trace.json.gz")
    assert rank_path(Path("r.html"), 0) == Path("r.rank0.html")
    assert rank_path(Path("trace-{rank}.json"), 3) == Path("trace-3.json")


def test_torchrun_is_recognised_as_the_launcher(tmp_path: Path) -> None:
    assert launcher_module("torch.distributed.run", is_module=True)
    assert not launcher_module("torch.distributed.checkpoint", is_module=True)
    torchrun = Path(sys.executable).parent / "torchrun"  # the console script torch installs
    assert launcher_module(str(torchrun), is_module=False)
    lookalike = tmp_path / "torchrun"
    lookalike.write_text("print('not torch')\n")
    assert not launcher_module(str(lookalike), is_module=False)
    assert not launcher_module(str(SCRIPTS / "probe.py"), is_module=False)


def test_launcher_arguments_wrap_the_worker_in_traceinsight_run() -> None:
    words = worker_launch_args(("--nproc-per-node", "2", "-m", "pkg.train", "--lr", "1"), ["--active", "3"])
    assert words == [
        "--nproc-per-node", "2", "--no-python", sys.executable, "-m", "traceinsight", "run",
        "--active", "3", "-m", "pkg.train", "--lr", "1",
    ]  # fmt: skip


def check_job(tmp_path: Path, job: subprocess.CompletedProcess[str]) -> None:
    """Distinct per-rank files in one folder; each rank's JSON is its own; one summary."""
    assert job.returncode == 0, job.stderr
    assert sorted(re.findall(r"rank (\d) done", job.stdout)) == ["0", "1"]
    folders = [p for p in tmp_path.iterdir() if p.is_dir()]
    assert len(folders) == 1 and folders[0].name.endswith(".job"), folders
    names = sorted(p.name for p in folders[0].iterdir())
    assert names == [
        "ddp_two_ranks.rank0.pt.trace.json.gz", "ddp_two_ranks.rank0.report.html",
        "ddp_two_ranks.rank1.pt.trace.json.gz", "ddp_two_ranks.rank1.report.html",
    ]  # fmt: skip
    matmuls = []
    for rank in (0, 1):
        trace = folders[0] / f"ddp_two_ranks.rank{rank}.pt.trace.json.gz"
        events = events_of(trace)
        matmuls.append(sum(1 for e in events if e.get("name") == "aten::mm" and e.get("cat") == "cpu_op"))
        findings = json.loads((tmp_path / f"j.rank{rank}.json").read_text())
        assert findings["trace"]["rank"] == rank
        assert tmp_path / findings["trace"]["path"] == trace  # as typed: relative to the current folder
    assert matmuls[1] == matmuls[0] + 5  # rank 1's extra matmul in each of the 5 recorded steps
    summaries = (job.stdout + job.stderr).count("Scorecard")
    assert summaries == 1
    assert "ddp_two_ranks.rank1.pt.trace.json.gz" in job.stderr  # rank 0 lists every rank's files
    assert "RuntimeWarning" not in job.stderr  # runpy's, when run runs torchrun as a module


@pytest.mark.parametrize("form", ["torchrun-outside", "run-m-torch.distributed.run"])
def test_torchrun_job_writes_one_folder_with_a_file_per_rank(form: str, tmp_path: Path) -> None:
    script = str(SCRIPTS / "ddp_two_ranks.py")
    launcher = ["-m", "torch.distributed.run", "--nproc-per-node", "2"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    if form == "torchrun-outside":
        words = [sys.executable, *launcher, "-m", "traceinsight", "run", "--json", "j.json", script]
    else:
        words = [sys.executable, "-m", "traceinsight", "run", "--json", "j.json", *launcher, script]
    job = subprocess.run(words, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    check_job(tmp_path, job)


def test_memory_budget_stopping_the_first_recorded_step_is_not_a_run_without_steps(tmp_path: Path) -> None:
    """With --wait 0 --warmup 0, a budget passed during step 0 stops the window before any step
    ended, and steps are no longer counted: the trace holds part of step 0, not "the whole run as
    one step" (which run once said, for pytorch/examples' LBFGS time_sequence_prediction)."""
    ours = traceinsight_process(
        "run", "--trace", "t.pt.trace.json.gz", "-o", "r.html", "--json", "r.json", "--max-memory", "100M",
        "--wait", "0", "--warmup", "0", str(SCRIPTS / "frames_and_memory.py"), "early=200", cwd=tmp_path,
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr
    assert "recording stopped inside a step" in ours.stderr
    assert "the trace holds part of one step, stopped before its end" in ours.stderr
    assert "0 complete steps" not in ours.stderr  # beside the report's "Steps 1"
    assert "was seen" not in ours.stderr and "whole run" not in ours.stderr
    run = json.loads((tmp_path / "r.json").read_text())["run"]
    assert run["steps_recorded"] == 0
    with gzip.open(tmp_path / "t.pt.trace.json.gz", "rt", encoding="utf-8") as stream:
        assert json.load(stream)["traceinsight"]["cutShort"] is True  # no count "per step" over it


@pytest.mark.parametrize("slowed", [False, True])
def test_recording_cost_is_told_from_the_steady_steps_after_the_window(slowed: bool, tmp_path: Path) -> None:
    """Steps 1-3 are quick start-up steps, the rest take 80 ms: against the steps just before the
    window every recorded step looked many times slower. The trace now holds each step before the
    window, run's report adds those after it (preferred), and the warning comes only from a real
    slowdown (400 ms while recording)."""
    words = ["--wait", "4", "--warmup", "0", "--active", "3"]  # steps 4-6 recorded
    script = str(SCRIPTS / "steps_slower_when_recorded.py")
    result, trace, _, findings = run_cli(tmp_path, *words, script, *(["slowed"] if slowed else []))
    assert result.exit_code == 0, result.stderr
    with gzip.open(trace, "rt", encoding="utf-8") as stream:
        record = json.load(stream)["traceinsight"]
    # the steps that ran unrecorded before the window (step 0 is never kept): all but the first
    # (which also started the profiler) were quick ones, the baseline that said "N % more" before
    before = record["unprofiledStepsNs"]
    assert len(before) == 3 and max(before[1:]) < 10_000_000, before
    document = json.loads(findings.read_text())
    # each recorded step's usage, in the trace as in run's own result (ns there, µs here)
    usage = [
        [None if v is None else round(v / 1000, 3) for v in step[:3]] + step[3:]
        for step in record["stepUsage"]
    ]
    assert usage and usage == document["run"]["step_usage"] == document["trace"]["step_usage"]
    cost = [w for w in document["warnings"] if w["kind"] == "recording-cost"]
    assert bool(cost) == slowed, cost
    if slowed:
        assert "unrecorded steps after the window" in cost[0]["message"]
