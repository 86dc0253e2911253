"""One report from the ranks' results: collectives matched across ranks, each split into waiting
and transfer, stragglers by the waits they cause, and their own causes first.

Collectives are matched by process group and sequence number where the traces say them (Kineto
writes ``Process Group Name`` and ``Seq`` on communication kernels since 2026): the collective with
sequence number n of a group on one rank is the one with n in that group on every rank that ran it,
whatever order the groups' collectives ran in. Otherwise by order: the n-th collective of each kind
on one rank is the n-th of that kind on every other rank (kind: the NCCL/RCCL kernel's collective,
``AllReduce``, ``SendRecv``…, or the host ``c10d::`` operator without GPU work). A kind is matched by
group and sequence number only when every collective of it on every rank carries them.

**Clocks.** Every rank leaves a collective at about the same moment, so the ranks' clocks are
aligned on the collectives' ends: a rank's offset is the median over its matched collectives of
(its end − the collective's median end over ranks). A rank is aligned when every one of its ends
is then within :data:`ALIGN_TOLERANCE_NS` (200 µs) of the median end; otherwise (its collectives
do not end with the others': traces of different steps, host ``c10d`` operators) its own clock is
kept and said so. The residual stated is the largest such distance over the aligned ranks.

For each matched collective c and rank r, on the aligned clock:

- ``arrival(r, c)`` is its kernel's start; ``last(c)`` the latest arrival; the last rank is the
  one arriving then (the lowest rank on a tie);
- ``wait(r, c) = last(c) − arrival(r, c)``, within the kernel (never past its end), and
  ``transfer(r, c)`` = its kernel's end − ``last(c)`` (the rest of the kernel): the wire time once
  everyone is there. Each is also counted where the kernel ran with no compute under it (the
  exposed wait and the exposed transfer);
- ``lateness(r, c) = arrival(r, c) − median over ranks of arrival(·, c)`` (the lower middle);
- the last rank *caused* the others' waits in c: summed (``caused``), and their mean per other
  member (``caused_per_other``: what each other rank saves if it keeps pace).

Per rank and steady step (the step whose GPU window holds the collective's start on that rank):
the wait, the transfer, and the rank it waited for longest.

**Stragglers.** A rank is a straggler when (a) the waits it causes are a noticeable share of the
others' step: its ``caused_per_other`` less its own wait, per steady step, is at least
:data:`WAIT_SHARE` (5 %) of the job's median step (one large lateness in one collective counts as
much as a small one in each; subtracting its own wait keeps a rank that is late only because it
waited for another, as in a pipeline, from being blamed), or (b) its median lateness, its step
time, or its *own time* (step time less its collective waits per step) is above the job's median
by more than ``max(floor, 4 × 1.4826 × MAD)``: MAD the median absolute deviation over ranks,
floor 5 % of the median step time (200 µs for lateness without steps). A rank's step time is the
spacing of when its steps' work was done, host and GPU (:mod:`traceinsight.analysis.steady`).
Its cause is its own largest excess over the job's median rank, per step: the idle cause of its
own (DataLoader, a host sync, a blocking copy, host work, launching, a pause with nothing
recorded) whose time exceeds the median the most, or slower GPU work when compute time grew more
than any of them. Time spent waiting for another rank is a symptom the straggler shares with the
ranks that wait for it, never its cause. Its top finding is its own finding of that cause (the
rules of :data:`CAUSE_RULES`) where it has one.

**Findings.** Each straggler's top finding leads the job's findings, with the job-level saving
(``caused_per_other`` per step). Where collectives are split, ``exposed-communication`` counts the
exposed transfer only: each rank's saving is scaled by its exposed transfer's share of its exposed
communication, and a rank stays only while that transfer is still at least the rule's share of its
steady window; the wait is named as waiting for its rank.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import median_low
from typing import Final

import msgspec

from traceinsight.analysis.causes import CauseKind
from traceinsight.errors import TraceFormatError
from traceinsight.formatting import format_duration
from traceinsight.model import replace
from traceinsight.results.job import (
    ALIGN_TOLERANCE_NS,
    ARRIVALS_SHOWN,
    Arrival,
    Collective,
    FindingBrief,
    JobClock,
    JobCollectives,
    JobFinding,
    JobInfo,
    JobResult,
    Rank,
    RankArrival,
    RankCollectives,
    RankResult,
    RankStep,
    Straggler,
)
from traceinsight.rules.findings import SEVERITIES, Severity
from traceinsight.thresholds import Thresholds

__all__ = ["ALIGN_TOLERANCE_NS", "ARRIVALS_SHOWN", "BLAMED_CAUSES", "CAUSE_RULES", "WAIT_SHARE", "combine"]

#: Idle causes a straggler's time can be blamed on: what its own host did while its GPU waited.
#: Not ``communication`` (its host waiting in a collective for the others: a symptom the ranks that
#: wait for a straggler share), nor ``queued`` (the GPU waited on a dependency), nor the step's
#: edges or time outside the steady state.
BLAMED_CAUSES: Final[tuple[CauseKind, ...]] = (
    CauseKind.DATALOADER,
    CauseKind.SYNC,
    CauseKind.COPY,
    CauseKind.LAUNCH,
    CauseKind.HOST_OP,
    CauseKind.ALLOCATOR,
    CauseKind.UNTRACED,
)
_MAD_SCALE: Final = 1.4826
_MAD_TIMES: Final = 4.0
_STEP_FLOOR_SHARE: Final = 0.05
_LATE_FLOOR_NS: Final = 200_000
_ALIGN_ROUNDS: Final = 50
#: A straggler by the waits it causes: the others' mean wait for it, less its own wait, per step,
#: at least this share of the job's median step.
WAIT_SHARE: Final = 0.05
#: The rules whose finding is a cause's own (a straggler's top finding, where it has one).
CAUSE_RULES: Final[dict[str, tuple[str, ...]]] = {
    CauseKind.DATALOADER.value: ("dataloader-stall",),
    CauseKind.SYNC.value: ("sync-in-forward", "sync-in-loop", "latent-sync"),
    CauseKind.COPY.value: ("pageable-memcpy", "blocking-h2d"),
    CauseKind.LAUNCH.value: ("launch-bound",),
    CauseKind.HOST_OP.value: ("host-preprocessing",),
    CauseKind.UNTRACED.value: ("low-gpu-utilization",),
}


def _check_ranks(results: Sequence[RankResult]) -> None:
    seen: dict[int, str] = {}
    for result in results:
        if result.rank in seen:
            raise TraceFormatError(
                f"two traces say they are rank {result.rank}: {seen[result.rank]} and {result.path} "
                f"(rank taken from {result.entry.rank_from}); give each rank's trace once"
            )
        seen[result.rank] = result.path


def _keyed(ranks: Sequence[RankResult], kind: str) -> bool:
    """Whether every collective of ``kind`` on every rank carries its process group and sequence."""
    return all(
        collective.process_group is not None and collective.seq is not None
        for result in ranks
        for collective in result.collectives
        if collective.kind == kind
    )


Matched = list[tuple[str, dict[int, Collective]]]


def _match_keyed(ranks: Sequence[RankResult], kind: str) -> Matched:
    """Collectives of ``kind`` matched by (process group, sequence number, occurrence): each one
    among the ranks that ran it (a group's collective involves its members only), two ranks up."""
    by_key: dict[tuple[str, int, int], dict[int, Collective]] = defaultdict(dict)
    for result in ranks:
        seen: Counter[tuple[str, int]] = Counter()
        for collective in result.collectives:
            if collective.kind != kind or collective.process_group is None or collective.seq is None:
                continue
            key = (collective.process_group, collective.seq)
            by_key[(*key, seen[key])][result.rank] = collective
            seen[key] += 1
    return [(kind, starts) for starts in by_key.values() if len(starts) > 1]


def _match(ranks: Sequence[RankResult]) -> tuple[Matched, list[str]]:
    """Matched collectives: (kind, {rank: collective}) in order, and warnings on counts that differ.

    By process group and sequence number where every collective of a kind carries them, else by
    order (see the module doc)."""
    by_rank: dict[int, dict[str, list[Collective]]] = {}
    for result in ranks:
        kinds: dict[str, list[Collective]] = defaultdict(list)
        for collective in result.collectives:
            kinds[collective.kind].append(collective)
        by_rank[result.rank] = kinds
    warnings: list[str] = []
    every_kind = sorted({kind for kinds in by_rank.values() for kind in kinds})
    matched: Matched = []
    for kind in every_kind:
        if _keyed(ranks, kind):
            matched += _match_keyed(ranks, kind)
            continue
        counts = {rank: len(kinds.get(kind, [])) for rank, kinds in by_rank.items()}
        low, high = min(counts.values()), max(counts.values())
        if low != high:
            fewest = min(counts, key=lambda rank: (counts[rank], rank))
            warnings.append(
                f"ranks ran {low} to {high} {kind} collectives (rank {fewest}: {low}); the first {low} "
                "of each rank were matched: profile the same steps on every rank"
            )
        for index in range(low):
            matched.append((kind, {rank: kinds[kind][index] for rank, kinds in by_rank.items()}))
    matched.sort(key=lambda item: (median_low([c.start_ns for c in item[1].values()]), item[0]))
    return matched, warnings


def _reference_end(ends: list[int]) -> int:
    """Where a collective's members left it, by the ends on their aligned clocks: the median (the
    lower middle), or the mean of two."""
    return (ends[0] + ends[1]) // 2 if len(ends) == 2 else median_low(ends)


def _align(matched: Matched) -> tuple[dict[int, int], dict[int, bool], int | None]:
    """Each rank's clock offset on the collectives' ends, whether it was aligned, and the residual
    (see the module doc). Offsets are refined a few rounds (pairs, as a pipeline's send/recv,
    pass a shift along a chain of ranks), until none moves by 100 ns."""
    offsets: dict[int, int] = defaultdict(int)
    deviations: dict[int, list[int]] = defaultdict(list)
    for _ in range(_ALIGN_ROUNDS):
        deviations = defaultdict(list)
        for _, members in matched:
            reference = _reference_end([c.end_ns - offsets[rank] for rank, c in members.items()])
            for rank, collective in members.items():
                deviations[rank].append(collective.end_ns - offsets[rank] - reference)
        moved = 0
        for rank, values in deviations.items():
            shift = median_low(values)
            offsets[rank] += shift
            moved = max(moved, abs(shift))
        if moved < 100:
            break
    aligned: dict[int, bool] = {}
    residual: int | None = None
    for rank, values in deviations.items():
        shift = median_low(values)
        spread = max(abs(value - shift) for value in values)
        aligned[rank] = spread <= ALIGN_TOLERANCE_NS
        if aligned[rank]:
            residual = max(residual or 0, spread)
        else:
            offsets[rank] = 0
    return dict(offsets), aligned, residual


def _exposed_within(collective: Collective, low: int, high: int, offset: int) -> int:
    """How much of ``[low, high)`` (aligned clock) the collective ran with no compute under it."""
    stretches = collective.exposed_ns
    total = 0
    for index in range(0, len(stretches) - 1, 2):
        total += max(0, min(stretches[index + 1] - offset, high) - max(stretches[index] - offset, low))
    return total


class _Tally(msgspec.Struct):
    """One rank's sums while the collectives are walked."""

    late: list[int] = msgspec.field(default_factory=list)
    waited: int = 0
    caused: int = 0
    caused_per_other: float = 0.0
    wait: int = 0
    transfer: int = 0
    exposed_wait: int = 0
    exposed_transfer: int = 0
    waited_for: Counter[int] = msgspec.field(default_factory=Counter)
    steps: dict[int, list[int]] = msgspec.field(default_factory=dict)  # step → [wait, transfer]
    step_waited_for: dict[int, Counter[int]] = msgspec.field(default_factory=lambda: defaultdict(Counter))


def _step_of(result: RankResult, begins: list[int], at: int) -> int | None:
    """The steady step whose GPU window holds ``at`` (the rank's own clock), or None."""
    index = bisect_right(begins, at) - 1
    if index < 0:
        return None
    step, _, done = result.steps_ns[index]
    return step if at <= done else None


Timings = dict[int, RankCollectives]


def _timings(
    ranks: Sequence[RankResult], matched: Matched
) -> tuple[Timings, tuple[Arrival, ...], int, int | None]:
    """Each rank in the matched collectives (by rank), the first collectives' arrivals, and the
    clocks' alignment (ranks aligned, residual): see the module doc."""
    offsets, aligned, residual = _align(matched)
    by_rank = {result.rank: result for result in ranks}
    begins = {result.rank: [begin for _, begin, _ in result.steps_ns] for result in ranks}
    tallies = {result.rank: _Tally() for result in ranks}
    for result in ranks:  # every steady step has its row, with or without collectives in it
        for number, _, _ in result.steps_ns:
            tallies[result.rank].steps.setdefault(number, [0, 0])
    arrivals: list[Arrival] = []
    for kind, members in matched:
        starts = {rank: collective.start_ns - offsets.get(rank, 0) for rank, collective in members.items()}
        middle = median_low(starts.values())
        last_rank = max(starts, key=lambda rank: (starts[rank], -rank))
        last = starts[last_rank]
        others = len(members) - 1
        last_step = _step_of(by_rank[last_rank], begins[last_rank], members[last_rank].start_ns)
        for rank, collective in members.items():
            tally = tallies[rank]
            offset = offsets.get(rank, 0)
            start, end = starts[rank], collective.end_ns - offset
            tally.late.append(start - middle)
            tally.waited += last - start
            cut = min(max(last, start), end)
            wait = cut - start
            if rank != last_rank:
                tallies[last_rank].caused += last - start
                if last_step is not None:
                    tallies[last_rank].caused_per_other += wait / others
            step = _step_of(by_rank[rank], begins[rank], collective.start_ns)
            if step is None:
                continue
            tally.wait += wait
            tally.transfer += end - cut
            tally.exposed_wait += _exposed_within(collective, start, cut, offset)
            tally.exposed_transfer += _exposed_within(collective, cut, end, offset)
            split = tally.steps.setdefault(step, [0, 0])
            split[0] += wait
            split[1] += end - cut
            if wait > 0 and rank != last_rank:
                tally.waited_for[last_rank] += wait
                tally.step_waited_for[step][last_rank] += wait
        if len(arrivals) < ARRIVALS_SHOWN:
            first = min(starts.values())
            arrivals.append(
                Arrival(
                    kind=kind,
                    step=last_step,
                    last_rank=last_rank,
                    arrivals=tuple(
                        RankArrival(rank=rank, after_first_ns=starts[rank] - first) for rank in sorted(starts)
                    ),
                )
            )
    timings: Timings = {}
    for rank, tally in sorted(tallies.items()):
        top_rank, top_ns = _most(tally.waited_for)
        timings[rank] = RankCollectives(
            source=by_rank[rank].collectives_from,
            matched=len(tally.late),
            late_median_ns=median_low(tally.late) if tally.late else 0,
            late_max_ns=max(tally.late, default=0),
            waited_ns=tally.waited,
            others_waited_ns=tally.caused,
            clock_offset_ns=offsets.get(rank, 0),
            clock_aligned=aligned.get(rank, False),
            wait_ns=tally.wait,
            transfer_ns=tally.transfer,
            exposed_wait_ns=tally.exposed_wait,
            exposed_transfer_ns=tally.exposed_transfer,
            waited_for=top_rank,
            waited_for_ns=top_ns,
            per_step=tuple(
                RankStep(
                    step=step,
                    wait_ns=wait,
                    transfer_ns=transfer,
                    waited_for=_most(tally.step_waited_for.get(step))[0],
                    waited_for_ns=_most(tally.step_waited_for.get(step))[1],
                )
                for step, (wait, transfer) in sorted(tally.steps.items())
            ),
            others_mean_wait_ns=round(tally.caused_per_other),
        )
    return timings, tuple(arrivals), sum(aligned.values()), residual


def _most(counts: Counter[int] | None) -> tuple[int | None, int]:
    """The rank waited for longest and how long (None, 0 when none)."""
    if not counts:
        return None, 0
    rank, ns = max(counts.items(), key=lambda item: (item[1], -item[0]))
    return rank, ns


def _outliers(values: dict[int, int], floor_ns: int) -> dict[int, int]:
    """Ranks whose value is above the median by more than ``max(floor, 4 × 1.4826 × MAD)``: rank → excess over the median."""
    if len(values) < 3:
        return {}
    middle = median_low(values.values())
    spread = median_low(abs(value - middle) for value in values.values())
    bound = max(floor_ns, round(_MAD_TIMES * _MAD_SCALE * spread))
    return {rank: value - middle for rank, value in values.items() if value - middle > bound}


def _idle_per_step(result: RankResult) -> dict[str, int]:
    per_cause = {kind.value: result.per_step(ns) for kind, ns in result.usage.idle}
    per_cause["compute"] = result.per_step(result.usage.compute_ns)
    return per_cause


def _medians(ranks: Sequence[RankResult]) -> dict[str, int]:
    """The job's median rank's time per step of each blamable cause (the lower middle)."""
    splits = [_idle_per_step(rank) for rank in ranks]
    return {
        cause: median_low([split.get(cause, 0) for split in splits])
        for cause in [kind.value for kind in BLAMED_CAUSES] + ["compute"]
    }


def _cause(result: RankResult, medians: dict[str, int]) -> tuple[str | None, int]:
    """The cause whose time per step exceeds the job's median rank (``medians``) the most, and by
    how much."""
    own = _idle_per_step(result)
    best: tuple[str | None, int] = (None, 0)
    for cause, middle in medians.items():
        excess = own.get(cause, 0) - middle
        if excess > best[1]:
            best = (cause, excess)
    return best


def _waits_caused(ranks: Sequence[RankResult], timings: Timings, step_ns: int | None) -> dict[int, str]:
    """Ranks whose waits caused, less their own, are a noticeable share of the step (module doc)."""
    by_rank = {result.rank: result for result in ranks}
    windows = [result.usage.window_ns for result in ranks if result.usage.window_ns]
    medians = _medians(ranks)
    own_cause = {result.rank: _cause(result, medians)[0] is not None for result in ranks}
    pace = step_ns if step_ns else (median_low(windows) if windows else 0)
    found: dict[int, str] = {}
    for rank, timing in timings.items():
        result = by_rank[rank]
        steps = max(1, result.steps)
        net = (timing.others_mean_wait_ns - timing.wait_ns) / steps
        if pace <= 0 or timing.others_mean_wait_ns <= 0 or net < WAIT_SHARE * pace:
            continue
        if not own_cause[rank]:
            continue  # late with nothing of its own: it waited for another (a pipeline's chain)
        per_step = round(timing.others_mean_wait_ns / steps)
        reason = (
            f"the others waited {format_duration(per_step)} per step on average for it in the collectives "
            f"it came last to ({format_duration(timing.others_waited_ns)} summed over the ranks), "
            f"{per_step / pace:.0%} of the {'median step' if step_ns else 'steady window'}"
        )
        if result.steps <= 1:
            reason += f"; {result.steps or 'no'} step recorded: it may be a one-off"
        found[rank] = reason
    return found


def _top_finding(
    result: RankResult, cause: str | None, timing: RankCollectives | None
) -> FindingBrief | None:
    """The rank's top finding in the job's view: its own finding of ``cause`` where it has one,
    else its first that is not minor, ``exposed-communication`` counted by its transfer only."""
    own = [finding for finding in result.findings if finding.rule in CAUSE_RULES.get(cause or "", ())]
    if own:
        return max(own, key=lambda finding: (finding.savings_ns, -result.findings.index(finding)))
    if cause is not None:
        return None  # no finding of its own cause: the cause itself leads (see ``_findings``)
    ratio = _transfer_ratio(timing)
    ranked = [
        (
            finding.savings_ns
            if finding.rule != "exposed-communication"
            else round(finding.savings_ns * ratio),
            -i,
            finding,
        )
        for i, finding in enumerate(result.findings)
        if not finding.minor
    ]
    return max(ranked, key=lambda item: (item[0], item[1]))[2] if ranked else None


def _transfer_ratio(timing: RankCollectives | None) -> float:
    """The exposed transfer's share of the exposed communication in the split collectives (1
    where nothing was split)."""
    if timing is None:
        return 1.0
    exposed = timing.exposed_wait_ns + timing.exposed_transfer_ns
    return timing.exposed_transfer_ns / exposed if exposed else 1.0


def _stragglers(ranks: Sequence[RankResult], timings: Timings, step_ns: int | None) -> tuple[Straggler, ...]:
    floor = round(_STEP_FLOOR_SHARE * step_ns) if step_ns else _LATE_FLOOR_NS
    reasons: dict[int, list[str]] = defaultdict(list)
    for rank, reason in _waits_caused(ranks, timings, step_ns).items():
        reasons[rank].append(reason)
    if any(timing.matched for timing in timings.values()):
        for rank, excess in _outliers(
            {rank: t.late_median_ns for rank, t in timings.items()}, max(floor, _LATE_FLOOR_NS)
        ).items():
            timing = timings[rank]
            reasons[rank].append(
                f"its collectives start {format_duration(timing.late_median_ns)} after the median rank's "
                f"(the median over {timing.matched} collectives; {format_duration(excess)} above the job's "
                "median lateness)"
            )
    stepped = {result.rank: result.step_ns for result in ranks if result.step_ns is not None}
    for rank, excess in _outliers(stepped, floor).items():
        reasons[rank].append(f"its step takes {format_duration(excess)} longer than the median rank's")
    waited = {rank: timing.waited_ns for rank, timing in timings.items()}
    own = {
        result.rank: result.step_ns - result.per_step(waited.get(result.rank, 0))
        for result in ranks
        if result.step_ns is not None
    }
    for rank, excess in _outliers(own, floor).items():
        if not any("step takes" in reason for reason in reasons[rank]):
            reasons[rank].append(
                f"its own time per step (step time less waits in collectives) is {format_duration(excess)} "
                "above the median rank's"
            )
    by_rank = {result.rank: result for result in ranks}
    medians = _medians(ranks)
    found = []
    for rank in sorted(reasons):
        result = by_rank[rank]
        cause, excess = _cause(result, medians)
        split = timings.get(rank)
        top = _top_finding(result, cause, split)
        found.append(
            Straggler(
                rank=rank,
                reasons=tuple(reasons[rank]),
                cause=cause,
                cause_excess_per_step_ns=excess,
                others_waited_ns=split.others_waited_ns if split is not None else 0,
                top_finding=top.title if top is not None else None,
                top_finding_rule=top.rule if top is not None else None,
                top_finding_source=top.source if top is not None else None,
                waits_caused_per_step_ns=result.per_step(split.others_mean_wait_ns)
                if split is not None
                else 0,
                steps=result.steps,
            )
        )
    return tuple(
        sorted(
            found,
            key=lambda straggler: (
                -straggler.waits_caused_per_step_ns,
                -straggler.others_waited_ns,
                straggler.rank,
            ),
        )
    )


def _severity_order(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def _findings(
    ranks: Sequence[RankResult],
    timings: Timings | None = None,
    stragglers: tuple[Straggler, ...] = (),
    thresholds: Thresholds | None = None,
) -> tuple[JobFinding, ...]:
    """The ranks' findings, one per rule: the stragglers' own causes first (module doc)."""
    share = (thresholds or Thresholds()).exposed_communication_share
    # only ranks whose clocks were aligned: elsewhere the split is approximate
    timing_of = {rank: timing for rank, timing in (timings or {}).items() if timing.clock_aligned}
    by_rule: dict[str, list[tuple[int, int, str, str, bool, str | None]]] = defaultdict(list)
    per_step: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # rule → rank → ns
    for result in ranks:
        for finding in result.findings:
            savings = finding.savings_ns
            if finding.rule == "exposed-communication" and result.rank in timing_of:
                timing = timing_of[result.rank]
                ratio = _transfer_ratio(timing)
                savings = round(savings * ratio)
                exposed = round(result.usage.communication_ns * ratio)
                if exposed < share * result.usage.window_ns:
                    continue  # its exposed communication is mostly waiting: not this rule's
            by_rule[finding.rule].append(
                (result.rank, savings, finding.title, finding.severity, finding.minor, finding.source)
            )
            per_step[finding.rule][result.rank] += result.per_step(savings)
    leads = {
        straggler.top_finding_rule: straggler
        for straggler in reversed(stragglers)
        if straggler.top_finding_rule is not None and straggler.cause is not None
    }
    found = []
    for rule, entries in by_rule.items():
        lead = leads.get(rule)
        biggest = max(entries, key=lambda entry: (entry[1], -entry[0]))
        if lead is not None:
            biggest = next((entry for entry in entries if entry[0] == lead.rank), biggest)
        title, note = biggest[2], None
        if rule == "exposed-communication" and timing_of:
            title, note = _transfer_words(ranks, timing_of, entries, per_step[rule])
        found.append(
            JobFinding(
                rule=rule,
                severity=Severity(min((entry[3] for entry in entries), key=_severity_order)),
                title=title,
                ranks=tuple(sorted({entry[0] for entry in entries})),
                savings_total_ns=sum(entry[1] for entry in entries),
                savings_per_step_ns=median_low(per_step[rule].values()),
                savings_per_step_all_ranks_ns=sum(per_step[rule].values()),
                minor=all(entry[4] for entry in entries) and lead is None,
                straggler=lead.rank if lead is not None else None,
                job_savings_per_step_ns=lead.waits_caused_per_step_ns if lead is not None else 0,
                source=biggest[5],
                note=note,
            )
        )
    for straggler in stragglers:
        if straggler.top_finding_rule is None and straggler.cause is not None:
            found.append(_cause_finding(straggler))
    order = [straggler.rank for straggler in stragglers]

    def key(finding: JobFinding) -> tuple[int, bool, int, int, str]:
        place = order.index(finding.straggler) if finding.straggler is not None else len(order)
        return (place, finding.minor, -len(finding.ranks), -finding.savings_total_ns, finding.rule)

    return tuple(sorted(found, key=key))


def _cause_finding(straggler: Straggler) -> JobFinding:
    """A straggler's cause as the job's finding, where no finding of its own names it."""
    return JobFinding(
        rule="straggler",
        severity=Severity.HIGH,
        title=(
            f"rank {straggler.rank} holds the others back: {straggler.cause_words} "
            f"(+{format_duration(straggler.cause_excess_per_step_ns)} per step over the median rank)"
        ),
        ranks=(straggler.rank,),
        savings_total_ns=0,
        savings_per_step_ns=straggler.waits_caused_per_step_ns,
        savings_per_step_all_ranks_ns=straggler.waits_caused_per_step_ns,
        minor=False,
        straggler=straggler.rank,
        job_savings_per_step_ns=straggler.waits_caused_per_step_ns,
    )


def _transfer_words(
    ranks: Sequence[RankResult],
    timing_of: Timings,
    entries: list[tuple[int, int, str, str, bool, str | None]],
    per_step: dict[int, int],
) -> tuple[str, str]:
    """The job's ``exposed-communication`` title and note, by the transfer (module doc)."""
    by_rank = {result.rank: result for result in ranks}
    fired = [entry[0] for entry in entries]
    transfer = median_low(
        [by_rank[rank].per_step(timing_of[rank].exposed_transfer_ns) for rank in fired if rank in timing_of]
        or [0]
    )
    waits = [
        (by_rank[rank].per_step(timing_of[rank].exposed_wait_ns), timing_of[rank].waited_for)
        for rank in fired
        if rank in timing_of
    ]
    wait = median_low([ns for ns, _ in waits] or [0])
    whom = Counter(rank for _, rank in waits if rank is not None).most_common(1)
    title = (
        f"collectives move data with no compute under them {format_duration(transfer)} per step after "
        "the last rank arrived (the median rank's)"
    )
    note = "counts the transfer only"
    if wait:
        note += (
            f"; the {format_duration(wait)} per step of waiting with no compute under it (the median rank's) "
            + (f"is waiting for rank {whom[0][0]}: see its cause" if whom else "is waiting for the last rank")
        )
    return title, note


def combine(
    results: Sequence[RankResult], *, cycles_of: str | None = None, thresholds: Thresholds | None = None
) -> JobResult:
    """The job's result from every rank's result (any order). ``cycles_of``: the results are the
    profiler cycles of that one process, not ranks (side by side, no cross-rank analysis)."""
    if cycles_of is not None:
        return _cycles(results, cycles_of)
    _check_ranks(results)
    ranks = tuple(sorted(results, key=lambda result: result.rank))
    warnings: list[str] = []
    sizes = {result.world_size for result in ranks if result.world_size is not None}
    if len(sizes) == 1 and (size := next(iter(sizes))) != len(ranks):
        warnings.append(
            f"the traces say the job had {size} ranks; {len(ranks)} were given, so figures are over those only"
        )
    sources = Counter(result.collectives_from for result in ranks)
    source = sources.most_common(1)[0][0] if ranks else "none"
    matched, match_warnings = _match(ranks) if len(ranks) > 1 else ([], [])
    warnings += match_warnings
    timings, arrivals, aligned, residual = _timings(ranks, matched) if matched else ({}, (), 0, None)
    unaligned = [rank for rank, timing in timings.items() if timing.matched and not timing.clock_aligned]
    if unaligned:
        warnings.append(
            f"{len(unaligned)} rank{'' if len(unaligned) == 1 else 's'} (rank {unaligned[0]}"
            f"{' …' if len(unaligned) > 1 else ''}) left collectives more than "
            f"{format_duration(ALIGN_TOLERANCE_NS)} apart from the others after the best shift: their own "
            "clocks are kept, and their wait and transfer are approximate"
        )
    if len(ranks) == 1:
        warnings.append("one rank's trace: wait and transfer in its collectives cannot be told apart")
    steps = [result.step_ns for result in ranks if result.step_ns is not None]
    step_ns = median_low(steps) if steps else None
    slowest = max(
        (result for result in ranks if result.step_ns is not None),
        key=lambda result: (result.step_ns or 0, -result.rank),
        default=None,
    )
    if len(ranks) < 3:
        warnings.append(
            f"{len(ranks)} rank{'' if len(ranks) == 1 else 's'}: stragglers are named from 3 ranks up "
            "(they are outliers among the ranks)"
        )
    kinds = Counter(kind for kind, _ in matched)
    keyed = {kind: _keyed(ranks, kind) for kind in kinds}
    stragglers = _stragglers(ranks, timings, step_ns) if len(ranks) >= 3 else ()
    return JobResult(
        job=_job_info(
            ranks,
            step_ns,
            JobCollectives(
                source=source,
                matched=len(matched),
                matched_by_seq=sum(count for kind, count in kinds.items() if keyed.get(kind)),
                kinds=dict(sorted(kinds.items(), key=lambda item: (-item[1], item[0]))),
                split=any(timing.clock_aligned for timing in timings.values()),
                clock=JobClock(aligned_ranks=aligned, residual_ns=residual, tolerance_ns=ALIGN_TOLERANCE_NS),
                arrivals=arrivals,
            ),
            slowest=slowest,
        ),
        warnings=tuple(warnings),
        ranks=tuple(_rank(result, timings.get(result.rank)) for result in ranks),
        stragglers=stragglers,
        findings=_findings(ranks, timings, stragglers, thresholds),
        rank_results=ranks,
    )


def _job_info(
    ranks: Sequence[RankResult],
    step_ns: int | None,
    collectives: JobCollectives,
    *,
    slowest: RankResult | None = None,
    cycles_of: str | None = None,
) -> JobInfo:
    """The job as a whole: its size and setup as the first rank that says, its pace."""
    return JobInfo(
        ranks=len(ranks),
        world_size=next((r.world_size for r in ranks if r.world_size is not None), None),
        backend=next((r.backend for r in ranks if r.backend is not None), None),
        step_time_ns=step_ns,
        slowest_step_time_ns=slowest.step_ns if slowest is not None else None,
        slowest_rank=slowest.rank if slowest is not None else None,
        read_as="ranks" if cycles_of is None else "cycles",
        cycles_of=cycles_of,
        collectives=collectives,
    )


def _rank(result: RankResult, collectives: RankCollectives | None) -> Rank:
    """A rank's entry in the job: the worker's, with its collectives' timing across the ranks."""
    return result.entry if collectives is None else replace(result.entry, collectives=collectives)


def _cycles(results: Sequence[RankResult], worker: str) -> JobResult:
    """One process's profiler cycles side by side: each cycle's own figures, findings over them."""
    cycles = tuple(sorted(results, key=lambda result: result.rank))
    steps = [result.step_ns for result in cycles if result.step_ns is not None]
    return JobResult(
        job=_job_info(
            cycles,
            median_low(steps) if steps else None,
            JobCollectives(source="none", matched=0, clock=JobClock(tolerance_ns=ALIGN_TOLERANCE_NS)),
            cycles_of=worker,
        ),
        ranks=tuple(_rank(result, None) for result in cycles),
        findings=_findings(cycles),
        rank_results=cycles,
    )
