"""The pure-Python loader: msgspec decodes the whole text into small structs, polars makes columns.

Used where the C scanner was not built (``TRACEINSIGHT_PURE=1``, no compiler) and for the rare
file the scanner leaves to Python (see :mod:`.native`). The gzip text is streamed into one buffer
under the size limit (:meth:`.source.TraceFile.read_all`); decoding needs the whole text.

Algorithm: events are decoded split by phase (``"ph": "X"`` events into :data:`XEvent` with the
fields of :data:`.schema.EVENT_FIELDS`, ``"ph": "i"`` ones into :data:`IEvent` for the ``memory``
table, others reduced to their category), with the collector
paused (:func:`traceinsight.process.collector_paused`: the structs are ``gc=False``; nothing
decoded can form a cycle). Columns are made with one
C-level pass per field (``map(attrgetter(...))``); a column whose values all have the usual type
becomes a polars Series directly and is converted with polars expressions, any other goes through
the reference's per-value coercion (:mod:`.coerce`). A file whose values the typed decode cannot
hold (a list where a number belongs, an event that is not an object, NaN, a lone surrogate) is
read by the reference's own decoder and table builder (:mod:`.reference`): the same tables, slower.
It takes the reference's decisions on every file: text that is not UTF-8 is refused wherever it
is (msgspec would skip it unchecked in a field the tables do not read), and a name of any number
of digits becomes its digits.
"""

from __future__ import annotations

import codecs
import re
import string
from collections import Counter
from collections.abc import Callable, Sequence
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import Any, Final, Union, cast

import msgspec
import polars as pl

from traceinsight.load import limits, reference, schema
from traceinsight.load.coerce import (
    INT64_NS_LIMIT,
    Scalar,
    as_int,
    as_ns,
    end_ns,
    float_column_to_ns,
    json_text_of,
)
from traceinsight.load.decode import UTF8_BOM, TraceDocument, check_start, json_error, parse_json
from traceinsight.load.source import TraceFile
from traceinsight.load.tables import (
    GROUP_OF_CATEGORY,
    GROUPS,
    ChunkTables,
    assemble,
    clean_categories,
    empty_chunk,
    group_columns,
)
from traceinsight.load.text import clean_texts
from traceinsight.process import collector_paused

# --- the structs, made from the one field list -------------------------------------------------


_NO_RAW: Final = msgspec.Raw()


def _fields(in_args: bool, memory: bool = False) -> list[tuple[str, Any, Any]]:
    return [
        # a ``json`` field keeps its value's raw text (msgspec's ``Raw``; empty when missing)
        (f.name, msgspec.Raw, msgspec.field(default=_NO_RAW, name=f.key))
        if f.kind == "json"
        else (f.name, Scalar, msgspec.field(default=None, name=f.key))
        for f in schema.EVENT_FIELDS
        if f.in_args is in_args and (memory or not f.memory)
    ]


#: The ``args`` fields the tables read (frozen: one empty instance stands for every missing one).
Args: Final[Any] = msgspec.defstruct("Args", _fields(True), gc=False, frozen=True)
_NO_ARGS: Final = Args()
_EVENT_FIELDS: Final = [*_fields(False), ("args", Args, _NO_ARGS)]
#: The ``args`` of an event of any phase: an X event's and a ``[memory]`` record's.
AllArgs: Final[Any] = msgspec.defstruct("AllArgs", _fields(True, memory=True), gc=False, frozen=True)
_NO_ALL_ARGS: Final = AllArgs()
#: The ``args`` of a ``[memory]`` record.
MemoryArgs: Final[Any] = msgspec.defstruct(
    "MemoryArgs", [f for f in _fields(True, memory=True) if f not in _fields(True)], gc=False, frozen=True
)
_NO_MEMORY_ARGS: Final = MemoryArgs()

#: One event of any phase (the decode used when some ``ph`` is not a one-letter string).
Event: Final[Any] = msgspec.defstruct(
    "Event", [("ph", Scalar, None), *_fields(False), ("args", AllArgs, _NO_ALL_ARGS)], gc=False
)
#: A ``"ph": "X"`` event of the phase-tagged decode.
XEvent: Final[Any] = msgspec.defstruct("XEvent", _EVENT_FIELDS, gc=False, tag_field="ph", tag="X")
#: A ``"ph": "i"`` event of the phase-tagged decode (a ``[memory]`` record when its name says so).
IEvent: Final[Any] = msgspec.defstruct(
    "IEvent",
    [
        ("cat", Scalar, None),
        ("name", Scalar, None),
        ("ts", Scalar, None),
        ("args", MemoryArgs, _NO_MEMORY_ARGS),
    ],
    gc=False,
    tag_field="ph",
    tag=schema.MEMORY_PHASE,
)


class OtherEvent(msgspec.Struct, gc=False, tag_field="ph"):
    """An event of any other phase: only ``cat`` (its category is counted; the tables skip it)."""

    cat: Scalar = None


#: Phases decoded as :class:`OtherEvent` (one subclass per tag): flows, instants, metadata, counters…
_OTHER_KINDS: Final = tuple(
    msgspec.defstruct(f"Phase_{ord(c)}", [], bases=(OtherEvent,), tag=c)
    for c in string.ascii_letters + "()"
    if c not in ("X", schema.MEMORY_PHASE)
)
_PHASED: Final[Any] = Union.__getitem__((XEvent, IEvent, *_OTHER_KINDS))

_PhasedDocument: Final[Any] = msgspec.defstruct(
    "PhasedDocument",
    [("traceEvents", list.__class_getitem__(_PHASED) | None, None)],
    bases=(TraceDocument,),
    gc=False,
)
_Document: Final[Any] = msgspec.defstruct(
    "Document",
    [("traceEvents", list.__class_getitem__(Event) | None, None)],
    bases=(TraceDocument,),
    gc=False,
)
#: (bare array, split by phase) → decoder.
_DECODERS: Final = {
    (False, True): msgspec.json.Decoder(_PhasedDocument),
    (False, False): msgspec.json.Decoder(_Document),
    (True, True): msgspec.json.Decoder(list.__class_getitem__(_PHASED)),
    (True, False): msgspec.json.Decoder(list.__class_getitem__(Event)),
}
_META_FIELDS: Final = tuple(f for f in TraceDocument.__struct_fields__ if f != "bare_array")
#: What msgspec does not read as Python's json does: lone surrogates, NaN and infinities.
_SURROGATE_ESCAPE: Final = re.compile(rb"\\u[dD][89a-fA-F]")
_AT_BYTE: Final = re.compile(r"\(byte (\d+)\)")


def load_fallback(source: TraceFile) -> tuple[TraceDocument, ChunkTables]:
    """The document and tables of an opened trace (see the module docstring). The text is let go
    of as soon as it is decoded, before the tables are made."""
    raw = source.read_all()
    check_start(raw, source.path)
    check_utf8(raw, source.path)
    with collector_paused():
        decoded = _decode(raw, source.path)
        if decoded is None:  # values the typed decode cannot hold: the reference's way
            value = parse_json(raw, source.path)
            del raw
            document, events = reference.document_and_events(value, source.path)
            return document, reference.build_tables(events)
        del raw
        document, phased = decoded
        return document, event_tables(phased)


def _decode(raw: bytes | bytearray, path: Path) -> tuple[TraceDocument, list[Any]] | None:
    """Typed decode, split by phase, else as one struct; None when only the reference can read it."""
    if _SURROGATE_ESCAPE.search(raw):
        return None
    text = memoryview(raw)[len(UTF8_BOM) :] if raw.startswith(UTF8_BOM) else raw
    bare = bytes(text[:64]).lstrip()[:1] == b"["
    for phased in (True, False):
        try:
            value = _DECODERS[(bare, phased)].decode(text)
        except msgspec.ValidationError:
            continue
        except msgspec.DecodeError as exc:
            if _nonfinite_at(text, str(exc)):
                return None  # NaN/Infinity: Python's json (the reference) reads them
            at = _AT_BYTE.search(str(exc))
            where = None if at is None else int(at.group(1)) + len(raw) - len(text)
            raise json_error(path, str(exc).removeprefix("JSON is malformed: "), at=where) from None
        except UnicodeDecodeError as exc:
            raise json_error(path, f"invalid UTF-8 at byte {exc.start}", truncated=False) from None
        except RecursionError:
            raise json_error(path, "nested too deeply", truncated=False) from None
        if bare:
            return TraceDocument(bare_array=True), _checked(value, path)
        if value.traceEvents is None:
            return None  # missing or null: the reference words it
        document = TraceDocument(**{f: getattr(value, f) for f in _META_FIELDS})
        return document, _checked(value.traceEvents, path)
    return None


def check_utf8(raw: bytes | bytearray, path: Path) -> None:
    """Refuse text that is not UTF-8 anywhere, as the scanner and the reference do: msgspec checks
    only the strings it keeps, and would read invalid bytes in a field it skips. ASCII text is
    known valid at once; other text is decoded a block at a time, nothing kept."""
    if raw.isascii():
        return
    decoder = codecs.getincrementaldecoder("utf-8")()
    view = memoryview(raw)
    step = 16 << 20
    for at in range(0, len(view), step):
        # The decoder holds the start of a character cut by the last block: an error's position
        # counts those bytes too (a character across a block's end moved the offset by them).
        held = len(decoder.getstate()[0])
        try:
            decoder.decode(view[at : at + step], final=at + step >= len(view))
        except UnicodeDecodeError as exc:
            raise json_error(
                path, f"invalid UTF-8 at byte {at - held + exc.start}", truncated=False
            ) from None


def _checked(events: list[Any], path: Path) -> list[Any]:
    if len(events) > limits.MAX_EVENTS:
        raise limits.too_many_events(path)
    return events


def _nonfinite_at(raw: bytes | bytearray | memoryview, message: str) -> bool:
    """Whether msgspec stopped at ``NaN``/``Infinity``/``-Infinity``, which Python's json writes."""
    match = _AT_BYTE.search(message)
    if match is None:
        return False
    at = int(match.group(1))
    return bytes(raw[at : at + 9]).startswith((b"NaN", b"Infinity", b"-Infinity"))


# --- columns ----------------------------------------------------------------------------------


def _ids(values: list[Scalar]) -> pl.Series:
    """:func:`.coerce.as_int` over a column (nulls kept).

    polars' strict Int64 construction accepts exactly ints within Int64, integral floats and None
    (what ``as_int`` keeps as they are) and raises on anything else, which then goes value by value.
    """
    try:
        return pl.Series(values, dtype=pl.Int64, strict=True)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        return pl.Series([as_int(v) for v in values], dtype=pl.Int64, strict=False)


def _times(values: list[Scalar]) -> tuple[pl.Series, bool]:
    """:func:`.coerce.as_ns` over a column: (Int64 ns, null where not a time; whether any value was
    a float)."""
    kinds = set(map(type, values))
    if kinds <= {int}:
        try:
            series = pl.Series(values, dtype=pl.Int64)
            low, high = cast("int | None", series.min()) or 0, cast("int | None", series.max()) or 0
            if low >= -INT64_NS_LIMIT and high <= INT64_NS_LIMIT:
                return series * 1000, False
        except (TypeError, OverflowError):
            pass
    elif kinds == {float}:
        floats = pl.Series(values, dtype=pl.Float64)
        if floats.is_finite().all() and (floats.abs().max() or 0.0) < INT64_NS_LIMIT:  # type: ignore[operator]
            return float_column_to_ns(floats), True
    return pl.Series([as_ns(v) for v in values], dtype=pl.Int64, strict=False), float in kinds


def _texts(values: list[Scalar], convert: Callable[[Scalar], str | None], nulls: bool = False) -> pl.Series:
    """A text column: strings as they are; other values through ``convert`` (the reference's rule).

    ``nulls`` says whether None stays null (``call_stack``) or must go through ``convert`` too.
    """
    try:
        series = pl.Series(values, dtype=pl.String, strict=True)
        if nulls or not series.null_count():
            return series
    except (TypeError, ValueError, OverflowError, pl.exceptions.PolarsError):  # a 71-digit name too
        pass
    return pl.Series([v if type(v) is str else convert(v) for v in values], dtype=pl.String)


def _json_texts(values: list[Any]) -> pl.Series:
    """A ``json`` column from msgspec's raw values: :func:`.coerce.json_text_of` once per distinct
    text (shapes repeat step after step)."""
    known: dict[bytes, str | None] = {}
    texts: list[str | None] = []
    for value in values:
        if value is None:
            texts.append(None)
            continue
        raw = bytes(value)
        if not raw:
            texts.append(None)
            continue
        if raw not in known:
            known[raw] = json_text_of(raw) if raw[:1] in (b"[", b"{") else None
        texts.append(known[raw])
    return pl.Series(texts, dtype=pl.String)


def _name(value: Scalar) -> str:
    return value if isinstance(value, str) else str(value)


def _stack(value: Scalar) -> str | None:
    return value if isinstance(value, str) else None


def _category(value: Scalar) -> str:
    return value if isinstance(value, str) else ""


def _external(primary: list[Scalar], legacy: list[Scalar]) -> pl.Series:
    """``External id``, else the 2021 ``external id``: as the reference picks, then ``as_int``."""
    return _ids([a if a is not None else b for a, b in zip(primary, legacy, strict=True)])


def _pick(items: list[Any], indices: list[int]) -> list[Any]:
    if not indices:
        return []
    if len(indices) == 1:
        return [items[indices[0]]]
    return list(itemgetter(*indices)(items))


def _group_frame(
    group: str, xs: list[Any], indices: pl.Series, ts_all: pl.Series, cats: pl.Series
) -> pl.DataFrame:
    """The :func:`.tables.group_columns` of ``group`` for its events (``xs`` at ``indices``)."""
    members = _pick(xs, indices.to_list())
    args = list(map(attrgetter("args"), members))

    def field(name: str) -> list[Scalar]:
        return list(map(attrgetter(name), members))

    def arg(name: str) -> list[Scalar]:
        return list(map(attrgetter(name), args))

    ts = ts_all.gather(indices)
    dur, _ = _times(field("dur"))
    dur = dur.fill_null(0).clip(lower_bound=0)
    build: dict[str, Callable[[], pl.Series]] = {
        "cat": lambda: cats.gather(indices),
        "name": lambda: clean_texts(_texts(field("name"), _name)),
        "ts": lambda: ts,
        "dur": lambda: dur,
        "end": lambda: end_ns(ts, dur),
        "pid": lambda: _ids(field("pid")),
        "tid": lambda: _ids(field("tid")),
        "external_id": lambda: _external(arg("external_id"), arg("external_id_legacy")),
        "correlation": lambda: _ids(arg("correlation")),
        "device": lambda: _ids(arg("device")),
        "stream": lambda: _ids(arg("stream")),
        "bytes": lambda: _ids(arg("bytes")),
        "python_id": lambda: _ids(arg("python_id")),
        "parent_id": lambda: _ids(arg("python_parent_id")),
        "call_site": lambda: _ids(arg("call_site")),
        "call_stack": lambda: clean_texts(_texts(arg("call_stack"), _stack, nulls=True)),
        "seq": lambda: _ids(arg("seq")),
        "process_group": lambda: clean_texts(_texts(arg("process_group"), _stack, nulls=True)),
        "flops": lambda: _ids(arg("flops")),
        "sequence_number": lambda: _ids(arg("sequence_number")),
        "fwd_thread_id": lambda: _ids(arg("fwd_thread_id")),
        "input_dims": lambda: _json_texts(arg("input_dims")),
        "input_types": lambda: _json_texts(arg("input_types")),
        "concrete_inputs": lambda: _json_texts(arg("concrete_inputs")),
    }
    columns = group_columns(group)
    return pl.DataFrame(
        {name: build[name]() for name in columns}, schema={n: schema.EVENT_COLUMNS[n] for n in columns}
    )


def memory_frame(instants: Sequence[Any]) -> pl.DataFrame:
    """Decoded instant events → the ``memory`` table: the ``[memory]`` records with a time."""
    names = clean_texts(_texts(list(map(attrgetter("name"), instants)), lambda _: None, nulls=True))
    members = _pick(list(instants), (names == schema.MEMORY_EVENT_NAME).fill_null(False).arg_true().to_list())
    ts, _ = _times(list(map(attrgetter("ts"), members)))
    args = list(map(attrgetter("args"), members))
    columns = {
        column: ts if column == "ts" else _ids(list(map(attrgetter(field), args)))
        for column, field in schema.MEMORY_COLUMNS.items()
    }
    return pl.DataFrame(columns, schema=schema.MEMORY_EVENTS).filter(pl.col("ts").is_not_null())


def event_tables(events: Sequence[Any]) -> ChunkTables:
    """Decoded events → the loader's tables (same rows, order and values as the reference's).

    Only ``ph == "X"`` events with a time are kept; categories route them to tables.
    """
    counts: Counter[Scalar] = Counter(map(attrgetter("cat"), events))
    raw_categories: dict[str, int] = {}
    for value, count in counts.items():
        key = _category(value)
        raw_categories[key] = raw_categories.get(key, 0) + count
    categories = clean_categories(raw_categories.items())
    if events and type(events[0]) is Event:  # the one-struct decode: every phase in one type
        xs = [e for e in events if e.ph == "X"]
        instants = [e for e in events if e.ph == schema.MEMORY_PHASE]
    else:
        xs = [e for e in events if type(e) is XEvent]
        instants = [e for e in events if type(e) is IEvent]
    memory = memory_frame(instants)
    ts_values = list(map(attrgetter("ts"), xs))
    ts_all, float_time = _times(ts_values)
    kept = ts_all.is_not_null()
    dropped = len(xs) - int(kept.sum())
    if float_time and dropped:  # as the reference: some event that is kept has a float time
        float_time = any(type(v) is float and k for v, k in zip(ts_values, kept.to_list(), strict=True))
    cats = _texts(list(map(attrgetter("cat"), xs)), _category)
    route = cats.replace_strict(GROUP_OF_CATEGORY, default=-1, return_dtype=pl.Int64)
    if not kept.any():
        chunk = empty_chunk(len(events), categories)
        chunk.dropped_time = dropped
        chunk.tables = {**chunk.tables, "memory": memory}
        return chunk
    frames = {
        group: _group_frame(group, xs, (kept & (route == index)).arg_true(), ts_all, cats)
        for index, group in enumerate(GROUPS)
    }
    tables, legacy = assemble(frames)
    return ChunkTables(
        tables={**tables, "memory": memory},
        event_count=len(events),
        categories=categories,
        origin=cast("int", ts_all.min()),
        legacy=legacy,
        float_time=float_time,
        dropped_time=dropped,
    )
