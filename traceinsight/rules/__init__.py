"""Rules: small functions with stable ids that turn analysis results into findings.

Each rule reads an :class:`~traceinsight.analysis.Analysis` and returns zero or more findings, only
from evidence in the trace. Register a rule with :func:`rule`; :func:`evaluate` runs them all and
ranks findings by estimated saving.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from traceinsight.analysis import Analysis
from traceinsight.rules.findings import Advice, Finding

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


def evaluate(analysis: Analysis) -> tuple[Finding, ...]:
    """Run every registered rule; findings with the largest estimated saving first."""
    from traceinsight.rules import builtin  # noqa: F401  (registers the built-in rules)

    findings = [finding for function in REGISTRY.values() for finding in function(analysis)]
    order = {"high": 0, "medium": 1, "low": 2}
    return tuple(sorted(findings, key=lambda f: (-f.savings_ns, order[f.severity], f.rule, f.title)))


__all__ = ["REGISTRY", "Advice", "Finding", "evaluate", "rule"]
