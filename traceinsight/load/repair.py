"""Repair the names torch writes unescaped, so that a trace torch made can be read at all.

libkineto writes every event's ``"name"`` as it is, between quotes, one key per line. A Python
frame whose file or function name holds a ``"`` (torch's tracer wrote
``torchvision/ops/roi_align.py(0):`` followed by a docstring's triple quote) makes the file invalid JSON;
kinetos before 2023 also left newlines in names, splitting the line. Only the ``"name"`` lines of
that layout are touched, and only those that are not already a JSON string closed at the line's
end:

- a name line whose text holds a bare ``"`` gets it escaped (``\\"``);
- a name line that does not close (no unescaped ``"`` or ``",`` at its end) is joined with the
  lines after it, up to :data:`MAX_JOINED_LINES`, each newline written as ``\\n``.

Nothing else is guessed: a file cut short (a real truncation) has no such line to repair, so the
loader keeps its own message for it. Used only after a file failed to parse where
:func:`mends_line_at` says the repair can help: the byte where the JSON stopped being valid lies on
a name line it mends (a file cut short is never read again whole). The repair streams
(:class:`MendedText`): a file is mended as it is read, a few lines held at a time.
"""

from __future__ import annotations

import io
import re
from collections.abc import Callable, Iterable, Iterator
from typing import Final

__all__ = ["HOLD_BYTES", "MAX_JOINED_LINES", "MendedText", "mended_blocks", "mends_line_at", "repair_names"]

MAX_JOINED_LINES: Final = 8
"""Most lines one name may have been split into by raw newlines."""

HOLD_BYTES: Final = 16 << 20
"""Most text :func:`mended_blocks` holds back to find the lines a name spans (about)."""

#: A name that is not a JSON string closed at its line's end, not after ``, `` (found by the
#: regex engine from its literal start, so that well-formed names, nearly all of them, cost no
#: Python; :func:`_suspects` keeps those that start their line): the match ends where the name's
#: text starts.
_SUSPECT: Final = re.compile(rb'(?m)"name": "(?<!, "name": ")(?![^"\\\n]*(?:\\[^\n][^"\\\n]*)*",?\r?$)')
_NAME_START: Final = re.compile(rb'[ \t]*"name": "')
#: An escape pair, or a quote (group 1) that is not part of one.
_QUOTE: Final = re.compile(rb'(?s)\\.|(")')
_COMMA_AT_END: Final = re.compile(rb",?")


def repair_names(raw: bytes | bytearray | memoryview) -> tuple[bytes, int]:
    """``raw`` with every malformed name line repaired, and how many names were repaired."""
    count = [0]
    mended = b"".join(mended_blocks([bytes(raw)], count))
    return mended, count[0]


def mends_line_at(data: bytes | bytearray | memoryview, at: int) -> bool:
    """Whether the line of ``data`` that holds byte ``at`` is a name line :func:`repair_names`
    mends: the loader reads a whole file again to repair it only when the byte where its JSON
    stopped being valid lies on such a line (nothing else can make it valid)."""
    text = bytes(data)
    match = _NAME_START.match(text, text.rfind(b"\n", 0, at) + 1)
    return match is not None and _mended(text, match.end()) is not None


def mended_blocks(blocks: Iterable[bytes], count: list[int]) -> Iterator[bytes]:
    """The text of ``blocks`` with every malformed name line repaired, in blocks; ``count[0]``
    is raised by one for each name repaired. Holds the lines a name may span past each block,
    and no more than about :data:`HOLD_BYTES` of them: past that (lines no name spans) a name
    is mended with the lines there are, and a longer line goes out as it is."""
    held: list[bytes] = []
    held_bytes = lines = 0
    #: Whether the held text starts inside a line (the rest of one that went out as it is).
    inside = False
    for block in blocks:
        held.append(block)
        held_bytes += len(block)
        lines += block.count(b"\n")
        if lines <= MAX_JOINED_LINES + 1 and held_bytes < HOLD_BYTES:
            continue
        data = b"".join(held)
        skip = data.find(b"\n") + 1 if inside else 0
        if lines > MAX_JOINED_LINES + 1:
            cut, final = _settled(data), False
        else:  # past HOLD_BYTES: up to the last line, or all of it when it is one line
            cut = data.rfind(b"\n") + 1
            final = cut <= skip
        out, used = _mend_run(data, cut, count, skip=skip, final=final)
        rest = data[used:]
        held, held_bytes, lines = [rest], len(rest), rest.count(b"\n")
        inside = data[used - 1 : used] != b"\n" if used else inside
        yield out
    data = b"".join(held)
    yield _mend_run(data, len(data), count, skip=data.find(b"\n") + 1 if inside else 0, final=True)[0]


def _settled(data: bytes) -> int:
    """The start of the line with :data:`MAX_JOINED_LINES` complete lines after it in ``data``
    (which holds more): a name line starting before it has every line it may be joined with."""
    end = len(data)
    for _ in range(MAX_JOINED_LINES + 2):
        end = data.rfind(b"\n", 0, end)
    return end + 1


def _mend_run(data: bytes, cut: int, count: list[int], *, skip: int, final: bool) -> tuple[bytes, int]:
    """``data`` up to ``cut`` (all of it when ``final``, or past ``cut`` to the end of a name
    joined across it) with the name lines that start in ``skip:cut`` mended, and where that text
    ends in ``data``."""
    pieces: list[bytes] = []
    copied = 0
    for line_start, text_start in _suspects(data):
        if line_start >= cut:
            break
        if line_start < skip or text_start < copied:
            continue  # the rest of a line gone out, or inside a name already joined
        mended = _mended(data, text_start)
        if mended is None:
            continue
        fixed, line_end = mended
        pieces += [data[copied:text_start], fixed]
        copied = line_end
        count[0] += 1
    used = len(data) if final else max(cut, copied)
    pieces.append(data[copied:used])
    return b"".join(pieces), used


def _suspects(data: bytes) -> Iterator[tuple[int, int]]:
    """Where each name line of ``data`` that is not well formed starts, and its name's text."""
    for match in _SUSPECT.finditer(data):
        line_start = data.rfind(b"\n", 0, match.start()) + 1
        if _NAME_START.fullmatch(data, line_start, match.end()):
            yield line_start, match.end()


def _mended(data: bytes, text_start: int) -> tuple[bytes, int] | None:
    """The name text starting at ``text_start`` repaired (closing quote and comma kept) and where
    its last line ends; None when it needs no repair or cannot have one (it never closes)."""
    line_end = _line_end(data, text_start)
    text = data[text_start:line_end].rstrip(b"\r")
    joined = 0
    while _closing(text) is None and joined < MAX_JOINED_LINES and line_end < len(data):
        next_end = _line_end(data, line_end + 1)
        text = text + b"\n" + data[line_end + 1 : next_end].rstrip(b"\r")
        line_end = next_end
        joined += 1
    closing = _closing(text)
    if closing is None:
        return None  # never closes: not a name we can mend (a truncated file)
    body, tail = text[:closing], text[closing:]
    fixed = _QUOTE.sub(_escaped_quote, body).replace(b"\n", b"\\n")
    if fixed == body and not joined:
        return None
    return fixed + tail, line_end


def _closing(text: bytes) -> int | None:
    """Where the quote closing a name's ``text`` is: its last quote outside an escape pair, when
    only a comma may follow it."""
    quotes = [match.start() for match in _QUOTE.finditer(text) if match.group(1)]
    if quotes and _COMMA_AT_END.fullmatch(text, quotes[-1] + 1):
        return quotes[-1]
    return None


def _line_end(data: bytes, start: int) -> int:
    end = data.find(b"\n", start)
    return len(data) if end < 0 else end


def _escaped_quote(match: re.Match[bytes]) -> bytes:
    return b'\\"' if match.group(1) else match.group()


class MendedText(io.RawIOBase):
    """A stream of ``open_blocks()``'s text with its names repaired (:func:`mended_blocks`), for
    the loaders to read as they read a file; ``repaired`` counts the names mended so far. Seeking
    goes back to the start only (``open_blocks`` is called again)."""

    def __init__(self, open_blocks: Callable[[], Iterable[bytes]]) -> None:
        super().__init__()
        self._open = open_blocks
        self._count = [0]
        self._blocks = mended_blocks(open_blocks(), self._count)
        self._left = memoryview(b"")

    @property
    def repaired(self) -> int:
        return self._count[0]

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        if (offset, whence) != (0, io.SEEK_SET):
            raise io.UnsupportedOperation("a mended text seeks only to its start")
        self._count = [0]
        self._blocks = mended_blocks(self._open(), self._count)
        self._left = memoryview(b"")
        return 0

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        while not self._left:
            block = next(self._blocks, None)
            if block is None:
                return 0
            self._left = memoryview(block)
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size
