"""The gate: budgets a result must keep, for CI. A broken budget is one line and exit status 1.

Budgets come from the command line (``--fail-on``, ``--fail-on-rule``, ``--max-idle``,
``--max-syncs-per-step``, ``--max-regression``) or the ``[tool.traceinsight]`` table
(``fail-on``, ``fail-on-rule``, ``max-idle``, ``max-syncs-per-step``, ``max-regression``); the
command line wins. They are checked on the typed result (:class:`~.trace.Result`, what ``--json``
writes, live or read back), so the same budgets hold for ``analyze`` and for ``diff`` (the after
side, plus the step-time regression).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Protocol

from traceinsight.errors import ConfigError
from traceinsight.model import Model, replace
from traceinsight.results.trace import Result, Utilization
from traceinsight.rules.findings import SEVERITIES
from traceinsight.rules.ids import check_budget, check_rule_ids

if TYPE_CHECKING:
    from traceinsight.results.comparison import Comparison, Metric
    from traceinsight.results.job import JobResult, RankResult
    from traceinsight.results.job_comparison import JobComparison

__all__ = [
    "EXIT_BROKEN",
    "Budgets",
    "broken",
    "broken_diff",
    "broken_job",
    "broken_job_diff",
    "broken_ranks",
    "budgets_from_table",
    "held_back",
]

#: The exit status of a broken gate (bad input stays 2, internal errors 3).
EXIT_BROKEN = 1


class Budgets(Model, frozen=True):
    """What a result must keep. None (or empty) means "not checked"."""

    #: Fail on any finding (not minor) of this severity or worse: ``high``, ``medium`` or ``low``.
    fail_on: str | None = None
    #: Fail on any finding of these rules, minor ones included.
    fail_on_rules: tuple[str, ...] = ()
    #: Most GPU idle allowed, in percent of the step time (of the time analyzed without steps).
    max_idle: float | None = None
    #: Most host syncs per steady step allowed.
    max_syncs_per_step: float | None = None
    #: ``diff`` only: most step-time growth allowed, in percent of the before side.
    max_regression: float | None = None

    @property
    def empty(self) -> bool:
        """True when nothing is checked."""
        return self == Budgets()

    def over(self, other: Budgets) -> Budgets:
        """These budgets, with any that ``other`` sets taken from it (the command line over the table)."""
        return replace(
            self,
            **{
                name: getattr(other, name)
                for name in ("fail_on", "fail_on_rules", "max_idle", "max_syncs_per_step", "max_regression")
                if getattr(other, name) not in (None, ())
            },
        )


def _check_severity(value: Any, where: str) -> str:
    if value not in SEVERITIES:
        raise ConfigError(f"{where}: fail-on must be one of {', '.join(SEVERITIES)}, not {value!r}")
    return str(value)


def budgets_from_table(table: dict[str, Any] | None, where: str) -> Budgets:
    """Budgets from a ``[tool.traceinsight]`` table (``where`` names it in errors)."""
    if not table:
        return Budgets()

    def number(key: str) -> float | None:
        value = table.get(key)
        if value is None:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: {key} in [tool.traceinsight] must be a number ≥ 0, not {value!r}")
        return check_budget(float(value), f"{where}: {key} in [tool.traceinsight]")

    rules = table.get("fail-on-rule", [])
    if isinstance(rules, str):
        rules = [rules]
    if not isinstance(rules, list) or not all(isinstance(rule, str) for rule in rules):
        raise ConfigError(
            f'{where}: fail-on-rule in [tool.traceinsight] must be a list of rule ids, e.g. ["sync-in-loop"]'
        )
    fail_on = table.get("fail-on")
    return Budgets(
        fail_on=_check_severity(fail_on, where) if fail_on is not None else None,
        fail_on_rules=check_rule_ids(rules, f"{where}: fail-on-rule in [tool.traceinsight]"),
        max_idle=number("max-idle"),
        max_syncs_per_step=number("max-syncs-per-step"),
        max_regression=number("max-regression"),
    )


class _Judged(Protocol):
    """What the gate reads of a finding (a result's, or a rank's brief)."""

    @property
    def rule(self) -> str: ...
    @property
    def severity(self) -> str: ...
    @property
    def title(self) -> str: ...
    @property
    def minor(self) -> bool: ...


def broken(result: Result, budgets: Budgets) -> list[str]:
    """One line per budget the result breaks (empty: the gate passes)."""
    from traceinsight.results.comparison import syncs_per_step  # a diff's module, loaded when a gate is set

    return _broken(result.findings, result.utilization, syncs_per_step(result), budgets)


def broken_ranks(ranks: Sequence[RankResult], budgets: Budgets, unit: str = "rank") -> list[str]:
    """A job's gate: each rank held to the budgets exactly as its own ``analyze`` would be (its
    findings, minor ones included; its utilization; its host syncs per steady step), one line per
    rank and broken budget, ``rank 3: …`` (``unit``: ``cycle`` for one process's profiler cycles).
    A job passes only when every rank would."""
    return [
        f"{unit} {rank.rank}: {line}"
        for rank in ranks
        for line in _broken(
            rank.findings,
            rank.entry.utilization,
            rank.syncs_per_step,
            budgets,
        )
    ]


def _broken(
    every: Sequence[_Judged], utilization: Utilization, syncs: float | None, budgets: Budgets
) -> list[str]:
    lines: list[str] = []
    findings = [finding for finding in every if not finding.minor]
    if budgets.fail_on is not None:
        worst = SEVERITIES.index(budgets.fail_on)
        for finding in findings:
            if SEVERITIES.index(finding.severity) <= worst:
                lines.append(
                    f"a {finding.severity} finding ({finding.rule}, --fail-on {budgets.fail_on}): {finding.title}"
                )
    for rule in budgets.fail_on_rules:  # a rule named asks for none of it: minor findings count
        for finding in every:
            if finding.rule == rule:
                minor = "minor " if finding.minor else ""
                lines.append(f"a {minor}{rule} finding (--fail-on-rule {rule}): {finding.title}")
    idle = utilization.idle_share
    if budgets.max_idle is not None and idle is not None and idle * 100 > budgets.max_idle:
        lines.append(
            f"the GPU is idle {idle * 100:.1f}% of {utilization.of or 'the time'}, over --max-idle {budgets.max_idle:g}%"
        )
    if budgets.max_syncs_per_step is not None and syncs is not None and syncs > budgets.max_syncs_per_step:
        lines.append(
            f"{syncs:.3g} host syncs per step, over --max-syncs-per-step {budgets.max_syncs_per_step:g}"
        )
    return lines


def broken_diff(comparison: Comparison, after: Result, budgets: Budgets) -> list[str]:
    """The after side's budgets, and the step time's growth against ``--max-regression``."""
    lines = broken(after, budgets)
    if budgets.max_regression is not None:
        lines += _regression(comparison.metric("step_time"), budgets.max_regression)
    return lines


def _regression(step: Metric, most: float) -> list[str]:
    """The step time's growth over ``most`` percent, as a line, when it is told apart from noise
    too (its verdict ``slower``: the whole interval above no change). None when within the budget,
    or when the growth cannot be told apart from what steps and runs vary by (a comparison
    without a verdict, e.g. a stored one of schema 2, is judged on the change alone)."""
    if step.relative is None or step.relative * 100 <= most:
        return []
    if step.verdict is not None and step.verdict != "slower":
        return []
    return [
        f"the {step.label} grew {step.relative * 100:.1f}% ({step.before:,.1f} µs → {step.after:,.1f} µs), "
        f"over --max-regression {most:g}%"
        + (f" and told apart from noise ({step.interval_text()})" if step.verdict else "")
    ]


def held_back(step: Metric, most: float | None) -> list[str]:
    """What the gate did not break on: a step-time growth over ``most`` percent that could not be
    told apart from noise, in words that say what would tell (one line; none otherwise)."""
    if most is None or step.relative is None or step.relative * 100 <= most:
        return []
    if step.verdict is None or step.verdict == "slower":
        return []
    return [
        f"the {step.label} grew {step.relative * 100:.1f}%, over --max-regression {most:g}%, but "
        f"{step.verdict} ({step.interval_text()}): not broken; more steps, more runs a side "
        "(profiler cycles, repeated runs) or a quieter machine would tell"
    ]


def broken_job(result: JobResult, budgets: Budgets) -> list[str]:
    """A job's gate on its result: every rank held to the budgets as ``analyze`` holds it
    (:func:`broken_ranks`) when the ranks were analyzed here. A stored job's result keeps each
    rank's utilization and syncs per step, but of its findings only each rule's ranks, worst
    severity and whether it was minor on every rank: those are judged once per rule, the line
    naming the ranks."""
    unit = "cycle" if result.job.read_as == "cycles" else "rank"
    if result.rank_results:
        return broken_ranks(result.rank_results, budgets, unit)
    on_findings = Budgets(fail_on=budgets.fail_on, fail_on_rules=budgets.fail_on_rules)
    on_figures = replace(budgets, fail_on=None, fail_on_rules=())
    lines: list[str] = []
    for entry in result.findings:
        if entry.rule == "straggler":  # the job's word on a rank's cause, no rank's finding (as live)
            continue
        ranks = f"{unit}{'s' if len(entry.ranks) > 1 else ''} {', '.join(map(str, entry.ranks))}"
        lines += [f"{ranks}: {line}" for line in _broken((entry,), _UNMEASURED, None, on_findings)]
    for rank in result.ranks:
        lines += [
            f"{unit} {rank.rank}: {line}"
            for line in _broken((), rank.utilization, rank.syncs_per_step, on_figures)
        ]
    return lines


#: No figures to judge (a stored job's findings are judged apart from its ranks' figures).
_UNMEASURED = Utilization(
    of=None, window_ns=None, busy_share=None, compute_share=None, communication_share=None,
    copy_share=None, idle_share=None,
)  # fmt: skip


def broken_job_diff(comparison: JobComparison, after: JobResult, budgets: Budgets) -> list[str]:
    """The after job's budgets (:func:`broken_job`), and its median step time's growth against
    ``--max-regression``."""
    lines = broken_job(after, budgets)
    if budgets.max_regression is not None:
        lines += _regression(comparison.metric("step_time"), budgets.max_regression)
    return lines
