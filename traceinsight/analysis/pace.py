"""Which side sets the pace of the steps: the host or the GPU.

A step is done when both its host range and the GPU work it launched have ended
(:mod:`.steady`), so its time is set by whichever side needs longer. Each side's own time per
steady step, waits for the other side left out:

- **host**: the step's host range less the time the host sat in blocking calls (``.item()``,
  ``synchronize``, a pageable copy) waiting for the GPU;
- **GPU**: busy time in the step's device window plus the idle where its next work was already
  queued (it waited on another stream, an event, a peer), that is, all but the idle spent waiting
  for the host to launch work. With several GPUs, the one that needs longest.

The side whose median is more than ``pace_difference`` above the other's sets the pace; within
that, neither clearly does. A host that runs ahead (a ``ProfilerStep`` range of 0.4 ms for 8.4 ms of
GPU work) leaves the GPU setting the pace; a DataLoader the host waits for, the host.
"""

from __future__ import annotations

from statistics import median

import polars as pl

from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.intervals import merge_intervals, overlap_ns
from traceinsight.analysis.results import Step
from traceinsight.analysis.steady import SteadySteps
from traceinsight.compat import StrEnum
from traceinsight.model import Model

__all__ = ["Pace", "PaceSetter", "step_pace"]


class PaceSetter(StrEnum):
    """The side whose own time per step sets the step time (JSON: ``steady_state.pace.set_by``)."""

    HOST = "host"
    GPU = "gpu"


class Pace(Model, frozen=True, kw_only=True):
    """Which side sets the step's pace, and each side's own time per steady step (medians, ns)."""

    #: The side more than ``pace_difference`` above the other (None: neither, or unknown).
    set_by: PaceSetter | None = None
    #: The host's own time: its range less the time blocked waiting for the GPU (None: no steps).
    host_ns: int | None = None
    #: The GPU's own time: busy plus queued idle in the device window (None: no steps or no GPU).
    gpu_ns: int | None = None


def _blocked_in_ranges(calls: pl.DataFrame, ranges: pl.DataFrame) -> dict[int, int]:
    """Per step: the union of blocking calls' time inside its host range (``step, start, end``)."""
    if calls.is_empty() or ranges.is_empty():
        return {}
    merged = merge_intervals(calls.select(one=pl.lit(0), ts="ts", end="end"), "one")
    inside = ranges.join_where(
        merged.select(c_start="start", c_end="end"),
        pl.col("c_start") < pl.col("end"),
        pl.col("c_end") > pl.col("start"),
    )
    table = inside.group_by("step").agg(ns=overlap_ns("start", "end", "c_start", "c_end").sum())
    return dict(table.iter_rows())


def step_pace(steady: SteadySteps, steps: tuple[Step, ...], calls: pl.DataFrame, difference: float) -> Pace:
    """The host's and the GPU's own time per steady step, and which sets the pace (module doc)."""
    steady_steps = steady.steady_steps
    if not steady_steps:
        return Pace()
    ranges = pl.DataFrame(
        {
            "step": [step.step for step in steady_steps],
            "start": [step.start_ns for step in steady_steps],
            "end": [step.end_ns for step in steady_steps],
        },
        schema={"step": pl.Int64, "start": pl.Int64, "end": pl.Int64},
    )
    blocked = _blocked_in_ranges(calls, ranges)
    host = round(median(step.host_ns - blocked.get(step.step, 0) for step in steady_steps))
    per_device: dict[int, list[int]] = {}
    for step in steps:
        if step.steady:
            queued = step.idle_by_cause_ns.get(CauseKind.QUEUED.value, 0)
            per_device.setdefault(step.device, []).append(step.busy_ns + queued)
    if not per_device:
        return Pace(host_ns=host)
    gpu = max(round(median(values)) for values in per_device.values())
    setter = None
    if gpu > (1 + difference) * host:
        setter = PaceSetter.GPU
    elif host > (1 + difference) * gpu:
        setter = PaceSetter.HOST
    return Pace(set_by=setter, host_ns=host, gpu_ns=gpu)
