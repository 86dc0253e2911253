"""Code excerpts for the report: a few lines of the user's source, read only from a source root.

A trace names files by path (``/srv/app/train.py(47): step``), and a report is made to be shared,
so what a trace names must never pull an arbitrary file of the analyzing machine into it. An
excerpt is read only when the user named a source root (``--source-root``, the ``source-root`` of
``[tool.traceinsight]``, or the script's project for ``traceinsight run``), and only from a regular
``.py`` file that lies inside that root once symlinks and ``..`` are resolved; its size and the
lines shown are bounded.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path
from typing import Final

from traceinsight.load.text import printable
from traceinsight.model import Model

#: Lines shown either side of a finding's source line.
EXCERPT_CONTEXT: Final[int] = 3
#: Source files larger than this are not read for excerpts.
MAX_SOURCE_BYTES: Final[int] = 4 * 1024 * 1024
#: Characters shown of each line.
MAX_LINE_CHARS: Final[int] = 160


class SourceExcerpt(Model, frozen=True):
    """A few lines around a source line, read from disk when the report was made."""

    location: str
    path: str
    line: int
    #: (line number, text) pairs, the offending line among them.
    lines: tuple[tuple[int, str], ...]


def resolve_source(file_part: str, root: Path) -> Path | None:
    """The file a trace's path names, when it is a ``.py`` file inside ``root`` after symlinks and
    ``..`` are resolved (relative paths are taken from ``root``); else None."""
    try:
        base = root.resolve(strict=True)
        candidate = Path(file_part)
        path = (candidate if candidate.is_absolute() else base / candidate).resolve(strict=True)
    except (OSError, ValueError, RuntimeError):  # missing, a NUL in the name, a symlink loop
        return None
    if not path.is_relative_to(base) or path.suffix != ".py":
        return None
    return path


def _read_source(path: Path) -> str | None:
    """The text of a regular file of at most :data:`MAX_SOURCE_BYTES` (never a FIFO or device:
    it is opened non-blocking and not through a symlink swapped in since it was resolved)."""
    flags = (
        os.O_RDONLY
        | getattr(os, "O_NONBLOCK", 0)
        | getattr(os, "O_NOFOLLOW", 0)
        | getattr(os, "O_CLOEXEC", 0)
    )
    try:
        descriptor = os.open(path, flags)
    except OSError:
        return None
    with os.fdopen(descriptor, "rb") as stream:
        info = os.fstat(descriptor)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_SOURCE_BYTES:
            return None
        try:
            data = stream.read(MAX_SOURCE_BYTES + 1)
        except OSError:
            return None
    if len(data) > MAX_SOURCE_BYTES:
        return None
    return data.decode("utf-8", errors="replace")


def source_excerpt(
    location: str, root: Path | None, context: int = EXCERPT_CONTEXT, *, from_line: bool = False
) -> SourceExcerpt | None:
    """The lines around ``file.py:line`` when that file may be read (see the module docstring),
    else None: no root, not a ``.py`` file inside it, too large, or the line past the end of the
    file (it changed since the profile). Control characters in the lines are replaced.

    ``from_line``: the lines from ``line`` on (twice ``context`` after it, none before), for a
    function's first line: what follows it is the function's body, where the call is."""
    if root is None:
        return None
    file_part, _, line_part = location.rpartition(":")
    if not file_part or not line_part.isdigit() or len(line_part) > 9:
        return None
    line = int(line_part)
    path = resolve_source(file_part, root)
    text = _read_source(path) if path is not None else None
    if path is None or text is None:
        return None
    lines = text.splitlines()
    if line < 1 or line > len(lines):
        return None
    first = line if from_line else max(1, line - context)
    last = min(len(lines), line + (2 * context if from_line else context))
    shown = tuple(
        (number, printable(lines[number - 1].expandtabs(4).rstrip()[:MAX_LINE_CHARS]))
        for number in range(first, last + 1)
    )
    return SourceExcerpt(location=location, path=str(path), line=line, lines=shown)
