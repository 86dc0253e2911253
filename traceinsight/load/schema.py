"""The loader's schema, declared once: the event fields it reads (:mod:`.fields`, which needs no
polars), and its tables' columns.

Every time is an integer number of nanoseconds on the trace's own clock (``ts`` × 1000, rounded
once at load); ``end = ts + dur``. ids that a trace may omit are nullable ``Int64``.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from traceinsight.load.fields import EVENT_FIELDS as EVENT_FIELDS  # the fields, declared there

#: The phase and name of the instant events :data:`MEMORY_EVENTS` holds (2021 traces give them no
#: ``cat``; later ones ``cpu_instant_event``, which ``[OutOfMemory]`` shares).
MEMORY_PHASE: Final = "i"
MEMORY_EVENT_NAME: Final = "[memory]"

_TIMED: Final[dict[str, type[pl.DataType] | pl.DataType]] = {
    "ts": pl.Int64,
    "dur": pl.Int64,
    "end": pl.Int64,
}

#: What torch records of an operator beyond its time (the operators' table's last columns).
_OPERATOR_RECORDS: Final[dict[str, type[pl.DataType] | pl.DataType]] = {
    # Recorded shapes (``record_shapes=True``), each the compact JSON text of the trace's list
    # (:func:`.coerce.as_json_text`), null when not recorded: ``Input Dims``, ``Input type``,
    # ``Concrete Inputs``.
    "input_dims": pl.String,
    "input_types": pl.String,
    "concrete_inputs": pl.String,
    #: torch's ``flops`` arg (``with_flops=True``; null elsewhere).
    "flops": pl.Int64,
    #: autograd's ``Sequence number`` and ``Fwd thread id`` (> 0 on backward operators).
    "sequence_number": pl.Int64,
    "fwd_thread_id": pl.Int64,
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
        # communication kernels: ``Seq`` and ``Process Group Name`` (null elsewhere and before 2026)
        "seq": pl.Int64,
        "process_group": pl.String,
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
        **_OPERATOR_RECORDS,
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
        #: ``traceinsight run``'s frames: 1 when the name's line is a call's, 0 when it is the
        #: function's first line; null in torch's own frames (see :mod:`traceinsight.analysis.sources`).
        "call_site": pl.Int64,
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

#: ``[memory]`` instant events: one allocation (``bytes`` > 0) or free (< 0) by the allocator of
#: ``device_type`` (c10's DeviceType: 0 CPU, 1 CUDA, also on ROCm) ``device_id`` (-1 for the CPU),
#: with the allocator's totals after it (null in 2021 traces, which recorded only ``Bytes``). The
#: block address (``Addr``) is not kept: no analysis reads it.
MEMORY_EVENTS: Final[pl.Schema] = pl.Schema(
    {
        "ts": pl.Int64,
        "device_type": pl.Int64,
        "device_id": pl.Int64,
        "bytes": pl.Int64,
        "total_allocated": pl.Int64,
        "total_reserved": pl.Int64,
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
    "memory": MEMORY_EVENTS,
}

#: ``memory`` column → the field it is read from (see :data:`EVENT_FIELDS`).
MEMORY_COLUMNS: Final[dict[str, str]] = {
    "ts": "ts",
    **{f.name if f.name != "alloc_bytes" else "bytes": f.name for f in EVENT_FIELDS if f.memory},
}


#: The columns every loader builds for the X events it keeps (never the ``memory`` fields), before they are split into
#: :data:`TABLES` by ``load.tables.assemble``: each table's columns are among them, plus ``cat``
#: (routing), ``pid``/``tid`` (the GPU rows' fallback for device/stream) and ``parent_id``.
EVENT_COLUMNS: Final[pl.Schema] = pl.Schema(
    {
        "cat": pl.String,
        "name": pl.String,
        **_TIMED,
        "pid": pl.Int64,
        "tid": pl.Int64,
        "external_id": pl.Int64,  # "External id", else the 2021 "external id"
        "correlation": pl.Int64,
        "device": pl.Int64,
        "stream": pl.Int64,
        "bytes": pl.Int64,
        "python_id": pl.Int64,
        "parent_id": pl.Int64,  # "Python parent id"
        "call_site": pl.Int64,  # "Call site"
        "call_stack": pl.String,
        "seq": pl.Int64,
        "process_group": pl.String,
        **_OPERATOR_RECORDS,
    }
)
