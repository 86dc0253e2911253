"""Rules: small functions with stable ids that turn analysis results into findings.

Each rule reads an :class:`~traceinsight.analysis.Analysis` and returns zero or more findings, only
from evidence in the trace, one per fix. Register a rule with :func:`rule`; :func:`evaluate` runs
them all, marks the findings below the noise floor as minor, and ranks the rest by saving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from traceinsight.analysis import Analysis
from traceinsight.rules.findings import SEVERITIES, Advice, Finding, Severity

Rule = Callable[[Analysis], Iterable[Finding]]

#: Rule id → rule function, in registration order.
REGISTRY: dict[str, Rule] = {}


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    """Register a rule under a stable id."""

    def register(function: Rule) -> Rule:
        if rule_id in REGISTRY:
            raise ValueError(f"rule id {rule_id!r} registered twice")
        REGISTRY[rule_id] = function
        return function

    return register


def is_minor(analysis: Analysis, finding: Finding) -> bool:
    """Below the noise floor: the saving is under ``minor_share`` of the step time (of the steady
    window without steps) and under ``minor_total_us`` in all."""
    limits = analysis.thresholds
    if not finding.saving_known:
        return False
    share = finding.saving_share or 0.0
    return share < limits.minor_share and finding.savings_ns < limits.minor_total_us * 1000


def evaluate(analysis: Analysis) -> tuple[Finding, ...]:
    """Run every registered rule; cards by largest saving first, then the minor findings."""
    from traceinsight.rules import (  # noqa: F401  (registers the built-in rules)
        communication,
        copies,
        idle,
        launching,
        memory,
        optimizer,
        pipeline,
        precision,
        syncs,
    )

    findings = [
        finding.with_(minor=is_minor(analysis, finding))
        for function in REGISTRY.values()
        for finding in function(analysis)
    ]
    order = {severity: index for index, severity in enumerate(SEVERITIES)}
    return tuple(sorted(findings, key=lambda f: (f.minor, -f.savings_ns, order[f.severity], f.rule, f.title)))


__all__ = ["REGISTRY", "Advice", "Finding", "Severity", "evaluate", "is_minor", "rule"]
