"""The FLOP count and MFU of an analysis (:class:`~traceinsight.analysis.flops.FlopStats`) as the
result's :class:`~.trace.Flops`."""

from __future__ import annotations

from traceinsight.analysis.flops import FlopStats
from traceinsight.results import trace as t

__all__ = ["flops_of"]


def flops_of(stats: FlopStats) -> t.Flops:
    """The result's ``flops`` of an analysis' :class:`FlopStats`."""
    return t.Flops(
        shapes_recorded=stats.shapes_recorded,
        operators_counted=stats.operators_counted,
        operators_unknown=stats.operators_unknown,
        flops=stats.flops,
        steps=stats.steps,
        flops_per_step=stats.flops_per_step,
        kernel_ns=stats.kernel_ns,
        counted_kernel_ns=stats.counted_kernel_ns,
        coverage=stats.coverage,
        by_class=tuple(
            t.FlopClass(
                op_class=c.op_class,
                flops=c.flops,
                kernel_ns=c.kernel_ns,
                operators=c.operators,
                achieved_flops_per_s=c.achieved_flops_per_s,
            )
            for c in stats.by_class
        ),
        by_dtype=dict(stats.by_dtype),
        torch_counted=stats.torch_counted,
        torch_agreement=stats.torch_agreement,
        mfu=tuple(
            t.Mfu(
                device=d.device,
                gpu_name=d.gpu_name,
                model=d.model,
                peak_source=d.peak_source,
                dtype=d.dtype,
                peak_flops_per_s=d.peak_flops_per_s,
                flops=d.flops,
                window_ns=d.window_ns,
                busy_ns=d.busy_ns,
                achieved_flops_per_s=d.achieved_flops_per_s,
                mfu=d.mfu,
                busy_share=min(d.busy_share, 1.0),
                efficiency_while_busy=d.efficiency_while_busy,
                unknown=d.unknown,
            )
            for d in stats.devices
        ),
        kernels=tuple(
            t.FlopKernel(
                device=k.device,
                name=k.name,
                launches=k.launches,
                kernel_ns=k.kernel_ns,
                flops=k.flops,
                op_class=k.op_class,
                dtype=k.dtype,
                achieved_flops_per_s=k.achieved_flops_per_s,
            )
            for k in stats.top_kernels
        ),
    )
