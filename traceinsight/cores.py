"""How many cores this process may use, and whether it may keep a second one busy."""

from __future__ import annotations

import os

__all__ = ["available_cores", "second_core"]


def available_cores() -> int:
    """The cores this process may run on (its CPU affinity on Linux, else every core)."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def second_core() -> bool:
    """Whether work may go to a second core beside this thread: the analysis's side thread asks this.

    No when the process may run on one core, when its polars was given one thread
    (``POLARS_MAX_THREADS=1``: a job gives each rank's worker its share of the cores), or when
    ``TRACEINSIGHT_WORKERS=0`` asks for no workers.
    """
    if os.environ.get("TRACEINSIGHT_WORKERS") == "0" or os.environ.get("POLARS_MAX_THREADS") == "1":
        return False
    return available_cores() > 1
