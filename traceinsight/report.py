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
class RunContext:
    """What ``traceinsight run`` knows about the run that the trace file does not say."""

    command: str
    """The command as typed, e.g. ``traceinsight run train.py --epochs 1``."""
    script: str
    """The script path as typed, or the module name."""
    started: str
    """When the script started, ISO 8601 with the local offset (``2026-11-22T10:04:05+01:00``)."""
    torch_version: str | None
    elapsed_s: float
    """Wall time of the script, in seconds."""
    exit_status: int
    """The script's own exit status (what ``run`` exits with)."""
    failure: str | None = None
    """How the script failed, one line (``ValueError: bad shape at train.py:47``), or None."""
    steps_recorded: int | None = None
    """Complete steps in the trace (None: the whole run as one window)."""


@dataclass(frozen=True, slots=True)
class Report:
    """Everything the renderers show, in the order they show it."""

    analysis: Analysis
    findings: tuple[Finding, ...]
    run: RunContext | None = None
    """Set when the report was made by ``traceinsight run``."""

    @property
    def trace_name(self) -> str:
        """The trace file's name."""
        return Path(self.analysis.meta.path).name


class Renderer(Protocol):
    """Turns a report into text (terminal, JSON, HTML)."""

    def render(self, report: Report) -> str:
        """The whole output as one string."""
        ...


def report_for(
    trace: Trace,
    thresholds: Thresholds | None = None,
    user_code: Collection[str] = (),
    run: RunContext | None = None,
) -> Report:
    """Analyze a loaded trace and evaluate the rules on it."""
    analysis = analyze(trace, thresholds, user_code)
    return Report(analysis=analysis, findings=evaluate(analysis), run=run)


def build_report(
    trace_path: Path, thresholds: Thresholds | None = None, progress: ProgressCallback | None = None
) -> Report:
    """Load, analyze and evaluate the rules for one trace file (``progress`` sees the load)."""
    return report_for(load_trace(trace_path, progress=progress), thresholds)
