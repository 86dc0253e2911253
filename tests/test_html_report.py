"""Structural checks of the HTML report on real sample traces.

Expected values are computed here from the raw trace JSON (stdlib json + gzip) or from the
Report, never from the renderer's own output. Each trace is rendered once per module.
"""

from __future__ import annotations

import gzip
import html
import json
import os
import re
import subprocess
import sys
from collections import defaultdict
from dataclasses import dataclass
from functools import cached_property
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from markupsafe import escape

from traceinsight.analysis import analyze
from traceinsight.analysis.kernels import top_kernels
from traceinsight.analysis.timeline import timeline
from traceinsight.load import load_trace
from traceinsight.render import charts
from traceinsight.render.html import (
    TOP_GAPS,
    TOP_HOTSPOTS,
    TOP_KERNELS,
    HtmlRenderer,
    source_excerpt,
    templates_dir,
)
from traceinsight.render.scorecard import scorecard
from traceinsight.render.templates import code_spans
from traceinsight.results import Report, result_of
from traceinsight.rules import evaluate

SAMPLES = Path(__file__).resolve().parents[1] / "sample_traces"
#: "a few MB": the page must stay below this for any trace.
MAX_PAGE_BYTES = 3_000_000
GPU_ACTIVITY_CATEGORIES = {"kernel", "Kernel", "gpu_memcpy", "Memcpy", "gpu_memset", "Memset"}


# --- helpers -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Page:
    """A rendered report and the report it came from."""

    report: Report
    html: str

    @cached_property
    def parsed(self) -> ParsedPage:
        return ParsedPage.of(self.html)


class ParsedPage(HTMLParser):
    """Tags, attributes and text nodes (entities decoded) of a page."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[str] = []
        self.styles: list[str] = []
        self._in_style = False

    @classmethod
    def of(cls, html: str) -> ParsedPage:
        parser = cls()
        parser.feed(html)
        parser.close()
        return parser

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        self._in_style = tag == "style"

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))

    def handle_endtag(self, tag: str) -> None:
        if tag == "style":
            self._in_style = False

    def handle_data(self, data: str) -> None:
        (self.styles if self._in_style else self.texts).append(data)

    @property
    def text(self) -> str:
        return "\n".join(self.texts)

    def text_nodes(self) -> set[str]:
        return {text.strip() for text in self.texts}


def raw_events(path: Path) -> list[dict[str, Any]]:
    """The trace's events, read with the stdlib only."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        document = json.load(handle)
    events = document if isinstance(document, list) else document["traceEvents"]
    return [event for event in events if isinstance(event, dict)]


def raw_document(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as handle:
        document = json.load(handle)
    return document if isinstance(document, dict) else {}


def host_event(cat: str, name: str, ts: int, dur: int, **args: int) -> dict[str, Any]:
    """A host event on pid 1 / tid 1 (µs)."""
    return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur, "args": args}


def kernel(name: str, ts: int, dur: int, correlation: int) -> dict[str, Any]:
    """A kernel on GPU 0, stream 7 (µs)."""
    args = {"device": 0, "stream": 7, "correlation": correlation}
    return {"ph": "X", "cat": "kernel", "name": name, "pid": 0, "tid": 7, "ts": ts, "dur": dur, "args": args}


def render(name: str, source_root: Path) -> Page:
    """Load, analyze, evaluate and render one sample trace."""
    trace = load_trace(SAMPLES / name)
    analysis = analyze(trace)
    report = Report(analysis=analysis, findings=evaluate(analysis))
    return Page(report, HtmlRenderer(source_root).render(result_of(report)))


@pytest.fixture(scope="module")
def source_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A project directory holding the script the ResNet-50 traces name (60 numbered lines)."""
    root = tmp_path_factory.mktemp("project")
    lines = [f"x_{number} = {number}  # line {number}" for number in range(1, 61)]
    (root / "resnet50_profiler_api.py").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return root


@pytest.fixture(scope="module")
def gp100(source_root: Path) -> Page:
    return render("gp100_mlp_pageable_sync.json.gz", source_root)


@pytest.fixture(scope="module")
def workers0(source_root: Path) -> Page:
    return render("v100_resnet50_workers0.pt.trace.json.gz", source_root)


@pytest.fixture(scope="module")
def recsys(source_root: Path) -> Page:
    return render("a100_recsys_rank0.json.gz", source_root)


@pytest.fixture(scope="module")
def b200(source_root: Path) -> Page:
    return render("b200_eager_stacks.json.gz", source_root)


@pytest.fixture(scope="module")
def healthy(source_root: Path) -> Page:
    return render("v100_ddp_ns_timestamps.pt.trace.json.gz", source_root)


@pytest.fixture(scope="module")
def bert(source_root: Path) -> Page:
    return render("h100_bert_small_stacks.json.gz", source_root)


GPU_PAGES = ("gp100", "workers0", "recsys", "b200", "healthy", "bert")


@pytest.fixture(params=GPU_PAGES)
def gpu_page(request: pytest.FixtureRequest) -> Page:
    page: Page = request.getfixturevalue(request.param)
    return page


# --- self-contained, safe, bounded ----------------------------------------------------------------

_REMOTE = re.compile(r"^\s*(?:[a-z][a-z0-9+.-]*:|//)", re.IGNORECASE)


def test_page_loads_nothing_from_anywhere(gpu_page: Page) -> None:
    parsed = gpu_page.parsed
    for tag, attrs in parsed.tags:
        assert tag not in {"script", "link", "iframe", "object", "embed", "img", "base"}, tag
        for name in ("src", "href", "xlink:href", "action", "srcset", "poster", "data"):
            value = attrs.get(name)
            if value is not None:
                assert not _REMOTE.match(value), f"<{tag} {name}={value!r}>"
                assert "http" not in value and "//" not in value, f"<{tag} {name}={value!r}>"
    css = "\n".join(parsed.styles)
    assert "@import" not in css
    assert re.search(r"url\(\s*['\"]?(?!#)", css) is None


def test_page_says_it_may_load_nothing(gp100: Page) -> None:
    policies = [attrs.get("content") or "" for tag, attrs in gp100.parsed.tags if tag == "meta"]
    assert any("default-src 'none'" in policy for policy in policies)


def test_page_size_stays_bounded_on_the_largest_traces(recsys: Page, b200: Page) -> None:
    assert (SAMPLES / "a100_recsys_rank0.json.gz").stat().st_size > 1_000_000
    for page in (recsys, b200):
        assert len(page.html.encode("utf-8")) < MAX_PAGE_BYTES


def test_kernel_names_from_the_trace_are_escaped(recsys: Page, b200: Page) -> None:
    """A templated kernel name among the top kernels appears decoded in the text, never raw."""
    for page, name in ((recsys, "a100_recsys_rank0.json.gz"), (b200, "b200_eager_stacks.json.gz")):
        totals: dict[str, float] = defaultdict(float)
        for event in raw_events(SAMPLES / name):
            if event.get("cat") in {"kernel", "Kernel"} and event.get("ph") == "X":
                totals[str(event["name"])] += float(event.get("dur", 0))
        ranked = sorted(totals, key=lambda kernel: -totals[kernel])[: TOP_KERNELS // 2]
        templated = [kernel for kernel in ranked if "<" in kernel]
        assert templated, f"no templated kernel among the top of {name}"
        for kernel in templated:
            assert kernel not in page.html
            assert kernel in page.parsed.text_nodes()


def test_hostile_names_cannot_inject_markup(tmp_path: Path) -> None:
    """Names built to break out of HTML stay text, in tables and in chart labels."""
    hostile = '<script>alert("k")</script> & <img src=x onerror=alert(1)>'
    events = [
        host_event("cpu_op", hostile, ts=0, dur=400),
        host_event("cuda_runtime", "cudaLaunchKernel", ts=10, dur=5, correlation=1),
        host_event("cuda_runtime", "cudaLaunchKernel", ts=300, dur=5, correlation=2),
        kernel(hostile, ts=20, dur=30, correlation=1),
        kernel(hostile + " $x$", ts=310, dur=30, correlation=2),
    ]
    path = tmp_path / "hostile.json"
    path.write_text(json.dumps({"traceEvents": events}), encoding="utf-8")
    trace = load_trace(path)
    analysis = analyze(trace)
    report = Report(analysis=analysis, findings=evaluate(analysis))
    html = HtmlRenderer(tmp_path).render(result_of(report))
    parsed = ParsedPage.of(html)
    assert "<script" not in html and "<img" not in html
    assert not any(tag in {"script", "img"} for tag, _ in parsed.tags)
    assert hostile in parsed.text_nodes()


def test_same_input_gives_the_same_page(gp100: Page, source_root: Path) -> None:
    again = render("gp100_mlp_pageable_sync.json.gz", source_root)
    assert again.html == gp100.html


def test_same_input_gives_the_same_page_in_another_process(gp100: Page, source_root: Path) -> None:
    """Another interpreter, another hash seed: set and dict orders must not leak into the page."""
    script = (
        "import sys; from pathlib import Path; "
        "from tests.test_html_report import render; "
        "sys.stdout.write(render('gp100_mlp_pageable_sync.json.gz', Path(sys.argv[1])).html)"
    )
    environment = {**os.environ, "PYTHONHASHSEED": "12345"}
    result = subprocess.run(
        [sys.executable, "-c", script, str(source_root)],
        capture_output=True,
        text=True,
        encoding="utf-8",
        cwd=SAMPLES.parent,
        env=environment,
        check=True,
    )
    assert result.stdout == gp100.html


OTHER_SAMPLES = sorted(
    str(path.relative_to(SAMPLES))
    for path in SAMPLES.rglob("*.json*")
    if path.name
    not in {
        "gp100_mlp_pageable_sync.json.gz",
        "v100_resnet50_workers0.pt.trace.json.gz",
        "a100_recsys_rank0.json.gz",
        "b200_eager_stacks.json.gz",
        "v100_ddp_ns_timestamps.pt.trace.json.gz",
        "h100_bert_small_stacks.json.gz",
        "cpu_only_gloo.pt.trace.json.gz",
        "cpu_torch2.14_with_stack.pt.trace.json.gz",
    }
)


@pytest.mark.parametrize("name", OTHER_SAMPLES)
def test_every_other_sample_renders_a_bounded_self_contained_page(name: str, tmp_path: Path) -> None:
    page = render(name, tmp_path)
    assert len(page.html.encode("utf-8")) < MAX_PAGE_BYTES
    assert not any(tag in {"script", "link", "img", "iframe"} for tag, _ in page.parsed.tags)
    text = page.parsed.text
    words = _words(text)
    for finding in page.report.findings:  # a title's `code` is set as code: its words, no backticks
        assert finding.rule in text and _words(finding.title) in words
    assert ('id="timeline-title"' in page.html) == page.report.analysis.has_gpu


# --- content ------------------------------------------------------------------------------------


def _words(text: str) -> str:
    """``text``'s words, a backtick-quoted part (shown as code on the page) as words too."""
    return " ".join(text.replace("`", " ").split())


def test_every_finding_appears_with_its_id_title_and_source(gpu_page: Page) -> None:
    text = gpu_page.parsed.text
    words = _words(text)
    for finding in gpu_page.report.findings:
        assert finding.rule in text
        assert _words(finding.title) in words
        if finding.minor:  # listed in one line under "Minor findings", no card
            continue
        assert _words(finding.advice.summary) in words
        assert "`" not in finding.advice.summary or "<code>" in gpu_page.html
        assert finding.advice.before in gpu_page.html or escape(finding.advice.before) in gpu_page.html
        if finding.source:
            assert finding.source in text


def test_minor_findings_are_listed_not_carded(gpu_page: Page) -> None:
    cards = [f for f in gpu_page.report.findings if not f.minor]
    minor = [f for f in gpu_page.report.findings if f.minor]
    assert gpu_page.html.count('class="finding severity-') == len(cards)
    assert ('id="minor-findings"' in gpu_page.html) == bool(minor)


def test_every_source_line_of_the_analysis_appears(gpu_page: Page) -> None:
    analysis = gpu_page.report.analysis
    shown_gaps = sorted(analysis.idle_gaps, key=lambda g: (-g.duration_ns, g.device, g.start_ns))[:TOP_GAPS]
    sources = {gap.source for gap in shown_gaps} | {
        spot.source for spot in analysis.sync_hotspots[:TOP_HOTSPOTS]
    }
    nodes = gpu_page.parsed.text_nodes()
    for source in sources - {None}:
        # a call's line as it is; another line inside what names it ("`f` (defined at x.py:4)")
        assert source in nodes or any(f" {source}" in node for node in nodes)
    calls = {
        item.source for item in [*shown_gaps, *analysis.sync_hotspots] if item.source_line_kind == "call"
    }
    for gap in shown_gaps:
        if gap.source is not None and gap.source not in calls:
            assert gap.source not in nodes  # never shown bare, as if it were the call's line


def test_pages_with_stacks_name_source_lines(workers0: Page, bert: Page) -> None:
    assert "resnet50_profiler_api.py:42" in workers0.parsed.text_nodes()
    assert any(finding.source for finding in bert.report.findings)


def test_findings_come_ranked_by_saving(gpu_page: Page) -> None:
    findings = [finding for finding in gpu_page.report.findings if not finding.minor]
    positions = [gpu_page.html.index(f'id="finding-{rank}"') for rank in range(1, len(findings) + 1)]
    assert positions == sorted(positions)
    assert [f.savings_total_ns for f in findings] == sorted(
        (f.savings_total_ns for f in findings), reverse=True
    )
    words = _words(gpu_page.parsed.text)
    by_title = sorted(findings, key=lambda f: words.index(_words(f.title)))
    savings = [finding.savings_total_ns for finding in by_title]
    assert savings == sorted(savings, reverse=True)


def test_sections_come_in_the_terminal_summary_order(gpu_page: Page) -> None:
    order = [
        "summary",
        "scorecard",
        "findings",
        "idle-gaps",
        "sync-hotspots",
        "copies",
        "top-kernels",
        "host",
    ]
    positions = [gpu_page.html.index(f'id="{section}"') for section in order]
    assert positions == sorted(positions)


def test_scorecard_figures_and_verdicts_appear(gpu_page: Page) -> None:
    nodes = gpu_page.parsed.text_nodes()
    for score in scorecard(result_of(gpu_page.report)):
        assert score.label in nodes and score.value in nodes and score.verdict in nodes


def test_header_names_gpu_rank_and_versions(b200: Page, recsys: Page) -> None:
    for page, name in ((b200, "b200_eager_stacks.json.gz"), (recsys, "a100_recsys_rank0.json.gz")):
        document = raw_document(SAMPLES / name)
        text = page.parsed.text
        assert name in text
        for device in document["deviceProperties"]:
            assert device["name"] in text
        info = document["distributedInfo"]
        assert f"{info['rank']} of {info['world_size']} ({info['backend']})" in text
    assert "CUDA runtime 12.9" in b200.parsed.text  # cuda_runtime_version 12090 in the trace
    assert "5 (ProfilerStep ranges), all steady" in recsys.parsed.text  # five ProfilerStep#N spans


def test_charts_are_inline_svg_where_the_data_has_them(gpu_page: Page) -> None:
    analysis = gpu_page.report.analysis
    expected = {
        "timeline": analysis.has_gpu,
        "steps": bool(analysis.steps),
        "gaps": bool(analysis.idle_gaps),
        # waits in the steady state only: the sync that ends a profile costs nothing per step
        "syncs": any(hotspot.steady_count for hotspot in analysis.sync_hotspots),
        "copies": bool(analysis.copies),
        "host": bool(analysis.host.top_ops),
    }
    svgs = [attrs for tag, attrs in gpu_page.parsed.tags if tag == "svg"]
    labelled = {attrs.get("aria-labelledby") for attrs in svgs}
    for chart, present in expected.items():
        assert (f"{chart}-title" in labelled) == present, chart


def test_chart_ids_are_unique_on_the_page(recsys: Page) -> None:
    ids = [attrs["id"] for _, attrs in recsys.parsed.tags if attrs.get("id")]
    assert len(ids) == len(set(ids))


def test_detail_tables_are_capped(recsys: Page) -> None:
    gaps = len(recsys.report.analysis.idle_gaps)
    assert gaps > 20
    assert f"Showing the top 20 of {gaps:,} gaps." in recsys.parsed.text
    section = recsys.html[recsys.html.index('id="idle-gaps"') : recsys.html.index('id="sync-hotspots"')]
    assert section.count("<tr>") < 20 + 30 + 10  # longest gaps + source lines + causes, with headers


def test_every_idle_cause_gets_a_row_and_a_colour(gpu_page: Page) -> None:
    kinds = {gap.cause_kind for gap in gpu_page.report.analysis.idle_gaps}
    if not kinds:
        return
    start = gpu_page.html.index("<caption>Idle in these gaps by cause</caption>")
    table = gpu_page.html[start : gpu_page.html.index("</table>", start)]
    assert table.count('<span class="swatch"') == len(kinds)


def test_cause_kinds_this_version_does_not_know_still_get_drawn() -> None:
    assert charts.ordered_causes(["mystery", "sync", "dataloader"]) == ["dataloader", "sync", "mystery"]
    assert charts.cause_label("mystery") == "mystery"
    assert charts.cause_color("mystery") == charts.cause_color("unknown")


def test_top_kernels_match_a_plain_count(gp100: Page) -> None:
    counts: dict[str, int] = defaultdict(int)
    totals: dict[str, float] = defaultdict(float)
    for event in raw_events(SAMPLES / "gp100_mlp_pageable_sync.json.gz"):
        if event.get("cat") == "kernel" and event.get("ph") == "X":
            counts[event["name"]] += 1
            totals[event["name"]] += event["dur"]
    top = max(totals, key=lambda kernel: (totals[kernel], kernel))
    kernels = top_kernels(load_trace(SAMPLES / "gp100_mlp_pageable_sync.json.gz"))
    assert kernels.kernel_count == sum(counts.values())
    assert kernels.distinct == len(counts)
    assert kernels.kernels[0].name == top
    assert kernels.kernels[0].count == counts[top]
    assert kernels.kernels[0].total_ns == round(totals[top] * 1000)
    assert top in gp100.parsed.text_nodes()


def test_healthy_trace_says_there_is_nothing_to_fix(source_root: Path) -> None:
    from loops import copy_loop
    from tracebuild import write_trace

    trace = write_trace(
        source_root / "healthy.json",
        copy_loop(
            kind="Memcpy HtoD (Pinned -> Device)", sync_after=False, copy_us=20, copy_stream=9, prep_us=0
        ).events,
    )
    analysis = analyze(load_trace(trace))
    healthy = Page(
        Report(analysis, evaluate(analysis)),
        HtmlRenderer(source_root).render(result_of(Report(analysis, evaluate(analysis)))),
    )
    assert healthy.report.findings == ()
    assert "No findings: nothing in the steady state keeps the GPU waiting" in healthy.parsed.text


# --- code excerpts --------------------------------------------------------------------------------


def test_finding_shows_the_source_lines_with_the_offending_one_marked(workers0: Page) -> None:
    located = [finding.source for finding in workers0.report.findings if finding.source]
    assert located
    marked = re.findall(
        r'<span class="line hit"><span class="ln">(\d+)</span><span class="mark">▶</span>([^<]*)</span>',
        workers0.html,
    )
    for source in located:
        line = int(source.rpartition(":")[2])
        assert (str(line), f"x_{line} = {line}  # line {line}") in marked
        assert f"x_{line - 3} = {line - 3}  # line {line - 3}" in workers0.html  # context above


def test_excerpt_reads_only_python_files_inside_the_root(tmp_path: Path) -> None:
    root = tmp_path / "project"
    root.mkdir()
    (root / "train.py").write_text("a = 1\nb = 2\nc = 3\n", encoding="utf-8")
    (root / "notes.txt").write_text("secret\n", encoding="utf-8")
    (tmp_path / "outside.py").write_text("secret = 1\n", encoding="utf-8")
    excerpt = source_excerpt("train.py:2", root)
    assert excerpt is not None
    assert excerpt.line == 2 and excerpt.lines == ((1, "a = 1"), (2, "b = 2"), (3, "c = 3"))
    assert source_excerpt("train.py:4", root) is None  # the file changed since the profile
    assert source_excerpt("notes.txt:1", root) is None
    assert source_excerpt("../outside.py:1", root) is None
    assert source_excerpt("missing.py:1", root) is None
    assert source_excerpt("train.py", root) is None


def test_unreadable_source_says_how_to_see_the_code(b200: Page) -> None:
    """The b200 trace names lines of a project (vllm) that is not in the source root."""
    assert any(finding.source for finding in b200.report.findings if not finding.minor)
    assert 'class="line hit"' not in b200.html
    assert "run traceinsight analyze --source-root DIR" in " ".join(b200.parsed.text.split())


# --- traces without GPU activity -------------------------------------------------------------------


@pytest.mark.parametrize(
    "name", ["cpu_only_gloo.pt.trace.json.gz", "cpu_torch2.14_with_stack.pt.trace.json.gz"]
)
def test_trace_without_gpu_says_so_and_shows_the_host(name: str, tmp_path: Path) -> None:
    page = render(name, tmp_path)
    text = " ".join(page.parsed.text.split())
    assert "This trace has no GPU activity." in text
    for section in ("idle-gaps", "sync-hotspots", "copies", "top-kernels"):
        assert f'id="{section}"' not in page.html
    assert 'id="host"' in page.html
    from test_host import plain_self_times

    own, _ = plain_self_times(name)  # the operator with the most self time, by a plain stack walk
    busiest = max(own, key=lambda op: own[op])
    assert busiest in page.parsed.text_nodes()
    assert 'aria-labelledby="host-title"' in page.html


# --- packaging and the timeline -------------------------------------------------------------------


def test_templates_use_inheritance_and_inline_css() -> None:
    root = templates_dir()
    report = (root / "report.html").read_text(encoding="utf-8")
    base = (root / "base.html").read_text(encoding="utf-8")
    assert report.lstrip().startswith('{% extends "base.html" %}')
    assert '{% include "report.css" %}' in base
    css = (root / "report.css").read_text(encoding="utf-8")
    assert "prefers-color-scheme: dark" in css and "@media print" in css


def _plain_busy_union(path: Path) -> tuple[int, int]:
    """Busy ns (union of GPU activity, all devices' intervals merged per device) and event count."""
    by_device: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for event in raw_events(path):
        if event.get("cat") in GPU_ACTIVITY_CATEGORIES and event.get("ph") == "X":
            start = round(event["ts"] * 1000)
            by_device[int(event["args"]["device"])].append((start, start + round(event.get("dur", 0) * 1000)))
    busy = 0
    count = 0
    for intervals in by_device.values():
        intervals.sort()
        count += len(intervals)
        current_start, current_end = intervals[0]
        for start, end in intervals[1:]:
            if start > current_end:
                busy += current_end - current_start
                current_start, current_end = start, end
            else:
                current_end = max(current_end, end)
        busy += current_end - current_start
    return busy, count


@pytest.mark.parametrize("max_blocks", [2, 40, 2000])
def test_timeline_is_downsampled_and_keeps_busy_time(max_blocks: int) -> None:
    path = SAMPLES / "gp100_mlp_pageable_sync.json.gz"
    busy, _ = _plain_busy_union(path)
    result = timeline(load_trace(path), max_blocks)
    (device,) = result.devices
    assert 1 <= len(device.blocks) <= max_blocks
    assert sum(block.busy_ns for block in device.blocks) == busy
    for before, after in zip(device.blocks, device.blocks[1:], strict=False):
        assert after.start_ns - before.end_ns >= result.resolution_ns
    assert len(device.syncs) <= max_blocks
    syncs = sum(1 for event in raw_events(path) if event.get("name") == "cudaStreamSynchronize")
    assert sum(mark.count for mark in device.syncs) == syncs


def test_timeline_of_a_trace_without_gpu_is_empty() -> None:
    result = timeline(load_trace(SAMPLES / "cpu_only_gloo.pt.trace.json.gz"))
    assert result.devices == ()


# --- a report made by `traceinsight run` --------------------------------------------------------


def _run_report(name: str, **changes: Any) -> Report:
    from traceinsight.results import RunContext

    analysis = analyze(load_trace(SAMPLES / name))
    facts: dict[str, Any] = {
        "command": "traceinsight run train.py --epochs 1",
        "script": "train.py",
        "started": "2026-11-22T10:04:05+01:00",
        "torch_version": "2.13.0",
        "elapsed_s": 12.5,
        "exit_status": 0,
    }
    run = RunContext(**{**facts, **changes})
    return Report(analysis=analysis, findings=evaluate(analysis), run=run)


def test_a_run_report_is_titled_by_the_script_command_date_and_torch(tmp_path: Path) -> None:
    page = HtmlRenderer(source_root=tmp_path).render(
        result_of(_run_report("cpu_torch2.14_with_stack.pt.trace.json.gz"))
    )
    parsed = ParsedPage.of(page)
    assert "<title>train.py · 2026-11-22 10:04 · traceinsight</title>" in page
    assert "traceinsight run train.py --epochs 1" in parsed.text
    assert "torch 2.13.0" in parsed.text
    assert "ProfilerActivity.CUDA" not in page  # run records CUDA itself: no such advice


def test_a_failed_script_is_said_first(tmp_path: Path) -> None:
    report = _run_report(
        "v100_resnet50_workers0.pt.trace.json.gz",
        exit_status=1,
        failure="ValueError: bad shape at train.py:47",
        steps_recorded=2,
    )
    page = HtmlRenderer(source_root=tmp_path).render(result_of(report))
    failed = page.index('id="script-failed"')
    assert failed < page.index('id="scorecard"')
    assert "ValueError: bad shape at train.py:47" in ParsedPage.of(page).text
    from traceinsight.render.terminal import TerminalRenderer

    text = TerminalRenderer(width=100).render(result_of(report))
    assert text.index("The script failed") < text.index("Scorecard")


# --- compiled templates kept beside the code (traceinsight.render.templates) ------------------------


def _environment(folder: Path, pages: dict[str, str], *, always: bool = True) -> Any:
    """A jinja2 environment over ``pages`` with the package's cache of compiled templates in ``folder``."""
    import jinja2

    from traceinsight.render.templates import _CompiledBeside

    cache = _CompiledBeside(folder)
    cache.always = always
    return jinja2.Environment(loader=jinja2.DictLoader(pages), autoescape=True, bytecode_cache=cache)


def _compiles(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    import jinja2

    compiled: list[str] = []
    original = jinja2.Environment.compile

    def counting(self: Any, source: Any, name: Any = None, *args: Any, **kwargs: Any) -> Any:
        compiled.append(name)
        return original(self, source, name, *args, **kwargs)

    monkeypatch.setattr(jinja2.Environment, "compile", counting)
    return compiled


def test_a_compiled_template_is_read_back_and_compiled_again_when_it_changes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    compiled = _compiles(monkeypatch)
    assert _environment(tmp_path, {"a.html": "<b>{{ x }}</b>"}).get_template("a.html").render(x="<1>") == (
        "<b>&lt;1&gt;</b>"
    )
    assert compiled == ["a.html"] and len(list(tmp_path.iterdir())) == 1
    again = _environment(tmp_path, {"a.html": "<b>{{ x }}</b>"}).get_template("a.html").render(x="<1>")
    assert again == "<b>&lt;1&gt;</b>" and compiled == ["a.html"]  # read back, not compiled
    changed = _environment(tmp_path, {"a.html": "<i>{{ x }}</i>"}).get_template("a.html").render(x="<1>")
    assert changed == "<i>&lt;1&gt;</i>" and compiled == ["a.html", "a.html"]


def test_a_damaged_or_unwritable_cache_is_no_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    compiled = _compiles(monkeypatch)
    _environment(tmp_path, {"a.html": "{{ x }}"}).get_template("a.html")
    (kept,) = tmp_path.iterdir()
    kept.write_bytes(kept.read_bytes()[:40] + b"\x00garbage")
    assert _environment(tmp_path, {"a.html": "{{ x }}"}).get_template("a.html").render(x=1) == "1"
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder")
    assert _environment(blocked, {"a.html": "{{ x }}"}).get_template("a.html").render(x=2) == "2"
    assert compiled == ["a.html"] * 3


def test_no_compiled_template_is_written_under_dont_write_bytecode(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    _environment(tmp_path, {"a.html": "{{ x }}"}, always=False).get_template("a.html")
    assert list(tmp_path.iterdir()) == []
    _environment(tmp_path, {"a.html": "{{ x }}"}, always=True).get_template("a.html")  # precompile's way
    assert len(list(tmp_path.iterdir())) == 1


def test_a_kept_template_whose_code_was_damaged_is_compiled_again_never_unmarshalled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import marshal

    import jinja2.bccache

    _environment(tmp_path, {"a.html": "{{ x }}"}).get_template("a.html")
    (kept,) = tmp_path.iterdir()
    data = bytearray(kept.read_bytes())
    for place in range(len(data) - 40, len(data)):  # the compiled code's end, past every header
        data[place] ^= 0x5A
    kept.write_bytes(bytes(data))
    unmarshalled: list[object] = []
    original = marshal.load

    def counting(source: Any) -> Any:
        unmarshalled.append(source)
        return original(source)

    monkeypatch.setattr(jinja2.bccache.marshal, "load", counting)
    compiled = _compiles(monkeypatch)
    assert _environment(tmp_path, {"a.html": "{{ x }}"}).get_template("a.html").render(x=3) == "3"
    assert compiled == ["a.html"] and unmarshalled == []  # the digest refused it before marshal
    assert kept.read_bytes() != bytes(data)  # written anew


def test_the_template_cache_never_writes_or_reads_through_a_link(tmp_path: Path) -> None:
    folder, elsewhere = tmp_path / "cache", tmp_path / "elsewhere"
    folder.mkdir()
    elsewhere.mkdir()
    _environment(elsewhere, {"a.html": "{{ x }}"}).get_template("a.html")
    (real,) = elsewhere.iterdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"someone else's")
    victim.chmod(0o600)
    (folder / real.name).symlink_to(victim)
    _environment(folder, {"a.html": "{{ x }}"}).get_template("a.html")
    assert victim.read_bytes() == b"someone else's" and victim.stat().st_mode & 0o777 == 0o600
    assert not (folder / real.name).is_symlink()  # the link replaced by a file of its own
    # a link to a valid kept file is not read either: the template is compiled
    (folder / real.name).unlink()
    (folder / real.name).symlink_to(real)
    compiled: list[str] = []
    import jinja2

    original = jinja2.Environment.compile

    def counting(self: Any, source: Any, name: Any = None, *args: Any, **kwargs: Any) -> Any:
        compiled.append(name)
        return original(self, source, name, *args, **kwargs)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(jinja2.Environment, "compile", counting)
        _environment(folder, {"a.html": "{{ x }}"}).get_template("a.html")
    assert compiled == ["a.html"]


def test_the_template_cache_follows_pycache_prefix(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from traceinsight.render import templates

    here = Path(templates.__file__).resolve().parent
    assert templates._beside_code() == here / "__pycache__"
    monkeypatch.setattr(sys, "pycache_prefix", str(tmp_path))
    assert templates._beside_code() == tmp_path / here.relative_to(here.anchor)


def test_the_page_from_compiled_templates_is_the_page(gp100: Page, tmp_path: Path) -> None:
    import jinja2

    from traceinsight.render import templates

    renderer = HtmlRenderer(None)
    context = renderer.context(result_of(gp100.report))
    pages = []
    for _ in range(2):  # compiled and kept, then read back
        made = templates.environment.__wrapped__()
        cache = templates._CompiledBeside(tmp_path)
        cache.always = True
        made.bytecode_cache = cache
        pages.append(made.get_template("report.html").render(context))
    assert len(list(tmp_path.iterdir())) >= 5  # the page, its base, macros, cards and style
    assert pages[0] == pages[1] == renderer.render(result_of(gp100.report))
    assert isinstance(templates.environment().bytecode_cache, jinja2.FileSystemBytecodeCache)


def test_the_top_finding_is_on_the_first_screen(gpu_page: Page) -> None:
    """Before the scorecard (the first screen), one line names the top finding and links its card."""
    head = gpu_page.html.split('id="scorecard"')[0]
    top = next(f for f in gpu_page.report.findings if not f.minor)
    assert 'class="top-finding"><a href="#finding-1">' in head
    line = head.split('class="top-finding"')[1].split("</p>")[0]
    assert _words(re.sub(r"<[^>]+>", "", html.unescape(line))).find(_words(top.title)) >= 0


def test_backtick_quotes_are_code_and_text_stays_escaped() -> None:
    """Words quoted with backticks are set as code; everything else is escaped; an odd number of
    backticks is shown as written."""
    assert str(code_spans("call `x.item()` <b>")) == "call <code>x.item()</code> &lt;b&gt;"
    assert str(code_spans("`<script>`")) == "<code>&lt;script&gt;</code>"
    assert str(code_spans("one ` tick")) == "one ` tick"
