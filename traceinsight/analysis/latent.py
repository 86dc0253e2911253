"""Syncs waiting to happen: in a trace without GPU work, the operators that would make the host
wait for a GPU (``.item()``, ``if tensor:``, ``nonzero``, boolean-mask indexing ...), with the
line and the module that run them, so a CPU run already says where a GPU run will stall."""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass

import polars as pl

from traceinsight.analysis.intervals import within
from traceinsight.analysis.sources import enclosing_ops, module_at, source_at
from traceinsight.analysis.steady import SteadyState
from traceinsight.load import Trace, taxonomy

__all__ = ["LatentSync", "latent_syncs"]


@dataclass(frozen=True, slots=True)
class LatentSync:
    """One kind of would-be sync: the outermost such operator, where it runs, how often."""

    op: str
    op_chain: str | None
    source: str | None
    source_kind: str | None
    #: The ``nn.Module`` whose forward runs it (data-dependent control flow), if any.
    module: str | None
    count: int
    #: Occurrences inside the steady-state steps.
    steady_count: int
    #: What ``source``'s line is: ``call`` (the call's line), ``def`` (the first line of
    #: ``source_function``: torch's stack names a function so), ``recording-start`` (the line
    #: ``source_function`` was on when recording began), None when the trace does not say (see
    #: :mod:`traceinsight.analysis.sources`).
    source_line_kind: str | None = None
    #: The function ``source`` is in (``log_metrics``), when frames name it.
    source_function: str | None = None
    #: Framework code the line calls that reads GPU values on the host by design
    #: (``torch.optim.LBFGS``: :data:`traceinsight.load.taxonomy.DESIGNED_SYNCS`), when the calls
    #: happen inside it.
    framework_call: str | None = None


def latent_syncs(
    trace: Trace, steady: SteadyState, user_code: Collection[str] = ()
) -> tuple[LatentSync, ...]:
    """Operators of :data:`taxonomy.LATENT_SYNC_OPS` not inside another one, grouped by (op, line,
    module, framework code that syncs by design); only for traces without GPU work (with a GPU, the
    real syncs are measured instead), and not for an accelerator this tool cannot read (MTIA, ...):
    there the operators did wait, on it."""
    if trace.has_gpu_activity or trace.meta.foreign_accelerator is not None:
        return ()
    ops = trace.cpu_ops.filter(pl.col("name").is_in(list(taxonomy.LATENT_SYNC_OPS))).with_row_index("key")
    if ops.is_empty():
        return ()
    ops = ops.with_columns(pl.col("key").cast(pl.Int64))
    nested = (
        ops.select("key", "pid", "tid", "ts", "end")
        .join_where(
            ops.select(o_key="key", o_pid="pid", o_tid="tid", o_ts="ts", o_end="end"),
            pl.col("o_ts") <= pl.col("ts"),
            pl.col("o_end") >= pl.col("end"),
            pl.col("o_key") != pl.col("key"),
        )
        .filter((pl.col("pid") == pl.col("o_pid")) & (pl.col("tid") == pl.col("o_tid")))
        .select("key")
        .unique()
    )
    outermost = ops.join(nested, on="key", how="anti")
    outermost = outermost.with_columns(
        steady=within(outermost.get_column("ts"), steady.windows) if steady.windows else pl.lit(True)
    )
    points = outermost.select("key", "pid", "tid", t=pl.col("ts") + 1)
    chains = enclosing_ops(trace, points).select("key", "op_chain")
    table = (
        outermost.select("key", "steady", op="name")
        .join(chains, on="key", how="left")
        .join(source_at(trace, points, user_code), on="key", how="left")
        .join(module_at(trace, points), on="key", how="left")
        .group_by("op", "source", "module", "framework_call", maintain_order=True)
        .agg(
            op_chain=pl.col("op_chain").mode().sort().first(),
            source_kind=pl.col("source_kind").first(),
            source_line_kind=pl.col("source_line_kind").first(),
            source_function=pl.col("source_function").first(),
            count=pl.len(),
            steady_count=pl.col("steady").sum(),
        )
        .sort(["steady_count", "count", "op"], descending=[True, True, False])
    )
    return tuple(
        LatentSync(
            op=row["op"],
            op_chain=row["op_chain"],
            source=row["source"],
            source_kind=row["source_kind"],
            module=row["module"],
            count=row["count"],
            steady_count=row["steady_count"],
            source_line_kind=row["source_line_kind"],
            source_function=row["source_function"],
            framework_call=row["framework_call"],
        )
        for row in table.iter_rows(named=True)
    )
