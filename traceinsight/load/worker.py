"""A decode worker process: ``python -m traceinsight.load.worker``.

Reads framed chunks from stdin (16-byte header: chunk index and length, little-endian u64, then the
comma-separated events without the enclosing brackets), decodes each into tables with
:func:`traceinsight.load.columns.chunk_tables` and writes the result back framed the same way
(:func:`traceinsight.load.columns.to_wire`; an empty payload means the chunk is not valid JSON).
A fresh interpreter rather than a fork: polars' thread pool does not survive ``fork``.
"""

from __future__ import annotations

import gc
import json
import sys
from typing import BinaryIO

import msgspec

from traceinsight.load.columns import (
    EVENT_LIST,
    HEADER,
    PHASED_EVENTS,
    AnyEvent,
    chunk_tables,
    from_reference_events,
    to_wire,
)
from traceinsight.load.decode import _event_from_dict


def _read_into(stream: BinaryIO, view: memoryview) -> bool:
    """Fill ``view`` from ``stream``; False at end of stream."""
    filled = 0
    while filled < len(view):
        count = stream.readinto(view[filled:])  # type: ignore[attr-defined]
        if not count:
            return False
        filled += count
    return True


def decode_chunk(buffer: bytearray) -> list[AnyEvent]:
    """``[events]`` → events: split by phase, else as one struct when some ``ph`` is unexpected, else
    through the lenient stdlib decoder when types differ."""
    try:
        return PHASED_EVENTS.decode(buffer)
    except msgspec.ValidationError:
        pass
    try:
        return list(EVENT_LIST.decode(buffer))
    except msgspec.ValidationError:
        items = json.loads(buffer)
        return list(
            from_reference_events([_event_from_dict(item) for item in items if isinstance(item, dict)])
        )


def main() -> None:
    """Serve chunks until stdin closes."""
    gc.disable()  # decoded structs are gc=False; nothing here forms cycles
    source, sink = sys.stdin.buffer, sys.stdout.buffer
    header = bytearray(HEADER.size)
    while _read_into(source, memoryview(header)):
        index, length = HEADER.unpack(header)
        buffer = bytearray(length + 2)
        buffer[0], buffer[-1] = ord("["), ord("]")
        if not _read_into(source, memoryview(buffer)[1 : length + 1]):
            return
        try:
            events = decode_chunk(buffer)
        except (msgspec.DecodeError, ValueError):
            payload = b""
        else:
            del buffer
            part = chunk_tables(events)
            del events
            # The event count rides at the end so the parent can show progress without decoding.
            payload = to_wire(part) + part.event_count.to_bytes(8, "little")
        sink.write(HEADER.pack(index, len(payload)))
        sink.write(payload)
        sink.flush()


if __name__ == "__main__":
    main()
