"""The reference's coercions of trace values, one value at a time and column-wise.

A trace field may hold any JSON value; these functions say once what each becomes: an id
(:func:`as_int`), a time in integer nanoseconds (:func:`as_ns`), a version (:func:`as_version`).
Every loader uses them, directly or through their column-wise twins here, so the tables agree.
"""

from __future__ import annotations

import json
import math
import re
from decimal import Decimal
from typing import Final

import polars as pl

Scalar = int | float | str | None

_DIGITS: Final[re.Pattern[str]] = re.compile(r"-?\d+")
INT64_MIN: Final = -(2**63)
INT64_MAX: Final = 2**63 - 1
#: A string id longer than this is not an id ("stream 7" and 19-digit numbers are far shorter).
_ID_CHARS: Final = 64


def as_int(value: Scalar) -> int | None:
    """An id as an int: ints as they are, numeric strings parsed (``"12"``, ``"stream 7"``,
    ``"-3"``, ``"0x1f"``), integral floats; None for anything else and for values beyond Int64."""
    number: int | None = None
    if type(value) is int:
        number = value
    elif isinstance(value, str):
        if len(value) > _ID_CHARS:
            return None
        match = _DIGITS.search(value)
        if match is not None and (value.isdigit() or value.startswith(("stream", "-"))):
            number = int(match.group())
        elif value.startswith("0x"):
            try:
                number = int(value, 16)
            except ValueError:
                return None
    elif isinstance(value, float) and value.is_integer():
        number = int(value)
    if number is None or not INT64_MIN <= number <= INT64_MAX:
        return None
    return number


def as_ns(value: Scalar) -> int | None:
    """Microseconds (int or float) → integer nanoseconds, rounded once; None when not a time (a
    string, NaN, an infinity) or beyond what an Int64 of ns holds (year 2262): such an event is
    dropped like one without time."""
    if type(value) is int:
        ns = value * 1000
    elif type(value) is float and math.isfinite(value):
        ns = float_us_to_ns(value)
    else:
        return None
    return ns if -INT64_MAX <= ns <= INT64_MAX else None


def float_us_to_ns(value: float) -> int:
    """Finite float µs → ns as written in the file. Epoch-sized floats (1.7e15 µs) carry only 0.25 µs
    of binary precision, so arithmetic on the float would shift times by up to 125 ns; the shortest
    decimal text of the float (``repr``) is the text the profiler wrote, and is converted exactly."""
    text = repr(value)
    whole, dot, fraction = text.partition(".")
    if dot and whole.lstrip("-").isdigit() and fraction.isdigit():
        ns = int(whole) * 1000 + (-1 if whole.startswith("-") else 1) * int(fraction[:3].ljust(3, "0"))
        if len(fraction) > 3 and fraction[3] >= "5":
            ns += -1 if whole.startswith("-") else 1
        return ns
    return round(Decimal(text) * 1000)


def as_version(value: Scalar) -> str | None:
    """CUDA's integer versions (12040) → "12.4"; strings as they are."""
    if type(value) is int and value > 1000:
        return f"{value // 1000}.{(value % 1000) // 10}"
    return None if value is None else str(value)


#: The longest JSON text a ``json`` field keeps (compact form); longer ones are null. Recorded shapes
#: are tens of characters; an operator with 30 inputs a few hundred.
JSON_TEXT_CHARS: Final = 4096


def as_json_text(value: object) -> str | None:
    """A list or object (as a JSON decoder gives it) → its compact JSON text (``[[2,3],[]]``), the
    one form every loader gives for a ``json`` field; None for any other value and for a text longer
    than :data:`JSON_TEXT_CHARS`. The text is only ever decoded again (never interpreted)."""
    if not isinstance(value, (list, dict)):
        return None
    try:
        text = json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError, RecursionError):
        return None
    return text if len(text) <= JSON_TEXT_CHARS else None


#: A raw text of only these characters is lists of non-negative integers (``Input Dims``): its
#: compact form is the text without its whitespace, what :func:`as_json_text` would give.
_PLAIN_DIMS: Final = re.compile(r"[\[\]0-9, \t\n\r]*")
_JSON_WHITESPACE: Final = re.compile(r"[ \t\n\r]+")


def json_text_of(raw: str | bytes) -> str | None:
    """:func:`as_json_text` of a list or object given as its raw JSON text (the scanner's and
    msgspec's ``Raw``); None when the text does not decode. Lists of non-negative integers (the
    scanner validated the text) skip the decode and encode: their whitespace is dropped."""
    text = raw if isinstance(raw, str) else None
    if text is not None and text[:1] == "[" and _PLAIN_DIMS.fullmatch(text):
        compact = _JSON_WHITESPACE.sub("", text)
        return compact if len(compact) <= JSON_TEXT_CHARS else None
    try:
        return as_json_text(json.loads(raw))
    except (ValueError, RecursionError):
        return None


# --- column-wise ------------------------------------------------------------------------------

#: |µs| below which ``µs × 1000`` fits Int64.
INT64_NS_LIMIT: Final = INT64_MAX // 1000
#: Below this many µs a float's product by 1000 is within ``1e-12`` relative of its decimal text's.
_ARITHMETIC_US_LIMIT: Final = 1e9


def end_ns(ts: pl.Series, dur: pl.Series) -> pl.Series:
    """``ts + dur`` (``dur >= 0``), null where the sum leaves Int64 (the reference's big int)."""
    end = ts + dur
    return end.set(end < ts, None)


def float_column_to_ns(floats: pl.Series) -> pl.Series:
    """:func:`float_us_to_ns` over a column of finite floats below :data:`INT64_NS_LIMIT`, by
    arithmetic where that provably gives the same ns, from the text elsewhere.

    The text path rounds (half away from zero) the shortest decimal ``d`` of ``x`` times 1000. For
    ``|x| < 1e9``, ``x·1000`` in floats is within ``|x|·2.3e-13`` of ``d·1000`` (half an ulp of
    ``x``, scaled, plus the product's rounding), so both round to the same integer unless ``x·1000``
    lies within ``|x|·1e-12`` of a half-integer: those values, and larger ones, take the text path.
    """
    if (floats.abs().min() or 0.0) >= _ARITHMETIC_US_LIMIT:  # type: ignore[operator]
        return _float_text_to_ns(floats)  # epoch-sized times
    scaled = floats * 1000.0
    near_half = ((scaled - scaled.floor() - 0.5).abs() <= floats.abs() * 1e-12 + 1e-9) | (
        floats.abs() >= _ARITHMETIC_US_LIMIT
    )
    exact = near_half.sum()
    if exact == floats.len():
        return _float_text_to_ns(floats)
    result = scaled.round(0).cast(pl.Int64)
    if exact:
        indices = near_half.arg_true()
        result = result.scatter(indices, _float_text_to_ns(floats.gather(indices)))
    return result


def _float_text_to_ns(floats: pl.Series) -> pl.Series:
    """:func:`float_us_to_ns` for a column: ns from the float's shortest decimal text.

    polars formats a float with the same shortest round-trip digits as Python's ``repr``, in plain
    notation from 1e-5 to 1e16 (:func:`float_column_to_ns` only sends values from 0.0005 on; the
    callers leave 1e16 on to the per-value path). The text's whole part is the float truncated
    (below 2**53 no shortest text rounds into the next integer); the ns are whole × 1000 + the
    first three fraction digits, plus one when the fourth is 5 or more, signed like the value.
    """
    fraction = floats.cast(pl.String).str.split_exact(".", 1).struct.field("field_1")
    first_four = fraction.fill_null("").str.pad_end(4, "0").str.slice(0, 4).cast(pl.Int64)
    sign = (floats < 0).cast(pl.Int64) * -2 + 1
    return floats.cast(pl.Int64) * 1000 + sign * ((first_four + 5) // 10)
