"""The rule ids there are, and the check that a gate names only those.

A misspelled id given to ``--fail-on-rule`` (or ``fail-on-rule`` in ``[tool.traceinsight]``) would
match no finding and so silently turn the gate off; :func:`check_rule_ids` refuses it in one line
that names the closest id and lists them all. :func:`check_budget` does the same for a numeric
budget that is not a finite number ≥ 0 (``nan`` compares false with everything, so it never fires).
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Iterable

from traceinsight.errors import ConfigError

__all__ = ["check_budget", "check_rule_ids", "rule_ids"]


def rule_ids() -> tuple[str, ...]:
    """Every registered rule id, in registration order."""
    from traceinsight.rules import builtin_rules

    return tuple(builtin_rules())


def check_rule_ids(ids: Iterable[str], where: str) -> tuple[str, ...]:
    """``ids`` when each is a registered rule; else :class:`ConfigError` naming the first unknown
    one, the closest known id, and every id. ``where`` says where the ids came from
    (``--fail-on-rule``, ``fail-on-rule in /x/pyproject.toml``)."""
    given = tuple(ids)
    known = rule_ids()
    for rule_id in given:
        if rule_id not in known:
            close = difflib.get_close_matches(rule_id.replace("_", "-").lower(), known, n=1, cutoff=0.5)
            hint = f"did you mean {close[0]!r}? " if close else ""
            raise ConfigError(
                f"{where}: {rule_id!r} is not a rule id; {hint}the rules are: {', '.join(known)}"
            )
    return given


def check_budget(value: float | None, where: str) -> float | None:
    """``value`` when it is None or a finite number ≥ 0; else :class:`ConfigError` (``where`` names
    the option or the table key)."""
    if value is None:
        return None
    if not math.isfinite(value) or value < 0:
        raise ConfigError(f"{where} must be a finite number ≥ 0, not {value!r}")
    return value
