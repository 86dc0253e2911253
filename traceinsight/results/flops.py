"""The GPU time by module and region of an analysis (:class:`~traceinsight.analysis.modules.ScopeTimes`,
window totals) as the result's :class:`~.trace.Scopes` (per steady step). The FLOP count and MFU
need nothing of the kind: the analysis makes the result's :class:`~traceinsight.analysis.flops.Flops`."""

from __future__ import annotations

from traceinsight.analysis.modules import ScopeTime, ScopeTimes
from traceinsight.results import trace as t

__all__ = ["scopes_of"]


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
