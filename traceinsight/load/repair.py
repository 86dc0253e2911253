"""Repair the names torch writes unescaped, so that a trace torch made can be read at all.

libkineto writes every event's ``"name"`` as it is, between quotes, one key per line. A Python
frame whose file or function name holds a ``"`` (torch's tracer wrote
``torchvision/ops/roi_align.py(0):`` followed by a docstring's triple quote) makes the file invalid JSON;
kinetos before 2023 also left newlines in names, splitting the line. Only the ``"name"`` lines of
that layout are touched:

- a name line whose text holds a bare ``"`` gets it escaped (``\\"``);
- a name line that does not close (no ``"`` or ``",`` at its end) is joined with the lines after
  it, up to :data:`MAX_JOINED_LINES`, each newline written as ``\\n``.

Nothing else is guessed: a file cut short (a real truncation) has no such line to repair, so the
loader keeps its own message for it. Used only after a file failed to parse where
:func:`mends_line_at` says the repair can help: the byte where the JSON stopped being valid lies on
a name line it mends (a file cut short is never read again whole).
"""

from __future__ import annotations

import re
from typing import Final

__all__ = ["MAX_JOINED_LINES", "mends_line_at", "repair_names"]

MAX_JOINED_LINES: Final = 8
"""Most lines one name may have been split into by raw newlines."""

_NAME_START: Final = re.compile(rb'(?m)^[ \t]*"name": "')
_BARE_QUOTE: Final = re.compile(rb'(?<!\\)"')
_CLOSED: Final = re.compile(rb'(?<!\\)",?$|(?<!\\)"$')


def repair_names(raw: bytes | bytearray | memoryview) -> tuple[bytes, int]:
    """``raw`` with every malformed name line repaired, and how many names were repaired."""
    data = bytes(raw)
    pieces: list[bytes] = []
    copied = 0
    repaired = 0
    for match in _NAME_START.finditer(data):
        text_start = match.end()
        if text_start < copied:
            continue  # inside a name already joined
        mended = _mended(data, text_start)
        if mended is None:
            continue
        fixed, line_end = mended
        pieces += [data[copied:text_start], fixed]
        copied = line_end
        repaired += 1
    if not repaired:
        return data, 0
    pieces.append(data[copied:])
    return b"".join(pieces), repaired


def mends_line_at(data: bytes | bytearray | memoryview, at: int) -> bool:
    """Whether the line of ``data`` that holds byte ``at`` is a name line :func:`repair_names`
    mends: the loader reads a whole file again to repair it only when the byte where its JSON
    stopped being valid lies on such a line (nothing else can make it valid)."""
    text = bytes(data)
    match = _NAME_START.match(text, text.rfind(b"\n", 0, at) + 1)
    return match is not None and _mended(text, match.end()) is not None


def _mended(data: bytes, text_start: int) -> tuple[bytes, int] | None:
    """The name text starting at ``text_start`` repaired (closing quote and comma kept) and where
    its last line ends; None when it needs no repair or cannot have one (it never closes)."""
    line_end = _line_end(data, text_start)
    text = data[text_start:line_end].rstrip(b"\r")
    joined = 0
    while not _CLOSED.search(text) and joined < MAX_JOINED_LINES and line_end < len(data):
        next_end = _line_end(data, line_end + 1)
        text = text + b"\n" + data[line_end + 1 : next_end].rstrip(b"\r")
        line_end = next_end
        joined += 1
    closing = _CLOSED.search(text)
    if closing is None:
        return None  # never closes: not a name we can mend (a truncated file)
    body, tail = text[: closing.start()], text[closing.start() :]
    fixed = _BARE_QUOTE.sub(_escaped_quote, body).replace(b"\n", b"\\n")
    if fixed == body and not joined:
        return None
    return fixed + tail, line_end


def _line_end(data: bytes, start: int) -> int:
    end = data.find(b"\n", start)
    return len(data) if end < 0 else end


def _escaped_quote(_: re.Match[bytes]) -> bytes:
    return b'\\"'
