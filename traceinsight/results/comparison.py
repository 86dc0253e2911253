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
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final

from traceinsight.analysis.causes import cause_label
from traceinsight.formatting import format_change, format_duration, format_share, source_label
from traceinsight.load.text import clean_text
from traceinsight.model import Model, field, replace
from traceinsight.results.codec import document_of, us
from traceinsight.results.frames import comparison_frames
from traceinsight.results.noise import (
    CONFIDENCE,
    GPU_RUN_SPREAD,
    HOST_RUN_SPREAD,
    NO_CHANGE_MARGIN,
    SEED,
    VERDICTS,
    bootstrap_medians,
    estimate,
    median,
    step_verdict,
)
from traceinsight.results.noise import verdict as interval_verdict
from traceinsight.results.stored import from_text
from traceinsight.results.trace import SCHEMA_VERSION, Finding, Result
from traceinsight.results.writer import strict_json
from traceinsight.rules.findings import Severity
from traceinsight.shown import figures_of, html_of

if TYPE_CHECKING:
    import polars as pl

__all__ = [
    "Comparison",
    "DiffTool",
    "FindingChange",
    "KernelChange",
    "Metric",
    "Prediction",
    "compare",
    "finding_site",
    "syncs_per_step",
]

#: A hyphen used as a sign (before a digit, not inside a word or a number's exponent).
_SIGN = re.compile(r"(?<![\w.])-(?=[\d.])")


class Metric(Model, frozen=True):
    """One figure before and after. ``unit``: ``us`` (per step, or in all), ``share`` (0-1) or ``count``."""

    JSON_KEYS: ClassVar[tuple[str | tuple[str, str], ...]] = (
        "key",
        "label",
        "unit",
        "before",
        "after",
        "change",
        ("written_relative", "relative"),
        "lower",
        "upper",
        "relative_lower",
        "relative_upper",
        "verdict",
        "before_steps",
        "after_steps",
    )
    key: str
    label: str
    unit: str
    before: float | None
    after: float | None
    #: The change's interval at the comparison's confidence (the metric's unit; None: no
    #: per-step figures to draw it from), and as shares of before.
    lower: float | None = None
    upper: float | None = None
    relative_lower: float | None = None
    relative_upper: float | None = None
    #: ``faster`` / ``slower`` (the step time) or ``lower`` / ``higher`` (every other figure),
    #: ``no change`` or ``cannot tell`` (see :mod:`.noise`); None: not judged (no per-step figures).
    verdict: str | None = field(default=None, metadata={"check": VERDICTS})
    #: Each steady step's value on each side (every run's, in order; the metric's unit), at most
    #: :data:`STEPS_KEPT` a side: what the interval is drawn from, and the page's dots.
    before_steps: tuple[float, ...] = ()
    after_steps: tuple[float, ...] = ()

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

    @property
    def judged(self) -> bool:
        """True when the change was told apart from noise (``faster``/``slower``/``lower``/``higher``)."""
        return self.verdict in ("faster", "slower", "lower", "higher")

    def interval_text(self) -> str:
        """The interval of the change in words, as shares for times (``−31 % to −26 %``), in the
        metric's unit otherwise; empty without one."""
        if self.lower is None or self.upper is None:
            return ""
        if self.unit == "us" and self.key.startswith("idle:"):  # a cause can start from nothing
            return " to ".join(format_change(value) for value in (self.lower, self.upper))
        if self.unit == "us" and self.relative_lower is not None and self.relative_upper is not None:
            return _minus(f"{self.relative_lower * 100:+.1f}% to {self.relative_upper * 100:+.1f}%")
        if self.unit == "share":
            return _minus(f"{self.lower * 100:+.1f} to {self.upper * 100:+.1f} pts")
        return _minus(f"{self.lower:+.3g} to {self.upper:+.3g}")

    def verdict_text(self) -> str:
        """The verdict first, then the interval: ``faster: −31.0% to −26.0%``; ``cannot tell:
        −40% to +20%``; ``—`` when not judged."""
        if self.verdict is None:
            return "—"
        interval = self.interval_text()
        return f"{self.verdict}: {interval}" if interval else self.verdict

    def change_text(self) -> str:
        """after − before in the metric's unit (points for shares, % too for times)."""
        change = self.change
        if change is None:
            return "—"
        if self.unit == "share":
            return _minus(f"{change * 100:+.1f} pts")
        if self.unit == "us":
            relative = f" ({self.relative * 100:+.1f}%)" if self.relative is not None else ""
            return format_change(change) + _minus(relative)
        return _minus(f"{change:+.3g}")


def _minus(text: str) -> str:
    """``text`` with each sign written as a minus sign (−), as the change of a time was: one sign
    for every change, not a hyphen beside it."""
    return _SIGN.sub("−", text)


class FindingChange(Model, frozen=True, kw_only=True):
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


class Prediction(Model, frozen=True, kw_only=True):
    """A finding fixed between the sides: its predicted saving (from before) beside the measured
    change of the step and of the figure the finding targets (per step when both sides have steps,
    µs; a saving is positive, a measured fall negative)."""

    rule: str = field(metadata={"check": "id"})
    site: str
    predicted_us: float | None
    #: The metric the finding targets: an idle cause (``idle:dataloader``), ``gpu_work`` or
    #: ``host_wait``.
    target: str
    target_label: str
    measured_step_us: float | None
    measured_target_us: float | None
    #: Other findings fixed at once: the measured change is theirs together.
    together_with: tuple[str, ...] = ()

    def text(self) -> str:
        """``predicted 58.82 ms per step; measured: step −50.76 ms, DataLoader idle −47.54 ms``."""

        def signed(value: float | None) -> str:
            return "—" if value is None else format_change(value)

        predicted = "—" if self.predicted_us is None else format_duration(self.predicted_us * 1000)
        words = (
            f"predicted {predicted}; measured: step {signed(self.measured_step_us)}, "
            f"{self.target_label} {signed(self.measured_target_us)}"
        )
        if self.together_with:
            words += f" (with {', '.join(self.together_with)} fixed too: the change is theirs together)"
        return words


class KernelChange(Model, frozen=True, kw_only=True):
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


class ModuleChange(Model, frozen=True, kw_only=True):
    """An ``nn.Module`` path whose time changed: GPU time launched under it (host time where
    neither run used a GPU), on the comparison's basis, and its FLOPs."""

    path: str
    before_us: float
    after_us: float
    #: ``gpu`` or ``host``: which time the figures are.
    time: str = field(metadata={"check": "id"})
    before_flops: int = 0
    after_flops: int = 0

    @property
    def change_us(self) -> float:
        return self.after_us - self.before_us


class DiffTool(Model, frozen=True, kw_only=True):
    """What wrote a comparison."""

    name: str = "traceinsight"
    kind: str = "diff"


class Comparison(Model, frozen=True, kw_only=True):
    """Everything ``traceinsight diff`` shows."""

    KIND: ClassVar[str] = "diff"
    #: The metrics a stored comparison must hold (read back by :meth:`from_json`): the page's
    #: bars and the gate look them up.
    REQUIRED_METRICS: ClassVar[tuple[str, ...]] = (
        "step_time", "compute_share", "communication_share", "copy_share",
    )  # fmt: skip
    schema: int = SCHEMA_VERSION
    tool: DiffTool = field(default_factory=DiffTool)
    before: str
    after: str
    #: ``per step`` when both sides have steady steps, else ``in all``.
    basis: str = field(metadata={"check": ("per step", "in all")})
    #: What differs between the runs beyond the code (GPU, step count, torch, schema), in words.
    notes: tuple[str, ...]
    metrics: tuple[Metric, ...]
    #: Idle by cause before and after (per step or in all), causes in either.
    idle: tuple[Metric, ...] = field(metadata={"key": "idle_by_cause"})
    findings: tuple[FindingChange, ...]
    kernels: tuple[KernelChange, ...]
    #: The confidence of every interval (schema 3 on).
    confidence: float = CONFIDENCE
    #: Runs (traces, profiler cycles) pooled on each side, and their steady steps in all.
    before_runs: int = field(default=1, metadata={"check": "count"})
    after_runs: int = field(default=1, metadata={"check": "count"})
    before_steps: int = field(default=0, metadata={"check": "count"})
    after_steps: int = field(default=0, metadata={"check": "count"})
    #: The run-to-run spread assumed for a side of one run (a share of its step time; see
    #: :data:`.noise.HOST_RUN_SPREAD`), 0 when both sides pooled several runs.
    run_spread: float = 0.0
    #: What moved, in words: the GPU's own work against the host side (see :func:`what_moved`).
    moved: tuple[str, ...] = ()
    #: Each fixed finding's predicted saving beside the measured change it targets.
    predictions: tuple[Prediction, ...] = ()
    #: ``nn.Module`` paths whose time changed most (empty when neither run recorded module frames).
    modules: tuple[ModuleChange, ...] = ()

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
    def charts(self) -> Mapping[str, object]:
        """The page's chart as a matplotlib Figure (``before-after``: the step time before and
        after, by where it went), drawn on each call; empty when neither side has a step time."""
        return figures_of(self)

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
    def headline(self) -> str:
        """The step time's verdict first, with its interval and what it rests on: ``faster by
        5.4-51.8% (95%): 6 steps before and 6 after, one run a side``; empty when not judged."""
        step = next((metric for metric in self.metrics if metric.key == "step_time"), None)
        if step is None or step.verdict is None or step.relative_lower is None or step.relative_upper is None:
            return ""
        low, high = step.relative_lower * 100, step.relative_upper * 100
        level = f"{self.confidence * 100:.0f}%"
        runs = (
            "one run a side"
            if self.before_runs == 1 and self.after_runs == 1
            else f"{self.before_runs} runs before and {self.after_runs} after, pooled"
        )
        basis = f"{self.before_steps} steps before and {self.after_steps} after, {runs}"
        if self.before_runs == 1 or self.after_runs == 1:
            basis += f" (a run-to-run spread of ±{self.run_spread * 100:.1f}% per run assumed, measured)"
        if step.verdict in ("faster", "slower"):
            ends = sorted((abs(low), abs(high)))
            return f"step time {step.verdict} by {ends[0]:.1f}-{ends[1]:.1f}% ({level}): {basis}"
        width = (high - low) / 2
        words = _minus(f"{low:+.1f}% to {high:+.1f}% ({level})")
        if any("starved of CPU" in line for line in self.moved):
            return f"step time: cannot tell, {words}: a run was starved of CPU (below); {basis}"
        if step.verdict == "no change":
            return f"step time: no change, {words}: {basis}"
        return (
            f"step time: cannot tell, {words}: {basis}; a change of about ±{width:.0f}% could be told "
            "apart; more steps, more runs a side or a quieter machine would narrow it"
        )

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
    ``source_line_kind`` of ``def``, ``recording-start`` or ``entry``) is named as what it is; else the site."""
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


def _base(
    before: Result,
    after: Result,
    before_label: str,
    after_label: str,
    top: int = 10,
    basis: str | None = None,
) -> Comparison:
    """Two results compared figure by figure, nothing judged yet; per step when both have steps,
    else in all (``basis``: the one given, a pool's)."""
    basis = basis or ("per step" if _steps(before) and _steps(after) else "in all")

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
    for label, key in (("MFU", "mfu"), ("FLOPs per step" if basis == "per step" else "FLOPs", "flops")):
        values = (_flop_metric(before, key, basis), _flop_metric(after, key, basis))
        if values != (None, None):
            metrics.append(Metric(key, label, "share" if key == "mfu" else "count", *values))
    return Comparison(
        before=before_label,
        after=after_label,
        basis=basis,
        notes=tuple(_notes(before, after)),
        metrics=tuple(metrics),
        idle=tuple(idle),
        findings=tuple(changes),
        kernels=tuple(change for change in moved[:top] if change.change_us),
        modules=_module_changes(before, after, basis, top),
    )


#: Per-step values kept per side and metric in a comparison (the JSON's ``before_steps``).
STEPS_KEPT: Final = 1000

#: The idle cause each rule's fix targets (the rest target the GPU's own work or its idle in all).
_TARGETS: Final = {
    "dataloader-stall": "idle:dataloader",
    "sync-in-loop": "idle:sync",
    "sync-in-forward": "idle:sync",
    "pageable-memcpy": "idle:copy",
    "blocking-h2d": "idle:copy",
    "launch-bound": "idle:host-bound",
    "optimizer-not-fused": "idle:host-bound",
    "host-preprocessing": "idle:cpu_op",
    "exposed-communication": "idle:communication",
    "pipeline-bubble": "idle:other-gpu",
    "amp-opportunity": "gpu_work",
    "tf32-opportunity": "gpu_work",
}


def step_figures(result: Result) -> dict[str, list[float]]:
    """Each steady step's figures (µs, shares), by metric key: ``step_time``, ``gpu_work`` (the
    GPU's busy time per step), ``host_wait`` (its idle time per step), the busy classes' and idle's
    shares of the step, ``idle:<cause>``. Devices are averaged per step (the step time is the
    longest); a trace without GPU steps has its step times alone."""
    by_step: dict[int, list[Any]] = {}
    for step in result.steps:
        if step.steady:
            by_step.setdefault(step.step, []).append(step)
    figures: dict[str, list[float]] = {}
    times = [us(value) for value in result.steady_state.step_times_ns]
    causes = list(
        dict.fromkeys(
            cause for steps in by_step.values() for step in steps for cause in step.idle_by_cause_ns
        )
    )
    for steps in by_step.values():
        count = len(steps)
        span = sum(step.span_ns for step in steps)

        def add(key: str, value: float) -> None:
            figures.setdefault(key, []).append(value)

        add("gpu_work", us(sum(step.busy_ns for step in steps) / count))
        add("host_wait", us(sum(step.idle_ns for step in steps) / count))
        if span:
            add("busy_share", sum(step.busy_ns for step in steps) / span)
            add("compute_share", sum(step.compute_ns for step in steps) / span)
            add("communication_share", sum(step.communication_ns for step in steps) / span)
            add("copy_share", sum(step.copy_exposed_ns for step in steps) / span)
            add("idle_share", sum(step.idle_ns for step in steps) / span)
        for cause in causes:
            add(f"idle:{text(cause)}", us(sum(step.idle_by_cause_ns.get(cause, 0) for step in steps) / count))
        if not result.steady_state.step_times_ns:
            add("step_time", us(max(step.span_ns for step in steps)))
    if times:
        figures["step_time"] = times
    if result.steady_state.step_syncs:
        figures["syncs_per_step"] = [float(count) for count in result.steady_state.step_syncs]
    return figures


def _pooled_step(results: Sequence[Result]) -> float | None:
    """The median of every run's steady step times (None when a run has no figures)."""
    times = [value for result in results for value in step_figures(result).get("step_time", [])]
    return median(times) if times else None


def compare(
    before: Result | Sequence[Result],
    after: Result | Sequence[Result],
    before_label: str,
    after_label: str,
    top: int = 10,
) -> Comparison:
    """Compare two results, or two sides of several runs each (traces of one setup: profiler
    cycles, repeated runs), pooled: see the module doc. Findings, kernels and notes are each side's
    first run's; every figure with per-step values is judged (:mod:`.noise`)."""
    befores = [before] if isinstance(before, Result) else list(before)
    afters = [after] if isinstance(after, Result) else list(after)
    base = _base(befores[0], afters[0], before_label, after_label, top)
    if len(befores) > 1 or len(afters) > 1:
        base = _pooled(base, befores, afters)
    per_step = base.basis == "per step"
    figures_before = [step_figures(result) for result in befores]
    figures_after = [step_figures(result) for result in afters]
    step_before = _pooled_step(befores) or 0.0
    step_after = _pooled_step(afters) or 0.0

    def filled(figures: list[dict[str, list[float]]]) -> list[dict[str, list[float]]]:
        """Each run's figures with every idle cause either side has (0 in each step that lacks it)."""
        causes = {key for run in (*figures_before, *figures_after) for key in run if key.startswith("idle:")}
        return [
            {**run, **{key: [0.0] * len(run.get("host_wait", [])) for key in causes if key not in run}}
            for run in figures
        ]

    drawn_before = bootstrap_medians(filled(figures_before), seed=SEED) if per_step else {}
    drawn_after = bootstrap_medians(filled(figures_after), seed=SEED + 1) if per_step else {}

    def runs(figures: list[dict[str, list[float]]], key: str) -> list[list[float]]:
        """A side's runs' values of ``key``; an idle cause a run's steps lack is 0 in each."""
        if key.startswith("idle:"):
            return [run.get(key, [0.0] * len(run.get("host_wait", []))) for run in figures]
        return [run.get(key, []) for run in figures]

    def host_share(figures: list[dict[str, list[float]]], key: str) -> float:
        """The idle cause's part of the GPU's wait on the host (medians), what its run-to-run
        spread is taken as a part of."""
        waits = [value for run in runs(figures, "host_wait") for value in run]
        part = [value for run in runs(figures, key) for value in run]
        return min(1.0, median(part) / median(waits)) if part and waits and median(waits) > 0 else 0.0

    def judged(metric: Metric) -> Metric:
        if not per_step:
            return metric
        was, now = runs(figures_before, metric.key), runs(figures_after, metric.key)
        middle_before = median([value for run in was for value in run]) if any(was) else 0.0
        middle_after = median([value for run in now for value in run]) if any(now) else 0.0
        if metric.key == "gpu_work":
            spreads = (GPU_RUN_SPREAD * middle_before, GPU_RUN_SPREAD * middle_after)
            margin = NO_CHANGE_MARGIN * middle_before
        elif metric.key == "syncs_per_step":
            # A count the code sets, not the machine: no run-to-run allowance (several runs a side
            # still add their own spread); less than one sync per step either way is no change.
            spreads = (0.0, 0.0)
            margin = SYNCS_NO_CHANGE
        elif metric.unit == "share":
            spreads = (HOST_RUN_SPREAD * middle_before, HOST_RUN_SPREAD * middle_after)
            margin = NO_CHANGE_MARGIN
        elif metric.key.startswith("idle:"):  # the host's spread, shared by its causes by size
            spreads = (
                HOST_RUN_SPREAD * step_before * host_share(figures_before, metric.key),
                HOST_RUN_SPREAD * step_after * host_share(figures_after, metric.key),
            )
            margin = NO_CHANGE_MARGIN * step_before
        else:  # host-paced times: the step, the GPU's wait on the host
            spreads = (HOST_RUN_SPREAD * step_before, HOST_RUN_SPREAD * step_after)
            margin = NO_CHANGE_MARGIN * step_before
        draws = (drawn_before.get(metric.key, []), drawn_after.get(metric.key, []))
        found = estimate(
            was,
            now,
            run_sd_before=spreads[0],
            run_sd_after=spreads[1],
            margin=margin,
            drawn=draws if all(draws) else None,
        )
        kept = (_kept(was, metric.unit), _kept(now, metric.unit))
        if found is None or metric.change is None:
            return replace(metric, before_steps=kept[0], after_steps=kept[1])
        # The interval's width is the steps' and runs'; it stands around the change shown (a share
        # of the whole steady state need not be its steps' median share).
        below, above = found.change - found.lower, found.upper - found.change
        lower = min(metric.change, found.change) - below
        upper = max(metric.change, found.change) + above
        # A time or a share is never below 0 (nor a share above 1): the normal interval is cut there.
        if metric.before is not None:
            lower = max(lower, -metric.before)
            if metric.unit == "share":
                upper = min(upper, 1.0 - metric.before)
        verdict = interval_verdict(lower, upper, margin)
        if metric.key == "step_time":
            verdict = step_verdict(verdict)
        relative = metric.before if metric.before else None
        return replace(
            metric,
            lower=_rounded(lower, metric.unit),
            upper=_rounded(upper, metric.unit),
            relative_lower=None if relative is None else round(lower / relative, 4),
            relative_upper=None if relative is None else round(upper / relative, 4),
            verdict=verdict,
            before_steps=kept[0],
            after_steps=kept[1],
        )

    extra = []
    if per_step:
        for key, label in (("gpu_work", "GPU work"), ("host_wait", "GPU waiting on the host")):
            was = [value for run in runs(figures_before, key) for value in run]
            now = [value for run in runs(figures_after, key) for value in run]
            if was and now:
                extra.append(Metric(key, label, "us", round(median(was), 3), round(median(now), 3)))
    metrics = [judged(metric) for metric in (*base.metrics[:1], *extra, *base.metrics[1:])]
    idle = [judged(metric) for metric in base.idle]
    one_run = len(befores) == 1 or len(afters) == 1
    comparison = replace(
        base,
        metrics=tuple(metrics),
        idle=tuple(idle),
        before_runs=len(befores),
        after_runs=len(afters),
        before_steps=sum(len(run.get("step_time", [])) for run in figures_before),
        after_steps=sum(len(run.get("step_time", [])) for run in figures_after),
        run_spread=HOST_RUN_SPREAD if one_run else 0.0,
    )
    starved = [_starved(results) for results in (befores, afters)]
    step = comparison.metric("step_time")
    lines: list[str] = []
    for name, (mine, theirs) in (("before", starved), ("after", starved[::-1])):
        if mine is None or mine[0] < STARVED_WAIT_SHARE or (theirs is not None and mine[0] < 2 * theirs[0]):
            continue
        other = "after" if name == "before" else "before"
        against = f", against {theirs[0] * 100:.0f}% {other} ({theirs[1]})" if theirs is not None else ""
        lines.append(
            f"the {name} run was starved of CPU: its steps waited {mine[0] * 100:.0f}% of their time "
            f"for a CPU ({mine[1]}){against}: a difference of the machine, not of the code"
        )
    both = all(side is not None and side[0] >= STARVED_WAIT_SHARE for side in starved)
    if both:
        assert starved[0] is not None and starved[1] is not None
        lines.append(
            f"both runs were starved of CPU: their steps waited {starved[0][0] * 100:.0f}% and "
            f"{starved[1][0] * 100:.0f}% of their time for a CPU ({starved[0][1]}; {starved[1][1]}): "
            "step time on this machine measures its load; judge syncs per step, findings and GPU work"
        )
    if lines and step.verdict in ("faster", "slower"):
        # The run that waited for a CPU is the slower one: its steps measure the machine's load.
        slower = "after" if step.verdict == "slower" else "before"
        if both or any(line.startswith(f"the {slower} run") for line in lines):
            step = replace(step, verdict="cannot tell")
            comparison = replace(
                comparison, metrics=tuple(step if m.key == "step_time" else m for m in comparison.metrics)
            )
    return replace(
        comparison,
        moved=(*lines, *what_moved(comparison)),
        predictions=predictions(comparison),
    )


#: The largest change of host syncs per step that is "no change": under one sync per step.
SYNCS_NO_CHANGE: Final = 0.5


#: A run whose steps' thread waited for a CPU this share of their wall time (median) or more was
#: starved of CPU (on an idle machine the share is ~0; 2 cores under load 8: most of the step).
STARVED_WAIT_SHARE: Final = 0.2


def _starved(results: Sequence[Result]) -> tuple[float, str] | None:
    """How much of its steps a side's runs waited for a CPU (median share of the wall time) and
    the machine's load in words; None where ``run`` did not measure it (its result's ``run``, else
    the record of the trace it wrote; another profiler's trace cannot say). A side is starved at
    :data:`STARVED_WAIT_SHARE` or more and twice the other side's share."""
    shares, loads, cores = [], [], None
    for result in results:
        if result.run is not None:
            cores = cores or result.run.cores
        measured = result.run.step_usage if result.run is not None else ()
        for usage in measured or result.trace.step_usage:
            if usage.cpu_wait_ns is not None and usage.wall_ns > 0:
                shares.append(usage.cpu_wait_ns / usage.wall_ns)
            if usage.load_1m is not None:
                loads.append(usage.load_1m)
    if not shares:
        return None
    share = median(shares)
    load = f"load average {median(loads):.1f}" if loads else "load unknown"
    return share, f"{load} on {cores} cores" if cores else load


def _kept(runs: list[list[float]], unit: str) -> tuple[float, ...]:
    """A side's per-step values as the JSON keeps them (rounded, at most :data:`STEPS_KEPT`)."""
    return tuple(_rounded(value, unit) for run in runs for value in run)[:STEPS_KEPT]


def _rounded(value: float, unit: str) -> float:
    return round(value, 4 if unit == "share" else 3)


def _pooled(base: Comparison, befores: list[Result], afters: list[Result]) -> Comparison:
    """``base`` (the first runs compared) with each figure the runs' own, on ``base``'s basis: the
    step time the median of every run's steps, every other figure the mean of the runs' figures (an
    idle cause a run lacks counts 0 there). Per step, a run without steady steps has no figures to
    pool: it is left out, and a note says so (its window's totals are not a step's)."""

    def side(results: list[Result]) -> tuple[dict[str, float | None], dict[str, float]]:
        counted = [result for result in results if base.basis == "in all" or _steps(result)]
        figures: dict[str, list[float]] = {}
        idle: dict[str, float] = {}
        for result in counted:
            alone = _base(result, result, "", "", basis=base.basis)
            for metric in alone.metrics:
                if metric.before is not None:
                    figures.setdefault(metric.key, []).append(metric.before)
            for metric in alone.idle:
                idle[metric.key] = idle.get(metric.key, 0.0) + (metric.before or 0.0) / len(counted)
        means: dict[str, float | None] = {key: round(sum(v) / len(v), 4) for key, v in figures.items()}
        if base.basis == "per step":
            step = _pooled_step(counted)
            means["step_time"] = None if step is None else round(step, 3)
        return means, {key: round(value, 3) for key, value in idle.items()}

    (was, was_idle), (now, now_idle) = side(befores), side(afters)
    left_out = {
        where: sum(not _steps(result) for result in runs) if base.basis == "per step" else 0
        for where, runs in (("before", befores), ("after", afters))
    }
    stepless = [
        f"{count} run{'s' if count > 1 else ''} {where}" for where, count in left_out.items() if count
    ]
    causes = dict.fromkeys([*was_idle, *now_idle])
    return replace(
        base,
        metrics=tuple(replace(m, before=was.get(m.key), after=now.get(m.key)) for m in base.metrics),
        idle=tuple(
            Metric(key, key.removeprefix("idle:"), "us", was_idle.get(key, 0.0), now_idle.get(key, 0.0))
            for key in causes
        ),
        notes=(
            *base.notes,
            f"pooled {len(befores)} run{'s' if len(befores) > 1 else ''} before and {len(afters)} after "
            "(findings and kernels: each side's first run's)",
            *(
                [f"{' and '.join(stepless)} without steady steps: left out of the pooled per-step figures"]
                if stepless
                else []
            ),
        ),
    )


def _find(comparison: Comparison, key: str) -> Metric | None:
    return next((metric for metric in (*comparison.metrics, *comparison.idle) if metric.key == key), None)


def what_moved(comparison: Comparison) -> tuple[str, ...]:
    """What moved between the sides, in words: the GPU's own work per step (its kernels, copies,
    collectives: what a code change moves, stable from run to run) against the host side (the GPU
    waiting on the DataLoader, Python, launches: what runs vary by), with the idle cause that
    moved most. Empty without per-step figures."""
    gpu, host = _find(comparison, "gpu_work"), _find(comparison, "host_wait")
    if gpu is None or host is None or gpu.before is None or gpu.after is None:
        return ()
    lines = []
    sides = f"({gpu.text(gpu.before)} → {gpu.text(gpu.after)})"
    if gpu.judged and gpu.relative is not None:
        lines.append(
            f"GPU work {abs(gpu.relative) * 100:.1f}% {'less' if gpu.verdict == 'lower' else 'more'} {sides}"
        )
    elif gpu.verdict == "no change":
        lines.append(f"GPU work unchanged {sides}")
    else:
        lines.append(f"GPU work: cannot tell {sides}")
    causes = [m for m in comparison.idle if m.change is not None and m.key.startswith("idle:")]
    largest = max(causes, key=lambda m: abs(m.change or 0.0), default=None)
    host_words = f"the GPU's wait on the host {host.text(host.before)} → {host.text(host.after)}"
    if largest is not None and largest.change:
        host_words += (
            f"; most of it {cause_label(largest.label)} ({largest.text(largest.before)} → "
            f"{largest.text(largest.after)})"
        )
    if host.judged:
        lines.append(
            f"{host_words}: {'shorter' if host.verdict == 'lower' else 'longer'}, told apart from noise"
        )
    elif host.verdict == "no change":
        lines.append(f"{host_words}: unchanged")
    else:
        one_run = comparison.before_runs == 1 or comparison.after_runs == 1
        lines.append(
            f"{host_words}: a difference of the host within what "
            + (
                f"runs vary by (±{comparison.run_spread * 100:.0f}% of the step per run, measured)"
                if one_run
                else "these runs vary by"
            )
        )
    return tuple(lines)


def predictions(comparison: Comparison) -> tuple[Prediction, ...]:
    """Each fixed finding's predicted saving (from before) beside the measured change of the step
    and of the figure the fix targets; several fixed at once share the measured change."""
    step = _find(comparison, "step_time")
    fixed = comparison.fixed
    made = []
    for change in fixed:
        target = _TARGETS.get(change.rule, "host_wait")
        metric = _find(comparison, target)
        if metric is None and target.startswith("idle:"):
            label = f"idle: {cause_label(target.removeprefix('idle:'))}"
            measured = None
        else:
            label = metric.title if metric is not None else target
            measured = None if metric is None else metric.change
        made.append(
            Prediction(
                rule=change.rule,
                site=change.shown_site,
                predicted_us=change.before_saving_us,
                target=target,
                target_label=label,
                measured_step_us=None if step is None or step.change is None else round(step.change, 3),
                measured_target_us=None if measured is None else round(measured, 3),
                together_with=tuple(other.rule for other in fixed if other is not change),
            )
        )
    return tuple(made)


def _flop_metric(result: Result, key: str, basis: str) -> float | None:
    """MFU (the first device's) or the counted FLOPs on the comparison's basis; None without."""
    flops = result.flops
    if key == "mfu":
        known = [device.mfu for device in flops.mfu if device.mfu is not None]
        return known[0] if known else None
    if not flops.flops:
        return None
    if basis == "per step" and flops.flops_per_step is not None:
        return float(flops.flops_per_step)
    return float(flops.flops)


def _module_changes(before: Result, after: Result, basis: str, top: int) -> tuple[ModuleChange, ...]:
    """Module paths by the change in their time (GPU, else host), largest first."""
    on_gpu = any(scope.gpu_ns for result in (before, after) for scope in result.scopes.modules)

    def times(result: Result) -> dict[str, tuple[float, float]]:
        scopes = result.scopes
        # Scopes are per step when the result has steps; the comparison's basis may be totals.
        scale = 1 if basis == "per step" or scopes.per != "step" else max(scopes.steps, 1)
        return {
            text(scope.path): (
                us((scope.gpu_ns if on_gpu else scope.host_ns) * scale),
                float(scope.flops * scale),
            )
            for scope in scopes.modules
        }

    was, now = times(before), times(after)
    changes = [
        ModuleChange(
            path=path,
            before_us=was.get(path, (0.0, 0.0))[0],
            after_us=now.get(path, (0.0, 0.0))[0],
            time="gpu" if on_gpu else "host",
            before_flops=round(was.get(path, (0.0, 0.0))[1]),
            after_flops=round(now.get(path, (0.0, 0.0))[1]),
        )
        for path in dict.fromkeys([*was, *now])
    ]
    changes.sort(key=lambda change: (-abs(change.change_us), change.path))
    return tuple(change for change in changes[:top] if change.change_us)
