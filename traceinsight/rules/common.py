"""What every rule needs: the saving of a fix from the replay, its severity, where it happens, how
often, in plain words."""

from __future__ import annotations

from dataclasses import dataclass

from traceinsight.analysis import Analysis
from traceinsight.analysis.replay import Fix
from traceinsight.analysis.results import SyncHotspot
from traceinsight.analysis.sources import LIBRARY
from traceinsight.analysis.usage import Usage
from traceinsight.formatting import format_duration, format_share
from traceinsight.load import RunProfile
from traceinsight.rules.findings import Advice, Finding, Severity


@dataclass(frozen=True, slots=True)
class Saving:
    """What a fix gives back: in all, per step, and as a share of the step (or window)."""

    total_ns: int
    per_step_ns: int | None
    share: float | None

    def words(self) -> str:
        """``1.2 ms per step (7% of the step)`` or ``3.4 ms over the 155.4 ms analyzed (2%)``."""
        share = f" ({format_share(self.share)} of the step)" if self.share is not None else ""
        if self.per_step_ns is not None:
            return f"{format_duration(self.per_step_ns)} per step{share}"
        if self.share is not None:
            return f"{format_duration(self.total_ns)} ({format_share(self.share)} of the time analyzed)"
        return format_duration(self.total_ns)


def usage_amount(usage: Usage, ns: int) -> str:
    """``ns`` of ``usage``'s steady time in words: ``1.2 ms per step (48% of each step)`` where
    there are steps, else ``3.4 ms (7% of the time)``; never a total beside a share of each step."""
    per_step = usage.per_step(ns)
    amount = format_duration(ns) if per_step is None else f"{format_duration(per_step)} per step"
    return f"{amount} ({format_share(usage.share(ns))} of {usage.of_what})"


def reference(analysis: Analysis) -> tuple[int | None, int]:
    """(median steady step or None, the time shares are taken of)."""
    return analysis.steady.step_ns, analysis.reference_ns


def saving_of(analysis: Analysis, fix: Fix) -> Saving:
    """Replay the steady state with ``fix``: the change in step time."""
    total = analysis.replay.saving_ns(fix)
    return saving_from_total(analysis, total)


def saving_from_total(analysis: Analysis, total: int) -> Saving:
    """A saving over the steady windows, expressed per step and as a share."""
    step, base = reference(analysis)
    steps = len(analysis.steady.steady_steps)
    per_step = round(total / steps) if step is not None and steps else None
    share_of = per_step if per_step is not None else total
    return Saving(total, per_step, share_of / base if base else None)


def severity(analysis: Analysis, saving: Saving) -> str:
    """high at ``high_severity_share`` of the step (or window), medium at a third of it, else low."""
    high = analysis.thresholds.high_severity_share
    share = saving.share or 0.0
    if share >= high:
        return Severity.HIGH.value
    if share >= high / 3:
        return Severity.MEDIUM.value
    return Severity.LOW.value


def where(source: str | None, source_kind: str | None) -> str | None:
    """``train.py:52``, or ``vllm/x.py:88 (library code)``; None without a line."""
    if source is None:
        return None
    return f"{source} (library code)" if source_kind == LIBRARY else source


def source_evidence(source: str | None, source_kind: str | None, run: RunProfile | None = None) -> str:
    """The evidence line for the source; without one, how to get it (for a trace of
    ``traceinsight run``, with run's own options)."""
    if source is None:
        return f"not recorded ({no_line_hint(run)})"
    if source_kind == LIBRARY:
        return (
            f"{source}: library code, the innermost frame outside torch; if this package is yours, "
            "pass --user-code PACKAGE"
        )
    return source


def no_line_hint(run: RunProfile | None) -> str:
    """How to get the source line of a finding that has none."""
    if run is None:
        return "profile with with_stack=True to name the line"
    if run.step_marks == "none":
        return (
            "no step was marked, so the run was recorded without Python frames; call "
            "traceinsight.step() at the end of each iteration of your loop"
        )
    if run.stacks == "none":
        return "recorded with --stacks none; run with --stacks user to name the line"
    return "no frame of your code was running around it"


def how_often(analysis: Analysis, count: int) -> str:
    """``every step``, ``3× per step``, ``in 2 of 5 steps`` or ``5 times`` (steady state)."""
    steps = len(analysis.steady.steady_steps)
    if not steps:
        return f"{count} time{'s' if count != 1 else ''}"
    per_step = count / steps
    if count == steps:
        return "every step"
    if per_step > 1:
        return f"{per_step:.3g}× per step"
    return f"in {count} of {steps} steps"


def hotspot_place(hotspot: SyncHotspot) -> str:
    """Where a sync hot spot happens, for a title: the line, else the operator."""
    place = where(hotspot.source, hotspot.source_kind)
    if place is not None:
        return f"at {place}"
    if hotspot.op is not None:
        return f"in {hotspot.op}"
    return ""


def repeats(analysis: Analysis, count: int) -> bool:
    """True when something happens every steady step (or, without steps, often enough to be a loop)."""
    steps = len(analysis.steady.steady_steps)
    if steps:
        return count >= steps and (count >= 2 or analysis.steps_marked)
    return count >= analysis.thresholds.sync_min_repeats


def make_finding(
    analysis: Analysis,
    rule: str,
    saving: Saving,
    *,
    title: str,
    evidence: list[tuple[str, str]] | tuple[tuple[str, str], ...],
    advice: Advice,
    why: str,
    note: str | None = None,
    source: str | None = None,
    source_kind: str | None = None,
    op: str | None = None,
    device: int | None = None,
) -> Finding:
    """A finding whose severity and saving fields come from ``saving``."""
    return Finding(
        rule=rule,
        severity=severity(analysis, saving),
        title=title,
        evidence=tuple(evidence),
        savings_ns=saving.total_ns,
        advice=advice,
        why=why,
        op=op,
        source=source,
        device=device,
        saving_per_step_ns=saving.per_step_ns,
        saving_share=saving.share,
        source_kind=source_kind,
        saving_note=note,
    )
