"""The fast path for one buffer: typed decode of the whole document, then column-wise tables.

Used for small files and for layouts the chunk splitter does not recognise (it is also what each
worker does to one chunk). Malformed JSON is a one-line :class:`TraceFormatError`; values of
unexpected types go through the lenient stdlib decoder (:func:`.decode.decode_generic`).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Final

import msgspec

from traceinsight.load.columns import (
    EVENT_LIST,
    PHASED_EVENT,
    PHASED_EVENTS,
    AnyEvent,
    FastEvent,
    from_reference_events,
)
from traceinsight.load.decode import (
    TraceDocument,
    _json_error,
    _not_a_trace,
    decode_generic,
)


class _FastDocument(TraceDocument, gc=False):
    """The reference document with events decoded into the fast path's structs."""

    traceEvents: list[FastEvent] | None = None  # type: ignore[assignment]


_PhasedDocument: Final[type[_FastDocument]] = msgspec.defstruct(  # type: ignore[assignment]
    "_PhasedDocument", [("traceEvents", list[PHASED_EVENT] | None, None)], bases=(_FastDocument,), gc=False
)


_DOCUMENT: Final = msgspec.json.Decoder(_FastDocument)
_PHASED_DOCUMENT: Final = msgspec.json.Decoder(_PhasedDocument)
_META_FIELDS: Final = tuple(
    f for f in _FastDocument.__struct_fields__ if f not in ("traceEvents", "bare_array")
)


def decode_whole(raw: bytes | bytearray | memoryview, path: Path) -> tuple[TraceDocument, list[AnyEvent]]:
    """The document's metadata and its events, decoded in one pass (see the module docstring).

    Events are decoded split by phase (:data:`.columns.PHASED_EVENTS`), else as one struct
    (:data:`.columns.EVENT_LIST`) when some ``ph`` is unexpected, else by the lenient decoder.
    """
    try:
        return _decode_whole(raw, path, phased=True)
    except msgspec.ValidationError:
        pass
    try:
        return _decode_whole(raw, path, phased=False)
    except msgspec.ValidationError:
        return _generic(raw, path)


def _decode_whole(
    raw: bytes | bytearray | memoryview, path: Path, *, phased: bool
) -> tuple[TraceDocument, list[AnyEvent]]:
    start = bytes(raw[:64]).lstrip()[:1]
    try:
        if start == b"[":
            events: list[AnyEvent] = PHASED_EVENTS.decode(raw) if phased else list(EVENT_LIST.decode(raw))
            return TraceDocument(bare_array=True), events
        if start == b"{":
            document: _FastDocument = (_PHASED_DOCUMENT if phased else _DOCUMENT).decode(raw)
            if document.traceEvents is None:
                raise _not_a_trace(path, "no traceEvents list")
            meta = TraceDocument(**{f: getattr(document, f) for f in _META_FIELDS})
            return meta, list(document.traceEvents)
    except msgspec.ValidationError:
        raise
    except msgspec.DecodeError as exc:
        if _python_json_extension_at(raw, str(exc)):
            return _generic(raw, path)  # NaN/Infinity: stdlib json (the reference) reads them
        raise _json_error(path, str(exc).removeprefix("JSON is malformed: ")) from exc
    if start in (b"", b"\x00"):
        raise _json_error(path, "no JSON text")
    return _generic(raw, path)


_AT_BYTE: Final = re.compile(r"\(byte (\d+)\)")


def _python_json_extension_at(raw: bytes | bytearray | memoryview, message: str) -> bool:
    """Whether msgspec stopped at ``NaN``/``Infinity``/``-Infinity``, which Python's json writes."""
    match = _AT_BYTE.search(message)
    if match is None:
        return False
    at = int(match.group(1))
    return bytes(raw[at : at + 9]).startswith((b"NaN", b"Infinity", b"-Infinity"))


def _generic(raw: bytes | bytearray | memoryview, path: Path) -> tuple[TraceDocument, list[AnyEvent]]:
    document, events = decode_generic(bytes(raw), path)
    return document, list(from_reference_events(events))


def decode_document(raw: bytes, path: Path) -> TraceDocument:
    """Only the top-level fields (the events array is empty or skipped)."""
    document, _ = decode_whole(raw, path)
    return document
