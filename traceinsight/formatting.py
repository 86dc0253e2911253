"""How numbers and names are written for people: one set of units for rules and every renderer."""

from __future__ import annotations


def format_duration(ns: float) -> str:
    """Nanoseconds as µs below 0.1 ms, ms below 10 s, else seconds."""
    if abs(ns) >= 10_000_000_000:
        return f"{ns / 1e9:,.1f} s"
    if abs(ns) >= 100_000:
        return f"{ns / 1e6:,.2f} ms"
    return f"{ns / 1e3:,.1f} µs"


def format_size(count: int) -> str:
    """Bytes in B, KiB, MiB or GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:,.0f} {unit}" if unit == "B" else f"{value:,.1f} {unit}"
        value /= 1024
    return f"{value:,.1f} GiB"


def format_share(value: float | None) -> str:
    """A ratio as a whole percentage ("—" when unknown), "<1%" for small non-zero shares."""
    if value is None:
        return "—"
    if 0 < value < 0.005:
        return "<1%"
    return f"{value:.0%}"


def short_kernel_name(name: str, limit: int = 100) -> str:
    """A kernel name without ``void`` and its parameter list, shortened to ``limit`` characters.

    Template arguments stay: they tell apart the instances of one kernel (the functor of an
    elementwise kernel, the tile shape of a GEMM).
    """
    short = name.removeprefix("void ")
    depth = 0
    for index, char in enumerate(short):
        if char == "<":
            depth += 1
        elif char == ">":
            depth = max(depth - 1, 0)
        elif char == "(" and depth == 0 and not short.startswith("(anonymous namespace)", index):
            short = short[:index] if index else short
            break
    return short if len(short) <= limit else short[: limit - 1] + "…"


def source_label(source: str, source_kind: str | None, line_kind: str | None, function: str | None) -> str:
    """A source line as a table shows it, saying what the line is (see
    :class:`traceinsight.load.taxonomy.LineKind`): "train.py:18" for a call's line,
    "`log_metrics` (defined at train.py:4)" for a function's first line, "`main` (recorded from
    train.py:21)" for the line a function was on when recording began, "`main` (train.py:17)" when
    the trace does not say; "library code" added for a library's line."""
    library = source_kind == "library"
    if line_kind == "call" or function is None:
        return f"{source} (library code)" if library else source
    what = {"def": "defined at ", "recording-start": "recorded from "}.get(line_kind or "", "")
    return f"`{function}` ({what}{source}{', library code' if library else ''})"


def source_place(source: str, source_kind: str | None, line_kind: str | None, function: str | None) -> str:
    """Where something happens, for a sentence: "at train.py:18" for a call's line, else "in" the
    function ("in `log_metrics` (defined at train.py:4)"): a line that is not the call's is never
    written as if it were (see :func:`source_label`)."""
    label = source_label(source, source_kind, line_kind, function)
    return f"at {label}" if line_kind == "call" or function is None else f"in {label}"
