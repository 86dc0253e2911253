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
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from traceinsight.errors import CaptureError

__all__ = [
    "ScriptOutcome",
    "ScriptTarget",
    "exit_like_python",
    "module_target",
    "run_target",
    "script_target",
]

PYTHON_SUFFIXES = (".py", ".pyw")
_SCRIPT_MODULES: list[types.ModuleType] = []
SIGINT_EXIT_STATUS = 128 + signal.SIGINT
#: A terminal escape sequence (``ESC [ … m``), as libraries put in messages for bold or colour:
#: torch's "Weights only load failed" message bolds its warning.
_TERMINAL_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")


@dataclass(frozen=True, slots=True)
class ScriptTarget:
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


@dataclass(frozen=True, slots=True)
class ScriptOutcome:
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


def run_target(target: ScriptTarget) -> ScriptOutcome:
    """Run the script or module as ``__main__`` and return how it ended; never raises for its errors.

    The script's traceback (or ``sys.exit`` message) is printed here, when it ends, as Python would.
    """
    saved_argv = sys.argv[:]
    saved_path = sys.path[:]
    saved_folder = os.getcwd()
    try:
        try:
            if target.is_module:
                sys.argv[:] = ["-m", *target.args]  # run_module replaces argv[0] with the module's file
                with _script_folder_first(os.getcwd()):
                    runpy.run_module(target.name, run_name="__main__", alter_sys=True)
            else:
                sys.argv[:] = [target.name, *target.args]
                script_folder = os.path.dirname(os.path.realpath(target.name))
                with _script_folder_first(script_folder):
                    _run_script_file(os.path.abspath(target.name))
        except SystemExit as exit_request:
            status = _system_exit_status(exit_request)
            return ScriptOutcome(
                exit_status=status,
                failure=_failure_line(exit_request) if status else None,
                parser_exit=_raised_by_parser(exit_request),
            )
        except KeyboardInterrupt as interrupt:
            _show_traceback(interrupt)
            return ScriptOutcome(
                exit_status=SIGINT_EXIT_STATUS, interrupted=True, failure=_failure_line(interrupt)
            )
        except BaseException as error:
            _show_traceback(error)
            return ScriptOutcome(exit_status=1, failure=_failure_line(error))
        return ScriptOutcome(exit_status=0)
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


def _run_script_file(absolute_path: str) -> None:
    """Compile and execute the file as a fresh ``__main__`` module, as ``python FILE`` does."""
    with open(absolute_path, "rb") as source_file:  # bytes: compile() honours the coding cookie
        source = source_file.read()
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
        code = compile(source, absolute_path, "exec", dont_inherit=True)
        exec(code, main_module.__dict__)
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
    while traceback is not None and traceback.tb_frame.f_globals.get("__name__") in (__name__, "runpy"):
        traceback = traceback.tb_next
    error.__traceback__ = traceback
    _flush_standard_streams()
    sys.excepthook(type(error), error, traceback)
    _flush_standard_streams()


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
