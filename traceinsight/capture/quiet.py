"""Keep libkineto's own log lines out of the script's stderr.

torch 2.13's libkineto writes ``USDT:… profiler_start`` / ``profiler_stop`` (and, at some log levels,
``STAGE:…``) straight to file descriptor 2 whenever a profiler starts or stops, whatever
``KINETO_LOG_LEVEL`` says: four lines in a default `run`, mixed with the script's output. While
`run` records, the two functions torch calls for that (``_enable_profiler`` and
``_disable_profiler`` of :mod:`torch.autograd.profiler`) run with descriptor 2 pointed at a
temporary file; what else was written meanwhile (by another thread) is copied back to the real
stderr afterwards, without those lines. Only descriptor 2 is touched, and only during these calls:
the script's stderr is its terminal (or file) the rest of the time.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
import tempfile
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["KinetoLinesDropped"]

#: Line starts that are libkineto's own log lines.
KINETO_LINE_STARTS = (b"USDT:", b"STAGE:")


class KinetoLinesDropped:
    """Wraps torch's profiler enable/disable calls so that libkineto's lines are dropped."""

    def __init__(self) -> None:
        self._patched: list[tuple[Any, str, Any]] = []

    def install(self) -> None:
        """Wrap the calls (until :meth:`remove`)."""
        import torch.autograd.profiler as autograd_profiler

        for name in ("_enable_profiler", "_disable_profiler"):
            original = getattr(autograd_profiler, name, None)
            if callable(original):
                self._patched.append((autograd_profiler, name, original))
                setattr(autograd_profiler, name, _quiet(original))

    def remove(self) -> None:
        """Put the original calls back."""
        while self._patched:
            owner, name, original = self._patched.pop()
            setattr(owner, name, original)


def _quiet(call: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(call)
    def quiet_call(*args: Any, **kwargs: Any) -> Any:
        with kineto_lines_dropped():
            return call(*args, **kwargs)

    return quiet_call


@contextlib.contextmanager
def kineto_lines_dropped() -> Iterator[None]:
    """Descriptor 2 goes to a temporary file in this block; its content comes back to the real
    stderr at the end, without libkineto's lines. Without a usable descriptor 2, nothing changes."""
    with contextlib.suppress(AttributeError, OSError, ValueError):
        sys.stderr.flush()
    try:
        saved = os.dup(2)
    except OSError:
        yield
        return
    try:
        captured = tempfile.TemporaryFile()  # noqa: SIM115 (closed below, after descriptor 2 is back)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        os.dup2(captured.fileno(), 2)
        try:
            yield
        finally:
            os.dup2(saved, 2)
            captured.seek(0)
            kept = b"".join(
                line
                for line in captured.read().splitlines(keepends=True)
                if not line.startswith(KINETO_LINE_STARTS)
            )
            with contextlib.suppress(OSError):
                while kept:
                    kept = kept[os.write(2, kept) :]
    finally:
        os.close(saved)
        captured.close()
