"""How each GPU spent the steady state: busy by class and idle by cause, per step when there are
steps. What the scorecard, the "where the time goes" table and ``low-gpu-utilization`` show."""

from __future__ import annotations

from traceinsight.analysis.causes import CauseKind
from traceinsight.model import Model, field

__all__ = ["Usage", "total_usage"]


class Usage(Model, frozen=True):
    """One device over the steady state. window = compute + communication + copies + idle, exactly."""

    device: int
    #: The time judged: the steady steps' windows summed, else the GPU span without the start-up.
    window_ns: int
    compute_ns: int
    communication_ns: int
    copy_ns: int
    #: Idle by cause, largest first (time outside the steady state is not in the window); in a
    #: result's JSON ``idle_us``, ``[cause, µs]`` pairs.
    idle: tuple[tuple[CauseKind, int], ...] = field(metadata={"ns": True, "key": "idle_us"})
    #: Steady steps the window holds (0 without steps).
    steps: int
    #: Idle outside the steady state on this device (start-up, outlier steps), not in the window.
    outside_ns: int = 0

    @property
    def busy_ns(self) -> int:
        """Compute + communication + exposed copies."""
        return self.compute_ns + self.communication_ns + self.copy_ns

    @property
    def idle_ns(self) -> int:
        """Window minus busy."""
        return sum(ns for _, ns in self.idle)

    @property
    def of_what(self) -> str:
        """What shares are of, in words: ``each step``, else ``the time analyzed`` or ``the time``."""
        if self.steps:
            return "each step"
        return "the time analyzed" if self.outside_ns else "the time"

    def share(self, ns: int) -> float:
        """``ns`` as a share of the window (0 for an empty window)."""
        return ns / self.window_ns if self.window_ns else 0.0

    def per_step(self, ns: int) -> int | None:
        """``ns`` per steady step (None without steps)."""
        return round(ns / self.steps) if self.steps else None


def total_usage(usages: tuple[Usage, ...]) -> Usage:
    """Every device's steady state added up (device -1): what the scorecard and the JSON headline."""
    idle: dict[CauseKind, int] = {}
    for usage in usages:
        for kind, ns in usage.idle:
            idle[kind] = idle.get(kind, 0) + ns
    return Usage(
        device=-1,
        window_ns=sum(usage.window_ns for usage in usages),
        compute_ns=sum(usage.compute_ns for usage in usages),
        communication_ns=sum(usage.communication_ns for usage in usages),
        copy_ns=sum(usage.copy_ns for usage in usages),
        idle=tuple(sorted(idle.items(), key=lambda item: (-item[1], item[0].value))),
        steps=max((usage.steps for usage in usages), default=0),
        outside_ns=sum(usage.outside_ns for usage in usages),
    )
