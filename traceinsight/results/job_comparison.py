"""Did the fix work on the whole job? Two jobs' results compared: the job as a whole, each rank,
the stragglers gone / new / still there, the findings fixed / new / still there.

Both sides are :class:`~.job.JobResult` objects: a job analyzed (a folder, a pattern), or a job's
result ``analyze --json`` wrote, read back under the checks of :mod:`.stored`; the comparison reads
only what the job's JSON holds, so a stored baseline gives the same comparison as its traces.

The job view's unit throughout: a rank's figures are per steady step (in all for a rank without
steps), in microseconds as the JSON writes them (:func:`.codec.us`). The whole job is its median
step (the job view's: the lower middle of the ranks' steps) and its slowest rank's, the ranks'
mean of every other figure (so that they add up: busy and idle shares, compute, communication,
idle by cause), the latest rank's lateness, and the collective waits summed over the ranks (what
a straggler costs the others). Ranks are matched by rank number; a
rank on one side only is listed as such. Stragglers are matched by rank, findings by rule id (a
job reports each rule once), with the saving per step of the median rank it fired on and the sum
over those ranks. :class:`JobComparison` is itself a result: ``diff --json`` writes its
:meth:`~JobComparison.to_json`, whose ``kind`` is ``job-diff``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import median_low
from typing import TYPE_CHECKING, ClassVar

from traceinsight.model import Model, field, replace
from traceinsight.results.codec import document_of, us
from traceinsight.results.comparison import DiffTool, Metric, text
from traceinsight.results.frames import comparison_frames
from traceinsight.results.job import CAUSE_WORDS, JobFinding, JobResult, Rank, Straggler
from traceinsight.results.noise import HOST_RUN_SPREAD, NO_CHANGE_MARGIN, estimate, step_verdict
from traceinsight.results.stored import from_text
from traceinsight.results.trace import SCHEMA_VERSION
from traceinsight.results.writer import strict_json
from traceinsight.rules.findings import Severity
from traceinsight.shown import html_of

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "JobComparison",
    "JobFindingChange",
    "RankChange",
    "StragglerChange",
    "compare_jobs",
]

_ORDER = {"gone": 0, "fixed": 0, "new": 1, "still": 2}


class RankChange(Model, frozen=True, kw_only=True):
    """One rank (by rank number) before and after: its figures per steady step."""

    #: The metrics a stored rank's change must hold: the rank table's columns.
    REQUIRED_METRICS: ClassVar[tuple[str, ...]] = (
        "step_time", "busy_share", "idle", "communication_exposed", "syncs_per_step", "late_median", "waited",
    )  # fmt: skip
    rank: int
    #: ``both``, or ``before`` / ``after`` for a rank in that job only.
    present: str = field(metadata={"check": "id"})
    #: The rank's trace on each side (None where it is not there).
    before_path: str | None
    after_path: str | None
    #: ``step_time``, ``busy_share``, ``compute``, ``communication``, ``communication_exposed``,
    #: ``idle``, ``syncs_per_step``, ``late_median``, ``waited``, ``others_waited`` (times per
    #: steady step but the lateness, the median over its collectives).
    metrics: tuple[Metric, ...]
    #: The rule id of the rank's top finding on each side.
    before_top_finding: str | None = None
    after_top_finding: str | None = None

    def metric(self, key: str) -> Metric:
        """The metric named ``key``."""
        return next(metric for metric in self.metrics if metric.key == key)


class StragglerChange(Model, frozen=True, kw_only=True):
    """A rank named a straggler on either side."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "status", "rank", "before_cause", "after_cause", "before_cause_words", "after_cause_words",
        "before_cause_excess_per_step_us", "after_cause_excess_per_step_us", "before_others_waited_us",
        "after_others_waited_us", "reasons",
    )  # fmt: skip
    #: ``gone`` (a straggler before only), ``new`` (after only) or ``still`` (both).
    status: str = field(metadata={"check": "id"})
    rank: int
    #: The cause on each side (a ``CauseKind`` value or ``compute``; None: not a straggler there,
    #: or no single cause).
    before_cause: str | None = field(metadata={"check": "id"})
    after_cause: str | None = field(metadata={"check": "id"})
    #: How much more of its cause per step than the job's median rank, µs.
    before_cause_excess_per_step_us: float | None
    after_cause_excess_per_step_us: float | None
    #: The other ranks' wait for it in collectives (summed), µs.
    before_others_waited_us: float | None
    after_others_waited_us: float | None
    #: Why it is slow, the latest side's words.
    reasons: tuple[str, ...] = ()

    @property
    def before_cause_words(self) -> str | None:
        """The cause before, as the job report names it (None: not a straggler before)."""
        return _cause_words(self.before_cause) if self.status != "new" else None

    @property
    def after_cause_words(self) -> str | None:
        """The cause after, as the job report names it (None: not a straggler after)."""
        return _cause_words(self.after_cause) if self.status != "gone" else None


def _cause_words(cause: str | None) -> str:
    return CAUSE_WORDS.get(cause, cause) if cause is not None else "no single cause"


class JobFindingChange(Model, frozen=True, kw_only=True):
    """A rule's findings over the ranks, before and after (a job reports each rule once)."""

    #: ``fixed`` (before only), ``new`` (after only) or ``still`` (both).
    status: str = field(metadata={"check": "id"})
    rule: str = field(metadata={"check": "id"})
    #: The latest side's title and severity; minor when minor on every rank of the latest side.
    title: str
    severity: Severity
    minor: bool
    #: The ranks it fired on, each side.
    before_ranks: tuple[int, ...]
    after_ranks: tuple[int, ...]
    #: Saving per steady step of the median rank it fired on, µs (None: not there).
    before_saving_us: float | None = field(metadata={"key": "before_savings_per_step_us"})
    after_saving_us: float | None = field(metadata={"key": "after_savings_per_step_us"})
    #: Saving per steady step summed over the ranks it fired on, µs.
    before_saving_all_ranks_us: float | None = field(metadata={"key": "before_savings_per_step_all_ranks_us"})
    after_saving_all_ranks_us: float | None = field(metadata={"key": "after_savings_per_step_all_ranks_us"})


class JobComparison(Model, frozen=True, kw_only=True):
    """Everything ``traceinsight diff`` shows of two jobs."""

    KIND: ClassVar[str] = "job-diff"
    #: The job metric a stored comparison of two jobs must hold (the page and the gate read it).
    REQUIRED_METRICS: ClassVar[tuple[str, ...]] = ("step_time",)
    schema: int = SCHEMA_VERSION
    #: ``job-diff``: a diff of two jobs (``tool.kind`` is ``diff`` as for two traces).
    kind: str = "job-diff"
    tool: DiffTool = field(default_factory=DiffTool)
    before: str
    after: str
    #: Always ``per step`` (a rank without steps: in all), the job view's unit.
    basis: str = "per step"
    #: What differs between the jobs beyond the code (ranks, world size, backend, steps), in words.
    notes: tuple[str, ...]
    #: The job as a whole (see the module doc).
    metrics: tuple[Metric, ...]
    #: Idle per step by cause, the mean over the ranks.
    idle: tuple[Metric, ...] = field(metadata={"key": "idle_by_cause"})
    #: Every rank of either job, by rank number.
    ranks: tuple[RankChange, ...]
    stragglers: tuple[StragglerChange, ...]
    findings: tuple[JobFindingChange, ...]

    @property
    def headline(self) -> str:
        """The job's step-time verdict first: ``step time: cannot tell, −18.9% to +23.4% (95%):
        the run-to-run spread alone (a job's result keeps no per-step figures)``; empty when not judged."""
        step = next((metric for metric in self.metrics if metric.key == "step_time"), None)
        if step is None or step.verdict is None:
            return ""
        return (
            f"step time: {step.verdict}, {step.interval_text()} (95%): the run-to-run spread alone "
            "(a job's result keeps no per-step figures, so the interval is a lower bound)"
        )

    def to_json(self) -> str:
        """The comparison as ``diff --json`` writes it."""
        return strict_json(document_of(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> JobComparison:
        """A comparison of two jobs from its JSON (what ``diff --json`` wrote), read as untrusted input."""
        return from_text(text, cls)

    def _repr_html_(self) -> str | None:
        return html_of(self)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.before!r} -> {self.after!r}, {len(self.findings)} findings)"

    @property
    def frames(self) -> dict[str, pl.DataFrame]:
        """The comparison's tables as polars DataFrames (see :mod:`.frames`), made on each call."""
        return comparison_frames(self)

    @property
    def shown(self) -> tuple[Metric, ...]:
        """The job's metrics and idle causes with a value on either side."""
        return tuple(m for m in (*self.metrics, *self.idle) if m.before is not None or m.after is not None)

    def metric(self, key: str) -> Metric:
        """The job metric named ``key``."""
        return next(metric for metric in (*self.metrics, *self.idle) if metric.key == key)

    def rank(self, rank: int) -> RankChange:
        """The rank numbered ``rank``."""
        return next(change for change in self.ranks if change.rank == rank)

    @property
    def changed_ranks(self) -> tuple[RankChange, ...]:
        """Ranks on one side only first, then by how much their step time changed, most first."""

        def moved(change: RankChange) -> float:
            step = change.metric("step_time").change
            return -abs(step) if step is not None else 0.0

        return tuple(sorted(self.ranks, key=lambda c: (c.present == "both", moved(c), c.rank)))


# --- figures of one rank and of the job --------------------------------------------------------


def _per_step(rank: Rank, ns: int) -> float:
    """``ns`` per steady step of ``rank`` in µs (in all without steps)."""
    return us(ns / rank.steps) if rank.steps else us(ns)


def _rank_figures(rank: Rank) -> dict[str, float | None]:
    """The rank's figures by metric key (see :class:`RankChange`), µs per steady step."""
    timing = rank.collectives
    per = rank.per_step
    gpu = rank.utilization.window_ns is not None
    return {
        "step_time": us(rank.step_time_ns) if rank.step_time_ns is not None else None,
        "busy_share": rank.utilization.busy_share,
        "idle_share": rank.utilization.idle_share,
        "compute": us(per.compute_ns) if gpu else None,
        "communication": us(per.communication_ns) if gpu else None,
        "communication_exposed": us(per.communication_exposed_ns) if gpu else None,
        "idle": us(per.idle_ns) if gpu else None,
        "syncs_per_step": rank.syncs_per_step,
        "late_median": us(timing.late_median_ns) if timing is not None else None,
        "waited": _per_step(rank, timing.waited_ns) if timing is not None else None,
        "others_waited": _per_step(rank, timing.others_waited_ns) if timing is not None else None,
    }


#: A rank's metrics: key, label, unit.
_RANK_METRICS: tuple[tuple[str, str, str], ...] = (
    ("step_time", "step time", "us"),
    ("busy_share", "GPU busy", "share"),
    ("compute", "compute", "us"),
    ("communication", "communication", "us"),
    ("communication_exposed", "communication exposed", "us"),
    ("idle", "GPU idle", "us"),
    ("syncs_per_step", "host syncs per step", "count"),
    ("late_median", "late in collectives (median)", "us"),
    ("waited", "waited in collectives", "us"),
    ("others_waited", "others waited for it", "us"),
)


def _middle(values: Sequence[float | None]) -> float | None:
    """The lower middle of the values there are (None when none is)."""
    known = [value for value in values if value is not None]
    return median_low(known) if known else None


def _mean(values: Sequence[float | None], digits: int = 3) -> float | None:
    """The mean of the values there are, rounded as the JSON writes them (None when none is)."""
    known = [value for value in values if value is not None]
    return round(sum(known) / len(known), digits) if known else None


def _job_figures(job: JobResult) -> dict[str, float | None]:
    """The job's figures by metric key (see the module doc)."""
    figures = [_rank_figures(rank) for rank in job.ranks]

    def mean(key: str, digits: int = 3) -> float | None:
        return _mean([each[key] for each in figures], digits)

    steps = [each["step_time"] for each in figures if each["step_time"] is not None]
    lateness = [each["late_median"] for each in figures if each["late_median"] is not None]
    waits = [each["waited"] for each in figures if each["waited"] is not None]
    return {
        "ranks": float(len(job.ranks)),
        "step_time": us(job.job.step_time_ns) if job.job.step_time_ns is not None else None,
        "slowest_step": max(steps) if steps else None,
        "busy_share": mean("busy_share", 4),
        "idle_share": mean("idle_share", 4),
        "compute": mean("compute"),
        "communication": mean("communication"),
        "communication_exposed": mean("communication_exposed"),
        "idle": mean("idle"),
        "syncs_per_step": mean("syncs_per_step", 4),
        "late_latest": max(lateness) if lateness else None,
        "waited_all_ranks": round(sum(waits), 3) if waits else None,
        "stragglers": float(len(job.stragglers)),
    }


#: The job's metrics: key, label, unit.
_JOB_METRICS: tuple[tuple[str, str, str], ...] = (
    ("ranks", "ranks", "count"),
    ("step_time", "median step time", "us"),
    ("slowest_step", "slowest rank's step time", "us"),
    ("busy_share", "GPU busy (mean rank)", "share"),
    ("idle_share", "GPU idle (mean rank)", "share"),
    ("compute", "compute (mean rank)", "us"),
    ("communication", "communication (mean rank)", "us"),
    ("communication_exposed", "communication exposed (mean rank)", "us"),
    ("idle", "GPU idle time (mean rank)", "us"),
    ("syncs_per_step", "host syncs per step (mean rank)", "count"),
    ("late_latest", "latest rank's lateness in collectives (median)", "us"),
    ("waited_all_ranks", "waited in collectives, summed over ranks", "us"),
    ("stragglers", "stragglers", "count"),
)


def _metrics(
    names: Sequence[tuple[str, str, str]], before: dict[str, float | None], after: dict[str, float | None]
) -> tuple[Metric, ...]:
    return tuple(Metric(key, label, unit, before.get(key), after.get(key)) for key, label, unit in names)


def _idle_by_cause(before: JobResult, after: JobResult) -> tuple[Metric, ...]:
    """Idle per step by cause: the mean over each job's ranks (0 where a rank has none), so that
    the causes add up to the idle time beside them; causes 0 on both sides are left out."""

    def by_cause(job: JobResult) -> dict[str, float]:
        causes = dict.fromkeys(cause for rank in job.ranks for cause in rank.per_step.idle_by_cause_ns)
        return {
            cause: _mean([us(rank.per_step.idle_by_cause_ns.get(cause, 0)) for rank in job.ranks]) or 0.0
            for cause in causes
        }

    was, now = by_cause(before), by_cause(after)
    return tuple(
        Metric(f"idle:{text(cause)}", text(cause), "us", was.get(cause, 0.0), now.get(cause, 0.0))
        for cause in dict.fromkeys([*was, *now])
        if was.get(cause) or now.get(cause)
    )


def _rank_changes(before: JobResult, after: JobResult) -> tuple[RankChange, ...]:
    was = {rank.rank: rank for rank in before.ranks}
    now = {rank.rank: rank for rank in after.ranks}
    changes = []
    for number in sorted({*was, *now}):
        one, two = was.get(number), now.get(number)
        changes.append(
            RankChange(
                rank=number,
                present="both" if one is not None and two is not None else "before" if one else "after",
                before_path=text(one.path) if one is not None else None,
                after_path=text(two.path) if two is not None else None,
                metrics=_metrics(
                    _RANK_METRICS,
                    _rank_figures(one) if one is not None else {},
                    _rank_figures(two) if two is not None else {},
                ),
                before_top_finding=one.top_finding.rule if one is not None and one.top_finding else None,
                after_top_finding=two.top_finding.rule if two is not None and two.top_finding else None,
            )
        )
    return tuple(changes)


def _straggler_changes(before: JobResult, after: JobResult) -> tuple[StragglerChange, ...]:
    was = {entry.rank: entry for entry in before.stragglers}
    now = {entry.rank: entry for entry in after.stragglers}

    def excess(entry: Straggler | None) -> float | None:
        return us(entry.cause_excess_per_step_ns) if entry is not None else None

    def waited(entry: Straggler | None) -> float | None:
        return us(entry.others_waited_ns) if entry is not None else None

    changes = []
    for number in dict.fromkeys([*was, *now]):
        one, two = was.get(number), now.get(number)
        latest = two if two is not None else one
        assert latest is not None
        changes.append(
            StragglerChange(
                status="still" if one is not None and two is not None else "gone" if one else "new",
                rank=number,
                before_cause=one.cause if one is not None else None,
                after_cause=two.cause if two is not None else None,
                before_cause_excess_per_step_us=excess(one),
                after_cause_excess_per_step_us=excess(two),
                before_others_waited_us=waited(one),
                after_others_waited_us=waited(two),
                reasons=tuple(text(reason) for reason in latest.reasons),
            )
        )
    changes.sort(key=lambda change: (_ORDER[change.status], change.rank))
    return tuple(changes)


def _finding_changes(before: JobResult, after: JobResult) -> tuple[JobFindingChange, ...]:
    was = {text(entry.rule): entry for entry in before.findings}
    now = {text(entry.rule): entry for entry in after.findings}

    def saving(entry: JobFinding | None, of: Callable[[JobFinding], int]) -> float | None:
        return us(of(entry)) if entry is not None else None

    changes = []
    for rule in dict.fromkeys([*was, *now]):
        one, two = was.get(rule), now.get(rule)
        latest = two if two is not None else one
        assert latest is not None
        changes.append(
            JobFindingChange(
                status="still" if one is not None and two is not None else "fixed" if one else "new",
                rule=rule,
                title=text(latest.title),
                severity=latest.severity,
                minor=latest.minor,
                before_ranks=one.ranks if one is not None else (),
                after_ranks=two.ranks if two is not None else (),
                before_saving_us=saving(one, lambda entry: entry.savings_per_step_ns),
                after_saving_us=saving(two, lambda entry: entry.savings_per_step_ns),
                before_saving_all_ranks_us=saving(one, lambda entry: entry.savings_per_step_all_ranks_ns),
                after_saving_all_ranks_us=saving(two, lambda entry: entry.savings_per_step_all_ranks_ns),
            )
        )
    changes.sort(
        key=lambda change: (
            _ORDER[change.status],
            change.minor,
            -(change.before_saving_us or change.after_saving_us or 0.0),
            change.rule,
        )
    )
    return tuple(changes)


def _notes(before: JobResult, after: JobResult) -> list[str]:
    notes = []
    one, two = before.job, after.job
    if one.read_as != two.read_as:
        notes.append(f"one job is read as {one.read_as}, the other as {two.read_as}")
    if len(before.ranks) != len(after.ranks):
        notes.append(f"the rank counts differ: {len(before.ranks)} before, {len(after.ranks)} after")
    if one.world_size != two.world_size and one.world_size is not None and two.world_size is not None:
        notes.append(f"the world sizes differ: {one.world_size} before, {two.world_size} after")
    if one.backend and two.backend and one.backend != two.backend:
        notes.append(f"the backends differ: {text(one.backend)} before, {text(two.backend)} after")
    was = {rank.rank for rank in before.ranks}
    now = {rank.rank for rank in after.ranks}
    for ranks, where in ((sorted(was - now), "before"), (sorted(now - was), "after")):
        if ranks:
            listed = ", ".join(map(str, ranks[:10])) + (
                f" and {len(ranks) - 10} more" if len(ranks) > 10 else ""
            )
            notes.append(f"{'rank' if len(ranks) == 1 else 'ranks'} {listed} only {where}")
    steps_before = _middle([float(rank.steps) for rank in before.ranks])
    steps_after = _middle([float(rank.steps) for rank in after.ranks])
    if steps_before != steps_after:
        notes.append(
            f"the steady step counts differ: {steps_before or 0:g} before, {steps_after or 0:g} after "
            "(median rank)"
        )
    return notes


def compare_jobs(before: JobResult, after: JobResult, before_label: str, after_label: str) -> JobComparison:
    """Compare two jobs' results: see the module doc."""
    return JobComparison(
        before=before_label,
        after=after_label,
        notes=tuple(_notes(before, after)),
        metrics=tuple(
            _judged_step(metric)
            for metric in _metrics(_JOB_METRICS, _job_figures(before), _job_figures(after))
        ),
        idle=_idle_by_cause(before, after),
        ranks=_rank_changes(before, after),
        stragglers=_straggler_changes(before, after),
        findings=_finding_changes(before, after),
    )


def _judged_step(metric: Metric) -> Metric:
    """The job's median step time judged against run-to-run variation alone (a job's result keeps
    no per-step figures): its interval is the change ± what one run of each side may differ by
    (:data:`~.noise.HOST_RUN_SPREAD`), a lower bound on its width; other metrics as they are."""
    if metric.key != "step_time" or metric.before is None or metric.after is None or metric.change is None:
        return metric
    found = estimate(
        [[metric.before]],
        [[metric.after]],
        drawn=([metric.before], [metric.after]),  # one value a side: no resampling can move it
        run_sd_before=HOST_RUN_SPREAD * metric.before,
        run_sd_after=HOST_RUN_SPREAD * metric.after,
        margin=NO_CHANGE_MARGIN * metric.before,
    )
    if found is None:
        return metric
    verdict = step_verdict(found.verdict)
    return replace(
        metric,
        lower=round(found.lower, 3),
        upper=round(found.upper, 3),
        relative_lower=None if found.relative_lower is None else round(found.relative_lower, 4),
        relative_upper=None if found.relative_upper is None else round(found.relative_upper, 4),
        verdict=verdict,
    )
