"""The DataLoader's fetch records as one range: its operators are not collected while a window records.

Why. A Python-heavy Dataset runs hundreds of torch operators per sample (torchvision's FakeData
with ToTensor and Normalize: reseeding, ``randn``, ``item``, ``mul``, ``div``, ``sub_`` …, ~1,600
per batch of 64), and the profiler pays for each one (a record with its input shapes): mnist on
FakeData took 1.3-1.7 × as long per batch under ``run`` as alone, with the frame tracer already
off there (:mod:`.frames`). What the training step's findings need from the fetch is how long the
loop waited for it: the ``enumerate(DataLoader)#…__next__`` range, which torch opens in
``__next__`` around the fetch.

How. The fetch proper (sampler, Dataset, transforms, collate, pin memory; with workers, the wait on
their queue) runs inside that range, which ``__next__`` opens with
``torch.autograd.profiler.record_function``. Each DataLoader iterator class gets a ``__next__`` of
the same code that reads that name as a ``record_function`` of ours (:func:`_next_seeing`): right
after the range opens it removes the frame tracer's profile function (on any thread; :mod:`.frames`)
and, while a window records and the profiler is on in this thread, switches CPU operator
collection off (``torch.profiler``'s ``toggle_collection_dynamic``: the profiler's record-function
callback is removed from this thread and pushed back after); right before the range closes it puts
both back. So the range and everything outside the fetch are recorded as before, and no frame of
ours is on the stack while the Dataset runs: a wrapper around ``_next_data`` was one more frame
under every sample, and a Dataset that formats its stack (``torch.manual_seed`` does, per call,
without CUDA) paid 4-5 % of its fetch per frame (measured in one process, conditions interleaved).
``record_function`` itself stays torch's everywhere else. GPU activity (CUPTI) is never switched
off. Only the thread that started the profiler toggles (the callback is per thread), only the
outermost fetch (a Dataset that iterates a DataLoader of its own), and only in the process that
started it (not in forked workers). Any call of the recorder into the profiler (a step boundary, a
stop for the memory budget) first switches collection back on (:meth:`FetchOpsPaused.resume`): it
then stays on for the rest of that fetch.

torch 2.13 logs a warning on each toggle ("Toggling CPU activity with GPU activity on …", printed
whatever activities are on: its test is ``!CUDA || !XPU``); it goes to descriptor 2 from C++, so
the toggles run with descriptor 2 pointed at a file kept for the purpose, and what else was written
meanwhile is copied back to the real stderr.

The trace says so: :attr:`FetchOpsPaused.used` becomes true at the first paused fetch, and the
recorder writes ``"loaderFetch": "range only"`` in the trace's ``traceinsight`` record.
"""

from __future__ import annotations

import contextlib
import os
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from types import FunctionType
from typing import Any

from traceinsight.load.taxonomy import LOADER_FETCH_RANGE_ONLY

__all__ = ["LOADER_FETCH_RANGE_ONLY", "FetchOpsPaused"]

#: How the DataLoader's ``__next__`` names its range (``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``).
LOADER_RANGE_PREFIX = "enumerate(DataLoader)#"

#: What torch logs on each toggle (dropped from the stderr copied back).
_TOGGLE_WARNING = b"Toggling CPU activity with GPU activity on"


class FetchOpsPaused:
    """Pauses CPU operator collection and the frame tracer inside each DataLoader fetch while
    ``recording()`` is true, from the fetch's own ``enumerate(DataLoader)#…`` range (see the module
    doc)."""

    def __init__(self, recording: Callable[[], bool], tracing: Callable[[object], bool]) -> None:
        self._recording = recording
        self._tracing = tracing
        self._patched: list[tuple[type, Any]] = []
        self._owner_pid = os.getpid()
        self._owner_thread = threading.get_ident()
        self._paused = False
        self._depth = 0
        self._toggle: Callable[[bool, Any], Any] | None = None
        self._profiler_enabled: Callable[[], bool] | None = None
        self._cpu: Any = None
        self._log: int | None = None
        self.used = False
        """True once a fetch ran with collection paused (the trace then says so)."""

    def install(self) -> None:
        """Give each DataLoader iterator class a ``__next__`` of the same code that opens its range
        with a ``record_function`` of ours (see :func:`_next_seeing`)."""
        try:
            from torch._C._autograd import _profiler_enabled, _toggle_collection_dynamic
            from torch.profiler import ProfilerActivity
            from torch.utils.data.dataloader import _BaseDataLoaderIter
        except ImportError:
            return  # a torch without dynamic toggling: the fetch is recorded as before
        self._toggle = _toggle_collection_dynamic
        self._profiler_enabled = _profiler_enabled
        self._cpu = {ProfilerActivity.CPU}
        self._owner_thread = threading.get_ident()
        for kind in _subclasses(_BaseDataLoaderIter):
            original = kind.__dict__.get("__next__")
            replaced = _next_seeing(original, self) if isinstance(original, FunctionType) else None
            if replaced is not None:
                self._patched.append((kind, original))
                setattr(kind, "__next__", replaced)  # noqa: B010 (a method is replaced)

    def remove(self) -> None:
        """Put the original methods back (collection is on again: :meth:`resume`)."""
        self.resume()
        while self._patched:
            kind, original = self._patched.pop()
            setattr(kind, "__next__", original)  # noqa: B010
        log, self._log = self._log, None
        if log is not None:
            os.close(log)

    def resume(self) -> None:
        """Switch collection back on now if a fetch paused it (before any call into the profiler)."""
        if self._paused and threading.get_ident() == self._owner_thread:
            self._paused = False
            self._switch(True)

    def entered(self) -> tuple[object, bool]:
        """A fetch's range was opened: the frame tracer's function off (returned, to put back), and
        collection paused when this is the outermost fetch of the recording thread."""
        hook = sys.getprofile()
        traced = hook is not None and self._tracing(hook)
        if traced:
            sys.setprofile(None)  # the frame tracer's function: not inside the fetch (frames.py)
        counted = self._may_pause()
        if counted:
            self._depth += 1
            if self._depth == 1:
                self._pause()
        return (hook if traced else None), counted

    def leaving(self, hook: object, counted: bool) -> None:
        """The fetch's range is about to close: collection and the frame tracer back as they were."""
        if counted:
            self._depth -= 1
            if self._depth == 0:
                self.resume()
        if hook is not None and self._tracing(hook):
            sys.setprofile(hook)  # type: ignore[arg-type]

    def _may_pause(self) -> bool:
        return (
            self._toggle is not None
            and os.getpid() == self._owner_pid
            and threading.get_ident() == self._owner_thread
        )

    def _pause(self) -> bool:
        """Switch collection off when a window records with the profiler on in this thread."""
        if self._paused or not self._recording() or self._profiler_enabled is None:
            return False
        if not self._profiler_enabled():
            return False
        if not self._switch(False):
            return False
        self._paused = self.used = True
        return True

    def _switch(self, enable: bool) -> bool:
        """One toggle, with torch's warning kept off the script's stderr; False if torch refused."""
        if self._toggle is None:
            return False
        with self._warning_dropped():
            try:
                self._toggle(enable, self._cpu)
            except RuntimeError:
                return False  # no profiler state in this thread any more: nothing to switch
        return True

    @contextlib.contextmanager
    def _warning_dropped(self) -> Iterator[None]:
        """Descriptor 2 goes to a file of ours in this block; what else was written comes back."""
        with contextlib.suppress(AttributeError, OSError, ValueError):
            sys.stderr.flush()
        try:
            if self._log is None:
                self._log = _unnamed_file()
            saved = os.dup(2)
        except OSError:
            yield
            return
        log = self._log
        try:
            os.dup2(log, 2)
            try:
                yield
            finally:
                os.dup2(saved, 2)
                _copy_back(log)
        finally:
            os.close(saved)


def _next_seeing(original: FunctionType, pauser: FetchOpsPaused) -> FunctionType | None:
    """torch's ``__next__`` (the same code) reading ``torch.autograd.profiler.record_function`` as
    a class of ours, which pauses inside the ``enumerate(DataLoader)#…`` range it opens (after the
    range opens, before it closes: the range and what is around it are recorded as before). Not a
    wrapper: no frame of ours is on the stack while the fetch runs (a Dataset that formats its stack,
    as ``torch.manual_seed`` does per call, pays for each one), and ``record_function`` stays torch's
    everywhere else (TorchScript compiles it). None when ``__next__`` does not read it so."""
    torch = original.__globals__.get("torch")
    opener = getattr(getattr(getattr(torch, "autograd", None), "profiler", None), "record_function", None)
    if torch is None or not isinstance(opener, type) or "torch" not in original.__code__.co_names:
        return None

    class record_function(opener):  # type: ignore[valid-type,misc]
        __doc__ = opener.__doc__

        def __enter__(self) -> Any:
            entered = super().__enter__()
            name = getattr(self, "name", None)
            if isinstance(name, str) and name.startswith(LOADER_RANGE_PREFIX):
                self._traceinsight_fetch = pauser.entered()
            return entered

        def __exit__(self, *exc_info: object) -> Any:
            fetch = self.__dict__.pop("_traceinsight_fetch", None)
            if fetch is not None:
                pauser.leaving(*fetch)
            return super().__exit__(*exc_info)

    profiler = _Overlay(torch.autograd.profiler, record_function=record_function)
    seen = _Overlay(torch, autograd=_Overlay(torch.autograd, profiler=profiler))
    replaced = FunctionType(
        original.__code__,
        {**original.__globals__, "torch": seen},
        original.__name__,
        original.__defaults__,
        original.__closure__,
    )
    replaced.__kwdefaults__ = original.__kwdefaults__
    replaced.__qualname__ = original.__qualname__
    replaced.__doc__ = original.__doc__
    replaced.__module__ = original.__module__
    replaced.__dict__.update(original.__dict__)
    return replaced


class _Overlay:
    """A module as one function sees it: some attributes replaced, the rest read from the module."""

    def __init__(self, base: object, **replaced: object) -> None:
        self.__dict__.update(replaced)
        self._overlay_base = base

    def __getattr__(self, name: str) -> Any:
        return getattr(self._overlay_base, name)


def _unnamed_file() -> int:
    """A descriptor of a temporary file that has no name any more (closed by :meth:`remove`)."""
    handle, name = tempfile.mkstemp(prefix="traceinsight-stderr-")
    os.unlink(name)
    return handle


def _copy_back(log: int) -> None:
    """What the block wrote to descriptor 2, except torch's toggle warning, to the real stderr."""
    size = os.lseek(log, 0, os.SEEK_CUR)
    if not size:
        return
    written = os.pread(log, size, 0)
    os.ftruncate(log, 0)
    os.lseek(log, 0, os.SEEK_SET)
    kept = b"".join(line for line in written.splitlines(keepends=True) if _TOGGLE_WARNING not in line)
    with contextlib.suppress(OSError):
        while kept:
            kept = kept[os.write(2, kept) :]


def _subclasses(kind: type) -> list[type]:
    """``kind`` and every class derived from it, now."""
    found: list[type] = []
    pending = [kind]
    while pending:
        current = pending.pop()
        if current not in found:
            found.append(current)
            pending.extend(current.__subclasses__())
    return found
