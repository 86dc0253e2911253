"""Did the fix work? Two results compared: step time, where the GPU time goes, syncs, copies,
communication, findings fixed / new / still present, and the kernels that changed most.

Both sides are :class:`~.trace.Result` objects: a trace analyzed, or a result ``analyze --json``
wrote, read back under the checks of :mod:`.stored` (so a stored baseline works without its
trace). Figures are per steady step when both sides have steps, else over the time analyzed, in
microseconds as the JSON writes them (:func:`.codec.us`). :class:`Comparison` is itself a result:
``diff --json`` writes its :meth:`~Comparison.to_json`, and :meth:`~Comparison.from_json` reads it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from traceinsight.analysis.causes import cause_label
from traceinsight.formatting import format_duration, format_share, source_label
from traceinsight.load.text import clean_text
from traceinsight.results.codec import document_of, us
from traceinsight.results.frames import comparison_frames
from traceinsight.results.stored import from_text
from traceinsight.results.trace import SCHEMA_VERSION, Finding, Result
from traceinsight.results.writer import strict_json
from traceinsight.rules.findings import Severity
from traceinsight.shown import html_of

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "Comparison",
    "DiffTool",
    "FindingChange",
    "KernelChange",
    "Metric",
    "compare",
    "finding_site",
    "syncs_per_step",
]

#: A hyphen used as a sign (before a digit, not inside a word or a number's exponent).
_SIGN = re.compile(r"(?<![\w.])-(?=[\d.])")


@dataclass(frozen=True, slots=True)
class Metric:
    """One figure before and after. ``unit``: ``us`` (per step, or in all), ``share`` (0-1) or ``count``."""

    JSON_KEYS: ClassVar[tuple[str | tuple[str, str], ...]] = (
        "key",
        "label",
        "unit",
        "before",
        "after",
        "change",
        ("written_relative", "relative"),
    )
    key: str
    label: str
    unit: str
    before: float | None
    after: float | None

    @property
    def change(self) -> float | None:
        """after − before (None when either is missing)."""
        return None if self.before is None or self.after is None else self.after - self.before

    @property
    def relative(self) -> float | None:
        """The change as a share of before (None when before is 0 or missing)."""
        change = self.change
        return None if change is None or not self.before else change / self.before

    @property
    def written_relative(self) -> float | None:
        """:attr:`relative` as the JSON writes it (4 decimals)."""
        relative = self.relative
        return None if relative is None else round(relative, 4)

    @property
    def title(self) -> str:
        """The row's name in every view (an idle cause in words, never its key)."""
        return f"idle: {cause_label(self.label)}" if self.key.startswith("idle:") else self.label

    def text(self, value: float | None) -> str:
        """``value`` (``before`` or ``after``) written in the metric's unit, as every view shows it."""
        if value is None:
            return "—"
        if self.unit == "us":
            return format_duration(value * 1000)
        if self.unit == "share":
            return format_share(value)
        return f"{value:.3g}"

    def change_text(self) -> str:
        """after − before in the metric's unit (points for shares, % too for times)."""
        change = self.change
        if change is None:
            return "—"
        if self.unit == "share":
            return _minus(f"{change * 100:+.1f} pts")
        if self.unit == "us":
            relative = f" ({self.relative * 100:+.1f}%)" if self.relative is not None else ""
            return _minus(f"{'+' if change >= 0 else '-'}{format_duration(abs(change) * 1000)}{relative}")
        return _minus(f"{change:+.3g}")


def _minus(text: str) -> str:
    """``text`` with each sign written as a minus sign (−), as the change of a time was: one sign
    for every change, not a hyphen beside it."""
    return _SIGN.sub("−", text)


@dataclass(frozen=True, slots=True, kw_only=True)
class FindingChange:
    """A finding matched by rule and site across the two sides."""

    #: ``fixed`` (before only), ``new`` (after only) or ``still`` (both).
    status: str = field(metadata={"check": "id"})
    rule: str = field(metadata={"check": "id"})
    #: What the sides are matched on: the source's ``file:line``, else the operator, else the GPU.
    site: str
    #: The site as the report writes it: a line that is not the call's is named as what it is
    #: ("`main` (recorded from train.py:21)"); else ``site``.
    site_label: str = ""
    title: str
    severity: Severity
    #: The finding's saving on the comparison's basis (per step when both sides have steps), µs.
    before_saving_us: float | None = field(metadata={"key": "before_savings_us"})
    after_saving_us: float | None = field(metadata={"key": "after_savings_us"})

    @property
    def shown_site(self) -> str:
        """``site_label`` where there is one, else ``site``."""
        return self.site_label or self.site


@dataclass(frozen=True, slots=True, kw_only=True)
class KernelChange:
    """A kernel (by device and name) whose total time changed."""

    device: int
    name: str
    before_total_us: float
    after_total_us: float
    before_count: int
    after_count: int
    #: Launches on the comparison's basis (per steady step when both sides have steps, like the
    #: times beside them); the counts above are the totals.
    before_launches: float = 0.0
    after_launches: float = 0.0

    @property
    def change_us(self) -> float:
        return self.after_total_us - self.before_total_us


@dataclass(frozen=True, slots=True, kw_only=True)
class DiffTool:
    """What wrote a comparison."""

    name: str = "traceinsight"
    kind: str = "diff"


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """Everything ``traceinsight diff`` shows."""

    KIND: ClassVar[str] = "diff"
    schema: int = SCHEMA_VERSION
    tool: DiffTool = field(default_factory=DiffTool)
    before: str
    after: str
    #: ``per step`` when both sides have steady steps, else ``in all``.
    basis: str
    #: What differs between the runs beyond the code (GPU, step count, torch, schema), in words.
    notes: tuple[str, ...]
    metrics: tuple[Metric, ...]
    #: Idle by cause before and after (per step or in all), causes in either.
    idle: tuple[Metric, ...] = field(metadata={"key": "idle_by_cause"})
    findings: tuple[FindingChange, ...]
    kernels: tuple[KernelChange, ...]

    def to_json(self) -> str:
        """The comparison as ``diff --json`` writes it."""
        return strict_json(document_of(self))

    @classmethod
    def from_json(cls, text: str | bytes) -> Comparison:
        """A comparison from its JSON (what ``diff --json`` wrote), read as untrusted input."""
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
        """The metrics and idle causes with a value on either side (what the renderers list; a run
        without a GPU has no GPU shares)."""
        return tuple(m for m in (*self.metrics, *self.idle) if m.before is not None or m.after is not None)

    def metric(self, key: str) -> Metric:
        """The metric named ``key``."""
        return next(metric for metric in (*self.metrics, *self.idle) if metric.key == key)

    @property
    def fixed(self) -> tuple[FindingChange, ...]:
        return tuple(change for change in self.findings if change.status == "fixed")

    @property
    def new(self) -> tuple[FindingChange, ...]:
        return tuple(change for change in self.findings if change.status == "new")

    @property
    def still(self) -> tuple[FindingChange, ...]:
        return tuple(change for change in self.findings if change.status == "still")


def _steps(result: Result) -> int:
    return result.steady_state.steady_steps


def syncs_per_step(result: Result) -> float | None:
    """Blocking calls per steady step (None without steps)."""
    steps = _steps(result)
    if not steps:
        return None
    return sum(spot.steady_count for spot in result.sync_hotspots) / steps


def _per(result: Result, total_us: float, basis: str) -> float:
    return total_us / _steps(result) if basis == "per step" else total_us


def text(value: object) -> str:
    """A string taken from a result, for display: a stored result is untrusted like a trace, so it
    gets the trace's cleaning (control characters replaced, long strings cut)."""
    return clean_text(str(value))


def finding_site(finding: Finding) -> str:
    """Where a finding is: its source line, else its operator, else its GPU (for matching sides)."""
    if finding.source:
        return text(finding.source)
    if finding.op:
        return text(finding.op)
    if finding.device is not None:
        return f"GPU {finding.device}"
    return ""


def finding_site_label(finding: Finding) -> str:
    """:func:`finding_site` as the report writes it: a source line that is not the call's (a
    ``source_line_kind`` of ``def`` or ``recording-start``) is named as what it is; else the site."""
    site = finding_site(finding)
    line_kind, function = finding.source_line_kind, finding.source_function
    if not finding.source or function is None or line_kind == "call":
        return site
    return source_label(
        site,
        text(finding.source_kind) if finding.source_kind else None,
        text(line_kind) if line_kind else None,
        text(function),
    )


def _notes(before: Result, after: Result) -> list[str]:
    notes = []

    def gpus(result: Result) -> str:
        return ", ".join(sorted(text(d.name) for d in result.devices if d.name)) or "none"

    if gpus(before) != gpus(after):
        notes.append(f"the GPUs differ: {gpus(before)} before, {gpus(after)} after")
    steps_before, steps_after = _steps(before), _steps(after)
    if steps_before != steps_after:
        notes.append(f"the steady step counts differ: {steps_before} before, {steps_after} after")

    def torch(result: Result) -> str | None:
        return None if result.run is None else result.run.torch_version

    versions = [
        (torch(before), torch(after)),
        (before.trace.cuda_runtime_version, after.trace.cuda_runtime_version),
    ]
    for (one, two), what in zip(versions, ("torch", "the CUDA runtime"), strict=True):
        if one and two and one != two:
            notes.append(f"{what} differs: {text(one)} before, {text(two)} after")
    if before.trace.world_size != after.trace.world_size:
        notes.append("the world sizes differ")
    return notes


def compare(before: Result, after: Result, before_label: str, after_label: str, top: int = 10) -> Comparison:
    """Compare two results: see the module doc."""
    basis = "per step" if _steps(before) and _steps(after) else "in all"

    def step_time(result: Result) -> float | None:
        if basis == "per step":
            step = result.steady_state.step_time_ns
            return us(step) if step is not None else None
        return us(result.utilization.window_ns or 0)

    def share(result: Result, key: str) -> float | None:
        value: float | None = getattr(result.utilization, key)
        return value

    def overlap(result: Result, direction: str) -> float | None:
        return result.overlap.get(direction)

    metrics = [
        Metric(
            "step_time",
            "step time" if basis == "per step" else "time analyzed",
            "us",
            step_time(before),
            step_time(after),
        ),
        Metric("busy_share", "GPU busy", "share", share(before, "busy_share"), share(after, "busy_share")),
        Metric(
            "compute_share",
            "GPU computing",
            "share",
            share(before, "compute_share"),
            share(after, "compute_share"),
        ),
        Metric(
            "communication_share",
            "communication",
            "share",
            share(before, "communication_share"),
            share(after, "communication_share"),
        ),
        Metric(
            "copy_share", "copies alone", "share", share(before, "copy_share"), share(after, "copy_share")
        ),
        Metric("idle_share", "GPU idle", "share", share(before, "idle_share"), share(after, "idle_share")),
        Metric(
            "syncs_per_step", "host syncs per step", "count", syncs_per_step(before), syncs_per_step(after)
        ),
        Metric(
            "h2d_overlap",
            "H2D copies under compute",
            "share",
            overlap(before, "HtoD"),
            overlap(after, "HtoD"),
        ),
        Metric(
            "d2h_overlap",
            "D2H copies under compute",
            "share",
            overlap(before, "DtoH"),
            overlap(after, "DtoH"),
        ),
    ]
    was_idle, now_idle = before.utilization.idle_by_cause_ns, after.utilization.idle_by_cause_ns
    idle = [
        Metric(
            f"idle:{text(cause)}",
            text(cause),
            "us",
            _per(before, us(was_idle.get(cause, 0)), basis),
            _per(after, us(now_idle.get(cause, 0)), basis),
        )
        for cause in dict.fromkeys([*was_idle, *now_idle])
    ]

    def keyed(result: Result) -> dict[tuple[str, str], Finding]:
        table: dict[tuple[str, str], Finding] = {}
        for finding in result.findings:
            table.setdefault((text(finding.rule), finding_site(finding)), finding)
        return table

    def saving(finding: Finding) -> float | None:
        """The finding's saving on the comparison's basis (per step when both sides have steps)."""
        if not finding.saving_known:
            return None  # no GPU in the run, or nothing to replay: no figure to compare
        per_step = finding.savings_per_step_ns
        return us(per_step) if basis == "per step" and per_step is not None else us(finding.savings_total_ns)

    old, fresh = keyed(before), keyed(after)
    changes = [
        FindingChange(
            status="fixed" if key not in fresh else "still",
            rule=key[0],
            site=key[1],
            title=text((fresh.get(key) or finding).title),
            before_saving_us=saving(finding),
            after_saving_us=saving(fresh[key]) if key in fresh else None,
            severity=(fresh.get(key) or finding).severity,
            site_label=finding_site_label(fresh.get(key) or finding),
        )
        for key, finding in old.items()
    ]
    changes += [
        FindingChange(
            status="new",
            rule=key[0],
            site=key[1],
            title=text(finding.title),
            before_saving_us=None,
            after_saving_us=saving(finding),
            severity=finding.severity,
            site_label=finding_site_label(finding),
        )
        for key, finding in fresh.items()
        if key not in old
    ]
    order = {"fixed": 0, "new": 1, "still": 2}
    changes.sort(
        key=lambda change: (order[change.status], -(change.before_saving_us or change.after_saving_us or 0.0))
    )

    def kernels(result: Result) -> dict[tuple[int, str], tuple[float, int]]:
        return {
            (kernel.device, text(kernel.name)): (us(kernel.total_ns), kernel.count)
            for kernel in result.kernels
        }

    was, now = kernels(before), kernels(after)
    moved = [
        KernelChange(
            device=key[0],
            name=key[1],
            before_total_us=_per(before, was[key][0], basis) if key in was else 0.0,
            after_total_us=_per(after, now[key][0], basis) if key in now else 0.0,
            before_count=was[key][1] if key in was else 0,
            after_count=now[key][1] if key in now else 0,
            before_launches=round(_per(before, float(was[key][1]), basis), 3) if key in was else 0.0,
            after_launches=round(_per(after, float(now[key][1]), basis), 3) if key in now else 0.0,
        )
        for key in dict.fromkeys([*was, *now])
    ]
    moved.sort(key=lambda change: (-abs(change.change_us), change.device, change.name))
    return Comparison(
        before=before_label,
        after=after_label,
        basis=basis,
        notes=tuple(_notes(before, after)),
        metrics=tuple(metrics),
        idle=tuple(idle),
        findings=tuple(changes),
        kernels=tuple(change for change in moved[:top] if change.change_us),
    )
