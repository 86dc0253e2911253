"""The pages' templates (``templates/``, shipped in the wheel as ``traceinsight/templates``) and
the one jinja2 environment every page is rendered with: autoescape on, so every name taken from a
trace is escaped; undefined names are errors."""

from __future__ import annotations

import functools
import importlib.resources
from pathlib import Path
from typing import TYPE_CHECKING

import jinja2

from traceinsight.errors import TraceInsightError
from traceinsight.formatting import (
    format_count,
    format_duration,
    format_share,
    format_size,
    short_kernel_name,
)

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

__all__ = ["TemplatesMissing", "environment", "prepare", "templates_dir"]


class TemplatesMissing(TraceInsightError):
    """The report templates are neither in the installed package nor in the source checkout."""


def templates_dir() -> Traversable:
    """Where the report templates are: inside the installed wheel, else ``<checkout>/templates``."""
    packaged = importlib.resources.files("traceinsight") / "templates"
    if packaged.is_dir():
        return packaged
    checkout = Path(__file__).resolve().parents[2] / "templates"
    if checkout.is_dir():
        return checkout
    raise TemplatesMissing(
        f"cannot find the report templates (looked in {packaged} and {checkout}); "
        "reinstall torch-traceinsight."
    )


@functools.cache
def environment() -> jinja2.Environment:
    """The pages' jinja2 environment, made once per process: it keeps each template compiled."""
    root = templates_dir()

    def load(name: str) -> str:
        return (root / name).read_text(encoding="utf-8")

    made = jinja2.Environment(
        loader=jinja2.FunctionLoader(load),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
    )
    made.filters.update(
        duration=format_duration,
        size=format_size,
        pct=format_share,
        count=lambda value: f"{value:,}",
        launches=format_count,
        kernel_short=short_kernel_name,
    )
    return made


def prepare() -> None:
    """Compile the report page's templates ahead of use (~80 ms): a command does this beside the
    analysis (:func:`traceinsight.process.prepare_beside`)."""
    environment().get_template("report.html")
