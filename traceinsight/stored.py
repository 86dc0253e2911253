"""A stored result (``analyze --json``) read back for ``diff``: input as untrusted as a trace.

A baseline result comes from a teammate, a CI artifact, a bug report. It is read as a trace is:

- **the file**: a regular file (a FIFO, a device, a socket refused before it is opened, by
  :func:`~traceinsight.load.source.open_trace`), at most :data:`MAX_RESULT_BYTES` (or
  ``--max-size``) read, never more;
- **the parse**: strict JSON (no ``NaN``/``Infinity``), integers of at most
  :data:`MAX_INTEGER_DIGITS` digits, finite numbers only (``1e400`` refused), nesting at most
  :data:`MAX_RESULT_DEPTH` deep;
- **the fields** ``diff`` and the gate read (:func:`validated`): each of the type and range the
  contract gives it, rule ids and cause keys in their id alphabet, severities among the known
  ones, strings cleaned as trace strings are (:func:`~traceinsight.load.text.clean_text`). What
  comes back holds only those fields, so nothing else of the file reaches a renderer.

Anything else is one line and exit 2 (:class:`~traceinsight.errors.TraceFormatError`) naming the
file and the field. A file is taken for a stored result when its first bytes say so (an object
whose ``tool`` is ``traceinsight``); anything else is left to the trace loader.

Issue 32 folds this into the result types' ``from_json``; until then this is the one reader.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final, NoReturn

from traceinsight.errors import TraceFormatError
from traceinsight.load.source import SizeLimit, TraceTooLarge, format_bytes, open_trace
from traceinsight.load.taxonomy import LineKind
from traceinsight.load.text import clean_text
from traceinsight.rules.findings import SEVERITIES

__all__ = [
    "MAX_INTEGER_DIGITS",
    "MAX_RESULT_BYTES",
    "MAX_RESULT_DEPTH",
    "read_stored_result",
    "validated",
]

#: A stored result larger than this is refused (unless ``--max-size`` says more): the largest
#: result of the sample traces is 0.55 MB, and every list in a result is bounded.
MAX_RESULT_BYTES: Final = 16 << 20
#: Nesting deeper than this is refused (a result is 5 levels deep).
MAX_RESULT_DEPTH: Final = 32
#: Integers with more digits are refused (``trace.base_time_ns``, the longest, has 19).
MAX_INTEGER_DIGITS: Final = 20
#: A number's text longer than this is refused (``repr`` of a float is at most 24 characters).
_MAX_NUMBER_CHARS: Final = 40
#: Times in a result are µs: more than this (31 years) is not a time.
_MAX_US: Final = 1e15
#: Rule ids and idle-cause keys: lowercase words joined by ``-`` or ``_``.
_ID: Final = re.compile(r"[a-z][a-z0-9_-]{0,63}")
_HEAD: Final = re.compile(rb'\A(?:\xef\xbb\xbf)?\s*\{[^\0]*?"tool"\s*:\s*\{\s*"name"\s*:\s*"traceinsight"')
_INT64: Final = 1 << 63


class _Refused(Exception):
    """A number the parse does not take (its words)."""


def read_stored_result(path: Path, limit: SizeLimit | None = None) -> dict[str, Any] | None:
    """The validated result in ``path`` when it is one (see the module doc), else None (a trace).

    ``limit.max_bytes`` (``--max-size``) replaces :data:`MAX_RESULT_BYTES` when given.
    """
    given = limit if limit is not None else SizeLimit()
    most = given.max_bytes if given.max_bytes is not None else MAX_RESULT_BYTES
    with open_trace(path, SizeLimit(given.max_bytes)) as source:
        if source.compressed:
            return None
        head = source.stream.read(4096)
        if _HEAD.match(head) is None:
            return None
        if source.size > most:
            raise _too_large(path, most)
        data = head + source.stream.read(most + 1 - len(head))
    if len(data) > most:  # grew while read
        raise _too_large(path, most)
    return validated(parse_result(data, path), path)


def _too_large(path: Path, most: int) -> TraceTooLarge:
    return TraceTooLarge(
        f"cannot compare {path}: the stored result is larger than {format_bytes(most)}, which no result "
        "of traceinsight analyze --json is; pass --max-size to read it anyway"
    )


def _refuse_constant(name: str) -> NoReturn:
    raise _Refused(f"{name} is not a number JSON allows")


def _integer(text: str) -> int:
    if len(text.lstrip("-")) > MAX_INTEGER_DIGITS:
        raise _Refused(f"an integer of {len(text.lstrip('-')):,} digits (at most {MAX_INTEGER_DIGITS})")
    return int(text)


def _float(text: str) -> float:
    if len(text) > _MAX_NUMBER_CHARS:
        raise _Refused(f"a number written with {len(text):,} characters")
    value = float(text)
    if not math.isfinite(value):
        raise _Refused(f"the number {text} is out of range")
    return value


def parse_result(data: bytes, path: Path) -> Any:
    """``data`` parsed as strict JSON under the module's limits; one line for anything else."""

    def refused(words: str) -> TraceFormatError:
        return TraceFormatError(
            f"cannot compare {path}: {words}; is it a result of traceinsight analyze --json?"
        )

    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise refused("it is not UTF-8 text") from None
    try:
        value = json.loads(text, parse_constant=_refuse_constant, parse_int=_integer, parse_float=_float)
    except _Refused as error:
        raise refused(str(error)) from None
    except json.JSONDecodeError as error:
        raise refused(f"not valid JSON ({error.msg} at line {error.lineno}, column {error.colno})") from None
    except RecursionError:
        raise refused(f"JSON nested deeper than {MAX_RESULT_DEPTH} levels") from None
    if _depth(value) > MAX_RESULT_DEPTH:
        raise refused(f"JSON nested deeper than {MAX_RESULT_DEPTH} levels")
    return value


def _depth(value: Any) -> int:
    """How deep ``value`` nests (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[Any, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_RESULT_DEPTH:
            stack.extend((child, level + 1) for child in children)
    return deepest


def _kind(value: Any) -> str:
    """What ``value`` is, in words that never quote a string from the file."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, (int, float)):
        return f"the number {value!r}"[:60]
    if isinstance(value, str):
        return "a string"
    return "a list" if isinstance(value, list) else "an object"


class _Reader:
    """Typed reads of the fields of one stored result; each failure is one line naming the field."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def fail(self, where: str, value: Any, wanted: str) -> NoReturn:
        raise TraceFormatError(
            f"cannot compare {self.path}: {where} is {_kind(value)}, not {wanted}; "
            "is it a complete result of traceinsight analyze --json?"
        )

    def object(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, value, "an object")
        return value

    def optional_object(self, value: Any, where: str) -> dict[str, Any]:
        return {} if value is None else self.object(value, where)

    def items(self, value: Any, where: str) -> list[dict[str, Any]]:
        if value is None:
            return []
        if not isinstance(value, list):
            self.fail(where, value, "a list")
        return [self.object(item, f"{where}[{index}]") for index, item in enumerate(value)]

    def integer(self, value: Any, where: str, *, low: int = -_INT64, nullable: bool = False) -> int | None:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not low <= value < _INT64:
            self.fail(where, value, "an integer" + (f" of at least {low}" if low > -_INT64 else ""))
        return value

    def count(self, value: Any, where: str) -> int:
        number = self.integer(value, where, low=0)
        assert number is not None
        return number

    def number(self, value: Any, where: str, *, high: float = _MAX_US, nullable: bool = True) -> float | None:
        if value is None and nullable:
            return None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= high:
            self.fail(where, value, f"a number from 0 to {high:g}")
        return float(value)

    def share(self, value: Any, where: str) -> float | None:
        return self.number(value, where, high=1.0)

    def text(self, value: Any, where: str, *, nullable: bool = True) -> str | None:
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            self.fail(where, value, "a string")
        return clean_text(value)

    def identifier(self, value: Any, where: str, check: Callable[[str], bool] | None = None) -> str:
        if not isinstance(value, str) or _ID.fullmatch(value) is None or (check and not check(value)):
            self.fail(where, value, "an id (lowercase letters, digits, - and _)")
        return value

    def flag(self, value: Any, where: str, default: bool) -> bool:
        if value is None:
            return default
        if not isinstance(value, bool):
            self.fail(where, value, "true or false")
        return value


def validated(document: Any, path: Path) -> dict[str, Any]:
    """The fields ``diff`` and the gate read, checked and cleaned (see the module doc)."""
    read = _Reader(path)
    top = read.object(document, "the result")
    tool = read.object(top.get("tool"), "tool")
    if tool.get("name") != "traceinsight":
        read.fail("tool.name", tool.get("name"), '"traceinsight"')
    if tool.get("kind") == "diff":
        raise TraceFormatError(
            f"cannot compare {path}: it is the output of traceinsight diff; give a trace or a result of "
            "traceinsight analyze --json"
        )
    if top.get("kind") == "job":
        raise TraceFormatError(
            f"cannot compare {path}: it is a job's result (several ranks); diff compares one trace's "
            "results: give a rank's trace or its result of traceinsight analyze --json"
        )
    schema = top.get("schema")
    if isinstance(schema, int) and not isinstance(schema, bool) and 0 <= schema < 2:
        raise TraceFormatError(
            f"cannot compare {path}: it is a result of schema {schema}, written before traceinsight "
            "measured steps and savings; analyze its trace again"
        )
    trace = read.object(top.get("trace"), "trace")
    run = top.get("run")
    steady = read.object(top.get("steady_state"), "steady_state")
    use = read.object(top.get("utilization"), "utilization")
    causes = read.optional_object(use.get("idle_by_cause_us"), "utilization.idle_by_cause_us")
    overlap = read.optional_object(top.get("overlap"), "overlap")
    return {
        "schema": read.integer(schema, "schema", low=2),
        "tool": {"name": "traceinsight"},
        "trace": {
            "cuda_runtime_version": read.text(
                trace.get("cuda_runtime_version"), "trace.cuda_runtime_version"
            ),
            "world_size": read.integer(trace.get("world_size"), "trace.world_size", low=0, nullable=True),
        },
        "run": None
        if run is None
        else {"torch_version": read.text(read.object(run, "run").get("torch_version"), "run.torch_version")},
        "steady_state": {
            "steady_steps": read.count(steady.get("steady_steps", 0), "steady_state.steady_steps"),
            "step_time_us": read.number(steady.get("step_time_us"), "steady_state.step_time_us"),
        },
        "utilization": {
            "of": read.text(use.get("of"), "utilization.of"),
            "window_us": read.number(use.get("window_us"), "utilization.window_us"),
            **{
                key: read.share(use.get(key), f"utilization.{key}")
                for key in ("busy_share", "compute_share", "communication_share", "copy_share", "idle_share")
            },
            "idle_by_cause_us": {
                read.identifier(cause, "a key of utilization.idle_by_cause_us"): read.number(
                    value, f"utilization.idle_by_cause_us.{cause}", nullable=False
                )
                for cause, value in causes.items()
            },
        },
        "overlap": {
            direction: read.share(overlap.get(direction), f"overlap.{direction}")
            for direction in ("HtoD", "DtoH")
        },
        "sync_hotspots": [
            {"steady_count": read.count(spot.get("steady_count", 0), f"sync_hotspots[{index}].steady_count")}
            for index, spot in enumerate(read.items(top.get("sync_hotspots"), "sync_hotspots"))
        ],
        "findings": [
            _finding(read, finding, f"findings[{index}]")
            for index, finding in enumerate(read.items(top.get("findings"), "findings"))
        ],
        "kernels": [
            {
                "device": read.integer(kernel.get("device"), f"kernels[{index}].device"),
                "name": read.text(kernel.get("name"), f"kernels[{index}].name", nullable=False),
                "total_us": read.number(kernel.get("total_us"), f"kernels[{index}].total_us", nullable=False),
                "count": read.count(kernel.get("count"), f"kernels[{index}].count"),
            }
            for index, kernel in enumerate(read.items(top.get("kernels"), "kernels"))
        ],
        "devices": [
            {"name": read.text(device.get("name"), f"devices[{index}].name")}
            for index, device in enumerate(read.items(top.get("devices"), "devices"))
        ],
    }


#: The values of a finding's ``source_line_kind``.
LINE_KINDS: Final = tuple(kind.value for kind in LineKind)


def _source_kind(read: _Reader, value: Any, where: str) -> str | None:
    """Whose code a finding's source line is (``user`` or ``library``), or null."""
    if value is None:
        return None
    return read.identifier(value, f"{where} (user or library)", ("user", "library").__contains__)


def _line_kind(read: _Reader, value: Any, where: str) -> str | None:
    """What a finding's source line is (``call``, ``def``, ``recording-start``), or null."""
    if value is None:
        return None
    return read.identifier(value, f"{where} (one of {', '.join(LINE_KINDS)})", LINE_KINDS.__contains__)


def _finding(read: _Reader, finding: dict[str, Any], where: str) -> dict[str, Any]:
    return {
        "rule": read.identifier(finding.get("rule"), f"{where}.rule"),
        "severity": read.identifier(
            finding.get("severity"),
            f"{where}.severity (one of {', '.join(SEVERITIES)})",
            SEVERITIES.__contains__,
        ),
        "title": read.text(finding.get("title"), f"{where}.title", nullable=False),
        "source": read.text(finding.get("source"), f"{where}.source"),
        "source_kind": _source_kind(read, finding.get("source_kind"), f"{where}.source_kind"),
        "source_line_kind": _line_kind(read, finding.get("source_line_kind"), f"{where}.source_line_kind"),
        "source_function": read.text(finding.get("source_function"), f"{where}.source_function"),
        "op": read.text(finding.get("op"), f"{where}.op"),
        "device": read.integer(finding.get("device"), f"{where}.device", nullable=True),
        "minor": read.flag(finding.get("minor"), f"{where}.minor", False),
        "saving_known": read.flag(finding.get("saving_known"), f"{where}.saving_known", True),
        "savings_us": read.number(finding.get("savings_us"), f"{where}.savings_us"),
        "savings_per_step_us": read.number(
            finding.get("savings_per_step_us"), f"{where}.savings_per_step_us"
        ),
    }
