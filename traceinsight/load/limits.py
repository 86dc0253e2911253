"""What the loader accepts: the limits that keep a hostile file from taking the machine.

A trace is untrusted input (a teammate's upload, a bug report's attachment). Every limit here
stops the load with one line and exit code 2; the README's "Safety" section lists them.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

from traceinsight.errors import TraceFormatError

#: Every string taken from a trace (names, categories, call stacks, device names) is cut to this
#: many characters, with its full length noted (``…(+N chars)``), so that outputs stay bounded.
TEXT_CHARS: Final = 1024

#: JSON nesting deeper than this (the top-level value is level 1) is refused.
MAX_DEPTH: Final = 512

#: One JSON string (or number) longer than this many bytes is refused.
MAX_STRING_BYTES: Final = 1 << 30

#: More events than this are refused (memory grows with events: about 150 bytes per kept event).
MAX_EVENTS: Final = 100_000_000

#: Integers with more digits are refused, as Python's ``json`` refuses them.
MAX_INT_DIGITS: Final = 4300

#: The top-level fields before and after the events array (device properties, distributed info)
#: may take at most this many bytes (whitespace aside).
MAX_FIELDS_BYTES: Final = 64 << 20

#: A gzip trace whose text grows past ``GZIP_RATIO`` times the compressed bytes read so far is
#: stopped as a compression bomb, at any size past ``GZIP_FLOOR_BYTES`` (below it the memory is
#: nothing, and a small repetitive file is no bomb), unless ``--force``. Real traces never come
#: near: the 22 gzip samples expand 1.2 to 30.3 times in all, and at most 44.0 times counted while
#: they stream (a run of near-identical events early in the file: v100 resnet50); recompressed at
#: gzip's highest level, at most 34.7 times in all. A gzip bomb reaches about 1000.
GZIP_RATIO: Final = 100
GZIP_FLOOR_BYTES: Final = 1 << 20


def too_many_events(path: Path) -> TraceFormatError:
    """The one line for a trace past :data:`MAX_EVENTS` (every loader's)."""
    return TraceFormatError(
        f"cannot read trace {path}: it holds more than {MAX_EVENTS:,} events; "
        "profile fewer steps (schedule active=) or split the trace"
    )


_SIZE: Final = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(b|[kmgt]i?b?)?\s*")


def parse_size(text: str) -> int:
    """``512M``, ``2G``, ``1.5GB``, ``8GiB``, ``4096`` → bytes; ValueError for anything else or 0.

    One reading for every size option (``--max-size``, ``--max-memory``): k, M, G and T are powers
    of 1024, with or without ``B`` or ``iB`` (``--max-size 2G`` was 2.0e9 bytes while
    ``--max-memory 2G`` was 2^31)."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ValueError(text)
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    scale = 1 if unit in ("", "b") else 1024 ** ("kmgt".index(unit[0]) + 1)
    size = int(number * scale)
    if size <= 0:
        raise ValueError(text)
    return size
