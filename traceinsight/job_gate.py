"""The gate on a job: a budget breaks when any rank breaks it, and the line names the rank.

Each rank is held to the budgets exactly as its own ``analyze`` would be (:func:`traceinsight.gate.broken`
on the fields of its result the gate reads: its findings, minor ones included; its utilization;
its host syncs per steady step), so a job passes only when every rank would.
"""

from __future__ import annotations

from typing import Any

from traceinsight.gate import Budgets, broken
from traceinsight.job.combine import JobReport
from traceinsight.job.rank import RankResult
from traceinsight.render.json_report import usage_dict

__all__ = ["broken_job"]


def _rank_document(result: RankResult) -> dict[str, Any]:
    """The fields of the rank's own result that the gate reads (see :func:`traceinsight.gate.broken`)."""
    return {
        "findings": [
            {"rule": f.rule, "severity": f.severity, "title": f.title, "minor": f.minor}
            for f in result.findings
        ],
        "utilization": usage_dict(result.usage, result.has_usage),
        "steady_state": {"steady_steps": result.steps},
        "sync_hotspots": [{"steady_count": result.steady_syncs}],
    }


def broken_job(job: JobReport, budgets: Budgets) -> list[str]:
    """One line per rank and broken budget, ``rank 3: …`` (``cycle 1: …`` for a process's cycles)."""
    unit = "rank" if job.cycles_of is None else "cycle"
    return [
        f"{unit} {result.rank}: {line}"
        for result in job.ranks
        for line in broken(_rank_document(result), budgets)
    ]
