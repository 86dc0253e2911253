"""The trace document around the events, and the words for a file that is not a trace.

:class:`TraceDocument` holds the top-level fields every loader reads besides the events.
:func:`parse_json` is the reference reading of JSON text (strict UTF-8, stdlib ``json``), used
by the reference loader and, for the fields around the events array, by the native one;
:func:`document_from_value` turns the parsed top level into a :class:`TraceDocument`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import msgspec

from traceinsight.errors import TraceFormatError
from traceinsight.load.coerce import Scalar
from traceinsight.load.limits import MAX_INT_DIGITS
from traceinsight.load.text import without_lone_surrogates


class DeviceProperties(msgspec.Struct, gc=False):
    """An entry of ``deviceProperties``."""

    id: Scalar = None
    name: Scalar = None
    totalGlobalMem: Scalar = None
    computeMajor: Scalar = None
    computeMinor: Scalar = None
    numSms: Scalar = None
    warpSize: Scalar = None


class DistributedInfo(msgspec.Struct, gc=False):
    """``distributedInfo``: missing on single-process runs."""

    rank: Scalar = None
    world_size: Scalar = None
    backend: Scalar = None


class RunRecord(msgspec.Struct, gc=False):
    """``traceinsight``: how ``traceinsight run`` recorded the trace (absent from other traces)."""

    stacks: Scalar = None
    stepMarks: Scalar = None
    unprofiledStepNs: Scalar = None
    unprofiledSteps: Scalar = None
    #: Each unrecorded step before the window, in order (any JSON value: checked when read).
    unprofiledStepsNs: Any = None
    loaderFetch: Scalar = None
    cutShort: Scalar = None
    #: Each recorded step as the process lived it, ``[wall_ns, cpu_ns, cpu_wait_ns, load_1m]``
    #: (any JSON value: checked when read).
    stepUsage: Any = None


class TraceDocument(msgspec.Struct, gc=False):
    """The top-level object of a trace (traces before Dec 2020 are a bare event array)."""

    deviceProperties: list[DeviceProperties] | None = None
    distributedInfo: DistributedInfo | None = None
    baseTimeNanoseconds: Scalar = None
    schemaVersion: Scalar = None
    traceName: Scalar = None
    cuda_runtime_version: Scalar = None
    cuda_driver_version: Scalar = None
    hip_runtime_version: Scalar = None
    with_stack: Scalar = None
    traceinsight: RunRecord | None = None
    #: Set by the decoder (never read from the file): the top level was a bare event array.
    bare_array: bool = msgspec.field(default=False, name="traceinsight:bare_array")


UTF8_BOM = b"\xef\xbb\xbf"
#: Bytes a JSON text may start with (after whitespace).
_JSON_START = frozenset(b'{["-0123456789tfnNI')


def json_error(path: Path, detail: str, *, truncated: bool = True, at: int | None = None) -> TraceFormatError:
    """The one line for a file that is not valid JSON (``truncated``: it may have been cut short;
    ``at``: the byte of the text where the parser stopped, when it said)."""
    hint = (
        "a truncated file usually means the export was interrupted"
        if truncated
        else "the file is damaged or is not a trace written by the profiler"
    )
    return TraceFormatError(f"cannot read trace {path}: not valid JSON ({detail}); {hint}", at=at)


def not_a_trace(path: Path, what: str) -> TraceFormatError:
    """The one line for valid JSON that is not a trace."""
    return TraceFormatError(
        f"cannot read trace {path}: it is JSON but not a torch.profiler trace ({what}); "
        "pass the file written by export_chrome_trace or tensorboard_trace_handler"
    )


def not_json_text(path: Path, first: int) -> TraceFormatError:
    """The one line for a file whose first byte cannot start JSON (an image, an archive …)."""
    return TraceFormatError(
        f"cannot read trace {path}: not a JSON text (it starts with byte 0x{first:02x}, "
        "so it is some other kind of file); pass the .json or .json.gz file the profiler wrote"
    )


#: The first byte of a Perfetto protobuf trace: the tag of ``Trace.packet`` (field 1, length-delimited).
PERFETTO_TAG = 0x0A


def is_perfetto(head: bytes | bytearray | memoryview) -> bool:
    """Whether a text's first bytes (as read, nothing stripped) are a Perfetto protobuf trace.

    Kineto can write Perfetto's native format instead of JSON (a ``.pftrace``, off by default): a
    protobuf ``Trace``, a run of ``packet`` fields that each start with the byte 0x0a and a varint
    length. That byte is also a newline, which JSON may start with; but after it JSON has only
    whitespace and then ``{`` or ``[`` (a trace), where a packet has its first field's tag. Three
    bytes tell them apart once the newline's run of whitespace-like varint bytes ends."""
    start = bytes(head[:16])
    if len(start) < 2 or start[0] != PERFETTO_TAG:
        return False
    rest = start[1:].lstrip(b" \t\r\n")
    return bool(rest) and rest[0] not in b"{["


def perfetto_trace(path: Path) -> TraceFormatError:
    """The one line for a Perfetto protobuf trace: what it is and how to get JSON instead."""
    return TraceFormatError(
        f"cannot read trace {path}: it is a Perfetto protobuf trace (.pftrace), not the JSON trace "
        "traceinsight reads; write JSON instead: leave Kineto's Perfetto trace output off and export "
        "with prof.export_chrome_trace('trace.json') or tensorboard_trace_handler"
    )


def check_start(text: bytes | bytearray | memoryview, path: Path) -> None:
    """Refuse a text whose first byte (after a byte order mark and whitespace) cannot start JSON;
    one that starts a JSON value other than an object or array is not a trace. A Perfetto protobuf
    trace (:func:`is_perfetto`) gets its own line."""
    if is_perfetto(text):
        raise perfetto_trace(path)
    head = bytes(text[:4096]).removeprefix(UTF8_BOM).lstrip(b" \t\r\n")
    if not head:
        return
    if head[0] not in _JSON_START:
        raise not_json_text(path, head[0])
    if head[0] not in b"{[":
        try:
            value, _ = json.JSONDecoder().raw_decode(head.decode("utf-8", "replace"))
        except ValueError:
            raise json_error(path, "it does not start with a JSON value", truncated=False) from None
        raise not_a_trace(path, f"the top level is {json_kind(value)}, not an object")


def json_kind(value: Any) -> str:
    """``a number``, ``a string`` …: a parsed JSON value's kind, in words."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return "a string"
    return "null" if value is None else f"a {type(value).__name__}"


def parse_json(raw: bytes | bytearray, path: Path, **options: Any) -> Any:
    """Python's ``json`` on strict UTF-8 text (a leading byte order mark is allowed); every failure
    is one :class:`TraceFormatError` line. ``options`` go to :func:`json.loads`."""
    check_start(raw, path)
    try:
        text = bytes(raw).removeprefix(UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise json_error(path, f"invalid UTF-8 at byte {exc.start}", truncated=False) from None
    try:
        return json.loads(text, **options)
    except json.JSONDecodeError as exc:
        step = 1 << 24  # bytes before the error, counted a slice at a time (not a copy of the text)
        at = sum(len(text[start : min(start + step, exc.pos)].encode()) for start in range(0, exc.pos, step))
        at += len(UTF8_BOM) if raw.startswith(UTF8_BOM) else 0
        raise json_error(path, str(exc), at=at) from None
    except RecursionError:
        raise json_error(path, "nested too deeply for Python's json", truncated=False) from None
    except ValueError as exc:  # an integer of more than 4300 digits
        detail = f"{exc}".split(";")[0] or f"an integer of more than {MAX_INT_DIGITS} digits"
        raise json_error(path, detail, truncated=False) from None


def scalar(value: Any) -> Scalar:
    """Keep JSON scalars; anything else (lists, objects) becomes None; booleans are 0/1; strings
    lose lone surrogates (see :func:`.text.without_lone_surrogates`)."""
    if isinstance(value, str):
        return without_lone_surrogates(value)
    if isinstance(value, bool):
        return int(value)
    return value if isinstance(value, int | float) else None


def _run_value(run: dict[str, Any], key: str) -> Any:
    """One field of the run record: a scalar, or for ``unprofiledStepsNs`` a list of scalars (at
    most 64: ``run`` writes 8), for ``stepUsage`` the value as it is (checked where read)."""
    value = run.get(key)
    if key == "unprofiledStepsNs" and isinstance(value, list):
        return [scalar(item) for item in value[:64]]
    if key == "stepUsage":  # checked where read (:func:`.tables.trace_for`), by both loaders alike
        return value
    return scalar(value)


def document_from_value(value: dict[str, Any]) -> TraceDocument:
    """The :class:`TraceDocument` of a parsed top-level object."""
    devices = value.get("deviceProperties")
    dist = value.get("distributedInfo")
    run = value.get("traceinsight")
    return TraceDocument(
        deviceProperties=[
            DeviceProperties(**{k: scalar(d.get(k)) for k in DeviceProperties.__struct_fields__})
            for d in devices
            if isinstance(d, dict)
        ]
        if isinstance(devices, list)
        else None,
        distributedInfo=DistributedInfo(
            rank=scalar(dist.get("rank")),
            world_size=scalar(dist.get("world_size")),
            backend=scalar(dist.get("backend")),
        )
        if isinstance(dist, dict)
        else None,
        baseTimeNanoseconds=scalar(value.get("baseTimeNanoseconds")),
        schemaVersion=scalar(value.get("schemaVersion")),
        traceName=scalar(value.get("traceName")),
        cuda_runtime_version=scalar(value.get("cuda_runtime_version")),
        cuda_driver_version=scalar(value.get("cuda_driver_version")),
        hip_runtime_version=scalar(value.get("hip_runtime_version")),
        with_stack=scalar(value.get("with_stack")),
        traceinsight=RunRecord(**{k: _run_value(run, k) for k in RunRecord.__struct_fields__})
        if isinstance(run, dict)
        else None,
    )
