"""``--stacks user``: record the frames of the user's own code, and only those, while a window records.

Why not torch's own tracer. ``with_stack=True`` makes torch record *every* Python call (there is no
filter in torch 2.13: its ``_ExperimentalConfig`` has none, and ``torch.profiler.python_tracer``
only trims path prefixes); each call costs little while recording but ~1 KB when the profiler
stops, so a library that runs thousands of Python calls per sample (a Dataset that reseeds torch
per sample) turns 5 steps into a million frames, a 117 MB trace and +640 MB at stop (measured on
``benchmarks/run_scripts/stack_walk_dataset.py``, 8 steps). Filtering at export would shrink the
file but not that cost.

How. A ``sys.setprofile`` function (set on the recording thread, and on threads started while it
records) looks at each Python ``call``/``return`` and acts only on code objects whose file is the
user's (:func:`traceinsight.load.taxonomy.is_user_file`, decided once per code object): it opens a
``torch`` record function named :data:`FRAME_MARK` + ``file(first line): function`` on the call
and closes it on the return. The profiler records those ranges with its own clock, so they nest
operators exactly as torch's frames would; the export (:mod:`.export`) turns them into
``python_function`` events. Frames already running when recording starts (the training loop) are
opened at once, outermost first, and closed when recording stops.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Collection
from types import CodeType, FrameType
from typing import Any

from traceinsight.load.taxonomy import is_user_file

__all__ = ["FRAME_MARK", "UserFrameTracer"]

_RUNNERS = ("traceinsight.capture.script", "runpy")

FRAME_MARK = "traceinsight.frame: "
"""Prefix of the record-function names that stand for user frames until the export renames them."""


class UserFrameTracer:
    """Opens one profiler range per user-code frame between :meth:`start` and :meth:`stop`."""

    def __init__(self, user_code: Collection[str]) -> None:
        self._user_code = tuple(user_code)
        self._names: dict[CodeType, str | None] = {}
        self._prefixes = _path_prefixes()
        self._not_user = _not_user_folders()
        self._open = threading.local()
        self._threads: list[list[tuple[FrameType, Any]]] = []
        self._lock = threading.Lock()
        self._running = False
        self._saved_profile: Any = None
        self._saved_thread_profile: Any = None
        self._record: Callable[[str], Any] | None = None

    def start(self) -> None:
        """Start on this thread (opening the user frames now running) and on threads started later."""
        from torch._C._profiler import _RecordFunctionFast

        self._record = _RecordFunctionFast
        self._running = True
        self._saved_profile = sys.getprofile()
        self._saved_thread_profile = threading.getprofile()
        frame = sys._getframe(1)
        running: list[FrameType] = []
        while frame is not None:
            if frame.f_globals.get("__name__") in _RUNNERS:
                break  # below this frame runs traceinsight itself, not the script
            running.append(frame)
            frame = frame.f_back  # type: ignore[assignment]
        for outer in reversed(running):
            self._enter(outer)
        threading.setprofile(self._on_event)
        sys.setprofile(self._on_event)
        _ACTIVE.append(self)
        _register_fork_hook()

    def stop(self) -> None:
        """Close every open range (innermost first) and remove the profile functions."""
        self._running = False
        if self in _ACTIVE:
            _ACTIVE.remove(self)
        sys.setprofile(self._saved_profile)
        threading.setprofile(self._saved_thread_profile)
        with self._lock:
            stacks, self._threads = self._threads, []
        for stack in stacks:
            while stack:
                _, record = stack.pop()
                record.__exit__(None, None, None)

    def _stack(self) -> list[tuple[FrameType, Any]]:
        stack: list[tuple[FrameType, Any]] | None = getattr(self._open, "stack", None)
        if stack is None:
            stack = []
            self._open.stack = stack
            with self._lock:
                self._threads.append(stack)
        return stack

    def _on_event(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            if self._running:
                self._enter(frame)
        elif event == "return":
            stack = getattr(self._open, "stack", None)
            if stack and stack[-1][0] is frame:
                stack.pop()[1].__exit__(None, None, None)

    def _enter(self, frame: FrameType) -> None:
        code = frame.f_code
        name = self._names.get(code, "")
        if name == "":
            name = self._frame_name(code)
            self._names[code] = name
        if name is None or self._record is None:
            return
        record = self._record(name)
        record.__enter__()
        self._stack().append((frame, record))

    def _frame_name(self, code: CodeType) -> str | None:
        """``FRAME_MARK + file(first line): function`` for user code, None for everything else."""
        path = code.co_filename
        # Judged on the absolute path (site-packages and the standard library are visible there),
        # then named as torch names frames: relative to the sys.path entry that holds the file.
        if not os.path.isabs(path) or path.startswith(self._not_user):
            return None
        if not is_user_file(path, self._user_code):
            return None
        for prefix in self._prefixes:
            if path.startswith(prefix):
                path = path[len(prefix) :]
                break
        return f"{FRAME_MARK}{path}({code.co_firstlineno}): {code.co_name}"


_ACTIVE: list[UserFrameTracer] = []
_FORK_HOOK: list[bool] = []


def _register_fork_hook() -> None:
    """Once: a child forked while frames are traced (a DataLoader worker) does not trace them."""
    if _FORK_HOOK or not hasattr(os, "register_at_fork"):
        return
    _FORK_HOOK.append(True)
    os.register_at_fork(after_in_child=_forget_in_child)


def _forget_in_child() -> None:
    for tracer in _ACTIVE:
        tracer._running = False
        sys.setprofile(tracer._saved_profile)
        threading.setprofile(tracer._saved_thread_profile)
    _ACTIVE.clear()


def _not_user_folders() -> tuple[str, ...]:
    """Folders whose files are never the user's: this package and the Python installation (venv)."""
    package = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    folders = {package, sys.prefix, sys.base_prefix, sys.exec_prefix}
    return tuple(os.path.join(os.path.abspath(folder), "") for folder in folders)


def _path_prefixes() -> list[str]:
    """The folder prefixes torch trims from frame file names (longest first), as its tracer does."""
    try:
        from torch.profiler.python_tracer import _prefix_regex

        return list(_prefix_regex())
    except (ImportError, AttributeError):
        prefixes = {os.path.abspath(entry) + os.sep for entry in sys.path if entry}
        return sorted(prefixes, reverse=True)
