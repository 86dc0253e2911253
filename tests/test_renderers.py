"""The same tests over every renderer (``render(result) -> str``) and every kind of result: a
trace's, a job's, a comparison's. pyinstrument's ``test/test_renderers.py`` is the model."""

from __future__ import annotations

import re
from typing import Any

import pytest
from tracebuild import SAMPLES

import traceinsight
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
    """The JSON, a job and a comparison need only the figures; a trace's summary, page and
    Markdown are drawn from the analysis, which a stored result does not hold: one clear error."""
    for kind in ("trace", "job", "comparison"):
        live = results[kind]
        stored = type(live).from_json(live.to_json())
        if name == "json" or kind in ("job", "comparison"):
            assert RENDERERS[name].render(stored) == RENDERERS[name].render(live)
        else:
            with pytest.raises(NotLive, match=r"stored result.*analyze"):
                RENDERERS[name].render(stored)


def test_the_html_pages_are_self_contained(results: dict[str, Any]) -> None:
    for result in results.values():
        page = RENDERERS["html"].render(result)
        assert "<script src" not in page and not re.search(r"""(src|href)=["']?https?:""", page)
