"""A result's tables as polars DataFrames, for a notebook: filter, group, join, plot.

Times are integer nanoseconds (``*_ns`` columns) counted from the trace's earliest event, as in
every output; sizes in bytes. One trace's result (:func:`result_frames`):

- ``steps``: one row per step and device (its window on the GPU's clock, busy by class, idle, and
  ``idle_by_cause_ns``, a struct of the idle causes);
- ``idle_gaps``: every idle gap of a live result, the short ones too (``reported`` marks those of
  at least ``min_gap_us``, the ones the outputs list; only those carry a source line); a stored
  result holds only the reported ones;
- ``kernels``: kernels by total time (the 50 longest), with ``flops`` and ``achieved_flops_per_s``
  counted in the steady state (null where none were), and for memory-bound kernels (FLOPs not
  counted) ``bytes_moved`` and ``achieved_bytes_per_s`` from recorded shapes (null where unknown); ``flop_kernels``: every kernel name with
  counted FLOPs; ``modules`` and ``regions``: GPU time, idle inside, FLOPs by ``nn.Module`` and by
  ``record_function`` region per step (a tree: ``path``, ``depth``); ``syncs``: the host's waits for the GPU by
  call, operator and line (the sync hot spots); ``copies``: copies by device and kind;
- ``findings``: one row per finding, largest saving first.

A job's result (:func:`job_frames`): ``ranks`` (one row per rank: step time, shares, time per step,
lateness in collectives), ``rank_steps`` (per rank and steady step: wait, transfer, the rank waited
for), ``stragglers`` and ``findings`` (each rule once, over the ranks).

A comparison (:func:`comparison_frames`): ``metrics`` (one row per figure before and after, the
idle causes after the metrics, ``group`` telling them apart), ``findings`` (fixed, new, still)
and, of two traces, ``kernels``; of two jobs, ``ranks`` (each rank's figures as ``<key>_before``
and ``<key>_after`` columns) and ``stragglers``.
"""

from __future__ import annotations

import typing
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import polars as pl

from traceinsight.model import Model, as_dict, fields_of
from traceinsight.results.codec import attributes

if TYPE_CHECKING:
    from traceinsight.results.comparison import Comparison
    from traceinsight.results.job import JobResult
    from traceinsight.results.job_comparison import JobComparison
    from traceinsight.results.trace import Result

__all__ = ["comparison_frames", "job_frames", "result_frames"]


def _rows(items: Iterable[Any], drop: tuple[str, ...] = ()) -> list[dict[str, Any]]:
    """Each result row as a dict of its fields; a nested result is flattened one level (``a_b``
    columns, null where a row has none)."""
    items = list(items)
    nested: dict[str, tuple[str, ...]] = {}
    for item in items:
        for name in attributes(type(item)):
            value = getattr(item, name)
            if isinstance(value, Model):
                nested[name] = attributes(type(value))
    rows = []
    for item in items:
        row: dict[str, Any] = {}
        for name in attributes(type(item)):
            if name in drop:
                continue
            value = getattr(item, name)
            if name in nested:
                for inner in nested[name]:
                    row[f"{name}_{inner}"] = None if value is None else _plain(getattr(value, inner))
            else:
                row[name] = value
        rows.append(row)
    return rows


def _plain(value: Any) -> Any:
    """A tuple of results as a list of dicts (a list of structs in the frame); anything else as is."""
    if isinstance(value, tuple) and value and isinstance(value[0], Model):
        return [as_dict(item) for item in value]
    return value


def _frame(owner: Any, name: str, drop: tuple[str, ...] = ()) -> pl.DataFrame:
    """The rows of ``owner``'s field ``name`` (a tuple of results) as a frame; an empty one has
    the columns of the field's row type."""
    rows = _rows(getattr(owner, name), drop)
    if rows:
        return pl.from_dicts(rows, infer_schema_length=None)
    row_type = typing.get_args(typing.get_type_hints(type(owner))[name])[0]
    return pl.DataFrame(schema=[field.name for field in fields_of(row_type) if field.name not in drop])


def _gaps(result: Result) -> pl.DataFrame:
    analysis = None if result.report is None else result.report.analysis
    every = None if analysis is None else analysis.every_gap
    if every is None:
        return _frame(result, "idle_gaps").with_columns(
            end_ns=pl.col("start_ns") + pl.col("duration_ns"), reported=pl.lit(True)
        )
    assert analysis is not None
    origin = analysis.meta.origin_ns
    min_ns = round(analysis.thresholds.min_gap_us * 1000)
    return every.sort("device", "start").select(
        "device",
        start_ns=pl.col("start") - origin,
        duration_ns="duration",
        cause_kind="cause_kind",
        cause="cause",
        source="source",
        source_kind="source_kind",
        source_line_kind="source_line_kind",
        source_function="source_function",
        end_ns=pl.col("end") - origin,
        reported=pl.col("duration") >= min_ns,
    )


#: What the findings' table leaves to the findings themselves (their words).
_FINDING_WORDS = ("evidence", "advice", "why")


def _findings(owner: Result | JobResult) -> pl.DataFrame:
    frame = _frame(owner, "findings", drop=_FINDING_WORDS)
    return frame.with_columns(pl.col("severity").cast(pl.String)) if owner.findings else frame


def _kernels(result: Result) -> pl.DataFrame:
    """The kernels by total time, with the FLOPs counted for them in the steady state and their
    achieved FLOP/s there (null where none were counted); the bytes moved by those whose FLOPs are
    not counted, and their achieved bytes/s (null where unknown)."""
    frame = _frame(result, "kernels")
    counted = _frame(result.flops, "kernels")
    if frame.is_empty() or counted.is_empty():
        frame = frame.with_columns(
            flops=pl.lit(None, dtype=pl.Int64), achieved_flops_per_s=pl.lit(None, dtype=pl.Float64)
        )
    else:
        frame = frame.join(
            counted.select("device", "name", "flops", "achieved_flops_per_s"),
            on=["device", "name"],
            how="left",
        )
    moved = _frame(result.flops, "memory_kernels")
    if frame.is_empty() or moved.is_empty():
        return frame.with_columns(
            bytes_moved=pl.lit(None, dtype=pl.Int64), achieved_bytes_per_s=pl.lit(None, dtype=pl.Float64)
        )
    return frame.join(
        moved.select("device", "name", "bytes_moved", "achieved_bytes_per_s"),
        on=["device", "name"],
        how="left",
    )


def result_frames(result: Result) -> dict[str, pl.DataFrame]:
    """One trace's tables (see the module doc)."""
    return {
        "steps": _frame(result, "steps"),
        "idle_gaps": _gaps(result),
        "kernels": _kernels(result),
        "syncs": _frame(result, "sync_hotspots"),
        "copies": _frame(result, "memcpy"),
        "findings": _findings(result),
        "modules": _frame(result.scopes, "modules"),
        "regions": _frame(result.scopes, "regions"),
        "flop_kernels": _frame(result.flops, "kernels"),
    }


def job_frames(job: JobResult) -> dict[str, pl.DataFrame]:
    """A job's tables (see the module doc)."""
    return {
        "ranks": _frame(job, "ranks"),
        # per rank and steady step: the wait for the last rank in collectives, the transfer, whom
        "rank_steps": pl.DataFrame(
            [
                {"rank": rank.rank, **as_dict(step)}
                for rank in job.ranks
                if rank.collectives is not None
                for step in rank.collectives.per_step
            ],
            schema={
                "rank": pl.Int64,
                "step": pl.Int64,
                "wait_ns": pl.Int64,
                "transfer_ns": pl.Int64,
                "waited_for": pl.Int64,
                "waited_for_ns": pl.Int64,
            },
        ),
        "stragglers": _frame(job, "stragglers"),
        "findings": _findings(job),
    }


def _metrics(comparison: Comparison | JobComparison) -> pl.DataFrame:
    rows = [
        {"group": group, **row}
        for group, metrics in (("metric", comparison.metrics), ("idle", comparison.idle))
        for row in _rows(metrics)
    ]
    columns = {"group": pl.String, "key": pl.String, "label": pl.String, "unit": pl.String,
               "before": pl.Float64, "after": pl.Float64}  # fmt: skip
    return pl.DataFrame(rows, schema=columns)


def comparison_frames(comparison: Comparison | JobComparison) -> dict[str, pl.DataFrame]:
    """A comparison's tables (see the module doc)."""
    frames = {"metrics": _metrics(comparison), "findings": _frame(comparison, "findings")}
    for name in ("kernels", "stragglers"):
        if hasattr(comparison, name):
            frames[name] = _frame(comparison, name)
    ranks = getattr(comparison, "ranks", None)
    if ranks is not None:  # each rank's metrics as ``<key>_before`` and ``<key>_after`` columns
        frames["ranks"] = pl.from_dicts(
            [
                {
                    **{key: value for key, value in row.items() if key != "metrics"},
                    **{
                        f"{m.key}_{side}": getattr(m, side)
                        for m in rank.metrics
                        for side in ("before", "after")
                    },
                }
                for rank, row in zip(ranks, _rows(ranks), strict=True)
            ],
            infer_schema_length=None,
        )
    if "severity" in frames["findings"].columns:
        frames["findings"] = frames["findings"].with_columns(pl.col("severity").cast(pl.String))
    return frames
