"""examples/notebook.ipynb runs: each code cell in order, as a kernel would, from its folder; what
each cell ends with shows (its HTML or its repr)."""

from __future__ import annotations

import ast
import json
import os
from pathlib import Path
from typing import Any

import pytest
from matplotlib.figure import Figure

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "notebook.ipynb"


def _cells() -> list[str]:
    notebook = json.loads(EXAMPLE.read_text(encoding="utf-8"))
    assert notebook["nbformat"] == 4
    return ["".join(cell["source"]) for cell in notebook["cells"] if cell["cell_type"] == "code"]


def _shown(value: Any) -> str:
    """What a notebook shows of ``value``: its HTML where it has one, else its repr."""
    html = getattr(value, "_repr_html_", None)
    shown = html() if callable(html) else None
    return shown if shown is not None else repr(value)


def test_the_example_notebook_runs(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(EXAMPLE.parent)
    namespace: dict[str, Any] = {"__name__": "__main__"}
    shown = []
    for source in _cells():
        tree = ast.parse(source)
        last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
        exec(compile(tree, str(EXAMPLE), "exec"), namespace)
        if last is not None:
            value = eval(compile(ast.Expression(last.value), str(EXAMPLE), "eval"), namespace)
            shown.append(_shown(value))
    assert len(shown) == len(_cells())
    # the first cell shows the result's cards; the chart cell a figure
    result = namespace["result"]
    assert result.findings and result.findings[0].title.split(":")[0] in shown[0]

    timeline = namespace["result"].charts["timeline"]
    assert isinstance(timeline, Figure) and timeline.svg.startswith("<svg")
    assert os.path.basename(os.getcwd()) == "examples"
