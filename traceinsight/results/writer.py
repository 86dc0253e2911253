"""A result's JSON text: byte for byte ``json.dumps(document_of(result), indent=2, ensure_ascii=False)``,
and as strict (a NaN or an infinity is a bug, raised, never written as ``NaN``).

An LLM decode trace reports tens of thousands of idle gaps, and the standard encoder indents in
Python, several calls per value: the idle gaps (:func:`_gap_rows`) and the other long lists of flat
objects (:func:`_flat_rows`) are written apart, column by column, and put in place of a marker.
"""

from __future__ import annotations

import json
import uuid
from json.encoder import encode_basestring
from operator import attrgetter
from typing import TYPE_CHECKING, Any, Final

import polars as pl

from traceinsight.model import fields_of
from traceinsight.results.codec import document_of

if TYPE_CHECKING:
    from traceinsight.results.trace import IdleGap, Result

__all__ = ["result_json", "strict_json"]


def strict_json(document: object) -> str:
    """``document`` as indented JSON that every parser reads: a NaN or an infinity is a bug
    (ValueError), never written as the ``NaN`` that strict parsers refuse."""
    return json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def _scalar(value: object) -> str | None:
    """``value`` as ``json.dumps(value, ensure_ascii=False)`` writes it, for None, bools, ints,
    floats and strings; None for anything else."""
    if value is None:
        return "null"
    if value is True:
        return "true"
    if value is False:
        return "false"
    if isinstance(value, int):
        return int.__repr__(value)
    if isinstance(value, float):
        if value - value != 0:  # NaN or an infinity: strict parsers refuse what json writes for them
            raise ValueError(f"Out of range float values are not JSON compliant: {value!r}")
        return float.__repr__(value)
    if isinstance(value, str):
        return encode_basestring(value)
    return None


def _encoded_column(values: list[Any]) -> list[str] | None:
    """Each value as :func:`_scalar` writes it (None if one is not a scalar)."""
    out: list[str] = []
    strings: dict[str, str] = {}  # causes, sources and kinds repeat from row to row
    for value in values:
        kind = type(value)
        if kind is str:
            text = strings.get(value)
            if text is None:
                text = strings[value] = encode_basestring(value)
        elif kind is int:
            text = int.__repr__(value)
        elif kind is float and value - value == 0:  # finite
            text = float.__repr__(value)
        else:
            scalar = _scalar(value)
            if scalar is None:
                return None
            text = scalar
        out.append(text)
    return out


def _flat_rows(rows: list[Any]) -> str | None:
    """A top-level list of flat objects (the same string keys in the same order, scalar values) as
    ``json.dumps(..., indent=2)`` writes it at depth 1, or None when it is not one: each column
    encoded in one pass, each row one ``%`` format of a template with the keys already written."""
    if not rows or not isinstance(rows[0], dict) or not rows[0]:
        return None
    keys = tuple(rows[0])
    if not all(isinstance(key, str) for key in keys):
        return None
    if not all(isinstance(row, dict) and tuple(row) == keys for row in rows):
        return None
    columns = []
    for key in keys:
        column = _encoded_column([row[key] for row in rows])
        if column is None:
            return None
        columns.append(column)
    fields = ",\n".join(f"      {encode_basestring(key).replace('%', '%%')}: %s" for key in keys)
    template = "    {\n" + fields + "\n    }"
    return "[\n" + ",\n".join(template % values for values in zip(*columns, strict=True)) + "\n  ]"


#: Below this many ns in magnitude (10^12 µs, 11.6 days), ``us(ns)``'s float is the one nearest
#: ``ns / 1000`` and has at most 15 significant digits, so its repr is that decimal, trailing zeros
#: cut (at least one fraction digit): what :func:`_us_texts` writes without floats.
_EXACT_NS: Final = 10**15


def _us_texts(ns: list[int]) -> pl.Series:
    """Each ``_scalar(us(value))`` of ``ns`` (every ``abs(value) < _EXACT_NS``), by integer
    arithmetic on the whole column."""
    values = pl.lit(pl.Series(ns, dtype=pl.Int64))
    magnitude = values.abs()
    fraction = (magnitude % 1000).cast(pl.String).str.zfill(3).str.strip_chars_end("0")
    whole = (magnitude // 1000).cast(pl.String)
    text = pl.concat_str(whole, pl.lit("."), pl.when(fraction == "").then(pl.lit("0")).otherwise(fraction))
    return pl.select(pl.when(values < 0).then(pl.lit("-") + text).otherwise(text)).to_series()


def _encoded(values: list[Any]) -> pl.Series:
    """Each value of a column of strings, Nones and ints as :func:`_scalar` writes it (each distinct
    value encoded once)."""
    texts = {value: _scalar(value) for value in set(values)}
    return pl.Series([texts[value] for value in values], dtype=pl.String)


def _gap_rows(gaps: tuple[IdleGap, ...]) -> str | None:
    """The ``idle_gaps`` as :func:`_flat_rows` writes them, or None where that path must (fewer than
    101 gaps, a time too far from the trace's start for :func:`_us_texts`): each column taken from
    the gaps once and turned into text by polars (times by integer arithmetic, strings once per
    distinct value), with no dict per gap."""
    if len(gaps) <= 100:
        return None
    columns: dict[str, pl.Series] = {}
    for declared in fields_of(gaps[0]):  # the gaps' JSON keys, in order
        name = declared.name
        if declared.metadata.get("local", False):
            continue
        key = name[:-3] + "_us" if name.endswith("_ns") else name
        values = list(map(attrgetter(name), gaps))
        if name.endswith("_ns"):
            if max(map(abs, values)) >= _EXACT_NS:
                return None
            columns[key] = _us_texts(values)
        else:
            columns[key] = _encoded(values)
    if any(column.null_count() for column in columns.values()):  # a value _scalar does not write
        return None
    fields = [[pl.lit(f"      {encode_basestring(key)}: "), pl.col(key)] for key in columns]
    parts = [pl.lit("    {\n"), *fields[0]]
    for field in fields[1:]:
        parts += [pl.lit(",\n"), *field]
    parts.append(pl.lit("\n    }"))
    rows = pl.DataFrame(columns).select(pl.concat_str(parts).str.join(",\n")).item()
    return f"[\n{rows}\n  ]"


def result_json(result: Result) -> str:
    """``result`` as its JSON document (UTF-8, keys in contract order): see the module doc."""
    gap_rows = _gap_rows(result.idle_gaps)
    document = document_of(result if gap_rows is None else result.replace(idle_gaps=()))
    return spliced_json(document, {} if gap_rows is None else {"idle_gaps": gap_rows})


def spliced_json(document: dict[str, Any], written: dict[str, str]) -> str:
    """:func:`strict_json` of ``document``, with ``written`` (key → text) and the long lists of flat
    objects (:func:`_flat_rows`) written apart and put in place."""
    written = dict(written)
    for key, value in document.items():
        if isinstance(value, list) and len(value) > 100 and (text := _flat_rows(value)) is not None:
            written[key] = text
    spliced: dict[str, str] = {}
    for key, text in written.items():
        marker = f"traceinsight-{uuid.uuid4().hex}"
        document[key] = marker
        spliced[json.dumps(marker)] = text
    out = json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False)
    for marker, text in spliced.items():
        out = out.replace(marker, text, 1)
    return out + "\n"
