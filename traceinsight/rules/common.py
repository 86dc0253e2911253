"""What every rule needs: the saving of a fix from the replay, its severity, where it happens, how
often, in plain words."""

from __future__ import annotations

from traceinsight.analysis import Analysis
from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.replay import Fix
from traceinsight.analysis.results import SyncHotspot, share_of
from traceinsight.analysis.sources import CALL, DEF, ENTRY, LIBRARY, RECORDING_START, Located
from traceinsight.analysis.usage import Usage
from traceinsight.formatting import format_duration, format_share, source_label, source_place
from traceinsight.load import RunProfile
from traceinsight.model import Model
from traceinsight.rules.findings import Advice, Finding, Severity


class Saving(Model, frozen=True):
    """What a fix gives back: in all, per step, and as a share of the step (or window)."""

    total_ns: int
    per_step_ns: int | None
    share: float | None
    #: The replay's figure when it was above what the fix can free (the GPU idle the host caused,
    #: :func:`freeable_ns`) and cut to it; None when it was not cut.
    replayed_ns: int | None = None

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


def measured_ns(analysis: Analysis) -> int:
    """The time savings are measured on, all steady steps together: the replayed steady windows
    (the later of the host's and the GPU's end of each, on the GPU without steps) where there is GPU
    work to replay, else the steady steps' host windows summed, else the steady window."""
    if analysis.replay.available:
        replayed = analysis.replay.step_time_ns()
        if replayed > 0:
            return replayed
    steps = analysis.steady.steady_steps
    if steps:
        return sum(step.duration_ns for step in steps)
    return analysis.reference_ns


#: Idle a fix on the host cannot free: the GPU waited on another stream, an event or a graph node
#: (the work was queued), on another GPU, or inside a collective for the other ranks.
NOT_HOST_CAUSED = frozenset(
    {CauseKind.QUEUED, CauseKind.OTHER_GPU, CauseKind.COMMUNICATION, CauseKind.WAITING}
)


def host_caused_idle_ns(analysis: Analysis) -> int:
    """The GPU idle in the steady state that the host caused, on the device with the most of it:
    every idle cause but :data:`NOT_HOST_CAUSED`. A fix on the host can give back at most this."""
    return max(
        (sum(ns for kind, ns in usage.idle if kind not in NOT_HOST_CAUSED) for usage in analysis.usage),
        default=0,
    )


def freeable_ns(analysis: Analysis, fix: Fix) -> int | None:
    """The most ``fix`` can give back: the GPU idle the host caused, plus the GPU time of the work
    the fix makes faster or moves off its stream. None where no GPU time was measured (a trace
    without GPU work: the host is the whole step)."""
    if not analysis.usage or not any(usage.window_ns for usage in analysis.usage):
        return None
    changed = fix.side_stream | frozenset(c for c, _ in fix.durations)
    if fix.faster and fix.speedup != 1:
        changed |= fix.faster
    return host_caused_idle_ns(analysis) + analysis.replay.gpu_ns(changed)


def saving_of(analysis: Analysis, fix: Fix) -> Saving:
    """Replay the steady state with ``fix``: the change in step time, never more than the fix can
    free (:func:`freeable_ns`): the replay keeps the waits between streams it saw, but a fix that
    lets the host launch earlier can only remove idle the host caused."""
    total = analysis.replay.saving_ns(fix)
    cap = freeable_ns(analysis, fix)
    if cap is not None and total > cap:
        cut = saving_from_total(analysis, cap)
        return Saving(cut.total_ns, cut.per_step_ns, cut.share, replayed_ns=total)
    return saving_from_total(analysis, total)


def saving_from_total(analysis: Analysis, total: int, window_ns: int | None = None) -> Saving:
    """``total`` ns over the steady state as a saving: per steady step (the total divided by the
    steps, never a total beside a median) and as a share of ``window_ns``, the time it was measured
    on (by default :func:`measured_ns`; a device's :class:`Usage` window for idle by cause). A
    saving is never more than the window it was measured on: the rules measure it so, and a total
    above it is cut to it here."""
    window = measured_ns(analysis) if window_ns is None else window_ns
    total = max(0, min(total, window)) if window > 0 else max(0, total)
    steps = len(analysis.steady.steady_steps)
    per_step = round(total / steps) if steps else None
    return Saving(total, per_step, total / window if window > 0 else None)


def in_saving_unit(analysis: Analysis, ns: int) -> str:
    """``ns`` of the steady state as the saving reads: ``1.2 ms per step (7% of the step)``, or
    ``3.4 ms (2% of the time analyzed)`` without steps (for evidence beside a saving)."""
    return saving_from_total(analysis, ns).words()


def per_step(analysis: Analysis, ns: int) -> str:
    """``ns`` of the steady state per steady step (``1.2 ms per step``), or in all without steps."""
    steps = len(analysis.steady.steady_steps)
    return f"{format_duration(round(ns / steps))} per step" if steps else format_duration(ns)


def beyond(saving_ns: int, idle_ns: int) -> int | None:
    """The part of a replayed saving beyond the idle a card shows beside it (the gap classification's
    idle of its cause), when that part is a tenth of the saving or more; else None. The replay also
    removes idle the classification gives to other causes: work the host, delayed by the fixed
    wait, launched late later on."""
    extra = saving_ns - idle_ns
    return extra if extra > 0 and extra >= saving_ns / 10 else None


def severity(analysis: Analysis, saving: Saving) -> Severity:
    """high at ``high_severity_share`` of the step (or window), medium at a third of it, else low."""
    high = analysis.thresholds.high_severity_share
    share = saving.share or 0.0
    if share >= high:
        return Severity.HIGH
    if share >= high / 3:
        return Severity.MEDIUM
    return Severity.LOW


def where(
    source: str | None,
    source_kind: str | None,
    line_kind: str | None = CALL,
    function: str | None = None,
) -> str | None:
    """ "train.py:52", "vllm/x.py:88 (library code)", or for a line that is not the call's,
    "`log_metrics` (defined at train.py:4)" (:func:`~traceinsight.formatting.source_label`); None
    without a line. Without ``line_kind`` the line is taken as the call's."""
    if source is None:
        return None
    return source_label(source, source_kind, line_kind, function)


def place(item: Located) -> str | None:
    """Where ``item`` happens, for a title: "at train.py:18", or "in `log_metrics` (defined at
    train.py:4)" when the line is not the call's (never "at" a line that is not); None without a
    line."""
    if item.source is None:
        return None
    return source_place(item.source, item.source_kind, item.source_line_kind, item.source_function)


def exact_line(function: str) -> str:
    """How to get the call's own line, for a line in ``function`` that is not it."""
    return (
        "to name the call's own line, profile with `traceinsight run` (it records each call's line), "
        f"or look in `{function}` for the call the title names"
    )


def source_evidence(
    source: str | None,
    source_kind: str | None,
    line_kind: str | None = CALL,
    function: str | None = None,
    *,
    run: RunProfile | None = None,
) -> str:
    """The evidence line for the source: the line, what kind of line it is when it is not the
    call's, and how to get the call's line; without one, how to get it (for a trace of
    ``traceinsight run``, with run's own options: ``run``)."""
    if source is None:
        return f"not recorded ({no_line_hint(run)})"
    library = (
        "library code, the innermost frame outside torch; if this package is yours, pass --user-code PACKAGE"
    )
    if line_kind == CALL or function is None:
        return f"{source}: {library}" if source_kind == LIBRARY else source
    if line_kind == DEF:
        what = (
            f"in `{function}`, defined at {source}: torch's stack names a function by its `def` "
            "line, not by the line of the call"
        )
    elif line_kind == RECORDING_START:
        what = (
            f"in `{function}`, on {source} when recording began: torch's stack keeps that line for a "
            "function already running, not the line of the call"
        )
    elif line_kind == ENTRY:
        what = (
            f"in `{function}`, entered at {source} or a later line of that file: torch's stack names a "
            "frame by its `def` line, but a generator resumed by the line of its `yield`, and one caller "
            f"entered `{function}` at several lines, so they are one generator or several functions "
            "of that name; none is known to be where it is defined, nor the line of the call"
        )
    else:
        what = (
            f"in `{function}`, {source}: this trace's frames do not say whether that is the call's "
            "line or the function's first line"
        )
    return f"{what}{'; ' + library if source_kind == LIBRARY else ''}; {exact_line(function)}"


def located_evidence(item: Located | None, run: RunProfile | None = None) -> str:
    """:func:`source_evidence` for a result that names a source line (or for none)."""
    if item is None:
        return source_evidence(None, None, run=run)
    return source_evidence(
        item.source, item.source_kind, item.source_line_kind, item.source_function, run=run
    )


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


def how_often(analysis: Analysis, count: int, steps_with: int | None = None) -> str:
    """``every step``, ``3× per step``, ``in 2 of 5 steps`` (``in 1 of 5 steps, 3 times``) or
    ``5 times`` (steady state). ``steps_with``: the steady steps it happens in (None: unknown,
    taken as ``count``)."""
    steps = len(analysis.steady.steady_steps)
    run = analysis.meta.recorded_by_run
    if not steps or (steps == 1 and run is not None and run.last_step_cut):
        # One step the memory budget cut short: "11× per step" was counted over part of one.
        cut = " in the part of a step recorded" if steps else ""
        return f"{count} time{'s' if count != 1 else ''}{cut}"
    per_step = count / steps
    if steps_with is not None and steps_with < steps:
        return f"in {steps_with} of {steps} steps" + (f", {count} times" if count != steps_with else "")
    if count == steps:
        return "every step"
    if per_step > 1:
        return f"{per_step:.3g}× per step"
    return f"in {count} of {steps} steps"


def hotspot_place(hotspot: SyncHotspot) -> str:
    """Where a sync hot spot happens, for a title: the line (:func:`place`), else the operator."""
    line = place(hotspot)
    if line is not None:
        return line
    if hotspot.op is not None:
        return f"in {hotspot.op}"
    return ""


def repeats(analysis: Analysis, count: int, steps_with: int | None = None) -> bool:
    """True when something happens in most steady steps, more than half of them (or, without
    steps, often enough to be a loop). Every step was asked before: a sync in 4 of 5 steps (a
    step's ``.item()`` that a recording start or the window's end cut off) got no card; it is
    counted as it is (:func:`how_often`: ``in 4 of 5 steps``). The steps are counted, not the
    occurrences (``steps_with``; None: a stored result without it, its count taken): three
    syncs in one of five steps are not in most steps."""
    steps = len(analysis.steady.steady_steps)
    if steps:
        present = count if steps_with is None else steps_with
        return 2 * present > steps and (count >= 2 or analysis.steps_marked)
    return count >= analysis.thresholds.sync_min_repeats


def make_finding(
    analysis: Analysis,
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
    located: Located | None = None,
    framework_call: str | None = None,
) -> Finding:
    """A finding whose severity and saving fields come from ``saving``; its source fields from
    ``located`` when given (else ``source``, ``source_kind``, taken as a call's line). Its rule id
    is the registry's (:func:`traceinsight.rules.rule`), set on every finding a rule yields."""
    if saving.replayed_ns is not None:
        bound = (
            "at most the GPU idle the host caused in the steady state (the rest waited on other "
            f"streams, events or ranks; the replay alone said {format_duration(saving.replayed_ns)})"
        )
        note = f"{note}; {bound}" if note else bound
    line_kind: str | None = CALL if source is not None else None
    function = None
    if located is not None:
        source, source_kind = located.source, located.source_kind
        line_kind, function = located.source_line_kind, located.source_function
    return Finding(
        rule="",  # set by the rule's registration
        severity=severity(analysis, saving),
        title=title,
        evidence=tuple(dict(evidence).items()),  # one row per label, as the JSON's object keeps
        savings_total_ns=saving.total_ns,
        advice=advice,
        why=why,
        op=op,
        source=source,
        device=device,
        savings_per_step_ns=saving.per_step_ns,
        saving_share=share_of(saving.share),
        source_kind=source_kind,
        saving_note=note,
        source_line_kind=line_kind,
        source_function=function,
        framework_call=framework_call,
    )
