"""Runs the user's script in this process exactly as ``python SCRIPT ARGS`` (or ``python -m``) would.

What "exactly" means, checked against CPython 3.10+:

- ``sys.argv`` is ``[SCRIPT as typed, *ARGS]``; ``__name__ == "__main__"``; ``__file__`` is the
  absolute path (not resolving symlinks); ``sys.path[0]`` is the script's folder with symlinks
  resolved. With ``-m``, ``sys.argv[0]`` is the module's file and ``sys.path[0]`` the current
  folder. All of these, and the current folder, are restored afterwards.
- Exit status: 0 at the end; ``sys.exit(n)`` gives n, ``sys.exit(None)`` 0, and
  ``sys.exit("message")`` prints the message to stderr and gives 1; an uncaught exception shows its
  traceback through ``sys.excepthook`` (without our own or runpy's frames) and gives 1; Ctrl-C
  shows the ``KeyboardInterrupt`` traceback and the process should then die by SIGINT, as Python
  does (:func:`exit_like_python`).

A script file is compiled and executed directly (not with ``runpy.run_path``, which would set
``sys.argv[0]`` to the path it is given and so could not keep both ``argv[0]`` as typed and
``__file__`` absolute); a module goes through ``runpy.run_module``, as ``python -m`` does.

Frames above the script. A script that walks its stack pays for every frame above it:
``traceback.format_stack``, which ``torch.manual_seed`` calls once per call on a machine whose
CUDA is not initialised (a Dataset reseeding per sample: 64 calls per batch), formats each one
(in 3.11 with the caret anchors of its line, parsed). So the run is set up in stages
(:class:`StagedRun`): generators prepare the script and hand it over (:class:`ScriptCode`), the
entry point runs it in its own frame (``exec``), and the generators, suspended meanwhile (so not
on the stack), are resumed with how it ended (:func:`outcome_of`) to restore what they changed.
:func:`run_target` and :func:`drive` do all of it in one call, one frame deeper.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import importlib.util
import os
import re
import runpy
import signal
import sys
import types
from collections.abc import Callable, Generator, Iterator
from contextlib import contextmanager, suppress
from functools import partial
from pathlib import Path
from typing import Any, Generic, TypeVar

from traceinsight.errors import CaptureError
from traceinsight.model import Model

__all__ = [
    "ScriptCode",
    "ScriptOutcome",
    "ScriptSteps",
    "ScriptTarget",
    "StagedRun",
    "drive",
    "execute",
    "exit_like_python",
    "module_target",
    "outcome_of",
    "run_target",
    "run_target_steps",
    "script_target",
]

PYTHON_SUFFIXES = (".py", ".pyw")
_SCRIPT_MODULES: list[types.ModuleType] = []
SIGINT_EXIT_STATUS = 128 + signal.SIGINT
#: A terminal escape sequence (``ESC [ … m``), as libraries put in messages for bold or colour:
#: torch's "Weights only load failed" message bolds its warning.
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


class ScriptTarget(Model, frozen=True):
    """What to run: a script file or a module, and the arguments that follow it."""

    name: str
    """The script path as typed, or the module name."""
    args: tuple[str, ...]
    """Everything after the script on the command line, untouched."""
    is_module: bool = False
    """True for ``-m`` (``name`` is a module name)."""

    @property
    def stem(self) -> str:
        """A short name for output files: the script's stem or the module's dotted name."""
        return self.name if self.is_module else Path(self.name).stem


class ScriptOutcome(Model, frozen=True):
    """How the script ended, in Python's terms."""

    exit_status: int
    """The status ``python SCRIPT`` would exit with (130 for Ctrl-C, where Python dies by SIGINT)."""
    interrupted: bool = False
    """True when the script ended with ``KeyboardInterrupt`` (Ctrl-C)."""
    failure: str | None = None
    """How it failed, one line: ``ValueError: bad shape at train.py:47`` (None when it exited 0)."""
    parser_exit: bool = False
    """True when an argument parser ended it (``--help``, a usage error): argparse, optparse, click."""


def script_target(script: str, args: tuple[str, ...]) -> ScriptTarget:
    """Check that ``script`` is a Python file that can be run; raise :class:`CaptureError` if not."""
    path = Path(script)
    if not path.exists():
        raise CaptureError(f"cannot run {script}: no such file; check the path (or use -m for a module)")
    if path.is_dir():
        raise CaptureError(
            f"cannot run {script}: it is a folder, not a Python file; pass the script inside it"
        )
    if path.suffix not in PYTHON_SUFFIXES and not _has_python_shebang(path):
        raise CaptureError(
            f"cannot run {script}: not a Python file (expected a .py script); "
            "pass the training script, e.g. traceinsight run train.py"
        )
    if not os.access(path, os.R_OK):
        raise CaptureError(f"cannot run {script}: permission denied; make the file readable")
    return ScriptTarget(name=script, args=args)


def module_target(module: str, args: tuple[str, ...]) -> ScriptTarget:
    """Check that ``module`` can be run like ``python -m``; raise :class:`CaptureError` if not."""
    with _script_folder_first(os.getcwd()):
        try:
            spec = importlib.util.find_spec(module)
            if spec is not None and spec.submodule_search_locations is not None:
                spec = importlib.util.find_spec(f"{module}.__main__")
        except (ImportError, ValueError) as error:
            raise CaptureError(f"cannot run module {module}: {error}; check the module name") from None
    if spec is None:
        raise CaptureError(
            f"cannot run module {module}: no such module (or package without __main__) from "
            f"{os.getcwd()}; check the name and the current folder"
        )
    return ScriptTarget(name=module, args=args, is_module=True)


class ScriptCode(Model, frozen=True):
    """The script, ready to run: ``exec(code, namespace)`` for a file (nothing of ours between the
    runner's frame and the script's), or ``call()`` for a module (through runpy, as ``python -m``)."""

    code: types.CodeType | None = None
    namespace: dict[str, Any] | None = None
    call: Callable[[], object] | None = None


_Result = TypeVar("_Result")

ScriptSteps = Generator[ScriptCode, ScriptOutcome, _Result]
"""Stages of a run: yields the script once, is sent how it ended, returns its result."""


class StagedRun(Generic[_Result]):
    """Runs :data:`ScriptSteps` with the script in the caller's frame (see the module doc):
    ``ready = staged.start()``; the caller runs ``ready`` (:func:`execute`, or ``exec`` inline) and
    makes its :class:`ScriptOutcome` (:func:`outcome_of`); ``staged.finish(outcome)``."""

    def __init__(self, steps: ScriptSteps[_Result]) -> None:
        self._steps = steps
        self._ended: tuple[_Result] | None = None

    def start(self) -> ScriptCode | None:
        """Prepare the script; None when the stages ended without running it (then :meth:`finish`
        gives their result whatever it is passed)."""
        try:
            return next(self._steps)
        except StopIteration as done:
            self._ended = (done.value,)
            return None

    def finish(self, outcome: ScriptOutcome | None) -> _Result:
        """Resume the stages with how the script ended; their result."""
        if self._ended is not None:
            return self._ended[0]
        try:
            self._steps.send(outcome if outcome is not None else ScriptOutcome(exit_status=0))
        except StopIteration as done:
            result: _Result = done.value
            return result
        self._steps.close()
        raise RuntimeError("the run's stages asked to run the script twice")


def execute(ready: ScriptCode) -> ScriptOutcome:
    """Run the prepared script here; how it ended (never raises for its errors)."""
    try:
        if ready.code is not None:
            exec(ready.code, ready.namespace)
        elif ready.call is not None:
            ready.call()
    except BaseException as error:
        return outcome_of(error)
    return ScriptOutcome(exit_status=0)


def drive(steps: ScriptSteps[_Result]) -> _Result:
    """Run the stages and the script in one call (the script one frame deeper than the caller)."""
    staged = StagedRun(steps)
    ready = staged.start()
    return staged.finish(None if ready is None else execute(ready))


def outcome_of(error: BaseException) -> ScriptOutcome:
    """How the script ended when it raised ``error``; its traceback (or ``sys.exit`` message) is
    printed here, as Python would."""
    if isinstance(error, SystemExit):
        status = _system_exit_status(error)
        return ScriptOutcome(
            exit_status=status,
            failure=_failure_line(error) if status else None,
            parser_exit=_raised_by_parser(error),
        )
    _show_traceback(error)
    if isinstance(error, KeyboardInterrupt):
        return ScriptOutcome(exit_status=SIGINT_EXIT_STATUS, interrupted=True, failure=_failure_line(error))
    return ScriptOutcome(exit_status=1, failure=_failure_line(error))


def run_target(target: ScriptTarget) -> ScriptOutcome:
    """Run the script or module as ``__main__`` and return how it ended; never raises for its errors.

    The script's traceback (or ``sys.exit`` message) is printed here, when it ends, as Python would.
    """
    return drive(run_target_steps(target))


def run_target_steps(target: ScriptTarget) -> ScriptSteps[ScriptOutcome]:
    """:func:`run_target` in stages: set ``sys.argv``, ``sys.path`` and ``__main__`` up, hand the
    script over, restore them (and the current folder); returns how it ended."""
    saved_argv = sys.argv[:]
    saved_path = sys.path[:]
    saved_folder = os.getcwd()
    try:
        if target.is_module:
            sys.argv[:] = ["-m", *target.args]  # run_module replaces argv[0] with the module's file
            with _script_folder_first(os.getcwd()):
                run = partial(runpy.run_module, target.name, run_name="__main__", alter_sys=True)
                return (yield ScriptCode(call=run))
        sys.argv[:] = [target.name, *target.args]
        script_folder = os.path.dirname(os.path.realpath(target.name))
        with _script_folder_first(script_folder):
            return (yield from _script_file_steps(os.path.abspath(target.name)))
    finally:
        sys.argv[:] = saved_argv
        sys.path[:] = saved_path
        with suppress(OSError):  # our outputs are named relative to where we started
            os.chdir(saved_folder)
        _flush_standard_streams()


def exit_like_python(outcome: ScriptOutcome) -> int:
    """Return the status to exit with; for Ctrl-C, kill this process by SIGINT as Python does.

    Python re-raises SIGINT on itself after an uncaught ``KeyboardInterrupt`` so that a calling
    shell loop sees "killed by Ctrl-C" (status 130 in the shell) and stops too.
    """
    if outcome.interrupted and hasattr(signal, "SIGINT") and os.name == "posix":
        _flush_standard_streams()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    return outcome.exit_status


def _script_file_steps(absolute_path: str) -> ScriptSteps[ScriptOutcome]:
    """Compile the file and hand it over to run as a fresh ``__main__`` module, as ``python FILE``
    does; how it ended (a file that cannot be read or compiled ends it as Python would)."""
    main_module = types.ModuleType("__main__")
    main_module.__file__ = absolute_path
    main_module.__loader__ = importlib.machinery.SourceFileLoader("__main__", absolute_path)
    main_module.__dict__["__builtins__"] = builtins
    saved_main = sys.modules["__main__"]
    sys.modules["__main__"] = main_module
    # As under python, the script's globals live until the process ends: tearing them down here,
    # while gloo threads may still be finishing work, deadlocked DDP jobs (see distributed.py).
    _SCRIPT_MODULES.append(main_module)
    try:
        try:
            with open(absolute_path, "rb") as source_file:  # bytes: compile() honours the coding cookie
                source = source_file.read()
            code = compile(source, absolute_path, "exec", dont_inherit=True)
        except BaseException as error:
            return outcome_of(error)
        return (yield ScriptCode(code=code, namespace=main_module.__dict__))
    finally:
        sys.modules["__main__"] = saved_main


@contextmanager
def _script_folder_first(folder: str) -> Iterator[None]:
    """Replace ``sys.path[0]`` (this tool's own folder) with the script's, as Python sets it."""
    saved = sys.path[:]
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.append(folder)
    try:
        yield
    finally:
        sys.path[:] = saved


def _system_exit_status(exit_request: SystemExit) -> int:
    """The status Python exits with for ``sys.exit(code)``; prints a non-integer code like Python."""
    code = exit_request.code
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    _flush_standard_streams()
    print(code, file=sys.stderr)
    return 1


def _show_traceback(error: BaseException) -> None:
    """Print the script's traceback as Python would: via ``sys.excepthook``, without our frames."""
    traceback = error.__traceback__
    while traceback is not None and _ours(traceback.tb_frame):
        traceback = traceback.tb_next
    error.__traceback__ = traceback
    _flush_standard_streams()
    sys.excepthook(type(error), error, traceback)
    _flush_standard_streams()


_PACKAGE_FOLDER = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "")


def _ours(frame: types.FrameType) -> bool:
    """True for a frame of this tool (the runner's: ``traceinsight/__main__.py`` runs as
    ``__main__`` under ``python -m``, so its file tells) or of runpy."""
    return frame.f_globals.get("__name__") == "runpy" or frame.f_code.co_filename.startswith(_PACKAGE_FOLDER)


_PARSER_MODULES = ("argparse", "optparse", "getopt", "click")


def _raised_by_parser(exit_request: SystemExit) -> bool:
    """True when an argument parser's frame is on the way to ``sys.exit`` (``--help``, bad options)."""
    traceback = exit_request.__traceback__
    while traceback is not None:
        module = str(traceback.tb_frame.f_globals.get("__name__", ""))
        if module.split(".")[0] in _PARSER_MODULES:
            return True
        traceback = traceback.tb_next
    return False


def _failure_line(error: BaseException) -> str:
    """``Type: message at file:line``, the line being the innermost frame of the user's own code.

    The report shows it as text: terminal escapes in the message are dropped, and any other
    control character is replaced."""
    from traceinsight.load.taxonomy import is_user_file
    from traceinsight.load.text import printable

    where = None
    traceback = error.__traceback__
    while traceback is not None:
        path = traceback.tb_frame.f_code.co_filename
        if os.path.isabs(path) and is_user_file(path):
            where = f"{_short_path(path)}:{traceback.tb_lineno}"
        traceback = traceback.tb_next
    if isinstance(error, SystemExit):
        what = f"sys.exit({error.code!r})"
    else:
        message = str(error).strip().splitlines()
        what = f"{type(error).__name__}: {message[0].rstrip()}" if message else type(error).__name__
    what = _TERMINAL_ESCAPE.sub("", what)
    return printable(f"{what} at {where}" if where else what)


def _short_path(path: str) -> str:
    """``path`` relative to the current folder when it is inside it."""
    relative = os.path.relpath(path)
    return path if relative.startswith("..") else relative


def _has_python_shebang(path: Path) -> bool:
    try:
        with path.open("rb") as script_file:
            first_line = script_file.readline(200)
    except OSError:
        return False
    return first_line.startswith(b"#!") and b"python" in first_line


def _flush_standard_streams() -> None:
    for stream in (sys.stdout, sys.stderr):
        with suppress(AttributeError, OSError, ValueError):  # closed or replaced by the script
            stream.flush()
