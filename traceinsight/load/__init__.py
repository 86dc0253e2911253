"""Loading a trace file into typed polars tables (:class:`Trace`).

Which loader runs (:func:`choose_loader`): the C scanner (:mod:`.native`) whenever it was built,
which is every install from source with a C compiler; the pure-Python loader (:mod:`.fallback`,
msgspec) where it was not, or for the rare file the scanner leaves to Python. Both give exactly
the tables of the reference loader (:mod:`.reference`, stdlib json), which the tests hold them to.
Every path opens the file the same safe way and streams gzip under the same size limit
(:mod:`.source`); the limits are in :mod:`.limits`.
"""

from __future__ import annotations

import io
import os
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Final

from traceinsight.errors import TraceFormatError, TraceInsightError
from traceinsight.load import fallback, native
from traceinsight.load.decode import TraceDocument
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.reference import load_trace_reference
from traceinsight.load.repair import mends_line_at, repair_names
from traceinsight.load.source import SizeLimit, TraceFile, open_trace
from traceinsight.load.tables import ChunkTables, Device, Trace, TraceMeta, trace_for

__all__ = [
    "Device",
    "ProgressCallback",
    "SizeLimit",
    "Trace",
    "TraceMeta",
    "choose_loader",
    "load_trace",
    "load_trace_reference",
]

#: Bytes read on either side of where a text stopped being JSON to see whether a name repair mends it.
MEND_REACH: Final = 1 << 20

Loader = Callable[[TraceFile, ProgressCallback | None], tuple[TraceDocument, ChunkTables]]


def choose_loader() -> Loader:
    """The loader for this install: the C scanner (:func:`.native.load_native`) when it was built
    and ``TRACEINSIGHT_NATIVE`` is not ``0``, else the pure-Python one (:func:`load_pure`).

    The scanner reads every file itself (invalid JSON and the limits are its own one-line
    errors) except one whose ``traceEvents`` key is repeated or not first an array: for those it
    raises :class:`.native.Unavailable` and :func:`load_trace` takes the pure-Python loader.
    """
    if native.AVAILABLE and os.environ.get("TRACEINSIGHT_NATIVE", "1") != "0":
        return native.load_native
    return load_pure


def load_pure(source: TraceFile, progress: ProgressCallback | None) -> tuple[TraceDocument, ChunkTables]:
    """The pure-Python loader: the whole text (gzip streamed in under the size limit) decoded by
    msgspec (:func:`.fallback.load_fallback`)."""
    if progress is not None:
        progress(0, source.size, 0)
    document, part = fallback.load_fallback(source)
    if progress is not None:
        progress(source.size, source.size, part.event_count)
    return document, part


def load_trace(
    path: Path, progress: ProgressCallback | None = None, *, limit: SizeLimit | None = None
) -> Trace:
    """Read a ``.json`` or ``.json.gz`` trace (object or bare array) into tables.

    ``progress(bytes_read, total_bytes, events)`` is called as the file is read (bytes of the file
    on disk) and once at the end; see :mod:`traceinsight.load.progress`. ``limit`` bounds how much
    JSON the file may expand to (default: the gzip ratio rule of :class:`.source.SizeLimit`).

    Raises a :class:`~traceinsight.errors.TraceInsightError` subclass with a one-line message for
    any file that cannot be read, is not a trace, or is past a limit.
    """
    loader = choose_loader()
    repaired = 0
    with open_trace(path, limit) as source:
        try:
            try:
                document, part = loader(source, progress)
            except native.Unavailable:
                source.rewind()
                document, part = load_pure(source, progress)
        except TraceFormatError as error:
            # torch's own unescaped frame names (see :mod:`.repair`); any other error stands. The
            # text is read again whole only when the byte where it stopped being JSON lies on a
            # name line the repair mends (not for a file cut short: memory stays bounded).
            if error.at is None:
                raise
            start = max(error.at - MEND_REACH, 0)
            source.rewind()
            try:
                near = source.window(start, error.at + MEND_REACH)
            except TraceInsightError:
                raise error from None
            if not mends_line_at(near, error.at - start):
                raise
            source.rewind()
            text, repaired = repair_names(source.read_all())
            if not repaired:
                raise
            with TraceFile(path, io.BytesIO(text), len(text), source.limit) as mended:
                document, part = load_pure(mended, progress)
    trace = trace_for(path, document, part)
    if not repaired:
        return trace
    notes = (*trace.meta.load_notes, ("repaired-name", repaired))
    return replace(trace, meta=replace(trace.meta, load_notes=notes))
