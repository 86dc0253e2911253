"""The memory budget of a recording: watch the process's RSS, end recording before it is passed.

What is counted. The profiler keeps what it records in memory (its record queue: the events
recorded), and stopping it builds the trace's activities from them before anything can be written;
the export then streams them to a file (libkineto writes event by event, and so does our pass over
its file, :mod:`.export`). A window's cost is what it has added to the process's RSS since it
started, plus what the stop will allocate: ``STOP_PER_HELD_BYTE`` × the heap bytes the recording
holds, its events (the growth of the bytes in use in the heap, glibc's ``mallinfo2``, since the
window started; the script's own temporaries are freed by the end of a step, so at a step boundary
that growth is the events recorded). RSS growth alone misjudges both ways: the recording reuses heap
pages the script had freed (LBFGS over ``LSTMCell``: +287 MB of RSS for +133 MB of events), and the
stop's allocations do not always find free pages (a stop added 0.84 × the window's RSS growth on
one run and 0.24 × on another), so the window's part is the larger of its RSS growth and the
bytes it holds. Where ``mallinfo2`` is missing, ``STOP_COST_FACTOR`` × the RSS
growth is used instead.

Measured with torch 2.13 on CPU, stopping with ``trace_only`` (torch then builds no Python event
objects, which the export never reads; see :mod:`.recorder`): the stop allocated 1.05-1.15 × the
heap bytes the events held (LBFGS over ``LSTMCell``, shapes and user frames, 150 k to 1.2 M
events); with ``--stacks all`` (torch's own tracer needs the Python events) 3 × as much
(``STOP_PER_HELD_BYTE_WITH_EVENTS``). After the export the profiler's results are dropped and the
freed heap is given back to the system (:func:`release_freed_memory`): without that, a run kept
its stopped windows' memory to its end (+3.5 GB on LBFGS, under the analysis that followed).

When a stop is asked for. At every step boundary inside a window, the next step is predicted to
record as much as the window's average step so far: when that would pass the budget, the window
ends there, with complete steps only. Between boundaries, a watch thread stops the window as soon
as its cost reaches the budget (a single step bigger than the budget: part of a step is kept).

How a stop is asked for. The watch thread cannot stop the profiler itself (torch's profiler state
belongs to the thread that started it), so it asks the main thread with
``_thread.interrupt_main(signum)``, which runs our Python handler for ``signum`` there at the next
bytecode, without sending any signal. The handler is installed only while a window records, on a
real-time signal no training script uses; a real signal arriving then goes to the previous handler.
A stop that is already under way (the window ended with the script, or at its last step) is never
asked for again: the guard is disarmed before any stop.
"""

from __future__ import annotations

import _thread
import contextlib
import ctypes
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

from traceinsight.load.limits import parse_size

__all__ = [
    "STOP_COST_FACTOR",
    "STOP_PER_HELD_BYTE",
    "STOP_PER_HELD_BYTE_WITH_EVENTS",
    "MemoryGuard",
    "heap_in_use",
    "parse_size",
    "peak_rss",
    "release_freed_memory",
    "rss",
]


STOP_PER_HELD_BYTE = 2.0
"""Bytes the stop and the export allocate per heap byte the recording holds, with ``trace_only``:
1.68 × (LBFGS over a 101-step ``LSTMCell``, 4 closures a step, 3 steps: 180 MB held, 166 MB of
JSON) and 1.77 × (201 steps, 8 closures: 742 MB held, 663 MB of JSON) measured from the stop's
start to the peak of stop and export, issue 52; 1.25 before (measured 1.05-1.15 on a shorter
stop), which put a 2 GiB window of the 400-step shape at 4.6 GB."""

STOP_PER_HELD_BYTE_WITH_EVENTS = 4.0
"""The same when torch builds its Python events at the stop (``--stacks all``: measured 3.0 × on
LBFGS over ``LSTMCell``, against 1.08 × with ``trace_only`` on the same window)."""

STOP_COST_FACTOR = 2.0
"""Without ``mallinfo2``: a window's cost per byte of RSS growth (stops measured at 1.24-1.84 ×)."""

_POLL_SECONDS = 0.05
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_SIGNAL = getattr(signal, "SIGRTMIN", None)


def rss() -> int:
    """This process's resident set size now, in bytes (peak RSS where /proc is missing)."""
    try:
        with open("/proc/self/statm", "rb") as statm:
            return int(statm.read().split()[1]) * _PAGE
    except (OSError, IndexError, ValueError):
        return peak_rss()


def peak_rss() -> int:
    """The highest RSS this process has had, in bytes."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in (
            "arena",
            "ordblks",
            "smblks",
            "hblks",
            "hblkhd",
            "usmblks",
            "fsmblks",
            "uordblks",
            "fordblks",
            "keepcost",
        )
    ]


def _mallinfo2() -> Callable[[], _MallInfo2] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None).mallinfo2
    except (OSError, AttributeError):  # not glibc, or glibc before 2.33
        return None
    function.restype = _MallInfo2
    function.argtypes = []
    return function


_MALLINFO2 = _mallinfo2()


def heap_in_use() -> int | None:
    """Bytes in use in the malloc heap (allocated and not freed, mmapped blocks included), or None
    where glibc's ``mallinfo2`` is missing (about 0.02 ms a call)."""
    if _MALLINFO2 is None:
        return None
    info = _MALLINFO2()
    return int(info.uordblks + info.hblkhd)


def release_freed_memory() -> None:
    """Give the heap pages freed by a stopped recording back to the system (glibc's ``malloc_trim``).

    glibc keeps freed pages in the process: a dropped start-up window (+0.3 GB on LBFGS) or a
    written one (+3.5 GB) stayed resident until the run ended. Elsewhere it does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    with contextlib.suppress(OSError, AttributeError):  # not glibc
        ctypes.CDLL(None).malloc_trim(0)


class MemoryGuard:
    """Watches RSS while a window records; asks the main thread to stop it before the budget passes."""

    def __init__(
        self,
        budget_bytes: int,
        stop_recording: Callable[[], None],
        stop_per_held_byte: float = STOP_PER_HELD_BYTE,
    ) -> None:
        self.budget_bytes = budget_bytes
        self.stop_per_held_byte = stop_per_held_byte
        """Bytes the stop allocates per heap byte the recording holds (:data:`STOP_PER_HELD_BYTE`)."""
        self._stop_recording = stop_recording
        self._baseline = 0
        self._heap_baseline: int | None = None
        self._armed = False
        self._asked = False
        self._inside = 0
        self._previous: Any = None
        self._installed = False
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self.tripped_at_bytes: int | None = None
        """The window's estimated cost when the guard stopped it (None: never stopped one)."""
        self.peak_bytes = 0
        """Highest RSS seen while watching (recording, stopping and writing)."""

    def arm(self) -> None:
        """A window starts recording: measure from now and watch."""
        self._baseline = rss()
        self._heap_baseline = heap_in_use()
        self._asked = False
        self._armed = True
        self._install_handler()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="traceinsight-memory", daemon=True)
            self._thread.start()

    @property
    def armed(self) -> bool:
        """True while a window records under the guard."""
        return self._armed

    def cost_now(self, now: int | None = None) -> int:
        """What the window would cost at its peak if it were stopped now: the RSS it added, plus
        what the stop allocates for the events it holds (see the module doc)."""
        growth = max((rss() if now is None else now) - self._baseline, 0)
        heap = heap_in_use()
        if heap is None or self._heap_baseline is None:
            return int(growth * STOP_COST_FACTOR)
        held = max(heap - self._heap_baseline, 0)
        # A recording that reuses pages the script freed grows RSS by less than it holds (the
        # audit's LBFGS window: +0.72 GB of RSS, then +3.5 GB at the stop): count at least what it holds.
        return int(max(growth, held) + held * self.stop_per_held_byte)

    def next_step_would_pass(self, steps_recorded: int) -> int | None:
        """At a step boundary: the estimated cost after one more step like the average one so far,
        when it would pass the budget (None when it would not, or nothing is armed)."""
        if not self._armed or steps_recorded < 1:
            return None
        predicted = int(self.cost_now() * (steps_recorded + 1) / steps_recorded)
        return predicted if predicted >= self.budget_bytes else None

    def disarm(self) -> None:
        """The window stopped recording (the thread keeps measuring the peak until :meth:`close`)."""
        self._armed = False
        self._remove_handler()

    def close(self) -> None:
        """Stop watching."""
        self.disarm()
        thread, self._thread = self._thread, None
        if thread is not None:
            self._wake.set()
            thread.join(timeout=1)

    @contextlib.contextmanager
    def deferred(self) -> Any:
        """A stop asked for inside this block waits for its end (our own profiler calls)."""
        self._inside += 1
        try:
            yield
        finally:
            self._inside -= 1
        if self._asked and self._armed and not self._inside:
            self._trip()

    def _watch(self) -> None:
        while not self._wake.wait(_POLL_SECONDS):
            now = rss()
            self.peak_bytes = max(self.peak_bytes, now)
            if self._armed and not self._asked:
                cost = self.cost_now(now)
                if cost >= self.budget_bytes:
                    self.tripped_at_bytes = cost
                    self._asked = True
                    if self._installed and _SIGNAL is not None:
                        _thread.interrupt_main(_SIGNAL)

    def _install_handler(self) -> None:
        if self._installed or _SIGNAL is None or threading.current_thread() is not threading.main_thread():
            return
        try:
            self._previous = signal.signal(_SIGNAL, self._on_signal)
        except (ValueError, OSError):
            return
        self._installed = True

    def _remove_handler(self) -> None:
        if not self._installed or _SIGNAL is None:
            return
        with contextlib.suppress(ValueError, OSError):
            signal.signal(_SIGNAL, self._previous)
        self._installed = False

    def _on_signal(self, signum: int, frame: FrameType | None) -> None:
        if not self._asked:
            self._pass_on(signum, frame)  # a real signal: what the script had set handles it
            return
        if self._armed and not self._inside:
            self._trip()

    def _trip(self) -> None:
        self._armed = False
        self._remove_handler()
        self._stop_recording()

    def _pass_on(self, signum: int, frame: FrameType | None) -> None:
        previous = self._previous
        if callable(previous):
            previous(signum, frame)
        elif previous == signal.SIG_DFL:
            self._remove_handler()
            os.kill(os.getpid(), signum)
