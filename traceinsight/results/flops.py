"""The FLOP count and MFU of an analysis (:class:`~traceinsight.analysis.flops.FlopStats`) as the
result's :class:`~.trace.Flops`."""

from __future__ import annotations

from dataclasses import fields, replace
from typing import TYPE_CHECKING, TypeVar

from traceinsight.analysis.flops import FlopStats
from traceinsight.analysis.modules import ScopeTime, ScopeTimes
from traceinsight.results import trace as t

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

__all__ = ["flops_of", "scopes_of"]

_Entry = TypeVar("_Entry", bound="DataclassInstance")


def _mirrored(entry: type[_Entry], source: object) -> _Entry:
    """``entry`` made from the fields (or properties) of ``source`` that it shares by name: an
    analysis figure the result keeps as it is."""
    return entry(**{item.name: getattr(source, item.name) for item in fields(entry)})


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
        by_class=tuple(_mirrored(t.FlopClass, c) for c in stats.by_class),
        by_dtype=dict(stats.by_dtype),
        torch_counted=stats.torch_counted,
        torch_agreement=stats.torch_agreement,
        mfu=tuple(replace(_mirrored(t.Mfu, d), busy_share=min(d.busy_share, 1.0)) for d in stats.devices),
        kernels=tuple(_mirrored(t.FlopKernel, k) for k in stats.top_kernels),
        memory_kernels=tuple(_mirrored(t.MemoryKernel, k) for k in stats.memory_kernels),
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
