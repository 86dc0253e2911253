"""The script's own profiler: `traceinsight run` steps aside for it.

Two torch profilers cannot run in one process: torch 2.13 keeps one profiler state per thread,
and a script's ``with torch.profiler.profile():`` started while ours records ended in SIGSEGV
(exit 139), leaving a stray trace. So when the script starts a profiler of its own, ours is
stopped and dropped first, records nothing more, and the script's profiler runs as it would
alone. The traces the script exports are noted, so that `run` can report on the last one.

Every torch profiler goes through one of a few methods, wrapped here while the script runs:
``torch.autograd.profiler.profile._prepare_trace``/``_start_trace`` (``torch.profiler.profile``,
scheduled or not, and ``torch.autograd.profiler.profile``), the legacy profiler's ``__enter__``,
and ``emit_nvtx``/``emit_itt``. Exports are seen through ``export_chrome_trace`` of
``torch.profiler.profile`` and ``torch.autograd.profiler.profile`` (``tensorboard_trace_handler``
calls the former). An export made while a scheduled profiler stops (the script ended, or left the
``with`` block, in the middle of a window) holds a partial window: it is noted as such, so that
`run` reports on the last complete one.
"""

from __future__ import annotations

import contextlib
import functools
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

__all__ = ["ForeignProfilerWatch"]

_OUR_PACKAGES = ("traceinsight", "torch")


class ForeignProfilerWatch:
    """Calls ``step_aside`` once, when a profiler that is not ours starts; collects exported paths."""

    def __init__(self, step_aside: Callable[[], None]) -> None:
        self._step_aside = step_aside
        self._ours = 0
        self._patched: list[tuple[Any, str, Any]] = []
        self.started_at: str | None = None
        """``file:line`` of the script's call that started its profiler (None: it never did)."""
        self.exported: list[Path] = []
        """Paths the script exported traces to, in order."""
        self.partial: set[Path] = set()
        """Those exported while a scheduled profiler stopped in the middle of a window."""

    @contextlib.contextmanager
    def ours(self) -> Iterator[None]:
        """Profiler calls made inside this block are our own."""
        self._ours += 1
        try:
            yield
        finally:
            self._ours -= 1

    def install(self) -> None:
        """Wrap the methods every torch profiler starts and exports through."""
        import torch.autograd.profiler as autograd_profiler
        import torch.profiler.profiler as profiler_module

        for owner, name in (
            (autograd_profiler.profile, "_prepare_trace"),
            (autograd_profiler.profile, "_start_trace"),
            (autograd_profiler.emit_nvtx, "__enter__"),
            (getattr(autograd_profiler, "emit_itt", None), "__enter__"),
            (_legacy_profile(), "__enter__"),
        ):
            if owner is not None and hasattr(owner, name):
                self._wrap(owner, name, self._starting)
        for owner in (profiler_module._KinetoProfile, autograd_profiler.profile):
            self._wrap(owner, "export_chrome_trace", self._exporting)

    def remove(self) -> None:
        """Put the original methods back."""
        while self._patched:
            owner, name, original = self._patched.pop()
            setattr(owner, name, original)

    def _wrap(self, owner: Any, name: str, around: Callable[..., Any]) -> None:
        original = owner.__dict__.get(name, getattr(owner, name))

        @functools.wraps(original)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            return around(original, *args, **kwargs)

        self._patched.append((owner, name, original))
        setattr(owner, name, wrapper)

    def _starting(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if not self._ours and self.started_at is None:
            self.started_at = _callers_line()
            with self.ours():
                self._step_aside()
        return original(*args, **kwargs)

    def _exporting(self, original: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._ours:
            return original(*args, **kwargs)
        with self.ours():  # torch.profiler's export calls the autograd profiler's: count one
            result = original(*args, **kwargs)
        path = kwargs.get("path", args[1] if len(args) > 1 else None)
        if isinstance(path, (str, os.PathLike)):
            exported = Path(path).absolute()
            self.exported.append(exported)
            if args and _stopping_mid_window(args[0]):
                self.partial.add(exported)
        return result


def _stopping_mid_window(profiler: Any) -> bool:
    """True when ``profiler`` (a scheduled ``torch.profiler.profile``) exports from its ``stop()`` or
    ``__exit__`` rather than from the ``step()`` that closes a window."""
    from torch.profiler import ProfilerAction

    schedule = getattr(profiler, "schedule", None)
    if schedule is None or getattr(schedule, "__name__", "") == "_default_schedule_fn":
        return False  # unscheduled: its one window ends at stop
    frame = sys._getframe(2)
    while frame is not None:
        if frame.f_globals.get("__name__") == "torch.profiler.profiler":
            if frame.f_code.co_name == "step":
                return False
            if frame.f_code.co_name in ("stop", "__exit__"):
                return getattr(profiler, "current_action", None) in (
                    ProfilerAction.RECORD,
                    ProfilerAction.RECORD_AND_SAVE,
                )
        frame = frame.f_back  # type: ignore[assignment]
    return False


def _legacy_profile() -> Any:
    try:
        from torch.autograd.profiler_legacy import profile
    except ImportError:
        return None
    return profile


def _callers_line() -> str:
    """``file:line`` of the innermost frame outside torch and traceinsight (the script's call)."""
    frame = sys._getframe(2)
    while frame is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".")[0] not in _OUR_PACKAGES and not module.startswith(("contextlib", "functools")):
            return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"
        frame = frame.f_back  # type: ignore[assignment]
    return "?"
