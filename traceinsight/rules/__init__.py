"""Rules: small functions with stable ids that turn analysis results into findings.

Each rule reads an :class:`~traceinsight.analysis.Analysis` and returns zero or more findings, only
from evidence in the trace, one per fix. Register a rule with :func:`rule`; :func:`evaluate` runs
them all, marks the findings below the noise floor as minor, and ranks the rest by saving.
"""

from __future__ import annotations

from traceinsight.analysis import Analysis
from traceinsight.rules.findings import SEVERITIES, Advice, Finding, Severity
from traceinsight.rules.registry import REGISTRY, Rule, rule


def is_minor(analysis: Analysis, finding: Finding) -> bool:
    """Below the noise floor: the saving is under ``minor_share`` of the step time (of the steady
    window without steps) and under ``minor_total_us`` in all."""
    limits = analysis.thresholds
    if not finding.saving_known:
        return False
    share = finding.saving_share or 0.0
    return share < limits.minor_share and finding.savings_total_ns < limits.minor_total_us * 1000


def builtin_rules() -> dict[str, Rule]:
    """The registry, with the built-in rules' modules imported (they register as they load)."""
    from traceinsight.rules import (  # noqa: F401  (registers the built-in rules)
        communication,
        copies,
        efficiency,
        idle,
        launching,
        memory,
        optimizer,
        pipeline,
        precision,
        syncs,
    )

    return REGISTRY


def _claims_nothing(finding: Finding) -> Finding:
    """A finding on a window of first calls: no saving, low, with the reason."""
    why = "no saving claimed: the window holds only first calls (a cold pass; see the warning)"
    return finding.with_(
        savings_total_ns=0,
        savings_per_step_ns=None,
        saving_share=None,
        saving_known=False,
        severity=Severity.LOW,
        saving_note=why,
    )


def evaluate(analysis: Analysis) -> tuple[Finding, ...]:
    """Run every registered rule; cards by largest saving first, then the minor findings. On a
    window of first calls (:data:`~traceinsight.analysis.validity.FIRST_CALLS_ONLY`) no finding
    claims a saving."""
    from traceinsight.analysis.validity import FIRST_CALLS_ONLY

    cold = any(warning.kind == FIRST_CALLS_ONLY for warning in analysis.warnings)
    findings = [
        finding.with_(minor=is_minor(analysis, finding))
        for function in builtin_rules().values()
        for finding in function(analysis)
    ]
    order = {severity: index for index, severity in enumerate(SEVERITIES)}
    ranked = sorted(
        findings, key=lambda f: (f.minor, -f.savings_total_ns, order[f.severity], f.rule, f.title)
    )
    # on a cold pass the order stays the measured one (what to look at first), with no saving claimed
    return tuple(_claims_nothing(finding) for finding in ranked) if cold else tuple(ranked)


__all__ = [
    "REGISTRY",
    "Advice",
    "Finding",
    "Rule",
    "Severity",
    "builtin_rules",
    "evaluate",
    "is_minor",
    "rule",
]
