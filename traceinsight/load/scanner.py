"""The C scanner (:mod:`._scan`) configured with the loader's fields, and how a mapped file is cut
into runs for it: what :mod:`.native` scans with, in a module that needs neither polars nor numpy,
so that a command can start scanning before they load (:mod:`.head_start`)."""

from __future__ import annotations

import mmap
import weakref
from typing import Any, Final

from traceinsight.load import limits
from traceinsight.load.fields import EVENT_FIELDS
from traceinsight.load.source import leading_whitespace

#: The C module (None where it was not built: the pure-Python path then does all the loading).
C_SCANNER: Any
try:
    from traceinsight.load import _scan as C_SCANNER  # type: ignore[attr-defined,no-redef]
except ImportError:
    C_SCANNER = None

__all__ = [
    "AFTER_COMMA",
    "AFTER_EVENT",
    "BLOCK_BYTES",
    "CUT_BYTES",
    "CUT_PREFIX",
    "C_SCANNER",
    "MAPPED_RUNS",
    "MAX_SCAN_ROWS",
    "SCANNER_FIELDS",
    "START",
    "close_quietly",
    "cut_end",
    "cut_short",
    "guard",
    "is_bare",
    "line_boundary",
]

_ROLE: Final = {"category": 2, "time": 1, "json": 4}
_INSTANT_ROLE: Final = 3
#: What the scanner is configured with: (JSON key, in args, role) per field of the schema.
SCANNER_FIELDS: Final = tuple(
    (f.key, f.in_args, _INSTANT_ROLE if f.memory else _ROLE.get(f.kind, 0)) for f in EVENT_FIELDS
)
#: Strings longer than this many bytes reach Python as a prefix of ``CUT_PREFIX`` bytes with their
#: full length; :func:`.text.clean_texts` keeps far fewer characters of them anyway.
CUT_BYTES: Final = 1 << 16
CUT_PREFIX: Final = 1 << 14
if C_SCANNER is not None:
    C_SCANNER.configure(
        SCANNER_FIELDS,
        (limits.MAX_DEPTH, limits.MAX_STRING_BYTES, CUT_BYTES, CUT_PREFIX, limits.MAX_INT_DIGITS),
    )

#: Where a scan starts: just after the ``[``, after an event, after a ``,``.
START, AFTER_EVENT, AFTER_COMMA = 0, 1, 2
#: Bytes of the file read per block: the scanner's unit of work.
BLOCK_BYTES: Final = 16 << 20
#: A mapped file's runs are views, not copies: twice as long, which halves the per-run overhead.
MAPPED_RUNS: Final = 2
#: A scan stops after this many rows and the next resumes there, so that memory follows bytes
#: whatever the events' size: a row costs 163 bytes until its run's tables are built (its (kind,
#: value) per field and its phase, the scanner's columns, handed to Python without a copy; 260 when
#: they were copied), so a 32 MB run of real events (~100-350 bytes each, ~100k-300k rows) is about
#: its own size, but a run of 24-byte events made 1.4M rows (360 MB then) and three runs in flight
#: made the memory per JSON byte 4.6 (200 MB of ``{"ph": "i", ...}``).
MAX_SCAN_ROWS: Final = 1 << 18


def line_boundary(rest: bytes) -> bytes | None:
    """``\\n`` + indentation + ``{`` of the first event in ``rest`` (the bytes after the events
    array's ``[``), when it starts its own line as Kineto writes every event; None for any other
    layout. A raw newline cannot be inside a JSON string, so that pattern is always structure."""
    body = rest.lstrip()
    if not body:
        return None
    offset = len(rest) - len(body)
    line = rest.rfind(b"\n", 0, offset)
    indent = rest[line + 1 : offset]
    if body[:1] != b"{" or line < 0 or indent.strip(b" \t"):
        return None
    return b"\n" + indent + b"{"


def cut_end(mapped: mmap.mmap, position: int, width: int, boundary: bytes) -> int:
    """Where the run of ``mapped`` that starts at ``position`` ends: at the ``{`` of the last
    ``boundary`` (:func:`line_boundary`) before ``position + width``, or of the first one after it
    for an event longer than that, or at the end of the file."""
    size = len(mapped)
    end = min(size, position + width)
    cut, searched = -1, position + 1
    while end < size and (cut := mapped.rfind(boundary, searched, end)) < 0:
        searched = max(searched, end - len(boundary) + 1)  # a long event: each byte searched once
        end = min(size, end + width)
    if end < size:
        end = cut + len(boundary) - 1  # at the "{"
    return end


def is_bare(head: bytes) -> bool:
    """Whether the text before the events array (``head``, from its first non-space byte) opens a
    bare array rather than an object: the array then sits at nesting 1, else 2."""
    body = head.removeprefix(b"\xef\xbb\xbf")
    return body[leading_whitespace(body) :].startswith(b"[")


def guard(mapped: mmap.mmap) -> bool:
    """Guard ``mapped`` against its file being cut short while it is read: a page past the new end
    reads as zeros instead of ending the process with SIGBUS (:func:`cut_short` tells), until
    :func:`close_quietly` closes it. False when it cannot be guarded (no C scanner, no POSIX
    signals, or 64 mappings guarded at once): the caller reads the file another way."""
    return C_SCANNER is not None and not mapped.closed and C_SCANNER.guard(mapped) >= 0


def cut_short(mapped: mmap.mmap) -> bool:
    """Whether pages of ``mapped`` (guarded: :func:`guard`) could not be read when they were: past
    its file's end, the file truncated by another process meanwhile (or a read error of the disk).
    Zeros were read in their place."""
    return C_SCANNER is not None and not mapped.closed and C_SCANNER.faults(mapped) > 0


def close_quietly(mapped: mmap.mmap) -> None:
    """Close a mapping and forget its guard (:func:`guard`). If a view is still alive somewhere (a
    scan still running or cancelled, an error's traceback), the collector closes the mapping once
    the last view goes, and its guard is forgotten then."""
    token = -1 if C_SCANNER is None or mapped.closed else C_SCANNER.slot(mapped)
    try:
        mapped.close()
    except BufferError:
        if token >= 0:
            weakref.finalize(mapped, C_SCANNER.unguard, token)
        return
    if token >= 0:
        C_SCANNER.unguard(token)
