"""What a rule produces: a finding with evidence, an estimated saving and advice."""

from __future__ import annotations

from traceinsight.analysis.results import CODE, DURATION, ID
from traceinsight.compat import StrEnum
from traceinsight.model import Model, field, replace
from traceinsight.shown import html_of

__all__ = ["SEVERITIES", "Advice", "Finding", "Severity"]


class Severity(StrEnum):
    """How much a finding costs, by its saving's share of the step time."""

    HIGH = "high"
    MEDIUM = "medium"
    LOW = "low"


#: Severities, worst first.
SEVERITIES = tuple(severity.value for severity in Severity)


class Advice(Model, frozen=True, kw_only=True):
    """What to change, with a before/after snippet."""

    summary: str
    before: str = field(metadata=CODE)
    after: str = field(metadata=CODE)


class Finding(Model, frozen=True, kw_only=True):
    """One problem found in the trace, and the one fix for it (its fields are the JSON's keys, in
    order: see :mod:`traceinsight.results.trace`).

    ``rule`` is the stable id its rule was registered under (``sync-in-loop``, ``pageable-memcpy``
    ...: :func:`traceinsight.rules.rule` sets it on every finding the rule yields); ``evidence`` holds the
    numbers behind the claim as (label, value) pairs, one per label; ``savings_per_step_ns`` is what
    the fix gives back in each steady step, ``savings_total_ns`` over all of them, from the step replay (:mod:`traceinsight.analysis.replay`),
    or for ``low-gpu-utilization`` the idle that no other finding explains (an upper bound).
    """

    rule: str = field(metadata=ID)
    severity: Severity
    title: str
    #: (label, value) pairs; written as an object.
    evidence: tuple[tuple[str, str], ...] = field(default=(), metadata={"pairs": True})
    #: The saving over the whole steady state (every steady step together): JSON ``savings_us``.
    #: What outputs show is :attr:`savings_per_step_ns`.
    savings_total_ns: int = field(default=0, metadata={"key": "savings_us", **DURATION})
    advice: Advice
    #: Why it costs time: the host/GPU timeline in one sentence.
    why: str
    op: str | None = None
    source: str | None = None
    device: int | None = None
    #: Below the noise floor: listed among the minor findings, not as a card.
    minor: bool = False
    #: The saving per steady step, the figure every output shows (None for a trace without steps:
    #: then :attr:`savings_total_ns`, over the time analyzed, is the figure).
    savings_per_step_ns: int | None = field(default=None, metadata=DURATION)
    #: The saving's share of the step time (of the steady window without steps), 4 decimals.
    saving_share: float | None = None
    #: What the saving assumes, or why it is small, in plain words.
    saving_note: str | None = None
    #: False when the trace cannot tell the saving (a sync waiting to happen on a GPU the run did
    #: not have): such a finding is never minor, and its saving is not shown as a number.
    saving_known: bool = True
    #: ``user`` or ``library`` for ``source`` (see :func:`traceinsight.analysis.sources.source_at`).
    source_kind: str | None = None
    #: What ``source``'s line is: ``call`` (the call's line), ``def`` (the first line of
    #: ``source_function``: torch's stack names a function so), ``recording-start`` (the line
    #: ``source_function`` was on when recording began), None when the trace does not say (see
    #: :mod:`traceinsight.analysis.sources`).
    source_line_kind: str | None = None
    #: The function ``source`` is in (``log_metrics``), when frames name it.
    source_function: str | None = None
    #: Framework code the line calls that reads GPU values on the host by design
    #: (``torch.optim.LBFGS``: :data:`traceinsight.load.taxonomy.DESIGNED_SYNCS`), when the calls
    #: happen inside it.
    framework_call: str | None = None

    def with_(self, **changes: object) -> Finding:
        """A copy with ``changes`` (:func:`traceinsight.model.replace`)."""
        return replace(self, **changes)

    def _repr_html_(self) -> str | None:
        return html_of(self)
