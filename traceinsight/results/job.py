"""A distributed job's result: the ranks' summaries, their collectives' timing, the stragglers.

One model: the job layer's workers return each rank's :class:`RankResult` (the rank's own
analysis, in brief), and :func:`traceinsight.job.combine` makes the job's :class:`JobResult` from
them directly: its JSON contract, typed, what ``analyze --json`` writes for a job and reads back.
The terminal summary, the page, the Markdown and the chart are drawn from the :class:`JobResult`
alone, so a job's stored result renders them as the live one did. A live result also keeps the
ranks' :class:`RankResult` (:attr:`JobResult.rank_results`, not in the JSON): the gate holds each
rank to the budgets with its every finding, and ``--per-rank`` finds the ranks' own reports there.

The JSON's top-level keys (never renamed; new keys may be added): ``schema``, ``kind`` (``"job"``),
``tool``, ``job``, ``warnings``, ``ranks``, ``stragglers``, ``findings``; keys added later sit at the
end of their object (``job.collectives.arrivals``, ``ranks[].busy_us``,
``ranks[].collectives.others_mean_wait_us``). Each ``ranks[]`` entry's
``utilization`` is exactly the ``utilization`` of that rank's own ``analyze --json``. Nothing in it
depends on where or how the ranks were analyzed (local pool or dask), so both give the same bytes.
The schema is the one version of every result (:data:`~.trace.SCHEMA_VERSION`; a job's was 1 before
the three kinds shared it, with the same keys).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.usage import Usage
from traceinsight.model import Model, field
from traceinsight.results.codec import document_of
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
#: Collectives whose arrivals the job keeps for its chart (the first ones, in order).
ARRIVALS_SHOWN: Final = 12

__all__ = [
    "ALIGN_TOLERANCE_NS",
    "ARRIVALS_SHOWN",
    "CAUSE_WORDS",
    "Arrival",
    "Collective",
    "FindingBrief",
    "JobClock",
    "JobCollectives",
    "JobFinding",
    "JobInfo",
    "JobResult",
    "PerStep",
    "Rank",
    "RankArrival",
    "RankCollectives",
    "RankResult",
    "RankStep",
    "Straggler",
    "TopFinding",
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


class Collective(Model, frozen=True):
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


class FindingBrief(Model, frozen=True):
    """What a rank's worker keeps of one of its findings (:class:`RankResult`)."""

    rule: str
    severity: str
    title: str
    savings_ns: int
    minor: bool
    #: The line it points at (``train.py:42``), when the trace says.
    source: str | None = None


class RankResult(Model, frozen=True):
    """What a rank's worker returns (a few kilobytes): the rank's entry in the job (:class:`Rank`,
    made once there; its ``collectives`` are filled in by :func:`traceinsight.job.combine`, which
    needs every rank for them), and what the combine needs besides from the rank's own analysis.
    Not part of the JSON; a live :class:`JobResult` keeps them for the gate."""

    entry: Rank
    world_size: int | None
    backend: str | None
    #: The rank's steady state, over every device (:func:`~traceinsight.analysis.usage.total_usage`).
    usage: Usage
    #: Host blocking calls inside the steady state.
    steady_syncs: int
    #: Every finding of the rank's own ``analyze``, minor ones too, ranked by saving.
    findings: tuple[FindingBrief, ...]
    #: The rank's collectives in order: GPU communication kernels, else host ``c10d::`` operators.
    collectives: tuple[Collective, ...]
    #: ``gpu`` (communication kernels) or ``host`` (``c10d::`` operators) or ``none``.
    collectives_from: str
    #: This rank's own reports, staged by the worker: (file name, staged path) pairs.
    staged: tuple[tuple[str, str], ...] = ()
    #: Its steady steps on the GPU's clock, on the collectives' clock: (step number, begin, done).
    #: Without steps, the steady windows, numbered -1.
    steps_ns: tuple[tuple[int, int, int], ...] = ()

    @property
    def rank(self) -> int:
        """The rank (:attr:`Rank.rank`)."""
        return self.entry.rank

    @property
    def path(self) -> str:
        """The trace's path as the user gave it."""
        return self.entry.path

    @property
    def step_ns(self) -> int | None:
        """Median steady step time (None without steps)."""
        return self.entry.step_time_ns

    @property
    def steps(self) -> int:
        """Steady steps (0 without steps)."""
        return self.entry.steps

    @property
    def name(self) -> str:
        """The trace file's name."""
        return Path(self.path).name

    def per_step(self, ns: int) -> int:
        """``ns`` per steady step, or ``ns`` itself without steps."""
        return self.entry.per_step_of(ns)

    @property
    def syncs_per_step(self) -> float | None:
        """Host blocking calls per steady step, unrounded (None without steps)."""
        return self.steady_syncs / self.steps if self.steps else None


# --- the job's result, as its JSON says it --------------------------------------------------------


class JobClock(Model, frozen=True, kw_only=True):
    """How the ranks' clocks were aligned on their collectives' ends (:mod:`traceinsight.job.combine`)."""

    aligned_ranks: int = field(default=0, metadata={"check": "count"})
    #: The largest distance of an aligned rank's collective end from the collective's median end
    #: once shifted (null: nothing aligned).
    residual_ns: int | None = None
    #: A rank is aligned when every end lies this close once shifted.
    tolerance_ns: int = 0


class RankArrival(Model, frozen=True, kw_only=True):
    """A rank's arrival at a collective after the first rank's (JSON ``[rank, after_first_us]``)."""

    JSON_ARRAY: ClassVar[bool] = True
    rank: int
    after_first_ns: int


class Arrival(Model, frozen=True, kw_only=True):
    """One collective's arrivals across ranks, on the aligned clock (the arrivals chart)."""

    #: ``AllReduce``, ``SendRecv``, ``c10d::allreduce_``…
    kind: str
    #: The step it ran in on its last rank (null: outside the steady steps).
    step: int | None
    #: The rank that arrived last (the lowest on a tie).
    last_rank: int
    #: By rank.
    arrivals: tuple[RankArrival, ...] = ()

    def after_first_ns(self, rank: int) -> int | None:
        """When ``rank`` arrived after the first rank (None: not among the arrivals)."""
        return next((entry.after_first_ns for entry in self.arrivals if entry.rank == rank), None)


class JobCollectives(Model, frozen=True, kw_only=True):
    """How the ranks' collectives were matched across ranks."""

    #: ``gpu`` (communication kernels), ``host`` (``c10d::`` operators) or ``none``.
    source: str = field(metadata={"key": "from"})
    matched: int = field(metadata={"check": "count"})
    #: Of those, matched by process group and sequence number (the rest by kind and order).
    matched_by_seq: int = field(default=0, metadata={"check": "count"})
    #: Matched collectives by kind, the most first.
    kinds: dict[str, int] = field(default_factory=dict)
    #: Whether collectives' time is split into wait and transfer: false with one rank, or where no
    #: rank's collectives end with the others' (its clock cannot be aligned).
    split: bool = False
    clock: JobClock = field(default_factory=JobClock)
    #: The first :data:`ARRIVALS_SHOWN` matched collectives' arrivals, in order (the page's chart).
    arrivals: tuple[Arrival, ...] = ()


class JobInfo(Model, frozen=True, kw_only=True):
    """The job as a whole."""

    ranks: int = field(metadata={"check": "count"})
    #: The first rank's that says (null: none does).
    world_size: int | None
    backend: str | None
    step_time_ns: int | None = field(metadata={"check": "duration"})
    #: What ``step_time`` is: the median over ranks of each rank's median steady step.
    step_time_statistic: str = "median over ranks (lower middle) of each rank's median step"
    #: The slowest rank's median steady step: what sets the job's pace.
    slowest_step_time_ns: int | None = None
    slowest_rank: int | None = None
    #: ``ranks``, or ``cycles`` when the files are one process's profiler cycles (``cycles_of``
    #: names the process; ``ranks[]`` are then the cycles in time order): no collectives are
    #: matched and no straggler is named.
    read_as: str = "ranks"
    cycles_of: str | None = None
    collectives: JobCollectives


class PerStep(Model, frozen=True, kw_only=True):
    """A rank's time per steady step (in all, without steps)."""

    compute_ns: int = field(metadata={"key": "compute"})
    #: Communication kernel time (union), overlapped by compute or not.
    communication_ns: int = field(metadata={"key": "communication"})
    communication_exposed_ns: int = field(metadata={"key": "communication_exposed"})
    copy_exposed_ns: int = field(metadata={"key": "copy_exposed"})
    idle_ns: int = field(metadata={"key": "idle"})
    idle_by_cause_ns: dict[str, int] = field(
        default_factory=dict, metadata={"key": "idle_by_cause", "check": "id"}
    )


class RankStep(Model, frozen=True, kw_only=True):
    """A rank's time in collectives in one of its steady steps, split (see :mod:`traceinsight.job.combine`)."""

    #: ``ProfilerStep#N``'s N (-1: the steady window of a trace without steps).
    step: int
    #: Waiting in collectives for the last rank to arrive.
    wait_ns: int
    #: In collectives after the last rank arrived.
    transfer_ns: int
    #: The rank it waited for longest in this step (null: it waited for nobody), and how long.
    waited_for: int | None = None
    waited_for_ns: int = 0


class RankCollectives(Model, frozen=True, kw_only=True):
    """A rank in the job's matched collectives."""

    #: ``gpu`` (communication kernels), ``host`` (``c10d::`` operators) or ``none``: the rank's own.
    source: str = field(metadata={"key": "from"})
    #: Collectives of this rank matched with the other ranks' (every other rank's when matched by
    #: order; the other members of its process group when matched by group and sequence number).
    matched: int
    late_median_ns: int
    late_max_ns: int
    #: Time this rank spent in collectives waiting for the last rank to arrive (summed).
    waited_ns: int
    #: Time the other ranks spent waiting for this rank, in collectives it arrived at last.
    others_waited_ns: int
    #: In its steady steps: waiting for the last rank (within each kernel), the transfer after,
    #: and of each the part with no compute under it.
    wait_ns: int = 0
    transfer_ns: int = 0
    exposed_wait_ns: int = 0
    exposed_transfer_ns: int = 0
    #: The rank it waited for longest in its steady steps, and how long.
    waited_for: int | None = None
    waited_for_ns: int = 0
    #: Subtracted from its times to put them on the job's clock (0 where not aligned); whether its
    #: collectives' ends agreed with the others' once shifted by it.
    clock_offset_ns: int = 0
    clock_aligned: bool = False
    #: Per steady step, in order.
    per_step: tuple[RankStep, ...] = ()
    #: Over the collectives it came last to in the steady steps: the mean wait of the other members
    #: for it, summed (what each other rank would save if it had kept pace).
    others_mean_wait_ns: int = 0


class TopFinding(Model, frozen=True, kw_only=True):
    """A rank's first finding that is not minor."""

    rule: str = field(metadata={"check": "id"})
    title: str
    #: Over the rank's whole steady state (JSON ``savings_us``).
    savings_total_ns: int = field(metadata={"key": "savings_us"})


class Rank(Model, frozen=True, kw_only=True):
    """One rank's figures: the same numbers its own ``analyze`` shows, and its collectives."""

    rank: int
    #: Where the rank number came from: ``distributedInfo``, ``file name`` or ``order``.
    rank_from: str
    #: The trace's path as the user gave it (control characters replaced).
    path: str
    #: Steady steps (0 without steps).
    steps: int = field(metadata={"check": "count"})
    #: Median steady step time: the spacing of when the steps' work was done (null without steps).
    step_time_ns: int | None
    utilization: Utilization
    per_step: PerStep = field(metadata={"key": "per_step_us"})
    #: Host blocking calls per steady step (null without steps).
    syncs_per_step: float | None
    collectives: RankCollectives | None
    top_finding: TopFinding | None
    warnings: tuple[str, ...] = ()
    #: The GPU's busy time in the steady state (compute, exposed communication, exposed copies;
    #: ``utilization.busy_share`` is it over ``utilization.window_us``, rounded): null in a result
    #: written before it was kept.
    busy_ns: int | None = None

    def per_step_of(self, ns: int) -> int:
        """``ns`` per steady step (rounded), or ``ns`` itself without steps."""
        return round(ns / self.steps) if self.steps else ns

    @property
    def busy_share(self) -> float | None:
        """The GPU's busy share of the steady window, unrounded where the result keeps ``busy``."""
        window = self.utilization.window_ns
        if not window:
            return None
        return self.busy_ns / window if self.busy_ns is not None else self.utilization.busy_share

    @property
    def largest_idle(self) -> tuple[str, int] | None:
        """The first idle cause (largest first) with any time in the steady state, and that time."""
        return next(((cause, ns) for cause, ns in self.utilization.idle_by_cause_ns.items() if ns), None)


class Straggler(Model, frozen=True, kw_only=True):
    """A rank that holds the others back, and why."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "rank", "reasons", "cause", "cause_words", "cause_excess_per_step_ns", "others_waited_ns", "top_finding",
        "top_finding_rule", "top_finding_source", "waits_caused_per_step_ns", "steps",
    )  # fmt: skip
    rank: int
    #: What is out of line, in plain words (``collectives start 80.0 ms late (median)``).
    reasons: tuple[str, ...] = ()
    #: ``CauseKind`` value (or ``compute``) whose time per step grew most over the job's median.
    cause: str | None
    #: How much more of that per step than the job's median rank.
    cause_excess_per_step_ns: int
    #: Time the other ranks waited for this rank in collectives (summed).
    others_waited_ns: int
    #: Its top finding's title: its own finding of its cause where it has one.
    top_finding: str | None
    top_finding_rule: str | None = None
    #: The line its top finding points at.
    top_finding_source: str | None = None
    #: What each other rank would save per step if it kept pace: the others' mean wait for it per
    #: step (:attr:`RankCollectives.others_mean_wait_ns` per step).
    waits_caused_per_step_ns: int = 0
    #: Its steady steps (the wait may be a one-off when there is one).
    steps: int = 0

    @property
    def cause_words(self) -> str:
        """The cause as the report names it."""
        return CAUSE_WORDS.get(self.cause, self.cause) if self.cause is not None else "no single cause"


class JobFinding(Model, frozen=True, kw_only=True):
    """One rule's findings over the ranks: reported once, with the ranks it fired on."""

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
    #: The worst over the ranks it fired on.
    severity: Severity
    #: The title on the rank where the saving is largest.
    title: str
    ranks: tuple[int, ...]
    #: Summed over the ranks' whole steady states (JSON ``savings_us``; per step is
    #: :attr:`savings_per_step_ns`).
    savings_total_ns: int = field(metadata={"key": "savings_us"})
    #: Per steady step, the median rank's (the lower middle of the ranks it fired on).
    savings_per_step_ns: int = 0
    #: Per steady step, summed over the ranks it fired on (what the job as a whole would free in
    #: one step, counted once per rank's GPU).
    savings_per_step_all_ranks_ns: int = 0
    minor: bool = False
    #: The straggler whose own cause this finding is (such findings lead the job's).
    straggler: int | None = None
    #: With ``straggler``: what every other rank saves per step if it kept pace.
    job_savings_per_step_ns: int = 0
    #: The line the finding points at on the rank where the saving is largest (the straggler's).
    source: str | None = None
    #: How the job view changed the ranks' finding (``exposed-communication``: transfer only).
    note: str | None = None

    @property
    def rank_count(self) -> int:
        """On how many ranks the rule fired."""
        return len(self.ranks)


class JobResult(Model, frozen=True, kw_only=True):
    """A distributed job's result, as ``analyze --json`` writes it for several traces (see the
    module doc). :meth:`to_json` writes it, :meth:`from_json` reads it back."""

    KIND: ClassVar[str] = "job"
    schema: int = SCHEMA_VERSION
    kind: str = "job"
    tool: Tool = field(default_factory=Tool)
    job: JobInfo
    warnings: tuple[str, ...] = ()
    #: By rank.
    ranks: tuple[Rank, ...] = ()
    #: The most waited-for first.
    stragglers: tuple[Straggler, ...] = ()
    #: The stragglers' own causes first, then by ranks and saving.
    findings: tuple[JobFinding, ...] = ()
    #: What each rank's worker returned, by rank (a live result only; empty for a stored one): the
    #: gate holds each rank to the budgets with its every finding, ``--per-rank`` finds the staged
    #: reports. No renderer reads it.
    rank_results: tuple[RankResult, ...] = field(
        default=(), compare=False, repr=False, metadata={"local": True}
    )
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata={"local": True})

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
    def cycles(self) -> bool:
        """Whether the "ranks" are one process's profiler cycles (``job.read_as``)."""
        return self.job.read_as == "cycles"

    @property
    def charts(self) -> Mapping[str, object]:
        """The job page's chart as a matplotlib Figure (``arrivals``: each collective's arrivals
        across ranks), drawn on each call; empty without matched collectives."""
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
