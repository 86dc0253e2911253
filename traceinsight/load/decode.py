"""From bytes to events, the plain way: read (plain or gzip), then stdlib ``json``.

:func:`read_bytes` owns the one-line errors for files that cannot be read (missing, a folder,
truncated or corrupt gzip, empty). :func:`decode_generic` is the reference decoder: stdlib ``json``
into dicts, each value coerced leniently into an :class:`Event`. It accepts any value types and is
what the fast path (:mod:`.whole`, :mod:`.parallel`, :mod:`.columns`) must equal; it is also the
fallback when the fast decoder rejects a file's types.
"""

from __future__ import annotations

import gzip
import json
import zlib
from pathlib import Path
from typing import Any

import msgspec

from traceinsight.errors import TraceFormatError, TraceNotFound, TraceUnreadable

Scalar = int | float | str | None


class Args(msgspec.Struct, gc=False, frozen=True):
    """The ``args`` fields analyses read; every other key is skipped while decoding."""

    external_id: Scalar = msgspec.field(default=None, name="External id")
    external_id_legacy: Scalar = msgspec.field(default=None, name="external id")
    correlation: Scalar = None
    device: Scalar = None
    stream: Scalar = None
    bytes: Scalar = None
    python_id: Scalar = msgspec.field(default=None, name="Python id")
    python_parent_id: Scalar = msgspec.field(default=None, name="Python parent id")
    call_stack: Scalar = msgspec.field(default=None, name="Call stack")


class Event(msgspec.Struct, gc=False):
    """One trace event, reduced to what the loader needs."""

    ph: Scalar = None
    cat: Scalar = None
    name: Scalar = None
    pid: Scalar = None
    tid: Scalar = None
    ts: Scalar = None
    dur: Scalar = None
    args: Args | None = None


class DeviceProperties(msgspec.Struct, gc=False):
    """An entry of ``deviceProperties``."""

    id: Scalar = None
    name: Scalar = None
    totalGlobalMem: Scalar = None
    computeMajor: Scalar = None
    computeMinor: Scalar = None
    numSms: Scalar = None


class DistributedInfo(msgspec.Struct, gc=False):
    """``distributedInfo``: missing on single-process runs."""

    rank: Scalar = None
    world_size: Scalar = None
    backend: Scalar = None


class TraceDocument(msgspec.Struct, gc=False):
    """The top-level object of a trace (traces before Dec 2020 are a bare event array)."""

    traceEvents: list[Event] | None = None
    deviceProperties: list[DeviceProperties] | None = None
    distributedInfo: DistributedInfo | None = None
    baseTimeNanoseconds: Scalar = None
    schemaVersion: Scalar = None
    traceName: Scalar = None
    cuda_runtime_version: Scalar = None
    cuda_driver_version: Scalar = None
    hip_runtime_version: Scalar = None
    with_stack: Scalar = None
    #: Set by the decoder (never read from the file): the top level was a bare event array.
    bare_array: bool = msgspec.field(default=False, name="traceinsight:bare_array")


def read_bytes(path: Path) -> bytes:
    """The trace's uncompressed bytes; gzip is recognised by its magic number, not the name."""
    if not path.exists():
        raise TraceNotFound(f"cannot read trace {path}: no such file; check the path")
    if not path.is_file():
        raise TraceNotFound(f"cannot read trace {path}: it is a directory, not a trace file")
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise TraceUnreadable(f"cannot read trace {path}: {exc.strerror or exc}") from exc
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except EOFError as exc:
            raise TraceUnreadable(
                f"cannot read trace {path}: the gzip stream ends early; "
                "was the file copied completely and the profiler stopped cleanly?"
            ) from exc
        except (OSError, zlib.error) as exc:
            raise TraceUnreadable(f"cannot read trace {path}: corrupt gzip data ({exc})") from exc
    if not raw.strip():
        raise TraceFormatError(
            f"cannot read trace {path}: the file is empty; was the profiler stopped before it exported?"
        )
    return raw


def _json_error(path: Path, detail: str) -> TraceFormatError:
    return TraceFormatError(
        f"cannot read trace {path}: not valid JSON ({detail}); "
        "a truncated file usually means the export was interrupted"
    )


def _not_a_trace(path: Path, what: str) -> TraceFormatError:
    return TraceFormatError(
        f"cannot read trace {path}: it is JSON but not a torch.profiler trace ({what}); "
        "pass the file written by export_chrome_trace or tensorboard_trace_handler"
    )


def decode_generic(raw: bytes, path: Path) -> tuple[TraceDocument, list[Event]]:
    """The plain path: stdlib ``json``, then coerce each value leniently."""
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _json_error(path, str(exc)) from exc
    if isinstance(value, list):
        return TraceDocument(bare_array=True), [
            _event_from_dict(item) for item in value if isinstance(item, dict)
        ]
    if not isinstance(value, dict):
        raise _not_a_trace(path, f"the top level is a {type(value).__name__}")
    events = value.get("traceEvents")
    if not isinstance(events, list):
        raise _not_a_trace(path, "no traceEvents list")
    devices = value.get("deviceProperties")
    dist = value.get("distributedInfo")
    document = TraceDocument(
        deviceProperties=[
            DeviceProperties(**{k: _scalar(d.get(k)) for k in DeviceProperties.__struct_fields__})
            for d in devices
            if isinstance(d, dict)
        ]
        if isinstance(devices, list)
        else None,
        distributedInfo=DistributedInfo(
            rank=_scalar(dist.get("rank")),
            world_size=_scalar(dist.get("world_size")),
            backend=_scalar(dist.get("backend")),
        )
        if isinstance(dist, dict)
        else None,
        baseTimeNanoseconds=_scalar(value.get("baseTimeNanoseconds")),
        schemaVersion=_scalar(value.get("schemaVersion")),
        traceName=_scalar(value.get("traceName")),
        cuda_runtime_version=_scalar(value.get("cuda_runtime_version")),
        cuda_driver_version=_scalar(value.get("cuda_driver_version")),
        hip_runtime_version=_scalar(value.get("hip_runtime_version")),
        with_stack=_scalar(value.get("with_stack")),
    )
    return document, [_event_from_dict(item) for item in events if isinstance(item, dict)]


def _scalar(value: Any) -> Scalar:
    """Keep JSON scalars; anything else (lists, objects, booleans) becomes None."""
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, int | float | str) else None


_ARG_KEYS = {
    field: name for field, name in zip(Args.__struct_fields__, Args.__struct_encode_fields__, strict=True)
}


def _event_from_dict(item: dict[str, Any]) -> Event:
    args = item.get("args")
    return Event(
        ph=_scalar(item.get("ph")),
        cat=_scalar(item.get("cat")),
        name=_scalar(item.get("name")),
        pid=_scalar(item.get("pid")),
        tid=_scalar(item.get("tid")),
        ts=_scalar(item.get("ts")),
        dur=_scalar(item.get("dur")),
        args=Args(**{field: _scalar(args.get(key)) for field, key in _ARG_KEYS.items()})
        if isinstance(args, dict)
        else None,
    )
