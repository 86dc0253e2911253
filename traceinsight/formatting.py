"""How numbers and names are written for people: one set of units for rules and every renderer."""

from __future__ import annotations

import os


def format_duration(ns: float) -> str:
    """Nanoseconds as µs below 0.1 ms, ms below 10 s, else seconds."""
    if abs(ns) >= 10_000_000_000:
        return f"{ns / 1e9:,.1f} s"
    if abs(ns) >= 100_000:
        return f"{ns / 1e6:,.2f} ms"
    return f"{ns / 1e3:,.1f} µs"


def format_change(us: float) -> str:
    """A change of a time given in µs, its sign always written (a minus sign, −; a change of
    nothing is +): ``+1.20 ms``, ``−47.5 µs``."""
    return ("+" if us >= 0 else "−") + format_duration(abs(us) * 1000)


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


def format_count(value: float) -> str:
    """A count that may be an average (launches per step): ``26``, ``4.3``, ``0.17``."""
    if value == int(value):
        return f"{int(value):,}"
    return f"{value:,.1f}" if value >= 1 else f"{value:.2g}"


def short_kernel_name(name: str, limit: int = 100) -> str:
    """A kernel name without ``void`` and its parameter list, shortened to ``limit`` characters
    in the middle (:func:`shorten_middle`).

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
    return shorten_middle(short, limit)


def shorten_middle(text: str, limit: int) -> str:
    """``text`` cut to ``limit`` characters in the middle (``at::native::vectorized_…<float, 4>``):
    a name's start says what it is and its end which instance (template arguments, a file's name),
    so both stay."""
    if len(text) <= limit:
        return text
    if limit < 3:
        return text[:limit]
    head = limit // 2
    tail = limit - 1 - head
    return text[:head] + "…" + (text[-tail:] if tail else "")


def shorten_distinct(texts: list[str], limit: int) -> list[str]:
    """Each of ``texts`` shortened in the middle to ``limit`` characters, so that two different
    texts never read the same: where two shortened texts would collide, the part where they
    differ is shown between two ellipses (``head…<difference>…tail``); a text that still collides
    is kept whole (wider than ``limit`` rather than ambiguous)."""
    shown = [shorten_middle(text, limit) for text in texts]
    groups: dict[str, set[str]] = {}
    for text, short in zip(texts, shown, strict=True):
        groups.setdefault(short, set()).add(text)
    clashing = {short for short, members in groups.items() if len(members) > 1}
    if not clashing:
        return shown
    for short in clashing:
        members = sorted(groups[short])
        prefix = len(os.path.commonprefix(members))  # noqa: RUF071  (characters, not paths)
        for index, text in enumerate(texts):
            if shown[index] == short:
                shown[index] = _around(text, prefix, limit)
    final: dict[str, set[str]] = {}
    for text, short in zip(texts, shown, strict=True):
        final.setdefault(short, set()).add(text)
    return [text if len(final[short]) > 1 else short for text, short in zip(texts, shown, strict=True)]


def _around(text: str, at: int, limit: int) -> str:
    """``text`` in ``limit`` characters: its start, the stretch from just before ``at`` (where it
    differs from a text it would be confused with), its end, with an ellipsis at each cut."""
    side = max((limit - 2) // 4, 1)
    window = max(limit - 2 - 2 * side, 1)
    start = min(max(at - 2, side), len(text) - side - window)
    if start <= side:
        return shorten_middle(text, limit)
    return text[:side] + "…" + text[start : start + window] + "…" + text[-side:]


def source_label(source: str, source_kind: str | None, line_kind: str | None, function: str | None) -> str:
    """A source line as a table shows it, saying what the line is (see
    :class:`traceinsight.load.taxonomy.LineKind`): "train.py:18" for a call's line,
    "`log_metrics` (defined at train.py:4)" for a function's first line, "`main` (recorded from
    train.py:21)" for the line a function was on when recording began, "`batches` (entered at
    data.py:8 or a later line)" for the lowest of several lines a function of that name was entered
    at (a generator's ``yield``s, or several functions of one name), "`main` (train.py:17)" when
    the trace does not say; "library code" added for a library's line."""
    library = source_kind == "library"
    if line_kind == "call" or function is None:
        return f"{source} (library code)" if library else source
    what = {"def": "defined at ", "recording-start": "recorded from ", "entry": "entered at "}.get(
        line_kind or "", ""
    )
    later = " or a later line" if line_kind == "entry" else ""
    return f"`{function}` ({what}{source}{later}{', library code' if library else ''})"


def source_place(source: str, source_kind: str | None, line_kind: str | None, function: str | None) -> str:
    """Where something happens, for a sentence: "at train.py:18" for a call's line, else "in" the
    function ("in `log_metrics` (defined at train.py:4)"): a line that is not the call's is never
    written as if it were (see :func:`source_label`)."""
    label = source_label(source, source_kind, line_kind, function)
    return f"at {label}" if line_kind == "call" or function is None else f"in {label}"
