"""Progress reporting for long loads, without tying the loader to a display library.

The loader calls a :data:`ProgressCallback` with ``(bytes_read, total_bytes, events)``: bytes of
the file on disk (compressed bytes for ``.json.gz``), and events decoded so far. ``bytes_read``
equals ``total_bytes`` only in the last call, once every event is decoded. The CLI passes
:func:`terminal_progress`'s callback, a rich progress bar on stderr that stays silent when stderr is
not a terminal and appears only for loads that take more than a moment.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

ProgressCallback = Callable[[int, int, int], None]

#: Loads shorter than this show nothing.
SHOW_AFTER_S = 0.5


@contextmanager
def terminal_progress(description: str = "reading trace") -> Iterator[ProgressCallback | None]:
    """A rich progress bar on stderr (bytes read, events decoded), or None when stderr is no TTY.

    The bar starts only once a load has run for :data:`SHOW_AFTER_S`, so small traces print nothing.
    ``description`` names a file, a string from a stranger: it is shown as text (never rich markup)
    with its control characters replaced, so it cannot drive the terminal.
    """
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import (
        BarColumn,
        DownloadColumn,
        Progress,
        TextColumn,
        TimeRemainingColumn,
        TransferSpeedColumn,
    )

    from traceinsight.load.text import printable

    description = printable(description)
    progress = Progress(
        TextColumn("{task.description}", markup=False),
        BarColumn(),
        DownloadColumn(),
        TransferSpeedColumn(),
        TextColumn("{task.fields[events]:,} events"),
        TimeRemainingColumn(),
        transient=True,
        console=Console(stderr=True),
        redirect_stdout=False,
        redirect_stderr=False,
    )
    started = time.perf_counter()
    state: dict[str, Any] = {"task": None}

    def update(done: int, total: int, events: int) -> None:
        if state["task"] is None:
            if time.perf_counter() - started < SHOW_AFTER_S:
                return
            progress.start()
            state["task"] = progress.add_task(description, total=total or None, events=0)
        progress.update(state["task"], completed=done, total=total or None, events=events)
        if total and done >= total:  # the loader's last call: reading and decoding are done
            progress.stop()

    try:
        yield update
    finally:
        if state["task"] is not None:
            progress.stop()
