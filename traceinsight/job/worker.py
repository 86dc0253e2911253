"""A job's local workers: fresh interpreters running :func:`serve`, each analyzing one rank at a
time (:func:`~.rank.analyze_rank`), driven by :class:`Workers`.

A worker is started with ``python -c`` (:data:`_BOOT`), never ``-m``: ``-m`` and ``-c`` put the working
folder first on ``sys.path``, and a job is often analyzed where a stranger's files were unpacked (a
planted ``pickle.py`` or ``traceinsight/`` there would run in every worker). The boot line puts the
folder this package was found in there instead, before anything is imported, and moves stdout aside
before any import could print into the answers. A worker never imports the caller's
``__main__``: ``traceinsight.analyze("traces/")`` works from a plain script with no ``if __name__
== "__main__":`` guard (a ``multiprocessing`` pool, forkserver or spawn, re-imports that script in
every worker, which then starts a pool of its own and dies: ``BrokenProcessPool``). Tasks go in
on the worker's stdin and results come back on its own copy of stdout, pickled, one frame each
(an 8-byte length, then the pickle): between this process and the workers it started, nothing
else reads them. Whatever the analysis prints goes to stderr.

A worker ends with the process that started it: it checks its parent every
:data:`PARENT_CHECK_S` seconds and exits when the parent is gone (killed by ``SIGTERM`` or
``SIGKILL``, whose ``finally`` never runs); ``SIGINT`` at a terminal reaches the whole process
group, and :class:`Workers` stops its workers on the way out of any error.
"""

from __future__ import annotations

import os
import pickle
import queue
import struct
import subprocess
import sys
import threading
import time
import traceback
from pathlib import Path
from types import TracebackType
from typing import IO, Final

from traceinsight.errors import TraceInsightError
from traceinsight.job.rank import RankTask, analyze_rank
from traceinsight.results.job import RankResult

__all__ = ["PARENT_CHECK_S", "WorkerError", "WorkerTraceback", "Workers", "serve"]

#: How often a worker looks whether the process that started it is still there.
PARENT_CHECK_S: Final = 0.5
#: A worker's command line after ``python -c``; its arguments: the folder holding this package, the
#: parent's pid. The working folder ``-c`` put first on ``sys.path`` is dropped before any import
#: (replaced by the package's folder where the path lacks it: a script put it there itself),
#: and stdout (fd 1) is kept for the answers and pointed at stderr before the analysis is imported.
_BOOT: Final = (
    "import os, sys; p = sys.argv[1]; sys.path[0:1] = [] if p in sys.path[1:] else [p]; "
    "answers = os.dup(1); os.dup2(2, 1); "
    "from traceinsight.job.worker import serve; serve(int(sys.argv[2]), answers)"
)
_LENGTH: Final = struct.Struct("<Q")


class WorkerDied(TraceInsightError):
    """A worker process ended without answering (killed, out of memory)."""


def _send(stream: IO[bytes], value: object) -> None:
    data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
    stream.write(_LENGTH.pack(len(data)) + data)
    stream.flush()


def _receive(stream: IO[bytes]) -> object | None:
    """The next frame's value; None at the end of the stream."""
    head = stream.read(_LENGTH.size)
    if len(head) < _LENGTH.size:
        return None
    (length,) = _LENGTH.unpack(head)
    data = stream.read(length)
    if len(data) < length:
        return None
    value: object = pickle.loads(data)  # written by the process that started this one (or it)
    return value


def _watch_parent(parent: int) -> None:
    """Exit this process once ``parent`` is no longer its parent (it ended)."""
    while os.getppid() == parent:
        time.sleep(PARENT_CHECK_S)
    os._exit(1)


class Workers:
    """``size`` worker processes; :meth:`run` analyzes one rank on an idle one (call it from up to
    ``size`` threads at once). A context manager: leaving it stops every worker."""

    def __init__(self, size: int) -> None:
        # The package where this process found it (a script may have put it on sys.path itself).
        package_parent = str(Path(__file__).resolve().parents[2])
        command = [sys.executable, "-c", _BOOT, package_parent, str(os.getpid())]
        self._started: list[subprocess.Popen[bytes]] = []
        self._idle: queue.SimpleQueue[subprocess.Popen[bytes] | None] = queue.SimpleQueue()
        try:
            for _ in range(size):
                worker = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
                self._started.append(worker)
                self._idle.put(worker)
        except BaseException:
            self.close()
            raise

    def run(self, task: RankTask) -> RankResult:
        """``analyze_rank(task)`` in a worker: its result, or the error it raised, raised here."""
        worker = self._idle.get()
        if worker is None:  # closed
            raise WorkerDied("the job's workers were stopped")
        assert worker.stdin is not None and worker.stdout is not None
        try:
            _send(worker.stdin, task)
            answer = _receive(worker.stdout)
        except OSError:
            answer = None
        if answer is None:
            raise WorkerDied(
                f"the worker analyzing {task.shown_path or task.path} ended without a result (exit status "
                f"{worker.wait()}); if it ran out of memory, give fewer --workers"
            )
        self._idle.put(worker)
        if isinstance(answer, tuple) and len(answer) == 2 and isinstance(answer[1], RankResult):
            return answer[1]
        if isinstance(answer, tuple) and len(answer) == 3 and isinstance(answer[1], BaseException):
            if isinstance(answer[2], str) and answer[2]:  # a bug: where it happened, in the worker
                shown = task.shown_path or task.path
                raise answer[1] from WorkerTraceback(f"in the worker analyzing {shown}:\n{answer[2]}")
            raise answer[1]
        raise WorkerDied(
            f"the worker analyzing {task.shown_path or task.path} answered {type(answer).__name__}"
        )

    def close(self) -> None:
        """Stop every worker, and wake every :meth:`run` waiting for one."""
        for _ in self._started:
            self._idle.put(None)
        for worker in self._started:
            if worker.stdin is not None:
                worker.stdin.close()
            worker.kill()
        for worker in self._started:
            worker.wait()
            if worker.stdout is not None:
                worker.stdout.close()

    def __enter__(self) -> Workers:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, trace: TracebackType | None
    ) -> None:
        self.close()


class WorkerError(Exception):
    """A bug in a worker whose own error could not cross back (it does not pickle, or does not
    rebuild from its pickle): its words."""


def _crossable(answer: tuple[object, ...]) -> tuple[object, ...]:
    """An error's answer ``(False, error, traceback)`` as the process that asked can read it back:
    an error that does not pickle, or does not rebuild from its pickle (an ``__init__`` taking other
    arguments than it gave ``Exception``), sent as its words, a bug's still with its traceback."""
    _, error, text = answer
    try:
        pickle.loads(pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL))
        return answer
    except Exception as failure:
        words = f"{type(error).__name__}: {error} (sent back as words: {type(failure).__name__})"
        return (False, WorkerError(words) if text else TraceInsightError(words), text)


class WorkerTraceback(Exception):
    """Where a worker's error happened: its traceback there, as text (the cause of the error raised
    again here, shown under ``TRACEINSIGHT_DEBUG=1``)."""

    def __str__(self) -> str:
        return str(self.args[0])


def serve(parent: int, answers_fd: int) -> None:
    """A worker's loop: each task read from stdin analyzed, its result (or error) written back on
    ``answers_fd`` (the worker's stdout, kept aside by :data:`_BOOT`)."""
    threading.Thread(target=_watch_parent, args=(parent,), daemon=True, name="traceinsight-parent").start()
    tasks = os.fdopen(os.dup(0), "rb")
    answers = os.fdopen(answers_fd, "wb")
    while (task := _receive(tasks)) is not None:
        assert isinstance(task, RankTask)
        try:
            answer: tuple[object, ...] = (True, analyze_rank(task))
        except TraceInsightError as error:  # what is wrong with the rank's file: its one line
            answer = (False, error, "")
        except Exception as error:  # a bug: raised again where the task came from, with its traceback
            answer = (False, error, traceback.format_exc())
        if answer[0]:
            try:
                _send(answers, answer)  # (pickled whole before a byte is written)
                continue
            except Exception as error:  # a result that does not pickle: a bug
                answer = (
                    False,
                    WorkerError(f"the rank's result cannot be sent back: {error}"),
                    traceback.format_exc(),
                )
        _send(answers, _crossable(answer))
