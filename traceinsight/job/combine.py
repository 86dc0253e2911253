"""One report from the ranks' results: collectives matched across ranks, lateness, stragglers.

Collectives are matched by process group and sequence number where the traces say them (Kineto
writes ``Process Group Name`` and ``Seq`` on communication kernels since 2026): the collective with
sequence number n of a group on one rank is the one with n in that group on every rank that ran it,
whatever order the groups' collectives ran in. Otherwise by order: the n-th collective of each kind
on one rank is the n-th of that kind on every other rank (kind: the NCCL/RCCL kernel's collective,
``AllReduce``, ``SendRecv``…, or the host ``c10d::`` operator without GPU work). A kind is matched by
group and sequence number only when every collective of it on every rank carries them. Times are
on the traces' own
clocks, taken as one clock (torch.profiler writes wall-clock time; ranks on hosts with skewed
clocks show the skew as lateness).

For each matched collective c and rank r:

- ``lateness(r, c) = start(r, c) − median over ranks of start(·, c)`` (the lower middle value for
  an even count), so a rank on time is near 0 whatever the others do;
- ``wait(r, c) = max over ranks of start(·, c) − start(r, c)``: how long r sat in c waiting for
  the last rank to arrive;
- the rank that arrives last in c *caused* ``Σ wait(r, c)`` over the others.

A rank is a straggler when its median lateness, its step time, or its *own time* (step time less
its collective waits per step) is above the job's median by more than
``max(floor, 4 × 1.4826 × MAD)`` — MAD the median absolute deviation over ranks, floor 5 % of the
median step time (200 µs for lateness without steps). A rank's step time is the spacing of when its
steps' work was done, host and GPU (:mod:`traceinsight.analysis.steady`), and its figures per step
are over those steps' windows on the GPU's clock. Its cause is its own largest excess over the job's
median rank, per step: the idle cause of its own (DataLoader, a host sync, a blocking copy, host
work, launching) whose time exceeds the median the most, or slower GPU work when compute time grew
more than any of them. Time spent waiting for another rank is a symptom the straggler shares with
the ranks that wait for it, never its cause: communication (its GPU in a collective, its host in a
``c10d`` call) and work queued behind a dependency are not blamed.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Sequence
from statistics import median_low
from typing import Final

from traceinsight.analysis.causes import CauseKind
from traceinsight.errors import TraceFormatError
from traceinsight.formatting import format_duration
from traceinsight.results.job import JobFinding, JobReport, RankResult, RankTiming, Straggler
from traceinsight.rules.findings import SEVERITIES

__all__ = ["BLAMED_CAUSES", "combine"]

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


def _check_ranks(results: Sequence[RankResult]) -> None:
    seen: dict[int, str] = {}
    for result in results:
        if result.rank in seen:
            raise TraceFormatError(
                f"two traces say they are rank {result.rank}: {seen[result.rank]} and {result.path} "
                f"(rank taken from {result.rank_from}); give each rank's trace once"
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


def _match_keyed(ranks: Sequence[RankResult], kind: str) -> list[tuple[str, dict[int, tuple[int, int]]]]:
    """Collectives of ``kind`` matched by (process group, sequence number, occurrence): each one
    among the ranks that ran it (a group's collective involves its members only), two ranks up."""
    by_key: dict[tuple[str, int, int], dict[int, tuple[int, int]]] = defaultdict(dict)
    for result in ranks:
        seen: Counter[tuple[str, int]] = Counter()
        for collective in result.collectives:
            if collective.kind != kind or collective.process_group is None or collective.seq is None:
                continue
            key = (collective.process_group, collective.seq)
            by_key[(*key, seen[key])][result.rank] = (collective.start_ns, collective.end_ns)
            seen[key] += 1
    return [(kind, starts) for starts in by_key.values() if len(starts) > 1]


def _match(ranks: Sequence[RankResult]) -> tuple[list[tuple[str, dict[int, tuple[int, int]]]], list[str]]:
    """Matched collectives: (kind, {rank: (start, end)}) in order, and warnings on counts that differ.

    By process group and sequence number where every collective of a kind carries them, else by
    order (see the module doc)."""
    by_rank: dict[int, dict[str, list[tuple[int, int]]]] = {}
    for result in ranks:
        kinds: dict[str, list[tuple[int, int]]] = defaultdict(list)
        for collective in result.collectives:
            kinds[collective.kind].append((collective.start_ns, collective.end_ns))
        by_rank[result.rank] = kinds
    warnings: list[str] = []
    every_kind = sorted({kind for kinds in by_rank.values() for kind in kinds})
    matched: list[tuple[str, dict[int, tuple[int, int]]]] = []
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
    matched.sort(key=lambda item: (median_low([start for start, _ in item[1].values()]), item[0]))
    return matched, warnings


def _timings(
    ranks: Sequence[RankResult], matched: list[tuple[str, dict[int, tuple[int, int]]]]
) -> tuple[RankTiming, ...]:
    late: dict[int, list[int]] = {result.rank: [] for result in ranks}
    waited: dict[int, int] = dict.fromkeys(late, 0)
    caused: dict[int, int] = dict.fromkeys(late, 0)
    for _, starts in matched:
        values = {rank: start for rank, (start, _) in starts.items()}
        middle = median_low(values.values())
        last_rank = max(values, key=lambda rank: (values[rank], -rank))
        last = values[last_rank]
        for rank, start in values.items():
            late[rank].append(start - middle)
            waited[rank] += last - start
            if rank != last_rank:
                caused[last_rank] += last - start
    return tuple(
        RankTiming(
            rank=rank,
            matched=len(values),
            late_median_ns=median_low(values) if values else 0,
            late_max_ns=max(values, default=0),
            waited_ns=waited[rank],
            caused_ns=caused[rank],
        )
        for rank, values in sorted(late.items())
    )


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


def _cause(result: RankResult, ranks: Sequence[RankResult]) -> tuple[str | None, int]:
    """The cause whose time per step exceeds the job's median rank the most, and by how much."""
    candidates = [kind.value for kind in BLAMED_CAUSES] + ["compute"]
    own = _idle_per_step(result)
    others = [_idle_per_step(other) for other in ranks]
    best: tuple[str | None, int] = (None, 0)
    for cause in candidates:
        excess = own.get(cause, 0) - median_low([split.get(cause, 0) for split in others])
        if excess > best[1]:
            best = (cause, excess)
    return best


def _stragglers(
    ranks: Sequence[RankResult], timings: tuple[RankTiming, ...], step_ns: int | None
) -> tuple[Straggler, ...]:
    floor = round(_STEP_FLOOR_SHARE * step_ns) if step_ns else _LATE_FLOOR_NS
    reasons: dict[int, list[str]] = defaultdict(list)
    if timings and any(timing.matched for timing in timings):
        for rank, excess in _outliers(
            {t.rank: t.late_median_ns for t in timings}, max(floor, _LATE_FLOOR_NS)
        ).items():
            timing = next(t for t in timings if t.rank == rank)
            reasons[rank].append(
                f"its collectives start {format_duration(timing.late_median_ns)} after the median rank's "
                f"(the median over {timing.matched} collectives; {format_duration(excess)} above the job's "
                "median lateness)"
            )
    stepped = {result.rank: result.step_ns for result in ranks if result.step_ns is not None}
    for rank, excess in _outliers(stepped, floor).items():
        reasons[rank].append(f"its step takes {format_duration(excess)} longer than the median rank's")
    waited = {timing.rank: timing.waited_ns for timing in timings}
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
    caused = {timing.rank: timing.caused_ns for timing in timings}
    found = []
    for rank in sorted(reasons):
        result = by_rank[rank]
        cause, excess = _cause(result, ranks)
        top = result.top_finding
        found.append(
            Straggler(
                rank=rank,
                reasons=tuple(reasons[rank]),
                cause=cause,
                cause_excess_ns=excess,
                caused_ns=caused.get(rank, 0),
                top_finding=top.title if top is not None else None,
            )
        )
    return tuple(sorted(found, key=lambda straggler: (-straggler.caused_ns, straggler.rank)))


def _severity_order(severity: str) -> int:
    return SEVERITIES.index(severity) if severity in SEVERITIES else len(SEVERITIES)


def _findings(ranks: Sequence[RankResult]) -> tuple[JobFinding, ...]:
    by_rule: dict[str, list[tuple[int, int, str, str, bool]]] = defaultdict(list)
    per_step: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))  # rule → rank → ns
    for result in ranks:
        for finding in result.findings:
            by_rule[finding.rule].append(
                (result.rank, finding.savings_ns, finding.title, finding.severity, finding.minor)
            )
            per_step[finding.rule][result.rank] += result.per_step(finding.savings_ns)
    found = []
    for rule, entries in by_rule.items():
        biggest = max(entries, key=lambda entry: (entry[1], -entry[0]))
        found.append(
            JobFinding(
                rule=rule,
                severity=min((entry[3] for entry in entries), key=_severity_order),
                title=biggest[2],
                ranks=tuple(sorted({entry[0] for entry in entries})),
                savings_ns=sum(entry[1] for entry in entries),
                minor=all(entry[4] for entry in entries),
                saving_per_step_ns=median_low(per_step[rule].values()),
                saving_per_step_all_ns=sum(per_step[rule].values()),
            )
        )
    return tuple(sorted(found, key=lambda f: (f.minor, -len(f.ranks), -f.savings_ns, f.rule)))


def combine(results: Sequence[RankResult], *, cycles_of: str | None = None) -> JobReport:
    """The job report from every rank's result (any order). ``cycles_of``: the results are the
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
    timings = _timings(ranks, matched) if matched else ()
    steps = [result.step_ns for result in ranks if result.step_ns is not None]
    step_ns = median_low(steps) if steps else None
    if len(ranks) < 3:
        warnings.append(
            f"{len(ranks)} rank{'' if len(ranks) == 1 else 's'}: stragglers are named from 3 ranks up "
            "(they are outliers among the ranks)"
        )
    kinds = Counter(kind for kind, _ in matched)
    keyed = {kind: _keyed(ranks, kind) for kind in kinds}
    return JobReport(
        ranks=ranks,
        timings=timings,
        collectives_from=source,
        collectives_matched=len(matched),
        collectives_matched_by_seq=sum(count for kind, count in kinds.items() if keyed.get(kind)),
        collective_kinds=tuple(sorted(kinds.items(), key=lambda item: (-item[1], item[0]))),
        stragglers=_stragglers(ranks, timings, step_ns),
        findings=_findings(ranks),
        warnings=tuple(warnings),
        step_ns=step_ns,
    )


def _cycles(results: Sequence[RankResult], worker: str) -> JobReport:
    """One process's profiler cycles side by side: each cycle's own figures, findings over them."""
    cycles = tuple(sorted(results, key=lambda result: result.rank))
    steps = [result.step_ns for result in cycles if result.step_ns is not None]
    return JobReport(
        ranks=cycles,
        timings=(),
        collectives_from="none",
        collectives_matched=0,
        collectives_matched_by_seq=0,
        collective_kinds=(),
        stragglers=(),
        findings=_findings(cycles),
        warnings=(),
        step_ns=median_low(steps) if steps else None,
        cycles_of=worker,
    )
