"""Loading a trace file into typed polars tables (:class:`Trace`)."""

from __future__ import annotations

import gc
from pathlib import Path

from traceinsight.load.columns import chunk_tables
from traceinsight.load.decode import decode_generic, read_bytes
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.tables import Device, Trace, TraceMeta, _meta, build_trace
from traceinsight.load.whole import decode_whole

__all__ = ["Device", "ProgressCallback", "Trace", "TraceMeta", "load_trace", "load_trace_reference"]


def load_trace(path: Path, progress: ProgressCallback | None = None) -> Trace:
    """Read a ``.json`` or ``.json.gz`` trace (object or bare array) into tables, fast.

    Algorithm: the bytes are decoded by msgspec into ``gc=False`` structs holding only the fields
    analyses read (the collector is paused meanwhile: nothing decoded can form a cycle), then turned
    into columns with one C-level pass per field and polars expressions (:mod:`.columns`), never a
    Python loop per event. Gives exactly the tables and meta of :func:`load_trace_reference`.

    ``progress(bytes_read, total_bytes, events)`` is called as the file is read (bytes of the file
    on disk) and once at the end; see :mod:`traceinsight.load.progress`.

    Raises a :class:`~traceinsight.errors.TraceInsightError` subclass with a one-line message for
    any file that cannot be read or is not a trace.
    """
    total = path.stat().st_size if path.is_file() else 0
    raw = read_bytes(path)
    if progress is not None:
        progress(total, total, 0)
    collecting = gc.isenabled()
    gc.disable()
    try:
        document, events = decode_whole(raw, path)
        del raw
        part = chunk_tables(events)
        del events
    finally:
        if collecting:
            gc.enable()
    if progress is not None:
        progress(total, total, part.event_count)
    gpu = part.tables["gpu"]
    meta = _meta(
        path, document, part.event_count, gpu, part.origin or 0, part.categories, part.legacy, part.float_time
    )
    return Trace(meta=meta, **part.tables)


def load_trace_reference(path: Path) -> Trace:
    """The plain path (stdlib json, lenient coercion, a loop per event): what :func:`load_trace` equals."""
    raw = read_bytes(path)
    document, events = decode_generic(raw, path)
    return build_trace(path, document, events)
