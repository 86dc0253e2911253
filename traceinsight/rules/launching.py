"""``launch-bound``: the GPU runs each kernel faster than the host can launch the next one.

Its saving is the idle the host's launching leaves (an upper bound: with a CUDA graph or fused
kernels the host's dispatch leaves the step).
"""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.usage import Usage
from traceinsight.formatting import format_duration, format_share
from traceinsight.rules import advice, rule
from traceinsight.rules.common import make_finding, saving_from_total, usage_amount
from traceinsight.rules.findings import Finding


def launch_idle(analysis: Analysis, usage: Usage) -> int | None:
    """The idle of ``usage`` that launch overhead leaves, when it is enough for ``launch-bound``."""
    idle = dict(usage.idle).get(CauseKind.LAUNCH, 0)
    long_enough = usage.window_ns >= analysis.thresholds.min_span_us * 1000
    if long_enough and idle >= analysis.thresholds.launch_bound_share * usage.window_ns:
        return idle
    return None


@rule("launch-bound")
def launch_bound(analysis: Analysis) -> Iterator[Finding]:
    """GPU idle while the launching thread is busy issuing work, ``launch_bound_share`` of the step."""
    stats = analysis.launching
    for usage in analysis.usage:
        idle = launch_idle(analysis, usage)
        if idle is None:
            continue
        saving = saving_from_total(analysis, idle, usage.window_ns)
        per_step = (
            f"{stats.kernels_per_step:,.0f} kernels per step"
            if stats.kernels_per_step
            else f"{stats.kernels:,} kernels"
        )
        evidence = [
            (
                "GPU idle while the host launched",
                usage_amount(usage, idle),
            ),
            ("kernels", per_step),
            ("median kernel", format_duration(stats.median_kernel_ns)),
            ("median launch call", format_duration(stats.median_launch_ns)),
        ]
        if stats.dispatching:
            evidence.append(
                (
                    "the host was dispatching",
                    "; ".join(
                        f"{op} ({format_duration(ns)} in {gaps} gaps)" for op, ns, gaps in stats.dispatching
                    ),
                )
            )
        yield make_finding(
            analysis,
            "launch-bound",
            saving,
            title=f"The host cannot launch kernels fast enough: GPU {usage.device} waits "
            f"{format_share(usage.share(idle))} of {usage.of_what} for the next launch "
            f"({per_step}, median {format_duration(stats.median_kernel_ns)} each)",
            evidence=evidence,
            advice=advice.LAUNCH_BOUND,
            why="Each kernel finishes before the host has prepared and launched the next one (Python, "
            "operator dispatch, the launch call), so the GPU idles between tiny kernels.",
            note="an upper bound: the idle the host's launching leaves, which a CUDA graph or fused "
            "kernels remove",
            device=usage.device,
        )
