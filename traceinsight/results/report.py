"""The live side of a result: the analysis of one trace and its findings, as the rules made them.

A :class:`~.trace.Result` made by an analysis carries its :class:`Report`: the terminal summary,
the page, the Markdown and the charts are drawn from it, the JSON from the result's own fields.
"""

from __future__ import annotations

import shlex
from collections.abc import Collection
from pathlib import Path

from traceinsight.analysis import Analysis, analyze
from traceinsight.analysis.validity import WAIT_COMMAND
from traceinsight.load import Trace
from traceinsight.load.tables import StepUsage
from traceinsight.model import Model, field, replace
from traceinsight.rules import evaluate
from traceinsight.rules.findings import Finding
from traceinsight.thresholds import Thresholds


class RunContext(Model, frozen=True):
    """What ``traceinsight run`` knows about the run that the trace file does not say: a result's
    ``run`` (the JSON's keys are its fields but the two marked not written)."""

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
    script_is_module: bool = field(default=False, compare=False, metadata={"local": True})
    """True when :attr:`script` is a module name (``traceinsight run -m``). Not written."""
    cores: int | None = None
    """CPUs the machine had (``os.cpu_count()``; schema 3)."""
    step_usage: tuple[StepUsage, ...] = field(default=(), metadata={"most": 10_000})
    """Each recorded step as the process lived it (schema 3; at most 10,000, what ``run`` keeps):
    what tells a step starved of CPU."""
    after_window_ns: tuple[int, ...] = field(default=(), compare=False, metadata={"local": True})
    """Wall time of each step that ran unrecorded after the window, in order (the first one also
    wrote the trace): the baseline of the ``recording-cost`` warning, which the trace file cannot
    hold (:attr:`traceinsight.load.tables.RunProfile.after_window_ns`). Not written."""


class Report(Model, frozen=True):
    """Everything the renderers show, in the order they show it."""

    analysis: Analysis
    findings: tuple[Finding, ...]
    run: RunContext | None = None
    """Set when the report was made by ``traceinsight run``."""
    source_root: Path | None = None
    """The folder the page's code excerpts may be read from, when the result carries it (the
    public API's ``source_root``; a command hands its own to the renderer)."""

    @property
    def trace_name(self) -> str:
        """The trace file's name."""
        return Path(self.analysis.meta.path).name


def report_for(
    trace: Trace,
    thresholds: Thresholds | None = None,
    user_code: Collection[str] = (),
    run: RunContext | None = None,
    *,
    every_gap: bool = False,
) -> Report:
    """Analyze a loaded trace and evaluate the rules on it (``every_gap``: keep the table of every
    idle gap, :attr:`~traceinsight.analysis.Analysis.every_gap`)."""
    analysis = analyze(_with_steps_after(trace, run), thresholds, user_code, every_gap=every_gap)
    return Report(analysis=_script_named(analysis, run), findings=evaluate(analysis), run=run)


def _with_steps_after(trace: Trace, run: RunContext | None) -> Trace:
    """``trace`` with the steps ``run`` saw after its window (the trace was written before them)."""
    recorded = trace.meta.recorded_by_run
    if run is None or recorded is None or not run.after_window_ns:
        return trace
    recorded = replace(recorded, after_window_ns=run.after_window_ns)
    return replace(trace, meta=replace(trace.meta, recorded_by_run=recorded))


def _script_named(analysis: Analysis, run: RunContext | None) -> Analysis:
    """A run's report names the script it ran in the warnings' advice, not ``train.py``."""
    if run is None or not any(WAIT_COMMAND in warning.advice for warning in analysis.warnings):
        return analysis
    script = shlex.join(["-m", run.script] if run.script_is_module else [run.script])
    command = WAIT_COMMAND.removesuffix("train.py") + script
    warnings = tuple(
        replace(warning, advice=warning.advice.replace(WAIT_COMMAND, command))
        for warning in analysis.warnings
    )
    return replace(analysis, warnings=warnings)
