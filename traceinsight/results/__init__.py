"""The typed results: one object behind every output, and the JSON contract it writes.

- :class:`~.trace.Result`: one trace (``analyze TRACE``), made from an analysis
  (:func:`result_for`) or read back from its JSON;
- :class:`~.job.JobResult`: a distributed job (``analyze FOLDER``);
- :class:`~.comparison.Comparison`: two results compared (``diff``);
- :class:`~.job_comparison.JobComparison`: two jobs compared (``diff`` of two jobs).

Each has ``to_json()`` (exactly what ``--json`` writes) and ``from_json(text)`` (what ``diff`` and
the gate read: typed objects, never string keys), one schema version for the three
(:data:`SCHEMA_VERSION`). The gate (:mod:`.gate`) holds a result to its budgets.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection
from typing import TYPE_CHECKING, Any, Final

from traceinsight.load import Trace
from traceinsight.results.contract import result_of
from traceinsight.results.report import Report, RunContext, report_for
from traceinsight.results.trace import SCHEMA_VERSION, Finding, Result
from traceinsight.thresholds import Thresholds

if TYPE_CHECKING:
    from traceinsight.results.comparison import Comparison, compare
    from traceinsight.results.job import JobResult
    from traceinsight.results.job_comparison import JobComparison, compare_jobs

__all__ = [
    "SCHEMA_VERSION",
    "Comparison",
    "Finding",
    "JobComparison",
    "JobResult",
    "Report",
    "Result",
    "RunContext",
    "compare",
    "compare_jobs",
    "report_for",
    "result_for",
    "result_of",
]


#: Where the job's and the comparison's names live: imported when first used, so that one trace's
#: analysis does not import their modules (~3 ms of CPU; ~8 ms with a job's flow and drawing).
_LATER: Final = {
    "Comparison": "comparison",
    "compare": "comparison",
    "JobResult": "job",
    "JobComparison": "job_comparison",
    "compare_jobs": "job_comparison",
}

if not TYPE_CHECKING:  # the type checker reads the imports above

    def __getattr__(name: str) -> Any:
        home = _LATER.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def result_for(
    trace: Trace,
    thresholds: Thresholds | None = None,
    user_code: Collection[str] = (),
    run: RunContext | None = None,
    *,
    every_gap: bool = False,
) -> Result:
    """The result of a loaded trace: analyzed, its rules evaluated, as the typed result."""
    return result_of(report_for(trace, thresholds, user_code, run, every_gap=every_gap))
