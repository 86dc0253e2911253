"""Repair the names torch writes unescaped, so that a trace torch made can be read at all.

libkineto writes every event's ``"name"`` as it is, between quotes, one key per line. A Python
frame whose file or function name holds a ``"`` (torch's tracer wrote
``torchvision/ops/roi_align.py(0):`` followed by a docstring's triple quote) makes the file invalid JSON;
kinetos before 2023 also left newlines in names, splitting the line. Only the ``"name"`` lines of
that layout are touched, and only those that are not already a JSON string closed at the line's
end:

- a name line that does not close (no unescaped ``"`` or ``",`` at its end) is joined with the
  lines after it, up to :data:`MAX_JOINED_LINES`; never with a line that holds a key
  (``"pid": 1,``): that is the next key of the event, so a name whose last quote follows a
  backslash (``"name": "C:\\dir\\",``, kinetos that leave backslashes as they are) ends there,
  that backslash its own;
- a name it mends is taken as libkineto wrote it, which escapes nothing: every backslash and
  every quote but the closing one is escaped, each newline written as ``\\n``
  (:func:`escaped_name`). A name line that is a valid JSON string is left as it is, even where its
  backslashes were torch's own (``"C:\\new",`` reads as a newline): nothing tells the two apart.

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

__all__ = [
    "HOLD_BYTES",
    "MAX_JOINED_LINES",
    "MendedText",
    "escaped_name",
    "mended_blocks",
    "mends_line_at",
    "repair_names",
]

MAX_JOINED_LINES: Final = 8
"""Most lines one name may have been split into by raw newlines."""

HOLD_BYTES: Final = 1 << 20
"""Longest line a name may have or be joined with (a longer one is never mended or joined):
what :func:`mended_blocks` holds back stays under about ten of these."""

#: A name that is not a JSON string closed at its line's end, not after ``, `` (found by the
#: regex engine from its literal start, so that well-formed names, nearly all of them, cost no
#: Python; :func:`_suspects` keeps those that start their line): the match ends where the name's
#: text starts.
_SUSPECT: Final = re.compile(
    rb'(?m)"name": "(?<!, "name": ")(?![^"\\\n]*(?:\\(?:["\\/bfnrt]|u[0-9a-fA-F]{4})[^"\\\n]*)*",?\r?$)'
)
_NAME_START: Final = re.compile(rb'[ \t]*"name": "')
#: A line that holds one of an event's keys: never part of a name.
_KEY_LINE: Final = re.compile(rb'[ \t]*"[^"\\\n]*": ')
_BLANK: Final = frozenset(b" \t")
_NEWLINE: Final = ord("\n")


def repair_names(raw: bytes | bytearray | memoryview) -> tuple[bytes, int]:
    """``raw`` with every malformed name line repaired, and how many names were repaired."""
    count = [0]
    mended = b"".join(mended_blocks([bytes(raw)], count))
    return mended, count[0]


def mends_line_at(data: bytes | bytearray | memoryview, at: int) -> bool:
    """Whether the line of ``data`` that holds byte ``at`` is a name line :func:`repair_names`
    mends: the loader reads a file again to repair it only when the byte where its JSON stopped
    being valid lies on such a line (nothing else can make it valid)."""
    text = bytes(data)
    match = _NAME_START.match(text, text.rfind(b"\n", 0, at) + 1)
    return match is not None and _mended(text, match.start(), match.end()) is not None


def mended_blocks(blocks: Iterable[bytes], count: list[int]) -> Iterator[bytes]:
    """The text of ``blocks`` with every malformed name line repaired, in blocks; ``count[0]``
    is raised by one for each name repaired. Holds back the lines a name may span: at most
    :data:`MAX_JOINED_LINES` + 1 lines of :data:`HOLD_BYTES` each (a longer line is never part
    of a name, whole text or stream alike), and a block."""
    held: list[bytes] = []
    held_bytes = lines = 0
    #: Whether the held text starts inside a line (the rest of a long one that went out).
    inside = False
    for block in blocks:
        held.append(block)
        held_bytes += len(block)
        lines += block.count(b"\n")
        if lines <= MAX_JOINED_LINES + 1 and held_bytes < HOLD_BYTES:
            continue
        data = b"".join(held)
        skip = _first_line_end(data) if inside else 0
        last = data.rfind(b"\n") + 1
        # every line before ``cut`` is complete; a last line past HOLD_BYTES can be no name's
        cut = len(data) if len(data) - last >= HOLD_BYTES else last
        out, used = _mend_run(data, max(cut, skip), count, skip=skip, final=False)
        rest = data[used:]
        held, held_bytes, lines = [rest], len(rest), rest.count(b"\n")
        inside = data[used - 1 : used] != b"\n" if used else inside
        yield out
    data = b"".join(held)
    skip = _first_line_end(data) if inside else 0
    yield _mend_run(data, len(data), count, skip=skip, final=True)[0]


def _first_line_end(data: bytes) -> int:
    """Where the second line of ``data`` starts (its end when it has one line)."""
    end = data.find(b"\n")
    return len(data) if end < 0 else end + 1


def _mend_run(data: bytes, cut: int, count: list[int], *, skip: int, final: bool) -> tuple[bytes, int]:
    """``data`` up to ``cut`` (past it to the end of a name joined across it; short of it from a
    name whose lines are not all held yet, unless ``final``) with the name lines that start in
    ``skip:cut`` mended, and where that text ends in ``data``."""
    pieces: list[bytes] = []
    copied = 0
    used = cut
    for line_start, text_start in _suspects(data):
        if line_start >= cut:
            break
        if line_start < skip or line_start < copied:
            continue  # the rest of a line gone out, or inside a name already joined
        mended = _mended(data, line_start, text_start, final=final)
        if mended is _MORE:
            used = line_start
            break
        if mended is None:
            continue
        fixed, line_end = mended
        pieces += [data[copied:text_start], fixed]
        copied = line_end
        count[0] += 1
    used = max(used, copied)
    pieces.append(data[copied:used])
    return b"".join(pieces), used


def _suspects(data: bytes) -> Iterator[tuple[int, int]]:
    """Where each name line of ``data`` that is not well formed starts, and its name's text."""
    for match in _SUSPECT.finditer(data):
        line_start = match.start()
        while line_start and data[line_start - 1] in _BLANK:
            line_start -= 1
        if line_start == 0 or data[line_start - 1] == _NEWLINE:
            yield line_start, match.end()


_MORE: Final = (b"", -1)
"""What :func:`_mended` gives for a name whose lines are not all in the text yet."""


def _mended(data: bytes, line_start: int, text_start: int, *, final: bool = True) -> tuple[bytes, int] | None:
    """The name text starting at ``text_start`` (on the line starting at ``line_start``) repaired
    (closing quote and comma kept) and where its last line ends; None when it needs no repair or
    cannot have one (it never closes, or a line of it reaches :data:`HOLD_BYTES`, its first
    counted from the line's start as :func:`mended_blocks` counts it); :data:`_MORE` when, not
    ``final``, its lines run past the end of ``data``."""
    line_end = data.find(b"\n", text_start)
    if line_end < 0:
        if not final and len(data) - line_start < HOLD_BYTES:
            return _MORE
        line_end = len(data)
    if line_end - line_start >= HOLD_BYTES:
        return None
    text = data[text_start:line_end].rstrip(b"\r")
    joined = 0
    at_key = False
    while _closing(text) is None and joined < MAX_JOINED_LINES and line_end < len(data):
        next_end = data.find(b"\n", line_end + 1)
        if next_end < 0:
            if not final and len(data) - line_end - 1 < HOLD_BYTES:
                return _MORE
            next_end = len(data)
        if next_end - line_end - 1 >= HOLD_BYTES:
            break
        if _KEY_LINE.match(data, line_end + 1, next_end):
            at_key = True  # the event's next key: the name ends before it
            break
        text = text + b"\n" + data[line_end + 1 : next_end].rstrip(b"\r")
        line_end = next_end
        joined += 1
    closing = _closing(text)
    if closing is None and at_key:
        closing = _closing(text, escaped=True)  # its last quote follows a backslash of its own
    if closing is None:
        return None  # never closes: not a name we can mend (a truncated file)
    body, tail = text[:closing], text[closing:]
    fixed = escaped_name(body)
    if fixed == body and not joined:
        return None
    return fixed + tail, line_end


def escaped_name(text: bytes) -> bytes:
    """A name's ``text`` as libkineto wrote it between its quotes (nothing escaped), made a JSON
    string's body: each backslash and quote escaped, each newline written ``\\n``."""
    return text.replace(b"\\", b"\\\\").replace(b'"', b'\\"').replace(b"\n", b"\\n")


def _closing(text: bytes, *, escaped: bool = False) -> int | None:
    """Where the quote closing a name's ``text`` is: a last quote, or one before a last comma,
    after an even number of backslashes (so not escaped), or with ``escaped`` an odd number."""
    end = len(text) - 1 if text.endswith(b'",') else len(text)
    if not text[:end].endswith(b'"'):
        return None
    quote = end - 1
    backslashes = quote - len(text[:quote].rstrip(b"\\"))
    return quote if backslashes % 2 == escaped else None


class MendedText(io.RawIOBase):
    """A stream of ``open_blocks()``'s text with its names repaired (:func:`mended_blocks`), for
    the loaders to read as they read a file; ``repaired`` counts the names mended so far. Seeking
    goes back to the start only (``open_blocks`` is called again)."""

    def __init__(self, open_blocks: Callable[[], Iterable[bytes]]) -> None:
        super().__init__()
        self._open = open_blocks
        self._count = [0]
        self._blocks: Iterator[bytes] | None = None  # opened at the first read
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
        self._blocks = None
        self._left = memoryview(b"")
        return 0

    def readinto(self, buffer: memoryview) -> int:  # type: ignore[override]
        if self._blocks is None:
            self._blocks = mended_blocks(self._open(), self._count)
        while not self._left:
            block = next(self._blocks, None)
            if block is None:
                return 0
            self._left = memoryview(block)
        size = min(len(buffer), len(self._left))
        buffer[:size] = self._left[:size]
        self._left = self._left[size:]
        return size
