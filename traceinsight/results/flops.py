"""The FLOP count and MFU of an analysis (:class:`~traceinsight.analysis.flops.FlopStats`) as the
result's :class:`~.trace.Flops`."""

from __future__ import annotations

from traceinsight.analysis.flops import FlopStats
from traceinsight.analysis.modules import ScopeTime, ScopeTimes
from traceinsight.results import trace as t

__all__ = ["flops_of", "scopes_of"]


def flops_of(stats: FlopStats) -> t.Flops:
    """The result's ``flops``: an analysis' :class:`FlopStats` without its tables (its rows are the
    result's own types)."""
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
        by_class=stats.by_class,
        by_dtype=dict(stats.by_dtype),
        torch_counted=stats.torch_counted,
        torch_agreement=stats.torch_agreement,
        mfu=stats.devices,
        kernels=stats.top_kernels,
        memory_kernels=stats.memory_kernels,
    )


def _scope(scope: ScopeTime, times: ScopeTimes) -> t.Scope:
    return t.Scope(
        path=scope.path,
        name=scope.name,
        depth=scope.depth,
        calls=scope.calls,
        host_ns=round(times.per_step(scope.host_ns)),
        gpu_ns=round(times.per_step(scope.gpu_ns)),
        idle_ns=round(times.per_step(scope.idle_ns)),
        flops=round(times.per_step(scope.flops)),
        achieved_flops_per_s=scope.achieved_flops_per_s,
        backward_gpu_ns=round(times.per_step(scope.backward_ns)),
        backward_flops=round(times.per_step(scope.backward_flops)),
    )


def scopes_of(times: ScopeTimes) -> t.Scopes:
    """The result's ``scopes`` of an analysis' :class:`ScopeTimes` (figures per steady step)."""
    return t.Scopes(
        per="step" if times.steps else "window",
        steps=times.steps,
        modules=tuple(_scope(scope, times) for scope in times.modules),
        regions=tuple(_scope(scope, times) for scope in times.regions),
        outside_modules_gpu_ns=round(times.per_step(times.outside_modules_gpu_ns)),
        backward_linked_gpu_ns=round(times.per_step(times.backward_linked_gpu_ns)),
    )
