"""The reference loader: stdlib ``json``, then a plain loop over the events into each table.

It is slow and needs several times the file's size in memory, and is not used to analyze: it is
what the tests hold the production loaders (:mod:`.native`, :mod:`.fallback`) to, table by table,
on every sample trace and on thousands of random and hostile ones. It shares with them only the
coercions of single values (:mod:`.coerce`), the string cleaning (:mod:`.text`), the file reading
(:mod:`.source`) and the metadata step (:func:`.tables.trace_for`); its tables are built here,
independently of :func:`.tables.assemble`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Final

import polars as pl

from traceinsight.load import limits, schema, taxonomy
from traceinsight.load.coerce import Scalar, as_int, as_json_text, as_ns
from traceinsight.load.decode import (
    TraceDocument,
    document_from_value,
    json_kind,
    not_a_trace,
    parse_json,
    scalar,
)
from traceinsight.load.source import SizeLimit, open_trace
from traceinsight.load.tables import ChunkTables, Trace, clean_categories, trace_for
from traceinsight.load.text import clean_text, clean_texts

#: Field name → JSON key, for the fields at the top of an event and for those in its ``args``.
_TOP: Final = {f.name: f.key for f in schema.EVENT_FIELDS if not f.in_args}
_ARGS: Final = {f.name: f.key for f in schema.EVENT_FIELDS if f.in_args and not f.memory}
_MEMORY_ARGS: Final = {f.name: f.key for f in schema.EVENT_FIELDS if f.memory}
#: The ``json`` fields (recorded shapes): read whole, not as scalars.
_JSON_ARGS: Final = {f.name: f.key for f in schema.EVENT_FIELDS if f.kind == "json"}


def load_trace_reference(path: Path, limit: SizeLimit | None = None) -> Trace:
    """Load ``path`` the plain way: what :func:`traceinsight.load.load_trace` equals."""
    with open_trace(path, limit) as source:
        raw = source.read_all()
    value = parse_json(raw, path)
    del raw
    document, events = document_and_events(value, path)
    return trace_for(path, document, build_tables(events))


def document_and_events(value: Any, path: Path) -> tuple[TraceDocument, list[dict[str, Any]]]:
    """The parsed JSON's document and its event objects (elements that are not objects are
    skipped, but a list of nothing else is not a trace)."""
    events: Any
    if isinstance(value, list):
        document, events = TraceDocument(bare_array=True), value
    elif isinstance(value, dict):
        events = value.get("traceEvents")
        if not isinstance(events, list):
            raise not_a_trace(path, "no traceEvents list")
        document = document_from_value(value)
    else:
        raise not_a_trace(path, f"the top level is {json_kind(value)}, not an object")
    objects = [item for item in events if isinstance(item, dict)]
    if events and not objects:
        raise not_a_trace(path, "its events are not JSON objects")
    if len(objects) > limits.MAX_EVENTS:
        raise limits.too_many_events(path)
    return document, objects


class _Columns:
    """Column lists for one table, appended row by row, turned into a frame with its schema."""

    __slots__ = ("columns", "schema")

    def __init__(self, table_schema: pl.Schema) -> None:
        self.schema = table_schema
        self.columns: dict[str, list[object]] = {name: [] for name in table_schema}

    def frame(self) -> pl.DataFrame:
        frame = pl.DataFrame(self.columns, schema=self.schema, strict=False)
        texts = [name for name in ("name", "call_stack", "process_group") if name in self.schema]
        return frame.with_columns(clean_texts(frame.get_column(name)) for name in texts)


def _get(item: dict[str, Any], key: str) -> Scalar:
    return scalar(item.get(key))


def _memory_event(item: dict[str, Any], columns: dict[str, list[object]]) -> None:
    """Add an instant event to the ``memory`` columns when it is a ``[memory]`` record with a time
    (its name compared as the tables show names, cleaned)."""
    raw_name = _get(item, _TOP["name"])
    if not isinstance(raw_name, str) or clean_text(raw_name) != schema.MEMORY_EVENT_NAME:
        return
    ts = as_ns(_get(item, _TOP["ts"]))
    if ts is None:
        return
    args_value = item.get("args")
    args = args_value if isinstance(args_value, dict) else {}
    columns["ts"].append(ts)
    for column, field in schema.MEMORY_COLUMNS.items():
        if column != "ts":
            columns[column].append(as_int(_get(args, _MEMORY_ARGS[field])))


def build_tables(events: list[dict[str, Any]]) -> ChunkTables:
    """Sort events into tables. Only ``ph == "X"`` events with a time are kept, and ``[memory]``
    instant events with a time (which count neither for the origin nor as dropped)."""
    gpu = _Columns(schema.GPU_ACTIVITY)
    runtime = _Columns(schema.RUNTIME_CALLS)
    cpu_ops = _Columns(schema.CPU_OPS)
    python = _Columns(schema.PYTHON_FRAMES)
    annotations = _Columns(schema.ANNOTATIONS)
    gpu_annotations = _Columns(schema.GPU_ANNOTATIONS)
    cuda_sync = _Columns(schema.CUDA_SYNC)
    memory = _Columns(schema.MEMORY_EVENTS)
    categories: dict[str, int] = {}
    origin: int | None = None
    legacy = False
    float_time = False
    dropped = 0

    g, r, c, p, a, ga, cs = (
        gpu.columns,
        runtime.columns,
        cpu_ops.columns,
        python.columns,
        annotations.columns,
        gpu_annotations.columns,
        cuda_sync.columns,
    )
    for item in events:
        raw_cat = _get(item, _TOP["cat"])
        cat = raw_cat if isinstance(raw_cat, str) else ""
        categories[cat] = categories.get(cat, 0) + 1
        phase = _get(item, "ph")
        if phase == schema.MEMORY_PHASE:
            _memory_event(item, memory.columns)
            continue
        if phase != "X":
            continue
        raw_ts = _get(item, _TOP["ts"])
        ts = as_ns(raw_ts)
        if ts is None:
            dropped += 1
            continue
        if type(raw_ts) is float:
            float_time = True
        dur = max(as_ns(_get(item, _TOP["dur"])) or 0, 0)
        end = ts + dur
        if origin is None or ts < origin:
            origin = ts
        raw_name = _get(item, _TOP["name"])
        name = raw_name if isinstance(raw_name, str) else str(raw_name)
        pid, tid = _get(item, _TOP["pid"]), _get(item, _TOP["tid"])
        args_value = item.get("args")
        args = args_value if isinstance(args_value, dict) else {}
        arg = {field: _get(args, key) for field, key in _ARGS.items()}
        external = as_int(arg["external_id"] if arg["external_id"] is not None else arg["external_id_legacy"])
        stack = arg["call_stack"] if isinstance(arg["call_stack"], str) else None
        kind = taxonomy.GPU_ACTIVITY_CATEGORIES.get(cat)
        if kind is not None:
            legacy = legacy or cat[0].isupper()
            device, stream = as_int(arg["device"]), as_int(arg["stream"])
            g["kind"].append(kind)
            g["name"].append(name)
            g["device"].append(device if device is not None else as_int(pid))
            g["stream"].append(stream if stream is not None else as_int(tid))
            g["ts"].append(ts)
            g["dur"].append(dur)
            g["end"].append(end)
            g["correlation"].append(as_int(arg["correlation"]))
            g["external_id"].append(external)
            g["bytes"].append(as_int(arg["bytes"]))
            g["seq"].append(as_int(arg["seq"]))
            g["process_group"].append(arg["process_group"] if isinstance(arg["process_group"], str) else None)
        elif cat in taxonomy.RUNTIME_CATEGORIES:
            r["name"].append(name)
            r["pid"].append(as_int(pid))
            r["tid"].append(as_int(tid))
            r["ts"].append(ts)
            r["dur"].append(dur)
            r["end"].append(end)
            r["correlation"].append(as_int(arg["correlation"]))
            r["external_id"].append(external)
        elif cat in taxonomy.CPU_OP_CATEGORIES or cat in taxonomy.ANNOTATION_CATEGORIES:
            is_annotation = cat in taxonomy.ANNOTATION_CATEGORIES or name.startswith(
                taxonomy.LEGACY_ANNOTATION_PREFIXES
            )
            target = a if is_annotation else c
            target["name"].append(name)
            target["pid"].append(as_int(pid))
            target["tid"].append(as_int(tid))
            target["ts"].append(ts)
            target["dur"].append(dur)
            target["end"].append(end)
            target["external_id"].append(external)
            target["call_stack"].append(stack)
            if not is_annotation:
                c["flops"].append(as_int(arg["flops"]))
                c["sequence_number"].append(as_int(arg["sequence_number"]))
                c["fwd_thread_id"].append(as_int(arg["fwd_thread_id"]))
                for field in _JSON_ARGS:
                    c[field].append(as_json_text(args.get(_JSON_ARGS[field])))
        elif cat in taxonomy.PYTHON_CATEGORIES:
            p["name"].append(name)
            p["pid"].append(as_int(pid))
            p["tid"].append(as_int(tid))
            p["ts"].append(ts)
            p["dur"].append(dur)
            p["end"].append(end)
            p["python_id"].append(as_int(arg["python_id"]))
            p["parent_id"].append(as_int(arg["python_parent_id"]))
            p["call_site"].append(as_int(arg["call_site"]))
        elif cat in taxonomy.GPU_ANNOTATION_CATEGORIES:
            ga["name"].append(name)
            ga["device"].append(as_int(pid))
            ga["stream"].append(as_int(tid))
            ga["ts"].append(ts)
            ga["dur"].append(dur)
            ga["end"].append(end)
        elif cat in taxonomy.CUDA_SYNC_CATEGORIES:
            device = as_int(arg["device"])
            cs["name"].append(name)
            cs["device"].append(device if device is not None else as_int(pid))
            cs["stream"].append(as_int(arg["stream"]))
            cs["ts"].append(ts)
            cs["dur"].append(dur)
            cs["end"].append(end)
            cs["correlation"].append(as_int(arg["correlation"]))
            cs["external_id"].append(external)

    return ChunkTables(
        tables={
            "gpu": gpu.frame(),
            "runtime": runtime.frame(),
            "cpu_ops": cpu_ops.frame(),
            "python": python.frame(),
            "annotations": annotations.frame(),
            "gpu_annotations": gpu_annotations.frame(),
            "cuda_sync": cuda_sync.frame(),
            "memory": memory.frame(),
        },
        event_count=len(events),
        categories=clean_categories(categories.items()),
        origin=origin,
        legacy=legacy,
        float_time=float_time,
        dropped_time=dropped,
    )
