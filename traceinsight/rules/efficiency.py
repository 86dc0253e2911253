"""``low-compute-efficiency``: the GPU is busy most of the step, but its counted FLOPs run far below
the datasheet peak. Names the module and the GEMM/convolution kernels that lose the most time
against the peak; the saving is an upper bound no kernel can beat: each counted GEMM/convolution
kernel brought to :attr:`~traceinsight.thresholds.Thresholds.efficiency_target` of the peak (never
faster than that). Attention kernels are left out of the saving (their rate follows the sequence
length and head size, which the advice does not change).
"""

from __future__ import annotations

from collections.abc import Iterator

import polars as pl

from traceinsight.analysis import Analysis
from traceinsight.analysis.flops import Mfu
from traceinsight.analysis.peaks import peak_for
from traceinsight.formatting import format_share, short_kernel_name
from traceinsight.rules import advice
from traceinsight.rules.common import make_finding, per_step, saving_from_total
from traceinsight.rules.findings import Finding
from traceinsight.rules.registry import rule


def _rate(value: float) -> str:
    return f"{value / 1e12:.3g} TFLOP/s"


def _lost(analysis: Analysis, device: Mfu, target: float) -> tuple[int, list[tuple[str, int, int, float]]]:
    """The kernel time above ``target`` × peak over the steady state, in all and by kernel name
    (name, kernel ns, ns lost, achieved FLOP/s), most lost first."""
    row = peak_for(device.gpu_name)
    kernels = analysis.flops.kernel_table.filter(
        (pl.col("device") == device.device)
        & pl.col("flops").is_not_null()
        & (pl.col("dur") > 0)
        # GEMMs and convolutions: what the advice reshapes (attention's rate is set by its
        # sequence length and head size, not by batching or padding)
        & pl.col("op_class").is_in(["gemm", "conv"])
    )
    if row is None or kernels.is_empty():
        return 0, []
    peaks = {dtype: row.peak(dtype) for dtype in kernels.get_column("dtype").unique().to_list() if dtype}
    lost_rows = kernels.with_columns(
        peak=pl.col("dtype").replace_strict(peaks, default=None, return_dtype=pl.Float64)
    ).with_columns(
        # the time at ``target`` of the peak; a kernel already faster loses nothing
        lost=(pl.col("dur") - pl.col("flops") / (pl.col("peak") * target) * 1e9).clip(lower_bound=0)
    )
    by_name = (
        lost_rows.group_by("name")
        .agg(ns=pl.col("dur").sum(), lost=pl.col("lost").sum(), flops=pl.col("flops").sum())
        .sort("lost", "name", descending=[True, False])
    )
    return round(lost_rows.get_column("lost").sum() or 0), [
        (name, int(ns), round(lost or 0), flops / ns * 1e9)
        for name, ns, lost, flops in by_name.filter(pl.col("lost") > 0)
        .select("name", "ns", "lost", "flops")
        .head(3)
        .iter_rows()
    ]


@rule("low-compute-efficiency")
def low_compute_efficiency(analysis: Analysis) -> Iterator[Finding]:
    """Busy at least ``busy_for_efficiency`` of the window, below ``low_efficiency`` of the peak
    while busy: the kernels, not idle, set the step."""
    limits = analysis.thresholds
    for device in analysis.flops.mfu:
        efficiency = device.efficiency_while_busy
        if efficiency is None or device.mfu is None or device.peak_flops_per_s is None:
            continue
        if device.busy_share < limits.busy_for_efficiency or efficiency >= limits.low_efficiency:
            continue
        lost, kernels = _lost(analysis, device, limits.efficiency_target)
        if not lost:
            continue
        saving = saving_from_total(analysis, lost)
        module = _worst_module(analysis, device.peak_flops_per_s, limits.efficiency_target)
        evidence: list[tuple[str, str]] = [
            ("MFU", f"{format_share(device.mfu)} = busy {format_share(device.busy_share)} × "
             f"{format_share(efficiency)} of peak while busy"),
            ("peak", f"{device.model} {device.dtype} {_rate(device.peak_flops_per_s)} ({device.peak_source})"),
            ("FLOPs known for", f"{format_share(analysis.flops.coverage or 0.0)} of kernel time"),
            (
                "kernels without counted FLOPs",
                f"{per_step(analysis, analysis.flops.kernel_ns - analysis.flops.counted_kernel_ns)} "
                "(elementwise, normalization, copies in kernels: memory-bound work)",
            ),
        ]  # fmt: skip
        if module is not None:
            evidence.append(("module losing most", module))
        for index, (name, ns, kernel_lost, achieved) in enumerate(kernels, 1):
            evidence.append(
                (
                    f"kernel {index}",
                    f"{short_kernel_name(name, 80)}: {per_step(analysis, ns)} at {_rate(achieved)}, "
                    f"{per_step(analysis, kernel_lost)} over {format_share(limits.efficiency_target)} of peak",
                )
            )
        yield make_finding(
            analysis,
            saving,
            title=f"GPU {device.device} is busy {format_share(device.busy_share)} of the time but does "
            f"{format_share(efficiency)} of its {device.dtype} peak while busy: the kernels, not idle, "
            "set the step",
            evidence=evidence,
            advice=advice.EFFICIENCY,
            why="MFU is time busy × efficiency while busy; with the GPU this busy, only faster kernels "
            "shorten the step: small or oddly shaped GEMMs, many tiny launches and memory-bound "
            "work keep the tensor cores waiting.",
            note=f"upper bound: every counted kernel at {format_share(limits.efficiency_target)} of the "
            "datasheet peak (none faster), the rest unchanged",
            device=device.device,
        )


def _worst_module(analysis: Analysis, peak: float, target: float) -> str | None:
    """The deepest module path losing the most GPU time against ``target`` × ``peak``, in words."""
    best: tuple[float, str] | None = None
    for scope in analysis.scopes.modules:
        if not scope.gpu_ns or not scope.flops:
            continue
        lost = scope.gpu_ns - scope.flops / (peak * target) * 1e9
        if lost <= 0:
            continue
        # prefer a deeper scope when it loses nearly as much (the parent's loss includes it)
        key = lost * (1 + 0.05 * scope.depth)
        if best is None or key > best[0]:
            best = (key, f"{scope.path}: {per_step(analysis, scope.gpu_ns)} on the GPU, "
                    f"{_rate(scope.flops / scope.gpu_ns * 1e9)}")  # fmt: skip
    return best[1] if best else None
