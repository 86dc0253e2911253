"""The memory budget of a recording: watch the process's RSS, stop recording before it is passed.

What is counted. The profiler keeps what it records in memory and, when it stops, builds a second,
larger copy before anything can be written; that stop is where runs died (OOM at 21.7 GB on
time_sequence_prediction). Measured with torch 2.13 on CPU (LBFGS over ``LSTMCell``, 1.1 M
operators, ``benchmarks/run_scripts/lbfgs_lstm.py --length 150``): recording took +579 MB (+1418 MB
with shapes) and stopping +612 MB more (+1331 MB), so stopping costs about as much again as the
recording. A window therefore counts ``STOP_COST_FACTOR`` × its RSS growth against the budget;
the growth is measured from the moment the window started, so the script's own growth in the
window counts too (the budget errs towards stopping early).

How a stop is asked for. The watch thread cannot stop the profiler itself (torch's profiler state
belongs to the thread that started it), so it asks the main thread with
``_thread.interrupt_main(signum)``, which runs our Python handler for ``signum`` there at the next
bytecode, without sending any signal. The handler is installed only while a window records, on a
real-time signal no training script uses; a real signal arriving then goes to the previous handler.
"""

from __future__ import annotations

import _thread
import contextlib
import os
import resource
import signal
import sys
import threading
from collections.abc import Callable
from types import FrameType
from typing import Any

__all__ = ["DEFAULT_MAX_MEMORY", "STOP_COST_FACTOR", "MemoryGuard", "parse_size", "peak_rss", "rss"]

DEFAULT_MAX_MEMORY = 2 << 30
"""Default budget of one recording (``--max-memory``): 2 GiB, stop included."""

STOP_COST_FACTOR = 2.5
"""RSS a window will have cost once stopped, per byte of growth while recording (measured 2.0-2.1)."""

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


def parse_size(text: str) -> int:
    """``'2G'``, ``'512M'``, ``'1.5GB'``, ``'800MiB'`` or a number of bytes → bytes; ValueError if not."""
    cleaned = text.strip().upper().removesuffix("B").removesuffix("I")
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}
    factor = units.get(cleaned[-1:], 1)
    number = cleaned[:-1] if cleaned[-1:] in units else cleaned
    value = float(number)
    if value <= 0:
        raise ValueError(text)
    return int(value * factor)


class MemoryGuard:
    """Watches RSS while a window records; asks the main thread to stop it before the budget passes."""

    def __init__(self, budget_bytes: int, stop_recording: Callable[[], None]) -> None:
        self.budget_bytes = budget_bytes
        self._stop_recording = stop_recording
        self._baseline = 0
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
        self._asked = False
        self._armed = True
        self._install_handler()
        if self._thread is None:
            self._thread = threading.Thread(target=self._watch, name="traceinsight-memory", daemon=True)
            self._thread.start()

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
                cost = int((now - self._baseline) * STOP_COST_FACTOR)
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
