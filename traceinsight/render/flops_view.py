"""The FLOP count and MFU as every renderer shows them, read from the result's :class:`~traceinsight.
results.trace.Flops` only: scorecard rows (MFU split into busy × efficiency, FLOPs per step with their
coverage) and a table of the kernels doing the most counted FLOPs. A trace without recorded shapes
shows none of it."""

from __future__ import annotations

from traceinsight.formatting import format_share
from traceinsight.render.tables import KernelTable
from traceinsight.results.trace import Flops

__all__ = ["flop_kernel_table", "flops_scores", "format_flops", "format_rate"]

#: A scorecard row: (label, value, verdict, level), as :class:`~.scorecard.Score` takes them.
Row = tuple[str, str, str, str]

_PREFIXES = ((1e18, "E"), (1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"))


def format_flops(value: float) -> str:
    """``8.19 GFLOP``: three significant digits and an SI prefix."""
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale:
            return f"{value / scale:.3g} {prefix}FLOP"
    return f"{value:.3g} FLOP"


def format_rate(value: float | None) -> str:
    """``40.6 TFLOP/s`` (— when unknown)."""
    return "—" if value is None else format_flops(value) + "/s"


def flops_scores(flops: Flops) -> tuple[Row, ...]:
    """The scorecard's rows: MFU per device (or achieved FLOP/s and why there is no MFU), and the
    FLOPs per step with the share of kernel time they cover. Empty without counted FLOPs."""
    if not flops.flops:
        return ()
    scores: list[Row] = []
    for device in flops.mfu:
        where = f"GPU {device.device}: " if len(flops.mfu) > 1 else ""
        if device.mfu is None or device.efficiency_while_busy is None:
            scores.append(
                (
                    "MFU",
                    "unknown",
                    f"{where}{device.unknown or 'no peak'}; achieved {format_rate(device.achieved_flops_per_s)} "
                    "while busy.",
                    "info",
                )
            )
            continue
        peak = f"{device.model} {device.dtype} peak {format_rate(device.peak_flops_per_s)} ({device.peak_source})"
        split = (
            f"busy {format_share(device.busy_share)} × {format_share(device.efficiency_while_busy)} "
            "of peak while busy"
        )
        level = "good" if device.mfu >= 0.4 else "warn" if device.mfu >= 0.15 else "bad"
        scores.append(("MFU", format_share(device.mfu), f"{where}{split}; against {peak}.", level))
    covered = (
        f"FLOPs known for {format_share(flops.coverage)} of kernel time"
        if flops.coverage is not None
        else "counted on the host (no GPU kernels)"
    )
    classes = ", ".join(f"{c.op_class} {format_flops(c.flops)}" for c in flops.by_class)
    if flops.flops_per_step is not None:
        label, value = "FLOPs / step", format_flops(flops.flops_per_step)
    else:
        label, value = "FLOPs", format_flops(flops.flops)
    scores.append((label, value, f"From recorded shapes ({classes}); {covered}.", "info"))
    return tuple(scores)


def flop_kernel_table(flops: Flops, top: int) -> KernelTable | None:
    """The kernels with the most counted FLOPs, their achieved FLOP/s (None without any)."""
    if not flops.kernels:
        return None
    return KernelTable(
        "Kernels by counted FLOPs (steady state)",
        ("class", "dtype", "FLOPs", "achieved"),
        [
            (
                kernel.device,
                kernel.name,
                (
                    kernel.op_class,
                    kernel.dtype or "?",
                    format_flops(kernel.flops),
                    format_rate(kernel.achieved_flops_per_s),
                ),
            )
            for kernel in flops.kernels[:top]
        ],
    )
