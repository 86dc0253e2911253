"""diff, the gate and the Markdown summary: figures computed here from the raw traces."""

from __future__ import annotations

import json
import random
import statistics
from pathlib import Path

import pytest
from markdown_it import MarkdownIt
from tracebuild import (
    SAMPLES,
    annotation,
    cpu_op,
    frame,
    launch,
    read_events,
    sample_report,
    sample_result,
    write_trace,
)

from traceinsight.analysis import analyze
from traceinsight.errors import ConfigError
from traceinsight.load import load_trace
from traceinsight.render.markdown import MAX_CHARS, MarkdownRenderer, escape
from traceinsight.results import Report, Result, result_of
from traceinsight.results.comparison import compare
from traceinsight.results.gate import Budgets, broken, broken_diff, budgets_from_table
from traceinsight.results.stored import read_stored_result
from traceinsight.rules import evaluate

ALL_SAMPLES = sorted(str(path.relative_to(SAMPLES)) for path in SAMPLES.rglob("*.json*"))


def document(name: str) -> Result:
    result: Result = sample_result(name)
    return result


def median_step_us(name: str) -> float:
    """The median step time from the raw JSON: the spacing of when each step was done (its
    ProfilerStep range and the GPU work it launched, see ``reference_split.step_windows``; every
    step of these traces is steady)."""
    from reference_split import step_windows

    _, raw = read_events(SAMPLES / name)
    return float(statistics.median((w.done - w.begin) / 1000 for w in step_windows(raw)))


# --- diff --------------------------------------------------------------------------------------


def test_diff_of_the_serial_and_parallel_loader_runs() -> None:
    before, after = "v100_resnet50_workers0.pt.trace.json.gz", "v100_resnet50_workers4.pt.trace.json.gz"
    comparison = compare(document(before), document(after), before, after)
    assert comparison.basis == "per step"
    step = comparison.metric("step_time")
    assert step.before == pytest.approx(median_step_us(before), abs=0.001)
    assert step.after == pytest.approx(median_step_us(after), abs=0.001)
    assert step.change == pytest.approx(median_step_us(after) - median_step_us(before), abs=0.002)
    assert [(c.rule, c.site) for c in comparison.fixed] == [
        ("dataloader-stall", "resnet50_profiler_api.py:42")
    ]
    assert comparison.metric("idle:dataloader").after == 0
    assert not comparison.notes  # same GPU, same step count


def test_every_change_is_signed_the_same_way() -> None:
    """A fall is written with the minus sign (−) in each part of the change, never a hyphen beside
    it (was: ``−49.73 ms (-28.2%)``, ``-16.4 pts``); a rise with ``+``."""
    from traceinsight.results.comparison import Metric

    assert Metric("t", "step time", "us", 200.0, 150.0).change_text() == "−50.0 µs (−25.0%)"
    assert Metric("t", "step time", "us", 150.0, 200.0).change_text() == "+50.0 µs (+33.3%)"
    assert Metric("s", "GPU busy", "share", 0.5, 0.25).change_text() == "−25.0 pts"
    assert Metric("c", "syncs", "count", 3.0, 1.0).change_text() == "−2"
    assert Metric("c", "syncs", "count", 1.0, 1.00002).change_text() == "+2e-05"  # an exponent keeps its -
    before, after = "v100_resnet50_workers0.pt.trace.json.gz", "v100_resnet50_workers4.pt.trace.json.gz"
    texts = [
        metric.change_text() for metric in compare(document(before), document(after), before, after).shown
    ]
    assert any(text.startswith("−") for text in texts)
    assert not [text for text in texts if "-" in text]


def test_diff_of_a_trace_with_itself_changes_nothing() -> None:
    name = "v100_resnet50_workers0.pt.trace.json.gz"
    comparison = compare(document(name), document(name), name, name)
    assert all(metric.change in (0, None) for metric in (*comparison.metrics, *comparison.idle))
    assert {change.status for change in comparison.findings} == {"still"}
    assert comparison.kernels == ()
    assert all(c.before_saving_us == c.after_saving_us for c in comparison.findings)


def test_diff_says_when_the_setups_differ() -> None:
    comparison = compare(
        document("v100_resnet50_workers0.pt.trace.json.gz"), document("a100_recsys_rank0.json.gz"), "a", "b"
    )
    assert any("GPUs differ" in note for note in comparison.notes)
    assert any("step counts differ" in note for note in comparison.notes)


@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_a_stored_json_result_compares_as_the_live_one(name: str, tmp_path: Path) -> None:
    """Every sample's result, written and read back under the stored result's checks, is the live
    result (every field): the comparison is the same as with the live result."""
    live = document(name)
    path = tmp_path / "baseline.json"
    path.write_text(live.to_json())
    stored = read_stored_result(path, Result)
    assert stored is not None and stored.report is None
    assert stored == live
    assert compare(stored, live, "a", "b").to_json() == compare(live, live, "a", "b").to_json()
    assert compare(live, stored, "a", "b").to_json() == compare(live, live, "a", "b").to_json()
    assert read_stored_result(SAMPLES / name, Result) is None  # a trace


def test_a_schema_1_result_cannot_be_compared(tmp_path: Path) -> None:
    from traceinsight.errors import TraceFormatError

    path = tmp_path / "old.json"
    path.write_text('{"schema": 1, "tool": {"name": "traceinsight"}, "findings": []}')
    with pytest.raises(TraceFormatError, match="schema 1"):
        read_stored_result(path, Result)


def test_the_diff_json_keeps_every_figure() -> None:
    comparison = compare(
        document("gp100_mlp_pageable_sync.json.gz"), document("gp100_mlp_pageable_sync.json.gz"), "a", "b"
    )
    data = json.loads(comparison.to_json())
    assert {m["key"] for m in data["metrics"]} >= {"step_time", "busy_share", "idle_share", "syncs_per_step"}
    assert all(f["status"] == "still" for f in data["findings"])


# --- the gate ----------------------------------------------------------------------------------


def _loop(tmp_path: Path, *, with_sync: bool) -> Result:
    """A GPU-bound loop: with ``.item()`` draining the queue every step, or a healthy twin."""
    from loops import copy_loop, item_loop

    loop = (
        item_loop(prep_us=300)
        if with_sync
        else copy_loop(
            kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_us=20, copy_stream=9, prep_us=0
        )
    )
    analysis = analyze(load_trace(write_trace(tmp_path / f"loop{with_sync}.json", loop.events)))
    return result_of(Report(analysis, evaluate(analysis)))


def test_each_budget_passes_and_breaks(tmp_path: Path) -> None:
    clean, synced = _loop(tmp_path, with_sync=False), _loop(tmp_path, with_sync=True)
    assert synced.utilization.idle_share is not None
    idle = synced.utilization.idle_share * 100
    cases = [
        Budgets(fail_on="high"),
        Budgets(fail_on_rules=("sync-in-loop",)),
        Budgets(max_idle=idle - 1),
        Budgets(max_syncs_per_step=0.5),
    ]
    for budgets in cases:
        assert broken(clean, budgets) == [], budgets
        lines = broken(synced, budgets)
        assert len(lines) >= 1 and all("\n" not in line for line in lines), budgets
    assert broken(synced, Budgets(max_idle=idle + 1, max_syncs_per_step=1)) == []
    assert any("over --max-idle" in line for line in broken(synced, Budgets(max_idle=idle - 1)))


def test_the_regression_budget_compares_step_time(tmp_path: Path) -> None:
    clean, synced = _loop(tmp_path, with_sync=False), _loop(tmp_path, with_sync=True)
    slower = compare(clean, synced, "before", "after")
    growth = slower.metric("step_time").relative
    assert growth is not None and growth > 0
    assert broken_diff(slower, synced, Budgets(max_regression=growth * 100 + 1)) == []
    (line,) = broken_diff(slower, synced, Budgets(max_regression=growth * 100 - 1))
    assert "over --max-regression" in line
    faster = compare(synced, clean, "before", "after")
    assert broken_diff(faster, clean, Budgets(max_regression=0)) == []


def test_budgets_from_the_project_table() -> None:
    budgets = budgets_from_table(
        {"fail-on": "medium", "max-idle": 30, "fail-on-rule": "sync-in-loop"}, "pyproject.toml"
    )
    assert budgets == Budgets(fail_on="medium", fail_on_rules=("sync-in-loop",), max_idle=30.0)
    assert Budgets(max_idle=30).over(Budgets(max_idle=10)).max_idle == 10  # the command line wins
    with pytest.raises(ConfigError, match="fail-on must be one of"):
        budgets_from_table({"fail-on": "critical"}, "pyproject.toml")
    with pytest.raises(ConfigError, match="max-idle"):
        budgets_from_table({"max-idle": "lots"}, "pyproject.toml")


# --- Markdown ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_SAMPLES)
def test_the_markdown_of_every_sample_is_valid_and_bounded(name: str) -> None:
    report = sample_report(name)
    text = MarkdownRenderer().render(result_of(report))
    assert len(text) < MAX_CHARS
    tokens = MarkdownIt("gfm-like").parse(text)
    kinds = {token.type for token in tokens}
    assert "heading_open" in kinds and "table_open" in kinds
    html = MarkdownIt("gfm-like").render(text)
    assert "<a href" not in html and "<img" not in html  # nothing from the trace became a link
    for finding in report.findings:
        if not finding.minor:
            assert escape(finding.title, 400) in text


def test_trace_strings_cannot_become_markdown(tmp_path: Path) -> None:
    events = [annotation("ProfilerStep#0", 0, 2000)]
    events += launch(5, 10, 50)
    hostile = "[click](https://evil.example/x) <img src=x onerror=alert(1)> | `code` *bold*"
    events.append(frame(f"{hostile}.py(3): f", 0, 2000, python_id=1))
    events.append(cpu_op(hostile, 100, 1800))
    events += launch(1950, 1960, 30)
    analysis = analyze(load_trace(write_trace(tmp_path / "t.json", events)))
    text = MarkdownRenderer().render(result_of(Report(analysis, evaluate(analysis))))
    assert "click" in text  # the name is in the summary (the host was in that operator)
    html = MarkdownIt("gfm-like").render(text)
    assert "<a " not in html and "<img" not in html and "<em>bold" not in html and "<code>code" not in html
    assert "evil.example/x" in html  # shown as text, not as a link


@pytest.mark.parametrize("seed", range(3))
def test_escaped_text_reads_as_itself_and_nothing_else(seed: int) -> None:
    """Whatever a trace's string holds, escaped it is text that reads as itself (markdown-it's
    GitHub-like parser, with its linkifier, the strictest reader we know) and nothing else: no link,
    autolink, image, HTML, entity, emphasis, code or strikethrough, inside a line or starting a list
    item (no heading, quote, list or rule there); with a backslash only where one is needed (the
    summary escaped every punctuation mark: it read badly raw)."""
    rng = random.Random(seed)
    alphabet = [
        *"ab_.:/@<>&|`*~$[]()!#\\ 1é-+=",
        "www.",
        "http://",
        ".com",
        ".py",
        "a@b.io",
        "&amp;",
        "<img>",
    ]
    alphabet += [
        "x_",
        "_x",
        "**",
        "~~",
        "$x$",
        "![a](b)",
        "[a]: b",
        "evil.example/x",
        "1. ",
        "# ",
        "> ",
        "---",
    ]
    parser = MarkdownIt("gfm-like")
    assert parser.options.get("linkify")
    paragraph = ["paragraph_open", "inline", "paragraph_close"]
    item = ["bullet_list_open", "list_item_open", *paragraph, "list_item_close", "bullet_list_close"]
    for _ in range(2000):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 25)))
        shown = " ".join(text.split())
        if not shown:  # only spaces: nothing to show
            continue
        for line, blocks, want in (
            (f"x {escape(text, 1000)} y", paragraph, f"x {shown} y"),
            (f"- {escape(text, 1000)}", item, shown),
        ):
            tokens = parser.parse(line)
            assert [token.type for token in tokens] == (
                blocks if shown else [tokens[0].type for _ in tokens]
            ), text
            children = [child for token in tokens for child in token.children or ()]
            assert {child.type for child in children} <= {"text", "text_special"}, text
            assert "".join(child.content for child in children) == want
    assert escape("train.py:12 in f(x) at 1.25 ms: foo_bar") == "train\\.py:12 in f(x) at 1.25 ms: foo_bar"
    # GitHub's own: an issue reference and an emoji's name stay text
    assert escape("fix #12 :fire: now") == "fix \\#12 \\:fire: now"


def test_the_diff_markdown_has_the_before_after_table() -> None:
    before, after = "v100_resnet50_workers0.pt.trace.json.gz", "v100_resnet50_workers4.pt.trace.json.gz"
    text = MarkdownRenderer().render(compare(document(before), document(after), before, after))
    tokens = MarkdownIt("gfm-like").parse(text)
    assert "table_open" in {token.type for token in tokens}
    assert "### Fixed (1)" in text and "dataloader\\-stall" not in text and "`dataloader-stall`" in text
    rows = [line.split("|")[1].strip() for line in text.splitlines() if line.startswith("| ")]
    # no internal keys
    assert "dataloader" not in rows and "host-bound" not in rows and "cpu\\_op" not in rows
    assert len(text) < MAX_CHARS


@pytest.mark.parametrize(
    ("us", "text"),
    [(0.0, "+0.0 µs"), (-0.0, "+0.0 µs"), (47.5, "+47.5 µs"), (-47.5, "−47.5 µs"), (-1200.0, "−1.20 ms")],
)
def test_a_change_of_a_time_is_written_one_way_everywhere(us: float, text: str) -> None:
    """Every signed change of a time (a metric's, an interval's ends, a prediction's, a module's row
    in the terminal and on the page) is written by one helper: a minus sign (−), and a change of
    nothing as + (a module's row wrote −0.0 µs)."""
    from traceinsight.formatting import format_change

    assert format_change(us) == text
