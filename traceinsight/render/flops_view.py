"""The FLOP count and MFU as every renderer shows them, read from the result's :class:`~traceinsight.
results.trace.Flops` only: scorecard rows (MFU split into busy × efficiency, FLOPs per step with their
coverage) and a table of the kernels doing the most counted FLOPs. A trace without recorded shapes
shows none of it."""

from __future__ import annotations

from rich.table import Table

from traceinsight.formatting import format_duration, format_share
from traceinsight.model import Model
from traceinsight.render.tables import KernelTable, data
from traceinsight.results.trace import Flops, Scope, Scopes

__all__ = [
    "ModuleRow",
    "flop_kernel_table",
    "flops_scores",
    "format_flops",
    "format_rate",
    "module_rows",
    "module_table",
]

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
    steps = flops.steps or 1
    classes = ", ".join(f"{c.op_class} {format_flops(c.flops / steps)}" for c in flops.by_class)
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


#: Module rows the terminal shows (the top levels: depth 0 and 1, most GPU time first).
_TERMINAL_DEPTH = 1


def module_table(scopes: Scopes, top: int) -> Table | None:
    """The top levels of the module tree (the page and the JSON hold the whole tree): per step,
    GPU time, idle inside, FLOPs and achieved FLOP/s; host time where no GPU ran. None without
    module frames."""
    if not scopes.modules:
        return None
    on_gpu = any(scope.gpu_ns for scope in scopes.modules)
    rows = sorted(
        (scope for scope in scopes.modules if scope.depth <= _TERMINAL_DEPTH),
        key=lambda scope: (-(scope.gpu_ns if on_gpu else scope.host_ns), scope.path),
    )[: max(top, 8)]
    rows.sort(key=lambda scope: scope.path)  # parents right above their children
    per = "per step" if scopes.per == "step" else "in the steady window"
    table = Table(
        title=f"nn.Module time {per} (top levels; the whole tree: page, JSON)",
        title_justify="left",
        show_edge=False,
    )
    table.add_column("module", overflow="ellipsis", no_wrap=True, max_width=60)
    backward = on_gpu and any(scope.backward_gpu_ns for scope in scopes.modules)
    columns = ("GPU", "idle inside", "FLOPs", "achieved") if on_gpu else ("host", "FLOPs")
    for column in columns:
        table.add_column(column, justify="right", no_wrap=True)
    if backward:
        table.add_column("backward", justify="right", no_wrap=True)
    for scope in rows:
        label = "  " * scope.depth + scope.name
        if on_gpu:
            cells = [
                format_duration(scope.gpu_ns),
                format_duration(scope.idle_ns),
                format_flops(scope.flops) if scope.flops else "—",
                format_rate(scope.achieved_flops_per_s) if scope.flops else "—",
            ]
            if backward:
                cells.append(format_duration(scope.backward_gpu_ns) if scope.backward_gpu_ns else "—")
            table.add_row(data(label), *cells)
        else:
            table.add_row(
                data(label), format_duration(scope.host_ns), format_flops(scope.flops) if scope.flops else "—"
            )
    if backward:
        table.caption = (
            f"backward: kernel time of the backward operators linked to the module's forward ones "
            f"(autograd's sequence numbers), {format_duration(scopes.backward_linked_gpu_ns)} {per} in all; "
            f"the rest launched outside every module (optimizer, backward not linked): "
            f"{format_duration(scopes.outside_modules_gpu_ns - scopes.backward_linked_gpu_ns)} {per}, "
            "not in these rows."
        )
    elif on_gpu and scopes.outside_modules_gpu_ns:
        table.caption = (
            f"Kernels launched outside every module (backward, optimizer): "
            f"{format_duration(scopes.outside_modules_gpu_ns)} {per}, not in these rows."
        )
    return table


class ModuleRow(Model, frozen=True):
    """One row of the page's module tree: its figures as text and its bar's width (its time's share
    of the largest top-level module's, 0-100)."""

    depth: int
    name: str
    path: str
    calls: str
    time: str
    idle: str
    flops: str
    achieved: str
    bar_percent: float
    backward: str = "—"
    """Its backward kernel time (autograd-linked), "—" where none."""


def module_rows(scopes: Scopes) -> list[ModuleRow]:
    """The whole module tree for the page, parents right above their children (path order), each
    with a bar of its GPU time (host time where no GPU ran) against the largest top-level one."""
    if not scopes.modules:
        return []
    on_gpu = any(scope.gpu_ns for scope in scopes.modules)

    def time_of(scope: Scope) -> int:
        return scope.gpu_ns if on_gpu else scope.host_ns

    largest = max((time_of(scope) for scope in scopes.modules if scope.depth == 0), default=0) or 1
    return [
        ModuleRow(
            depth=scope.depth,
            name=scope.name,
            path=scope.path,
            calls=f"{scope.calls:,}",
            time=format_duration(time_of(scope)),
            idle=format_duration(scope.idle_ns) if on_gpu else "—",
            flops=format_flops(scope.flops) if scope.flops else "—",
            achieved=format_rate(scope.achieved_flops_per_s) if scope.flops and on_gpu else "—",
            bar_percent=round(min(100.0, 100.0 * time_of(scope) / largest), 1),
            backward=format_duration(scope.backward_gpu_ns) if scope.backward_gpu_ns and on_gpu else "—",
        )
        for scope in sorted(scopes.modules, key=lambda scope: scope.path)
    ]
