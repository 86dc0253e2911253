"""Loading a trace file into typed polars tables (:class:`Trace`)."""

from __future__ import annotations

import gc
import os
from dataclasses import replace
from pathlib import Path

from traceinsight.errors import TraceFormatError, TraceInsightError
from traceinsight.load import native
from traceinsight.load.columns import ChunkTables, chunk_tables
from traceinsight.load.decode import TraceDocument, decode_generic, read_bytes
from traceinsight.load.parallel import Unsplittable, load_parallel
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.repair import repair_names
from traceinsight.load.tables import Device, Trace, TraceMeta, _meta, build_trace
from traceinsight.load.whole import decode_whole

__all__ = ["Device", "ProgressCallback", "Trace", "TraceMeta", "load_trace", "load_trace_reference"]


def load_trace(path: Path, progress: ProgressCallback | None = None) -> Trace:
    """Read a ``.json`` or ``.json.gz`` trace (object or bare array) into tables, fast.

    Algorithm: where the C scanner was built (:mod:`.native`), the file is streamed (a plain file
    is mapped) and its events scanned in C by two threads into columns, which numpy and polars turn
    into the tables while the next runs are scanned. Otherwise, or for what the scanner refuses,
    the bytes are decoded by msgspec into ``gc=False`` structs holding only the fields analyses read
    (the collector is paused meanwhile: nothing decoded can form a cycle), then turned into columns
    with one C-level pass per field and polars expressions (:mod:`.columns`). Either way the tables
    and meta equal :func:`load_trace_reference`'s. ``TRACEINSIGHT_NATIVE=0`` skips the scanner.

    ``progress(bytes_read, total_bytes, events)`` is called as the file is read (bytes of the file
    on disk) and once at the end; see :mod:`traceinsight.load.progress`.

    Raises a :class:`~traceinsight.errors.TraceInsightError` subclass with a one-line message for
    any file that cannot be read or is not a trace.
    """
    total = path.stat().st_size if path.is_file() else 0
    if native.AVAILABLE and os.environ.get("TRACEINSIGHT_NATIVE", "1") != "0" and total:
        try:
            loaded = native.load_native(path, progress)
        except (native.Unavailable, OSError):
            pass  # an unusual or damaged file: the Python paths read it or word the error
        else:
            return _trace(path, loaded.document, loaded.part)
    workers = _worker_count(path, total)
    if workers:
        try:
            loaded = load_parallel(path, progress, workers)
        except (Unsplittable, TraceInsightError, OSError):
            pass  # not Kineto's layout, or a damaged file: the whole-buffer path decides and explains
        else:
            return _trace(path, loaded.document, loaded.part)
    raw = read_bytes(path)
    if progress is not None:
        progress(max(total - 1, 0), total, 0)
    notes: tuple[tuple[str, int], ...] = ()
    collecting = gc.isenabled()
    gc.disable()
    try:
        try:
            document, events = decode_whole(raw, path)
        except TraceFormatError:
            raw, repaired = repair_names(raw)  # torch's unescaped names; else the error stands
            if not repaired:
                raise
            notes = (("repaired-name", repaired),)
            document, events = decode_whole(raw, path)
        del raw
        part = chunk_tables(events)
        del events
    finally:
        if collecting:
            gc.enable()
    if progress is not None:
        progress(total, total, part.event_count)
    trace = _trace(path, document, part)
    return (
        replace(trace, meta=replace(trace.meta, load_notes=trace.meta.load_notes + notes)) if notes else trace
    )


#: Files smaller than this (on disk) are decoded in-process: starting workers costs ~0.3 s.
PARALLEL_MIN_BYTES = {"plain": 48 << 20, "gzip": 4 << 20}


def _worker_count(path: Path, size: int) -> int:
    """Decode processes for this file: TRACEINSIGHT_WORKERS if set, else 2 (0 for small files)."""
    setting = os.environ.get("TRACEINSIGHT_WORKERS")
    if setting is not None and setting.isdigit():
        return int(setting)
    try:
        with path.open("rb") as stream:
            kind = "gzip" if stream.read(2) == b"\x1f\x8b" else "plain"
    except OSError:
        return 0
    return 2 if size >= PARALLEL_MIN_BYTES[kind] else 0


def _trace(path: Path, document: TraceDocument, part: ChunkTables) -> Trace:
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
