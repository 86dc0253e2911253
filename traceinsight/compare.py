"""Did the fix work? Two results compared: step time, where the GPU time goes, syncs, copies,
communication, findings fixed / new / still present, and the kernels that changed most.

Both sides are the JSON contract (:func:`traceinsight.render.json_report.report_dict`): a trace is
analyzed first, a JSON result written by ``analyze --json`` is read back under the checks of
:mod:`traceinsight.stored` (every field read here of its type and range), so a stored baseline
works without its trace. Figures are per steady step when both sides have steps, else over the
time analyzed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from traceinsight.analysis.causes import cause_label
from traceinsight.formatting import format_duration, format_share, source_label
from traceinsight.load.text import clean_text

__all__ = [
    "Comparison",
    "FindingChange",
    "KernelChange",
    "Metric",
    "compare",
    "finding_site",
    "syncs_per_step",
]

#: A hyphen used as a sign (before a digit, not inside a word or a number's exponent).
_SIGN = re.compile(r"(?<![\w.])-(?=[\d.])")

Document = dict[str, Any]


@dataclass(frozen=True, slots=True)
class Metric:
    """One figure before and after. ``unit``: ``us`` (per step, or in all), ``share`` (0-1) or ``count``."""

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


@dataclass(frozen=True, slots=True)
class FindingChange:
    """A finding matched by rule and site across the two sides."""

    #: ``fixed`` (before only), ``new`` (after only) or ``still`` (both).
    status: str
    rule: str
    #: What the sides are matched on: the source's ``file:line``, else the operator, else the GPU.
    site: str
    title: str
    #: The finding's saving on the comparison's basis (per step when both sides have steps), µs.
    before_saving_us: float | None
    after_saving_us: float | None
    severity: str
    #: The site as the report writes it: a line that is not the call's is named as what it is
    #: ("`main` (recorded from train.py:21)"); else ``site``.
    site_label: str = ""

    @property
    def shown_site(self) -> str:
        """``site_label`` where there is one, else ``site``."""
        return self.site_label or self.site


@dataclass(frozen=True, slots=True)
class KernelChange:
    """A kernel (by device and name) whose total time changed."""

    device: int
    name: str
    before_total_us: float
    after_total_us: float
    before_count: int
    after_count: int

    @property
    def change_us(self) -> float:
        return self.after_total_us - self.before_total_us


@dataclass(frozen=True, slots=True)
class Comparison:
    """Everything ``traceinsight diff`` shows."""

    before: str
    after: str
    #: ``per step`` when both sides have steady steps, else ``in all``.
    basis: str
    #: What differs between the runs beyond the code (GPU, step count, torch, schema), in words.
    notes: tuple[str, ...]
    metrics: tuple[Metric, ...]
    #: Idle by cause before and after (per step or in all), causes in either.
    idle: tuple[Metric, ...]
    findings: tuple[FindingChange, ...]
    kernels: tuple[KernelChange, ...]

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


def _steps(document: Document) -> int:
    return int(document.get("steady_state", {}).get("steady_steps") or 0)


def syncs_per_step(document: Document) -> float | None:
    """Blocking calls per steady step (None without steps)."""
    steps = _steps(document)
    if not steps:
        return None
    return sum(int(spot.get("steady_count") or 0) for spot in document.get("sync_hotspots", [])) / steps


def _per(document: Document, total_us: float, basis: str) -> float:
    return total_us / _steps(document) if basis == "per step" else total_us


def text(value: object) -> str:
    """A string taken from a result, for display: a stored result is untrusted like a trace, so it
    gets the trace's cleaning (control characters replaced, long strings cut)."""
    return clean_text(str(value))


def finding_site(finding: Document) -> str:
    """Where a finding is: its source line, else its operator, else its GPU (for matching sides)."""
    if finding.get("source"):
        return text(finding["source"])
    if finding.get("op"):
        return text(finding["op"])
    if finding.get("device") is not None:
        return f"GPU {finding['device']}"
    return ""


def finding_site_label(finding: Document) -> str:
    """:func:`finding_site` as the report writes it: a source line that is not the call's (a stored
    ``source_line_kind`` of ``def`` or ``recording-start``) is named as what it is; else the site."""
    site = finding_site(finding)
    line_kind, function = finding.get("source_line_kind"), finding.get("source_function")
    if not finding.get("source") or not isinstance(function, str) or line_kind == "call":
        return site
    return source_label(
        site,
        text(finding.get("source_kind")) if finding.get("source_kind") else None,
        text(line_kind) if line_kind else None,
        text(function),
    )


def _notes(before: Document, after: Document) -> list[str]:
    notes = []

    def gpus(document: Document) -> str:
        return (
            ", ".join(sorted(text(d.get("name")) for d in document.get("devices", []) if d.get("name")))
            or "none"
        )

    if gpus(before) != gpus(after):
        notes.append(f"the GPUs differ: {gpus(before)} before, {gpus(after)} after")
    steps_before, steps_after = _steps(before), _steps(after)
    if steps_before != steps_after:
        notes.append(f"the steady step counts differ: {steps_before} before, {steps_after} after")
    versions = [
        ((before.get("run") or {}).get("torch_version"), (after.get("run") or {}).get("torch_version")),
        (before["trace"].get("cuda_runtime_version"), after["trace"].get("cuda_runtime_version")),
    ]
    for (one, two), what in zip(versions, ("torch", "the CUDA runtime"), strict=True):
        if one and two and one != two:
            notes.append(f"{what} differs: {text(one)} before, {text(two)} after")
    if before["trace"].get("world_size") != after["trace"].get("world_size"):
        notes.append("the world sizes differ")
    return notes


def compare(
    before: Document, after: Document, before_label: str, after_label: str, top: int = 10
) -> Comparison:
    """Compare two results (the JSON contract): see the module doc."""
    basis = "per step" if _steps(before) and _steps(after) else "in all"
    before_use, after_use = before["utilization"], after["utilization"]

    def step_time(document: Document) -> float | None:
        if basis == "per step":
            value = document["steady_state"].get("step_time_us")
            return float(value) if value is not None else None
        return float(document["utilization"].get("window_us") or 0.0)

    def share(document: Document, key: str) -> float | None:
        value = document["utilization"].get(key)
        return float(value) if value is not None else None

    def overlap(document: Document, direction: str) -> float | None:
        value = document.get("overlap", {}).get(direction)
        return float(value) if value is not None else None

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
    causes = dict.fromkeys([*before_use.get("idle_by_cause_us", {}), *after_use.get("idle_by_cause_us", {})])
    idle = [
        Metric(
            f"idle:{text(cause)}",
            text(cause),
            "us",
            _per(before, float(before_use.get("idle_by_cause_us", {}).get(cause, 0.0)), basis),
            _per(after, float(after_use.get("idle_by_cause_us", {}).get(cause, 0.0)), basis),
        )
        for cause in causes
    ]

    def keyed(document: Document) -> dict[tuple[str, str], Document]:
        table: dict[tuple[str, str], Document] = {}
        for finding in document.get("findings", []):
            table.setdefault((text(finding["rule"]), finding_site(finding)), finding)
        return table

    def saving(finding: Document) -> float | None:
        """The finding's saving on the comparison's basis (per step when both sides have steps)."""
        if finding.get("saving_known") is False:
            return None  # no GPU in the run, or nothing to replay: no figure to compare
        per_step = finding.get("savings_per_step_us")
        return per_step if basis == "per step" and per_step is not None else finding.get("savings_us")

    old, fresh = keyed(before), keyed(after)
    changes = [
        FindingChange(
            status="fixed" if key not in fresh else "still",
            rule=key[0],
            site=key[1],
            title=text((fresh.get(key) or finding)["title"]),
            before_saving_us=saving(finding),
            after_saving_us=saving(fresh[key]) if key in fresh else None,
            severity=text((fresh.get(key) or finding)["severity"]),
            site_label=finding_site_label(fresh.get(key) or finding),
        )
        for key, finding in old.items()
    ]
    changes += [
        FindingChange(
            "new",
            key[0],
            key[1],
            text(finding["title"]),
            None,
            saving(finding),
            text(finding["severity"]),
            finding_site_label(finding),
        )
        for key, finding in fresh.items()
        if key not in old
    ]
    order = {"fixed": 0, "new": 1, "still": 2}
    changes.sort(
        key=lambda change: (order[change.status], -(change.before_saving_us or change.after_saving_us or 0.0))
    )

    def kernels(document: Document) -> dict[tuple[int, str], Document]:
        return {(int(k["device"]), text(k["name"])): k for k in document.get("kernels", [])}

    was, now = kernels(before), kernels(after)
    moved = [
        KernelChange(
            device=key[0],
            name=key[1],
            before_total_us=_per(before, float(was[key]["total_us"]), basis) if key in was else 0.0,
            after_total_us=_per(after, float(now[key]["total_us"]), basis) if key in now else 0.0,
            before_count=int(was[key]["count"]) if key in was else 0,
            after_count=int(now[key]["count"]) if key in now else 0,
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


def comparison_dict(comparison: Comparison) -> Document:
    """The comparison as plain JSON-ready data (``traceinsight diff --json``)."""

    def metric(item: Metric) -> Document:
        return {
            "key": item.key,
            "label": item.label,
            "unit": item.unit,
            "before": item.before,
            "after": item.after,
            "change": item.change,
            "relative": None if item.relative is None else round(item.relative, 4),
        }

    return {
        "schema": 1,
        "tool": {"name": "traceinsight", "kind": "diff"},
        "before": comparison.before,
        "after": comparison.after,
        "basis": comparison.basis,
        "notes": list(comparison.notes),
        "metrics": [metric(item) for item in comparison.metrics],
        "idle_by_cause": [metric(item) for item in comparison.idle],
        "findings": [
            {
                "status": change.status,
                "rule": change.rule,
                "site": change.site,
                "site_label": change.shown_site,
                "title": change.title,
                "severity": change.severity,
                "before_savings_us": change.before_saving_us,
                "after_savings_us": change.after_saving_us,
            }
            for change in comparison.findings
        ],
        "kernels": [
            {
                "device": change.device,
                "name": change.name,
                "before_total_us": change.before_total_us,
                "after_total_us": change.after_total_us,
                "before_count": change.before_count,
                "after_count": change.after_count,
            }
            for change in comparison.kernels
        ],
    }
