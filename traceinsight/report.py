"""The report: one object every renderer reads (analysis + findings + presentation helpers)."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from traceinsight.analysis import Analysis, analyze
from traceinsight.load import Trace, load_trace
from traceinsight.load.progress import ProgressCallback
from traceinsight.rules import evaluate
from traceinsight.rules.findings import Finding
from traceinsight.thresholds import Thresholds


@dataclass(frozen=True, slots=True)
class Report:
    """Everything the renderers show, in the order they show it."""

    analysis: Analysis
    findings: tuple[Finding, ...]

    @property
    def trace_name(self) -> str:
        """The trace file's name."""
        return Path(self.analysis.meta.path).name


class Renderer(Protocol):
    """Turns a report into text (terminal, JSON, HTML)."""

    def render(self, report: Report) -> str:
        """The whole output as one string."""
        ...


def report_for(trace: Trace, thresholds: Thresholds | None = None, user_code: Collection[str] = ()) -> Report:
    """Analyze a loaded trace and evaluate the rules on it."""
    analysis = analyze(trace, thresholds, user_code)
    return Report(analysis=analysis, findings=evaluate(analysis))


def build_report(
    trace_path: Path, thresholds: Thresholds | None = None, progress: ProgressCallback | None = None
) -> Report:
    """Load, analyze and evaluate the rules for one trace file (``progress`` sees the load)."""
    return report_for(load_trace(trace_path, progress=progress), thresholds)
