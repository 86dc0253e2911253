"""Streaming, chunked, two-process decoding for large traces written in Kineto's layout.

Algorithm: the file is read (and gunzipped) in blocks, never whole. Kineto writes every event of
``traceEvents`` starting on a line ``  {`` (two spaces); a raw newline cannot occur inside a JSON
string, so ``\\n  {`` is always structure, and cutting there gives runs of whole events. Each run
goes, as bytes, to one of the worker processes (:mod:`.worker`), which decode it and send back
compact tables (Arrow IPC); the parent keeps only those. The top-level fields around the array are
decoded once, from the bytes before and after it.

The split checks itself: a run that is not a comma-separated list of whole events does not decode
as ``[run]``. Whenever the layout is not recognised (another writer, no events, a truncated file)
:class:`Unsplittable` sends the caller to the whole-buffer path, which also gives the canonical
error messages.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import zlib
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Final

from traceinsight.errors import TraceInsightError
from traceinsight.load.columns import HEADER, ChunkTables, from_wire, merge
from traceinsight.load.decode import TraceDocument
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.whole import decode_document

_EVENTS_KEY: Final = re.compile(rb'"traceEvents"\s*:\s*\[')
READ_BYTES: Final = 4 << 20
_GZIP_READ_BYTES: Final = 256 << 10
CHUNK_BYTES: Final = 8 << 20
_HEAD_LIMIT: Final = 64 << 20


class Unsplittable(Exception):
    """The file is not in a layout the splitter handles: use the whole-buffer path."""


@dataclass
class _Frame:
    """What surrounds the events array, as read so far."""

    head: bytes = b""
    tail: bytes = b""
    bare: bool = False
    file_bytes: int = 0

    def loaded(
        self, path: Path, parts: list[ChunkTables], progress: ProgressCallback | None, refuse: type[Exception]
    ) -> Loaded:
        """The document (top-level fields decoded from the bytes around the events array) with the
        merged tables; the final progress call.

        ``refuse`` is raised when the fields are not what the reference would read (data after a
        bare array, invalid JSON around the array, a second ``traceEvents`` key whose list would win).
        """
        if self.bare:
            if self.tail.strip():
                raise refuse("data after the events array")
            document = TraceDocument(bare_array=True)
        else:
            try:
                document = decode_document(self.head + b"]" + self.tail, path)
            except TraceInsightError as exc:
                raise refuse(str(exc)) from exc
            if document.traceEvents:
                raise refuse("a second traceEvents key")
        merged = merge(parts)
        if progress is not None:
            total = path.stat().st_size
            progress(total, total, merged.event_count)
        return Loaded(document, merged)


def _blocks(path: Path, frame: _Frame, size: int = READ_BYTES) -> Iterator[bytes]:
    """The file's uncompressed bytes in blocks of about ``size`` (gzip by magic number; concatenated
    members too)."""
    with path.open("rb") as stream:
        first = stream.read(size)
        frame.file_bytes = len(first)
        if first[:2] != b"\x1f\x8b":
            block = first
            while block:
                yield block
                block = stream.read(size)
                frame.file_bytes += len(block)
            return
        inflater = zlib.decompressobj(31)
        pending = first
        try:
            while True:
                if not pending:
                    pending = stream.read(_GZIP_READ_BYTES)
                    frame.file_bytes += len(pending)
                    if not pending:
                        break
                if inflater.eof:  # another gzip member follows (or padding)
                    if not pending.strip(b"\x00"):
                        pending = b""
                        continue
                    inflater = zlib.decompressobj(31)
                # Bounded output: a block of a repetitive trace can inflate 20×.
                block = inflater.decompress(pending, size)
                pending = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
                if block:
                    yield block
            block = inflater.flush()
            if block:
                yield block
        except zlib.error as exc:
            raise Unsplittable("corrupt gzip") from exc
        if not inflater.eof:
            raise Unsplittable("gzip stream ends early")


def _runs(blocks: Iterator[bytes], frame: _Frame, chunk_bytes: int) -> Iterator[bytes]:
    """Runs of whole events (comma-separated, without brackets), in file order."""
    buffer = b""
    position = -1
    for block in blocks:
        buffer += block
        start = buffer.lstrip()[:1]
        if start == b"[":
            position, frame.bare = buffer.index(b"[") + 1, True
        elif start == b"{":
            match = _EVENTS_KEY.search(buffer)
            if match is not None:
                position = match.end()
            elif len(buffer) > _HEAD_LIMIT:
                raise Unsplittable("no traceEvents near the start")
        elif start:
            raise Unsplittable("not a JSON object or array")
        if position >= 0:
            break
    if position < 0:
        raise Unsplittable("no events array")
    frame.head = buffer[:position]
    rest = buffer[position:]
    boundary = b""
    for block in blocks:
        rest += block
        if not boundary:
            boundary = _boundary(rest)
            if not boundary:
                continue
        while len(rest) >= chunk_bytes:
            cut = rest.find(boundary, chunk_bytes)
            if cut <= 0:
                if len(rest) > 8 * chunk_bytes:
                    raise Unsplittable("no event boundary found")
                break
            run = rest[:cut].rstrip()
            if not run.endswith(b","):
                raise Unsplittable("events not separated by commas")
            yield run[:-1]
            rest = rest[cut:]
    boundary = boundary or _boundary(rest)
    end = re.search(re.escape(boundary[:-1] + b"}") + rb"\s*\]", rest) if boundary else None
    if end is None:
        raise Unsplittable("the events array does not end as it starts")
    yield rest[: end.start() + len(boundary)]
    frame.tail = rest[end.end() :]


def line_boundary(rest: bytes) -> bytes | None:
    """``\\n`` + indentation + ``{`` of the first event in ``rest`` (the bytes after the events
    array's ``[``), when it starts its own line as Kineto writes every event; empty while ``rest``
    holds only whitespace; None for any other layout. A raw newline cannot be inside a JSON string,
    so that pattern is always structure."""
    body = rest.lstrip()
    if not body:
        return b""
    offset = len(rest) - len(body)
    line = rest.rfind(b"\n", 0, offset)
    indent = rest[line + 1 : offset]
    if body[:1] != b"{" or line < 0 or indent.strip(b" \t"):
        return None
    return b"\n" + indent + b"{"


def _boundary(rest: bytes) -> bytes:
    """:func:`line_boundary`, or :class:`Unsplittable` for a layout the splitter cannot cut."""
    boundary = line_boundary(rest)
    if boundary is None:
        raise Unsplittable("events do not each start a line")
    return boundary


class _Pool:
    """Worker processes fed round-robin; a reader thread per worker collects its results."""

    def __init__(self, count: int) -> None:
        env = dict(os.environ)
        package_root = str(Path(__file__).resolve().parent.parent.parent)
        env["PYTHONPATH"] = package_root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
        self.processes = [
            subprocess.Popen(
                [sys.executable, "-m", "traceinsight.load.worker"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                # A worker's failure only sends the load to the whole-buffer path: no traceback
                # reaches the user unless they are debugging.
                stderr=None if os.environ.get("TRACEINSIGHT_DEBUG") else subprocess.DEVNULL,
                env=env,
            )
            for _ in range(count)
        ]
        self.results: dict[int, bytes] = {}
        self.events = 0
        self.failure: BaseException | None = None
        self.lock = threading.Lock()
        self.readers = [
            threading.Thread(target=self._collect, args=(p.stdout,), daemon=True) for p in self.processes
        ]
        for reader in self.readers:
            reader.start()

    def _collect(self, stream: IO[bytes] | None) -> None:
        assert stream is not None
        try:
            while header := stream.read(HEADER.size):
                index, length = HEADER.unpack(header)
                payload = stream.read(length)
                count = int.from_bytes(payload[-8:], "little") if length else 0
                with self.lock:
                    self.results[index] = payload[:-8]
                    self.events += count
        except BaseException as exc:  # reported by finish()
            self.failure = exc

    def submit(self, index: int, run: bytes) -> None:
        stdin = self.processes[index % len(self.processes)].stdin
        assert stdin is not None
        stdin.write(HEADER.pack(index, len(run)))
        stdin.write(run)
        stdin.flush()

    def finish(self, expected: int) -> list[ChunkTables]:
        for process in self.processes:
            if process.stdin is not None:
                process.stdin.close()
        for reader in self.readers:
            reader.join()
        for process in self.processes:
            process.wait()
        if self.failure is not None or len(self.results) != expected:
            raise Unsplittable(f"a worker failed: {self.failure!r}")
        if not all(self.results[i] for i in range(expected)):
            raise Unsplittable("a run of events is not valid JSON")
        # Decoded here, one at a time, in the main thread: reader threads would each grow their
        # own malloc arena, and keeping payloads and frames both alive doubles the peak.
        return [from_wire(self.results.pop(i)) for i in range(expected)]

    def kill(self) -> None:
        for process in self.processes:
            process.kill()
            process.wait()


@dataclass
class Loaded:
    """What the parallel path produces: the document's fields and the merged tables."""

    document: TraceDocument
    part: ChunkTables
    extra: dict[str, int] = field(default_factory=dict)


def load_parallel(
    path: Path,
    progress: ProgressCallback | None,
    workers: int = 2,
    chunk_bytes: int = CHUNK_BYTES,
) -> Loaded:
    """Decode ``path`` in runs of events on ``workers`` processes (see the module docstring)."""
    total = path.stat().st_size
    frame = _Frame()
    pool = _Pool(workers)
    count = 0
    try:
        for count, run in enumerate(_runs(_blocks(path, frame), frame, chunk_bytes), start=1):
            pool.submit(count - 1, run)
            if progress is not None:
                progress(min(frame.file_bytes, total - 1), total, pool.events)
        parts = pool.finish(count)
    except BaseException:
        pool.kill()
        raise
    return frame.loaded(path, parts, progress, Unsplittable)
