"""The native path: the C scanner (:mod:`._scan`) reads events as the file streams in.

Algorithm: a plain file is mapped in memory; a gzip file is gunzipped in blocks by a thread of
its own, never whole. The scanner finds the ``traceEvents`` array; then the events are scanned in
C, without the GIL, into columns of (kind, value) per field, with each distinct string made into a
Python object once. When each event of a mapped file starts its own line (Kineto's layout), the
file is cut at the last "newline, indentation, ``{``" before each 32 MB into runs of whole events
that two threads scan at once; every run must then end in exactly one comma after its last event,
else the cut was not between events and the load starts again with one scan after another, each
resuming where the previous stopped (what other layouts and gunzipped streams get).
Meanwhile the main thread turns each scanned run into the loader's tables with numpy and polars,
applying the reference's coercions (:func:`.tables._int`, :func:`.tables._ns`, ``str`` for names)
column-wise; the rare values of an unusual type (a float id, a non-string name) go through those
same functions one by one. The top-level fields around the array are decoded once, from the bytes
before and after it.

The scanner validates everything it passes over and refuses (:class:`Unavailable`) whatever it
does not read exactly like the reference (NaN, integers beyond int64 in a field the tables use,
escaped keys, a non-object event, invalid JSON); the caller then takes the pure-Python path, which
gives the same tables or the canonical one-line error.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import numpy as np
import polars as pl

from traceinsight.load import schema
from traceinsight.load.columns import (
    _GROUP_FIELDS,
    _GROUP_OF_CATEGORY,
    ChunkTables,
    _float_column_to_ns,
    assemble,
)
from traceinsight.load.parallel import Loaded, Unsplittable, _blocks, _Frame, line_boundary
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.tables import _int, _ns

try:
    from traceinsight.load import _scan  # type: ignore[attr-defined]
except ImportError:  # built without a C compiler: the pure-Python path does all the loading
    _scan = None

AVAILABLE: Final = _scan is not None

#: Field order of the scanner's columns (see ``_scan.c``).
FIELDS: Final = (
    "cat",
    "name",
    "pid",
    "tid",
    "ts",
    "dur",
    "external_id",
    "external_id_legacy",
    "correlation",
    "device",
    "stream",
    "bytes",
    "python_id",
    "python_parent_id",
    "call_stack",
)
_NONE, _INT, _FLOAT, _STR, _NS = 0, 1, 2, 3, 4
#: Bytes of the file read per block: the scanner's unit of work.
BLOCK_BYTES: Final = 16 << 20
#: A mapped file's runs are views, not copies: twice as long, which halves the per-run overhead.
MAPPED_RUNS: Final = 2
#: Threads scanning runs of events at once (when the layout lets runs be cut without scanning).
SCAN_THREADS: Final = 2
_HEAD_LIMIT: Final = 64 << 20
_INT64_NS_LIMIT: Final = (2**63 - 1) // 1000


_EMPTY_TABLES: Final = {
    name: pl.DataFrame(schema=table_schema) for name, table_schema in schema.TABLES.items()
}


class Unavailable(Exception):
    """The native path cannot read this file exactly (or was not built): use the Python path."""


class _Column:
    """One field of a scanned run: kinds, raw values, and the run's distinct strings.

    Each conversion is numpy over the whole column for the usual kinds, and the reference's own
    per-value function for the rare rest; nulls are set with one boolean mask (``Series.set``).
    """

    def __init__(self, kinds: np.ndarray, values: np.ndarray, strings: list[str]) -> None:
        self.kinds, self.values, self.strings = kinds, values, strings

    def python(self, rows: np.ndarray) -> list[Any]:
        """The reference decoder's values at ``rows`` (None, int, float or str)."""
        floats = self.values.view(np.float64)
        out: list[Any] = []
        for row in rows.tolist():
            kind = self.kinds[row]
            if kind == _INT:
                out.append(int(self.values[row]))
            elif kind == _FLOAT:
                out.append(float(floats[row]))
            elif kind == _STR:
                out.append(self.strings[self.values[row]])
            else:
                out.append(None)
        return out

    def ints(self, string_ints: np.ndarray, string_valid: np.ndarray) -> pl.Series:
        """``_int`` of each value: ints as they are, strings by their table, floats one by one."""
        kinds, values = self.kinds, self.values
        valid = kinds == _INT
        if not valid.all():
            values = values.copy()
            strings = kinds == _STR
            if strings.any():
                codes = values[strings]
                values[strings] = string_ints[codes]
                valid |= strings
                valid[strings] = string_valid[codes]
            floats = np.flatnonzero(kinds == _FLOAT)
            for row, value in zip(floats.tolist(), self.python(floats), strict=True):
                number = _int(value)
                values[row], valid[row] = (number, True) if number is not None else (0, False)
        return _with_nulls(pl.Series(values, dtype=pl.Int64), valid)

    def texts(self, strings: pl.Series, other: Callable[[Any], str | None] | str | None) -> pl.Series:
        """Strings as they are; any other value becomes ``other`` (a constant, or the reference's
        rule applied value by value)."""
        is_str = self.kinds == _STR
        everything = bool(is_str.all())
        codes = pl.Series(self.values if everything else np.where(is_str, self.values, 0), dtype=pl.Int64)
        result = (
            strings.gather(codes)
            if strings.len()
            else pl.repeat(None, len(codes), dtype=pl.String, eager=True)
        )
        if everything:
            return result
        if callable(other):
            rest = np.flatnonzero(~is_str)
            return result.scatter(rest, pl.Series([other(v) for v in self.python(rest)], dtype=pl.String))
        return result.set(pl.Series(~is_str), other)

    def times(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``_ns`` of each value: (ns, valid, was a float).

        Ints are µs; ``_NS`` floats were converted by the scanner from their text; other floats
        take the column-wise rule of the fast path (:func:`.columns._float_column_to_ns`)."""
        kinds, values = self.kinds, self.values
        ints = kinds == _INT
        converted = kinds == _NS
        floats = kinds == _FLOAT
        in_range = ints & (values >= -_INT64_NS_LIMIT) & (values <= _INT64_NS_LIMIT)
        ns = np.where(in_range, values * 1000, values)
        valid = in_range | converted
        if floats.any():
            rows = np.flatnonzero(floats)
            doubles = values.view(np.float64)[rows]
            finite = np.isfinite(doubles) & (np.abs(doubles) < _INT64_NS_LIMIT)
            if finite.any():
                ns[rows[finite]] = _float_column_to_ns(
                    pl.Series(doubles[finite], dtype=pl.Float64)
                ).to_numpy()
                valid[rows[finite]] = True
            odd = rows[~finite]
            for row, value in zip(odd.tolist(), self.python(odd), strict=True):
                number = _ns(value)
                ns[row], valid[row] = (number, True) if number is not None else (0, False)
        return ns, valid, floats | converted


def _with_nulls(series: pl.Series, valid: np.ndarray) -> pl.Series:
    if valid.all():
        return series
    return series.set(pl.Series(~valid), None)


def _decode_strings(raw: list[bytes], escaped: list[int]) -> list[str]:
    """The scanner's distinct strings (raw JSON contents) as Python strings."""
    try:
        strings = [s.decode() for s in raw]
    except UnicodeDecodeError as exc:  # the scanner validated UTF-8; this cannot happen
        raise Unavailable("undecodable string") from exc
    for index in escaped:
        strings[index] = json.loads(b'"' + raw[index] + b'"')
    return strings


#: Table groups by index, and each category's group (-1: none).
_GROUPS: Final = tuple(_GROUP_FIELDS)
_GROUP_INDEX: Final = {cat: _GROUPS.index(group) for cat, group in _GROUP_OF_CATEGORY.items()}


def block_tables(result: tuple[Any, ...]) -> ChunkTables:
    """One scan result → the loader's tables for its events (what ``build_trace`` gives for them)."""
    _resume, _done, events, rows, columns, raw_strings, escaped, counts = result
    strings = _decode_strings(raw_strings, escaped)
    categories: dict[str, int] = {}
    for _order, index, count in counts:  # in the order each category was first seen
        key = strings[index] if index >= 0 else ""
        categories[key] = categories.get(key, 0) + count
    if not rows:  # no complete event, or none of phase X: nothing for the tables
        return ChunkTables(tables=_EMPTY_TABLES, event_count=events, categories=categories)
    buffer = np.frombuffer(columns, dtype=np.uint8)
    width = len(FIELDS)
    values = buffer[: rows * 8 * width].view(np.int64).reshape(width, rows)
    kinds = buffer[rows * 8 * width :].reshape(width, rows)
    field = {name: _Column(kinds[i], values[i], strings) for i, name in enumerate(FIELDS)}
    texts = pl.Series(strings, dtype=pl.String)
    numbers = [_int(s) for s in strings]
    string_ints = np.array([0 if n is None else n for n in numbers], dtype=np.int64)
    string_valid = np.array([n is not None for n in numbers], dtype=bool)

    ts, kept, floats = field["ts"].times()
    float_time = bool((floats & kept).any())
    dur, dur_valid, _ = field["dur"].times()
    dur = np.where(dur_valid & (dur > 0), dur, 0)
    end = ts + dur  # wraps past Int64, which the reference leaves null
    cat = field["cat"]
    group_of_string = np.array([_GROUP_INDEX.get(s, -1) for s in strings] or [-1], dtype=np.int64)
    group = np.where(cat.kinds == _STR, group_of_string[np.where(cat.kinds == _STR, cat.values, 0)], -1)
    group[~kept] = -1
    # The reference takes "External id" unless it is None, then "external id"; then ``_int``.
    ext, legacy_ext = field["external_id"], field["external_id_legacy"]
    use_legacy = ext.kinds == _NONE
    external = _Column(
        np.where(use_legacy, legacy_ext.kinds, ext.kinds),
        np.where(use_legacy, legacy_ext.values, ext.values),
        strings,
    )
    frame = pl.DataFrame(
        {
            "cat": cat.texts(texts, ""),
            "name": field["name"].texts(texts, str),
            "ts": pl.Series(ts, dtype=pl.Int64),
            "dur": pl.Series(dur, dtype=pl.Int64),
            "end": _with_nulls(pl.Series(end, dtype=pl.Int64), end >= ts),
            "pid": field["pid"].ints(string_ints, string_valid),
            "tid": field["tid"].ints(string_ints, string_valid),
            "external_id": external.ints(string_ints, string_valid),
            "correlation": field["correlation"].ints(string_ints, string_valid),
            "device": field["device"].ints(string_ints, string_valid),
            "stream": field["stream"].ints(string_ints, string_valid),
            "bytes": field["bytes"].ints(string_ints, string_valid),
            "python_id": field["python_id"].ints(string_ints, string_valid),
            "parent_id": field["python_parent_id"].ints(string_ints, string_valid),
            "call_stack": field["call_stack"].texts(texts, None),
            "group": pl.Series(group, dtype=pl.Int64),
        }
    )
    parts = frame.partition_by("group", as_dict=True, include_key=False)
    empty = frame.clear()
    tables, legacy = assemble({g: parts.get((i,), empty) for i, g in enumerate(_GROUPS)})
    return ChunkTables(
        tables=tables,
        event_count=events,
        categories=categories,
        origin=int(ts[kept].min()) if kept.any() else None,
        legacy=legacy,
        float_time=float_time,
    )


def _events_start(blocks: Iterator[bytes], frame: _Frame) -> bytes:
    """Read up to the first byte inside the events array; the bytes read past it are returned."""
    assert _scan is not None
    head = b""
    start = -1
    for block in blocks:
        head += block
        start = _events_start_in(head)
        if start >= 0:
            break
        if len(head) > _HEAD_LIMIT:
            raise Unavailable("no traceEvents near the start")
    if start < 0:
        raise Unavailable("no events array")
    frame.head = head[:start]
    frame.bare = head[:start].lstrip().startswith(b"[")
    return head[start:]


class _Mismatch(Exception):
    """A cut between events was not one (another layout): scan the file run after run."""


def _sequential(
    pending: bytes, blocks: Iterator[bytes], frame: _Frame, pool: ThreadPoolExecutor
) -> Iterator[tuple[Any, ...]]:
    """Scan results block after block; each scan resumes where the previous one stopped. The next
    scan is started before a result is handed on, so tables are built while it runs."""
    assert _scan is not None
    first = True
    block = next(blocks, b"")
    more = bool(block)
    data = pending + block if pending else block
    future = pool.submit(_scan.scan, data, 0, not more, first)
    while True:
        block = next(blocks, b"") if more else b""  # read (and gunzip) ahead while it scans
        result = _result(future)
        first = False
        resume, done = result[0], result[1]
        if done:
            frame.tail = b"".join([data[resume:], block, *blocks])
            yield result
            return
        if not more:
            raise Unavailable("the events array does not end")
        more = bool(block)
        data = data[resume:] + block
        future = pool.submit(_scan.scan, data, 0, not more, first)
        yield result


def _mapped(
    mapped: mmap.mmap, frame: _Frame, pool: ThreadPoolExecutor, workers: int
) -> Iterator[tuple[Any, ...]]:
    """Scan results of an uncompressed file mapped in memory: runs are views of the mapping (no
    copies), and each run's pages are dropped from this process once scanned, so the file never
    counts whole in its memory.

    When each event starts its own line, runs are cut at :func:`.parallel.line_boundary` and
    scanned ``workers`` at a time; each must end, after its last event, in exactly one comma
    (checked in order), else the cut was not between events and :class:`_Mismatch` says so.
    Otherwise each scan resumes where the previous one stopped."""
    assert _scan is not None
    view = memoryview(mapped)
    size = len(view)
    window = min(size, 1 << 20)
    while (start := _events_start_in(view[:window])) < 0:
        if window >= size or window > _HEAD_LIMIT:
            raise Unavailable("no events array near the start")
        window = min(size, window * 4)
    frame.head = bytes(view[:start])
    frame.bare = frame.head.lstrip().startswith(b"[")
    boundary = (line_boundary(bytes(view[start : start + 4096])) or None) if workers > 1 else None
    inflight: deque[tuple[Future[Any], int, int]] = deque()
    first = True

    def submit(begin: int, end: int) -> None:
        nonlocal first
        inflight.append((pool.submit(_scan.scan, view[begin:end], 0, end >= size, first), begin, end))
        first = False

    def finish(cut: bool) -> tuple[Any, ...]:
        future, begin, end = inflight.popleft()
        result = _result(future)
        _drop_pages(mapped, begin, end)
        frame.file_bytes = end
        if result[1]:  # done: the rest of the file follows the array
            for other, _, _ in inflight:
                other.cancel()
            inflight.clear()
            frame.tail = bytes(view[begin + result[0] :])
        elif cut and bytes(view[begin + result[0] : end]).strip() != b",":
            raise _Mismatch
        return result

    position = start
    if boundary is None:  # one scan after another, each resuming where the previous stopped
        width = BLOCK_BYTES * MAPPED_RUNS
        while True:
            end = min(size, position + width)
            submit(position, end)
            result = finish(cut=False)
            yield result
            if result[1]:
                return
            if end >= size:
                raise Unavailable("the events array does not end")
            width = BLOCK_BYTES * MAPPED_RUNS if result[0] else width * 2  # an event longer than the window
            position += result[0]
    while position < size:
        end = min(size, position + BLOCK_BYTES * MAPPED_RUNS)
        cut = -1
        while end < size and (cut := mapped.rfind(boundary, position + 1, end)) < 0:
            end = min(size, end + BLOCK_BYTES * MAPPED_RUNS)
        if end < size:
            end = cut + len(boundary) - 1  # at the "{"
        submit(position, end)
        position = end
        while len(inflight) > workers or (inflight and position >= size):
            result = finish(cut=True)
            yield result
            if result[1]:
                return
    raise Unavailable("the events array does not end")


def _events_start_in(head: bytes | memoryview) -> int:
    assert _scan is not None
    try:
        return int(_scan.events_start(head))
    except _scan.Unsupported as exc:
        raise Unavailable(str(exc)) from exc


def _drop_pages(mapped: mmap.mmap, begin: int, end: int) -> None:
    """Let go of the whole pages of ``[begin, end)`` (they stay in the page cache)."""
    if not hasattr(mapped, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    first = begin - begin % mmap.PAGESIZE
    last = end - end % mmap.PAGESIZE
    if last > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)


def _result(future: Future[Any]) -> tuple[Any, ...]:
    assert _scan is not None
    try:
        return future.result()  # type: ignore[no-any-return]
    except _scan.Unsupported as exc:
        raise Unavailable(str(exc)) from exc


def load_native(path: Path, progress: ProgressCallback | None) -> Loaded:
    """Load ``path`` with the scanner (see the module docstring); :class:`Unavailable` if it cannot."""
    if _scan is None:
        raise Unavailable("the native scanner was not built")
    try:
        return _load(path, progress, SCAN_THREADS)
    except _Mismatch:
        return _load(path, progress, 1)


@contextlib.contextmanager
def _read_ahead(source: Iterator[bytes], depth: int = 2) -> Iterator[Iterator[bytes]]:
    """``source`` (gunzipped blocks) produced by a thread of its own, up to ``depth`` blocks ahead:
    zlib lets go of the GIL while it inflates, so decompression runs beside the scans."""
    slots: queue.Queue[tuple[bytes | None, BaseException | None]] = queue.Queue(maxsize=depth)
    stop = threading.Event()

    def produce() -> None:
        try:
            for block in source:
                while not stop.is_set():
                    try:
                        slots.put((block, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            slots.put((None, None))
        except BaseException as exc:  # handed to the consumer, which raises it
            slots.put((None, exc))

    def consume() -> Iterator[bytes]:
        while True:
            block, failure = slots.get()
            if failure is not None:
                raise failure
            if block is None:
                return
            yield block

    producer = threading.Thread(target=produce, name="traceinsight-gunzip", daemon=True)
    producer.start()
    try:
        yield consume()
    finally:
        stop.set()
        while producer.is_alive():  # let a blocked producer finish its put
            with contextlib.suppress(queue.Empty):
                slots.get_nowait()
            producer.join(timeout=0.05)


def _map_plain(path: Path, stack: contextlib.ExitStack) -> mmap.mmap | None:
    """The file mapped read-only when it is plain (not gzip) and not empty, else None."""
    with path.open("rb") as stream:
        if stream.read(2) in (b"\x1f\x8b", b""):
            return None
        try:
            mapped = mmap.mmap(stream.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError):
            return None
    stack.callback(_close_quietly, mapped)
    return mapped


def _close_quietly(mapped: mmap.mmap) -> None:
    # A view may still be alive somewhere (a cancelled scan): the collector closes the map then.
    with contextlib.suppress(BufferError):
        mapped.close()


def _load(path: Path, progress: ProgressCallback | None, workers: int) -> Loaded:
    total = path.stat().st_size
    frame = _Frame()
    parts: list[ChunkTables] = []
    events = 0
    with contextlib.ExitStack() as stack:
        pool = stack.enter_context(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="traceinsight-scan")
        )
        try:
            mapped = _map_plain(path, stack)
            if mapped is not None:
                results = _mapped(mapped, frame, pool, workers)
            else:
                # A gunzipped stream is scanned in one thread: gunzip already has the other core.
                blocks = stack.enter_context(_read_ahead(_blocks(path, frame, BLOCK_BYTES)))
                results = _sequential(_events_start(blocks, frame), blocks, frame, pool)
            for result in results:
                part = block_tables(result)
                events += part.event_count
                parts.append(part)
                if progress is not None:
                    progress(min(frame.file_bytes, total - 1), total, events)
        except Unsplittable as exc:  # a damaged gzip stream: the Python path words the error
            raise Unavailable(str(exc)) from exc
    return frame.loaded(path, parts, progress, Unavailable)


__all__ = ["AVAILABLE", "Unavailable", "block_tables", "load_native"]
