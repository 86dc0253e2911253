"""The native path: the C scanner (:mod:`._scan`) reads events as the file streams in.

Algorithm: the file is read (and gunzipped) in blocks, never whole. The scanner finds the
``traceEvents`` array, then reads each block's complete events in C, without the GIL, into columns
of (kind, value) per field, with each distinct string made into a Python object once. While it
scans one block, the main thread reads the next and turns the previous block's columns into the
loader's tables with numpy and polars, applying the reference's coercions (:func:`.tables._int`,
:func:`.tables._ns`, ``str`` for names) column-wise; the rare values of an unusual type (a float
id, a non-string name) go through those same functions one by one. The top-level fields around the
array are decoded once, from the bytes before and after it.

The scanner validates everything it passes over and refuses (:class:`Unavailable`) whatever it
does not read exactly like the reference (NaN, integers beyond int64, escaped keys, a non-object
event, invalid JSON, another layout); the caller then takes the pure-Python path, which gives the
same tables or the canonical one-line error.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import numpy as np
import polars as pl

from traceinsight.errors import TraceInsightError
from traceinsight.load import schema
from traceinsight.load.columns import _GROUP_FIELDS, _GROUP_OF_CATEGORY, ChunkTables, assemble, end_ns, merge
from traceinsight.load.decode import TraceDocument
from traceinsight.load.parallel import Loaded, Unsplittable, _blocks, _Frame
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.tables import _int, _ns
from traceinsight.load.whole import decode_document

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
_HEAD_LIMIT: Final = 64 << 20
_INT64_NS_LIMIT: Final = (2**63 - 1) // 1000


_EMPTY_TABLES: Final = {
    name: pl.DataFrame(schema=table_schema) for name, table_schema in schema.TABLES.items()
}


class Unavailable(Exception):
    """The native path cannot read this file exactly (or was not built): use the Python path."""


class _Column:
    """One field of a scanned block: kinds, raw values, and the block's distinct strings."""

    def __init__(self, kinds: np.ndarray, values: np.ndarray, strings: list[str]) -> None:
        self.kinds, self.values, self.strings = kinds, values, strings

    def mask(self, kind: int) -> np.ndarray:
        return np.asarray(self.kinds == kind)

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

    def ints(self, string_ints: pl.Series) -> pl.Series:
        """``_int`` of each value: ints as they are, strings by their table, floats one by one."""
        result = pl.Series(self.values, dtype=pl.Int64)
        strings = self.mask(_STR)
        if strings.any():
            codes = pl.Series(self.values[strings], dtype=pl.Int64)
            result = result.scatter(np.flatnonzero(strings), string_ints.gather(codes))
        none = self.mask(_NONE)
        if none.any():
            result = result.scatter(np.flatnonzero(none), None)
        floats = np.flatnonzero(self.mask(_FLOAT))
        if floats.size:
            result = result.scatter(floats, pl.Series([_int(v) for v in self.python(floats)], dtype=pl.Int64))
        return result

    def texts(self, strings: pl.Series, other: Callable[[Any], str | None] | str | None) -> pl.Series:
        """Strings as they are; any other value becomes ``other`` (a constant, or the reference's
        rule applied value by value)."""
        is_str = self.mask(_STR)
        codes = pl.Series(np.where(is_str, self.values, 0), dtype=pl.Int64)
        result = strings.gather(codes) if strings.len() else pl.Series([None] * len(codes), dtype=pl.String)
        rest = np.flatnonzero(~is_str)
        if rest.size and callable(other):
            result = result.scatter(rest, pl.Series([other(v) for v in self.python(rest)], dtype=pl.String))
        elif rest.size and not callable(other):
            result = result.scatter(rest, other)
        return result

    def times(self) -> tuple[pl.Series, np.ndarray]:
        """``_ns`` of each value (nulls where not a time), and which rows held a float.

        Ints are µs; ``_NS`` floats were converted by the scanner from their text; other floats
        take the column-wise rule of the fast path (:func:`.columns._float_column_to_ns`)."""
        ints = self.mask(_INT)
        converted = self.mask(_NS)
        floats = self.mask(_FLOAT)
        in_range = (self.values >= -_INT64_NS_LIMIT) & (self.values <= _INT64_NS_LIMIT)
        result = pl.Series(np.where(ints & in_range, self.values * 1000, self.values), dtype=pl.Int64)
        bad = ~((ints & in_range) | converted)
        if floats.any():
            values = self.values.view(np.float64)[floats]
            finite = np.isfinite(values) & (np.abs(values) < _INT64_NS_LIMIT)
            rows = np.flatnonzero(floats)
            if finite.any():
                result = result.scatter(rows[finite], _float_ns(pl.Series(values[finite], dtype=pl.Float64)))
            odd = rows[~finite]
            bad &= ~floats
            if odd.size:
                result = result.scatter(odd, pl.Series([_ns(v) for v in self.python(odd)], dtype=pl.Int64))
        if bad.any():
            result = result.scatter(np.flatnonzero(bad), None)
        return result, floats | converted


def _float_ns(floats: pl.Series) -> pl.Series:
    from traceinsight.load.columns import _float_column_to_ns

    return _float_column_to_ns(floats)


def _decode_strings(raw: list[bytes], escaped: list[int]) -> list[str]:
    """The scanner's distinct strings (raw JSON contents) as Python strings."""
    try:
        strings = [s.decode() for s in raw]
    except UnicodeDecodeError as exc:  # the scanner validated UTF-8; this cannot happen
        raise Unavailable("undecodable string") from exc
    for index in escaped:
        strings[index] = json.loads(b'"' + raw[index] + b'"')
    return strings


def _name(value: Any) -> str:
    return str(value)


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
    string_ints = pl.Series([_int(s) for s in strings], dtype=pl.Int64)

    ts, float_rows = field["ts"].times()
    kept = ts.is_not_null()
    origin = ts.min()
    float_time = bool((float_rows & kept.to_numpy()).any())
    dur = field["dur"].times()[0].fill_null(0).clip(lower_bound=0)
    ext = field["external_id"]
    legacy_ext = field["external_id_legacy"]
    # The reference takes "External id" unless it is None, then "external id"; then ``_int``.
    use_legacy = ext.mask(_NONE)
    external = _Column(
        np.where(use_legacy, legacy_ext.kinds, ext.kinds),
        np.where(use_legacy, legacy_ext.values, ext.values),
        strings,
    )
    cat = field["cat"].texts(texts, "")
    frame = pl.DataFrame(
        {
            "cat": cat,
            "name": field["name"].texts(texts, _name),
            "ts": ts,
            "dur": dur,
            "end": end_ns(ts, dur),
            "pid": field["pid"].ints(string_ints),
            "tid": field["tid"].ints(string_ints),
            "external_id": external.ints(string_ints),
            "correlation": field["correlation"].ints(string_ints),
            "device": field["device"].ints(string_ints),
            "stream": field["stream"].ints(string_ints),
            "bytes": field["bytes"].ints(string_ints),
            "python_id": field["python_id"].ints(string_ints),
            "parent_id": field["python_parent_id"].ints(string_ints),
            "call_stack": field["call_stack"].texts(texts, None),
            "group": cat.replace_strict(_GROUP_OF_CATEGORY, default=None, return_dtype=pl.String),
        }
    ).filter(kept)
    frames = {group: frame.filter(pl.col("group") == group) for group in _GROUP_FIELDS}
    tables, legacy = assemble(frames)
    return ChunkTables(
        tables=tables,
        event_count=events,
        categories=categories,
        origin=origin,  # type: ignore[arg-type]
        legacy=legacy,
        float_time=float_time,
    )


def _scans(blocks: Iterator[bytes], frame: _Frame, pool: ThreadPoolExecutor) -> Iterator[Future[Any]]:
    """Scans of the events, block by block, each started as soon as the previous one ended."""
    assert _scan is not None
    head = b""
    start = -1
    for block in blocks:
        head += block
        try:
            start = _scan.events_start(head)
        except _scan.Unsupported as exc:
            raise Unavailable(str(exc)) from exc
        if start >= 0:
            break
        if len(head) > _HEAD_LIMIT:
            raise Unavailable("no traceEvents near the start")
    if start < 0:
        raise Unavailable("no events array")
    frame.head = head[:start]
    frame.bare = head[:start].lstrip().startswith(b"[")
    pending = head[start:]
    first = True
    block = next(blocks, b"")
    while True:
        more = bool(block)
        data = pending + block if pending else block
        future = pool.submit(_scan.scan, data, 0, not more, first)
        yield future
        block = next(blocks, b"") if more else b""  # read (and gunzip) ahead while it scans
        try:
            result = future.result()
        except _scan.Unsupported as exc:
            raise Unavailable(str(exc)) from exc
        first = False
        resume, done = result[0], result[1]
        pending = data[resume:]
        if done:
            frame.tail = b"".join([pending, block, *blocks])
            return
        if not more:
            raise Unavailable("the events array does not end")


def load_native(path: Path, progress: ProgressCallback | None) -> Loaded:
    """Load ``path`` with the scanner (see the module docstring); :class:`Unavailable` if it cannot."""
    if _scan is None:
        raise Unavailable("the native scanner was not built")
    total = path.stat().st_size
    frame = _Frame()
    parts: list[ChunkTables] = []
    events = 0
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="traceinsight-scan") as pool:
        previous: Future[Any] | None = None
        try:
            for future in _scans(_blocks(path, frame, BLOCK_BYTES), frame, pool):
                if previous is not None:
                    part = block_tables(previous.result())
                    events += part.event_count
                    parts.append(part)
                    if progress is not None:
                        progress(min(frame.file_bytes, total - 1), total, events)
                previous = future
            if previous is not None:
                parts.append(block_tables(previous.result()))
        except Unsplittable as exc:  # a damaged gzip stream: the Python path words the error
            raise Unavailable(str(exc)) from exc
    if frame.bare:
        if frame.tail.strip():
            raise Unavailable("data after the events array")
        document = TraceDocument(bare_array=True)
    else:
        try:
            document = decode_document(frame.head + b"]" + frame.tail, path)
        except TraceInsightError as exc:
            raise Unavailable(str(exc)) from exc
        if document.traceEvents:
            raise Unavailable("a second traceEvents key")
    merged = merge(parts)
    if progress is not None:
        progress(total, total, merged.event_count)
    return Loaded(document, merged)


__all__ = ["AVAILABLE", "Unavailable", "block_tables", "load_native"]
