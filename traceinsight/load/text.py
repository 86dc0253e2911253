"""Every trace string is data: control characters replaced, length bounded, in one function.

The loader applies :func:`clean_texts` once, where the tables are built (to the distinct strings
of a scanned run, or to the text columns), on every path, so names can be printed, written to
Markdown or HTML, and compared between loaders without further care. Replacing is one character
for one, so positions and lengths are kept; cutting keeps the first characters.
"""

from __future__ import annotations

from typing import Final

import polars as pl

from traceinsight.load.limits import TEXT_CHARS

#: Code points replaced (first, last): C0 controls (tab and newline included; ESC starts every
#: terminal escape), DEL, C1 controls, and the bidi embeddings, overrides and isolates that make
#: text read differently than it is stored.
CONTROL_RANGES: Final = ((0x00, 0x1F), (0x7F, 0x9F), (0x202A, 0x202E), (0x2066, 0x2069))
REPLACEMENT: Final = "\ufffd"
#: :data:`CONTROL_RANGES` as a polars (Rust) regex character class.
CONTROL_PATTERN: Final = "[" + "".join(f"\\x{{{a:X}}}-\\x{{{b:X}}}" for a, b in CONTROL_RANGES) + "]"
_CONTROL_TABLE: Final = {
    code: REPLACEMENT for first, last in CONTROL_RANGES for code in range(first, last + 1)
}
#: Characters kept of a cut string: the note ``…(+N chars)`` (at most 29 characters) fits after
#: them, so a cut string is never longer than :data:`TEXT_CHARS` (cutting twice changes nothing).
KEPT_CHARS: Final = TEXT_CHARS - 32


def clean_texts(texts: pl.Series, lengths: pl.Series | None = None) -> pl.Series:
    """``texts`` with control characters replaced by U+FFFD and strings longer than
    :data:`~traceinsight.load.limits.TEXT_CHARS` cut to their first :data:`KEPT_CHARS` characters
    plus ``…(+N chars)``, N the number of characters cut.

    ``lengths`` gives each string's full length in characters when ``texts`` holds only a prefix
    of some (the native scanner hands over only the start of a very long string); by default it is
    the strings' own length. Nulls stay null.
    """
    if texts.len() == 1:  # polars copies a one-row column's string several times in each operation
        value, length = texts[0], None if lengths is None else lengths[0]
        return pl.Series(texts.name, [None if value is None else clean_text(value, length)], dtype=pl.String)
    # One query over the usual column, which needs nothing done.
    text = pl.col("text")
    dirty, longest = (
        pl.DataFrame({"text": texts} if lengths is None else {"text": texts, "length": lengths})
        .select(
            text.str.contains(CONTROL_PATTERN).any().alias("dirty"),
            (text.str.len_chars() if lengths is None else pl.col("length")).max().alias("longest"),
        )
        .row(0)
    )
    if not dirty and (longest or 0) <= TEXT_CHARS:
        return texts
    if lengths is None:
        lengths = texts.str.len_chars()
    cleaned = texts.str.replace_all(CONTROL_PATTERN, REPLACEMENT) if dirty else texts
    long = lengths > TEXT_CHARS
    if not long.any():
        return cleaned
    # Only the kept characters of a long string are copied (a 500 MB name costs no second copy).
    cut = cleaned.str.slice(0, KEPT_CHARS) + "…(+" + (lengths - KEPT_CHARS).cast(pl.String) + " chars)"
    return cleaned.zip_with(~long, cut).alias(texts.name)


def clean_text(text: str, length: int | None = None) -> str:
    """:func:`clean_texts` for one string (``length``: its full length when ``text`` is a prefix)."""
    full = len(text) if length is None else length
    if full <= TEXT_CHARS:
        return printable(text)
    return f"{printable(text[:KEPT_CHARS])}…(+{full - KEPT_CHARS} chars)"  # replacing is one for one


def printable(text: str) -> str:
    """``text`` with the control characters of :data:`CONTROL_RANGES` replaced (not cut): for
    messages that name a file or quote a trace."""
    return text.translate(_CONTROL_TABLE)


def without_lone_surrogates(text: str) -> str:
    """``text`` with each lone UTF-16 surrogate (``"\\ud800"`` in the JSON) replaced by U+FFFD.

    Python's json reads such escapes into strings that no UTF-8 output (polars, a file) can hold;
    they are replaced one for one, before anything else sees them.
    """
    if text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text
