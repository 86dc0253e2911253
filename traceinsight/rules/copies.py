"""Host-to-device copies the host waits for, or that stall compute: one finding per device and fix.

``pageable-memcpy``: copies from pageable host memory (or through a synchronous copy API): the
host waits for each one, and for the sync after it. The copy, its sync and the idle after it are
one problem with one fix (pinned memory + ``non_blocking=True``), so they are one finding.

``blocking-h2d``: copies from pinned memory that still stall: the host syncs after them
(``non_blocking=False``), or they run while no kernel runs. Fix: prefetch on a side stream.
"""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.replay import Fix
from traceinsight.analysis.results import CopyGroup, SyncHotspot
from traceinsight.formatting import format_duration, format_size
from traceinsight.rules import advice, rule
from traceinsight.rules.common import how_often, make_finding, saving_of, source_evidence, usage_amount, where
from traceinsight.rules.findings import Finding
from traceinsight.rules.syncs import waits_for_h2d

#: Host memory kinds a copy cannot be queued from without the host waiting (ROCm says ``Host``).
_UNPINNED = frozenset({"Pageable", "Host"})


def _blocks_host(group: CopyGroup) -> bool:
    return group.src in _UNPINNED


def _copy_lines(groups: list[CopyGroup]) -> list[tuple[str, str]]:
    return [
        (
            group.kind,
            f"{group.count} copies, {format_size(group.bytes)}, {format_duration(group.duration_ns)} on the GPU, "
            f"{group.overlapped_ns / group.duration_ns if group.duration_ns else 0:.0%} under compute",
        )
        for group in groups
    ]


def _hotspots(analysis: Analysis, kinds: set[str]) -> list[SyncHotspot]:
    return [h for h in analysis.sync_hotspots if waits_for_h2d(h) and h.copy in kinds]


def _wait_lines(hotspots: list[SyncHotspot]) -> list[tuple[str, str]]:
    return [
        (
            "host waits after them",
            f"{h.count} × {h.call}"
            + (f" in {h.op_chain}" if h.op_chain else "")
            + f", blocked {format_duration(h.blocked_ns)}",
        )
        for h in hotspots
    ]


def _idle_caused(analysis: Analysis, device: int, hotspots: list[SyncHotspot]) -> str:
    """The steady-state GPU idle in gaps that ``hotspots``' calls caused, per step where there are
    steps (not the device's idle of every blocking copy: other copies' waits are not these)."""
    caused = sum(h.idle_caused_ns for h in hotspots)
    usage = analysis.device_usage(device)
    return format_duration(caused) if usage is None else usage_amount(usage, caused)


def _place(hotspots: list[SyncHotspot]) -> tuple[str | None, str | None, str | None]:
    """(source, source kind, op) of the hot spot that caused the most idle."""
    if not hotspots:
        return None, None, None
    top = max(hotspots, key=lambda h: (h.idle_caused_ns, h.count))
    return top.source, top.source_kind, top.op


@rule("pageable-memcpy")
def pageable_memcpy(analysis: Analysis) -> Iterator[Finding]:
    """Host-to-device copies from pageable memory: the host waits for each (one finding per device)."""
    inputs = analysis.fix_inputs
    devices = sorted({g.device for g in analysis.copies if g.direction == "HtoD" and _blocks_host(g)})
    for device in devices:
        groups = [
            g for g in analysis.copies if g.device == device and g.direction == "HtoD" and _blocks_host(g)
        ]
        kinds = {g.kind for g in groups}
        hotspots = _hotspots(analysis, kinds)
        calls = [call for call in inputs.h2d_copy_calls if call[4] == device and call[3] in kinds]
        if not calls and not any(h.steady_count for h in hotspots):
            continue  # only outside the steady state (start-up): not a problem of the loop
        fix = Fix(
            remove_calls=frozenset(key for h in hotspots for key in h.keys),
            shorten=tuple((start, end, min(end - start, inputs.launch_cost_ns)) for start, end, *_ in calls),
        )
        saving = saving_of(analysis, fix)
        note = "replayed with each copy queued without waiting (the GPU copy itself takes as long)"
        source, source_kind, op = _place(hotspots)
        place = where(source, source_kind)
        often = how_often(analysis, len(calls)) if calls else f"{sum(g.count for g in groups)} times"
        evidence = (
            _copy_lines(groups)
            + _wait_lines(hotspots)
            + [
                (
                    "GPU idle waiting on these copies",
                    _idle_caused(analysis, device, hotspots),
                ),
                ("source", source_evidence(source, source_kind, analysis.meta.recorded_by_run)),
            ]
        )
        yield make_finding(
            analysis,
            "pageable-memcpy",
            saving,
            title=f"`.to('cuda')` from pageable memory{f' at {place}' if place else ''} makes the host "
            f"wait for each copy ({often}, {format_size(sum(g.bytes for g in groups))} in all)",
            evidence=(evidence),
            advice=advice.PINNED_COPY,
            why="A copy from pageable memory is staged through a driver buffer while the host waits, "
            "and the synchronize after it drains the GPU's queue: the GPU idles until the host has "
            "launched the next work.",
            op=op,
            source=source,
            device=device,
            source_kind=source_kind,
            note=note,
        )


@rule("blocking-h2d")
def blocking_h2d(analysis: Analysis) -> Iterator[Finding]:
    """Pinned host-to-device copies that still stall: the host waits for them, or they run alone."""
    limits = analysis.thresholds
    inputs = analysis.fix_inputs
    window = analysis.steady.window_ns or analysis.span_ns
    devices = sorted({g.device for g in analysis.copies if g.direction == "HtoD" and not _blocks_host(g)})
    for device in devices:
        groups = [
            g for g in analysis.copies if g.device == device and g.direction == "HtoD" and not _blocks_host(g)
        ]
        kinds = {g.kind for g in groups}
        hotspots = _hotspots(analysis, kinds)
        duration = sum(g.duration_ns for g in groups)
        overlapped = sum(g.overlapped_ns for g in groups)
        exposed = duration - overlapped
        stalls = (
            duration
            and overlapped / duration < limits.h2d_overlap_ratio
            and exposed >= limits.h2d_exposed_share * window
        )
        if not hotspots and not stalls:
            continue
        calls = [call for call in inputs.h2d_copy_calls if call[4] == device and call[3] in kinds]
        fix = Fix(
            remove_calls=frozenset(key for h in hotspots for key in h.keys),
            side_stream=frozenset(call[2] for call in calls),
        )
        saving = saving_of(analysis, fix)
        note = "replayed with these copies on a stream of their own, prefetched under compute"
        source, source_kind, op = _place(hotspots)
        place = where(source, source_kind)
        ratio = overlapped / duration if duration else 0.0
        what = "the host waits for them" if hotspots else "they run while no kernel runs"
        evidence = (
            _copy_lines(groups)
            + _wait_lines(hotspots)
            + [
                ("copy time not under compute", f"{format_duration(exposed)} ({1 - ratio:.0%})"),
                ("source", source_evidence(source, source_kind, analysis.meta.recorded_by_run)),
            ]
        )
        yield make_finding(
            analysis,
            "blocking-h2d",
            saving,
            title=f"Host-to-device copies{f' at {place}' if place else ''} stall the GPU: {what}",
            evidence=(evidence),
            advice=advice.PREFETCH,
            why="While a copy runs alone the SMs have nothing to do, and a copy the host waits for "
            "stops it from queueing the next kernels; copies issued from pinned memory on another "
            "stream run underneath kernels instead.",
            op=op,
            source=source,
            device=device,
            source_kind=source_kind,
            note=note,
        )
