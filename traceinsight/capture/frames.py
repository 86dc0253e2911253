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

Call sites. A frame's name carries its function's first line, which would put every finding of a
training loop at ``def main():``. So each call the user's code makes into torch (a Python call into
torch's files, or a C call on a torch object: ``loss.item()``, ``x.cuda()``, ``model(x)``) also
gets a range, named by the caller's current line, from the call to its return. The operators that
call runs nest inside it, so the source of a sync or a gap is the line that made it; the range
lasts until the frame's next call into torch (or its return), which also covers what the line
does after the call returns.

Syncs with no call on their line. ``running += float(loss)``, ``if loss > 100:``, ``int(t)``,
``bool(t)``: Python reaches the tensor through a type slot (``__float__``, ``__gt__`` then
``__bool__``), which no profile event shows, so their ``aten::item`` / ``aten::is_nonzero`` fell in
the range of the frame's last call into torch (``optimizer.step()``'s line) and got no card of
their own. While the tracer runs, those methods of ``torch.Tensor`` (:data:`SLOT_METHODS`: the
conversions and the comparisons) are Python functions of ours that call torch's own: each is a
call event whose caller's current line gets its range, the line executing when the operator
starts. Put back when the tracer stops. A line-level tracer (``sys.settrace``, a range per
line) was measured first and left: about 2 µs per line executed, a 20,000-iteration Python loop
inside the training loop's frame went from 3.1 ms to 79.6 ms per recorded step. These wrappers
cost a Python call and its profile events per conversion or comparison while a step records:
``float(t); t > 0`` took about 8 µs traced before, 14 µs with them (medians of three runs on a
shared 2-core machine: about 3 µs each, 0.24 µs of it the wrapper alone), nothing after the stop. Only calls into torch get one: a user loop calling builtins thousands
of times per step costs nothing more. Module forwards get ``nn.Module: ClassName_N`` ranges, as
torch's tracer writes them, so findings can name the module; ``Tensor.__repr__`` and
``Tensor.__format__`` get frames named as torch's tracer names them (``torch/_tensor.py(N):
__repr__``), so the operators ``print(loss)`` or ``f"{loss:.3f}"`` run are known to be a
tensor's formatting. The export marks each frame with its line's meaning (``"Call site": 1`` for
a call site, ``0`` for a function's first line), so that ``analyze`` never presents a function's
first line as the line of a call.

What it costs, and where it does not trace. The profile function runs for every Python call and
return on the thread, and while one is set CPython 3.11 runs all bytecode of the thread on its
slower tracing path (a loop without calls: 1.9× slower). Python-heavy code pays for it: a Dataset
doing torchvision-like work per sample ran 8-19× slower under it. So the DataLoader's ``__next__``
(the whole fetch: sampler, Dataset, transforms, collate) runs with the profile function removed on
its thread; the profiler still records the ``enumerate(DataLoader)#…`` range (its operators are
not collected either: :mod:`.fetch`), and the ``for`` line gets its call-site range. What recording costs elsewhere is measured by the
recorder on the steps themselves (:mod:`.recorder`).
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Collection
from types import CodeType, FrameType, FunctionType
from typing import Any, cast

from traceinsight.load.taxonomy import is_user_file

__all__ = ["FRAME_MARK", "SITE_MARK", "SLOT_METHODS", "UserFrameTracer"]

#: Methods of ``torch.Tensor`` Python calls through a type slot (no profile event): while the
#: tracer runs, each is a Python function calling torch's own, so its caller's line is seen.
SLOT_METHODS = (
    "__bool__", "__float__", "__int__", "__index__", "__complex__",
    "__eq__", "__ne__", "__lt__", "__le__", "__gt__", "__ge__",
)  # fmt: skip
_UNARY = frozenset({"__bool__", "__float__", "__int__", "__index__", "__complex__"})
_MISSING = object()

_RUNNERS = ("traceinsight.capture.script", "traceinsight.commands", "traceinsight.__main__", "runpy")

FRAME_MARK = "traceinsight.frame: "
"""Prefix of the record-function names that stand for user frames until the export renames them."""

SITE_MARK = "traceinsight.site: "
"""Prefix of the call-site ranges (named by the caller's current line, not its function's first
line): the export writes them as frames too, marked ``"Call site": 1`` so that ``analyze`` knows
their line is the call's."""


#: A range the tracer holds open: (the frame it belongs to, the record, its kind, the line it names).
_Open = tuple[FrameType, Any, str, int]


class UserFrameTracer:
    """Opens profiler ranges for user-code frames, their call sites into torch, and module forwards,
    between :meth:`start` and :meth:`stop` (see the module doc)."""

    def __init__(self, user_code: Collection[str]) -> None:
        self._user_code = tuple(user_code)
        self._names: dict[CodeType, str | None] = {}
        # Computed at the first user frame, when the script runs: sys.path[0] is then the
        # script's folder (a window recording from step 0 starts before that).
        self._prefixes: list[str] | None = None
        self._not_user = _not_user_folders()
        self._open = threading.local()
        self._threads: list[list[_Open]] = []
        self._lock = threading.Lock()
        self._running = False
        self._saved_profile: Any = None
        self._saved_thread_profile: Any = None
        self._saved_slots: dict[str, Any] = {}
        """``torch.Tensor``'s own entries for :data:`SLOT_METHODS` while ours stand in (see the
        module doc), ``_MISSING`` for one it inherits."""
        self._record: Callable[[str], Any] | None = None
        self._torch: dict[CodeType, bool] = {}
        self._torch_folder = _torch_folder()
        self._module_calls = _module_call_codes()
        self._module_index: dict[int, str] = {}
        self._class_counts: dict[str, int] = {}
        self._torch_frames = _torch_frame_names()

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
        self._wrap_slots()
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
        self._unwrap_slots()
        with self._lock:
            stacks, self._threads = self._threads, []
        for stack in stacks:
            while stack:
                stack.pop()[1].__exit__(None, None, None)

    def _wrap_slots(self) -> None:
        """``torch.Tensor``'s :data:`SLOT_METHODS` as Python functions calling torch's own."""
        import torch

        for name in SLOT_METHODS:
            original = getattr(torch.Tensor, name, None)
            if original is None:
                continue
            self._saved_slots[name] = torch.Tensor.__dict__.get(name, _MISSING)
            setattr(torch.Tensor, name, _slot_wrapper(name, original))

    def _unwrap_slots(self) -> None:
        """Put ``torch.Tensor``'s own methods back (one the script replaced meanwhile stays)."""
        import torch

        saved, self._saved_slots = self._saved_slots, {}
        for name, original in saved.items():
            if getattr(torch.Tensor.__dict__.get(name), "__code__", None) not in (_UNARY_CODE, _BINARY_CODE):
                continue
            if original is _MISSING:
                delattr(torch.Tensor, name)
            else:
                setattr(torch.Tensor, name, original)

    def _stack(self) -> list[_Open]:
        stack: list[_Open] | None = getattr(self._open, "stack", None)
        if stack is None:
            stack = []
            self._open.stack = stack
            with self._lock:
                self._threads.append(stack)
        return stack

    def _on_event(self, frame: FrameType, event: str, arg: object) -> None:
        if event == "call":
            if not self._running:
                return
            caller = frame.f_back
            code = frame.f_code
            if code is _UNARY_CODE or code is _BINARY_CODE:  # a slot of ours: its caller's line only
                if caller is not None and self._name(caller.f_code):
                    self._mark_line(caller)
                return
            if caller is not None and self._torch_code(code) and self._name(caller.f_code):
                self._mark_line(caller)
            if code in self._module_calls:
                self._enter_module(frame)
            self._enter(frame)
        elif event == "return":
            stack = getattr(self._open, "stack", None)
            while stack and stack[-1][0] is frame:  # its call site, its own range, its module range
                stack.pop()[1].__exit__(None, None, None)
        elif event == "c_call" and self._running and self._name(frame.f_code) and _torch_function(arg):
            self._mark_line(frame)

    def is_hook(self, hook: object) -> bool:
        """True when ``hook`` is this tracer's profile function and it still traces (the DataLoader's
        fetch runs without it: :mod:`.fetch`)."""
        return self._running and hook == self._on_event

    def _name(self, code: CodeType) -> str | None:
        """The frame name of ``code`` when it is the user's (cached per code object), else None."""
        name = self._names.get(code, "")
        if name == "":
            name = self._frame_name(code)
            self._names[code] = name
        return name

    def _torch_code(self, code: CodeType) -> bool:
        """True for Python code in torch's own files (cached per code object)."""
        known = self._torch.get(code)
        if known is None:
            known = code.co_filename.startswith(self._torch_folder)
            self._torch[code] = known
        return known

    def _push(self, frame: FrameType, name: str, kind: str, line: int) -> None:
        if self._record is None:
            return
        record = self._record(name)
        record.__enter__()
        self._stack().append((frame, record, kind, line))

    def _enter(self, frame: FrameType) -> None:
        code = frame.f_code
        name = self._name(code) or self._torch_frames.get(code)
        if name is not None:
            self._push(frame, name, "frame", 0)

    def _mark_line(self, frame: FrameType) -> None:
        """The user's ``frame`` calls into torch: its current line gets a range until its next call
        into torch or its return, so what runs meanwhile (the call, and what the line does after it,
        like a tensor's ``__bool__``) is tied to that line."""
        line = frame.f_lineno
        stack = self._stack()
        if stack and stack[-1][0] is frame and stack[-1][2] == "site":
            if stack[-1][3] == line:
                return
            stack.pop()[1].__exit__(None, None, None)
        name = self._names.get(frame.f_code)
        if not name:
            return
        head, _, function = name.partition("): ")
        file = head.rpartition("(")[0].removeprefix(FRAME_MARK)
        self._push(frame, f"{SITE_MARK}{file}({line}): {function}", "site", line)

    def _enter_module(self, frame: FrameType) -> None:
        """A module's forward: ``nn.Module: ClassName_N`` (N counts instances of the class, as torch does)."""
        module = frame.f_locals.get("self")
        if module is None:
            return
        index = self._module_index.get(id(module))
        if index is None:
            kind = type(module).__name__
            count = self._class_counts.get(kind, 0)
            self._class_counts[kind] = count + 1
            index = f"{kind}_{count}"
            self._module_index[id(module)] = index
        self._push(frame, f"{FRAME_MARK}nn.Module: {index}", "module", 0)

    def _frame_name(self, code: CodeType) -> str | None:
        """``FRAME_MARK + file(first line): function`` for user code, None for everything else."""
        path = code.co_filename
        # Judged on the absolute path (site-packages and the standard library are visible there),
        # then named as torch names frames: relative to the sys.path entry that holds the file.
        if not os.path.isabs(path) or path.startswith(self._not_user):
            return None
        if not is_user_file(path, self._user_code):
            return None
        if self._prefixes is None:
            self._prefixes = _path_prefixes()
        # The script runs under its path as typed while sys.path[0] is its folder with symlinks
        # resolved, as Python sets it: either may match.
        for candidate in (path, os.path.realpath(path)):
            prefix = next((prefix for prefix in self._prefixes if candidate.startswith(prefix)), None)
            if prefix is not None:
                path = candidate[len(prefix) :]
                break
        return f"{FRAME_MARK}{path}({code.co_firstlineno}): {code.co_name}"


def _slot_wrapper(name: str, original: Callable[..., Any]) -> Callable[..., Any]:
    """A Python function standing in for ``torch.Tensor.<name>``: it calls ``original``, and its
    call is an event the profile function sees (its caller's line marked)."""
    if name in _UNARY:

        def unary(self: Any) -> Any:
            return original(self)

        made: Callable[..., Any] = unary
    else:

        def binary(self: Any, other: Any) -> Any:
            return original(self, other)

        made = binary
    made.__name__ = name
    made.__qualname__ = f"Tensor.{name}"
    made.__doc__ = getattr(original, "__doc__", None)
    return made


#: The code of every :func:`_slot_wrapper` function (two shapes, one code object each).
_UNARY_CODE: CodeType = cast("FunctionType", _slot_wrapper("__bool__", len)).__code__
_BINARY_CODE: CodeType = cast("FunctionType", _slot_wrapper("__eq__", len)).__code__


def _module_call_codes() -> frozenset[CodeType]:
    """The code objects torch runs when a module is called (``module(x)``)."""
    from torch import nn

    codes = set()
    for name in ("_wrapped_call_impl", "_call_impl"):
        function = getattr(nn.Module, name, None)
        code = getattr(function, "__code__", None)
        if isinstance(code, CodeType):
            codes.add(code)
    # One range per call: the outer method when both exist.
    wrapped = getattr(getattr(nn.Module, "_wrapped_call_impl", None), "__code__", None)
    return frozenset({wrapped} if isinstance(wrapped, CodeType) else codes)


def _torch_frame_names() -> dict[CodeType, str]:
    """torch's own functions that get a frame, named as torch's tracer names them: a tensor's
    formatting (``print(loss)``, ``f"{loss:.3f}"``), so its operators are known to be that."""
    import torch

    names: dict[CodeType, str] = {}
    prefixes = _path_prefixes()
    for function in (torch.Tensor.__repr__, torch.Tensor.__format__):
        code = getattr(function, "__code__", None)
        if not isinstance(code, CodeType):
            continue
        path = code.co_filename
        for prefix in prefixes:
            if path.startswith(prefix):
                path = path[len(prefix) :]
                break
        names[code] = f"{FRAME_MARK}{path}({code.co_firstlineno}): {code.co_name}"
    return names


def _torch_folder() -> str:
    """The folder torch is installed in (with a trailing separator)."""
    import torch

    return os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "")


def _torch_function(function: object) -> bool:
    """True for a C function or method of torch: ``Tensor.item``, ``torch.nonzero``, ``x.cuda`` ..."""
    module = getattr(function, "__module__", None)
    if isinstance(module, str):
        return module == "torch" or module.startswith(("torch.", "torch._C"))
    owner = getattr(function, "__self__", None)
    if owner is None:
        return False
    kind = owner if isinstance(owner, type) else type(owner)
    return getattr(kind, "__module__", "").startswith("torch")


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
        tracer._unwrap_slots()
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
