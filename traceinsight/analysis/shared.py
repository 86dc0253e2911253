"""What several analyses read, computed once per trace: the GPU work's launching calls and the
classes of its kernel names, and what a launch call costs.

Each analysis that needs one of these takes it as an optional argument and computes it itself
when called alone, so every analysis stays a pure function of the trace; :func:`shared_tables` makes them
once for :func:`traceinsight.analysis.analyze`. On a 0.5 GB DDP trace the launching calls were
found five times over (a join of the 0.5 M runtime calls with the GPU's ids, then a unique per id:
about 80 ms of CPU each), and each of four analyses ran the kernel-name patterns over every kernel
(up to 0.4 s for long templated names).
"""

from __future__ import annotations

from typing import Final

import polars as pl

from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model

__all__ = [
    "DEFAULT_LAUNCH_COST_NS",
    "Shared",
    "gpu_classes",
    "launch_calls",
    "launch_cost_ns",
    "shared_tables",
]

#: Below this many GPU rows the name patterns run on each row (one polars operation); above it on
#: each distinct name, then mapped to the rows (kernel names repeat: hundreds of distinct names
#: over a million kernels).
_DISTINCT_FROM_ROWS: Final = 20_000


# tables compare as frames, not as a bool: by identity
class Shared(Model, frozen=True, eq=False):
    """Tables several analyses read (see the module docstring)."""

    #: :func:`launch_calls`.
    launch_calls: pl.DataFrame
    #: :func:`gpu_classes`.
    gpu: pl.DataFrame
    #: :func:`launch_cost_ns`.
    launch_cost_ns: int


def launch_calls(trace: Trace) -> pl.DataFrame:
    """The first runtime call (in the table's order) of each correlation id that some GPU activity
    carries → ``correlation, pid, tid, l_ts, l_end``.

    Calls whose id no activity carries are dropped before the per-id ``unique``: on a DDP trace
    most of the runtime table launches nothing, and a hash table over every call was the largest
    memory step of the analyses that use this (about 96 MB at 0.5 GB; 30 MB so)."""
    return (
        trace.runtime.select("correlation", "pid", "tid", l_ts="ts", l_end="end")
        .join(trace.gpu.select("correlation"), on="correlation", how="semi", maintain_order="left")
        .unique("correlation", keep="first")
    )


#: What a kernel launch call costs the host when the trace has none to measure (ns).
DEFAULT_LAUNCH_COST_NS: Final = 5_000


def launch_cost_ns(trace: Trace) -> int:
    """The median duration of the kernel launch calls (``*LaunchKernel*``) in ns, else
    :data:`DEFAULT_LAUNCH_COST_NS`. One column is filtered, not the runtime table (on a 0.5 GB DDP
    trace a filtered copy of the table, names and all, was the largest memory step of the replay's
    preparation)."""
    median = trace.runtime.select(
        pl.col("dur").filter(pl.col("name").str.contains("LaunchKernel")).median()
    ).item()
    return int(median) if isinstance(median, (int, float)) else DEFAULT_LAUNCH_COST_NS


def _name_matches(names: pl.Series, patterns: dict[str, str]) -> pl.DataFrame:
    """For each of ``names``, whether it matches each pattern (a column per pattern; null for a
    null name), as ``str.contains`` gives it."""
    if names.len() <= _DISTINCT_FROM_ROWS:
        return names.to_frame("name").select(
            **{column: pl.col("name").str.contains(pattern) for column, pattern in patterns.items()}
        )
    distinct = names.unique().drop_nulls().to_frame("name")
    hits = distinct.select(
        "name", **{column: pl.col("name").str.contains(pattern) for column, pattern in patterns.items()}
    )
    return names.to_frame("name").join(hits, on="name", how="left", maintain_order="left").drop("name")


def gpu_classes(trace: Trace) -> pl.DataFrame:
    """The GPU table with what its kernel names say, row for row → its columns plus
    ``communication`` (NCCL/RCCL ... :data:`.taxonomy.COMMUNICATION_KERNEL_PATTERN`),
    ``tensor_core`` and ``fp32_matmul`` (:data:`.taxonomy.TENSOR_CORE_KERNEL_PATTERN`,
    :data:`.taxonomy.FP32_MATMUL_KERNEL_PATTERN`), each true or false for kernels as the name's
    ``str.contains`` says (null for a null name) and null for copies and memsets."""
    patterns = {
        "communication": taxonomy.COMMUNICATION_KERNEL_PATTERN,
        "tensor_core": taxonomy.TENSOR_CORE_KERNEL_PATTERN,
        "fp32_matmul": taxonomy.FP32_MATMUL_KERNEL_PATTERN,
    }
    kernel = pl.col("kind") == "kernel"
    matched = _name_matches(trace.gpu.get_column("name"), patterns)
    return pl.concat([trace.gpu, matched], how="horizontal").with_columns(
        pl.when(kernel).then(pl.col(column)) for column in patterns
    )


def shared_tables(trace: Trace) -> Shared:
    """Everything in :class:`Shared`, for one trace."""
    return Shared(
        launch_calls=launch_calls(trace), gpu=gpu_classes(trace), launch_cost_ns=launch_cost_ns(trace)
    )
