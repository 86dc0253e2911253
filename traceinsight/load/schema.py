"""The loader's tables: column names and dtypes, declared once.

Every time is an integer number of nanoseconds on the trace's own clock (``ts`` × 1000, rounded
once at load); ``end = ts + dur``. ids that a trace may omit are nullable ``Int64``.
"""

from __future__ import annotations

from typing import Final

import polars as pl

_TIMED: Final[dict[str, type[pl.DataType] | pl.DataType]] = {
    "ts": pl.Int64,
    "dur": pl.Int64,
    "end": pl.Int64,
}

#: Kernels, copies and memsets: the only events that make a GPU busy.
GPU_ACTIVITY: Final[pl.Schema] = pl.Schema(
    {
        "kind": pl.String,  # kernel | memcpy | memset
        "name": pl.String,
        "device": pl.Int64,
        "stream": pl.Int64,
        **_TIMED,
        "correlation": pl.Int64,
        "external_id": pl.Int64,
        "bytes": pl.Int64,
    }
)

#: Host CUDA/HIP runtime and driver calls (launches, copies, synchronizations).
RUNTIME_CALLS: Final[pl.Schema] = pl.Schema(
    {
        "name": pl.String,
        "pid": pl.Int64,
        "tid": pl.Int64,
        **_TIMED,
        "correlation": pl.Int64,
        "external_id": pl.Int64,
    }
)

#: aten and other operators on host threads; ``call_stack`` only in 2020-21 traces.
CPU_OPS: Final[pl.Schema] = pl.Schema(
    {
        "name": pl.String,
        "pid": pl.Int64,
        "tid": pl.Int64,
        **_TIMED,
        "external_id": pl.Int64,
        "call_stack": pl.String,
    }
)

#: ``python_function`` frames (only with ``with_stack=True``).
PYTHON_FRAMES: Final[pl.Schema] = pl.Schema(
    {
        "name": pl.String,
        "pid": pl.Int64,
        "tid": pl.Int64,
        **_TIMED,
        "python_id": pl.Int64,
        "parent_id": pl.Int64,
    }
)

#: Host ranges: ProfilerStep#N, DataLoader ``__next__``, Optimizer.step, record_function ranges.
ANNOTATIONS: Final[pl.Schema] = pl.Schema(
    {
        "name": pl.String,
        "pid": pl.Int64,
        "tid": pl.Int64,
        **_TIMED,
        "external_id": pl.Int64,
        "call_stack": pl.String,
    }
)

#: The same ranges drawn on GPU rows (``gpu_user_annotation``): never GPU busy time.
GPU_ANNOTATIONS: Final[pl.Schema] = pl.Schema(
    {
        "name": pl.String,
        "device": pl.Int64,
        "stream": pl.Int64,
        **_TIMED,
    }
)

#: ``cuda_sync`` events: Stream Sync, Event Sync, Context Sync, Stream Wait Event.
CUDA_SYNC: Final[pl.Schema] = pl.Schema(
    {
        "name": pl.String,
        "device": pl.Int64,
        "stream": pl.Int64,
        **_TIMED,
        "correlation": pl.Int64,
        "external_id": pl.Int64,
    }
)

TABLES: Final[dict[str, pl.Schema]] = {
    "gpu": GPU_ACTIVITY,
    "runtime": RUNTIME_CALLS,
    "cpu_ops": CPU_OPS,
    "python": PYTHON_FRAMES,
    "annotations": ANNOTATIONS,
    "gpu_annotations": GPU_ANNOTATIONS,
    "cuda_sync": CUDA_SYNC,
}
