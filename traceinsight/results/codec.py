"""The results' JSON, written and read by one writer and one reader driven by the result types.

Every result (:class:`~.trace.Result`, :class:`~.comparison.Comparison`, :class:`~.job.JobResult`)
is a tree of frozen result types (:class:`~traceinsight.model.Model`) whose fields are the JSON's
keys, in the JSON's order. So the contract is declared once, in the types, and:

- **a field ending in ``_ns``** (integer nanoseconds) is written as microseconds (a float with at
  most 3 decimals) under its name ending in ``_us``, and read back to the same integer (exact below
  2^53 ns, 104 days); ``field(metadata={"raw": True})`` keeps an ``_ns`` field as written
  (``trace.base_time_ns``); ``field(metadata={"ns": True})`` writes the integers inside a field
  not named so as microseconds too (a device's idle by cause, ``(cause, ns)`` pairs);
- ``field(metadata={"key": ...})`` names a key the field's name does not say;
- a class may list its keys (``JSON_KEYS``): a name there that is not a field is a property,
  written (``rank_count``) and not read back; an entry ``(attribute, key)`` writes an attribute
  under another key;
- a class with ``JSON_ARRAY`` is written as a list of its fields (``[start_us, end_us]``);
- tuples are lists, ``dict[str, X]`` objects, a ``StrEnum`` its value; ``metadata={"pairs": True}``
  writes a tuple of (key, value) pairs as an object (a finding's evidence);
- a field with ``metadata={"local": True}`` is not part of the JSON (what a live result carries
  beside it: the analysis the page is drawn from).

A result read back is input as untrusted as a trace (a teammate's baseline, a CI artifact): the
text is parsed strictly (:func:`parse`: no ``NaN``/``Infinity``, integers of at most
:data:`MAX_INTEGER_DIGITS` digits, finite numbers, nesting at most :data:`MAX_RESULT_DEPTH`), and
every field is read as its type says, under the checks its metadata names (``check``: ``share``
0 to 1, ``count`` an integer ≥ 0, ``id`` lowercase words, ``duration`` 0 to 10^15 µs, a tuple of
words: one of them as the code writes it; ``most``: a list of at most so many, ``code``
text whose newlines stay). Strings get the trace's cleaning (control characters replaced, a very
long one cut). A missing key reads as null: null where the type allows it, else the field's
default (fields added to a schema after its first files carry one), else one line naming the
field (:class:`~traceinsight.errors.TraceFormatError`, exit 2). A class listing
``REQUIRED_METRICS`` (a comparison, a rank's change) must hold a metric of each of those keys (the
renderers and the gate look them up). Keys the type does not know are left out, so nothing else of
the file reaches a renderer.
"""

from __future__ import annotations

import json
import math
import re
import types
import typing
from collections.abc import Callable
from enum import Enum
from typing import Any, Final, NoReturn, TypeVar

from traceinsight.errors import TraceFormatError
from traceinsight.load.text import CONTROL_RANGES, REPLACEMENT, printable, without_lone_surrogates
from traceinsight.model import Model, fields_of

__all__ = [
    "MAX_INTEGER_DIGITS",
    "MAX_RESULT_DEPTH",
    "MAX_TEXT_CHARS",
    "Reader",
    "attributes",
    "document_of",
    "parse",
    "read_as",
    "us",
]

_T = TypeVar("_T")
#: A field's check (``field(metadata={"check": ...})``): a kind's name, or the words it may be.
Check = str | tuple[str, ...] | None

#: Nesting deeper than this is refused (a result is 5 levels deep).
MAX_RESULT_DEPTH: Final = 32
#: Integers with more digits are refused (``trace.base_time_ns``, the longest, has 19).
MAX_INTEGER_DIGITS: Final = 20
#: A string of a stored result longer than this is cut (a title quotes names of up to 1,024
#: characters of the trace's, and the largest sample result's longest string has 1,010).
MAX_TEXT_CHARS: Final = 16 * 1024
#: A number's text longer than this is refused (``repr`` of a float is at most 24 characters).
_MAX_NUMBER_CHARS: Final = 40
#: Durations in a result are µs: more than this (31 years) is not one.
_MAX_US: Final = 1e15
_INT64: Final = 1 << 63
#: Rule ids and idle-cause keys: lowercase words joined by ``-`` or ``_``.
_ID: Final = re.compile(r"[a-z][a-z0-9_-]{0,63}")
#: Every control character of :data:`~traceinsight.load.text.CONTROL_RANGES` (C0, DEL, C1, the
#: bidi embeddings, overrides and isolates) but the newline, kept in ``code`` text (the advice's
#: snippets); and the line and paragraph separators.
_CODE_CONTROLS: Final = {
    code: REPLACEMENT
    for first, last in (*CONTROL_RANGES, (0x2028, 0x2029))
    for code in range(first, last + 1)
    if code != 0x0A
}


def us(ns: float) -> float:
    """Nanoseconds as the JSON writes them: microseconds, rounded to 3 decimals."""
    return round(ns / 1000, 3)


# --- writing --------------------------------------------------------------------------------------


_Layout = tuple[tuple[str, str, bool], ...]
_LAYOUTS: dict[type, _Layout] = {}
_PAIRS: dict[type, frozenset[str]] = {}
_HINTS: dict[type, dict[str, Any]] = {}


def _layout(cls: type) -> _Layout:
    """(attribute, JSON key, written in µs) for each key of ``cls``, in order (worked out once)."""
    known = _LAYOUTS.get(cls)
    if known is not None:
        return known
    fields = {field.name: field for field in fields_of(cls)}
    layout = []
    for entry in getattr(cls, "JSON_KEYS", None) or tuple(fields):
        name, given = (entry, None) if isinstance(entry, str) else entry
        metadata = fields[name].metadata if name in fields else {}
        if metadata.get("local", False):
            continue
        micro = (name.endswith("_ns") or metadata.get("ns", False)) and not metadata.get("raw", False)
        key = given or metadata.get("key") or (name[:-3] + "_us" if micro else name)
        layout.append((name, key, micro))
    made = _LAYOUTS[cls] = tuple(layout)
    return made


def attributes(cls: type) -> tuple[str, ...]:
    """The attributes ``cls`` writes, in the JSON's order (fields and listed properties; not the
    local fields): what a row of a result's table holds."""
    return tuple(name for name, _, _ in _layout(cls))


def document_of(value: Any, micro: bool = False) -> Any:
    """``value`` (a result, or any part of one) as JSON-ready data: see the module doc.
    ``micro``: integers in it are nanoseconds, written as microseconds."""
    if value is None or isinstance(value, (bool, str)):
        return value.value if isinstance(value, Enum) else value
    if isinstance(value, int):
        return us(value) if micro else value
    if isinstance(value, float):
        return us(value) if micro else value
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, (tuple, list)):
        return [document_of(item, micro) for item in value]
    if isinstance(value, dict):
        return {str(key): document_of(item, micro) for key, item in value.items()}
    if isinstance(value, Model):
        layout = _layout(type(value))
        if getattr(value, "JSON_ARRAY", False):
            return [document_of(getattr(value, name), is_us) for name, _, is_us in layout]
        return {key: _member(value, name, is_us) for name, key, is_us in layout}
    raise TypeError(f"not part of a result: {type(value).__name__}")


def _member(value: Any, name: str, micro: bool) -> Any:
    member = getattr(value, name)
    if name in _pairs(type(value)):
        return {label: document_of(item, micro) for label, item in member}
    return document_of(member, micro)


def _pairs(cls: type) -> frozenset[str]:
    """The fields of ``cls`` written as an object of pairs."""
    known = _PAIRS.get(cls)
    if known is None:
        known = _PAIRS[cls] = frozenset(
            field.name for field in fields_of(cls) if field.metadata.get("pairs", False)
        )
    return known


# --- reading --------------------------------------------------------------------------------------


class _Refused(Exception):
    """A number the parse does not take (its words)."""


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


def parse(data: bytes | str, refused: Callable[[str], TraceFormatError]) -> Any:
    """``data`` parsed as strict JSON under the module's limits; ``refused(words)`` is the error
    for anything else."""
    if isinstance(data, bytes):
        try:
            text = data.decode("utf-8-sig")
        except UnicodeDecodeError:
            raise refused("it is not UTF-8 text") from None
    else:
        text = data.removeprefix("\ufeff")
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


def _depth(value: object) -> int:
    """How deep ``value`` nests (a scalar is 0), without recursion."""
    deepest = 0
    stack: list[tuple[object, int]] = [(value, 1)]
    while stack:
        item, level = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, level)
        if level <= MAX_RESULT_DEPTH:
            stack.extend((child, level + 1) for child in children)
    return deepest


def _kind(value: object) -> str:
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


def _text(value: str, code: bool = False) -> str:
    """A string of a stored result as a renderer may show it (see the module doc): a lone
    surrogate (``"\\ud800"``, valid JSON, which no UTF-8 output can hold: ``diff`` exited 3 in its
    terminal summary, ``.frames`` raised) read as U+FFFD."""
    value = without_lone_surrogates(value)
    if len(value) > MAX_TEXT_CHARS:
        value = f"{value[: MAX_TEXT_CHARS - 32]}…(+{len(value) - MAX_TEXT_CHARS + 32} chars)"
    if code:
        return value.translate(_CODE_CONTROLS)
    return printable(value)


class Reader:
    """Typed reads of one result; each failure is one line: ``{prefix}: {field} is {what it is},
    not {what it must be}; {hint}``."""

    def __init__(self, prefix: str, hint: str) -> None:
        self.prefix = prefix
        self.hint = hint

    def refused(self, words: str) -> TraceFormatError:
        """The error for ``words`` (what is wrong), prefixed and hinted."""
        return TraceFormatError(f"{self.prefix}: {words}; {self.hint}")

    def fail(self, where: str, value: object, wanted: str) -> NoReturn:
        raise self.refused(f"{where} is {_kind(value)}, not {wanted}")

    def object(self, value: Any, where: str) -> dict[str, Any]:
        if not isinstance(value, dict):
            self.fail(where, value, "an object")
        return value

    def read(self, kind: Any, value: Any, where: str, check: Check = None, micro: bool = False) -> Any:
        """``value`` read as ``kind`` (a type expression of a result field)."""
        origin = typing.get_origin(kind)
        if origin is typing.Union or origin is types.UnionType:
            options = [option for option in typing.get_args(kind) if option is not type(None)]
            if value is None:
                return None
            return self.read(options[0], value, where, check, micro)
        if origin is tuple:
            arguments = typing.get_args(kind)
            if not isinstance(value, list) or (
                arguments[-1] is not Ellipsis and len(value) != len(arguments)
            ):
                self.fail(
                    where, value, "a list" if arguments[-1] is Ellipsis else f"a list of {len(arguments)}"
                )
            kinds = [arguments[0]] * len(value) if arguments[-1] is Ellipsis else list(arguments)
            return tuple(
                self.read(item_kind, item, f"{where}[{index}]", check, micro)
                for index, (item_kind, item) in enumerate(zip(kinds, value, strict=True))
            )
        if origin is dict:
            value_kind = typing.get_args(kind)[1]
            entries = self.object(value, where)
            read: dict[str, Any] = {}
            for key, item in entries.items():
                name = self.identifier(key, f"a key of {where}") if check == "id" else _text(key)
                read[name] = self.read(value_kind, item, f"{where}.{name}", None, micro)
            return read
        if isinstance(kind, type) and issubclass(kind, Model):
            return self.result(kind, value, where)
        if isinstance(kind, type) and issubclass(kind, Enum):
            choices = [member.value for member in kind]
            if value not in choices:
                self.fail(f"{where} (one of {', '.join(map(str, choices))})", value, "an id")
            return kind(value)
        if kind is bool:
            if not isinstance(value, bool):
                self.fail(where, value, "true or false")
            return value
        if kind is str:
            if not isinstance(value, str):
                self.fail(where, value, "a string")
            if isinstance(check, tuple):  # one of the words the code writes (a verdict, a basis)
                if value not in check:
                    self.fail(f"{where} (one of {', '.join(check)})", value, "one of those words")
                return value
            return self.identifier(value, where) if check == "id" else _text(value, code=check == "code")
        if kind is int and micro:
            return round(self.number(value, where, check) * 1000)
        if kind is int:
            low = 0 if check == "count" else -_INT64
            if isinstance(value, bool) or not isinstance(value, int) or not low <= value < _INT64:
                self.fail(where, value, "an integer" + (" of at least 0" if low == 0 else ""))
            return value
        if kind is float:
            return self.number(value, where, check)
        raise TypeError(f"a result field of type {kind!r}")

    def number(self, value: Any, where: str, check: Check) -> float:
        low, high = {"share": (0.0, 1.0), "duration": (0.0, _MAX_US)}.get(
            check if isinstance(check, str) else "", (-_INT64 / 1e3, _INT64 / 1e3)
        )
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not low <= value <= high:
            self.fail(where, value, f"a number from {low:g} to {high:g}" if check else "a number")
        return float(value)

    def identifier(self, value: Any, where: str) -> str:
        if not isinstance(value, str) or _ID.fullmatch(value) is None:
            self.fail(where, value, "an id (lowercase letters, digits, - and _)")
        return value

    def result(self, cls: type[_T], value: Any, where: str) -> _T:
        """An instance of the result type ``cls`` from ``value`` (see the module doc)."""
        hints = _hints(cls)
        fields = {field.name: field for field in fields_of(cls)}
        layout = _layout(cls)
        if getattr(cls, "JSON_ARRAY", False):
            if not isinstance(value, list) or len(value) != len(layout):
                self.fail(where, value, f"a list of {len(layout)}")
            entries = {key: item for (_, key, _), item in zip(layout, value, strict=True)}
        else:
            entries = self.object(value, where)
        read: dict[str, Any] = {}
        for name, key, micro in layout:
            field = fields.get(name)
            if field is None:
                continue  # written from a property, not read back
            item = entries.get(key)
            here = f"{where}.{key}" if where else key
            if item is None and not _nullable(hints[name]) and field.has_default:
                continue
            if field.metadata.get("pairs", False):
                item = None if item is None else [list(pair) for pair in self.object(item, here).items()]
            most = field.metadata.get("most")
            if most is not None and isinstance(item, list) and len(item) > most:
                self.fail(here, item, f"a list of at most {most:,}")
            read[name] = self.read(hints[name], item, here, field.metadata.get("check"), micro)
        made = cls(**read)
        required: tuple[str, ...] = getattr(cls, "REQUIRED_METRICS", ())
        if required:  # what the renderers and the gate look up by key (a lookup of none raised)
            keys = {metric.key for metric in getattr(made, "metrics", ())}
            missing = next((key for key in required if key not in keys), None)
            if missing is not None:
                raise self.refused(f"{where + '.' if where else ''}metrics has no {missing} metric")
        return made


def _nullable(kind: Any) -> bool:
    origin = typing.get_origin(kind)
    return (origin is typing.Union or origin is types.UnionType) and type(None) in typing.get_args(kind)


def _hints(cls: type) -> dict[str, Any]:
    known = _HINTS.get(cls)
    if known is None:
        known = _HINTS[cls] = typing.get_type_hints(cls)
    return known


def read_as(cls: type[_T], document: Any, reader: Reader) -> _T:
    """The result of type ``cls`` in ``document`` (parsed JSON), read under ``reader``'s checks."""
    return reader.result(cls, document, "")
