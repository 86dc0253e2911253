"""The one path from a trace file to every output: load → analyze → rules → renderers.

Both commands (`analyze` and `run`) go through :func:`analyze_and_write`, so a report made right
after a capture is the same as one made later from the file alone.
"""

from __future__ import annotations

from pathlib import Path

from rich.console import Console


def analyze_and_write(
    trace: Path,
    *,
    html: Path | None,
    json_out: str | None = None,
    console: Console | None = None,
) -> None:
    """Analyze ``trace``; print the terminal summary; write the HTML report (and JSON if asked)."""
    raise NotImplementedError("filled in by the analysis work of issue 2/3")
