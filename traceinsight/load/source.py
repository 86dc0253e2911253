"""Opening a trace file safely and reading its JSON text: gzip is always streamed, never whole.

:func:`open_trace` refuses what is not a regular file (a FIFO, a device, a socket) *before*
opening it, so nothing can make the loader wait forever, and words every failure in one line.
:class:`TraceFile` then gives the uncompressed text as blocks (:meth:`TraceFile.blocks`), mapped
in memory (:meth:`TraceFile.mapped`, plain files), or whole (:meth:`TraceFile.read_all`), and
holds every path to :class:`SizeLimit`: a gzip stream that expands past it stops with one line.
"""

from __future__ import annotations

import mmap
import os
import stat
import zlib
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType, TracebackType
from typing import BinaryIO, Final

from traceinsight.errors import TraceFormatError, TraceNotFound, TraceUnreadable
from traceinsight.load.limits import GZIP_FLOOR_BYTES, GZIP_RATIO
from traceinsight.model import Model

_inflate: ModuleType
# ISA-L's inflater (the ``isal`` package) gives zlib's bytes 2.9-3.3x as fast (500 MB of JSON:
# 0.30 s against 0.91 s); whole analyze of 0.5 GB gzip, 5 paired runs: wall 0.93-0.94x.
try:
    from isal import isal_zlib as _inflate
except ImportError:  # a platform without its wheel: zlib's
    _inflate = zlib
#: What a corrupt gzip stream raises (zlib's error, or ISA-L's own).
_CORRUPT: Final[tuple[type[Exception], ...]] = (zlib.error, _inflate.error)

GZIP_MAGIC: Final = b"\x1f\x8b"
_GZIP_READ_BYTES: Final = 256 << 10


class TraceTooLarge(TraceUnreadable):
    """The trace expands past the size limit (a compression bomb, or ``--max-size``)."""


def format_bytes(count: int) -> str:
    """``1 GiB``, ``500 MiB``, ``12 kiB``: sizes in messages."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("kiB", 10)):
        if count >= 1 << shift:
            return f"{count / (1 << shift):.3g} {unit}"
    return f"{count} bytes"


class SizeLimit(Model, frozen=True):
    """How far a trace may expand when read: memory is bounded by what the file is, never by what
    it claims (a gzip trailer is never read).

    ``max_bytes`` (``--max-size``): no trace may hold more JSON than this. And unless ``force``
    (``--force``), a gzip stream whose text grows past :data:`~.limits.GZIP_RATIO` times the
    compressed bytes read so far is stopped, at any size past :data:`~.limits.GZIP_FLOOR_BYTES`
    (real traces expand at most 44 times: see there).
    """

    max_bytes: int | None = None
    force: bool = False

    def check(self, path: Path, produced: int, consumed: int, compressed: bool) -> None:
        """Raise :class:`TraceTooLarge` when ``produced`` bytes of JSON, read from ``consumed``
        bytes of the file, are past the limit."""
        if self.max_bytes is not None and produced > self.max_bytes:
            raise TraceTooLarge(
                f"cannot read trace {path}: it holds more than {format_bytes(self.max_bytes)} of JSON "
                "(--max-size); pass a larger --max-size to read it"
            )
        if (
            compressed
            and not self.force
            and produced > GZIP_FLOOR_BYTES
            and produced > GZIP_RATIO * max(consumed, 1)
        ):
            raise TraceTooLarge(
                f"cannot read trace {path}: the gzip data expands more than {GZIP_RATIO} times (real "
                "traces expand at most about 45 times; a compression bomb?); if it is a real trace, "
                "pass --force to read it"
            )


_KINDS: Final = (
    (stat.S_ISFIFO, "a named pipe (FIFO)"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _unreadable(path: Path, exc: OSError) -> TraceNotFound | TraceUnreadable:
    if isinstance(exc, FileNotFoundError | NotADirectoryError):
        return TraceNotFound(f"cannot read trace {path}: no such file; check the path")
    if isinstance(exc, PermissionError):
        return TraceUnreadable(
            f"cannot read trace {path}: permission denied; check that you may read the file "
            "(and enter its folders), or copy it somewhere you can"
        )
    return TraceUnreadable(f"cannot read trace {path}: {exc.strerror or exc}")


def open_trace(path: Path, limit: SizeLimit | None = None) -> TraceFile:
    """Open ``path`` for reading if it is a regular file (symlinks followed); else one line.

    The file type is checked with ``stat`` before the file is opened (opening a FIFO waits for a
    writer), and again on the opened descriptor, which is opened non-blocking, so that a file
    swapped in between cannot block either.
    """
    try:
        info = os.stat(path)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    if stat.S_ISDIR(info.st_mode):
        raise TraceNotFound(f"cannot read trace {path}: it is a directory, not a trace file")
    if not stat.S_ISREG(info.st_mode):
        kind = next((name for test, name in _KINDS if test(info.st_mode)), "not a regular file")
        raise TraceUnreadable(
            f"cannot read trace {path}: it is {kind}, not a regular file; save the trace to a file first"
        )
    flags = (
        os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        descriptor = os.open(path, flags)
    except OSError as exc:
        raise _unreadable(path, exc) from None
    opened = os.fstat(descriptor)
    if not stat.S_ISREG(opened.st_mode) or (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
        os.close(descriptor)
        raise TraceUnreadable(f"cannot read trace {path}: the file changed while it was opened; try again")
    stream = os.fdopen(descriptor, "rb")
    return TraceFile(path, stream, opened.st_size, limit or SizeLimit())


class TraceFile:
    """An opened trace (see :func:`open_trace`); a context manager that closes it."""

    def __init__(self, path: Path, stream: BinaryIO, size: int, limit: SizeLimit) -> None:
        self.path = path
        self.stream = stream
        #: Bytes of the file on disk.
        self.size = size
        self.limit = limit
        try:
            self.compressed = stream.read(2) == GZIP_MAGIC
            stream.seek(0)
        except OSError as exc:
            raise _unreadable(path, exc) from None
        #: Bytes of the file read so far (progress), and of JSON text given out.
        self.consumed = 0
        self.produced = 0
        if not self.compressed:
            limit.check(path, size, size, compressed=False)

    def __enter__(self) -> TraceFile:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.stream.close()

    def rewind(self) -> None:
        """Read again from the start."""
        self.stream.seek(0)
        self.consumed = self.produced = 0

    def mapped(self) -> mmap.mmap | None:
        """The plain (not gzip), non-empty file mapped read-only, else None."""
        if self.compressed or self.size == 0:
            return None
        try:
            return mmap.mmap(self.stream.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None

    def blocks(self, size: int) -> Iterator[bytes]:
        """The JSON text in blocks of about ``size`` bytes (gzip decompressed as it streams, any
        number of members; zero padding after the last is allowed)."""
        try:
            if not self.compressed:
                while block := self.stream.read(size):
                    self.consumed += len(block)
                    self.produced += len(block)
                    yield block
                return
            yield from self._gunzip(size)
        except OSError as exc:
            raise _unreadable(self.path, exc) from None

    def _gunzip(self, size: int) -> Iterator[bytes]:
        inflater = _inflate.decompressobj(31)
        pending = b""
        try:
            while True:
                if not pending:
                    pending = self.stream.read(_GZIP_READ_BYTES)
                    self.consumed += len(pending)
                    if not pending:
                        break
                if inflater.eof:  # another gzip member follows (or padding)
                    if not pending.strip(b"\x00"):
                        pending = b""
                        continue
                    inflater = _inflate.decompressobj(31)
                # Bounded output: a block of a repetitive trace can inflate 20×, a bomb 1000×.
                block = inflater.decompress(pending, size)
                pending = inflater.unused_data if inflater.eof else inflater.unconsumed_tail
                if block:
                    self.produced += len(block)
                    self.limit.check(self.path, self.produced, self.consumed, compressed=True)
                    yield block
        except _CORRUPT as exc:
            raise TraceUnreadable(f"cannot read trace {self.path}: corrupt gzip data ({exc})") from None
        if not inflater.eof:
            raise TraceUnreadable(
                f"cannot read trace {self.path}: the gzip stream ends early; "
                "was the file copied completely and the profiler stopped cleanly?"
            )

    def window(self, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of the JSON text (gzip streamed up to them, nothing before kept);
        shorter where the text ends first. Reads from the start: :meth:`rewind` first."""
        if not self.compressed:
            try:
                self.stream.seek(start)
                return self.stream.read(max(end - start, 0))
            except OSError as exc:
                raise _unreadable(self.path, exc) from None
        kept: list[bytes] = []
        at = 0
        for block in self.blocks(1 << 20):
            if at + len(block) > start:
                kept.append(block[max(start - at, 0) : end - at])
            at += len(block)
            if at >= end:
                break
        return b"".join(kept)

    def read_all(self) -> bytes | bytearray:
        """The whole JSON text (gzip streamed into one buffer, under the size limit); a text with
        nothing but whitespace is refused as empty."""
        if self.compressed:
            text = bytearray()
            for block in self.blocks(16 << 20):
                text += block
            data: bytes | bytearray = text
        else:
            try:
                data = self.stream.read()
            except OSError as exc:
                raise _unreadable(self.path, exc) from None
            self.consumed = self.produced = len(data)
        if is_blank(data):
            raise empty_trace(self.path)
        return data


JSON_WHITESPACE: Final = b" \t\r\n"


def leading_whitespace(data: bytes | bytearray | memoryview) -> int:
    """How many bytes of JSON whitespace ``data`` starts with.

    ``bytes.lstrip()`` without arguments is several times faster than with them (it strips all
    ASCII whitespace, also vertical tab and form feed, which JSON does not allow: checked after).
    """
    text = bytes(data)
    stripped = len(text) - len(text.lstrip())
    if stripped and text[:stripped].translate(None, JSON_WHITESPACE):
        stripped = len(text) - len(text.lstrip(JSON_WHITESPACE))
    return stripped


def is_blank(data: bytes | bytearray | memoryview) -> bool:
    """Whether ``data`` holds nothing but JSON whitespace (checked a block at a time)."""
    view = memoryview(data)
    step = 16 << 20
    return all(
        leading_whitespace(view[at : at + step]) == len(view[at : at + step])
        for at in range(0, len(view), step)
    )


def empty_trace(path: Path) -> TraceFormatError:
    """The one line for a file with no JSON in it."""
    return TraceFormatError(
        f"cannot read trace {path}: the file is empty; was the profiler stopped before it exported?"
    )
