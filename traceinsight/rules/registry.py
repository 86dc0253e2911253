"""The rule registry: each rule registered once under its stable id (:func:`rule`).

Apart from the package so that the rule modules, which register themselves here, never import
the package that imports them (no import cycle).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator

from traceinsight.analysis import Analysis
from traceinsight.rules.findings import Finding

__all__ = ["REGISTRY", "Rule", "rule"]

Rule = Callable[[Analysis], Iterable[Finding]]

#: Rule id → rule function, in registration order.
REGISTRY: dict[str, Rule] = {}


def rule(rule_id: str) -> Callable[[Rule], Rule]:
    """Register a rule under a stable id: every finding it yields carries that id (the id is
    written here once, never again in the rule's body)."""

    def register(function: Rule) -> Rule:
        if rule_id in REGISTRY:
            raise ValueError(f"rule id {rule_id!r} registered twice")

        @functools.wraps(function)
        def stamped(analysis: Analysis) -> Iterator[Finding]:
            for finding in function(analysis):
                yield finding.with_(rule=rule_id)

        REGISTRY[rule_id] = stamped
        return stamped

    return register
