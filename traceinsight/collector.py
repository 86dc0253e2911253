"""Python's cyclic garbage collector, paused while the command's own code runs.

What an analysis makes lives in polars (outside the collector) or is freed by reference counting.
On a 0.5 GB trace the collector ran 300-500 times in the main process, 0.11-0.18 s of its main
thread, and found about 1,000 objects in the plotting library's import (charts are now written as
SVG without one), 800 in the command's other imports and 9 in the analysis: the same on a 0.25 GB
and a 1 GB trace, so what it would free does not grow with the trace. The command pauses it while its
libraries load and while `analyze` reads one trace (a job's ranks keep it); `run` leaves the
user's script the collector as it was.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cyclic collection inside; the collector as it was (on or off) after."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
