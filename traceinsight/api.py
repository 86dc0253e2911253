"""The public API: traceinsight in a notebook or a script, the same results as every output.

``traceinsight.analyze(trace)`` gives the :class:`~traceinsight.results.trace.Result` that
``traceinsight analyze --json`` writes (a folder, a list or a pattern: a distributed job's
:class:`~traceinsight.results.job.JobResult`); ``traceinsight.diff(before, after)`` the
:class:`~traceinsight.results.comparison.Comparison` of ``traceinsight diff`` (of two jobs: a
:class:`~traceinsight.results.job_comparison.JobComparison`);
``traceinsight.load(trace)`` the typed polars tables every analysis reads. Each result has
``to_json()`` and ``from_json(text)``, its tables as polars DataFrames (``frames``), and shows its
scorecard and finding cards in a notebook; a trace's result draws the page's charts
(``charts``). Errors are :class:`~traceinsight.errors.TraceInsightError` with a one-line message.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from traceinsight.errors import ConfigError, TraceInsightError
from traceinsight.job import is_job
from traceinsight.job.execute import analyze_job
from traceinsight.job.triage import job_files
from traceinsight.load import SizeLimit, Trace, load_trace
from traceinsight.load.text import printable
from traceinsight.render import figures, notebook  # noqa: F401 (register what results show in a notebook)
from traceinsight.results import (
    Comparison,
    JobComparison,
    JobResult,
    Result,
    compare,
    compare_jobs,
    report_for,
    result_of,
)
from traceinsight.results.stored import read_stored
from traceinsight.thresholds import Thresholds

__all__ = ["analyze", "diff", "load"]

#: What names a trace: a path (or its text).
TracePath = str | os.PathLike[str]


def load(trace: TracePath, *, max_bytes: int | None = None) -> Trace:
    """The trace's typed polars tables (``trace.gpu``, ``trace.runtime``, ``trace.cpu_ops``, …;
    times in integer nanoseconds on the trace's clock), as every analysis reads them.
    ``max_bytes``: refuse a trace holding more JSON than that (``--max-size``)."""
    return load_trace(Path(trace), limit=SizeLimit(max_bytes))


def _thresholds(given: dict[str, Any]) -> Thresholds:
    """:class:`~traceinsight.thresholds.Thresholds` with ``given`` changed (their names as keywords)."""
    known = {field.name for field in dataclasses.fields(Thresholds)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(
            f"unknown threshold {', '.join(unknown)}: the thresholds are {', '.join(sorted(known))} "
            "(see traceinsight.thresholds.Thresholds)"
        )
    defaults = Thresholds()
    # ``min_gap_us=200`` is ``--min-gap-us 200``: a float where the threshold is one (the result's
    # JSON writes the thresholds it ran with).
    made: dict[str, Any] = {
        name: float(value) if isinstance(getattr(defaults, name), float) and type(value) is int else value
        for name, value in given.items()
    }
    return Thresholds(**made)


def _paths(trace: TracePath | Sequence[TracePath]) -> list[Path]:
    if isinstance(trace, (str, os.PathLike)):
        return [Path(trace)]
    return [Path(item) for item in trace]


def analyze(
    trace: TracePath | Sequence[TracePath],
    *,
    user_code: Sequence[str] = (),
    source_root: TracePath | None = None,
    **thresholds: Any,
) -> Result | JobResult:
    """Analyze a trace as ``traceinsight analyze`` does: its :class:`~traceinsight.results.trace.Result`.

    A folder, a list of traces or a glob pattern is a distributed job, one rank per trace: its
    :class:`~traceinsight.results.job.JobResult` (the ranks analyzed in a local process pool).
    ``user_code``: packages whose frames are your own code (``--user-code``). ``source_root``: the
    folder the finding cards' code excerpts may be read from (only ``.py`` files inside it).
    ``thresholds``: any field of :class:`~traceinsight.thresholds.Thresholds` by name
    (``min_gap_us=10``, ``low_utilization=0.5``).

    The result keeps the table of every idle gap, the short ones too (``frames["idle_gaps"]``).
    """
    limits = _thresholds(thresholds)
    paths = _paths(trace)
    code = tuple(user_code)
    if is_job(paths):
        return _job(paths, limits, code)
    loaded = load_trace(paths[0])
    report = report_for(loaded, limits, code, every_gap=True)
    root = None if source_root is None else Path(source_root)
    return result_of(dataclasses.replace(report, source_root=root))


def _job(paths: list[Path], thresholds: Thresholds, user_code: tuple[str, ...]) -> JobResult:
    """A job's result, its files found and sorted as the command does (a job folder's own result
    or config skipped with a note: :func:`~traceinsight.job.triage.job_files`)."""
    found = job_files(paths)
    return analyze_job(found.discovery, thresholds=thresholds, user_code=user_code, cycles_of=found.cycles_of)


def _side(
    side: Result | JobResult | TracePath, user_code: tuple[str, ...], thresholds: Thresholds
) -> Result | JobResult:
    """One side of a diff: a result, a stored result (``analyze --json``, a trace's or a job's), a
    job's traces (a folder, a pattern) analyzed, or a trace analyzed."""
    if isinstance(side, (Result, JobResult)):
        return side
    path = Path(side)
    if is_job([path]):
        return _job([path], thresholds, user_code)
    stored = read_stored(path, (Result, JobResult))
    if stored is not None:
        return stored
    loaded = load_trace(path)
    return result_of(report_for(loaded, thresholds, user_code))


def _name(side: Result | JobResult | TracePath) -> str:
    if isinstance(side, Result):
        return side.trace.name
    if isinstance(side, JobResult):
        return f"job of {side.job.ranks} ranks"
    return printable(Path(side).name)


def diff(
    before: Result | JobResult | TracePath,
    after: Result | JobResult | TracePath,
    *,
    top: int = 10,
    user_code: Sequence[str] = (),
    **thresholds: Any,
) -> Comparison | JobComparison:
    """Compare two runs as ``traceinsight diff`` does: step time, GPU busy and idle by cause, syncs,
    copies, communication, findings fixed / new / still there, the ``top`` kernels that changed
    most. Each side is a :class:`~traceinsight.results.trace.Result`, a trace, or a result
    ``analyze --json`` wrote (read under the checks of a stored result). Two jobs (each a
    :class:`~traceinsight.results.job.JobResult`, a job's stored result, a folder or a pattern of
    rank traces) give a :class:`~traceinsight.results.job_comparison.JobComparison`; a job beside a
    trace is refused."""
    limits = _thresholds(thresholds)
    code = tuple(user_code)
    sides = [_side(side, code, limits) for side in (before, after)]
    names = [_name(side) for side in (before, after)]
    if isinstance(sides[0], JobResult) and isinstance(sides[1], JobResult):
        return compare_jobs(sides[0], sides[1], names[0], names[1])
    if isinstance(sides[0], Result) and isinstance(sides[1], Result):
        return compare(sides[0], sides[1], names[0], names[1], top=top)
    raise TraceInsightError(
        f"cannot compare {names[0]} with {names[1]}: one is a job and the other one trace; give two jobs "
        "or two traces (a rank's trace on each side)"
    )
