"""``launch-bound``: the GPU runs each kernel faster than the host can launch the next one.

The pattern is decided from the gaps themselves (:class:`~traceinsight.analysis.launching.LaunchPattern`):
many short ``host-bound`` gaps (at least ``launch_bound_min_gaps`` per step, each under
``launch_gap_max_us``) between kernels, adding up to ``launch_bound_share`` of the step. A few long
pauses of the host (Python, I/O, a sleep between launches) are not launch overhead: they are left
to ``low-gpu-utilization``. The saving is the idle in the short gaps (an upper bound: with a CUDA
graph or fused kernels the host's dispatch leaves the step).
"""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.launching import LaunchPattern
from traceinsight.analysis.usage import Usage
from traceinsight.formatting import format_duration, format_share
from traceinsight.rules import advice, rule
from traceinsight.rules.common import make_finding, saving_from_total, usage_amount
from traceinsight.rules.findings import Finding


def device_pattern(analysis: Analysis, device: int) -> LaunchPattern | None:
    """The launch pattern measured on ``device`` (None when it had no kernels nor host-bound gaps)."""
    return next((pattern for pattern in analysis.launching.patterns if pattern.device == device), None)


def per_step(usage: Usage, count: int) -> str:
    """``12`` per steady step with steps (``0.5`` under 10), else ``12`` in all."""
    if not usage.steps:
        return f"{count:,}"
    value = count / usage.steps
    return f"{value:,.0f}" if value >= 10 or value == round(value) else f"{value:.1f}"


def _plural(count: str, noun: str) -> str:
    return f"{count} {noun}" if count == "1" else f"{count} {noun}s"


def _of_what(usage: Usage) -> str:
    return " per step" if usage.steps else ""


def launch_pattern(analysis: Analysis, usage: Usage) -> LaunchPattern | None:
    """``usage``'s launch pattern when it makes the device launch-bound (see the module doc)."""
    limits = analysis.thresholds
    pattern = device_pattern(analysis, usage.device)
    if pattern is None or usage.window_ns < limits.min_span_us * 1000:
        return None
    many = pattern.short_gaps >= limits.launch_bound_min_gaps * max(1, usage.steps)
    if many and pattern.short_ns >= limits.launch_bound_share * usage.window_ns:
        return pattern
    return None


def launch_idle(analysis: Analysis, usage: Usage) -> int | None:
    """The idle of ``usage`` in the launch pattern's short gaps, when it is ``launch-bound``."""
    pattern = launch_pattern(analysis, usage)
    return pattern.short_ns if pattern is not None else None


def pattern_words(analysis: Analysis, usage: Usage, pattern: LaunchPattern) -> str:
    """``10 gaps under 1.00 ms (median 80.0 µs) between 10 kernels (median 20.0 µs) per step``."""
    limit = format_duration(round(analysis.thresholds.launch_gap_max_us * 1000))
    return (
        f"{_plural(per_step(usage, pattern.short_gaps), 'gap')} under {limit} (median "
        f"{format_duration(pattern.median_gap_ns)}) between {_plural(per_step(usage, pattern.kernels), 'kernel')} "
        f"(median {format_duration(pattern.median_kernel_ns)}){_of_what(usage)}"
    )


def pauses_words(pattern: LaunchPattern) -> str:
    """``1 pause of the host, the longest 18.00 ms: not the many short gaps of launch overhead``."""
    return (
        f"{pattern.long_gaps:,} pause{'s' if pattern.long_gaps != 1 else ''} of the host, the longest "
        f"{format_duration(pattern.longest_gap_ns)}: not the many short gaps of launch overhead"
    )


@rule("launch-bound")
def launch_bound(analysis: Analysis) -> Iterator[Finding]:
    """Many short gaps between kernels while the launching thread issues work, ``launch_bound_share``
    of the step (see the module doc)."""
    stats = analysis.launching
    for usage in analysis.usage:
        pattern = launch_pattern(analysis, usage)
        if pattern is None:
            continue
        idle = pattern.short_ns
        saving = saving_from_total(analysis, idle, usage.window_ns)
        evidence = [
            ("GPU idle while the host launched", usage_amount(usage, idle)),
            ("the pattern", pattern_words(analysis, usage, pattern)),
            (
                "share of the host-launch idle in such gaps",
                format_share(pattern.short_share)
                + (f"; the rest is {pauses_words(pattern)}" if pattern.long_gaps else ""),
            ),
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
        compiled = stats.compiled
        if compiled.compiled_kernels:
            evidence.append(("torch.compile", compiled.words()))
        yield make_finding(
            analysis,
            "launch-bound",
            saving,
            title=f"The host cannot launch kernels fast enough: GPU {usage.device} waits "
            f"{format_share(usage.share(idle))} of {usage.of_what} in "
            f"{per_step(usage, pattern.short_gaps)} short gaps between "
            f"{per_step(usage, pattern.kernels)} kernels{_of_what(usage)} (median gap "
            f"{format_duration(pattern.median_gap_ns)}, median kernel "
            f"{format_duration(pattern.median_kernel_ns)})",
            evidence=evidence,
            advice=advice.launch_bound(compiled),
            why="Each kernel finishes before the host has prepared and launched the next one (Python, "
            "operator dispatch, the launch call), so the GPU idles between tiny kernels.",
            note="an upper bound: the idle in the short gaps the host's launching leaves, which a CUDA "
            "graph or fused kernels remove",
            device=usage.device,
        )
