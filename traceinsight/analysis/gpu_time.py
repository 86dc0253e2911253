"""GPU busy (by class), idle (by cause) and span per device and per step.

Busy classes: each busy nanosecond is counted once, compute first (the union of non-communication
kernels), then communication kernels (NCCL/RCCL, see :mod:`taxonomy`) where no compute ran, then
copies and memsets where no kernel ran. So compute + communication + exposed copies = busy.

Idle is the time between merged busy blocks, each gap with one cause (:mod:`.idle_gaps`); per
device, the part of a gap outside the steady-state windows is ``outside-steady-state``; per step,
the window's time before the device's first or after its last GPU work is ``before-first-work`` /
``after-last-work``. Either way the causes add up to the idle time exactly.

GPU time is judged on the GPU's clock: a step's window is its device window, from when the step
before it was done to when its own work was done (:mod:`.steady`), and the steady state's windows
are those windows' runs (``SteadySteps.device_windows``).
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import polars as pl

from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.intervals import merge_intervals, overlap_ns, plain_ints
from traceinsight.analysis.results import Device, Step
from traceinsight.analysis.shared import gpu_classes
from traceinsight.analysis.steady import SteadySteps
from traceinsight.analysis.usage import Usage
from traceinsight.arrays import distinct, series
from traceinsight.load import Trace


def busy_intervals(trace: Trace) -> pl.DataFrame:
    """Union of kernel, copy and memset intervals per device → ``device, start, end``."""
    return merge_intervals(
        trace.gpu.select("device", "ts", "end").filter(pl.col("device").is_not_null()), by="device"
    )


def kernel_intervals(trace: Trace) -> pl.DataFrame:
    """Union of kernel intervals only, per device → ``device, start, end`` (compute and communication)."""
    return merge_intervals(
        trace.gpu.select("kind", "device", "ts", "end").filter(pl.col("kind") == "kernel"), by="device"
    )


def compute_intervals(trace: Trace, classes: pl.DataFrame | None = None) -> pl.DataFrame:
    """Union of non-communication kernel intervals per device → ``device, start, end``.
    ``classes`` is :func:`~traceinsight.analysis.shared.gpu_classes` when the caller has it."""
    gpu = gpu_classes(trace) if classes is None else classes
    return merge_intervals(gpu.filter((pl.col("kind") == "kernel") & ~pl.col("communication")), by="device")


def _lengths(intervals: pl.DataFrame) -> dict[int, int]:
    table = intervals.group_by("device").agg(total=(pl.col("end") - pl.col("start")).sum())
    return dict(table.iter_rows())


def _clipped(intervals: pl.DataFrame, windows: pl.DataFrame, keys: list[str]) -> pl.DataFrame:
    """Length of ``intervals`` (device, start, end) inside each window (``keys``, device?, start, end).

    Windows with a ``device`` column are matched on it; without one, every device's intervals count.
    """
    on_device = "device" in windows.columns
    joined = windows.join_where(
        intervals.rename({"device": "i_device", "start": "i_start", "end": "i_end"}),
        pl.col("i_start") < pl.col("end"),
        pl.col("i_end") > pl.col("start"),
    )
    if on_device:
        joined = joined.filter(pl.col("device") == pl.col("i_device"))
    else:
        joined = joined.with_columns(device=pl.col("i_device"))
    group = [*keys, "device"] if "device" not in keys else keys
    return joined.group_by(group).agg(ns=overlap_ns("start", "end", "i_start", "i_end").sum())


def _inside_blocks(intervals: pl.DataFrame, grid: pl.DataFrame) -> dict[tuple[int, int], int] | None:
    """What :func:`_clipped` sums per ``(step, device)`` window of ``grid``, for ``intervals`` that
    are disjoint blocks on each device (:func:`merge_intervals`' output), found without the join:
    a device's blocks in start order end in order too, so the blocks meeting a window are a run
    found by two binary searches, and its length is a difference of prefix sums less what sticks
    out at either edge. The join kept a row per block and window (+25 MiB of the step times' memory
    on a 0.5 GB DDP trace). Blocks may touch (a zero-length kernel between two gaps of one cause
    does that) but not overlap. None where a column is not Int64 without nulls, the blocks overlap,
    or the times span 2**62 ns or more (the differences could overflow): the join counts those. A
    window without blocks in it has no entry, and a window given twice sums, as in the join's."""
    columns = (
        *(intervals.get_column(name) for name in ("device", "start", "end")),
        *(grid.get_column(name) for name in ("step", "device", "start", "end")),
    )
    if not plain_ints(*columns):
        return None
    devices, starts, ends, steps, window_devices, window_starts, window_ends = (
        column.to_numpy() for column in columns
    )
    if devices.size and window_devices.size:
        times = (starts, ends, window_starts, window_ends)
        if max(int(t.max()) for t in times) - min(int(t.min()) for t in times) >= 2**62:
            return None
    order = np.lexsort((ends, starts, devices))  # by start, and a zero-length block first
    devices, starts, ends = devices[order], starts[order], ends[order]
    same_device = devices[1:] == devices[:-1]
    if bool(np.any(ends < starts)) or bool(np.any(same_device & (starts[1:] < ends[:-1]))):
        return None
    prefix = np.concatenate(([0], np.cumsum(ends - starts)))
    found: dict[tuple[int, int], int] = {}
    for device in distinct(window_devices).tolist():
        first, last = np.searchsorted(devices, device, "left"), np.searchsorted(devices, device, "right")
        rows = np.flatnonzero(window_devices == device)
        begin, end = window_starts[rows], window_ends[rows]
        low = first + np.searchsorted(ends[first:last], begin, "right")  # the first block ending after
        high = first + np.searchsorted(starts[first:last], end, "left")  # past the last starting before
        met = high > low
        low, high, begin, end, rows = low[met], high[met], begin[met], end[met], rows[met]
        inside = (
            prefix[high]
            - prefix[low]
            - np.maximum(0, begin - starts[low])
            - np.maximum(0, ends[high - 1] - end)
        )
        # A window that ends before it begins meets a block over both its edges: no time inside.
        inside = np.where(end > begin, inside, 0)
        for step, ns in zip(steps[rows].tolist(), inside.tolist(), strict=True):
            found[(step, device)] = found.get((step, device), 0) + ns
    return found


def _total_inside(intervals: pl.DataFrame, windows: pl.DataFrame) -> int:
    """Summed length of ``intervals`` inside ``windows`` (``window, start, end``)."""
    table = _clipped(intervals, windows, ["window"])
    return int(table.get_column("ns").sum()) if table.height else 0


def device_times(
    trace: Trace,
    busy: pl.DataFrame,
    kernels: pl.DataFrame,
    compute: pl.DataFrame,
    gaps: pl.DataFrame,
    steady: SteadySteps,
) -> tuple[Device, ...]:
    """Busy (by class), span, and idle split by cause per device (see the module doc)."""
    if trace.gpu.is_empty() or busy.is_empty():
        return ()
    per_device = busy.group_by("device").agg(
        busy=(pl.col("end") - pl.col("start")).sum(),
        first=pl.col("start").min(),
        last=pl.col("end").max(),
    )
    kernel_busy, compute_busy = _lengths(kernels), _lengths(compute)
    copies = dict(
        trace.gpu.filter(pl.col("kind") == "memcpy").group_by("device").agg(pl.col("dur").sum()).iter_rows()
    )
    split = idle_split(gaps, steady)
    names = {device.index: device.name for device in trace.meta.devices}
    result = []
    for row in per_device.sort("device").iter_rows(named=True):
        device = row["device"]
        kernel = kernel_busy.get(device, 0)
        compute_ns = compute_busy.get(device, 0)
        span = row["last"] - row["first"]
        result.append(
            Device(
                device=device,
                name=names.get(device),
                span_ns=span,
                busy_ns=row["busy"],
                idle_ns=span - row["busy"],
                kernel_ns=kernel,
                copy_ns=copies.get(device, 0) or 0,
                utilization=round(row["busy"] / span, 4) if span else 0.0,
                compute_ns=compute_ns,
                communication_ns=kernel - compute_ns,
                copy_exposed_ns=row["busy"] - kernel,
                idle_by_cause_ns=dict(split.get(device, ())),
                first_ns=row["first"],
                last_ns=row["last"],
            )
        )
    return tuple(result)


def _ranked(by_cause: dict[str, int]) -> tuple[tuple[str, int], ...]:
    return tuple(
        sorted(((kind, ns) for kind, ns in by_cause.items() if ns > 0), key=lambda item: (-item[1], item[0]))
    )


def idle_split(gaps: pl.DataFrame, steady: SteadySteps) -> dict[int, tuple[tuple[str, int], ...]]:
    """Per device: gap time by cause inside the steady-state windows (on the GPU's clock), the rest
    ``outside-steady-state``."""
    if gaps.is_empty():
        return {}
    windows = pl.DataFrame(
        {
            "start": [start for start, _ in steady.device_windows],
            "end": [end for _, end in steady.device_windows],
        },
        schema={"start": pl.Int64, "end": pl.Int64},
    )
    table = gaps.select("device", "start", "end", "duration", "cause_kind")
    starts, ends = windows.get_column("start").to_numpy(), windows.get_column("end").to_numpy()
    if starts.size and bool(np.all(starts[1:] >= ends[:-1])) and bool(np.all(ends >= starts)):
        # Disjoint windows in order: a gap's time inside them is the windows' time up to its end
        # minus their time up to its start (one search per gap, not a join of gaps and windows).
        lengths = ends - starts
        before = np.cumsum(lengths) - lengths

        def covered(times: np.ndarray) -> np.ndarray:
            at = np.searchsorted(starts, times, side="right") - 1
            window = np.maximum(at, 0)
            return np.where(at >= 0, before[window] + np.minimum(times - starts[window], lengths[window]), 0)

        inside = covered(table.get_column("end").to_numpy()) - covered(table.get_column("start").to_numpy())
        table = table.with_columns(inside=series(inside, dtype=pl.Int64))
    else:
        indexed = table.with_row_index("gap")
        overlaps = (
            indexed.join_where(
                windows.rename({"start": "w_start", "end": "w_end"}),
                pl.col("w_start") < pl.col("end"),
                pl.col("w_end") > pl.col("start"),
            )
            .group_by("gap")
            .agg(inside=overlap_ns("start", "end", "w_start", "w_end").sum())
        )
        table = indexed.join(overlaps, on="gap", how="left").with_columns(pl.col("inside").fill_null(0))
    totals = (
        table.group_by("device", "cause_kind")
        .agg(inside=pl.col("inside").sum(), outside=(pl.col("duration") - pl.col("inside")).sum())
        .sort("device", "cause_kind")
    )
    by_device: dict[int, dict[str, int]] = defaultdict(lambda: defaultdict(int))
    for device, kind, inside_ns, outside_ns in totals.iter_rows():
        by_device[device][kind] += inside_ns
        by_device[device][CauseKind.OUTSIDE_STEADY.value] += outside_ns
    for device, waiting_ns in _waiting(table, steady).items():
        by_device[device][CauseKind.OUTSIDE_STEADY.value] -= waiting_ns
        by_device[device][CauseKind.WAITING.value] += waiting_ns
    return {device: _ranked(causes) for device, causes in by_device.items()}


def _waiting(gaps: pl.DataFrame, steady: SteadySteps) -> dict[int, int]:
    """Per device: gap time between two steady requests (one's done to the next one's start), the
    server waiting for work; empty unless the steps are requests. Outside every window already."""
    between = steady.between_requests
    if not between:
        return {}
    intervals = pl.DataFrame(
        {"w_start": [a for a, _ in between], "w_end": [b for _, b in between]},
        schema={"w_start": pl.Int64, "w_end": pl.Int64},
    )
    waited = (
        gaps.select("device", "start", "end")
        .join_where(intervals, pl.col("w_start") < pl.col("end"), pl.col("w_end") > pl.col("start"))
        .group_by("device")
        .agg(ns=overlap_ns("start", "end", "w_start", "w_end").sum())
    )
    return {device: ns for device, ns in waited.iter_rows()}


def _gaps_inside(grid: pl.DataFrame, gaps: pl.DataFrame) -> dict[tuple[int, int, str], int]:
    """The classified ``gaps``' time inside each ``(step, device)`` window of ``grid``, per cause:
    a device's gaps of one cause are disjoint blocks (:func:`_inside_blocks`); the join where they
    are not (a window and cause without gaps has no entry either way)."""
    kinds = gaps.get_column("cause_kind")
    if kinds.null_count():
        return _gaps_joined(grid, gaps)
    found: dict[tuple[int, int, str], int] = {}
    blocks = gaps.select("device", "start", "end")
    for kind in kinds.unique().sort().to_list():
        inside = _inside_blocks(blocks.filter(kinds == kind), grid)
        if inside is None:
            return _gaps_joined(grid, gaps)
        for (step, device), ns in inside.items():
            found[(step, device, kind)] = ns
    return found


def _gaps_joined(grid: pl.DataFrame, gaps: pl.DataFrame) -> dict[tuple[int, int, str], int]:
    """:func:`_gaps_inside` by an inequality join of every window with every gap."""
    idle_in = (
        grid.join_where(
            gaps.select(g_device="device", g_start="start", g_end="end", cause_kind="cause_kind"),
            pl.col("g_start") < pl.col("end"),
            pl.col("g_end") > pl.col("start"),
        )
        .filter(pl.col("device") == pl.col("g_device"))
        .group_by("step", "device", "cause_kind")
        .agg(idle=overlap_ns("start", "end", "g_start", "g_end").sum())
    )
    return {(step, device, kind): ns for step, device, kind, ns in idle_in.iter_rows()}


def _idle_by_cause(
    grid: pl.DataFrame, gaps: pl.DataFrame, extent: dict[int, tuple[int, int]]
) -> dict[tuple[int, int], dict[str, int]]:
    """Idle by cause in each (step, device) window of ``grid`` (``step, device, start, end``): the
    classified gaps clipped to it, and its time before the device's first or after its last work."""
    causes: dict[tuple[int, int], dict[str, int]] = defaultdict(dict)
    if gaps.height:
        for (step, device, kind), ns in _gaps_inside(grid, gaps).items():
            causes[(step, device)][kind] = ns
    for step, device, start, end in grid.select("step", "device", "start", "end").iter_rows():
        first, last = extent[device]
        before = max(0, min(end, first) - start)
        after = max(0, end - max(start, last))
        if before:
            causes[(step, device)][CauseKind.BEFORE_FIRST.value] = before
        if after:
            causes[(step, device)][CauseKind.AFTER_LAST.value] = after
    return causes


def step_times(
    trace: Trace,
    busy: pl.DataFrame,
    kernels: pl.DataFrame,
    compute: pl.DataFrame,
    gaps: pl.DataFrame,
    steady: SteadySteps,
) -> tuple[Step, ...]:
    """GPU time inside each step's device window, per device: busy by class and idle by cause, and
    the idle before the step's own first GPU work (module doc; the first work is
    :attr:`~traceinsight.analysis.steady.SteadySteps.first_work`)."""
    if not steady.steps or busy.is_empty():
        return ()
    windows = pl.DataFrame(
        {
            "step": [step.step for step in steady.steps],
            "start": [step.begin_ns for step in steady.steps],
            "end": [step.done_ns for step in steady.steps],
        },
        schema={"step": pl.Int64, "start": pl.Int64, "end": pl.Int64},
    )
    grid = windows.join(busy.select("device").unique(), how="cross")
    keys = ["step", "device"]

    def inside(intervals: pl.DataFrame) -> dict[tuple[int, int], int]:
        """Without a join where the intervals are disjoint blocks (busy, kernels, compute), by
        the join where they overlap (copies)."""
        found = _inside_blocks(intervals, grid)
        if found is None:
            table = _clipped(intervals, grid, keys)
            found = {(step, device): ns for step, device, ns in table.iter_rows()}
        return found

    busy_in, kernel_in, compute_in = inside(busy), inside(kernels), inside(compute)
    copies = trace.gpu.filter(pl.col("kind") == "memcpy").select("device", start="ts", end="end")
    copy_in = inside(copies)  # summed copy durations clipped to the window (copies may overlap)
    extent = {
        device: (first, last)
        for device, first, last in busy.group_by("device")
        .agg(pl.col("start").min(), pl.col("end").max())
        .iter_rows()
    }
    causes = _idle_by_cause(grid, gaps, extent)
    # The lead: from the window's start to the step's own first work on the device.
    first_own = steady.first_work
    leads = pl.DataFrame(
        [
            (step, device, start, min(end, first_own[(step, device)]))
            for step, device, start, end in grid.select("step", "device", "start", "end").iter_rows()
            if first_own.get((step, device), start) > start
        ],
        schema={"step": pl.Int64, "device": pl.Int64, "start": pl.Int64, "end": pl.Int64},
        orient="row",
    )
    lead_causes = _idle_by_cause(leads, gaps, extent) if leads.height else {}
    judged = {step.step: step for step in steady.steps}
    origin = trace.meta.origin_ns
    result = []
    for step_number, device, start, end in (
        grid.sort("start", "device").select("step", "device", "start", "end").iter_rows()
    ):
        key = (step_number, device)
        kernel, compute_ns, busy_ns = kernel_in.get(key, 0), compute_in.get(key, 0), busy_in.get(key, 0)
        info = judged[step_number]
        result.append(
            Step(
                step=step_number,
                device=device,
                start_ns=start - origin,
                span_ns=end - start,
                host_start_ns=info.start_ns - origin,
                host_span_ns=info.end_ns - info.start_ns,
                busy_ns=busy_ns,
                idle_ns=end - start - busy_ns,
                copy_ns=copy_in.get(key, 0),
                idle_by_cause_ns=dict(_ranked(causes.get(key, {}))),
                compute_ns=compute_ns,
                communication_ns=kernel - compute_ns,
                copy_exposed_ns=busy_ns - kernel,
                steady=info.steady,
                not_steady_because=info.reason,
                lead_by_cause_ns=_ranked(lead_causes.get(key, {})),
                first_work_ns=first_own.get(key),
            )
        )
    return tuple(result)


def steady_usage(
    devices: tuple[Device, ...],
    steps: tuple[Step, ...],
    busy: pl.DataFrame,
    kernels: pl.DataFrame,
    compute: pl.DataFrame,
    gaps: pl.DataFrame,
    steady: SteadySteps,
) -> tuple[Usage, ...]:
    """How each device spent the steady state (:class:`Usage`).

    With steps: the steady steps' windows summed (busy by class, idle by cause, before/after the
    GPU's work). Without steps: the steady window clipped to the device's span, busy by class and
    each gap's cause inside it.
    """
    result = []
    for device in devices:
        mine = [step for step in steps if step.device == device.device and step.steady]
        outside = device.idle_by_cause_ns.get(CauseKind.OUTSIDE_STEADY.value, 0)
        totals: dict[str, int] = defaultdict(int)
        if mine:
            for step in mine:
                for kind, ns in step.idle_by_cause_ns.items():
                    totals[kind] += ns
            parts = (
                sum(step.compute_ns for step in mine),
                sum(step.communication_ns for step in mine),
                sum(step.copy_exposed_ns for step in mine),
            )
        else:
            clipped = [
                (max(start, device.first_ns), min(end, device.last_ns))
                for start, end in steady.device_windows
                if min(end, device.last_ns) > max(start, device.first_ns)
            ]
            windows = pl.DataFrame(
                {"start": [a for a, _ in clipped], "end": [b for _, b in clipped]},
                schema={"start": pl.Int64, "end": pl.Int64},
            ).with_row_index("window")
            mask = pl.col("device") == device.device

            all_busy, kernel_busy, compute_busy = (
                _total_inside(intervals.filter(mask), windows) for intervals in (busy, kernels, compute)
            )
            parts = (compute_busy, kernel_busy - compute_busy, all_busy - kernel_busy)
            if clipped and gaps.height:
                by_cause = (
                    gaps.filter(mask)
                    .join_where(
                        windows.rename({"start": "w_start", "end": "w_end"}),
                        pl.col("w_start") < pl.col("end"),
                        pl.col("w_end") > pl.col("start"),
                    )
                    .group_by("cause_kind")
                    .agg(ns=overlap_ns("start", "end", "w_start", "w_end").sum())
                )
                totals.update(dict(by_cause.iter_rows()))
        idle = tuple(
            sorted(
                (
                    (CauseKind(kind), ns)
                    for kind, ns in totals.items()
                    if ns and kind in CauseKind._value2member_map_
                ),
                key=lambda item: (-item[1], item[0].value),
            )
        )
        window = sum(parts) + sum(ns for _, ns in idle)
        result.append(Usage(device.device, window, *parts, idle, len(mine), outside))
    return tuple(result)
