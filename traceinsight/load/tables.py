"""Events → typed polars tables plus trace metadata: the one shape every analysis reads.

Legacy names are mapped here once (2021 ``Kernel``/``Runtime``/``Operator`` categories, ``external
id``, ``"stream 7"`` tids, annotations recorded as operators), and time is normalised here once to
integer nanoseconds.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from decimal import Decimal
from pathlib import Path
from typing import Final

import polars as pl

from traceinsight.load import schema, taxonomy
from traceinsight.load.decode import Event, Scalar, TraceDocument

_DIGITS: Final[re.Pattern[str]] = re.compile(r"-?\d+")


@dataclass(frozen=True, slots=True)
class Device:
    """A GPU seen in the trace: from ``deviceProperties`` and/or from its activity."""

    index: int
    name: str | None = None
    total_memory_bytes: int | None = None
    compute_capability: str | None = None
    sm_count: int | None = None


@dataclass(frozen=True, slots=True)
class TraceMeta:
    """Facts about the trace as a whole."""

    path: str
    event_count: int
    devices: tuple[Device, ...]
    rank: int
    world_size: int | None
    backend: str | None
    base_time_ns: int | None
    #: The earliest timestamp of any timed event (ns, trace clock): the report's time zero.
    origin_ns: int
    schema_version: int | None
    trace_name: str | None
    cuda_runtime_version: str | None
    cuda_driver_version: str | None
    hip_runtime_version: str | None
    era: str  # "array-2020", "legacy-2021", "kineto" (int µs), "kineto-float", "kineto-base-ns"
    #: How many GPUs ``deviceProperties`` lists (0: the run saw no GPU at all; None: not recorded).
    gpus_listed: int | None
    categories: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    #: What loading had to do to the file, as (kind, count) pairs, reported as warnings:
    #: ``dropped-time`` (events dropped for impossible times), ``repaired-name`` (torch's malformed
    #: ``python_function`` names repaired or dropped). Empty for a clean file.
    load_notes: tuple[tuple[str, int], ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True)
class Trace:
    """A loaded trace: one polars table per kind of event (schemas in :mod:`schema`)."""

    meta: TraceMeta
    gpu: pl.DataFrame
    runtime: pl.DataFrame
    cpu_ops: pl.DataFrame
    python: pl.DataFrame
    annotations: pl.DataFrame
    gpu_annotations: pl.DataFrame
    cuda_sync: pl.DataFrame

    @property
    def has_gpu_activity(self) -> bool:
        """True when the trace holds at least one kernel, copy or memset."""
        return self.gpu.height > 0


def _int(value: Scalar) -> int | None:
    """An id as an int: ints as they are, numeric strings parsed, anything else None."""
    if type(value) is int:
        return value
    if isinstance(value, str):
        match = _DIGITS.search(value)
        if match is not None and (value.isdigit() or value.startswith(("stream", "-"))):
            return int(match.group())
        if value.startswith("0x"):
            try:
                return int(value, 16)
            except ValueError:
                return None
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return None


_INT64_MAX = 2**63 - 1


def _ns(value: Scalar) -> int | None:
    """Microseconds (int or float) → integer nanoseconds, rounded once; None when not a time or
    beyond what an Int64 of ns holds (year 2262): such an event is dropped like one without time."""
    if type(value) is int:
        ns = value * 1000
    elif type(value) is float:
        ns = _float_us_to_ns(value)
    else:
        return None
    return ns if -_INT64_MAX <= ns <= _INT64_MAX else None


def _float_us_to_ns(value: float) -> int:
    """Float µs → ns as written in the file. Epoch-sized floats (1.7e15 µs) carry only 0.25 µs of
    binary precision, so arithmetic on the float would shift times by up to 125 ns; the shortest
    decimal text of the float (``repr``) is the text the profiler wrote, and is converted exactly."""
    text = repr(value)
    whole, dot, fraction = text.partition(".")
    if dot and whole.lstrip("-").isdigit() and fraction.isdigit():
        ns = int(whole) * 1000 + (-1 if whole.startswith("-") else 1) * int(fraction[:3].ljust(3, "0"))
        if len(fraction) > 3 and fraction[3] >= "5":
            ns += -1 if whole.startswith("-") else 1
        return ns
    return round(Decimal(text) * 1000) if value == value and abs(value) != float("inf") else 0


def _version(value: Scalar) -> str | None:
    """CUDA's integer versions (12040) → "12.4"; strings as they are."""
    if type(value) is int and value > 1000:
        return f"{value // 1000}.{(value % 1000) // 10}"
    return None if value is None else str(value)


class _Columns:
    """Column lists for one table, appended row by row, turned into a frame with its schema."""

    __slots__ = ("columns", "schema")

    def __init__(self, table_schema: pl.Schema) -> None:
        self.schema = table_schema
        self.columns: dict[str, list[object]] = {name: [] for name in table_schema}

    def frame(self) -> pl.DataFrame:
        return pl.DataFrame(self.columns, schema=self.schema, strict=False)


def build_trace(path: Path, document: TraceDocument, events: list[Event]) -> Trace:
    """Sort events into tables. Only ``ph == "X"`` events with a time and duration are kept."""
    gpu = _Columns(schema.GPU_ACTIVITY)
    runtime = _Columns(schema.RUNTIME_CALLS)
    cpu_ops = _Columns(schema.CPU_OPS)
    python = _Columns(schema.PYTHON_FRAMES)
    annotations = _Columns(schema.ANNOTATIONS)
    gpu_annotations = _Columns(schema.GPU_ANNOTATIONS)
    cuda_sync = _Columns(schema.CUDA_SYNC)
    categories: dict[str, int] = {}
    origin: int | None = None
    legacy = False
    float_time = False

    g, r, c, p, a, ga, cs = (
        gpu.columns,
        runtime.columns,
        cpu_ops.columns,
        python.columns,
        annotations.columns,
        gpu_annotations.columns,
        cuda_sync.columns,
    )
    for event in events:
        cat = event.cat if isinstance(event.cat, str) else ""
        categories[cat] = categories.get(cat, 0) + 1
        if event.ph != "X":
            continue
        ts = _ns(event.ts)
        if ts is None:
            continue
        if type(event.ts) is float:
            float_time = True
        dur = _ns(event.dur) or 0
        dur = max(dur, 0)
        end = ts + dur
        if origin is None or ts < origin:
            origin = ts
        name = event.name if isinstance(event.name, str) else str(event.name)
        args = event.args
        external: int | None = None
        if args is not None:
            external = _int(args.external_id if args.external_id is not None else args.external_id_legacy)
        kind = taxonomy.GPU_ACTIVITY_CATEGORIES.get(cat)
        if kind is not None:
            legacy = legacy or cat[0].isupper()
            device = _int(args.device) if args is not None else None
            stream = _int(args.stream) if args is not None else None
            g["kind"].append(kind)
            g["name"].append(name)
            g["device"].append(device if device is not None else _int(event.pid))
            g["stream"].append(stream if stream is not None else _int(event.tid))
            g["ts"].append(ts)
            g["dur"].append(dur)
            g["end"].append(end)
            g["correlation"].append(_int(args.correlation) if args is not None else None)
            g["external_id"].append(external)
            g["bytes"].append(_int(args.bytes) if args is not None else None)
        elif cat in taxonomy.RUNTIME_CATEGORIES:
            r["name"].append(name)
            r["pid"].append(_int(event.pid))
            r["tid"].append(_int(event.tid))
            r["ts"].append(ts)
            r["dur"].append(dur)
            r["end"].append(end)
            r["correlation"].append(_int(args.correlation) if args is not None else None)
            r["external_id"].append(external)
        elif cat in taxonomy.CPU_OP_CATEGORIES:
            target = a if name.startswith(taxonomy.LEGACY_ANNOTATION_PREFIXES) else None
            if target is not None:
                _append_annotation(target, name, event, ts, dur, end, external)
                continue
            c["name"].append(name)
            c["pid"].append(_int(event.pid))
            c["tid"].append(_int(event.tid))
            c["ts"].append(ts)
            c["dur"].append(dur)
            c["end"].append(end)
            c["external_id"].append(external)
            stack = args.call_stack if args is not None else None
            c["call_stack"].append(stack if isinstance(stack, str) else None)
        elif cat in taxonomy.ANNOTATION_CATEGORIES:
            _append_annotation(a, name, event, ts, dur, end, external)
        elif cat in taxonomy.PYTHON_CATEGORIES:
            p["name"].append(name)
            p["pid"].append(_int(event.pid))
            p["tid"].append(_int(event.tid))
            p["ts"].append(ts)
            p["dur"].append(dur)
            p["end"].append(end)
            p["python_id"].append(_int(args.python_id) if args is not None else None)
            p["parent_id"].append(_int(args.python_parent_id) if args is not None else None)
        elif cat in taxonomy.GPU_ANNOTATION_CATEGORIES:
            ga["name"].append(name)
            ga["device"].append(_int(event.pid))
            ga["stream"].append(_int(event.tid))
            ga["ts"].append(ts)
            ga["dur"].append(dur)
            ga["end"].append(end)
        elif cat in taxonomy.CUDA_SYNC_CATEGORIES:
            device = _int(args.device) if args is not None else None
            stream = _int(args.stream) if args is not None else None
            cs["name"].append(name)
            cs["device"].append(device if device is not None else _int(event.pid))
            cs["stream"].append(stream)
            cs["ts"].append(ts)
            cs["dur"].append(dur)
            cs["end"].append(end)
            cs["correlation"].append(_int(args.correlation) if args is not None else None)
            cs["external_id"].append(external)

    gpu_frame = gpu.frame()
    meta = _meta(path, document, len(events), gpu_frame, origin or 0, categories, legacy, float_time)
    return Trace(
        meta=meta,
        gpu=gpu_frame,
        runtime=runtime.frame(),
        cpu_ops=cpu_ops.frame(),
        python=python.frame(),
        annotations=annotations.frame(),
        gpu_annotations=gpu_annotations.frame(),
        cuda_sync=cuda_sync.frame(),
    )


def _append_annotation(
    columns: dict[str, list[object]],
    name: str,
    event: Event,
    ts: int,
    dur: int,
    end: int,
    external: int | None,
) -> None:
    columns["name"].append(name)
    columns["pid"].append(_int(event.pid))
    columns["tid"].append(_int(event.tid))
    columns["ts"].append(ts)
    columns["dur"].append(dur)
    columns["end"].append(end)
    columns["external_id"].append(external)
    stack = event.args.call_stack if event.args is not None else None
    columns["call_stack"].append(stack if isinstance(stack, str) else None)


def _devices(document: TraceDocument, gpu: pl.DataFrame) -> tuple[Device, ...]:
    known: dict[int, Device] = {}
    for props in document.deviceProperties or ():
        index = _int(props.id)
        if index is None:
            continue
        major, minor = _int(props.computeMajor), _int(props.computeMinor)
        known[index] = Device(
            index=index,
            name=props.name if isinstance(props.name, str) and props.name else None,
            total_memory_bytes=_int(props.totalGlobalMem),
            compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
            sm_count=_int(props.numSms),
        )
    active: Iterable[int] = gpu.get_column("device").drop_nulls().unique().sort().to_list()
    # Only devices with activity are reported; deviceProperties lists every visible GPU.
    return tuple(known.get(index, Device(index=index)) for index in active)


def _meta(
    path: Path,
    document: TraceDocument,
    event_count: int,
    gpu: pl.DataFrame,
    origin: int,
    categories: dict[str, int],
    legacy: bool,
    float_time: bool,
) -> TraceMeta:
    dist = document.distributedInfo
    base = _int(document.baseTimeNanoseconds)
    if document.bare_array:
        era = "array-2020"
    elif legacy:
        era = "legacy-2021"
    elif base is not None and float_time:
        era = "kineto-base-ns"
    elif float_time:
        era = "kineto-float"
    else:
        era = "kineto"
    return TraceMeta(
        path=str(path),
        event_count=event_count,
        devices=_devices(document, gpu),
        rank=(_int(dist.rank) if dist is not None else None) or 0,
        world_size=_int(dist.world_size) if dist is not None else None,
        backend=dist.backend if dist is not None and isinstance(dist.backend, str) else None,
        base_time_ns=base,
        origin_ns=origin,
        schema_version=_int(document.schemaVersion),
        trace_name=document.traceName if isinstance(document.traceName, str) else None,
        cuda_runtime_version=_version(document.cuda_runtime_version),
        cuda_driver_version=_version(document.cuda_driver_version),
        hip_runtime_version=_version(document.hip_runtime_version),
        era=era,
        gpus_listed=None if document.deviceProperties is None else len(document.deviceProperties),
        categories=tuple(sorted(categories.items(), key=lambda item: -item[1])),
    )
