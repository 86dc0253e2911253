"""The public API: ``traceinsight.analyze`` / ``diff`` / ``load`` on the samples give what the
commands write, read back equal, and show their tables, cards and charts in a notebook."""

from __future__ import annotations

import html
import json
import re
from collections import defaultdict
from pathlib import Path

import polars as pl
import pytest
from matplotlib.colors import to_hex
from matplotlib.figure import Figure
from reference_split import GPU_KINDS, _ns
from tracebuild import SAMPLES, read_events
from typer.testing import CliRunner

import traceinsight
from traceinsight.commands import app
from traceinsight.errors import TraceInsightError
from traceinsight.model import replace
from traceinsight.render.html import HtmlRenderer
from traceinsight.render.mpl import INK

runner = CliRunner()

GP100 = SAMPLES / "gp100_mlp_pageable_sync.json.gz"
ALEXNET = SAMPLES / "a100_alexnet_cuda_sync.json.gz"
BERT = SAMPLES / "h100_bert_small_stacks.json.gz"
TWO_RANKS = SAMPLES / "two_ranks"


def _cli(*args: str) -> None:
    outcome = runner.invoke(app, list(args))
    assert outcome.exit_code == 0, outcome.stderr


@pytest.fixture(scope="module")
def gp100() -> traceinsight.Result:
    result = traceinsight.analyze(str(GP100))
    assert isinstance(result, traceinsight.Result)
    return result


@pytest.fixture(scope="module")
def job() -> traceinsight.JobResult:
    result = traceinsight.analyze(str(TWO_RANKS))
    assert isinstance(result, traceinsight.JobResult)
    return result


# --- the JSON: what the commands write, read back equal ---------------------------------------------


@pytest.mark.parametrize("trace", [GP100, ALEXNET, BERT], ids=lambda path: path.name)
def test_a_results_json_is_what_analyze_json_writes(trace: Path, tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    _cli("analyze", str(trace), "--no-html", "--json", str(out))
    result = traceinsight.analyze(str(trace))
    assert result.to_json() == out.read_text(encoding="utf-8")
    # the file the command wrote is the same result read back
    assert traceinsight.Result.from_json(out.read_bytes()) == result


def test_a_loaded_trace_analyzes_as_its_file(gp100: traceinsight.Result) -> None:
    """``analyze`` takes the tables ``load`` gave (what the command does, timing each step): the
    same result as from the file."""
    from traceinsight.api import load

    loaded = load(GP100, max_bytes=1 << 30)
    assert traceinsight.analyze(loaded) == gp100
    assert gp100.idle_gaps and traceinsight.analyze(loaded, min_gap_us=1e9).idle_gaps == ()  # none that long


def test_a_command_option_is_a_keyword_of_the_api(tmp_path: Path) -> None:
    """``--max-size`` is ``max_bytes``: the same refusal, in the same words, through both doors."""
    command = runner.invoke(app, ["analyze", str(GP100), "--no-html", "--max-size", "1k"])
    assert command.exit_code == 2
    with pytest.raises(TraceInsightError) as refused:
        traceinsight.analyze(GP100, max_bytes=1024)
    assert command.stderr == f"traceinsight: error: {refused.value}\n"


def test_a_result_read_back_equals_the_original(gp100: traceinsight.Result) -> None:
    again = traceinsight.Result.from_json(gp100.to_json())
    assert again == gp100
    assert again.report is None and gp100.report is not None  # a stored result: the figures only
    assert again.to_json() == gp100.to_json()
    # the result holds what the trace says (counted here from the raw events)
    _, events = read_events(GP100)
    kernels = [e for e in events if e.get("cat") in ("kernel", "Kernel") and e.get("ph") == "X"]
    assert sum(kernel.count for kernel in gp100.kernels) <= len(kernels)
    assert gp100.trace.events == len(events)


def test_a_comparisons_json_is_what_diff_json_writes(tmp_path: Path) -> None:
    out = tmp_path / "diff.json"
    _cli("diff", str(GP100), str(ALEXNET), "--no-html", "--json", str(out))
    comparison = traceinsight.diff(str(GP100), str(ALEXNET))
    assert comparison.to_json() == out.read_text(encoding="utf-8")
    again = traceinsight.Comparison.from_json(comparison.to_json())
    assert again == comparison
    assert again.to_json() == comparison.to_json()
    assert (comparison.before, comparison.after) == (GP100.name, ALEXNET.name)


def test_diff_takes_results_and_stored_results(gp100: traceinsight.Result, tmp_path: Path) -> None:
    stored = tmp_path / "gp100.json"
    stored.write_text(gp100.to_json(), encoding="utf-8")
    from_traces = traceinsight.diff(str(GP100), str(ALEXNET))
    assert traceinsight.diff(gp100, str(ALEXNET)).to_json() == from_traces.to_json()
    assert traceinsight.diff(str(stored), str(ALEXNET)).findings == from_traces.findings


def test_a_jobs_json_is_what_analyze_json_writes(job: traceinsight.JobResult, tmp_path: Path) -> None:
    out = tmp_path / "job.json"
    _cli("analyze", str(TWO_RANKS), "--no-html", "--json", str(out))
    assert job.to_json() == out.read_text(encoding="utf-8")
    again = traceinsight.JobResult.from_json(job.to_json())
    assert again == job
    assert again.to_json() == job.to_json()
    # one rank per trace in the folder, each by its own trace's name
    traces = sorted(path.name for path in TWO_RANKS.iterdir() if path.name.endswith(".json.gz"))
    assert sorted(Path(rank.path).name for rank in job.ranks) == traces


def test_one_schema_version_for_every_kind(gp100: traceinsight.Result, job: traceinsight.JobResult) -> None:
    comparison = traceinsight.diff(gp100, gp100)
    versions = {json.loads(item.to_json())["schema"] for item in (gp100, job, comparison)}
    assert versions == {traceinsight.results.SCHEMA_VERSION}


def test_a_result_of_another_kind_is_one_clear_error(gp100: traceinsight.Result) -> None:
    with pytest.raises(TraceInsightError):
        traceinsight.JobResult.from_json(gp100.to_json())
    with pytest.raises(TraceInsightError):
        traceinsight.Result.from_json("{")


@pytest.mark.parametrize("key", ["step_time", "copy_share"])
def test_a_stored_comparison_without_a_metric_its_views_read_is_one_clear_error(
    gp100: traceinsight.Result, job: traceinsight.JobResult, key: str
) -> None:
    """``from_json`` took a comparison with no step-time metric, and its notebook card then raised
    StopIteration; each kind's required metrics are checked as it is read."""
    from traceinsight.results import JobComparison

    document = json.loads(traceinsight.diff(gp100, gp100).to_json())
    document["metrics"] = [metric for metric in document["metrics"] if metric["key"] != key]
    with pytest.raises(TraceInsightError, match=f"metrics has no {key} metric"):
        traceinsight.Comparison.from_json(json.dumps(document))
    jobs = json.loads(traceinsight.diff(job, job).to_json())
    whole = {**jobs, "metrics": [metric for metric in jobs["metrics"] if metric["key"] != "step_time"]}
    with pytest.raises(TraceInsightError, match="metrics has no step_time metric"):
        JobComparison.from_json(json.dumps(whole))
    jobs["ranks"][0]["metrics"] = [m for m in jobs["ranks"][0]["metrics"] if m["key"] != "step_time"]
    with pytest.raises(TraceInsightError, match=r"ranks\[0\]\.metrics has no step_time metric"):
        JobComparison.from_json(json.dumps(jobs))


def test_from_json_refuses_a_text_past_the_stored_result_limit(gp100: traceinsight.Result) -> None:
    """``from_json`` had no size cap (64 MiB took 3.28 GB); past the limit ``diff`` holds a stored
    result to, it is refused before it is parsed."""
    from traceinsight.results.stored import MAX_RESULT_BYTES

    text = gp100.to_json()
    padded = text[:-1] + ', "pad": "' + "x" * (MAX_RESULT_BYTES - len(text)) + '"}'
    assert len(padded) > MAX_RESULT_BYTES
    for given in (padded, padded.encode()):
        with pytest.raises(TraceInsightError, match="more than the 16 MiB"):
            traceinsight.Result.from_json(given)
    assert traceinsight.Result.from_json(text) == traceinsight.Result.from_json(text.encode())


def test_an_unknown_threshold_is_one_clear_error() -> None:
    with pytest.raises(TraceInsightError, match="unknown threshold min_gap"):
        traceinsight.analyze(str(GP100), min_gap=10)


def test_thresholds_are_the_commands_options(tmp_path: Path) -> None:
    """``min_gap_us=`` is ``--min-gap-us``: the same JSON."""
    out = tmp_path / "result.json"
    _cli("analyze", str(GP100), "--no-html", "--min-gap-us", "200", "--json", str(out))
    assert traceinsight.analyze(str(GP100), min_gap_us=200).to_json() == out.read_text(encoding="utf-8")


# --- the tables ---------------------------------------------------------------------------------------


def _raw_gaps(path: Path) -> list[tuple[int, int, int]]:
    """Every stretch between merged GPU activity on a device, from the raw events (ns)."""
    _, events = read_events(path)
    by_device: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in GPU_KINDS and "dur" in e:
            device = int(e.get("args", {}).get("device", e.get("pid")))
            by_device[device].append((_ns(e["ts"]), _ns(e["ts"]) + _ns(e["dur"])))
    gaps = []
    for device, intervals in by_device.items():
        intervals.sort()
        end = intervals[0][1]
        for start, stop in intervals[1:]:
            if start > end:
                gaps.append((device, end, start))
            end = max(end, stop)
    return gaps


def test_the_idle_gap_table_holds_every_gap(gp100: traceinsight.Result) -> None:
    """Every gap, the short ones too, not the reported ones alone."""
    frame = gp100.frames["idle_gaps"]
    raw = _raw_gaps(GP100)
    assert frame.height == len(raw) > len(gp100.idle_gaps)
    assert frame["duration_ns"].sum() == sum(end - start for _, start, end in raw)
    assert frame.filter(pl.col("reported")).height == len(gp100.idle_gaps)
    min_ns = 50_000  # the default min_gap_us
    assert frame.filter(pl.col("reported")).height == sum(end - start >= min_ns for _, start, end in raw)


def test_a_stored_results_gap_table_holds_the_reported_gaps(gp100: traceinsight.Result) -> None:
    stored = traceinsight.Result.from_json(gp100.to_json())
    frame = stored.frames["idle_gaps"]
    assert frame.height == len(gp100.idle_gaps)
    assert frame["duration_ns"].to_list() == [gap.duration_ns for gap in gp100.idle_gaps]


def test_the_tables_of_a_trace(gp100: traceinsight.Result) -> None:
    frames = gp100.frames
    assert set(frames) == {
        "steps",
        "idle_gaps",
        "kernels",
        "syncs",
        "copies",
        "findings",
        "modules",
        "regions",
        "flop_kernels",
    }
    assert all(isinstance(frame, pl.DataFrame) for frame in frames.values())
    _, events = read_events(GP100)
    # kernels: the top kernel's launches, counted from the raw events
    top = frames["kernels"].sort("total_ns", descending=True).row(0, named=True)
    raw = [e for e in events if e.get("cat") in ("kernel", "Kernel") and e.get("name") == top["name"]]
    assert top["count"] == len(raw)
    assert top["total_ns"] == sum(_ns(e["dur"]) for e in raw)
    # copies: the bytes of each direction, from the raw copies' args
    copies = frames["copies"]
    raw_bytes: dict[str, int] = defaultdict(int)
    for e in events:
        if e.get("cat") in ("gpu_memcpy", "Memcpy"):
            raw_bytes[e["name"]] += int(e["args"]["bytes"])
    assert copies["bytes"].sum() == sum(raw_bytes.values())
    # syncs: the host's blocking calls, counted from the raw runtime events
    blocking = [e for e in events if e.get("cat") == "cuda_runtime" and "Synchronize" in e.get("name", "")]
    assert frames["syncs"]["count"].sum() == len(blocking) > 0
    # findings and steps: one row each
    assert frames["findings"]["rule"].to_list() == [finding.rule for finding in gp100.findings]
    assert frames["steps"].height == len(gp100.steps)


def test_a_jobs_tables_add_the_ranks(job: traceinsight.JobResult) -> None:
    frames = job.frames
    assert {"ranks", "findings"} <= set(frames)
    assert frames["ranks"].height == len(list(TWO_RANKS.glob("*.json.gz"))) == 2
    assert sorted(frames["ranks"]["rank"].to_list()) == [0, 1]


def test_load_gives_the_typed_tables() -> None:
    trace = traceinsight.load(str(GP100))
    _, events = read_events(GP100)
    kernels = [e for e in events if e.get("cat") in ("kernel", "Kernel")]
    assert trace.gpu.filter(pl.col("kind") == "kernel").height == len(kernels)


# --- what a notebook shows -----------------------------------------------------------------------------


def _self_contained(page: str) -> None:
    assert "<script" not in page.lower()
    # nothing loaded from elsewhere (the SVG's xmlns names are names, not loads)
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:|//)|url\(\s*["']?(https?:|//)|@import""", page)
    assert "<link" not in page.lower()


def test_a_result_shows_its_scorecard_and_cards(gp100: traceinsight.Result) -> None:
    page = gp100._repr_html_()
    assert page is not None
    _self_contained(page)
    for finding in gp100.findings:
        if not finding.minor:
            assert html.escape(finding.title, quote=False) in page
    one = gp100.findings[0]._repr_html_()
    assert one is not None and html.escape(gp100.findings[0].title, quote=False) in one
    _self_contained(one)


def test_a_comparison_and_a_job_show_their_pages(
    gp100: traceinsight.Result, job: traceinsight.JobResult
) -> None:
    comparison = traceinsight.diff(gp100, str(ALEXNET))
    page = comparison._repr_html_()
    assert page is not None
    _self_contained(page)
    assert html.escape(GP100.name) in page and html.escape(ALEXNET.name) in page
    shown = job._repr_html_()
    assert shown is not None
    _self_contained(shown)
    # JupyterLab lays output tables out fixed; the job's table, with cells that do not wrap, drew
    # over itself: the notebook's style sets them back to auto, after the page's own.
    assert (
        shown.index(".traceinsight-notebook table.data { table-layout: auto; }")
        > shown.index("</style>") - 200
    )
    for rank in job.ranks:
        assert f"<tr><td>{rank.rank}</td>" in shown
    for finding in job.findings:
        assert f'<code class="rule-id">{finding.rule}</code>' in shown


def test_text_from_the_trace_shows_as_text_not_markup(gp100: traceinsight.Result) -> None:
    """A title or a source line (text from the trace) reaches the cards escaped."""
    markup = "<img src=x onerror=alert(1)>"
    finding = replace(gp100.findings[0], title=markup, source=markup)
    for page in (finding._repr_html_(), gp100.replace(findings=(finding,))._repr_html_()):
        assert page is not None and "<img" not in page and html.escape(markup, quote=False) in page


def test_charts_are_the_pages_own(gp100: traceinsight.Result) -> None:
    """Result.charts are the page's charts as matplotlib Figures: each one's SVG is the one the
    page inlines, and the Figure writes the same words in the same colours."""
    charts = gp100.charts
    page = HtmlRenderer().render(gp100)
    assert charts and all(isinstance(chart, Figure) and chart.svg in page for chart in charts.values())
    for chart in charts.values():
        (axes,) = chart.axes
        words = [text.get_text() for text in axes.texts]
        assert words == [
            html.unescape(found) for found in re.findall(r"<text[^>]*>([^<]*)</text>", chart.svg)
        ]
        svg_fills = {fill.lower() for fill in re.findall(r'fill="(#[0-9A-Fa-f]{6})"', chart.svg)}
        drawn = {to_hex(patch.get_facecolor()) for patch in axes.patches} | {
            to_hex(color) for collection in axes.collections for color in collection.get_facecolors()
        }
        assert drawn <= svg_fills | {to_hex(INK)}
        assert chart._repr_png_().startswith(b"\x89PNG")
    assert {"timeline", "steps"} <= set(charts)
    assert gp100.charts is charts  # made once
    stored = traceinsight.Result.from_json(gp100.to_json())  # a CI artifact draws the same charts
    assert {name: chart.svg for name, chart in stored.charts.items()} == {
        name: chart.svg for name, chart in charts.items()
    }
    document = json.loads(gp100.to_json())
    del document["details"]  # written before results kept what their charts draw
    with pytest.raises(TraceInsightError, match=r"stored result.*'details'"):
        traceinsight.Result.from_json(json.dumps(document)).charts  # noqa: B018


def test_a_results_repr_is_one_short_line(gp100: traceinsight.Result, job: traceinsight.JobResult) -> None:
    """``repr`` names the result in one line (it was the whole dataclass tree: 193 KB); the page
    is ``_repr_html_``'s."""
    comparison = traceinsight.diff(gp100, gp100)
    for value in (gp100, job, comparison, traceinsight.diff(job, job)):
        text = repr(value)
        assert "\n" not in text and len(text) < 200
    assert GP100.name in repr(gp100) and f"{len(gp100.findings)} findings" in repr(gp100)
    assert f"{job.job.ranks} ranks" in repr(job)


def test_a_comparisons_tables(gp100: traceinsight.Result, job: traceinsight.JobResult) -> None:
    """``frames["metrics" | "findings" | "kernels"]`` of a comparison: one row per figure, per
    finding matched, per kernel changed; of two jobs, ``ranks`` with each rank's figures."""
    comparison = traceinsight.diff(gp100, str(ALEXNET))
    assert isinstance(comparison, traceinsight.Comparison)
    frames = comparison.frames
    metrics = frames["metrics"]
    assert metrics.height == len(comparison.metrics) + len(comparison.idle)
    assert metrics.filter(pl.col("group") == "metric")["key"].to_list() == [m.key for m in comparison.metrics]
    assert metrics["before"].to_list() == [m.before for m in (*comparison.metrics, *comparison.idle)]
    assert frames["findings"]["rule"].to_list() == [f.rule for f in comparison.findings]
    assert frames["kernels"]["name"].to_list() == [k.name for k in comparison.kernels]
    of_jobs = traceinsight.diff(job, job).frames
    assert of_jobs["ranks"]["rank"].to_list() == [rank.rank for rank in job.ranks]
    assert "step_time_before" in of_jobs["ranks"].columns


def test_a_comparisons_chart_is_its_pages_own(gp100: traceinsight.Result) -> None:
    """A comparison's chart (step time before and after) is a Figure drawn from its page's chart."""
    comparison = traceinsight.diff(gp100, str(ALEXNET))
    assert isinstance(comparison, traceinsight.Comparison)
    (chart,) = comparison.charts.values()
    assert isinstance(chart, Figure) and chart.svg in HtmlRenderer().render(comparison)
    (axes,) = chart.axes
    assert [text.get_text() for text in axes.texts] == [
        html.unescape(found) for found in re.findall(r"<text[^>]*>([^<]*)</text>", chart.svg)
    ]


def test_a_jobs_chart_is_its_pages_own(job: traceinsight.JobResult) -> None:
    """A job's chart (the collectives' arrivals) is a Figure drawn from its page's chart; a stored
    job keeps the arrivals, and draws the same chart."""
    charts = job.charts
    page = HtmlRenderer().render(job)
    assert charts and all(isinstance(chart, Figure) and chart.svg in page for chart in charts.values())
    stored = traceinsight.JobResult.from_json(job.to_json()).charts
    assert {name: chart.svg for name, chart in stored.items()} == {
        name: chart.svg for name, chart in charts.items()
    }
