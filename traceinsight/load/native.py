"""The native path: the C scanner (:mod:`._scan`) reads events as the file streams in.

Algorithm: a plain file is mapped in memory; a gzip file is gunzipped in blocks by a thread of
its own (:meth:`.source.TraceFile.blocks`), never whole. The scanner finds the ``traceEvents``
array; then the events are scanned in C, without the GIL, into columns of (kind, value) per field
of :data:`.schema.EVENT_FIELDS`, with each distinct string made into a Python object once. When
each event starts its own line (Kineto's layout), the text is cut at the last "newline,
indentation, ``{``" before each 32 MB into runs of whole events that two threads scan at once;
every run but the last must then end just after a comma, else the cut was not between events and
the load starts again with one scan after another, each resuming where (and in the state in
which) the previous stopped, which is what other layouts get. A scan that completes no element
(an event longer than the window) is retried on a window twice as long, so a huge event costs
linear time. ``analyze`` may have begun the first runs' scans while its libraries loaded
(:mod:`.head_start`): the loader takes those that are exactly the scans it would make. A
gunzipped stream is cut as a mapped file is (runs are the stream's buffer, handed over, not
copied): with ISA-L's inflater the gunzip thread takes about a sixth of a core, which leaves the
scans room for a second thread. 5 paired whole-process runs at 0.5 GB gzip, against
one scan after another: wall 0.93x, maximum RSS 0.90-0.92x (DDP, LLM decode); with the inflater,
against the previous release: 0.83-0.95x on three shapes, 1.02x on ResNet-50, whose load is
bound by building the tables.

Meanwhile the main thread turns each scanned run into the loader's tables with numpy and polars,
applying the reference's coercions (:mod:`.coerce`) column-wise and :func:`.text.clean_texts` to the
run's distinct strings; the rare values of an unusual type (a float id, a non-string name) go
through the per-value functions one by one. The top-level fields around the array are read once,
by the reference's own JSON reading (:func:`.decode.parse_json`), from the bytes before and after it.

The scanner validates everything it passes over; invalid JSON and the limits of :mod:`.limits`
are one-line errors here. Only a file whose ``traceEvents`` the reference might read differently
(a second ``traceEvents`` key, whose list would win; a first one that is not an array) is left to
the pure-Python path (:class:`Unavailable`).
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import queue
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

import msgspec
import numpy as np
import polars as pl

from traceinsight.arrays import series
from traceinsight.errors import TraceFormatError, TraceInsightError
from traceinsight.load import limits, schema
from traceinsight.load.coerce import INT64_NS_LIMIT, as_int, as_ns, float_column_to_ns, json_text_of
from traceinsight.load.decode import (
    TraceDocument,
    check_start,
    document_from_value,
    is_perfetto,
    json_error,
    not_a_trace,
    parse_json,
    perfetto_trace,
)
from traceinsight.load.head_start import HeadStart
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.scanner import AFTER_COMMA as _AFTER_COMMA
from traceinsight.load.scanner import (
    BLOCK_BYTES,
    MAPPED_RUNS,
    MAX_SCAN_ROWS,
    close_quietly,
    cut_end,
    cut_short,
    guard,
    is_bare,
    line_boundary,
)
from traceinsight.load.scanner import C_SCANNER as _scan
from traceinsight.load.scanner import START as _START
from traceinsight.load.source import TraceFile, empty_trace, format_bytes, is_blank, leading_whitespace
from traceinsight.load.tables import (
    GROUP_OF_CATEGORY,
    GROUPS,
    NO_EVENTS,
    ChunkTables,
    assemble,
    empty_chunk,
    group_columns,
    merge,
)
from traceinsight.load.text import clean_texts, without_lone_surrogates

AVAILABLE: Final = _scan is not None

#: Field order of the scanner's columns: the schema's list, handed to the scanner at import.
FIELDS: Final = tuple(f.name for f in schema.EVENT_FIELDS)
#: The fields read from every row, and those read only from ``"ph": "i"`` rows (the ``[memory]``
#: fields: the scanner gives them one row per ``i`` row, so X rows carry none of them).
_ROW_FIELDS: Final = tuple(f.name for f in schema.EVENT_FIELDS if not f.memory)
_INSTANT_FIELDS: Final = tuple(f.name for f in schema.EVENT_FIELDS if f.memory)

_NONE, _INT, _FLOAT, _STR, _NS, _BIG = 0, 1, 2, 3, 4, 5
#: The scanner's row phases (its last column): an X event, else a ``"ph": "i"`` one.
_PHASE_X: Final = 1
_NO_MEMORY: Final = pl.DataFrame(schema=schema.MEMORY_EVENTS)
_NO_INTS: Final = np.empty(0, dtype=np.int64)
_NO_KINDS: Final = np.empty(0, dtype=np.uint8)
#: Threads scanning runs of events at once (when the layout lets runs be cut without scanning).
SCAN_THREADS: Final = 2


class Unavailable(Exception):
    """The native path leaves this file to the pure-Python path (see the module docstring)."""


class _Column:
    """One field of a scanned run: kinds, raw values, and the run's distinct strings.

    Each conversion is numpy over the whole column for the usual kinds, and the reference's own
    per-value function for the rare rest; nulls are set with one boolean mask (``Series.set``).
    """

    def __init__(self, kinds: np.ndarray, values: np.ndarray, strings: list[str]) -> None:
        self.kinds, self.values, self.strings = kinds, values, strings

    def python(self, rows: np.ndarray) -> list[Any]:
        """The reference decoder's values at ``rows`` (None, int, float or str; a number beyond
        Int64 is None: no coercion keeps it)."""
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
        """``as_int`` of each value: ints as they are, strings by their table, floats one by one."""
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
                number = as_int(value)
                values[row], valid[row] = (number, True) if number is not None else (0, False)
        return _with_nulls(series(values, dtype=pl.Int64), valid)

    def texts(self, strings: pl.Series, other: Callable[[Any], str | None] | str | None) -> pl.Series:
        """Strings as they are; an integer beyond Int64 as its digits when ``other`` is ``str`` (the
        reference's ``str(value)``); any other value becomes ``other`` (a constant, or the
        reference's rule applied value by value)."""
        is_text = (self.kinds == _STR) | ((self.kinds == _BIG) if other is str else False)
        everything = bool(is_text.all())
        codes = series(self.values if everything else np.where(is_text, self.values, 0), dtype=pl.Int64)
        result = (
            strings.gather(codes)
            if strings.len()
            else pl.repeat(None, len(codes), dtype=pl.String, eager=True)
        )
        if everything:
            return result
        if callable(other):
            rest = np.flatnonzero(~is_text)
            return result.scatter(
                series(rest), pl.Series([other(v) for v in self.python(rest)], dtype=pl.String)
            )
        return result.set(series(~is_text), other)

    def times(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """``as_ns`` of each value: (ns, valid, was a float).

        Ints are µs; ``_NS`` floats were converted by the scanner from their text; other floats
        take the column-wise rule (:func:`.coerce.float_column_to_ns`)."""
        kinds, values = self.kinds, self.values
        ints = kinds == _INT
        converted = kinds == _NS
        floats = kinds == _FLOAT
        in_range = ints & (values >= -INT64_NS_LIMIT) & (values <= INT64_NS_LIMIT)
        ns = np.where(in_range, values * 1000, values)
        valid = in_range | converted
        if floats.any():
            rows = np.flatnonzero(floats)
            doubles = values.view(np.float64)[rows]
            finite = np.isfinite(doubles) & (np.abs(doubles) < INT64_NS_LIMIT)
            if finite.any():
                ns[rows[finite]] = float_column_to_ns(series(doubles[finite], dtype=pl.Float64)).to_numpy()
                valid[rows[finite]] = True
            odd = rows[~finite]
            for row, value in zip(odd.tolist(), self.python(odd), strict=True):
                number = as_ns(value)
                ns[row], valid[row] = (number, True) if number is not None else (0, False)
        return ns, valid, floats | converted


def _with_nulls(column: pl.Series, valid: np.ndarray) -> pl.Series:
    if valid.all():
        return column
    return column.set(series(~valid), None)


def _decode_strings(raw: list[bytes], escaped: list[int]) -> list[str]:
    """The scanner's distinct strings (raw JSON contents, validated UTF-8) as Python strings; the
    raw bytes are let go of one by one."""
    strings: list[str] = []
    for index, data in enumerate(raw):
        strings.append(data.decode())
        raw[index] = b""
    for index in escaped:
        strings[index] = without_lone_surrogates(json.loads('"' + strings[index] + '"'))
    return strings


def _memory_frame(
    column: dict[str, _Column],
    instant_column: dict[str, _Column],
    instants: np.ndarray,
    valid_ts: np.ndarray,
    ts: np.ndarray,
    cleaned: list[str],
    string_ints: np.ndarray,
    string_valid: np.ndarray,
) -> pl.DataFrame:
    """The ``memory`` table of a run: of its ``"ph": "i"`` rows (``instants``, whose memory fields
    are the ``instant_column`` rows in the same order), those with a time whose cleaned name is
    ``[memory]``."""
    if not len(instants):
        return _NO_MEMORY
    # A string may be interned twice (escaped and not): every distinct one is compared.
    names = column["name"]
    is_memory = np.array([s == schema.MEMORY_EVENT_NAME for s in cleaned] or [False], dtype=bool)
    name_kinds, name_values = names.kinds[instants], names.values[instants]
    keep = valid_ts[instants] & (name_kinds == _STR) & is_memory[np.where(name_kinds == _STR, name_values, 0)]
    picked = np.flatnonzero(keep)
    if not len(picked):
        return _NO_MEMORY
    data: dict[str, pl.Series] = {"ts": series(ts[instants[picked]], dtype=pl.Int64)}
    for name, field_name in schema.MEMORY_COLUMNS.items():
        if name != "ts":
            field = instant_column[field_name]
            data[name] = _Column(field.kinds[picked], field.values[picked], cleaned).ints(
                string_ints, string_valid
            )
    return pl.DataFrame(data, schema=schema.MEMORY_EVENTS)


#: The event columns each group's frame holds (what its tables read).
_GROUP_COLUMNS: Final = {group: group_columns(group) for group in GROUPS}
#: The scanner's field of each plain integer event column.
_ID_FIELD: Final = {"parent_id": "python_parent_id"}
#: Event columns read as text (a string or null): ``call_stack``, ``process_group``.
_TEXT_FIELDS: Final = frozenset(f.name for f in schema.EVENT_FIELDS if f.kind == "text")
#: Event columns read as JSON text (recorded shapes): the scanner hands a list's raw text over as a
#: string; it is made compact here (:func:`.coerce.json_text_of`), once per distinct text.
_JSON_FIELDS: Final = frozenset(f.name for f in schema.EVENT_FIELDS if f.kind == "json")


def _json_texts(field: _Column, strings: list[str], cut: frozenset[int]) -> pl.Series:
    """A ``json`` column: each distinct raw text made compact once; null where the scanner gave no
    list or object, or only the start of a long one."""
    is_text = field.kinds == _STR
    if not is_text.any():
        return pl.Series([None] * len(field.kinds), dtype=pl.String)
    codes, inverse = np.unique(np.where(is_text, field.values, -1), return_inverse=True)
    compact = [None if code < 0 or code in cut else json_text_of(strings[code]) for code in codes.tolist()]
    return pl.Series(compact, dtype=pl.String).gather(series(inverse.astype(np.int64), dtype=pl.Int64))


def _group_frame(
    columns: tuple[str, ...],
    column: dict[str, _Column],
    rows: np.ndarray,
    ts: np.ndarray,
    texts: pl.Series,
    cleaned: list[str],
    string_ints: np.ndarray,
    string_valid: np.ndarray,
    raw_strings: list[str],
    cut: frozenset[int],
) -> pl.DataFrame:
    """The event ``columns`` of the scanned ``rows`` of one group (their times ``ts`` in ns, all
    valid), converted as the reference does."""

    def taken(name: str) -> _Column:
        field = column[name]
        return _Column(field.kinds[rows], field.values[rows], cleaned)

    dur, dur_valid, _ = taken("dur").times()
    dur = np.where(dur_valid & (dur > 0), dur, 0)
    end = ts + dur  # wraps past Int64, which the reference leaves null
    data: dict[str, pl.Series] = {}
    for name in columns:
        if name == "cat":
            data[name] = taken("cat").texts(texts, "")
        elif name == "name":
            data[name] = taken("name").texts(texts, str)
        elif name in _TEXT_FIELDS:
            data[name] = taken(name).texts(texts, None)
        elif name in _JSON_FIELDS:
            data[name] = _json_texts(taken(name), raw_strings, cut)
        elif name == "ts":
            data[name] = series(ts, dtype=pl.Int64)
        elif name == "dur":
            data[name] = series(dur, dtype=pl.Int64)
        elif name == "end":
            data[name] = _with_nulls(series(end, dtype=pl.Int64), end >= ts)
        elif name == "external_id":
            # The reference takes "External id" unless it is None, then "external id"; then ``as_int``.
            ext, legacy_ext = taken("external_id"), taken("external_id_legacy")
            use_legacy = ext.kinds == _NONE
            data[name] = _Column(
                np.where(use_legacy, legacy_ext.kinds, ext.kinds),
                np.where(use_legacy, legacy_ext.values, ext.values),
                cleaned,
            ).ints(string_ints, string_valid)
        else:
            data[name] = taken(_ID_FIELD.get(name, name)).ints(string_ints, string_valid)
    return pl.DataFrame(data)


def block_tables(result: tuple[Any, ...]) -> ChunkTables:
    """One scan result → the loader's tables for its events (what the reference gives for them)."""
    _resume, _state, _done, events, skipped, rows, columns, raw_strings, escaped, counts, cut, _full = result
    strings = _decode_strings(raw_strings, escaped)
    texts = pl.Series(strings, dtype=pl.String)
    lengths = None
    if cut:  # long strings: only their start was handed over, with their full length
        index, chars = zip(*cut, strict=True)
        lengths = texts.str.len_chars().scatter(list(index), pl.Series(chars, dtype=pl.UInt32))
    cleaned_texts = clean_texts(texts, lengths)
    cleaned = strings if cleaned_texts is texts else cleaned_texts.to_list()  # usually nothing to clean
    texts = cleaned_texts
    categories: dict[str, int] = {}
    for _order, index, count in counts:  # in the order each category was first seen
        key = cleaned[index] if index >= 0 else ""
        categories[key] = categories.get(key, 0) + count
    if not rows:  # no complete event, or none of phase X or i: nothing for the tables
        return empty_chunk(events, categories, skipped)
    # The scanner's own memory, not copied: each field's values, then kinds, then the phases; then
    # the instant fields' (over the "i" rows only; none without such rows).
    width, side = len(_ROW_FIELDS), len(_INSTANT_FIELDS)
    values = [np.frombuffer(block, dtype=np.int64) for block in columns[:width]]
    kinds = [np.frombuffer(block, dtype=np.uint8) for block in columns[width : 2 * width]]
    is_x = np.frombuffer(columns[2 * width], dtype=np.uint8) == _PHASE_X
    instants = np.flatnonzero(~is_x)  # the rows of the instant fields' columns, in order
    rest = columns[2 * width + 1 :]
    side_values = [np.frombuffer(block, dtype=np.int64) for block in rest[:side]] or [_NO_INTS] * side
    side_kinds = [np.frombuffer(block, dtype=np.uint8) for block in rest[side:]] or [_NO_KINDS] * side
    # Strings as the loader sees them (cleaned) for names; as written for ids ("stream 7").
    column = {name: _Column(kinds[i], values[i], cleaned) for i, name in enumerate(_ROW_FIELDS)}
    instant_column = {
        name: _Column(side_kinds[i], side_values[i], cleaned) for i, name in enumerate(_INSTANT_FIELDS)
    }
    numbers = [as_int(s) for s in strings]
    string_ints = np.array([0 if n is None else n for n in numbers], dtype=np.int64)
    string_valid = np.array([n is not None for n in numbers], dtype=bool)

    ts, valid_ts, floats = column["ts"].times()
    memory = _memory_frame(column, instant_column, instants, valid_ts, ts, cleaned, string_ints, string_valid)
    x_rows = np.flatnonzero(is_x) if len(instants) else None  # the tables are built from X rows only
    if x_rows is not None:
        ts, valid_ts, floats = ts[x_rows], valid_ts[x_rows], floats[x_rows]
    kept = valid_ts
    float_time = bool((floats & kept).any())
    origin = int(ts[kept].min()) if kept.any() else None
    cat = column["cat"]
    cat_kinds, cat_values = (
        (cat.kinds, cat.values) if x_rows is None else (cat.kinds[x_rows], cat.values[x_rows])
    )
    group_of_string = np.array([GROUP_OF_CATEGORY.get(s, -1) for s in cleaned] or [-1], dtype=np.int64)
    is_str = cat_kinds == _STR
    group = np.where(is_str, group_of_string[np.where(is_str, cat_values, 0)], -1)
    group[~kept] = -1
    # The rows of the tables, group after group, each in file order (a stable sort); each group's
    # frame is built from its own rows and only the columns its tables read, so every frame owns
    # its memory (a table never holds on to another's rows).
    order = np.argsort(group, kind="stable")
    order = order[int(np.searchsorted(group[order], 0)) :]
    sizes = np.bincount(group[order], minlength=len(GROUPS)).tolist()
    full_rows = order if x_rows is None else x_rows[order]
    frames: dict[str, pl.DataFrame] = {}
    first = 0
    for group_index, group_name in enumerate(GROUPS):
        size = sizes[group_index]
        if not size:
            frames[group_name] = NO_EVENTS
            continue
        frames[group_name] = _group_frame(
            _GROUP_COLUMNS[group_name],
            column,
            full_rows[first : first + size],
            ts[order[first : first + size]],
            texts,
            cleaned,
            string_ints,
            string_valid,
            strings,
            frozenset(index for index, _ in cut),
        )
        first += size
    tables, legacy = assemble(frames)
    return ChunkTables(
        tables={**tables, "memory": memory},
        event_count=events,
        categories=categories,
        origin=origin,
        legacy=legacy,
        float_time=float_time,
        dropped_time=int(len(kept) - kept.sum()),
        skipped=skipped,
    )


# --- reading the text around the events, and scanning the events ------------------------------


class _Frame(msgspec.Struct):
    """What surrounds the events array, as read so far, and where the scan stands."""

    path: Path
    compressed: bool
    head: bytes = b""
    tail: bytes = b""
    bare: bool = False
    #: Nesting of the events array: 1 in a bare array, 2 in the top-level object.
    depth: int = 2
    #: Bytes of the file read (progress).
    file_bytes: int = 0
    events: int = 0
    parts: list[ChunkTables] = msgspec.field(default_factory=list)

    def found(self, head: bytes) -> None:
        self.head = head
        self.bare = is_bare(head)
        self.depth = 1 if self.bare else 2

    def invalid(self, exc: Exception, base: int, text: bytes | bytearray | memoryview) -> TraceFormatError:
        """The one line for the scanner's ``Invalid(kind, offset)`` in ``text``, whose first byte
        is at ``base`` in the whole text."""
        kind, offset = exc.args
        where = f"at byte {base + offset:,}" + (" of the uncompressed text" if self.compressed else "")
        path = self.path
        if kind == "depth":
            return TraceFormatError(
                f"cannot read trace {path}: JSON nested deeper than {limits.MAX_DEPTH} levels {where}; "
                "a profiler never writes that, so the file is damaged or not a trace"
            )
        if kind == "string":
            return TraceFormatError(
                f"cannot read trace {path}: a string longer than {format_bytes(limits.MAX_STRING_BYTES)} "
                f"{where}; a profiler never writes that, so the file is damaged or not a trace"
            )
        if kind == "number":
            return TraceFormatError(
                f"cannot read trace {path}: a number of more than {limits.MAX_INT_DIGITS} digits {where}; "
                "a profiler never writes that, so the file is damaged or not a trace"
            )
        return json_error(path, f"{_describe(text, offset)} {where}", truncated=False, at=base + offset)

    def fields_limit(self, where: str) -> TraceFormatError:
        return TraceFormatError(
            f"cannot read trace {self.path}: more than {format_bytes(limits.MAX_FIELDS_BYTES)} of JSON {where} "
            "the events array; a profiler never writes that, so the file is damaged or not a trace"
        )

    def add(self, result: tuple[Any, ...]) -> None:
        """Tables of one scan result, kept in file order."""
        part = block_tables(result)
        self.events += part.event_count
        if self.events > limits.MAX_EVENTS:
            raise limits.too_many_events(self.path)
        self.parts.append(part)

    def document(self) -> TraceDocument:
        """The top-level fields, as the reference reads them; :class:`Unavailable` for a second
        ``traceEvents`` key (the reference reads the last one)."""
        if self.bare:
            if not is_blank(self.tail):
                raise json_error(self.path, "data after the top-level array")
            return TraceDocument(bare_array=True)
        try:
            value = parse_json(self.head + b"]" + self.tail, self.path, object_pairs_hook=_flag_duplicates)
        except TraceFormatError as error:
            error.at = None  # a byte of the fields stitched together, not of the file
            raise
        if not isinstance(value, dict) or _DUPLICATE in value:
            raise Unavailable("a second traceEvents key")
        return document_from_value(value)


def _describe(text: bytes | bytearray | memoryview, offset: int) -> str:
    """What the scanner stopped at, in words (never the trace's bytes themselves)."""
    if offset >= len(text):
        return "unexpected end"
    byte = text[offset]
    if byte >= 0x80:
        return "invalid UTF-8"
    if byte < 0x20:
        return f"control character 0x{byte:02x} inside a string"
    return "unexpected character" if chr(byte).isprintable() else f"unexpected byte 0x{byte:02x}"


_DUPLICATE: Final = object()


def _flag_duplicates(pairs: list[tuple[Any, Any]]) -> dict[Any, Any]:
    value = dict(pairs)
    if sum(key == "traceEvents" for key, _ in pairs) > 1:
        value[_DUPLICATE] = True
    return value


def _events_start(frame: _Frame, text: bytes | bytearray | memoryview, final: bool, base: int) -> int | None:
    """Offset just inside the events array of ``text`` (a trace's start, whitespace stripped),
    None when more text is needed; one-line errors for what is not a trace."""
    assert _scan is not None
    try:
        status, offset = _scan.events_start(text)
    except _scan.Invalid as exc:
        raise frame.invalid(exc, base, text) from None
    if status == 0:
        return int(offset)
    if status == 1:
        if final:
            raise json_error(frame.path, "the text ends before the events array")
        if len(text) > limits.MAX_FIELDS_BYTES:
            raise frame.fields_limit("before")
        return None
    if status == 2:
        check_start(bytes(text[:16]), frame.path)  # raises: not JSON, or JSON but not a container
    if status == 3:
        raise not_a_trace(frame.path, "no traceEvents list")
    raise Unavailable("traceEvents is not an array")


def _result(
    future: Future[Any], frame: _Frame, base: int, text: bytes | bytearray | memoryview
) -> tuple[Any, ...]:
    assert _scan is not None
    try:
        return future.result()  # type: ignore[no-any-return]
    except _scan.Invalid as exc:
        raise frame.invalid(exc, base, text) from None


def _truncated(frame: _Frame) -> TraceFormatError:
    return json_error(frame.path, "the text ends inside the events array")


class _Mismatch(Exception):
    """A cut between events was not one (another layout): scan the file run after run."""


def _mapped(
    mapped: mmap.mmap, frame: _Frame, pool: ThreadPoolExecutor, workers: int, head: HeadStart | None
) -> Iterator[tuple[Any, ...]]:
    """Scan results of an uncompressed file mapped in memory: runs are views of the mapping (no
    copies), and each run's pages are dropped from this process once scanned, so the file never
    counts whole in its memory.

    When each event starts its own line, runs are cut at :func:`line_boundary` and scanned
    ``workers`` at a time; each but the last must end just after a comma (checked in order),
    else the cut was not between events and :class:`_Mismatch` says so. Otherwise each scan
    resumes where the previous one stopped. The scans of a ``head`` start are taken where they
    are the ones due (:meth:`.head_start.HeadStart.take`)."""
    assert _scan is not None
    view = memoryview(mapped)
    size = len(view)
    if is_perfetto(view[:16]):  # before whitespace is skipped: its first byte is a newline
        raise perfetto_trace(frame.path)
    lead = _first_text_byte(view)
    if lead >= size:
        raise empty_trace(frame.path)
    window = 1 << 20
    while (found := _events_start(frame, view[lead : lead + window], lead + window >= size, lead)) is None:
        window *= 4
    start = lead + found
    frame.found(bytes(view[lead:start]))
    boundary = (line_boundary(bytes(view[start : start + 4096])) or None) if workers > 1 else None
    if boundary is None:
        if head is not None:
            head.close()
        yield from _mapped_in_turn(view, mapped, start, frame, pool)
    else:
        yield from _mapped_cut(view, mapped, start, boundary, frame, pool, workers, head)


def _first_text_byte(view: memoryview) -> int:
    """Offset of the first byte that is not JSON whitespace (``len(view)`` if none); a few bytes
    are looked at first (a trace starts with ``{`` or ``[``), then blocks growing to 16 MiB."""
    at, step = 0, 4096
    while at < len(view):
        skipped = leading_whitespace(view[at : at + step])
        if skipped < len(view[at : at + step]):
            return at + skipped
        at, step = at + step, min(step * 4, 16 << 20)
    return len(view)


def _finish_mapped(view: memoryview, end: int, frame: _Frame) -> None:
    if len(view) - end > limits.MAX_FIELDS_BYTES:
        raise frame.fields_limit("after")
    frame.tail = bytes(view[end:])


def _mapped_in_turn(
    view: memoryview, mapped: mmap.mmap, start: int, frame: _Frame, pool: ThreadPoolExecutor
) -> Iterator[tuple[Any, ...]]:
    """One scan after another, each resuming where the previous stopped; the next is started
    before a result is handed on, so tables are built while it runs."""
    assert _scan is not None
    size = len(view)
    width = BLOCK_BYTES * MAPPED_RUNS
    position, state = start, _START

    def submit() -> Future[Any]:
        text = view[position : min(size, position + width)]
        return pool.submit(_scan.scan, text, 0, state, frame.depth, MAX_SCAN_ROWS)

    future = submit()
    while True:
        end = min(size, position + width)
        result = _result(future, frame, position, view[position:end])
        resume, state, done, full = result[0], result[1], result[2], result[11]
        _drop_pages(mapped, position, position + resume)
        frame.file_bytes = position + resume
        if done:
            _finish_mapped(view, position + resume, frame)
            yield result
            return
        if end >= size and not full:
            raise _truncated(frame)
        width = BLOCK_BYTES * MAPPED_RUNS if resume else width * 2  # an event longer than the window
        position += resume
        future = submit()
        yield result


def _mapped_cut(
    view: memoryview,
    mapped: mmap.mmap,
    start: int,
    boundary: bytes,
    frame: _Frame,
    pool: ThreadPoolExecutor,
    workers: int,
    head: HeadStart | None,
) -> Iterator[tuple[Any, ...]]:
    """Runs cut at ``boundary`` (:func:`.scanner.cut_end`), scanned ``workers`` at a time (see
    :func:`_mapped`)."""
    assert _scan is not None
    size = len(view)
    inflight: deque[tuple[Future[Any], int, int]] = deque()

    def finish() -> tuple[Any, ...]:
        future, begin, end = inflight.popleft()
        result = _result(future, frame, begin, view[begin:end])
        resume, state, done, full = result[0], result[1], result[2], result[11]
        if full and not done and begin + resume < end:  # the run goes on where the scan stopped
            _drop_pages(mapped, begin, begin + resume)
            frame.file_bytes = begin = begin + resume
            rest = pool.submit(_scan.scan, view[begin:end], 0, state, frame.depth, MAX_SCAN_ROWS)
            inflight.appendleft((rest, begin, end))
            return result
        _drop_pages(mapped, begin, end)
        frame.file_bytes = end
        if done:  # the rest of the file follows the array
            for other, _, _ in inflight:
                other.cancel()
            inflight.clear()
            _finish_mapped(view, begin + resume, frame)
        elif end >= size:
            raise _truncated(frame)
        elif begin + resume != end or state != _AFTER_COMMA:
            raise _Mismatch
        return result

    position = start
    while position < size:
        end = cut_end(mapped, position, BLOCK_BYTES * MAPPED_RUNS, boundary)
        state = _START if position == start else _AFTER_COMMA
        scan = None if head is None else head.take(position, end, state, frame.depth, MAX_SCAN_ROWS)
        if scan is None:
            scan = pool.submit(_scan.scan, view[position:end], 0, state, frame.depth, MAX_SCAN_ROWS)
        inflight.append((scan, position, end))
        position = end
        while len(inflight) > workers or (inflight and position >= size):
            result = finish()
            yield result
            if result[2]:
                return
    raise _truncated(frame)


class _Stream:
    """The gunzipped text not yet handed to a scan: ``buffer``, whose first byte is at ``offset``
    in the whole text, refilled from ``blocks`` (the read-ahead thread's)."""

    def __init__(self, source: TraceFile, blocks: Iterator[bytes], buffer: bytearray, offset: int) -> None:
        self.source, self.blocks, self.buffer, self.offset = source, blocks, buffer, offset
        self.more = True

    def fill(self, want: int) -> None:
        """Read blocks until the buffer holds ``want`` bytes or the text ends."""
        while self.more and len(self.buffer) < want:
            block = next(self.blocks, None)
            if block is None:
                self.more = False
            else:
                self.buffer.extend(block)

    def next_run(self, boundary: bytes, size: int) -> tuple[bytearray, int, bool] | None:
        """(run, its offset in the text, whether it is the rest of the text): the text up to the
        last ``boundary`` in its first ``size`` bytes, as a mapped file is cut, or all that is left
        when that is shorter; None when nothing is left, or when those bytes hold no boundary (an
        event longer than a run: the buffer is never grown to find one). The run is the buffer
        itself, cut short: no copy."""
        self.fill(size)
        if len(self.buffer) < size and not self.more:
            if not self.buffer:
                return None
            end, final = len(self.buffer), True
        else:
            cut = self.buffer.rfind(boundary, 1, size)
            if cut < 0:
                return None
            end, final = cut + len(boundary) - 1, False  # at the "{"
        run, self.buffer = self.buffer, self.buffer[end:]
        del run[end:]
        base, self.offset = self.offset, self.offset + end
        return run, base, final

    def tail(self, frame: _Frame, scanned: list[bytes | bytearray | memoryview]) -> bytes:
        """The text after the events array: ``scanned`` (the rest of the run that closed it, then
        any text after that run), then the blocks left one at a time, up to the fields' limit.
        Each part is let go of once copied."""
        tail = bytearray()
        self.buffer = bytearray()

        def add(part: bytes | bytearray | memoryview) -> None:
            tail.extend(part)
            if len(tail) > limits.MAX_FIELDS_BYTES:
                raise frame.fields_limit("after")

        while scanned:
            add(scanned.pop(0))
        for block in self.blocks:
            add(block)
        return bytes(tail)


def _streamed(
    source: TraceFile, blocks: Iterator[bytes], frame: _Frame, pool: ThreadPoolExecutor, workers: int
) -> Iterator[tuple[Any, ...]]:
    """Scan results of a gunzipped stream, never held whole: the part not yet scanned is kept in
    a buffer. As for a mapped file, when each event starts its own line the text is cut into runs
    at :func:`line_boundary`, scanned ``workers`` at a time and checked in order (:class:`_Mismatch`
    for a wrong cut); otherwise each scan resumes where the previous one stopped."""
    assert _scan is not None
    head = bytearray()
    offset = 0  # text offset of head[0] (leading whitespace is dropped)
    found: int | None = None
    for block in blocks:
        if not offset and not head and is_perfetto(block[:16]):  # before whitespace is skipped
            raise perfetto_trace(frame.path)
        if not head:
            skipped = leading_whitespace(block)
            offset += skipped
            block = block[skipped:]
        head += block
        if head and (found := _events_start(frame, head, False, offset)) is not None:
            break
    else:
        if not head:
            raise empty_trace(frame.path)
        found = _events_start(frame, head, True, offset)
    assert found is not None
    frame.found(bytes(memoryview(head)[:found]))
    stream = _Stream(source, blocks, bytearray(memoryview(head)[found:]), offset + found)
    del head
    boundary = None
    if workers > 1:
        stream.fill(4096)
        boundary = line_boundary(bytes(stream.buffer[:4096]))
    if boundary is None:
        yield from _streamed_in_turn(stream, frame, pool)
    else:
        yield from _streamed_cut(stream, boundary, frame, pool, workers)


def _streamed_in_turn(
    stream: _Stream, frame: _Frame, pool: ThreadPoolExecutor, state: int = _START
) -> Iterator[tuple[Any, ...]]:
    """One scan after another over the buffer (from ``state``), each resuming where the previous
    stopped; a scan that completes no element is retried on twice as much text."""
    assert _scan is not None
    want = BLOCK_BYTES
    stream.fill(want)
    future = pool.submit(_scan.scan, stream.buffer, 0, state, frame.depth, MAX_SCAN_ROWS)
    while True:
        result = _result(future, frame, stream.offset, stream.buffer)
        resume, state, done, full = result[0], result[1], result[2], result[11]
        frame.file_bytes = stream.source.consumed
        if done:
            frame.tail = stream.tail(frame, [memoryview(stream.buffer)[resume:]])
            yield result
            return
        if not stream.more and not full:
            raise _truncated(frame)
        if resume:
            stream.buffer = bytearray(memoryview(stream.buffer)[resume:])
            stream.offset += resume
            want = BLOCK_BYTES
        else:  # no element completed: an event longer than the buffer
            want = max(want, len(stream.buffer)) * 2
        stream.fill(want)
        future = pool.submit(_scan.scan, stream.buffer, 0, state, frame.depth, MAX_SCAN_ROWS)
        yield result


def _streamed_cut(
    stream: _Stream, boundary: bytes, frame: _Frame, pool: ThreadPoolExecutor, workers: int
) -> Iterator[tuple[Any, ...]]:
    """Runs of the stream cut at ``boundary``, scanned ``workers`` at a time (see :func:`_streamed`),
    until a run's worth of text holds no boundary: from there the scans go in turn, so an event
    longer than a run is read as the scanner's limits allow, never buffered whole to find its end."""
    assert _scan is not None
    inflight: deque[tuple[Future[Any], bytearray, int, bool]] = deque()

    def finish() -> tuple[Any, ...]:
        future, run, base, final = inflight.popleft()
        result = _result(future, frame, base, run)
        resume, state, done, full = result[0], result[1], result[2], result[11]
        frame.file_bytes = stream.source.consumed
        if full and not done and resume < len(run):  # the run goes on where the scan stopped
            rest = pool.submit(_scan.scan, run, resume, state, frame.depth, MAX_SCAN_ROWS)
            inflight.appendleft((rest, run, base, final))
            return result
        if done:  # the rest of the text follows the array
            for other, _, _, _ in inflight:
                other.cancel()
            later = [run for _, run, _, _ in inflight]
            frame.tail = stream.tail(frame, [memoryview(run)[resume:], *later, stream.buffer])
            inflight.clear()
        elif final:
            raise _truncated(frame)
        elif resume != len(run) or state != _AFTER_COMMA:
            raise _Mismatch
        return result

    state = _START
    while (taken := stream.next_run(boundary, BLOCK_BYTES * MAPPED_RUNS)) is not None:
        run, base, final = taken
        inflight.append(
            (pool.submit(_scan.scan, run, 0, state, frame.depth, MAX_SCAN_ROWS), run, base, final)
        )
        state = _AFTER_COMMA
        while len(inflight) > workers or (inflight and final):
            result = finish()
            yield result
            if result[2]:
                return
    while inflight:  # each checked before the text after it is scanned in turn
        result = finish()
        yield result
        if result[2]:
            return
    yield from _streamed_in_turn(stream, frame, pool, state)


def _drop_pages(mapped: mmap.mmap, begin: int, end: int) -> None:
    """Let go of the whole pages of ``[begin, end)`` (they stay in the page cache)."""
    if not hasattr(mapped, "madvise") or not hasattr(mmap, "MADV_DONTNEED"):
        return
    first = begin - begin % mmap.PAGESIZE
    last = end - end % mmap.PAGESIZE
    if last > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, last - first)


@contextlib.contextmanager
def _read_ahead(source: Iterator[bytes], depth: int = 2) -> Iterator[Iterator[bytes]]:
    """``source`` (gunzipped blocks) produced by a thread of its own, up to ``depth`` blocks ahead:
    the inflater (ISA-L's or zlib's) lets go of the GIL, so decompression runs beside the scans."""
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


def load_native(
    source: TraceFile, progress: ProgressCallback | None, head: HeadStart | None = None
) -> tuple[TraceDocument, ChunkTables]:
    """Load an opened trace with the scanner (see the module docstring), taking the scans of a
    ``head`` start where they are the ones due (:mod:`.head_start`); :class:`Unavailable` when
    the file is left to the pure-Python path."""
    if _scan is None:
        raise Unavailable("the native scanner was not built")
    try:
        return _load(source, progress, SCAN_THREADS, head)
    except _Mismatch:
        source.rewind()
        return _load(source, progress, 1, None)


def _adopted(head: HeadStart, source: TraceFile) -> mmap.mmap | None:
    """The head start's mapping when ``source`` is the plain file it mapped (else it is closed)."""
    try:
        fd = -1 if source.compressed else source.stream.fileno()
    except (AttributeError, OSError, ValueError):  # not a file (a mended text): no descriptor
        fd = -1
    if fd < 0:
        head.close()
        return None
    return head.adopt(fd)


def _check_whole(
    path: Path, source: TraceFile, stamp: tuple[int, int] | None, mapped: mmap.mmap | None
) -> None:
    """One line when what was read is not the file as it was: another process cut it short or
    wrote it again meanwhile (its size or time changed), or pages of its mapping could not be read
    (:func:`.scanner.cut_short`: zeros were read instead)."""
    if _stamp(source) != stamp:
        raise TraceFormatError(
            f"cannot read trace {path}: the file changed while it was read (another process cut it "
            "short or wrote it again); read it again once it is written"
        ) from None
    if mapped is not None and cut_short(mapped):
        raise TraceFormatError(
            f"cannot read trace {path}: part of the file could not be read (cut short while it was "
            "read, or a read error of the disk); check the file and read it again"
        ) from None


def _stamp(source: TraceFile) -> tuple[int, int] | None:
    """The open file's size and modification time, None when it has no descriptor."""
    try:
        info = os.fstat(source.stream.fileno())
    except (AttributeError, OSError, ValueError):
        return None
    return info.st_size, info.st_mtime_ns


def _load(
    source: TraceFile, progress: ProgressCallback | None, workers: int, head: HeadStart | None
) -> tuple[TraceDocument, ChunkTables]:
    frame = _Frame(source.path, source.compressed)
    total = source.size
    with contextlib.ExitStack() as stack:
        mapped = None if head is None else _adopted(head, source)
        if mapped is None:
            mapped = source.mapped()
            if mapped is not None and not guard(mapped):  # read, not mapped, where it cannot be guarded
                close_quietly(mapped)
                mapped = None
        stamp = _stamp(source)
        if mapped is not None:  # closed last: after the scans still running have ended
            stack.callback(close_quietly, mapped)
        pool = stack.enter_context(
            ThreadPoolExecutor(max_workers=workers, thread_name_prefix="traceinsight-scan")
        )
        if mapped is not None:
            if head is not None:  # first: what it did not hand over is dropped before the map goes
                stack.callback(head.close)
            results = _mapped(mapped, frame, pool, workers, head)
        else:
            blocks = stack.enter_context(_read_ahead(source.blocks(BLOCK_BYTES)))
            results = _streamed(source, blocks, frame, pool, workers)
        try:
            for result in results:
                frame.add(result)
                if progress is not None:
                    progress(min(frame.file_bytes, total - 1), total, frame.events)
        except (TraceInsightError, _Mismatch):
            # What was read may be zeros (a mapped page past a new end) or a mix of two files.
            _check_whole(frame.path, source, stamp, mapped)
            raise
        _check_whole(frame.path, source, stamp, mapped)
    document = frame.document()
    merged = merge(frame.parts)
    if merged.skipped and not merged.event_count:
        raise not_a_trace(frame.path, "its events are not JSON objects")
    if progress is not None:
        progress(total, total, merged.event_count)
    return document, merged


__all__ = ["AVAILABLE", "FIELDS", "Unavailable", "block_tables", "line_boundary", "load_native"]
