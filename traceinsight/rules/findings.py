"""What a rule produces: a finding with evidence, an estimated saving and advice."""

from __future__ import annotations

from dataclasses import dataclass

SEVERITIES = ("high", "medium", "low")


@dataclass(frozen=True, slots=True)
class Advice:
    """What to change, with a before/after snippet."""

    summary: str
    before: str
    after: str


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem found in the trace.

    ``rule`` is a stable id (``sync-in-loop``, ``pageable-memcpy`` ...); ``evidence`` holds the
    numbers behind the claim as (label, value) pairs; ``savings_ns`` is an estimate of the GPU time
    the fix would give back (an upper bound; savings of different findings can overlap).
    """

    rule: str
    severity: str
    title: str
    evidence: tuple[tuple[str, str], ...]
    savings_ns: int
    advice: Advice
    #: Why it costs time: the host/GPU timeline in one sentence.
    why: str
    op: str | None = None
    source: str | None = None
    device: int | None = None
