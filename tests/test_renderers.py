"""The same tests over every renderer (``render(result) -> str``) and every kind of result: a
trace's, a job's, a comparison's. pyinstrument's ``test/test_renderers.py`` is the model."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest
from tracebuild import SAMPLES

import traceinsight
from traceinsight.model import replace
from traceinsight.render import NotLive, Renderer
from traceinsight.render.html import HtmlRenderer
from traceinsight.render.json_report import JsonRenderer
from traceinsight.render.markdown import MarkdownRenderer
from traceinsight.render.terminal import TerminalRenderer

RENDERERS: dict[str, Renderer] = {
    "terminal": TerminalRenderer(width=120),
    "json": JsonRenderer(),
    "markdown": MarkdownRenderer(),
    "html": HtmlRenderer(),
}


@pytest.fixture(scope="module")
def results() -> dict[str, Any]:
    trace = traceinsight.analyze(str(SAMPLES / "gp100_mlp_pageable_sync.json.gz"))
    job = traceinsight.analyze(str(SAMPLES / "two_ranks"))
    comparison = traceinsight.diff(trace, str(SAMPLES / "a100_alexnet_cuda_sync.json.gz"))
    return {"trace": trace, "job": job, "comparison": comparison}


def _rules(result: Any) -> list[str]:
    return sorted({finding.rule for finding in result.findings})


@pytest.mark.parametrize("kind", ["trace", "job", "comparison"])
@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_every_renderer_renders_every_result(name: str, kind: str, results: dict[str, Any]) -> None:
    result = results[kind]
    text = RENDERERS[name].render(result)
    assert isinstance(text, str) and text.strip()
    assert text == RENDERERS[name].render(result)  # deterministic
    # every finding's rule is named (a job's and a comparison's findings are rules too)
    for rule in _rules(result):
        assert rule in text, (name, kind, rule)


@pytest.mark.parametrize("name", sorted(RENDERERS))
def test_a_stored_result_renders_or_says_why_not(name: str, results: dict[str, Any]) -> None:
    """A trace's result, a job's and a comparison hold all their outputs show: read back from their
    JSON, each renders as the live one did."""
    for kind in ("trace", "job", "comparison"):
        live = results[kind]
        stored = type(live).from_json(live.to_json())
        assert RENDERERS[name].render(stored) == RENDERERS[name].render(live), kind


@pytest.mark.parametrize("name", ["terminal", "markdown", "html"])
def test_a_stored_result_without_details_says_why_it_draws_nothing(
    name: str, results: dict[str, Any]
) -> None:
    """A trace's result written before results kept their ``details`` holds the figures but not
    the rest of what a report shows: one line naming the file's trace and what to do."""
    document = json.loads(results["trace"].to_json())
    del document["details"]
    stored = type(results["trace"]).from_json(json.dumps(document))
    assert stored.details is None
    with pytest.raises(
        NotLive, match=r"gp100_mlp_pageable_sync.json.gz .*'details'.*analyze its trace"
    ) as error:
        RENDERERS[name].render(stored)
    assert "\n" not in str(error.value)


def test_the_html_pages_are_self_contained(results: dict[str, Any]) -> None:
    for result in results.values():
        page = RENDERERS["html"].render(result)
        assert "<script src" not in page and not re.search(r"""(src|href)=["']?https?:""", page)


def test_host_syncs_no_finding_is_about_are_not_a_red_card(results: dict[str, Any]) -> None:
    """A red "Host syncs / step" with no finding under it sent the reader looking for what is not
    there: without a finding about syncs, the card says how much GPU idle they cause (the sync hot
    spots' idle over the steady steps) and is red no more."""
    from traceinsight.formatting import format_duration
    from traceinsight.render.scorecard import scorecard

    trace = results["trace"]
    (explained,) = (s for s in scorecard(trace) if s.label == "Host syncs / step")
    assert "No finding" not in explained.verdict  # pageable-memcpy is about its copy + sync
    hotspots = tuple(replace(h, steady_count=h.steady_count * 3) for h in trace.sync_hotspots)  # 6 a step
    alone = trace.replace(findings=(), sync_hotspots=hotspots)
    (score,) = (s for s in scorecard(alone) if s.label == "Host syncs / step")
    steps = trace.steady_state.steady_steps
    idle = sum(h.idle_caused_ns for h in trace.sync_hotspots) / steps
    assert score.level in ("info", "warn") and score.value == "6"
    assert "No finding is about them" in score.verdict and format_duration(round(idle)) in score.verdict
    assert (score.level == "warn") == (idle / trace.steady_state.step_time_ns >= 0.01)
    with_finding = trace.replace(sync_hotspots=hotspots)
    assert next(s for s in scorecard(with_finding) if s.label == "Host syncs / step").level == "bad"
