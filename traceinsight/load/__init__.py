"""Loading a trace file into typed polars tables (:class:`Trace`)."""

from __future__ import annotations

from pathlib import Path

from traceinsight.load.decode import decode_generic, decode_typed, read_bytes
from traceinsight.load.tables import Device, Trace, TraceMeta, build_trace

__all__ = ["Device", "Trace", "TraceMeta", "load_trace", "load_trace_reference"]


def load_trace(path: Path) -> Trace:
    """Read a ``.json`` or ``.json.gz`` trace (object or bare array) into tables.

    Raises a :class:`~traceinsight.errors.TraceInsightError` subclass with a one-line message for
    any file that cannot be read or is not a trace.
    """
    raw = read_bytes(path)
    document, events = decode_typed(raw, path)
    del raw
    return build_trace(path, document, events)


def load_trace_reference(path: Path) -> Trace:
    """The plain path (stdlib json, lenient coercion): what :func:`load_trace` must equal."""
    raw = read_bytes(path)
    document, events = decode_generic(raw, path)
    return build_trace(path, document, events)
