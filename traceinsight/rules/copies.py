"""Host-to-device copies the host waits for, or that stall compute: one finding per device and fix.

``pageable-memcpy``: copies from pageable host memory (or through a synchronous copy API): the
host waits for each one, and for the sync after it. The copy, its sync and the idle after it are
one problem with one fix (pinned memory + ``non_blocking=True``), so they are one finding. The fix
is replayed as it runs: each copy queued without waiting, on a stream of its own under compute, at
a pinned copy's speed (the trace's own pinned copies', else ``Thresholds.pinned_h2d_gb_per_s``).

``blocking-h2d``: copies from pinned memory that still stall: the host syncs after them
(``non_blocking=False``), or they run while no kernel runs. Fix: prefetch on a side stream.
"""

from __future__ import annotations

from collections.abc import Iterator
from math import ceil

from traceinsight.analysis import Analysis
from traceinsight.analysis.copies import RATE_MIN_BYTES
from traceinsight.analysis.replay import Fix
from traceinsight.analysis.results import H2DCopy, SyncHotspot
from traceinsight.formatting import format_size
from traceinsight.load import taxonomy
from traceinsight.rules import advice
from traceinsight.rules.common import (
    how_often,
    in_saving_unit,
    located_evidence,
    make_finding,
    per_step,
    place,
    saving_of,
)
from traceinsight.rules.findings import Finding
from traceinsight.rules.registry import rule
from traceinsight.rules.syncs import waits_for_h2d

#: Host memory kinds a copy cannot be queued from without the host waiting (ROCm says ``Host``).
_UNPINNED = frozenset({"Pageable", "Host"})


def _blocks_host(kind: str) -> bool:
    return taxonomy.parse_copy_name(kind).src in _UNPINNED


def _steady_copies(analysis: Analysis, device: int, pageable: bool) -> list[H2DCopy]:
    """The steady state's host-to-device copies on ``device``, from pageable memory or not."""
    return [
        copy
        for copy in analysis.fix_inputs.h2d_copies
        if copy.device == device and _blocks_host(copy.kind) == pageable
    ]


def _copy_lines(analysis: Analysis, copies: list[H2DCopy]) -> list[tuple[str, str]]:
    """Per copy name, in the steady state and per step where there are steps: how many, how much,
    their GPU time and the share of it under compute."""
    steps = len(analysis.steady.steady_steps)
    lines = []
    for kind in sorted({copy.kind for copy in copies}):
        mine = [copy for copy in copies if copy.kind == kind]
        size = sum(copy.bytes for copy in mine)
        duration = sum(copy.duration_ns for copy in mine)
        under = sum(copy.overlapped_ns for copy in mine) / duration if duration else 0.0
        amount = (
            f"{how_often(analysis, len(mine))}, {format_size(round(size / steps))} per step"
            if steps
            else f"{len(mine)} copies, {format_size(size)}"
        )
        lines.append(
            (kind, f"{amount}, {per_step(analysis, duration)} on the GPU, {under:.0%} under compute")
        )
    return lines


def _hotspots(analysis: Analysis, kinds: set[str]) -> list[SyncHotspot]:
    return [h for h in analysis.sync_hotspots if waits_for_h2d(h) and h.copy in kinds]


def _wait_lines(analysis: Analysis, hotspots: list[SyncHotspot]) -> list[tuple[str, str]]:
    """The syncs after the copies, in the steady state and in the saving's unit."""
    return [
        (
            "host waits after them",
            f"{how_often(analysis, h.steady_count)}: {h.call}"
            + (f" in {h.op_chain}" if h.op_chain else "")
            + f", blocked {in_saving_unit(analysis, h.steady_blocked_ns)}",
        )
        for h in hotspots
        if h.steady_count
    ]


def _idle_caused(analysis: Analysis, hotspots: list[SyncHotspot]) -> str:
    """The steady-state GPU idle in gaps that ``hotspots``' calls caused, in the saving's unit (not
    the device's idle of every blocking copy: other copies' waits are not these)."""
    return in_saving_unit(analysis, sum(h.idle_caused_ns for h in hotspots))


def _top(hotspots: list[SyncHotspot]) -> SyncHotspot | None:
    """The hot spot that caused the most idle (its line and op stand for the finding's)."""
    return max(hotspots, key=lambda h: (h.idle_caused_ns, h.count)) if hotspots else None


def pinned_rate(analysis: Analysis) -> tuple[float, str]:
    """The rate (GB/s) a pinned host-to-device copy runs at, and where it comes from in words."""
    measured = analysis.fix_inputs.pinned_h2d_gb_per_s
    if measured is not None:
        return measured, "the rate of this trace's own pinned copies"
    assumed = analysis.thresholds.pinned_h2d_gb_per_s
    return assumed, (
        "assumed: a typical pinned rate over PCIe 3.0 x16, the cautious end; the trace has no pinned "
        f"copies of {format_size(RATE_MIN_BYTES)} or more to measure it on"
    )


def _pinned_durations(copies: list[H2DCopy], rate: float) -> tuple[tuple[int, int], ...]:
    """Each copy of ``RATE_MIN_BYTES`` or more at ``rate`` (bytes per ns), never slower than it ran;
    smaller copies keep their time (their set-up outweighs the transfer)."""
    return tuple(
        (copy.correlation, min(copy.duration_ns, ceil(copy.bytes / rate)))
        for copy in copies
        if copy.bytes >= RATE_MIN_BYTES and rate > 0
    )


@rule("pageable-memcpy")
def pageable_memcpy(analysis: Analysis) -> Iterator[Finding]:
    """Host-to-device copies from pageable memory: the host waits for each (one finding per device)."""
    inputs = analysis.fix_inputs
    devices = sorted({g.device for g in analysis.copies if g.direction == "HtoD" and _blocks_host(g.kind)})
    for device in devices:
        kinds = {
            g.kind
            for g in analysis.copies
            if g.device == device and g.direction == "HtoD" and _blocks_host(g.kind)
        }
        hotspots = _hotspots(analysis, kinds)
        copies = _steady_copies(analysis, device, pageable=True)
        if not copies and not any(h.steady_count for h in hotspots):
            continue  # only outside the steady state (start-up): not a problem of the loop
        rate, rate_source = pinned_rate(analysis)
        fix = Fix(
            remove_calls=frozenset(key for h in hotspots for key in h.keys),
            shorten=tuple(
                (
                    copy.call_start_ns,
                    copy.call_end_ns,
                    min(copy.call_end_ns - copy.call_start_ns, inputs.launch_cost_ns),
                )
                for copy in copies
            ),
            side_stream=frozenset(copy.correlation for copy in copies),
            durations=_pinned_durations(copies, rate),
        )
        saving = saving_of(analysis, fix)
        note = (
            "replayed with each copy from pinned memory: queued without waiting, on a stream of its own "
            f"under compute, at {rate:.3g} GB/s ({rate_source})"
        )
        top = _top(hotspots)
        at = place(top) if top else None
        often = how_often(analysis, len(copies)) if copies else "outside the copies' calls"
        size = sum(copy.bytes for copy in copies)
        steps = len(analysis.steady.steady_steps)
        amount = f"{format_size(round(size / steps))} per step" if steps else f"{format_size(size)} in all"
        call_ns = sum(copy.call_end_ns - copy.call_start_ns for copy in copies)
        evidence = [
            *_copy_lines(analysis, copies),
            ("host blocked in the copy calls", in_saving_unit(analysis, call_ns)),
            *_wait_lines(analysis, hotspots),
            ("GPU idle right after the waits", _idle_caused(analysis, hotspots)),
            ("source", located_evidence(top, analysis.meta.recorded_by_run)),
        ]
        yield make_finding(
            analysis,
            saving,
            title=f"`.to('cuda')` from pageable memory{f' {at}' if at else ''} makes the host "
            f"wait for each copy ({often}, {amount})",
            evidence=(evidence),
            advice=advice.PINNED_COPY,
            why="A copy from pageable memory is staged through a driver buffer while the host waits, "
            "and the synchronize after it drains the GPU's queue: the GPU idles until the host has "
            "launched the next work, and the copy runs with no kernel beside it.",
            op=top.op if top else None,
            device=device,
            located=top,
            note=note,
        )


@rule("blocking-h2d")
def blocking_h2d(analysis: Analysis) -> Iterator[Finding]:
    """Pinned host-to-device copies that still stall: the host waits for them, or they run alone."""
    limits = analysis.thresholds
    window = analysis.steady.window_ns or analysis.span_ns
    devices = sorted(
        {g.device for g in analysis.copies if g.direction == "HtoD" and not _blocks_host(g.kind)}
    )
    for device in devices:
        kinds = {
            g.kind
            for g in analysis.copies
            if g.device == device and g.direction == "HtoD" and not _blocks_host(g.kind)
        }
        hotspots = [h for h in _hotspots(analysis, kinds) if h.steady_count]
        copies = _steady_copies(analysis, device, pageable=False)
        duration = sum(copy.duration_ns for copy in copies)
        overlapped = sum(copy.overlapped_ns for copy in copies)
        exposed = duration - overlapped
        stalls = (
            duration
            and overlapped / duration < limits.h2d_overlap_ratio
            and exposed >= limits.h2d_exposed_share * window
        )
        if not hotspots and not stalls:
            continue
        fix = Fix(
            remove_calls=frozenset(key for h in hotspots for key in h.keys),
            side_stream=frozenset(copy.correlation for copy in copies),
        )
        saving = saving_of(analysis, fix)
        note = "replayed with these copies on a stream of their own, prefetched under compute"
        top = _top(hotspots)
        at = place(top) if top else None
        ratio = overlapped / duration if duration else 0.0
        what = "the host waits for them" if hotspots else "they run while no kernel runs"
        evidence = (
            _copy_lines(analysis, copies)
            + _wait_lines(analysis, hotspots)
            + [
                (
                    "copy time not under compute",
                    f"{in_saving_unit(analysis, exposed)}, {1 - ratio:.0%} of it",
                ),
                ("source", located_evidence(top, analysis.meta.recorded_by_run)),
            ]
        )
        yield make_finding(
            analysis,
            saving,
            title=f"Host-to-device copies{f' {at}' if at else ''} stall the GPU: {what}",
            evidence=(evidence),
            advice=advice.PREFETCH,
            why="While a copy runs alone the SMs have nothing to do, and a copy the host waits for "
            "stops it from queueing the next kernels; copies issued from pinned memory on another "
            "stream run underneath kernels instead.",
            op=top.op if top else None,
            device=device,
            located=top,
            note=note,
        )
