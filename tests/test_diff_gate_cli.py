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

from traceinsight.commands import app

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
    assert code == 2 and "it is one of the runs compared" in stderr
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


@pytest.mark.parametrize("command", ["analyze", "diff", "job"])
def test_the_page_to_stdout_is_the_page_a_file_gets(
    command: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-o -`` writes the page to stdout, byte for byte the page ``-o FILE`` writes (the summary
    goes to stderr), and no file named ``-``."""
    subjects = {
        "analyze": ["analyze", str(WORKERS0)],
        "diff": ["diff", str(WORKERS0), str(WORKERS4)],
        "job": ["analyze", str(SAMPLES / "two_ranks")],
    }[command]
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke(*subjects, "-o", "-")
    assert code == 0, stderr
    assert list(tmp_path.iterdir()) == []
    page = tmp_path / "page.html"
    code, _, _ = invoke(*subjects, "-o", str(page))
    assert code == 0
    assert stdout == page.read_text(encoding="utf-8")
    summary = "traceinsight job: 2 ranks" if command == "job" else "╭─ traceinsight"
    assert stdout.startswith("<!DOCTYPE html>") and summary not in stdout
    assert summary in stderr


def test_per_rank_reports_are_never_sent_to_stdout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``--per-rank -`` is one line and status 2; no folder named ``-`` is made."""
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke("analyze", str(SAMPLES / "two_ranks"), "--per-rank", "-", "--no-html")
    assert code == 2 and stdout == "" and stderr.count("\n") == 1 and "--per-rank -: " in stderr
    assert list(tmp_path.iterdir()) == []


def test_a_page_named_dash_is_written_as_dot_slash_dash(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``-o ./-`` is a file named ``-`` (as ``--json ./-`` is), not stdout."""
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke("analyze", str(WORKERS0), "-o", "./-")
    assert code == 0, stderr
    assert "<html" not in stdout and (tmp_path / "-").read_text(encoding="utf-8").startswith(
        "<!DOCTYPE html>"
    )


@pytest.mark.parametrize(
    ("words", "phrase"),
    [
        (["-o", "-", "--json", "-"], "-o - and --json - both ask for stdout"),
        (["-o", "-", "--markdown", "-"], "-o - and --markdown - both ask for stdout"),
        (["-o", "-", "--json", "-", "--markdown", "-"], "-o -, --json - and --markdown - all ask for stdout"),
    ],
)
def test_the_page_cannot_share_stdout(
    words: list[str], phrase: str, loops: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke("analyze", str(loops["synced"]), *words)
    assert code == 2 and stdout == "" and stderr.count("\n") == 1 and phrase in stderr
    assert list(tmp_path.iterdir()) == []
    code, _, stderr = invoke("analyze", str(loops["synced"]), *words, "--no-html")  # no page: -o - is moot
    assert code == (0 if len(words) == 4 else 2), stderr


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
    usage = next(line for line in stdout.splitlines() if line.startswith("Usage: "))
    stdout = " ".join(stdout.split())
    assert code == 0
    assert "<bool>" not in stdout
    assert not re.search(r"--[\w-]+ <", stdout), "an option shows a type placeholder, not a metavar"
    assert "{" not in usage and "}" not in usage, usage  # typer writes a required argument {SCRIPT}
    if command == "run":
        # typer 0.16 (the floor) writes "SCRIPT SCRIPT_ARGS", later releases "SCRIPT [SCRIPT_ARGS]..."
        assert re.search(r" run \[OPTIONS\] SCRIPT \[?SCRIPT_ARGS(\]\.\.\.)?$", usage.rstrip()), usage
        assert "before its first recorded step (--wait + --warmup steps come first)" in stdout
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
    assert code == 2 and stderr.count("\n") == 1 and "kernels[0].device is a string, not an integer" in stderr


# --- issue 31: a stored result is input like a trace ------------------------------------------------


@pytest.fixture(scope="module")
def stored_baseline(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """A real stored result (analyze --json of a sample) and its text."""
    folder = tmp_path_factory.mktemp("stored")
    out = folder / "baseline.json"
    code, _, stderr = invoke(
        "analyze", str(SAMPLES / "gp100_mlp_pageable_sync.json.gz"), "--no-html", "--json", str(out)
    )
    assert code == 0, stderr
    return out, out.read_text()


def _edited(text: str, edit: Any) -> str:
    document = json.loads(text)
    edit(document)
    return json.dumps(document, indent=2)


def _set(path: str, value: Any) -> Any:
    """An edit that sets the field at ``path`` (dots, and [n] for list items) to ``value``."""

    def edit(document: Any) -> None:
        keys = [int(key) if key.isdigit() else key for key in re.split(r"\.|\[|\]\.?", path) if key != ""]
        for key in keys[:-1]:
            document = document[key]
        document[keys[-1]] = value

    return edit


HOSTILE_RESULTS: dict[str, tuple[Any, str]] = {
    # wrong types and values: one line naming the field, exit 2 (an internal error, exit 3, before)
    "findings-an-object": (lambda t: _edited(t, _set("findings", {"a": 1})), "findings is an object, not a list"),
    "a-list-where-an-object-belongs": (lambda t: _edited(t, _set("utilization", [1, 2])),
                                       "utilization is a list, not an object"),
    "share-a-string": (lambda t: _edited(t, _set("utilization.busy_share", "99%")),
                       "utilization.busy_share is a string, not a number from 0 to 1"),
    "share-above-one": (lambda t: _edited(t, _set("utilization.idle_share", 7.5)), "utilization.idle_share is the number 7.5"),
    "negative-count": (lambda t: _edited(t, _set("kernels[0].count", -3)), "kernels[0].count is the number -3"),
    "unknown-severity": (lambda t: _edited(t, _set("findings[0].severity", "critical")), "findings[0].severity"),
    "a-boolean-as-a-count": (lambda t: _edited(t, _set("steady_state.steady_steps", True)),
                             "steady_state.steady_steps is a boolean"),
    "no-utilization": (lambda t: _edited(t, lambda d: d.pop("utilization")), "utilization is null, not an object"),
    # Markdown and terminal payloads in a rule id: ids are an alphabet, so never shown at all
    "markdown-in-a-rule": (lambda t: _edited(t, _set("findings[0].rule", "x`](https://evil.example)![i](x)<details>")),
                           "findings[0].rule is a string, not an id"),
    "markup-in-a-cause-key": (lambda t: _edited(t, _set("utilization.idle_by_cause_us", {"[link=https://e.x]y": 1.0})),
                              "a key of utilization.idle_by_cause_us is a string, not an id"),
    # numbers
    "integer-of-5000-digits": (lambda t: re.sub(r'"steady_steps": [0-9]+', '"steady_steps": ' + "9" * 5000, t, count=1),
                               "an integer of 5,000 digits"),
    "number-1e400": (lambda t: re.sub(r'"window_us": [0-9.]+', '"window_us": 1e400', t, count=1), "the number 1e400 is out of range"),
    "NaN": (lambda t: re.sub(r'"busy_share": [0-9.]+', '"busy_share": NaN', t, count=1), "NaN is not a number JSON allows"),
    "Infinity": (lambda t: re.sub(r'"total_us": [0-9.]+', '"total_us": -Infinity', t, count=1),
                 "-Infinity is not a number JSON allows"),
    "a-time-of-a-million-years": (lambda t: _edited(t, _set("steady_state.step_time_us", 3e19)),
                                  "steady_state.step_time_us is the number 3e+19"),
    # nesting, below and past what Python's own parser stands
    "nested-100-deep": (lambda t: _edited(t, _set("run", json.loads("[" * 100 + "]" * 100))), "nested deeper than 32 levels"),
    "nested-100000-deep": (lambda t: t.replace('"run": null', '"run": ' + "[" * 100_000 + "]" * 100_000, 1),
                           "nested deeper than 32 levels"),
    # not ours to compare
    "a-job-result": (lambda t: _edited(t, _set("kind", "job")), "it is a job's result"),
    "not-utf8": (lambda t: t.replace('"title": "', '"title": "\udcff', 1), "it is not UTF-8 text"),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(HOSTILE_RESULTS))
def test_a_hostile_stored_result_is_one_line_and_exit_2(
    case: str, stored_baseline: tuple[Path, str], tmp_path: Path
) -> None:
    baseline, text = stored_baseline
    make, words = HOSTILE_RESULTS[case]
    hostile = tmp_path / "hostile.json"
    made = make(text)
    hostile.write_bytes(made.encode("utf-8", "surrogateescape"))
    for sides in ((hostile, baseline), (baseline, hostile)):
        code, _, stderr = invoke("diff", *map(str, sides), "--no-html", "--json", str(tmp_path / "d.json"))
        assert code == 2, (case, stderr)
        assert stderr.count("\n") == 1 and stderr.startswith("traceinsight: error: cannot compare "), stderr
        assert str(hostile) in stderr and words in stderr, stderr
        assert not (tmp_path / "d.json").exists()


def test_a_stored_result_past_the_size_limit_is_refused_unread(
    stored_baseline: tuple[Path, str], tmp_path: Path
) -> None:
    """A result is small (the samples' largest is 0.55 MB); a 17 MB one is refused before it is
    parsed (a 210 MB one took 5.1 GB), unless --max-size says more."""
    baseline, text = stored_baseline
    padded = tmp_path / "padded.json"
    padded.write_text(text.replace('"findings": [', '"findings": [' + " " * (17 << 20), 1))
    code, _, stderr = invoke("diff", str(padded), str(baseline), "--no-html")
    assert code == 2 and "larger than 16 MiB" in stderr and "--max-size" in stderr, stderr
    code, _, stderr = invoke("diff", str(padded), str(baseline), "--no-html", "--max-size", "20MB")
    assert code == 0, stderr
    code, _, stderr = invoke("diff", str(baseline), str(baseline), "--no-html", "--max-size", "1kB")
    assert code == 2 and "--max-size" in stderr, stderr


def test_a_fifo_given_to_diff_is_refused_without_waiting(
    stored_baseline: tuple[Path, str], tmp_path: Path
) -> None:
    baseline, _ = stored_baseline
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    done = subprocess.run(
        [sys.executable, "-m", "traceinsight", "diff", str(fifo), str(baseline), "--no-html"],
        capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": os.getcwd()},
    )  # fmt: skip
    assert done.returncode == 2 and "named pipe (FIFO)" in done.stderr, done.stderr
    assert done.stderr.count("\n") == 1


def test_diff_json_is_strict_and_payloads_stay_data(
    stored_baseline: tuple[Path, str], tmp_path: Path
) -> None:
    """Titles, sources and kernel names of a stored result, and its file name, are free text:
    shown as written in every renderer, control characters replaced (the name reached the
    terminal panel and the diff's JSON raw); the diff's JSON parses with a strict parser."""
    baseline, text = stored_baseline
    payload = (
        "\x1b]8;;https://evil.example\x07click\x1b]8;;\x07 [red]r[/red] `x`](https://e.x) ![i](x) <details>"
    )
    hostile = tmp_path / "hostile\x1b]0;title\x07.json"

    def plant(document: Any) -> None:
        document["findings"][0]["title"] = payload
        document["findings"][0]["source"] = payload
        document["kernels"][0]["name"] = payload
        document["devices"] = [{**document["devices"][0], "name": payload}]

    hostile.write_text(_edited(text, plant))
    page, summary, data = tmp_path / "d.html", tmp_path / "d.md", tmp_path / "d.json"
    code, stdout, stderr = invoke(
        "diff", str(baseline), str(hostile), "-o", str(page), "--markdown", str(summary), "--json", str(data)
    )
    assert code == 0, stderr
    for shown in (stdout, page.read_text(), summary.read_text(), data.read_text()):
        assert "\x1b" not in shown and "\x07" not in shown
    assert "[red]r[/red]" in stdout
    tokens = MarkdownIt("gfm-like").parse(summary.read_text())
    kinds = {token.type for token in tokens} | {c.type for token in tokens for c in token.children or ()}
    assert not kinds & {"link_open", "image", "html_inline", "html_block"}, kinds

    def strict(name: str) -> None:
        raise ValueError(f"{name} in the diff's JSON")

    result = json.loads(data.read_text(), parse_constant=strict)
    assert result["after"] == "hostile\ufffd]0;title\ufffd.json"
    for value in re.findall(r'"((?:[^"\\]|\\.)*)"', data.read_text()):
        assert not re.search(r"\\u00[01][0-9a-fA-F]", value), value  # no control character, even escaped


def test_renderers_show_a_stored_rule_as_data() -> None:
    """Were a hostile rule id to reach them (the reader refuses it), the Markdown code span cannot
    be closed by it and the terminal cell shows it as written."""
    from io import StringIO

    from rich.console import Console

    from traceinsight.render.diff import comparison_renderables
    from traceinsight.render.markdown import MarkdownRenderer
    from traceinsight.results.comparison import Comparison, FindingChange, Metric

    rule = "x``](https://evil.example)![i](x)<details>[link=https://e.x]y[/link]`"
    comparison = Comparison(
        before="a", after="b", basis="in all", notes=(),
        metrics=(Metric("step_time", "time analyzed", "us", 10.0, 12.0),),
        idle=(Metric("idle:[bold]c", "[bold]c", "us", 1.0, 2.0),),
        findings=(FindingChange(status="new", rule=rule, site="", title="t", before_saving_us=None,
                                after_saving_us=1.0, severity="high"),), kernels=(),
    )  # fmt: skip
    tokens = MarkdownIt("gfm-like").parse(MarkdownRenderer().render(comparison))
    kinds = {token.type for token in tokens} | {c.type for token in tokens for c in token.children or ()}
    assert not kinds & {"link_open", "image", "html_inline", "html_block"}, kinds
    assert rule in [c.content for token in tokens for c in token.children or () if c.type == "code_inline"]
    screen = StringIO()
    console = Console(file=screen, force_terminal=True, color_system="truecolor", width=300)
    for part in comparison_renderables(comparison):
        console.print(part)
    assert "\x1b]8" not in screen.getvalue()  # no hyperlink
    plain = StringIO()
    for part in comparison_renderables(comparison):
        Console(file=plain, width=300).print(part)
    assert "[link=https://e.x]y[/link]" in plain.getvalue() and "[bold]c" in plain.getvalue()


# --- a strict gate (issue 33) --------------------------------------------------------------------

GP100 = SAMPLES / "gp100_mlp_pageable_sync.json.gz"


@pytest.mark.parametrize("typo", ["dataloader_stall", "sync-in-lop", "Sync-In-Loop"])
def test_an_unknown_rule_id_is_refused_naming_the_closest(loops: dict[str, Path], typo: str) -> None:
    code, stdout, stderr = invoke("analyze", str(loops["synced"]), "--no-html", "--fail-on-rule", typo)
    assert code == 2 and stdout == "" and stderr.count("\n") == 1
    closest = "dataloader-stall" if typo.startswith("dataloader") else "sync-in-loop"
    assert f"did you mean {closest!r}" in stderr and f"--fail-on-rule: {typo!r}" in stderr
    # every rule id is listed: the ids the rule modules register, read from their source
    ids = set()
    for module in (Path(__file__).parent.parent / "traceinsight" / "rules").glob("*.py"):
        ids |= set(re.findall(r'@rule\("([a-z0-9-]+)"\)', module.read_text()))
    assert len(ids) > 10 and all(rule_id in stderr for rule_id in ids)


def test_an_unknown_rule_id_in_the_project_table_is_refused(
    loops: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.traceinsight]\nfail-on-rule = ["dataloader-stal"]\n')
    monkeypatch.chdir(tmp_path)
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html")
    assert code == 2 and stderr.count("\n") == 1
    assert "pyproject.toml" in stderr and "did you mean 'dataloader-stall'" in stderr


@pytest.mark.parametrize("option", ["--max-idle", "--max-syncs-per-step"])
def test_an_infinite_budget_is_refused(loops: dict[str, Path], option: str) -> None:
    # (nan and negative numbers typer refuses itself, by the option's min=0)
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html", option, "inf")
    assert code == 2 and stderr.count("\n") == 1 and option in stderr and "finite" in stderr


@pytest.mark.parametrize("key", ["max-idle", "max-syncs-per-step", "max-regression"])
@pytest.mark.parametrize("value", ["nan", "inf"])
def test_a_table_budget_that_is_not_finite_is_refused(
    loops: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, key: str, value: str
) -> None:
    (tmp_path / "pyproject.toml").write_text(f"[tool.traceinsight]\n{key} = {value}\n")
    monkeypatch.chdir(tmp_path)
    code, _, stderr = invoke("analyze", str(loops["synced"]), "--no-html")
    assert code == 2 and stderr.count("\n") == 1 and key in stderr and "finite" in stderr


def test_an_infinite_max_regression_is_refused_on_diff(loops: dict[str, Path]) -> None:
    args = ("diff", str(loops["clean"]), str(loops["synced"]), "--no-html", "--max-regression", "inf")
    code, _, stderr = invoke(*args)
    assert code == 2 and stderr.count("\n") == 1 and "--max-regression" in stderr


def test_a_named_rule_trips_on_a_minor_finding_and_fail_on_does_not(tmp_path: Path) -> None:
    # gp100 copies from pageable memory, too few and short to be more than a minor finding
    _, events = read_events(GP100)
    pageable = [e for e in events if e.get("cat") == "gpu_memcpy" and "Pageable" in e.get("name", "")]
    assert pageable
    document = result_of(GP100, tmp_path)
    found = [f for f in document["findings"] if f["rule"] == "pageable-memcpy"]
    assert found and all(f["minor"] for f in found)
    code, _, stderr = invoke("analyze", str(GP100), "--no-html", "--fail-on-rule", "pageable-memcpy")
    assert code == 1 and gate_lines(stderr)
    assert all("a minor pageable-memcpy finding" in line for line in gate_lines(stderr))
    code, _, stderr = invoke("analyze", str(GP100), "--no-html", "--fail-on", "low")
    assert not any("pageable-memcpy" in line for line in gate_lines(stderr))


def _raw_kernel_counts(path: Path) -> dict[tuple[int, str], int]:
    _, events = read_events(path)
    counts: dict[tuple[int, str], int] = {}
    for event in events:
        if str(event.get("cat", "")).lower() == "kernel" and event.get("ph") == "X":  # "Kernel" in 2021
            key = (int(event.get("args", {}).get("device", event["pid"])), event["name"])
            counts[key] = counts.get(key, 0) + 1
    return counts


def test_diff_kernel_launches_are_per_step_like_the_times_beside_them(tmp_path: Path) -> None:
    out = tmp_path / "d.json"
    code, _, stderr = invoke("diff", str(WORKERS0), str(WORKERS4), "--no-html", "--json", str(out))
    assert code == 0, stderr
    document = json.loads(out.read_text())
    assert document["basis"] == "per step" and document["kernels"]
    steps = {
        side: result_of(path, tmp_path)["steady_state"]["steady_steps"]
        for side, path in (("before", WORKERS0), ("after", WORKERS4))
    }
    counts = {"before": _raw_kernel_counts(WORKERS0), "after": _raw_kernel_counts(WORKERS4)}
    for kernel in document["kernels"]:
        for side in ("before", "after"):
            raw = counts[side].get((kernel["device"], kernel["name"]), 0)
            assert kernel[f"{side}_count"] == raw
            assert kernel[f"{side}_launches"] == pytest.approx(raw / steps[side], abs=0.001)
    markdown = tmp_path / "d.md"
    invoke("diff", str(WORKERS0), str(WORKERS4), "--no-html", "--markdown", str(markdown))
    first = document["kernels"][0]
    per_step = f"{first['before_launches']:g} → {first['after_launches']:g}"
    totals = f"{first['before_count']} → {first['after_count']}"
    assert totals != per_step
    assert "### Kernels that changed most (per step)" in markdown.read_text()
    row = next(line for line in markdown.read_text().splitlines() if line.startswith("| 0 |"))
    assert totals not in row


BIDI_AND_C1 = "\u202e\u2066\x85\x9b\x7f\u2028"


def test_control_characters_in_stored_advice_code_are_never_shown(
    stored_baseline: tuple[Path, str], tmp_path: Path
) -> None:
    """Advice code keeps its newlines, but a stored result's bidi overrides and isolates, C1
    controls (``\\x9b`` is a terminal's CSI) and DEL reached the notebook card and every view."""
    from traceinsight import Result

    baseline, text = stored_baseline
    document = json.loads(text)
    advised = next(finding for finding in document["findings"] if finding.get("advice"))
    advised["advice"]["before"] = f"x = 1\nif evil{BIDI_AND_C1}:\n    pass"
    advised["advice"]["after"] = f"y{BIDI_AND_C1}"
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(document))
    read = Result.from_json(hostile.read_text())
    page, summary = tmp_path / "d.html", tmp_path / "d.md"
    code, stdout, stderr = invoke(
        "diff", str(baseline), str(hostile), "-o", str(page), "--markdown", str(summary)
    )
    assert code == 0, stderr
    card = read._repr_html_() or ""
    assert "if evil" in card and "\nif evil" in read.to_json().replace("\\n", "\n")
    for shown in (card, read.to_json(), stdout, page.read_text(), summary.read_text()):
        assert not any(character in shown for character in BIDI_AND_C1)
