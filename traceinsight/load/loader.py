"""The loader's walk from a path to tables: open the file safely (:mod:`.source`), scan it with the
production loader (:func:`choose_loader`), mend torch's malformed names where a text stops being
JSON on one (:mod:`.repair`), and make the :class:`~.tables.Trace` (:mod:`.tables`)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Final

from traceinsight.errors import TraceFormatError, TraceInsightError
from traceinsight.load import native
from traceinsight.load.decode import TraceDocument
from traceinsight.load.head_start import HeadStart
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.repair import MendedText, mends_line_at
from traceinsight.load.source import SizeLimit, TraceFile, open_trace
from traceinsight.load.tables import ChunkTables, Trace, trace_for
from traceinsight.model import replace
from traceinsight.process import give_back_freed_memory

__all__ = ["BLOCK_BYTES", "MEND_REACH", "Loader", "choose_loader", "load_pure", "load_trace"]

#: Blocks of a file streamed through the name repair.
BLOCK_BYTES: Final = 4 << 20

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
    msgspec (:func:`.fallback.load_fallback`), imported when first needed (the scanner reads nearly
    every file)."""
    from traceinsight.load import fallback

    if progress is not None:
        progress(0, source.size, 0)
    document, part = fallback.load_fallback(source)
    if progress is not None:
        progress(source.size, source.size, part.event_count)
    return document, part


def _load_mended(
    source: TraceFile, loader: Loader, progress: ProgressCallback | None
) -> tuple[TraceDocument, ChunkTables, int]:
    """Load ``source`` again, its text streamed through the name repair (:class:`.MendedText`),
    with the loader that failed on it (progress in bytes of the file); and how many names were
    repaired."""

    def text_blocks() -> Iterator[bytes]:
        source.rewind()
        return source.blocks(BLOCK_BYTES)

    def on_file(done: int, total: int, events: int) -> None:
        if progress is not None:
            progress(
                min(source.consumed, source.size - 1) if done < total else source.size, source.size, events
            )

    text = MendedText(text_blocks)
    with TraceFile(source.path, text, source.size, source.limit) as mended:  # type: ignore[arg-type]
        try:
            document, part = loader(mended, on_file)
        except native.Unavailable:
            mended.rewind()
            document, part = load_pure(mended, on_file)
    return document, part, text.repaired


def load_trace(
    path: Path,
    progress: ProgressCallback | None = None,
    *,
    limit: SizeLimit | None = None,
    head_start: HeadStart | None = None,
) -> Trace:
    """Read a ``.json`` or ``.json.gz`` trace (object or bare array) into tables.

    ``progress(bytes_read, total_bytes, events)`` is called as the file is read (bytes of the file
    on disk) and once at the end; see :mod:`traceinsight.load.progress`. ``limit`` bounds how much
    JSON the file may expand to (default: the gzip ratio rule of :class:`.source.SizeLimit`).

    Raises a :class:`~traceinsight.errors.TraceInsightError` subclass with a one-line message for
    any file that cannot be read, is not a trace, or is past a limit.

    ``head_start``: scans of ``path`` begun before (:func:`.head_start.begin`), which the scanner
    takes where they are the ones it would make; closed here whatever happens.

    The heap the load freed is given back before the tables are returned
    (:func:`~traceinsight.process.give_back_freed_memory`): every caller, one place.
    """
    try:
        loaded = _load_trace(path, progress, limit, head_start)
    finally:
        if head_start is not None:
            head_start.close()
    give_back_freed_memory()
    return loaded


def _load_trace(
    path: Path, progress: ProgressCallback | None, limit: SizeLimit | None, head_start: HeadStart | None
) -> Trace:
    loader = choose_loader()
    first = loader
    if head_start is not None and loader is native.load_native:
        first = partial(native.load_native, head=head_start)
    repaired = 0
    with open_trace(path, limit) as source:
        try:
            try:
                document, part = first(source, progress)
            except native.Unavailable:
                source.rewind()
                document, part = load_pure(source, progress)
        except TraceFormatError as error:
            # torch's own unescaped frame names (see :mod:`.repair`); any other error stands. The
            # text is read again, streamed through the repair, only when the byte where it
            # stopped being JSON lies on a name line the repair mends (never for a file cut short).
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
            document, part, repaired = _load_mended(source, loader, progress)
            if not repaired:
                raise
    trace = trace_for(path, document, part)
    if not repaired:
        return trace
    notes = (*trace.meta.load_notes, ("repaired-name", repaired))
    return replace(trace, meta=replace(trace.meta, load_notes=notes))
