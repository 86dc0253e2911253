"""A head start for the scanner: the first runs of a large plain trace scanned while the command
still loads its libraries.

Before ``analyze`` can load a trace it imports polars, numpy and the analyses: about half a second
on one core, the machine's other cores idle. :func:`begin` maps a plain trace of at least
:data:`MIN_BYTES` whose events each start their own line (Kineto's layout), cuts its first
:data:`RUNS` runs as the loader cuts them (:func:`.scanner.cut_end`) and scans them one after
another in a thread of its own; it needs neither polars nor numpy (:mod:`.scanner`). The loader
(:func:`.native.load_native`) adopts the mapping when its own open file is the one mapped (device,
inode, size, modification time), and then takes each scan whose place and arguments are exactly
those it would scan next (:meth:`HeadStart.take`); from the first that differs it scans
everything itself. So the tables are the same with or without a head start, and anything
unexpected (gzip, another layout, a file that is not a trace, a file changed in between) only
means there is none: the loader meets it as it would have.

At most :data:`RUNS` scan results are held until the loader takes them (~20 MB each for real
events, and their 32 MB of the file's pages: :data:`.scanner.MAX_SCAN_ROWS`); :meth:`HeadStart.close`
drops what was not taken.
"""

from __future__ import annotations

import mmap
import os
import stat
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

from traceinsight.load.scanner import (
    AFTER_COMMA,
    BLOCK_BYTES,
    C_SCANNER,
    MAPPED_RUNS,
    MAX_SCAN_ROWS,
    START,
    close_quietly,
    cut_end,
    guard,
    is_bare,
    line_boundary,
)
from traceinsight.load.source import GZIP_MAGIC, leading_whitespace
from traceinsight.model import Model

__all__ = ["MIN_BYTES", "RUNS", "HeadStart", "begin"]

#: Smaller files are not started early: their whole scan is a few tens of milliseconds.
MIN_BYTES: Final = 8 << 20
#: Runs scanned ahead (32 MB each): what one thread scans while the libraries load (~0.1 s each),
#: and no more than the loader keeps in flight itself (its two threads' and the next one). With 4,
#: one of 5 jobs on the 0.5 GB DDP trace peaked at 1.08x the file (the others 0.94-0.97x); with 3,
#: 0.94-1.02x over 8 jobs (median 0.96x), against 0.94-0.99x without a head start.
RUNS: Final = 3
#: Bytes searched for the start of the events array (the loader searches further; this does not).
_HEAD_BYTES: Final = 1 << 20


def _identity(result: os.stat_result) -> tuple[int, int, int, int]:
    return (result.st_dev, result.st_ino, result.st_size, result.st_mtime_ns)


class _Run(Model, frozen=True):
    future: Future[Any]
    #: The scan's place and arguments: (begin, end, state, depth, max_rows).
    key: tuple[int, int, int, int, int]


class HeadStart:
    """Scans started on a mapped trace before its loader runs (see the module docstring)."""

    def __init__(
        self,
        identity: tuple[int, int, int, int],
        mapped: mmap.mmap,
        pool: ThreadPoolExecutor,
        runs: list[_Run],
    ) -> None:
        self._identity = identity
        self._mapped: mmap.mmap | None = mapped
        self._pool = pool
        self._runs = deque(runs)

    def adopt(self, fd: int) -> mmap.mmap | None:
        """The mapping, handed over (the caller closes it), when open file ``fd`` is the file it
        maps; else None, and the head start is closed."""
        mapped, self._mapped = self._mapped, None
        try:
            same = mapped is not None and _identity(os.fstat(fd)) == self._identity
        except (OSError, ValueError):
            same = False
        if not same:
            self.close()
            if mapped is not None:
                close_quietly(mapped)
            return None
        return mapped

    def take(self, begin: int, end: int, state: int, depth: int, max_rows: int) -> Future[Any] | None:
        """The next scan started here if it is of bytes ``begin:end`` with these arguments; else
        None, then and from then on (what was not taken is dropped)."""
        if self._runs and self._runs[0].key == (begin, end, state, depth, max_rows):
            return self._runs.popleft().future
        self.close()
        return None

    def close(self) -> None:
        """Drop the scans not taken (a running one is let finish; those taken run all the same)
        and the mapping if not adopted."""
        for run in self._runs:
            run.future.cancel()
        self._runs.clear()
        self._pool.shutdown(wait=False)
        if self._mapped is not None:
            mapped, self._mapped = self._mapped, None
            close_quietly(mapped)


def begin(path: Path) -> HeadStart | None:
    """Start scanning ``path`` (see the module docstring); None when it is not worth it or not
    for this path: never an error, whatever the file."""
    if C_SCANNER is None or os.environ.get("TRACEINSIGHT_NATIVE", "1") == "0":
        return None
    try:
        if not stat.S_ISREG(os.stat(path).st_mode):  # never open a FIFO or a device
            return None
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or info.st_size < MIN_BYTES:
                return None
            mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
    except (OSError, ValueError):
        return None
    if not guard(mapped):  # its pages must read as zeros if the file is cut short meanwhile
        close_quietly(mapped)
        return None
    try:
        started = _started(mapped, _identity(info))
    except Exception:  # whatever it is, the loader meets it and words it
        started = None
    if started is None:
        close_quietly(mapped)
    return started


def _started(mapped: mmap.mmap, identity: tuple[int, int, int, int]) -> HeadStart | None:
    view = memoryview(mapped)
    if bytes(view[:2]) == GZIP_MAGIC:
        return None
    lead = leading_whitespace(view[:_HEAD_BYTES])
    status, offset = C_SCANNER.events_start(view[lead : lead + _HEAD_BYTES])
    if status != 0:
        return None
    start = lead + offset
    depth = 1 if is_bare(bytes(view[lead:start])) else 2
    boundary = line_boundary(bytes(view[start : start + 4096]))
    if boundary is None:
        return None
    pool = ThreadPoolExecutor(1, thread_name_prefix="traceinsight-head-start")
    runs: list[_Run] = []
    position, size = start, len(view)
    while position < size and len(runs) < RUNS:
        end = cut_end(mapped, position, BLOCK_BYTES * MAPPED_RUNS, boundary)
        state = START if position == start else AFTER_COMMA
        text = view[position:end]
        future = pool.submit(C_SCANNER.scan, text, 0, state, depth, MAX_SCAN_ROWS)
        runs.append(_Run(future, (position, end, state, depth, MAX_SCAN_ROWS)))
        position = end
    return HeadStart(identity, mapped, pool, runs)
