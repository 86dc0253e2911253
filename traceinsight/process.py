"""Every process-level speed and memory trick, each with the figure that justifies it.

None changes a result: each only decides when the process does what it must do anyway (import a
library, collect garbage, give memory back, end). The module imports nothing of the package, so
every layer may use it: the analysis (:class:`Beside`), the job's workers
(:func:`give_back_freed_memory`, :func:`threads_per_worker`), the commands (the rest). The chart
child that draws half of a page's charts in a forked process lives with the page
(:mod:`traceinsight.render.html`), and the scanner's head start, which scans a large trace's first
runs while ``analyze`` loads its libraries, with the loader (:mod:`traceinsight.load.head_start`).

The figures are medians of paired runs on the 0.5 GB benchmark traces on a 2-core machine
(``benchmarks/bench_analyze.py``), unless a line says otherwise.
"""

from __future__ import annotations

import contextlib
import gc
import importlib
import importlib.util
import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, suppress
from typing import Final, NoReturn, ParamSpec, TypeVar

from traceinsight.cores import available_cores

__all__ = [
    "ALLOCATOR_OPTIONS",
    "ALLOCATOR_VARIABLE",
    "BLAS_VARIABLE",
    "LOAD_SETTINGS",
    "Beside",
    "collector_paused",
    "ends_at_once",
    "flush_and_exit",
    "give_back_freed_memory",
    "libraries_loading",
    "prepare_beside",
    "quiet_blas",
    "threads_per_worker",
    "work_done",
]

_P = ParamSpec("_P")
_T = TypeVar("_T")

# --- the libraries' settings, read once when they load --------------------------------------------

#: jemalloc's options for polars (its builds prefix the variable with ``_RJEM_``). polars'
#: allocator is built with a 500 ms decay of dirty pages and 1 s of muzzy ones: it keeps freed
#: pages resident that long, so each stage of an analysis adds the last one's garbage to the peak.
#: Asked to give them back after 100 ms, from a thread of its own: on a 0.5 GB DDP trace the peak
#: falls from 532 to 463 MiB (below the file's size) for about 4 % more wall time (5 paired runs).
ALLOCATOR_VARIABLE: Final = "_RJEM_MALLOC_CONF"
ALLOCATOR_OPTIONS: Final = "background_thread:true,dirty_decay_ms:100,muzzy_decay_ms:0"
#: numpy's OpenBLAS starts a thread per core that spins after each call; nothing here multiplies
#: matrices, and on two cores the spinning took ~1 % of the time from the scanner.
BLAS_VARIABLE: Final = "OPENBLAS_NUM_THREADS"
#: What a command sets while the libraries load, unless the user set it.
LOAD_SETTINGS: Final = {ALLOCATOR_VARIABLE: ALLOCATOR_OPTIONS, BLAS_VARIABLE: "1"}


@contextmanager
def _settings(settings: dict[str, str]) -> Iterator[None]:
    """``settings`` in the environment inside (a value the user set is kept), gone again after."""
    ours = [name for name in settings if name not in os.environ]
    for name in ours:
        os.environ[name] = settings[name]
    try:
        yield
    finally:
        for name in ours:
            os.environ.pop(name, None)


class _Frozen:
    """Whether what the command's imports made was frozen already (once a process)."""

    done = False


@contextmanager
def libraries_loading() -> Iterator[None]:
    """Inside: the command's libraries load as it wants them (:data:`LOAD_SETTINGS`, the collector
    paused); after: what the imports made is frozen (once a process).

    The settings are read once, when the libraries load, and are taken out of the environment
    again, so a script under ``traceinsight run`` never sees them. A command imports what it needs
    (polars, numpy, the analyses) inside, at the start of its work, never at the start of the
    process: ``--help`` and ``--version`` load none of it (0.8 s before, see ``tests/test_layers.py``).
    The imports make next to no garbage (about 1,800 objects for the collector), and what they make
    lives to the end: frozen, the cyclic collector need not walk it again each time an analysis
    makes objects (it took ~1 % of a run).
    """
    with _settings(LOAD_SETTINGS), collector_paused():
        importlib.import_module("numpy")
        importlib.import_module("polars")
        yield
    if not _Frozen.done:
        _Frozen.done = True
        gc.freeze()


def quiet_blas() -> None:
    """One BLAS thread for the rest of the process (``analyze`` and ``diff``; ``run`` keeps the
    user's): numpy's OpenBLAS starts a spinning thread per core at import, and matplotlib imports
    numpy again for the page (see :data:`BLAS_VARIABLE`)."""
    os.environ.setdefault(BLAS_VARIABLE, "1")


# --- the cyclic garbage collector -----------------------------------------------------------------


@contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic cyclic collection inside; the collector as it was (on or off) after.

    What an analysis makes lives in polars (outside the collector) or is freed by reference
    counting. On a 0.5 GB trace the collector ran 300-500 times in the main process, 0.11-0.18 s of
    its main thread, and found about 1,000 objects in the plotting library's import (charts are now
    written as SVG without one), 800 in the command's other imports and 9 in the analysis: the same
    on a 0.25 GB and a 1 GB trace, so what it would free does not grow with the trace. The command pauses it while
    its libraries load and while `analyze` reads one trace (a job's ranks keep it), the
    pure-Python loader while it decodes (its structs cannot form a cycle); `run` leaves the user's
    script the collector as it was.
    """
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()


# --- memory given back ----------------------------------------------------------------------------


def give_back_freed_memory() -> None:
    """Return the heap pages the loader freed to the system (glibc's ``malloc_trim``).

    Loading allocates and frees block after block (gunzipped text, scanned columns); glibc keeps
    freed pages of its heap in the process, where the analysis cannot use them (polars has an
    allocator of its own). Trimming once after the load lowers the peak that follows (and a job's
    worker trims again after each rank, so its memory is that of the largest rank it has read);
    elsewhere than glibc it does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


@contextmanager
def threads_per_worker(workers: int) -> Iterator[None]:
    """Give each of a job's worker processes its share of the cores for polars (read when a worker
    imports polars): ``workers`` polars each starting a thread per core would fight over them."""
    key = "POLARS_MAX_THREADS"
    before = os.environ.get(key)
    if before is None:
        os.environ[key] = str(max(1, available_cores() // workers))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(key, None)


# --- work beside the main thread ------------------------------------------------------------------


class Beside:
    """One thread that runs analyses beside the main ones, where there is a second core.

    An analysis is a chain of polars operations, and polars keeps both cores of a 2-core machine
    busy only part of the time (about 1.4 cores on average on a 0.5 GB trace). The analyses that
    need no more than the trace and its steady state (host operators, warnings, optimizer, top
    kernels, precision, memory, collectives) run here, in the order they are started, while the
    main thread finds the intervals, syncs and gaps (polars releases the GIL while it computes);
    the main thread takes their results before it classifies the gaps, its memory peak. On the
    0.5 GB benchmark traces the analysis step takes 0.86x (DDP) to 0.93x (LLM decode) the time;
    the whole process's peak moved by -28 to +17 MiB. Without a second core
    (:func:`traceinsight.cores.second_core`) each runs where it is started. Every analysis is a
    pure function of its inputs, so the results are the same either way.
    """

    def __init__(self, thread: bool) -> None:
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="traceinsight-analysis") if thread else None

    def start(self, analysis: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs) -> Callable[[], _T]:
        """Start ``analysis(*args, **kwargs)``; the function returned gives its result (or raises
        its exception) once it is done."""
        if self._pool is None:
            value = analysis(*args, **kwargs)
            return lambda: value
        return self._pool.submit(analysis, *args, **kwargs).result

    def close(self) -> None:
        """Wait for the running analysis to end; those not yet started are dropped (after an error,
        nothing reads their results)."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)


def _prepare(module: str) -> None:
    with contextlib.suppress(Exception):  # whatever fails here fails again, in one line, when used
        importlib.import_module(module).prepare()


def prepare_beside(module: str) -> None:
    """Import ``module`` and call its ``prepare()``, in a thread of its own, once the trace is loaded.

    The page's renderer imports jinja2 and its own modules (~0.1 s of CPU) and compiles its
    templates (~50 ms). Started once the trace is loaded (the load keeps both cores busy), beside
    the analysis, which leaves a core free part of the time.
    """
    threading.Thread(target=_prepare, args=(module,), daemon=True).start()


# --- the end ---------------------------------------------------------------------------------------


class _Work:
    """Whether the command's work is done in this process (every output written and flushed)."""

    done = False


def work_done() -> None:
    """Say that the command's work is done: the process may end at once (:func:`ends_at_once`)."""
    _Work.done = True


def ends_at_once() -> bool:
    """Whether the command's work is done and the process may end without tearing down
    (:func:`flush_and_exit`)."""
    return _Work.done


def flush_and_exit(code: int) -> NoReturn:
    """Flush stdout and stderr, then end the process at once with ``code``.

    After `analyze` (every output written and flushed) tearing down the tables of a large trace
    takes a noticeable part of a second and changes nothing; `run` ends normally, so the user's
    script's exit handlers still run. Also how a Ctrl-C ends: after an interrupted import the
    interpreter can end itself by SIGINT on the way out (seen 3 runs in 30), which a caller reads
    as another status than the 130 we say.
    """
    for stream in (sys.stdout, sys.stderr):
        with suppress(BrokenPipeError):  # its reader went away (`| head`): what is left is dropped
            stream.flush()
    os._exit(code)
