"""Decoded events → typed polars tables, column by column (the fast path's table builder).

:func:`chunk_tables` gives exactly what :func:`traceinsight.load.tables.build_trace` gives for the
same events, without a Python loop per event and field. Algorithm: one C-level pass per field
(``map(attrgetter(...))``) turns the events into value lists; a list whose values all have the
common type (ints and nulls for ids, floats or ints for times, strings for names) becomes a polars
Series directly and is converted with polars expressions (``µs × 1000``, rounded half to even like
Python's ``round``); any other list goes through the reference's own per-value coercion
(``_int``/``_ns``), so unusual traces give the same tables, only slower. Events are routed to
tables by category with boolean masks, which keeps file order within each table.
"""

from __future__ import annotations

import string
import struct
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from typing import Any, ClassVar, Final, Union, cast

import msgspec
import polars as pl

from traceinsight.load import schema, taxonomy
from traceinsight.load.decode import Args, Event, Scalar
from traceinsight.load.tables import _int, _ns

#: The ``args`` fields analyses read: the reference path's struct (frozen, so one empty instance
#: can stand for every missing ``args``).
FastArgs = Args

_NO_ARGS: Final[FastArgs] = FastArgs()


class FastEvent(Event, gc=False):
    """The reference's :class:`Event`, but a missing ``args`` is one shared empty :class:`FastArgs`
    (no None checks)."""

    args: FastArgs = _NO_ARGS


class XEvent(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    """A complete (``"ph": "X"``) event of the phase-tagged decode: the fields of :class:`FastEvent`."""

    ph: ClassVar[str] = "X"
    cat: Scalar = None
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    ts: Scalar = None
    dur: Scalar = None
    args: FastArgs = _NO_ARGS


class OtherEvent(msgspec.Struct, gc=False, tag_field="ph"):
    """An event of any other phase: only ``cat`` (its category is counted; the tables skip it)."""

    ph: ClassVar[str] = ""
    cat: Scalar = None


#: Phases decoded as :class:`OtherEvent` (one subclass per tag): flows, instants, metadata, counters…
_OTHER_PHASES: Final = tuple(c for c in string.ascii_letters + "()" if c != "X")
_OTHER_KINDS: Final[tuple[type[msgspec.Struct], ...]] = tuple(
    msgspec.defstruct(f"Phase_{ord(c)}", [], bases=(OtherEvent,), tag=c, namespace={"ph": c})
    for c in _OTHER_PHASES
)
#: The type of one event in the phase-tagged decode (a tagged union: :class:`XEvent` or a phase).
PHASED_EVENT: Final[Any] = Union.__getitem__((XEvent, *_OTHER_KINDS))

#: Any event the decoders give.
AnyEvent = FastEvent | XEvent | OtherEvent

#: The fast decode: events split by phase, non-X events reduced to their category. An unexpected
#: ``ph`` (missing, not a string, not a known phase) raises ValidationError: decode with
#: :data:`EVENT_LIST` then.
PHASED_EVENTS: Final[msgspec.json.Decoder[list[AnyEvent]]] = msgspec.json.Decoder(list[PHASED_EVENT])
EVENT_LIST: Final = msgspec.json.Decoder(list[FastEvent])

#: Frames between the loader and its workers: chunk index and payload length, little-endian u64.
HEADER: Final = struct.Struct("<QQ")


def from_reference_events(events: Sequence[Event]) -> list[FastEvent]:
    """Reference :class:`Event` objects (from the lenient stdlib decoder) as :class:`FastEvent`."""
    fields = FastArgs.__struct_fields__
    return [
        FastEvent(
            ph=e.ph,
            cat=e.cat,
            name=e.name,
            pid=e.pid,
            tid=e.tid,
            ts=e.ts,
            dur=e.dur,
            args=_NO_ARGS if e.args is None else FastArgs(*(getattr(e.args, f) for f in fields)),
        )
        for e in events
    ]


@dataclass(slots=True)
class ChunkTables:
    """The tables of a run of consecutive events, plus what :class:`TraceMeta` needs from them."""

    tables: dict[str, pl.DataFrame]
    event_count: int
    #: Events per category in first-seen order (non-string categories count as "").
    categories: dict[str, int] = field(default_factory=dict)
    origin: int | None = None
    legacy: bool = False
    float_time: bool = False


_INT64_NS_LIMIT: Final = (2**63 - 1) // 1000


def _ids(values: list[Scalar]) -> pl.Series:
    """``_int`` over a column: ids as Int64 (nulls kept).

    polars' strict Int64 construction accepts exactly ints, integral floats and None (what
    ``_int`` keeps as they are) and raises on anything else, which then goes value by value.
    """
    try:
        return pl.Series(values, dtype=pl.Int64, strict=True)
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        return pl.Series([v if type(v) is int else _int(v) for v in values], dtype=pl.Int64, strict=False)


def _times(values: list[Scalar]) -> tuple[pl.Series, bool]:
    """``_ns`` over a column: (Int64 ns with nulls for non-numbers, whether any value was a float)."""
    kinds = set(map(type, values))
    if kinds <= {int}:
        try:
            series = pl.Series(values, dtype=pl.Int64)
            low, high = cast("int | None", series.min()) or 0, cast("int | None", series.max()) or 0
            if low >= -_INT64_NS_LIMIT and high <= _INT64_NS_LIMIT:
                return series * 1000, False
        except (TypeError, OverflowError):
            pass
    elif kinds == {float}:
        floats = pl.Series(values, dtype=pl.Float64)
        if floats.is_finite().all() and (floats.abs().max() or 0.0) < _INT64_NS_LIMIT:  # type: ignore[operator]
            return _float_column_to_ns(floats), True
    return pl.Series([_ns(v) for v in values], dtype=pl.Int64, strict=False), float in kinds


#: Below this many µs a float's product by 1000 is within ``1e-12`` relative of its decimal text's.
_ARITHMETIC_US_LIMIT: Final = 1e9


def end_ns(ts: pl.Series, dur: pl.Series) -> pl.Series:
    """``ts + dur`` (``dur >= 0``), null where the sum leaves Int64 (the reference's big int)."""
    end = ts + dur
    return end.set(end < ts, None)


def _float_column_to_ns(floats: pl.Series) -> pl.Series:
    """:func:`_float_us_to_ns` by arithmetic where that provably gives the same ns, text elsewhere.

    The text path rounds (half away from zero) the shortest decimal ``d`` of ``x`` times 1000. For
    ``|x| < 1e9``, ``x·1000`` in floats is within ``|x|·2.3e-13`` of ``d·1000`` (half an ulp of
    ``x``, scaled, plus the product's rounding), so both round to the same integer unless ``x·1000``
    lies within ``|x|·1e-12`` of a half-integer: those values, and larger ones, take the text path.
    """
    if (floats.abs().min() or 0.0) >= _ARITHMETIC_US_LIMIT:  # type: ignore[operator]
        return _float_us_to_ns(floats)  # epoch-sized times
    scaled = floats * 1000.0
    near_half = ((scaled - scaled.floor() - 0.5).abs() <= floats.abs() * 1e-12 + 1e-9) | (
        floats.abs() >= _ARITHMETIC_US_LIMIT
    )
    exact = near_half.sum()
    if exact == floats.len():
        return _float_us_to_ns(floats)
    result = scaled.round(0).cast(pl.Int64)
    if exact:
        indices = near_half.arg_true()
        result = result.scatter(indices, _float_us_to_ns(floats.gather(indices)))
    return result


def _float_us_to_ns(floats: pl.Series) -> pl.Series:
    """``tables._float_us_to_ns`` for a column: ns from the float's shortest decimal text.

    polars formats a float with the same shortest round-trip digits as Python's ``repr``, in plain
    notation from 1e-5 to 1e16 (:func:`_float_column_to_ns` only sends values from 0.0005 on; the
    caller leaves 1e16 on to the per-value path). The text's whole part is the float truncated
    (below 2**53 no shortest text rounds into the next integer); the ns are whole × 1000 + the
    first three fraction digits, plus one when the fourth is 5 or more, signed like the value.
    """
    fraction = floats.cast(pl.String).str.split_exact(".", 1).struct.field("field_1")
    first_four = fraction.fill_null("").str.pad_end(4, "0").str.slice(0, 4).cast(pl.Int64)
    sign = (floats < 0).cast(pl.Int64) * -2 + 1
    return floats.cast(pl.Int64) * 1000 + sign * ((first_four + 5) // 10)


def _texts(values: list[Scalar], convert: Callable[[Scalar], str | None], nulls: bool) -> pl.Series:
    """A text column: strings as they are; other values through ``convert`` (the reference's rule).

    ``nulls`` says whether None stays null (``call_stack``) or must go through ``convert`` too.
    """
    try:
        series = pl.Series(values, dtype=pl.String, strict=True)
        if nulls or not series.null_count():
            return series
    except (TypeError, ValueError, pl.exceptions.PolarsError):
        pass
    return pl.Series([v if type(v) is str else convert(v) for v in values], dtype=pl.String)


def _name(value: Scalar) -> str:
    return value if isinstance(value, str) else str(value)


def _stack(value: Scalar) -> str | None:
    return value if isinstance(value, str) else None


def _category_counts(events: Sequence[AnyEvent]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for cat, count in Counter(map(attrgetter("cat"), events)).items():
        key = cat if isinstance(cat, str) else ""
        counts[key] = counts.get(key, 0) + count
    return counts


def _external(ext: list[Scalar], legacy_of: Callable[[], list[Scalar]]) -> pl.Series:
    """``External id``, else the 2021 ``external id`` (``legacy_of()``, only read when some event
    lacks the first): as the reference picks, then ``_int``."""
    try:
        primary = pl.Series(ext, dtype=pl.Int64, strict=True)
        if primary.null_count() == 0:
            return primary
        return primary.fill_null(pl.Series(legacy_of(), dtype=pl.Int64, strict=True))
    except (TypeError, OverflowError, ValueError, pl.exceptions.PolarsError):
        return pl.Series(
            [_int(a if a is not None else b) for a, b in zip(ext, legacy_of(), strict=True)],
            dtype=pl.Int64,
            strict=False,
        )


#: ``cat`` → the group of tables its events go to ("ops" splits into cpu_ops and annotations by name).
_GROUP_OF_CATEGORY: Final[dict[str, str]] = {
    **{cat: "gpu" for cat in taxonomy.GPU_ACTIVITY_CATEGORIES},
    **{cat: "runtime" for cat in taxonomy.RUNTIME_CATEGORIES},
    **{cat: "ops" for cat in taxonomy.CPU_OP_CATEGORIES | taxonomy.ANNOTATION_CATEGORIES},
    **{cat: "python" for cat in taxonomy.PYTHON_CATEGORIES},
    **{cat: "gpu_annotations" for cat in taxonomy.GPU_ANNOTATION_CATEGORIES},
    **{cat: "cuda_sync" for cat in taxonomy.CUDA_SYNC_CATEGORIES},
}

#: Per group: the event fields and ``args`` fields its tables read.
_GROUP_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "gpu": ("pid", "tid", "external_id", "correlation", "device", "stream", "bytes"),
    "runtime": ("pid", "tid", "external_id", "correlation"),
    "ops": ("pid", "tid", "external_id", "call_stack"),
    "python": ("pid", "tid", "python_id", "python_parent_id"),
    "gpu_annotations": ("pid", "tid"),
    "cuda_sync": ("pid", "external_id", "correlation", "device", "stream"),
}


def _pick(items: list[FastEvent | XEvent], indices: list[int]) -> list[FastEvent | XEvent]:
    if not indices:
        return []
    if len(indices) == 1:
        return [items[indices[0]]]
    return list(itemgetter(*indices)(items))


def _group_frame(group: str, events: list[FastEvent | XEvent], ts: pl.Series, cat: pl.Series) -> pl.DataFrame:
    """The columns one group of tables needs, for its events only."""
    args: list[FastArgs] = list(map(attrgetter("args"), events))

    def arg(name: str) -> list[Scalar]:
        return list(map(attrgetter(name), args))

    dur, _ = _times(list(map(attrgetter("dur"), events)))
    dur = dur.fill_null(0).clip(lower_bound=0)
    columns: dict[str, pl.Series] = {
        "cat": cat,
        "name": _texts(list(map(attrgetter("name"), events)), _name, nulls=False),
        "ts": ts,
        "dur": dur,
        "end": end_ns(ts, dur),
    }
    for name in _GROUP_FIELDS[group]:
        if name in ("pid", "tid"):
            columns[name] = _ids(list(map(attrgetter(name), events)))
        elif name == "external_id":
            columns[name] = _external(arg("external_id"), lambda: arg("external_id_legacy"))
        elif name == "call_stack":
            columns[name] = _texts(arg("call_stack"), _stack, nulls=True)
        elif name == "python_parent_id":
            columns["parent_id"] = _ids(arg(name))
        else:
            columns[name] = _ids(arg(name))
    return pl.DataFrame(columns)


def _select(frame: pl.DataFrame, table_schema: pl.Schema, **columns: pl.Expr) -> pl.DataFrame:
    if columns:
        frame = frame.with_columns(**columns)
    return frame.select([pl.col(n).cast(t) for n, t in table_schema.items()])


def chunk_tables(events: Sequence[AnyEvent]) -> ChunkTables:
    """Sort ``events`` into the loader's tables (same rows, order and values as ``build_trace``).

    Only ``ph == "X"`` events with a numeric ``ts`` are kept; categories route them to groups with
    one polars ``replace`` and index lists, and each group's columns are built from its events only.
    """
    categories = _category_counts(events)
    xs: list[FastEvent | XEvent]
    if events and type(events[0]) is FastEvent:  # the fallback decode: one struct for every phase
        xs = [e for e in events if e.ph == "X"]  # type: ignore[misc]
    else:
        xs = [e for e in events if type(e) is XEvent]
    ts_values = list(map(attrgetter("ts"), xs))
    ts_all, float_time = _times(ts_values)
    cats = _texts(list(map(attrgetter("cat"), xs)), lambda v: v if isinstance(v, str) else "", nulls=False)
    route = cats.replace_strict(_GROUP_OF_CATEGORY, default=None, return_dtype=pl.String)
    kept = ts_all.is_not_null()
    origin = ts_all.min()
    if float_time:  # as the reference: some event that is kept has a float time
        if set(map(type, ts_values)) == {float}:
            float_time = bool(kept.any())
        else:
            float_time = any(type(v) is float and k for v, k in zip(ts_values, kept.to_list(), strict=True))
    frames: dict[str, pl.DataFrame] = {}
    for group in _GROUP_FIELDS:
        indices = ((route == group) & kept).arg_true()
        members = _pick(xs, indices.to_list())
        frames[group] = _group_frame(group, members, ts_all.gather(indices), cats.gather(indices))
    tables, legacy = assemble(frames)
    return ChunkTables(
        tables=tables,
        event_count=len(events),
        categories=categories,
        origin=origin,  # type: ignore[arg-type]
        legacy=legacy,
        float_time=float_time,
    )


def assemble(frames: dict[str, pl.DataFrame]) -> tuple[dict[str, pl.DataFrame], bool]:
    """Group frames (``cat``, ``name``, times and the group's id columns; extra columns are ignored)
    → the loader's tables, and whether GPU categories are the 2021 capitalised ones."""
    gpu_kinds = taxonomy.GPU_ACTIVITY_CATEGORIES
    cat, name = pl.col("cat"), pl.col("name")
    legacy_annotation = cat.is_in(list(taxonomy.CPU_OP_CATEGORIES)) & pl.any_horizontal(
        [name.str.starts_with(prefix) for prefix in taxonomy.LEGACY_ANNOTATION_PREFIXES]
    )
    ops = frames["ops"].with_columns(
        annotation=legacy_annotation | cat.is_in(list(taxonomy.ANNOTATION_CATEGORIES))
    )
    gpu = frames["gpu"]
    tables = {
        "gpu": _select(
            gpu,
            schema.GPU_ACTIVITY,
            kind=cat.replace_strict(gpu_kinds, default=None, return_dtype=pl.String),
            device=pl.coalesce("device", "pid"),
            stream=pl.coalesce("stream", "tid"),
        ),
        "runtime": _select(frames["runtime"], schema.RUNTIME_CALLS),
        "cpu_ops": _select(ops.filter(~pl.col("annotation")), schema.CPU_OPS),
        "python": _select(frames["python"], schema.PYTHON_FRAMES),
        "annotations": _select(ops.filter(pl.col("annotation")), schema.ANNOTATIONS),
        "gpu_annotations": _select(
            frames["gpu_annotations"], schema.GPU_ANNOTATIONS, device=pl.col("pid"), stream=pl.col("tid")
        ),
        "cuda_sync": _select(frames["cuda_sync"], schema.CUDA_SYNC, device=pl.coalesce("device", "pid")),
    }
    legacy = bool(gpu.height and gpu.get_column("cat").str.slice(0, 1).is_in(["K", "M"]).any())
    return tables, legacy


def merge(parts: Sequence[ChunkTables]) -> ChunkTables:
    """Chunks in file order → one :class:`ChunkTables` (tables concatenated, counts summed)."""
    categories: dict[str, int] = {}
    for part in parts:
        for key, count in part.categories.items():
            categories[key] = categories.get(key, 0) + count
    origins = [p.origin for p in parts if p.origin is not None]
    tables: dict[str, pl.DataFrame] = {}
    for name, table_schema in schema.TABLES.items():
        frames = [p.tables[name] for p in parts if p.tables[name].height]
        tables[name] = pl.concat(frames, how="vertical") if frames else pl.DataFrame(schema=table_schema)
    return ChunkTables(
        tables=tables,
        event_count=sum(p.event_count for p in parts),
        categories=categories,
        origin=min(origins) if origins else None,
        legacy=any(p.legacy for p in parts),
        float_time=any(p.float_time for p in parts),
    )


def to_wire(part: ChunkTables) -> bytes:
    """A chunk's result as bytes for the trip from a worker process (Arrow IPC inside msgpack)."""
    tables = {}
    for name, frame in part.tables.items():
        sink = __import__("io").BytesIO()
        frame.write_ipc(sink, compression="uncompressed")
        tables[name] = sink.getvalue()
    payload: dict[str, Any] = {
        "tables": tables,
        "event_count": part.event_count,
        "categories": list(part.categories.items()),
        "origin": part.origin,
        "legacy": part.legacy,
        "float_time": part.float_time,
    }
    return msgspec.msgpack.encode(payload)


def from_wire(data: bytes) -> ChunkTables:
    """Inverse of :func:`to_wire`."""
    import io

    payload = msgspec.msgpack.decode(data)
    return ChunkTables(
        tables={name: pl.read_ipc(io.BytesIO(blob)) for name, blob in payload["tables"].items()},
        event_count=payload["event_count"],
        categories=dict(payload["categories"]),
        origin=payload["origin"],
        legacy=payload["legacy"],
        float_time=payload["float_time"],
    )
