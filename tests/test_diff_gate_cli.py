"""`traceinsight diff`, the gate options and `--markdown` through the real CLI.

The figures diff shows are checked against the raw traces in test_compare.py; here the commands
are held to what they promise: which files they write, what goes to stdout, and the exit status
of every budget (0 kept, 1 broken, 2 bad input), from the command line and from pyproject.toml.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from loops import copy_loop, item_loop
from markdown_it import MarkdownIt
from tracebuild import SAMPLES, read_events, write_trace
from typer.testing import CliRunner

from traceinsight.cli import app

runner = CliRunner()

WORKERS0 = SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz"
WORKERS4 = SAMPLES / "v100_resnet50_workers4.pt.trace.json.gz"


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def gate_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("traceinsight: gate: ")]


def median_step_us(path: Path) -> float:
    """The median step time: the spacing of when each step was done (``reference_split``)."""
    from reference_split import step_windows

    _, raw = read_events(path)
    return float(statistics.median((w.done - w.begin) / 1000 for w in step_windows(raw)))


@pytest.fixture(scope="module")
def loops(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A loop with ``.item()`` every step (a high sync finding) and its healthy twin."""
    folder = tmp_path_factory.mktemp("loops")
    synced = item_loop(prep_us=300)
    clean = copy_loop(
        kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_us=20, copy_stream=9, prep_us=0
    )
    return {
        "synced": write_trace(folder / "synced.json", synced.events),
        "clean": write_trace(folder / "clean.json", clean.events),
    }


def result_of(path: Path, tmp_path: Path) -> dict[str, Any]:
    out = tmp_path / f"{path.stem}.result.json"
    code, _, stderr = invoke("analyze", str(path), "--no-html", "--json", str(out))
    assert code == 0, stderr
    document: dict[str, Any] = json.loads(out.read_text())
    return document


# --- diff ----------------------------------------------------------------------------------------


def test_diff_writes_the_page_the_json_and_the_markdown(tmp_path: Path) -> None:
    page, data, summary = tmp_path / "diff.html", tmp_path / "diff.json", tmp_path / "diff.md"
    code, stdout, stderr = invoke(
        "diff", str(WORKERS0), str(WORKERS4), "-o", str(page), "--json", str(data), "--markdown", str(summary)
    )
    assert code == 0, stderr
    comparison = json.loads(data.read_text())
    step = next(metric for metric in comparison["metrics"] if metric["key"] == "step_time")
    assert step["before"] == pytest.approx(median_step_us(WORKERS0), abs=0.001)
    assert step["after"] == pytest.approx(median_step_us(WORKERS4), abs=0.001)
    fixed = [(f["rule"], f["site"]) for f in comparison["findings"] if f["status"] == "fixed"]
    assert fixed == [("dataloader-stall", "resnet50_profiler_api.py:42")]
    assert '<meta name="generator" content="traceinsight ' in page.read_text()
    tokens = MarkdownIt("gfm-like").parse(summary.read_text())
    assert any(token.type == "table_open" for token in tokens)
    assert "Fixed (1)" in stdout and "dataloader-stall" in stdout
    for path in (page, data, summary):
        assert str(path.name) in stdout


def test_a_stored_baseline_gives_the_same_diff_as_its_trace(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    assert invoke("analyze", str(WORKERS0), "--no-html", "--json", str(baseline))[0] == 0
    from_trace, from_json = tmp_path / "a.json", tmp_path / "b.json"
    assert invoke("diff", str(WORKERS0), str(WORKERS4), "--no-html", "--json", str(from_trace))[0] == 0
    assert invoke("diff", str(baseline), str(WORKERS4), "--no-html", "--json", str(from_json))[0] == 0
    one, two = json.loads(from_trace.read_text()), json.loads(from_json.read_text())
    assert one.pop("before") == WORKERS0.name and two.pop("before") == baseline.name
    assert one == two


def test_diff_of_a_trace_with_itself_reports_no_change(tmp_path: Path) -> None:
    out = tmp_path / "same.json"
    code, stdout, _ = invoke("diff", str(WORKERS4), str(WORKERS4), "--no-html", "--json", str(out))
    assert code == 0
    comparison = json.loads(out.read_text())
    assert all(metric["change"] in (0, None) for metric in comparison["metrics"])
    assert {finding["status"] for finding in comparison["findings"]} == {"still"}
    assert "Fixed" not in stdout and "New" not in stdout


def test_diff_json_to_stdout_is_only_json(tmp_path: Path) -> None:
    code, stdout, stderr = invoke("diff", str(WORKERS0), str(WORKERS4), "--no-html", "--json", "-")
    assert code == 0
    assert json.loads(stdout)["tool"] == {"name": "traceinsight", "kind": "diff"}
    assert "Before and after" in stderr


def test_a_diff_output_is_not_a_diff_input(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    assert invoke("diff", str(WORKERS4), str(WORKERS4), "--no-html", "--json", str(out))[0] == 0
    code, _, stderr = invoke("diff", str(out), str(WORKERS4), "--no-html")
    assert code == 2 and stderr.count("\n") == 1 and "output of traceinsight diff" in stderr


def test_diff_refuses_to_write_over_an_input(tmp_path: Path) -> None:
    baseline = tmp_path / "baseline.json"
    assert invoke("analyze", str(WORKERS0), "--no-html", "--json", str(baseline))[0] == 0
    before = baseline.read_bytes()
    code, _, stderr = invoke("diff", str(baseline), str(WORKERS4), "--no-html", "--json", str(baseline))
    assert code == 2 and "it is the trace being analyzed" in stderr
    assert baseline.read_bytes() == before


def test_diff_default_page_is_named_after_both_sides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert invoke("diff", str(WORKERS0), str(WORKERS4))[0] == 0
    assert [p.name for p in tmp_path.glob("*.html")] == [
        "v100_resnet50_workers0.pt.trace-vs-v100_resnet50_workers4.pt.trace.html"
    ]


# --- markdown ------------------------------------------------------------------------------------


def test_markdown_to_stdout_is_only_markdown(loops: dict[str, Path]) -> None:
    code, stdout, stderr = invoke("analyze", str(loops["synced"]), "--no-html", "--markdown", "-")
    assert code == 0
    assert stdout.startswith("## traceinsight: synced\\.json")
    assert "Scorecard" in stderr and "Scorecard" not in stdout.split("\n", 1)[0]


def test_json_and_markdown_cannot_both_take_stdout(loops: dict[str, Path]) -> None:
    code, stdout, stderr = invoke(
        "analyze", str(loops["synced"]), "--no-html", "--json", "-", "--markdown", "-"
    )
    assert code == 2 and stdout == "" and stderr.count("\n") == 1 and "both ask for stdout" in stderr


# --- the gate ------------------------------------------------------------------------------------


def test_fail_on_severity(loops: dict[str, Path], tmp_path: Path) -> None:
    synced = result_of(loops["synced"], tmp_path)
    high = [f for f in synced["findings"] if f["severity"] == "high" and not f["minor"]]
    assert high  # the planted .item() every step
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html", "--fail-on", "high")
    assert code == 1
    assert len(gate_lines(stderr)) == len(high)
    assert invoke("analyze", str(loops["clean"]), "--no-html", "--fail-on", "low")[0] == 0


def test_fail_on_rule(loops: dict[str, Path]) -> None:
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html", "--fail-on-rule", "sync-in-loop")
    assert code == 1 and all("sync-in-loop" in line for line in gate_lines(stderr)) and gate_lines(stderr)
    code, _, _ = invoke("analyze", str(loops["synced"]), "--no-html", "--fail-on-rule", "dataloader-stall")
    assert code == 0


def test_max_idle(loops: dict[str, Path], tmp_path: Path) -> None:
    idle = result_of(loops["synced"], tmp_path)["utilization"]["idle_share"] * 100
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html", "--max-idle", f"{idle - 1:.3f}")
    assert code == 1 and len(gate_lines(stderr)) == 1 and "over --max-idle" in stderr
    assert invoke("analyze", str(loops["synced"]), "--no-html", "--max-idle", f"{idle + 1:.3f}")[0] == 0


def test_max_syncs_per_step(loops: dict[str, Path]) -> None:
    # item_loop makes one cudaStreamSynchronize per step
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html", "--max-syncs-per-step", "0.5")
    assert code == 1 and "over --max-syncs-per-step" in stderr
    assert invoke("analyze", str(loops["synced"]), "--no-html", "--max-syncs-per-step", "1")[0] == 0
    assert invoke("analyze", str(loops["clean"]), "--no-html", "--max-syncs-per-step", "0")[0] == 0


def test_max_regression_on_diff(loops: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    code, _, _ = invoke("diff", str(loops["clean"]), str(loops["synced"]), "--no-html", "--json", str(out))
    assert code == 0
    step = next(m for m in json.loads(out.read_text())["metrics"] if m["key"] == "step_time")
    growth = (step["after"] - step["before"]) / step["before"] * 100
    assert growth > 0
    args = ("diff", str(loops["clean"]), str(loops["synced"]), "--no-html", "--max-regression")
    code, _, stderr = invoke(*args, f"{growth - 1:.3f}")
    assert code == 1 and len(gate_lines(stderr)) == 1 and "over --max-regression" in stderr
    assert invoke(*args, f"{growth + 1:.3f}")[0] == 0
    assert (
        invoke("diff", str(loops["synced"]), str(loops["clean"]), "--no-html", "--max-regression", "0")[0]
        == 0
    )


def test_budgets_from_pyproject_and_the_command_line_wins(
    loops: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.traceinsight]\nmax-syncs-per-step = 0.5\n")
    monkeypatch.chdir(tmp_path)
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html")
    assert code == 1 and "over --max-syncs-per-step 0.5" in stderr
    assert invoke("analyze", str(loops["synced"]), "--no-html", "--max-syncs-per-step", "2")[0] == 0


def test_a_gate_does_not_hide_bad_input_or_bad_options(loops: dict[str, Path], tmp_path: Path) -> None:
    broken = tmp_path / "broken.json"
    broken.write_text('{"traceEvents": [')
    code, _, stderr = invoke("analyze", str(broken), "--no-html", "--fail-on", "high")
    assert code == 2 and stderr.startswith("traceinsight: error: ")
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html", "--fail-on", "critical")
    assert code == 2 and stderr.count("\n") == 1 and "high, medium, low" in stderr


def test_a_broken_gate_still_writes_every_output(loops: dict[str, Path], tmp_path: Path) -> None:
    page, data = tmp_path / "r.html", tmp_path / "r.json"
    code, _, _ = invoke(
        "analyze", str(loops["synced"]), "-o", str(page), "--json", str(data), "--fail-on", "high"
    )
    assert code == 1 and page.is_file() and json.loads(data.read_text())["findings"]


# --- a reader that goes away (`traceinsight analyze … | head`) ------------------------------------


def run_real(args: list[str], *, stdout_gone: bool) -> tuple[int, str]:
    """The real command in a process of its own; its stdout /dev/null, or a pipe whose reader has
    already gone, so that its first write there fails as after ``| head``."""
    command = [sys.executable, "-m", "traceinsight", *args]
    if not stdout_gone:
        done = subprocess.run(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=300
        )
        return done.returncode, done.stderr
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run(command, stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    return done.returncode, done.stderr


@pytest.mark.parametrize(
    "case",
    ["analyze, gate kept", "analyze, gate broken", "analyze, Markdown to stdout", "diff, gate broken"],
)
def test_a_cut_stdout_changes_neither_the_status_nor_the_files(
    case: str, loops: dict[str, Path], tmp_path: Path
) -> None:
    """The summary's reader going away is no failure: the status is the one the work gives (0,
    or 1 for a broken gate, with its line on stderr), never rich's 1 for a cut pipe, and every
    file is written as it is without the cut."""
    synced, clean = str(loops["synced"]), str(loops["clean"])
    args = {
        "analyze, gate kept": ["analyze", clean, "--no-html", "--fail-on", "low"],
        "analyze, gate broken": ["analyze", synced, "-o", "r.html", "--fail-on", "high"],
        "analyze, Markdown to stdout": ["analyze", synced, "--no-html", "--markdown", "-"],
        "diff, gate broken": ["diff", clean, synced, "--no-html", "--max-regression", "0"],
    }[case]
    results = []
    for gone in (False, True):
        folder = tmp_path / ("gone" if gone else "kept")
        folder.mkdir()
        outputs = [arg.replace("r.html", str(folder / "r.html")) for arg in args]
        code, stderr = run_real([*outputs, "--json", str(folder / "r.json")], stdout_gone=gone)
        assert "Traceback" not in stderr, stderr
        data = json.loads((folder / "r.json").read_text())
        page = folder / "r.html"
        results.append((code, gate_lines(stderr), data, page.read_text() if page.exists() else None))
    assert results[1] == results[0]
    assert results[0][0] == (1 if "broken" in case else 0) and bool(results[0][1]) == ("broken" in case)


# --- help ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("command", ["analyze", "diff", "run"])
def test_help_is_plain_and_says_the_exit_codes(command: str) -> None:
    code, stdout, _ = invoke(command, "--help")
    stdout = " ".join(stdout.split())
    assert code == 0
    assert "<bool>" not in stdout
    assert not re.search(r"--[\w-]+ <", stdout), "an option shows a type placeholder, not a metavar"
    if command != "run":
        assert "[tool.traceinsight]" in stdout  # not eaten as markup
        assert "Exit status: 0 done; 1 a gate was broken" in stdout
        assert "[default: ./<" in stdout  # -o's default


# --- a stored result is untrusted input ----------------------------------------------------------


def test_a_hostile_stored_result_is_data_or_one_line(tmp_path: Path) -> None:
    baseline = result_of(WORKERS0, tmp_path)
    hostile = json.loads(json.dumps(baseline))
    hostile["findings"][0]["title"] = (
        "\x1b[2J\x1b]0;pwned\x07 [bold]b[/bold] <img src=x> [x](https://evil.example)"
    )
    after = tmp_path / "hostile.json"
    after.write_text(json.dumps(hostile))
    stored = tmp_path / "baseline.json"
    stored.write_text(json.dumps(baseline))
    page, summary = tmp_path / "d.html", tmp_path / "d.md"
    code, stdout, stderr = invoke(
        "diff", str(stored), str(after), "-o", str(page), "--markdown", str(summary)
    )
    assert code == 0, stderr
    for text in (stdout, page.read_text(), summary.read_text()):
        assert "\x1b" not in text and "\x07" not in text
    assert "[bold]b[/bold]" in stdout  # rich markup shown as written
    assert "<img" not in page.read_text()
    rendered = MarkdownIt("gfm-like").render(summary.read_text())
    assert "<a " not in rendered and "<img" not in rendered

    broken = json.loads(json.dumps(baseline))
    broken["kernels"] = [{"device": "GPU zero", "name": 3}]
    after.write_text(json.dumps(broken))
    code, _, stderr = invoke("diff", str(stored), str(after), "--no-html")
    assert code == 2 and stderr.count("\n") == 1 and "not a complete traceinsight result" in stderr
