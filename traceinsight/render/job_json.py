"""The job's JSON: a stable contract, like the one-trace JSON. Times in microseconds (floats).

Top-level keys (never renamed; new keys may be added): ``schema``, ``kind`` (``"job"``), ``tool``,
``job``, ``warnings``, ``ranks``, ``stragglers``, ``findings``. Each ``ranks[]`` entry's
``utilization`` is exactly the ``utilization`` of that rank's own ``analyze --json``. Nothing in it
depends on where or how the ranks were analyzed (local pool or dask), so both give the same bytes.
"""

from __future__ import annotations

import json
from typing import Any

from traceinsight import __version__
from traceinsight.job.combine import JobReport
from traceinsight.render.json_report import usage_dict

__all__ = ["JOB_SCHEMA_VERSION", "JobJsonRenderer", "job_dict"]

JOB_SCHEMA_VERSION = 1


def _us(ns: int) -> float:
    return round(ns / 1000, 3)


def _maybe_us(ns: int | None) -> float | None:
    return None if ns is None else _us(ns)


def job_dict(job: JobReport) -> dict[str, Any]:
    """The job report as plain JSON-ready data."""
    return {
        "schema": JOB_SCHEMA_VERSION,
        "kind": "job",
        "tool": {"name": "traceinsight", "version": __version__},
        "job": {
            "ranks": len(job.ranks),
            "world_size": next((r.world_size for r in job.ranks if r.world_size is not None), None),
            "backend": next((r.backend for r in job.ranks if r.backend is not None), None),
            "step_time_us": _maybe_us(job.step_ns),
            "collectives": {
                "from": job.collectives_from,
                "matched": job.collectives_matched,
                "matched_by_seq": job.collectives_matched_by_seq,
                "kinds": dict(job.collective_kinds),
            },
        },
        "warnings": list(job.warnings),
        "ranks": [_rank(job, result_index) for result_index in range(len(job.ranks))],
        "stragglers": [
            {
                "rank": straggler.rank,
                "reasons": list(straggler.reasons),
                "cause": straggler.cause,
                "cause_words": straggler.cause_words,
                "cause_excess_per_step_us": _us(straggler.cause_excess_ns),
                "others_waited_us": _us(straggler.caused_ns),
                "top_finding": straggler.top_finding,
            }
            for straggler in job.stragglers
        ],
        "findings": [
            {
                "rule": finding.rule,
                "severity": finding.severity,
                "title": finding.title,
                "ranks": list(finding.ranks),
                "rank_count": len(finding.ranks),
                "savings_us": _us(finding.savings_ns),
                "minor": finding.minor,
            }
            for finding in job.findings
        ],
    }


def _rank(job: JobReport, index: int) -> dict[str, Any]:
    result = job.ranks[index]
    timing = job.timing(result.rank)
    top = result.top_finding
    usage = result.usage
    return {
        "rank": result.rank,
        "rank_from": result.rank_from,
        "path": result.path,
        "steps": result.steps,
        "step_time_us": _maybe_us(result.step_ns),
        "utilization": usage_dict(usage, result.has_usage),
        "per_step_us": {
            "compute": _us(result.per_step(usage.compute_ns)),
            "communication": _us(result.per_step(result.communication_total_ns)),
            "communication_exposed": _us(result.per_step(usage.communication_ns)),
            "copy_exposed": _us(result.per_step(usage.copy_ns)),
            "idle": _us(result.per_step(usage.idle_ns)),
            "idle_by_cause": {kind.value: _us(result.per_step(ns)) for kind, ns in usage.idle},
        },
        "syncs_per_step": None if result.syncs_per_step is None else round(result.syncs_per_step, 4),
        "collectives": None
        if timing is None
        else {
            "from": result.collectives_from,
            "matched": timing.matched,
            "late_median_us": _us(timing.late_median_ns),
            "late_max_us": _us(timing.late_max_ns),
            "waited_us": _us(timing.waited_ns),
            "others_waited_us": _us(timing.caused_ns),
        },
        "top_finding": None
        if top is None
        else {"rule": top.rule, "title": top.title, "savings_us": _us(top.savings_ns)},
        "warnings": list(result.warnings),
    }


class JobJsonRenderer:
    """Renders :func:`job_dict` as indented JSON."""

    def render(self, job: JobReport) -> str:
        """The job report as a JSON document."""
        return json.dumps(job_dict(job), indent=2, ensure_ascii=False, allow_nan=False) + "\n"
