"""A distributed job's result: the ranks' summaries, their collectives' timing, the stragglers.

Two views of one job, as for one trace (:mod:`.trace`): :class:`JobReport` is what the job layer
computes (:func:`traceinsight.job.combine`: integer nanoseconds, each rank's
:class:`~traceinsight.analysis.usage.Usage`), and :class:`JobResult` is the job's JSON contract,
typed (:func:`job_result_of`): what ``analyze --json`` writes for a job and reads back. A live
:class:`JobResult` carries its :class:`JobReport`, which the terminal summary, the page and the
Markdown are drawn from.

The JSON's top-level keys (never renamed; new keys may be added): ``schema``, ``kind`` (``"job"``),
``tool``, ``job``, ``warnings``, ``ranks``, ``stragglers``, ``findings``. Each ``ranks[]`` entry's
``utilization`` is exactly the ``utilization`` of that rank's own ``analyze --json``. Nothing in it
depends on where or how the ranks were analyzed (local pool or dask), so both give the same bytes.
The schema is the one version of every result (:data:`~.trace.SCHEMA_VERSION`; a job's was 1 before
the three kinds shared it, with the same keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.usage import Usage
from traceinsight.results.codec import document_of
from traceinsight.results.contract import utilization_of
from traceinsight.results.frames import job_frames
from traceinsight.results.stored import from_text
from traceinsight.results.trace import SCHEMA_VERSION, Tool, Utilization
from traceinsight.results.writer import strict_json
from traceinsight.rules.findings import Severity
from traceinsight.shown import figures_of, html_of

if TYPE_CHECKING:
    import polars as pl

#: A rank's clock is aligned on its collectives' ends when every end lies this close to the
#: collective's median end once shifted (:mod:`traceinsight.job.combine`).
ALIGN_TOLERANCE_NS: Final = 200_000

__all__ = [
    "ALIGN_TOLERANCE_NS",
    "CAUSE_WORDS",
    "Arrival",
    "Collective",
    "FindingBrief",
    "JobFinding",
    "JobReport",
    "JobResult",
    "RankResult",
    "RankStep",
    "RankTiming",
    "Straggler",
    "job_result_of",
]

#: How the job report names a cause of lateness.
CAUSE_WORDS: Final[dict[str, str]] = {
    CauseKind.DATALOADER.value: "DataLoader",
    CauseKind.SYNC.value: "a host sync",
    CauseKind.COPY.value: "a blocking copy",
    CauseKind.LAUNCH.value: "launching",
    CauseKind.HOST_OP.value: "host work in an operator",
    CauseKind.ALLOCATOR.value: "the allocator",
    CauseKind.UNTRACED.value: "untraced host work",
    CauseKind.COMMUNICATION.value: "communication",
    CauseKind.QUEUED.value: "queued",
    CauseKind.WAITING.value: "waiting for work",
    CauseKind.OUTSIDE_STEADY.value: "outside steady state",
    CauseKind.BEFORE_FIRST.value: "before first work",
    CauseKind.AFTER_LAST.value: "after last work",
    CauseKind.CAPTURE.value: "graph capture",
    "compute": "slower GPU work",
}


@dataclass(frozen=True, slots=True)
class Collective:
    """One collective as this rank ran it: its kind (``AllReduce``, ``SendRecv``, ``c10d::allreduce_``)
    and its start and end on the job's common clock (ns since the epoch where the trace says so)."""

    kind: str
    start_ns: int
    end_ns: int
    #: The process group it ran in and its sequence number there (``Process Group Name`` and
    #: ``Seq`` on communication kernels since 2026): None where the trace does not say.
    process_group: str | None = None
    seq: int | None = None
    #: Where it ran with no compute kernel under it on its device, flattened ``(start, end, …)``
    #: on the same clock (at most 16 stretches, the closest joined past that); empty for host
    #: collectives.
    exposed_ns: tuple[int, ...] = ()


@dataclass(frozen=True, slots=True)
class FindingBrief:
    """What the job report keeps of one of a rank's findings."""

    rule: str
    severity: str
    title: str
    savings_ns: int
    minor: bool
    #: The line it points at (``train.py:42``), when the trace says.
    source: str | None = None


@dataclass(frozen=True, slots=True)
class RankResult:
    """One rank's figures: the same numbers its own ``analyze`` shows, and its collectives."""

    rank: int
    #: Where the rank number came from: ``distributedInfo``, ``file name`` or ``order``.
    rank_from: str
    #: The trace's path as the user gave it (control characters replaced).
    path: str
    world_size: int | None
    backend: str | None
    #: The rank's steady state, over every device (:func:`~traceinsight.analysis.usage.total_usage`).
    usage: Usage
    #: Whether the trace had any steady state to judge (the JSON's ``utilization.of`` is null if not).
    has_usage: bool
    #: Median steady step time: the spacing of when the steps' work was done (None without steps).
    step_ns: int | None
    #: Communication kernel time (union) inside the steady state, overlapped by compute or not.
    communication_total_ns: int
    #: Host blocking calls inside the steady state.
    steady_syncs: int
    findings: tuple[FindingBrief, ...]
    #: The rank's collectives in order: GPU communication kernels, else host ``c10d::`` operators.
    collectives: tuple[Collective, ...]
    #: ``gpu`` (communication kernels) or ``host`` (``c10d::`` operators) or ``none``.
    collectives_from: str
    warnings: tuple[str, ...]
    #: This rank's own reports, staged by the worker: (file name, staged path) pairs.
    staged: tuple[tuple[str, str], ...] = ()
    #: Its steady steps on the GPU's clock, on the collectives' clock: (step number, begin, done).
    #: Without steps, the steady windows, numbered -1.
    steps_ns: tuple[tuple[int, int, int], ...] = ()

    @property
    def steps(self) -> int:
        """Steady steps (0 without steps)."""
        return self.usage.steps

    @property
    def name(self) -> str:
        """The trace file's name."""
        return Path(self.path).name

    def per_step(self, ns: int) -> int:
        """``ns`` per steady step, or ``ns`` itself without steps."""
        return round(ns / self.steps) if self.steps else ns

    @property
    def syncs_per_step(self) -> float | None:
        """Host blocking calls per steady step (None without steps)."""
        return self.steady_syncs / self.steps if self.steps else None

    @property
    def top_finding(self) -> FindingBrief | None:
        """The first finding that is not minor (findings come ranked by saving)."""
        return next((finding for finding in self.findings if not finding.minor), None)


@dataclass(frozen=True, slots=True)
class RankStep:
    """A rank's time in collectives in one of its steady steps, split (see :mod:`traceinsight.job.combine`)."""

    step: int
    """``ProfilerStep#N``'s N (-1: the steady window of a trace without steps)."""
    wait_ns: int
    """Waiting in collectives for the last rank to arrive."""
    transfer_ns: int
    """In collectives after the last rank arrived."""
    waited_for: int | None
    """The rank it waited for longest in this step (None: it waited for nobody)."""
    waited_for_ns: int = 0
    """How long it waited for that rank in this step."""


@dataclass(frozen=True, slots=True)
class RankTiming:
    """A rank in the job's collectives."""

    rank: int
    matched: int
    """Collectives of this rank matched with the other ranks' (every other rank's when matched by
    order; the other members of its process group when matched by group and sequence number)."""
    late_median_ns: int
    late_max_ns: int
    waited_ns: int
    """Time this rank spent in collectives waiting for the last rank to arrive (summed)."""
    caused_ns: int
    """Time the other ranks spent waiting for this rank, in collectives it arrived at last."""
    clock_offset_ns: int = 0
    """Subtracted from this rank's times to put it on the job's clock (0 where not aligned)."""
    clock_aligned: bool = False
    """Whether its collectives' ends agreed with the others' once shifted by the offset."""
    wait_ns: int = 0
    """In its steady steps: time in collectives before the last rank arrived (within each kernel)."""
    transfer_ns: int = 0
    """In its steady steps: time in collectives after the last rank arrived."""
    exposed_wait_ns: int = 0
    """Of ``wait_ns``, with no compute under it."""
    exposed_transfer_ns: int = 0
    """Of ``transfer_ns``, with no compute under it."""
    waited_for: int | None = None
    """The rank it waited for longest in its steady steps."""
    waited_for_ns: int = 0
    steps: tuple[RankStep, ...] = ()
    """Per steady step, in order."""
    caused_per_other_ns: int = 0
    """Over the collectives it came last to: the mean wait of the other members for it, summed
    (what each other rank would save if it had kept pace)."""


@dataclass(frozen=True, slots=True)
class Arrival:
    """One collective's arrivals across ranks (the arrivals chart)."""

    kind: str
    step: int | None
    """The step it ran in on its last rank (None: outside the steady steps)."""
    arrivals_ns: tuple[tuple[int, int], ...]
    """(rank, arrival after the first rank's), by rank."""
    last_rank: int


@dataclass(frozen=True, slots=True)
class Straggler:
    """A rank that holds the others back, and why."""

    rank: int
    reasons: tuple[str, ...]
    """What is out of line, in plain words (``collectives start 80.0 ms late (median)``)."""
    cause: str | None
    """``CauseKind`` value (or ``compute``) whose time per step grew most over the job's median."""
    cause_excess_ns: int
    """How much more of that per step than the job's median rank."""
    caused_ns: int
    """Time the other ranks waited for this rank in collectives."""
    top_finding: str | None
    top_finding_rule: str | None = None
    """The rule of its top finding: its own finding of its cause where it has one."""
    top_finding_source: str | None = None
    """The line its top finding points at."""
    saving_per_step_ns: int = 0
    """What each other rank would save per step if it kept pace: the others' mean wait for it
    per step (:attr:`RankTiming.caused_per_other_ns` per step)."""
    steps: int = 0
    """Its steady steps (the wait may be a one-off when there is one)."""

    @property
    def cause_words(self) -> str:
        """The cause as the report names it."""
        return CAUSE_WORDS.get(self.cause, self.cause) if self.cause is not None else "no single cause"


@dataclass(frozen=True, slots=True)
class JobFinding:
    """One rule's findings over the ranks: reported once, with the ranks it fired on."""

    rule: str
    severity: str
    title: str
    """The title on the rank where the saving is largest."""
    ranks: tuple[int, ...]
    savings_ns: int
    """Summed over the ranks (each over its whole steady state)."""
    minor: bool
    saving_per_step_ns: int = 0
    """Per steady step, the median rank's (the lower middle of the ranks it fired on)."""
    saving_per_step_all_ns: int = 0
    """Per steady step, summed over the ranks it fired on (what the job as a whole would free in
    one step, counted once per rank's GPU)."""
    straggler: int | None = None
    """The straggler whose own cause this finding is (such findings lead the job's)."""
    job_saving_per_step_ns: int = 0
    """With ``straggler``: what every other rank saves per step if it kept pace."""
    source: str | None = None
    """The line the finding points at on the rank where the saving is largest (the straggler's)."""
    note: str | None = None
    """How the job view changed the ranks' finding (``exposed-communication``: transfer only)."""


@dataclass(frozen=True, slots=True)
class JobReport:
    """Everything the job's renderers show."""

    ranks: tuple[RankResult, ...]
    """By rank."""
    timings: tuple[RankTiming, ...]
    """By rank (empty when the ranks have no collectives to match)."""
    collectives_from: str
    collectives_matched: int
    #: Of those, matched by process group and sequence number (the rest by kind and order).
    collectives_matched_by_seq: int
    collective_kinds: tuple[tuple[str, int], ...]
    stragglers: tuple[Straggler, ...]
    findings: tuple[JobFinding, ...]
    warnings: tuple[str, ...]
    step_ns: int | None
    """Median over ranks of each rank's median steady step (the lower middle)."""
    cycles_of: str | None = None
    """The worker (``host_pid``) when the "ranks" are one process's profiler cycles
    (:mod:`traceinsight.job.triage`): no collectives are matched and no straggler is named."""
    slowest_step_ns: int | None = None
    """The slowest rank's median steady step: what sets the job's pace."""
    slowest_rank: int | None = None
    clock_aligned_ranks: int = 0
    """Ranks whose clock was shifted onto the job's by their collectives' ends."""
    clock_residual_ns: int | None = None
    """After the shift: the largest distance of an aligned rank's collective end from the
    collective's median end (None: nothing aligned)."""
    split: bool = False
    """Whether collectives' time is split into wait and transfer: matched across ranks, on clocks
    aligned by their ends (the split counts in the findings on aligned ranks only)."""
    arrivals: tuple[Arrival, ...] = ()
    """The first collectives' arrivals (the chart)."""

    def timing(self, rank: int) -> RankTiming | None:
        """The rank's collective timing."""
        return next((timing for timing in self.timings if timing.rank == rank), None)


# --- the job's JSON contract ----------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class JobClock:
    """How the ranks' clocks were aligned on their collectives' ends (:mod:`traceinsight.job.combine`)."""

    aligned_ranks: int = field(default=0, metadata={"check": "count"})
    #: The largest distance of an aligned rank's collective end from the collective's median end
    #: once shifted (null: nothing aligned).
    residual_ns: int | None = None
    #: A rank is aligned when every end lies this close once shifted.
    tolerance_ns: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class JobCollectives:
    """How the ranks' collectives were matched across ranks."""

    #: ``gpu`` (communication kernels), ``host`` (``c10d::`` operators) or ``none``.
    source: str = field(metadata={"key": "from"})
    matched: int = field(metadata={"check": "count"})
    matched_by_seq: int = field(default=0, metadata={"check": "count"})
    kinds: dict[str, int] = field(default_factory=dict)
    #: Whether collectives' time is split into wait and transfer: false with one rank, or where no
    #: rank's collectives end with the others' (its clock cannot be aligned).
    split: bool = False
    clock: JobClock = field(default_factory=JobClock)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobInfo:
    """The job as a whole."""

    ranks: int = field(metadata={"check": "count"})
    world_size: int | None
    backend: str | None
    step_time_ns: int | None = field(metadata={"check": "duration"})
    #: What ``step_time`` is: the median over ranks of each rank's median steady step.
    step_time_statistic: str = "median over ranks (lower middle) of each rank's median step"
    #: The slowest rank's median steady step: what sets the job's pace.
    slowest_step_time_ns: int | None = None
    slowest_rank: int | None = None
    #: ``ranks``, or ``cycles`` when the files are one process's profiler cycles (``cycles_of``
    #: names the process; ``ranks[]`` are then the cycles in time order).
    read_as: str = "ranks"
    cycles_of: str | None = None
    collectives: JobCollectives


@dataclass(frozen=True, slots=True, kw_only=True)
class PerStep:
    """A rank's time per steady step (in all, without steps)."""

    compute_ns: int = field(metadata={"key": "compute"})
    communication_ns: int = field(metadata={"key": "communication"})
    communication_exposed_ns: int = field(metadata={"key": "communication_exposed"})
    copy_exposed_ns: int = field(metadata={"key": "copy_exposed"})
    idle_ns: int = field(metadata={"key": "idle"})
    idle_by_cause_ns: dict[str, int] = field(
        default_factory=dict, metadata={"key": "idle_by_cause", "check": "id"}
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class RankStepSplit:
    """A rank's collectives in one steady step: waiting for the last rank, and the transfer."""

    step: int
    wait_ns: int
    transfer_ns: int
    waited_for: int | None = None
    waited_for_ns: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RankCollectives:
    """A rank in the job's matched collectives."""

    source: str = field(metadata={"key": "from"})
    matched: int
    late_median_ns: int
    late_max_ns: int
    waited_ns: int
    others_waited_ns: int
    #: In its steady steps: waiting for the last rank, the transfer after, and of each the part
    #: with no compute under it.
    wait_ns: int = 0
    transfer_ns: int = 0
    exposed_wait_ns: int = 0
    exposed_transfer_ns: int = 0
    #: The rank it waited for longest, and how long.
    waited_for: int | None = None
    waited_for_ns: int = 0
    #: Subtracted from its times to put them on the job's clock; whether its ends agreed.
    clock_offset_ns: int = 0
    clock_aligned: bool = False
    per_step: tuple[RankStepSplit, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TopFinding:
    """A rank's first finding that is not minor."""

    rule: str = field(metadata={"check": "id"})
    title: str
    #: Over the rank's whole steady state (JSON ``savings_us``).
    savings_total_ns: int = field(metadata={"key": "savings_us"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Rank:
    """One rank's figures: the same numbers its own ``analyze`` shows."""

    rank: int
    #: Where the rank number came from: ``distributedInfo``, ``file name`` or ``order``.
    rank_from: str
    path: str
    steps: int = field(metadata={"check": "count"})
    step_time_ns: int | None
    utilization: Utilization
    per_step: PerStep = field(metadata={"key": "per_step_us"})
    syncs_per_step: float | None
    collectives: RankCollectives | None
    top_finding: TopFinding | None
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StragglerEntry:
    """A rank that holds the others back, and why (see :class:`Straggler`)."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "rank", "reasons", "cause", "cause_words", "cause_excess_per_step_ns", "others_waited_ns", "top_finding",
        "top_finding_rule", "top_finding_source", "waits_caused_per_step_ns", "steps",
    )  # fmt: skip
    rank: int
    reasons: tuple[str, ...] = ()
    cause: str | None
    cause_excess_per_step_ns: int
    others_waited_ns: int
    top_finding: str | None
    top_finding_rule: str | None = None
    top_finding_source: str | None = None
    #: The others' mean wait for it per step: what each would save if it kept pace.
    waits_caused_per_step_ns: int = 0
    steps: int = 0

    @property
    def cause_words(self) -> str:
        """The cause as the report names it."""
        return CAUSE_WORDS.get(self.cause, self.cause) if self.cause is not None else "no single cause"


@dataclass(frozen=True, slots=True, kw_only=True)
class JobFindingEntry:
    """One rule's findings over the ranks (see :class:`JobFinding`)."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "rule",
        "severity",
        "title",
        "ranks",
        "rank_count",
        "savings_total_ns",
        "savings_per_step_ns",
        "savings_per_step_all_ranks_ns",
        "minor",
        "straggler",
        "job_savings_per_step_ns",
        "source",
        "note",
    )
    rule: str = field(metadata={"check": "id"})
    severity: Severity
    title: str
    ranks: tuple[int, ...]
    #: Summed over the ranks' whole steady states (JSON ``savings_us``; per step is
    #: :attr:`savings_per_step_ns`).
    savings_total_ns: int = field(metadata={"key": "savings_us"})
    #: The median rank's saving per steady step.
    savings_per_step_ns: int = 0
    #: Summed over the ranks it fired on, per step.
    savings_per_step_all_ranks_ns: int = 0
    minor: bool = False
    #: The straggler whose own cause this is (such findings come first).
    straggler: int | None = None
    #: With ``straggler``: what every other rank saves per step if it kept pace.
    job_savings_per_step_ns: int = 0
    source: str | None = None
    #: How the job view counts it (``exposed-communication``: the transfer only).
    note: str | None = None

    @property
    def rank_count(self) -> int:
        """On how many ranks the rule fired."""
        return len(self.ranks)


@dataclass(frozen=True, slots=True, kw_only=True)
class JobResult:
    """A distributed job's result, as ``analyze --json`` writes it for several traces (see the
    module doc). :meth:`to_json` writes it, :meth:`from_json` reads it back."""

    KIND: ClassVar[str] = "job"
    schema: int = SCHEMA_VERSION
    kind: str = "job"
    tool: Tool = field(default_factory=Tool)
    job: JobInfo
    warnings: tuple[str, ...] = ()
    ranks: tuple[Rank, ...] = ()
    stragglers: tuple[StragglerEntry, ...] = ()
    findings: tuple[JobFindingEntry, ...] = ()
    #: What the job layer computed (None for a stored result): what the terminal summary, the page
    #: and the Markdown are drawn from.
    report: JobReport | None = field(default=None, compare=False, repr=False, metadata={"local": True})
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata={"local": True})

    @classmethod
    def of(cls, job: JobReport) -> JobResult:
        """The result of a combined job (:func:`job_result_of`)."""
        return job_result_of(job)

    def to_json(self) -> str:
        """The job's result as ``analyze --json`` writes it."""
        return strict_json(document_of(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> JobResult:
        """A job's result from its JSON, read as untrusted input."""
        return from_text(text, cls)

    def __repr__(self) -> str:
        return f"JobResult({self.job.ranks} ranks, {len(self.findings)} findings)"

    @property
    def charts(self) -> Mapping[str, object]:
        """The job page's chart as a matplotlib Figure (``arrivals``: each collective's arrivals
        across ranks), drawn on each call (a live job only); empty without matched collectives."""
        return figures_of(self)

    @property
    def frames(self) -> dict[str, pl.DataFrame]:
        """The job's tables as polars DataFrames (``ranks``, ``stragglers``, ``findings``), made on
        first use (see :mod:`.frames`)."""
        if "frames" not in self._cache:
            self._cache["frames"] = job_frames(self)
        frames: dict[str, pl.DataFrame] = self._cache["frames"]
        return frames

    def _repr_html_(self) -> str | None:
        return html_of(self)


def _rank_entry(job: JobReport, result: RankResult) -> Rank:
    timing = job.timing(result.rank)
    top = result.top_finding
    usage = result.usage
    return Rank(
        rank=result.rank,
        rank_from=result.rank_from,
        path=result.path,
        steps=result.steps,
        step_time_ns=result.step_ns,
        utilization=utilization_of(usage, result.has_usage),
        per_step=PerStep(
            compute_ns=result.per_step(usage.compute_ns),
            communication_ns=result.per_step(result.communication_total_ns),
            communication_exposed_ns=result.per_step(usage.communication_ns),
            copy_exposed_ns=result.per_step(usage.copy_ns),
            idle_ns=result.per_step(usage.idle_ns),
            idle_by_cause_ns={kind.value: result.per_step(ns) for kind, ns in usage.idle},
        ),
        syncs_per_step=None if result.syncs_per_step is None else round(result.syncs_per_step, 4),
        collectives=None
        if timing is None
        else RankCollectives(
            source=result.collectives_from,
            matched=timing.matched,
            late_median_ns=timing.late_median_ns,
            late_max_ns=timing.late_max_ns,
            waited_ns=timing.waited_ns,
            others_waited_ns=timing.caused_ns,
            wait_ns=timing.wait_ns,
            transfer_ns=timing.transfer_ns,
            exposed_wait_ns=timing.exposed_wait_ns,
            exposed_transfer_ns=timing.exposed_transfer_ns,
            waited_for=timing.waited_for,
            waited_for_ns=timing.waited_for_ns,
            clock_offset_ns=timing.clock_offset_ns,
            clock_aligned=timing.clock_aligned,
            per_step=tuple(
                RankStepSplit(
                    step=step.step,
                    wait_ns=step.wait_ns,
                    transfer_ns=step.transfer_ns,
                    waited_for=step.waited_for,
                    waited_for_ns=step.waited_for_ns,
                )
                for step in timing.steps
            ),
        ),
        top_finding=None
        if top is None
        else TopFinding(rule=top.rule, title=top.title, savings_total_ns=top.savings_ns),
        warnings=result.warnings,
    )


def job_result_of(job: JobReport) -> JobResult:
    """The JSON contract of a combined job, typed (see the module doc)."""
    return JobResult(
        job=JobInfo(
            ranks=len(job.ranks),
            world_size=next((r.world_size for r in job.ranks if r.world_size is not None), None),
            backend=next((r.backend for r in job.ranks if r.backend is not None), None),
            step_time_ns=job.step_ns,
            slowest_step_time_ns=job.slowest_step_ns,
            slowest_rank=job.slowest_rank,
            read_as="ranks" if job.cycles_of is None else "cycles",
            cycles_of=job.cycles_of,
            collectives=JobCollectives(
                source=job.collectives_from,
                matched=job.collectives_matched,
                matched_by_seq=job.collectives_matched_by_seq,
                kinds=dict(job.collective_kinds),
                split=job.split,
                clock=JobClock(
                    aligned_ranks=job.clock_aligned_ranks,
                    residual_ns=job.clock_residual_ns,
                    tolerance_ns=ALIGN_TOLERANCE_NS,
                ),
            ),
        ),
        warnings=job.warnings,
        ranks=tuple(_rank_entry(job, result) for result in job.ranks),
        stragglers=tuple(
            StragglerEntry(
                rank=straggler.rank,
                reasons=straggler.reasons,
                cause=straggler.cause,
                cause_excess_per_step_ns=straggler.cause_excess_ns,
                others_waited_ns=straggler.caused_ns,
                top_finding=straggler.top_finding,
                top_finding_rule=straggler.top_finding_rule,
                top_finding_source=straggler.top_finding_source,
                waits_caused_per_step_ns=straggler.saving_per_step_ns,
                steps=straggler.steps,
            )
            for straggler in job.stragglers
        ),
        findings=tuple(
            JobFindingEntry(
                rule=finding.rule,
                severity=Severity(finding.severity),
                title=finding.title,
                ranks=finding.ranks,
                savings_total_ns=finding.savings_ns,
                savings_per_step_ns=finding.saving_per_step_ns,
                savings_per_step_all_ranks_ns=finding.saving_per_step_all_ns,
                minor=finding.minor,
                straggler=finding.straggler,
                job_savings_per_step_ns=finding.job_saving_per_step_ns,
                source=finding.source,
                note=finding.note,
            )
            for finding in job.findings
        ),
        report=job,
    )
