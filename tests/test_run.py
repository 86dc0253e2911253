"""`traceinsight run`: real torch, tiny scripts, checked against plain `python` and the trace itself.

Most runs are in-process through the CLI (torch is imported once); a few are real processes, for
what only a process shows: the exit status, death by Ctrl-C, forked DataLoader workers.
Traces are read with gzip + json here, independently of the package's loader.
"""

from __future__ import annotations

import contextlib
import gzip
import importlib.util
import io
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("CI") and importlib.util.find_spec("torch") is None:
    # CI installs torch ('.[run]'): never let these tests skip there.
    raise ImportError(
        "torch is not installed but CI is set: `traceinsight run` must be tested with real torch"
    )
torch = pytest.importorskip("torch")

from typer.testing import CliRunner  # noqa: E402

from traceinsight.capture import profile_step, step  # noqa: E402
from traceinsight.capture.steps import OptimizerCycle, StepMarker  # noqa: E402
from traceinsight.commands import app  # noqa: E402
from traceinsight.errors import TraceFormatError  # noqa: E402

SCRIPTS = Path(__file__).resolve().parent / "run_scripts"
PROBE = SCRIPTS / "probe.py"
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
REPO = Path(__file__).resolve().parent.parent
NO_GPU_NOTE = "no CUDA device: profiling CPU activity only"

runner = CliRunner()


# --- helpers -------------------------------------------------------------------------------------


@dataclass
class RunResult:
    """One `traceinsight run`: its exit code, its streams and the files it was told to write."""

    exit_code: int
    stdout: str
    stderr: str
    trace: Path
    report: Path

    def events(self) -> list[dict[str, Any]]:
        """The trace's events, read with the standard library."""
        with gzip.open(self.trace, "rt", encoding="utf-8") as stream:
            value = json.load(stream)
        events: list[dict[str, Any]] = value["traceEvents"]
        return events

    def annotations(self, prefix: str) -> list[dict[str, Any]]:
        """Host-side `user_annotation` spans whose name starts with ``prefix``, in time order."""
        spans = [
            event
            for event in self.events()
            if event.get("cat") == "user_annotation" and str(event.get("name", "")).startswith(prefix)
        ]
        return sorted(spans, key=lambda event: float(event["ts"]))

    def step_names(self) -> list[str]:
        return [span["name"] for span in self.annotations("ProfilerStep#")]

    def optimizer_steps_per_profiler_step(self) -> list[list[str]]:
        """For each ProfilerStep span, the `Optimizer.step#...` spans that start inside it."""
        optimizer_steps = self.annotations("Optimizer.step#")
        return [
            [
                inner["name"]
                for inner in optimizer_steps
                if float(span["ts"]) <= float(inner["ts"]) < float(span["ts"]) + float(span["dur"])
            ]
            for span in self.annotations("ProfilerStep#")
        ]


def run_in_process(tmp_path: Path, *words: str) -> RunResult:
    """`traceinsight run --trace T -o R WORDS...` through the real CLI, in this process."""
    trace = tmp_path / "run.pt.trace.json.gz"
    report = tmp_path / "run.report.html"
    result = runner.invoke(app, ["run", "--trace", str(trace), "-o", str(report), *words])
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return RunResult(result.exit_code, result.stdout, result.stderr, trace, report)


def error_line(stderr: str) -> str:
    """The one `traceinsight: error:` line; fails if there is not exactly one."""
    lines = [line for line in stderr.splitlines() if line.startswith("traceinsight: error: ")]
    assert len(lines) == 1, stderr
    assert "Traceback" not in stderr, stderr
    return lines[0]


def assert_report_written(run: RunResult) -> None:
    """The report exists, is HTML, and its path was printed."""
    assert run.report.is_file(), run.stderr
    assert "<html" in run.report.read_text(encoding="utf-8").lower()
    assert str(run.report) in run.stderr


def plain_python(*words: str, cwd: Path, record: Path) -> subprocess.CompletedProcess[str]:
    """``python WORDS...`` in a fresh process, the reference for parity."""
    env = {**os.environ, "PROBE_RECORD": str(record)}
    return subprocess.run(
        [sys.executable, *words], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def traceinsight_process(*words: str, cwd: Path, record: Path) -> subprocess.CompletedProcess[str]:
    """``python -m traceinsight WORDS...`` in a fresh process."""
    env = {**os.environ, "PROBE_RECORD": str(record), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-m", "traceinsight", *words],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )


def read_record(path: Path) -> dict[str, Any]:
    record: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
    return record


@pytest.fixture
def probe_record(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """Where an in-process probe writes how it was started."""
    record = tmp_path / "in_process_record.json"
    monkeypatch.setenv("PROBE_RECORD", str(record))
    yield record


# --- steps: marked without touching the script ---------------------------------------------------


def test_optimizer_steps_become_profiler_steps(tmp_path: Path, probe_record: Path) -> None:
    run = run_in_process(tmp_path, str(PROBE), "steps=10")
    assert run.exit_code == 0, run.stderr
    # Defaults: wait 1, warm-up 2, active 5.
    assert run.step_names() == [f"ProfilerStep#{n}" for n in range(3, 8)]
    assert run.optimizer_steps_per_profiler_step() == [["Optimizer.step#SGD.step"]] * 5
    assert run.stderr.count(NO_GPU_NOTE) == 1
    assert_report_written(run)


def test_two_optimizers_make_one_step_per_iteration(tmp_path: Path) -> None:
    run = run_in_process(tmp_path, str(SCRIPTS / "two_optimizers.py"))
    assert run.exit_code == 0, run.stderr
    assert run.step_names() == [f"ProfilerStep#{n}" for n in range(3, 8)]
    assert (
        run.optimizer_steps_per_profiler_step()
        == [["Optimizer.step#SGD.step", "Optimizer.step#Adam.step"]] * 5
    )


def test_step_api_marks_steps_in_loops_without_torch_optim(tmp_path: Path) -> None:
    run = run_in_process(tmp_path, str(SCRIPTS / "explicit_steps.py"))
    assert run.exit_code == 0, run.stderr
    assert run.step_names() == [f"ProfilerStep#{n}" for n in range(3, 8)]


def test_without_steps_the_whole_run_is_one_window(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", str(SCRIPTS / "no_steps.py")])  # default output names
    assert result.exit_code == 0, result.stderr
    traces = list(tmp_path.glob("no_steps.*.pt.trace.json.gz"))
    reports = list(tmp_path.glob("no_steps.*.report.html"))
    assert len(traces) == 1 and len(reports) == 1, sorted(p.name for p in tmp_path.iterdir())
    run = RunResult(result.exit_code, result.stdout, result.stderr, traces[0], reports[0])
    assert run.step_names() == []
    assert sum(1 for event in run.events() if event.get("name") == "aten::mm") == 5  # one per iteration
    assert "the trace covers the whole run" in run.stderr
    assert f"trace written: {traces[0].name}" in run.stderr
    assert run.stdout == "True\n"  # the script's own output, nothing of ours


def test_script_ending_inside_the_active_window_keeps_the_partial_window(
    tmp_path: Path, probe_record: Path
) -> None:
    run = run_in_process(tmp_path, str(PROBE), "steps=5")
    assert run.exit_code == 0, run.stderr
    assert run.step_names() == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    assert "the trace holds 2 complete steps of the 5 asked for" in run.stderr


def test_schedule_options_and_every_cycle_of_repeat_is_kept(tmp_path: Path, probe_record: Path) -> None:
    """``--repeat 2``: each cycle's window in a file of its own, named as tensorboard_trace_handler
    names cycles (``run.<time_ns>.pt.trace.json.gz``); the report is of the last; nothing is
    written at ``--trace``'s own name."""
    run = run_in_process(
        tmp_path, "--wait", "2", "--warmup", "1", "--active", "3", "--repeat", "2", str(PROBE), "steps=20"
    )
    assert run.exit_code == 0, run.stderr
    assert not run.trace.exists()
    cycles = sorted(tmp_path.glob("run.*.pt.trace.json.gz"), key=lambda path: int(path.name.split(".")[1]))
    assert len(cycles) == 2 and all(len(path.name.split(".")[1]) >= 10 for path in cycles), cycles
    # Cycles of 6 steps: active 3-5, then 9-11, each in its own file.
    names = [RunResult(0, "", "", path, run.report).step_names() for path in cycles]
    assert names == [[f"ProfilerStep#{n}" for n in (3, 4, 5)], [f"ProfilerStep#{n}" for n in (9, 10, 11)]]
    assert f"kept 2 profiler cycles, one trace each, in {tmp_path}" in run.stderr.replace("\n", " ")
    assert f"trace written: {cycles[1]}" in run.stderr or f"trace written: {cycles[1].name}" in run.stderr
    # The report is of the last cycle: its page names that file.
    assert cycles[1].name in run.report.read_text(encoding="utf-8")


def test_schedule_recording_from_step_zero(tmp_path: Path, probe_record: Path) -> None:
    run = run_in_process(tmp_path, "--wait", "0", "--warmup", "0", "--active", "2", str(PROBE), "steps=6")
    assert run.exit_code == 0, run.stderr
    assert run.step_names() == ["ProfilerStep#0", "ProfilerStep#1"]


def test_script_ending_in_the_first_active_step_says_the_trace_holds_only_the_tail(
    tmp_path: Path, probe_record: Path
) -> None:
    run = run_in_process(tmp_path, str(PROBE), "steps=3")
    assert run.exit_code == 0, run.stderr
    assert run.step_names() == ["ProfilerStep#3"]
    assert "ended after 3 steps, during the first recorded one" in run.stderr


def test_memory_and_json_options(tmp_path: Path, probe_record: Path) -> None:
    findings = tmp_path / "findings.json"
    run = run_in_process(tmp_path, "--memory", "--json", str(findings), str(PROBE), "steps=10")
    assert run.exit_code == 0, run.stderr
    assert any(event.get("name") == "[memory]" for event in run.events())
    assert isinstance(json.loads(findings.read_text(encoding="utf-8")), dict)


def test_profiler_failure_does_not_stop_the_script(
    tmp_path: Path, probe_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_step(self: object) -> None:
        raise RuntimeError("profiler broke")

    monkeypatch.setattr(torch.profiler.profile, "step", failing_step)
    run = run_in_process(tmp_path, str(PROBE), "steps=10")
    assert "probe done" in run.stdout  # the training went on
    assert run.exit_code == 3  # the script passed but no report was made: never 0 (a CI job would pass)
    assert "torch.profiler failed (RuntimeError: profiler broke)" in error_line(run.stderr)


@pytest.mark.parametrize(("error", "status"), [(TraceFormatError("unreadable"), 2), (RuntimeError("bug"), 3)])
def test_a_run_that_writes_no_report_does_not_exit_0(
    error: Exception, status: int, tmp_path: Path, probe_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A trace that cannot be read back (torch's unescaped ``traceName`` made one) or an analysis
    bug left no report, no ``--json`` file and exit 0; a failing script keeps its own status."""
    import traceinsight.commands.common

    def failing(*args: object, **kwargs: object) -> None:
        raise error

    monkeypatch.setattr(traceinsight.commands.common, "analyze_and_write", failing)
    run = run_in_process(tmp_path, str(PROBE), "steps=4")
    assert run.exit_code == status, run.stderr
    assert "no report was made" in error_line(run.stderr) and not run.report.exists()
    failed = run_in_process(tmp_path, str(PROBE), "steps=4", "end=exit3")
    assert failed.exit_code == 3 and not failed.report.exists()


def test_schedule_that_never_reaches_an_active_step_says_how_many_steps_ran(
    tmp_path: Path, probe_record: Path
) -> None:
    run = run_in_process(tmp_path, str(PROBE), "steps=2")
    assert run.exit_code == 0  # too few steps is a message, not exit 2, and not an "error:"
    assert "error:" not in run.stderr
    (line,) = [line for line in run.stderr.splitlines() if "no trace for" in line]
    assert "ran 2 steps" in line and "--wait" in line and str(PROBE) in line
    assert not run.trace.exists()
    assert "probe done" in run.stdout  # the script itself ran to the end


def test_optimizer_cycle_learns_which_optimizer_closes_an_iteration() -> None:
    single = OptimizerCycle()
    assert [single.ends_step(1) for _ in range(4)] == [True] * 4

    pair = OptimizerCycle()
    assert [pair.ends_step(opt) for opt in (1, 2) * 4] == [True, False, False, True, False, True, False, True]

    critic_then_generator = OptimizerCycle()  # WGAN: two critic steps per generator step
    calls = (1, 1, 2) * 3
    assert [critic_then_generator.ends_step(opt) for opt in calls] == [
        True, True, False, False, False, True, False, False, True,
    ]  # fmt: skip


def test_step_marker_ignores_forked_children_and_prefers_explicit_steps(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    ends: list[int] = []
    marker = StepMarker(lambda: ends.append(1))
    marker.optimizer_stepped(7)
    real_pid = os.getpid()
    monkeypatch.setattr(os, "getpid", lambda: real_pid + 1)  # as seen from a forked worker
    marker.optimizer_stepped(7)
    marker.explicit_step()
    monkeypatch.setattr(os, "getpid", lambda: real_pid)
    assert marker.steps_ended == 1
    marker.explicit_step()
    marker.optimizer_stepped(7)  # once the script marks steps itself, optimizers no longer do
    assert marker.steps_ended == 2 == len(ends)


def test_step_api_is_a_no_op_outside_traceinsight_run() -> None:
    step()
    with profile_step():
        pass


# --- the script runs as `python SCRIPT ARGS` would --------------------------------------------------


PARITY_ENDS = ["ok", "exit3", "exit-message", "raise"]


@pytest.mark.parametrize("end", PARITY_ENDS)
def test_parity_with_plain_python(end: str, tmp_path: Path, probe_record: Path) -> None:
    # Options after the script that look like ours belong to the script.
    words = [f"end={end}", "--trace", "not-ours.json.gz", "-o", "x", "-m", "--active", "9"]
    expected = plain_python(str(PROBE), *words, cwd=Path.cwd(), record=tmp_path / "python_record.json")
    run = run_in_process(tmp_path, str(PROBE), *words)

    assert read_record(probe_record) == read_record(tmp_path / "python_record.json")
    assert read_record(probe_record)["argv"] == [str(PROBE), *words]
    assert run.exit_code == expected.returncode == {"ok": 0, "exit3": 3, "exit-message": 1, "raise": 1}[end]
    assert run.stdout == expected.stdout
    # The script's own stderr (traceback, sys.exit message) appears exactly as Python shows it.
    assert expected.stderr in run.stderr
    assert run.trace.is_file()
    assert_report_written(run)


def test_script_that_raises_leaves_a_trace_that_analyze_loads(tmp_path: Path, probe_record: Path) -> None:
    run = run_in_process(tmp_path, str(PROBE), "steps=10", "end=raise")
    assert run.exit_code == 1
    assert "ValueError: the probe failed on purpose" in run.stderr
    assert run.step_names() == [f"ProfilerStep#{n}" for n in range(3, 8)]
    assert_report_written(run)
    analyzed = runner.invoke(app, ["analyze", str(run.trace), "-o", str(tmp_path / "again.html")])
    assert analyzed.exit_code == 0, analyzed.stderr


def test_module_mode_matches_python_dash_m(
    tmp_path: Path, probe_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shutil.copy(PROBE, tmp_path / "probe_as_module.py")
    words = ["end=exit3", "--json", "x"]
    expected = plain_python(
        "-m", "probe_as_module", *words, cwd=tmp_path, record=tmp_path / "python_record.json"
    )
    monkeypatch.chdir(tmp_path)
    run = run_in_process(tmp_path, "-m", "probe_as_module", *words)
    assert read_record(probe_record) == read_record(tmp_path / "python_record.json")
    assert run.exit_code == expected.returncode == 3
    assert run.trace.is_file()


# --- clear one-line errors -----------------------------------------------------------------------


def test_missing_script_is_one_clear_line(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere" / "train.py"
    run = run_in_process(tmp_path, str(missing))
    assert run.exit_code == 2
    line = error_line(run.stderr)
    assert str(missing) in line and "no such file" in line
    assert not run.trace.exists()


@pytest.mark.parametrize(("name", "phrase"), [("notes.txt", "not a Python file"), ("folder", "is a folder")])
def test_not_a_python_file_is_one_clear_line(name: str, phrase: str, tmp_path: Path) -> None:
    target = tmp_path / name
    if name == "folder":
        target.mkdir()
    else:
        target.write_text("print('hello')\n", encoding="utf-8")
    run = run_in_process(tmp_path, str(target))
    assert run.exit_code == 2
    assert phrase in error_line(run.stderr)


def test_unknown_module_is_one_clear_line(tmp_path: Path) -> None:
    run = run_in_process(tmp_path, "-m", "no_such_module_anywhere")
    assert run.exit_code == 2
    assert "no_such_module_anywhere" in error_line(run.stderr)


def test_missing_torch_names_the_install_command(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
    run = run_in_process(tmp_path, str(SCRIPTS / "no_steps.py"))
    assert run.exit_code == 2
    assert "pip install 'torch-traceinsight[run]'" in error_line(run.stderr)


def test_output_folder_that_does_not_exist_fails_before_the_script_runs(
    tmp_path: Path, probe_record: Path
) -> None:
    trace = tmp_path / "no_such_folder" / "t.json.gz"
    result = runner.invoke(app, ["run", "--trace", str(trace), str(PROBE), "steps=10"])
    assert result.exit_code == 2
    assert "no_such_folder" in error_line(result.stderr)
    assert not probe_record.exists()


@pytest.mark.parametrize(("words", "option"), [(["-o", "-"], "-o -"), (["--trace", "-"], "--trace -")])
def test_stdout_for_the_report_or_the_trace_fails_before_the_script_runs(
    words: list[str], option: str, tmp_path: Path, probe_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`run` writes its trace and report to files (stdout is the script's): ``-`` is refused in one
    line, and no file named ``-`` is left."""
    monkeypatch.chdir(tmp_path)
    result = runner.invoke(app, ["run", *words, str(PROBE), "steps=10"])
    assert result.exit_code == 2
    assert error_line(result.stderr).startswith(f"traceinsight: error: {option}: ")
    assert not probe_record.exists()
    assert list(tmp_path.iterdir()) == []


def test_analysis_failure_keeps_the_trace_and_prints_its_path(
    tmp_path: Path, probe_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def failing_analysis(trace: Path, *_: object, **__: object) -> None:
        raise TraceFormatError(f"cannot analyze {trace}: made to fail by the test")

    monkeypatch.setattr("traceinsight.commands.common.analyze_and_write", failing_analysis)
    run = run_in_process(tmp_path, str(PROBE), "steps=10", "end=exit3")
    assert run.exit_code == 3  # the script's status wins over ours
    assert f"trace written: {run.trace}" in run.stderr
    line = error_line(run.stderr)
    assert "made to fail by the test" in line and f"traceinsight analyze {run.trace}" in line
    assert run.step_names() == [f"ProfilerStep#{n}" for n in range(3, 8)]


def test_capture_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import traceinsight.capture, traceinsight.commands.run, traceinsight.commands.profiling\n"
        "traceinsight.capture.step()\n"
        "print('ok')\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "ok\n"


# --- real processes: exit status, Ctrl-C, forked DataLoader workers -------------------------------


def test_real_process_parity_with_forked_dataloader_workers(tmp_path: Path) -> None:
    words = ["steps=12", "workers=2", "end=exit3"]
    expected = plain_python(str(PROBE), *words, cwd=tmp_path, record=tmp_path / "python_record.json")
    ours = traceinsight_process(
        "run", "--trace", "t.pt.trace.json.gz", "-o", "r.html", str(PROBE), *words,
        cwd=tmp_path, record=tmp_path / "our_record.json",
    )  # fmt: skip
    assert ours.returncode == expected.returncode == 3, ours.stderr
    assert read_record(tmp_path / "our_record.json") == read_record(tmp_path / "python_record.json")
    assert ours.stdout == expected.stdout == "trained 12 steps\n"
    # Workers forked with the hook installed print and write nothing of ours.
    assert ours.stderr.count(NO_GPU_NOTE) == 1
    assert "USDT:" not in ours.stderr  # libkineto's own lines at each profiler start and stop
    assert ours.stderr.count("trace written") == 1
    assert sorted(path.name for path in tmp_path.iterdir()) == [
        "our_record.json", "python_record.json", "r.html", "t.pt.trace.json.gz",
    ]  # fmt: skip


def test_ctrl_c_still_writes_trace_and_report_then_dies_like_python(tmp_path: Path) -> None:
    words = ["steps=10", "interrupt_at=5"]
    expected = plain_python(str(PROBE), *words, cwd=tmp_path, record=tmp_path / "python_record.json")
    ours = traceinsight_process(
        "run", "--trace", "t.pt.trace.json.gz", "-o", "r.html", str(PROBE), *words,
        cwd=tmp_path, record=tmp_path / "our_record.json",
    )  # fmt: skip
    assert ours.returncode == expected.returncode == -signal.SIGINT, ours.stderr
    assert expected.stderr in ours.stderr  # the KeyboardInterrupt traceback, as Python shows it
    run = RunResult(
        ours.returncode, ours.stdout, ours.stderr, tmp_path / "t.pt.trace.json.gz", tmp_path / "r.html"
    )
    assert run.step_names() == ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#5"]
    assert run.report.is_file()


@pytest.mark.parametrize("delay", [0.05, 0.3, 0.6])
def test_ctrl_c_before_the_script_starts_is_one_line_and_status_130(delay: float, tmp_path: Path) -> None:
    """Ctrl-C while the command starts (its imports, torch's, the profiler's set-up): the script
    (which would write a file first thing) never ran, nothing is written, one line, 130."""
    script = tmp_path / "marks.py"
    script.write_text("open('ran', 'w').close()\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    process = subprocess.Popen(
        [sys.executable, "-m", "traceinsight", "run", str(script)],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),  # a shell's job, not ignoring it
    )
    time.sleep(delay)
    process.send_signal(signal.SIGINT)
    _, stderr = process.communicate(timeout=120)
    if (tmp_path / "ran").exists():
        pytest.skip(f"this machine started the script within {delay} s")  # not the case under test
    if (
        process.returncode != 130
        and "KeyboardInterrupt" in stderr
        and "traceinsight/__main__.py" not in stderr
    ):
        # Python was still starting (site, runpy: status 1) or finding the module (importlib, the
        # package's two-line __init__, which imports nothing else:
        # test_importing_the_package_loads_only_its_version: dies by SIGINT): the command's entry
        # had not started and Python prints its own traceback
        pytest.skip(f"Ctrl-C came within {delay} s, before Python started traceinsight's entry")
    assert process.returncode == 130, stderr
    assert stderr.splitlines() == [stderr.strip()] and "interrupted (Ctrl-C)" in stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == ["marks.py"]


# --- examples ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def example_run(
    tmp_path_factory: pytest.TempPathFactory,
) -> Callable[[str], tuple[RunResult, dict[str, Any]]]:
    """``traceinsight run --json`` of an example (each run once per module): the run and its JSON."""
    cache: dict[str, tuple[RunResult, dict[str, Any]]] = {}

    def get(name: str) -> tuple[RunResult, dict[str, Any]]:
        if name not in cache:
            folder = tmp_path_factory.mktemp(name.removesuffix(".py"))
            run = run_in_process(folder, "--json", str(folder / "run.json"), str(EXAMPLES / name))
            assert run.exit_code == 0, run.stderr
            cache[name] = (run, json.loads((folder / "run.json").read_text(encoding="utf-8")))
        return cache[name]

    return get


def line_of(script: str, text: str) -> int:
    """The 1-based line of ``script`` (in examples/) whose code (not a docstring or a comment)
    holds ``text``."""
    import ast

    source = (EXAMPLES / script).read_text()
    docstrings = {
        line
        for node in ast.walk(ast.parse(source))
        if isinstance(node, ast.Expr)
        and isinstance(node.value, ast.Constant)
        and isinstance(node.value.value, str)
        for line in range(node.lineno, (node.end_lineno or node.lineno) + 1)
    }
    (line,) = [
        n
        for n, code in enumerate(source.splitlines(), 1)
        if n not in docstrings and text in code.split("#", 1)[0]
    ]
    return line


@pytest.mark.parametrize("example", sorted(path.name for path in EXAMPLES.glob("*.py")))
def test_example_runs_on_cpu_and_the_report_says_there_was_no_gpu(
    example: str, example_run: Callable[[str], tuple[RunResult, dict[str, Any]]]
) -> None:
    run, _ = example_run(example)
    assert run.step_names() == [f"ProfilerStep#{n}" for n in range(3, 8)]
    assert_report_written(run)
    assert "no gpu" in run.report.read_text(encoding="utf-8").lower()


def test_item_every_step_is_a_latent_sync_at_its_line_and_its_twin_is_not(
    example_run: Callable[[str], tuple[RunResult, dict[str, Any]]],
) -> None:
    _, problem = example_run("item_every_step.py")
    _, fixed = example_run("item_every_step_fixed.py")
    line = line_of("item_every_step.py", "loss.item()")
    latent = [f for f in problem["findings"] if f["rule"] == "latent-sync"]
    assert [f["source"] for f in latent] == [f"item_every_step.py:{line}"]
    assert [f["source_line_kind"] for f in latent] == ["call"]  # run's call site: the call's own line
    assert not [f for f in fixed["findings"] if f["rule"] in ("latent-sync", "sync-in-forward")]


def test_tensor_branch_is_a_sync_in_forward_naming_its_module_and_its_twin_is_not(
    example_run: Callable[[str], tuple[RunResult, dict[str, Any]]],
) -> None:
    _, problem = example_run("tensor_branch.py")
    _, fixed = example_run("tensor_branch_fixed.py")
    line = line_of("tensor_branch.py", "if h.sum() > 0")
    (finding,) = [f for f in problem["findings"] if f["rule"] == "sync-in-forward"]
    assert finding["source"] == f"tensor_branch.py:{line}"
    assert "GatedBlock" in finding["title"]
    assert not [f for f in fixed["findings"] if f["rule"] in ("latent-sync", "sync-in-forward")]


def test_diff_of_an_example_and_its_fixed_twin_reports_the_finding_fixed(
    example_run: Callable[[str], tuple[RunResult, dict[str, Any]]], tmp_path: Path
) -> None:
    before, _ = example_run("item_every_step.py")
    after, _ = example_run("item_every_step_fixed.py")
    out = tmp_path / "diff.json"
    result = runner.invoke(
        app, ["diff", str(before.trace), str(after.trace), "--no-html", "--json", str(out)]
    )
    assert result.exit_code == 0, result.stderr
    comparison = json.loads(out.read_text())
    line = line_of("item_every_step.py", "loss.item()")
    fixed = [(f["rule"], f["site"]) for f in comparison["findings"] if f["status"] == "fixed"]
    assert ("latent-sync", f"item_every_step.py:{line}") in fixed
    assert not [f for f in comparison["findings"] if f["status"] == "new" and f["rule"] == "latent-sync"]


def test_a_failure_message_is_text_without_terminal_escapes() -> None:
    """torch's "Weights only load failed" message bolds a warning with ESC [1m … ESC [0m: the
    failure line drops such escapes, and replaces any other control character, so the panel, the
    page and the Markdown show text (the panel once carried the raw escapes)."""
    from traceinsight.capture.script import _failure_line

    error = RuntimeError("two options, \x1b[1mdo those steps only if you trust it\x1b[0m. \x07done\nmore")
    assert (
        _failure_line(error) == "RuntimeError: two options, do those steps only if you trust it. \ufffddone"
    )
    assert _failure_line(SystemExit("\x1b[31mred\x1b[0m")) == "sys.exit('\\x1b[31mred\\x1b[0m')"


# --- run's outputs, like analyze's (issue 33) -------------------------------------------------


def test_run_json_to_stdout_is_the_json_alone(tmp_path: Path) -> None:
    """`run --json - | jq`: the script's own prints go to stderr, stdout is the JSON."""
    ours = traceinsight_process(
        "run", "--trace", "t.pt.trace.json.gz", "-o", "r.html", "--json", "-", str(PROBE), "steps=12",
        cwd=tmp_path, record=tmp_path / "our_record.json",
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr
    document = json.loads(ours.stdout)
    assert document["tool"]["name"] == "traceinsight"
    assert "trained 12 steps" in ours.stderr


def test_run_takes_no_html_and_markdown(tmp_path: Path) -> None:
    ours = traceinsight_process(
        "run", "--trace", "t.pt.trace.json.gz", "--no-html", "--markdown", "-", str(PROBE), "steps=12",
        cwd=tmp_path, record=tmp_path / "our_record.json",
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr
    assert ours.stdout.startswith("## ") and "trained 12 steps" not in ours.stdout
    assert sorted(path.name for path in tmp_path.iterdir()) == ["our_record.json", "t.pt.trace.json.gz"]
    ours = traceinsight_process(
        "run", "--trace", "u.pt.trace.json.gz", "--no-html", "--markdown", "s.md", str(PROBE), "steps=12",
        cwd=tmp_path, record=tmp_path / "our_record.json",
    )  # fmt: skip
    assert ours.returncode == 0 and ours.stdout.startswith("trained 12 steps\n"), (
        ours.stderr
    )  # stdout is free
    assert (tmp_path / "s.md").read_text(encoding="utf-8").startswith("## ")
    assert not list(tmp_path.glob("*.html"))


# --- what a run says: would-be syncs, loops without torch.optim, paths, the stop (issue 30) --------

#: Operators that read a tensor's value on the host (a wait for the GPU when the value is there).
READS = {
    "aten::item", "aten::_local_scalar_dense", "aten::is_nonzero", "aten::nonzero", "aten::nonzero_static",
    "aten::masked_select", "aten::_unique2", "aten::unique_consecutive", "aten::unique_dim",
    "aten::repeat_interleave", "aten::tolist",
}  # fmt: skip


def outermost_reads(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Host ops in :data:`READS` not inside another one on the same thread."""
    reads = [e for e in events if e.get("cat") == "cpu_op" and e.get("name") in READS]
    return [
        read
        for read in reads
        if not any(
            other is not read
            and other["tid"] == read["tid"]
            and float(other["ts"]) <= float(read["ts"])
            and float(read["ts"]) + float(read["dur"]) <= float(other["ts"]) + float(other["dur"])
            for other in reads
        )
    ]


def inside_any(event: dict[str, Any], spans: list[dict[str, Any]]) -> bool:
    start = float(event["ts"])
    return any(
        span["tid"] == event["tid"] and float(span["ts"]) <= start <= float(span["ts"]) + float(span["dur"])
        for span in spans
    )


def run_script(tmp_path: Path, script: str, *options: str) -> tuple[RunResult, dict[str, Any]]:
    findings = tmp_path / "findings.json"
    run = run_in_process(tmp_path, "--json", str(findings), *options, str(SCRIPTS / script))
    assert run.exit_code == 0, run.stderr
    return run, json.loads(findings.read_text(encoding="utf-8"))


def script_line(script: str, text: str) -> int:
    (line,) = [n for n, code in enumerate((SCRIPTS / script).read_text().splitlines(), 1) if text in code]
    return line


def test_adam_and_a_dataset_that_reads_values_give_no_would_be_sync(tmp_path: Path) -> None:
    """Adam's step counters and what a Dataset reads (FakeData's .item(), Normalize's if) stay on the
    CPU with a GPU too: no card (they were cards at the optimizer.step() and for lines). Adam's reads
    are kept apart in the JSON, all of them; the Dataset's are not recorded (the fetch is recorded
    as its range, test below)."""
    run, document = run_script(tmp_path, "adam_with_dataset.py")
    assert not [f for f in document["findings"] if f["rule"] in ("latent-sync", "sync-in-forward")]
    events = run.events()
    reads = outermost_reads(events)
    loading = run.annotations("enumerate(DataLoader)#")
    adam = run.annotations("Optimizer.step#Adam.step")
    in_adam = [read for read in reads if inside_any(read, adam)]
    assert loading and in_adam and len(in_adam) == len(reads)
    kept = {(latent["cpu_value"], latent["count"]) for latent in document["latent_syncs"]}
    assert kept == {("optimizer step counters", len(in_adam))}


def test_the_dataloader_fetch_records_its_range_without_its_operators(tmp_path: Path) -> None:
    """Each batch's fetch is its enumerate(DataLoader) range alone: the Dataset's operators (hundreds
    per batch with torchvision-like transforms, each recorded with its shapes) made the fetch
    1.3-1.7x as slow under `run` as alone. The trace says so; the step's operators are all there;
    torch's warning about the toggle is not printed."""
    ours = traceinsight_process(
        "run", "--trace", "run.pt.trace.json.gz", "--no-html", str(SCRIPTS / "adam_with_dataset.py"),
        cwd=tmp_path, record=tmp_path / "unused.json",
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr
    run = RunResult(0, ours.stdout, ours.stderr, tmp_path / "run.pt.trace.json.gz", tmp_path / "unused")
    events = run.events()
    fetches = [e for e in run.annotations("enumerate(DataLoader)#") if e["name"].endswith("__next__")]
    steps = run.annotations("ProfilerStep#")
    assert len(fetches) == len(steps) == 5
    ops = [e for e in events if e.get("cat") == "cpu_op"]
    assert not [op for op in ops if inside_any(op, fetches)]
    # the step's own work: the model's matmul, the loss, Adam's update, in every step
    for name in ("aten::addmm", "aten::nll_loss_forward", "aten::addcmul_"):
        assert sum(1 for op in ops if op["name"] == name and inside_any(op, steps)) >= len(steps), name
    with gzip.open(run.trace, "rt", encoding="utf-8") as stream:
        assert json.load(stream)["traceinsight"]["loaderFetch"] == "range only"
    assert "Toggling" not in ours.stderr and "done" in ours.stdout


def test_the_dataloader_fetch_is_not_traced_but_its_for_line_is(tmp_path: Path) -> None:
    """The frame tracer is off inside the DataLoader's __next__ (Python-heavy Datasets ran up to 19x
    slower under it); the `for` line still gets its range around the fetch."""
    run, _ = run_script(tmp_path, "adam_with_dataset.py")
    frames = [e for e in run.events() if e.get("cat") == "python_function"]
    assert not [e for e in frames if e["name"].endswith(("__getitem__", "__len__"))]
    for_line = script_line("adam_with_dataset.py", "for images, targets in loader")
    sites = [e for e in frames if e["name"].startswith(f"adam_with_dataset.py({for_line}):")]
    fetches = [e for e in run.annotations("enumerate(DataLoader)#") if e["name"].endswith("__next__")]
    assert fetches and all(inside_any(fetch, sites) for fetch in fetches)


def test_the_dataset_runs_under_the_same_frames_as_alone_while_a_window_records(tmp_path: Path) -> None:
    """Between the script and its Dataset, the frames are torch's alone: the fetch's pause (operators
    and frame tracer off) was a wrapper around ``_next_data``, one frame more under every sample
    (a Dataset that formats its stack, or reseeds torch, pays per frame: 4-5 % of its fetch each,
    measured). The fetch is still paused (its range alone, no operator inside it)."""
    script = tmp_path / "walking.py"
    script.write_text(
        "import json, traceback\n"
        "import torch\n"
        "from torch.utils.data import DataLoader, Dataset\n"
        "class Walking(Dataset):\n"
        "    def __len__(self):\n"
        "        return 12 * 4\n"
        "    def __getitem__(self, index):\n"
        "        frames = [f'{f.name} {f.filename}' for f in traceback.extract_stack()]\n"
        "        first = next(n for n, f in enumerate(frames) if f.endswith('walking.py'))\n"
        "        STACKS.add(tuple(frames[first:-1]))\n"
        "        return torch.randn(4), index % 2\n"
        "STACKS = set()\n"
        "model = torch.nn.Linear(4, 2)\n"
        "optimizer = torch.optim.SGD(model.parameters(), lr=0.1)\n"
        "for x, y in DataLoader(Walking(), batch_size=4):\n"
        "    optimizer.zero_grad()\n"
        "    torch.nn.functional.cross_entropy(model(x), y).backward()\n"
        "    optimizer.step()\n"
        "print('STACKS', json.dumps(sorted(STACKS)))\n"
    )
    alone = plain_python(str(script), cwd=tmp_path, record=tmp_path / "unused.json")
    ours = traceinsight_process(
        "run", "--trace", "run.pt.trace.json.gz", "--no-html", str(script),
        cwd=tmp_path, record=tmp_path / "unused.json",
    )  # fmt: skip
    assert alone.returncode == ours.returncode == 0, ours.stderr
    stacks = [
        json.loads(line.split(" ", 1)[1])
        for line in (alone.stdout, ours.stdout)
        for line in line.splitlines()
        if line.startswith("STACKS ")
    ]
    assert len(stacks) == 2 and len(stacks[0]) == 1 and stacks[0][0][-1].startswith("<listcomp> ")
    assert stacks[1] == stacks[0]
    run = RunResult(0, ours.stdout, ours.stderr, tmp_path / "run.pt.trace.json.gz", tmp_path / "unused")
    fetches = [e for e in run.annotations("enumerate(DataLoader)#") if e["name"].endswith("__next__")]
    assert len(fetches) == len(run.step_names()) == 5
    assert not [e for e in run.events() if e.get("cat") == "cpu_op" and inside_any(e, fetches)]


def test_printing_the_loss_is_one_finding_at_its_line(tmp_path: Path) -> None:
    """print(loss) runs a boolean-mask selection, `if`s and .item() in torch's formatting: one card
    at the line, counted once per print (it was three cards with unrelated code)."""
    run, document = run_script(tmp_path, "print_loss.py")
    latent = [f for f in document["findings"] if f["rule"] in ("latent-sync", "sync-in-forward")]
    assert [f["source"] for f in latent] == [f"print_loss.py:{script_line('print_loss.py', 'print(loss)')}"]
    assert latent[0]["title"].startswith("`print(tensor)` or formatting a tensor")
    prints = [
        e for e in run.events() if e.get("cat") == "python_function" and e["name"].endswith(": __repr__")
    ]
    kinds = {read["name"] for read in outermost_reads(run.events()) if inside_any(read, prints)}
    assert len(prints) == len(run.step_names()) == 5 and len(kinds) >= 2
    assert latent[0]["title"].endswith("every step (this run had no GPU)")
    assert latent[0]["evidence"]["how often"].endswith(", 5 in the trace)")  # 5 prints, not 15 operators


def test_a_loop_without_torch_optim_is_profiled_by_steps_and_its_item_found_at_its_line(
    tmp_path: Path,
) -> None:
    """Manual SGD: backward() ends each step (from the second one), so the loop is profiled step by
    step with its lines (it was one window without frames or lines)."""
    run, document = run_script(tmp_path, "manual_sgd.py")
    assert run.step_names() == [f"ProfilerStep#{n}" for n in range(3, 8)]
    latent = [f for f in document["findings"] if f["rule"] == "latent-sync"]
    assert [f["source"] for f in latent] == [f"manual_sgd.py:{script_line('manual_sgd.py', 'loss.item()')}"]
    with gzip.open(run.trace, "rt", encoding="utf-8") as stream:
        assert json.load(stream)["traceinsight"]["stepMarks"] == "backward"


def test_recording_from_step_zero_leaves_no_absolute_path(tmp_path: Path) -> None:
    """With --wait 0 --warmup 0 the frame tracer starts before the script does: frames were named by
    their absolute path (the user's folder layout in a shared report)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    shutil.copy(SCRIPTS / "manual_sgd.py", tmp_path / "b" / "train.py")
    ours = traceinsight_process(
        "run", "--wait", "0", "--warmup", "0", "--trace", "t.pt.trace.json.gz", "-o", "r.html",
        "--json", "r.json", "../b/train.py", cwd=tmp_path / "a", record=tmp_path / "unused.json",
    )  # fmt: skip
    assert ours.returncode == 0, ours.stderr
    outputs = {name: (tmp_path / "a" / name).read_text(encoding="utf-8") for name in ("r.json", "r.html")}
    with gzip.open(tmp_path / "a" / "t.pt.trace.json.gz", "rt", encoding="utf-8") as stream:
        outputs["trace"] = stream.read()
    outputs["stderr"] = ours.stderr
    assert {name: text.count(str(tmp_path)) for name, text in outputs.items()} == dict.fromkeys(outputs, 0)
    document = json.loads(outputs["r.json"])
    assert [f["source"] for f in document["findings"] if f["rule"] == "latent-sync"] == [
        f"train.py:{script_line('manual_sgd.py', 'loss.item()')}"
    ]


def test_with_warmup_0_a_profiler_never_starts_inside_a_step_another_recorded(
    tmp_path: Path, probe_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--warmup 0: the start-up recording stops and step 1's starts at the same boundary. Started
    inside optimizer.step(), the new profiler received the end of the Optimizer.step# range the old
    one began (and freed): a corrupted heap, 7 crashes in 10 runs. It now starts once step() returns."""
    from torch.autograd.profiler import record_function
    from torch.profiler.profiler import _KinetoProfile

    open_steps: list[str] = []
    starts: list[int] = []
    enter, leave, original = record_function.__enter__, record_function.__exit__, _KinetoProfile.start_trace

    def entering(self: Any) -> Any:
        if self.name.startswith("Optimizer.step#"):
            open_steps.append(self.name)
        return enter(self)

    def leaving(self: Any, *args: Any) -> Any:
        if self.name.startswith("Optimizer.step#"):
            open_steps.remove(self.name)
        return leave(self, *args)

    def start_trace(self: Any) -> None:
        starts.append(len(open_steps))  # Optimizer.step# ranges open when a profiler starts
        original(self)

    monkeypatch.setattr(record_function, "__enter__", entering)
    monkeypatch.setattr(record_function, "__exit__", leaving)
    monkeypatch.setattr(_KinetoProfile, "start_trace", start_trace)
    run = run_in_process(tmp_path, "--warmup", "0", str(PROBE), "steps=8")
    assert run.exit_code == 0, run.stderr
    assert starts == [0, 0]  # the start-up recording, then the window: neither inside a step's range
    assert run.step_names() == [f"ProfilerStep#{n}" for n in range(1, 6)]


def test_writing_the_trace_is_logged_when_not_on_a_terminal(
    tmp_path: Path, probe_record: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In a log (stderr not a terminal) the write said nothing for 31 s; now a line every few
    seconds (every chunk here, with the interval at 0)."""
    monkeypatch.setattr("traceinsight.commands.profiling._LOG_PROGRESS_SECONDS", 0.0)
    monkeypatch.setattr("traceinsight.capture.export._PROGRESS_BYTES", 1 << 10)
    run = run_in_process(tmp_path, str(PROBE), "steps=10")
    progress = [
        line for line in run.stderr.splitlines() if line.startswith("traceinsight: writing the trace: ")
    ]
    assert len(progress) >= 2, run.stderr
    assert all(" MB (" in line and "%" in line for line in progress)


def test_the_progress_display_opens_once_per_written_window(tmp_path: Path) -> None:
    """The spinner came and went at every step; it is there only while a window is written."""
    from traceinsight.capture.recorder import ProfileSettings, RecorderEvents, TraceRecorder

    opened: list[int] = []

    def writing() -> Any:
        opened.append(1)
        return contextlib.nullcontext(None)

    recorder = TraceRecorder(ProfileSettings(), tmp_path / "t.json.gz", RecorderEvents(writing=writing))
    recorder.start()
    model = torch.nn.Linear(4, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(12):
        model(torch.randn(2, 4)).sum().backward()
        optimizer.step()
    capture = recorder.finish()
    assert capture.steps_in_trace == 5 and capture.trace is not None
    assert len(opened) == 1


def test_the_script_runs_under_no_frame_of_the_command_line_parser(tmp_path: Path) -> None:
    """A script that walks its stack pays for every frame above it (torch.manual_seed formats the
    stack once per call through torch.cuda._lazy_call; a Dataset reseeding per sample did it
    thousands of times per batch). The script ran under typer's and click's 8 frames (19 in all
    above and at its <module>, 2 with `python SCRIPT`): it now starts from the entry point."""
    script = tmp_path / "stack.py"
    script.write_text(
        "import json, traceback\n"
        "frames = [f.filename for f in traceback.extract_stack()]\n"
        "open('frames.json', 'w').write(json.dumps(frames))\n"
    )
    ours = traceinsight_process(
        "run", "--stacks", "none", str(script), cwd=tmp_path, record=tmp_path / "r.json"
    )
    assert ours.returncode == 0, ours.stderr
    frames = json.loads((tmp_path / "frames.json").read_text(encoding="utf-8"))
    assert frames[-1] == str(script)
    assert [f for f in frames if "/typer/" in f or "/click/" in f] == []
    assert len(frames) <= 10  # runpy 2 (python -m), our entry point 3, the runner 4, the script


def test_the_code_excerpts_line_shows_no_absolute_path_when_the_project_is_elsewhere(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The current folder and the script's project share nothing below the root: the line named
    the project by its absolute path (the machine's layout, in a log shared with the report). It is
    now named as the script's path was typed when that is relative, else by its name alone."""
    if os.path.commonpath([tmp_path.resolve(), REPO]) != os.sep:
        pytest.skip("the temporary folder lies inside the repository's folders")
    monkeypatch.chdir(tmp_path)
    typed = os.path.relpath(SCRIPTS / "manual_sgd.py", tmp_path)
    expected = {str(SCRIPTS / "manual_sgd.py"): REPO.name, typed: os.path.relpath(REPO, tmp_path)}
    for script, shown in expected.items():
        run = run_in_process(tmp_path, script)
        assert run.exit_code == 0, run.stderr
        (line,) = [line for line in run.stderr.splitlines() if "code excerpts" in line]
        assert line.split("): ", 1)[1].strip() == shown


def test_the_one_step_advice_of_a_run_asks_for_more_steps_never_more_waiting(tmp_path: Path) -> None:
    """One recorded step: the warning's advice said `traceinsight run --wait 2 …`, which leaves no
    trace at all where the script runs few steps or the memory budget ended the window; a run is
    advised in its own terms (more --active steps, --max-memory)."""
    _, document = run_script(tmp_path, "manual_sgd.py", "--active", "1")
    advice = [warning["advice"] for warning in document["warnings"] if warning["kind"] == "one-step"]
    assert advice and "--active" in advice[0] and "--max-memory" in advice[0]
    assert "--wait" not in advice[0]
    assert "train.py" not in json.dumps(document["warnings"])


def test_the_script_runs_under_three_frames_of_python_m_traceinsight(tmp_path: Path) -> None:
    """Code that formats its stack pays per frame above the script (`torch.manual_seed` does, per
    call, without CUDA): under `python -m traceinsight run` only runpy's two frames and
    traceinsight/__main__.py's module frame are left above it (9 before: the set-up and the tear-down
    ran as nested calls around it; 4 before the script ran in the module's frame, not in main())."""
    script = tmp_path / "stack.py"
    script.write_text(
        "import traceback\n"
        "for frame in traceback.extract_stack()[:-1]:\n"
        "    print('FRAME', frame.name, frame.filename)\n"
        "print('DONE')\n"
    )
    alone = plain_python(str(script), cwd=tmp_path, record=tmp_path / "unused.json")
    ours = traceinsight_process("run", str(script), cwd=tmp_path, record=tmp_path / "unused.json")
    assert alone.returncode == ours.returncode == 0, ours.stderr
    frames = [line.split(" ", 2)[1:] for line in ours.stdout.splitlines() if line.startswith("FRAME")]
    assert [line for line in alone.stdout.splitlines() if line.startswith("FRAME")] == []
    assert len(frames) == 3, frames
    assert [name for name, file in frames if file == str(REPO / "traceinsight" / "__main__.py")] == [
        "<module>"
    ]


def test_rank_zeros_job_hint_names_paths_as_typed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Rank 0's hint for the job report printed absolute paths (the user's folder layout, in a log
    shared with the report); every other path run prints is relative inside the current folder."""
    from rich.console import Console

    from traceinsight.capture.distributed import RankInfo
    from traceinsight.commands.profiling import OutputPaths, _say_job_files, _Speaker

    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "train.20260101-000000.job"
    paths = OutputPaths(
        trace=folder / "train.rank0.pt.trace.json.gz",
        report=folder / "train.rank0.report.html",
        json_out=None,
    )
    console = Console(file=io.StringIO(), width=400)
    _say_job_files(_Speaker(console, RankInfo(0, 2)), paths, RankInfo(0, 2))
    said = console.file.getvalue()  # type: ignore[attr-defined]
    assert str(tmp_path) not in said, said
    assert "traceinsight analyze train.20260101-000000.job/ " in said
    assert "train.20260101-000000.job/train.rank1.pt.trace.json.gz" in said


def test_a_log_hears_from_the_stop_from_its_start(monkeypatch: pytest.MonkeyPatch) -> None:
    """torch's stop and export of a large window say nothing for a minute or more: the first line
    in a log came 47 s after the stop began. Lines come every few seconds from its start until our
    pass over the export reports its own progress."""
    from rich.console import Console

    import traceinsight.commands.profiling as run_command

    monkeypatch.setattr(run_command, "_LOG_PROGRESS_SECONDS", 0.05)
    console = Console(file=io.StringIO(), width=300)  # not a terminal: a log
    speaker = run_command._Speaker(console, None)
    with speaker.writing() as progress:
        time.sleep(0.4)  # torch stopping and exporting
        said = console.file.getvalue()  # type: ignore[attr-defined]
        assert progress is not None
        progress(0, 100)  # our pass begins: it reports itself from now on
        time.sleep(0.3)
    lines = [line for line in said.splitlines() if "stopping the profiler and exporting its trace:" in line]
    assert len(lines) >= 3 and "process memory" in lines[0], said
    after = console.file.getvalue()[len(said) :]  # type: ignore[attr-defined]
    assert "stopping the profiler" not in after.split("\n", 1)[-1]
