"""The `traceinsight` command: `analyze`, `diff` and `run`, a module each, on one typer app.

One place turns the project's exception tree into one line on stderr and an exit code, for every
command (:func:`_one_line_errors`, which every command is registered through): a :class:`~traceinsight.errors.TraceInsightError` is its message and
its ``exit_code`` (2: bad input); running out of memory or a bug, exit 3; never a traceback (unless
``TRACEINSIGHT_DEBUG=1``). A Ctrl-C is one line and status 130. Nothing else in the package prints
an error or exits.

The commands' modules import only typer and the options at first, so ``--help`` and ``--version``
load neither polars nor numpy nor matplotlib; a command loads what it needs when it runs
(:func:`traceinsight.process.libraries_loading`).
"""

from __future__ import annotations

import functools
import os
import shlex
import sys
from collections.abc import Callable
from contextlib import suppress
from typing import TYPE_CHECKING, Annotated, Any, Final, NoReturn, ParamSpec

import typer

from traceinsight.commands import analyze, diff, run
from traceinsight.commands.coercion import QuickCommand, QuickGroup
from traceinsight.commands.options import EXIT_CODES
from traceinsight.errors import TraceInsightError
from traceinsight.process import ends_at_once, flush_and_exit
from traceinsight.version import __version__

if TYPE_CHECKING:
    from traceinsight.capture.script import ScriptCode, ScriptOutcome, StagedRun

__all__ = ["app", "fail", "main"]

_P = ParamSpec("_P")

#: How much of the command line an internal error's line quotes.
_QUOTED: Final = 160


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``traceinsight: error: message`` on stderr; return the Exit to raise.

    The message may quote a file name or a trace: control characters are replaced, so that it
    stays one line and cannot drive the terminal.
    """
    from traceinsight.load.text import printable  # polars (~0.3 s): an error line never waits at --help

    sys.stderr.write(f"traceinsight: error: {printable(message)}\n")
    return typer.Exit(code)


def _one_line_errors(command: Callable[_P, None]) -> Callable[_P, None]:
    """``command`` with every error it raises turned into one line and an exit code (see the module
    doc): what each command is registered as."""

    @functools.wraps(command)
    def run_command(*args: _P.args, **kwargs: _P.kwargs) -> None:
        try:
            command(*args, **kwargs)
        except TraceInsightError as exc:
            raise fail(str(exc), exc.exit_code) from None
        except MemoryError:
            raise fail(
                f"ran out of memory in {_line(command, kwargs)}; try a machine with more memory", 3
            ) from None
        except typer.Exit:
            raise
        except Exception as exc:  # a bug, not bad input: still one line unless debugging
            if os.environ.get("TRACEINSIGHT_DEBUG"):
                raise
            raise fail(
                f"internal error in {_line(command, kwargs)}: {type(exc).__name__}: {exc}; "
                "rerun with TRACEINSIGHT_DEBUG=1 for the traceback and please report it",
                3,
            ) from None

    return run_command


#: The arguments that name what a command works on (its traces, its script), for its error lines.
_SUBJECTS: Final = ("traces", "before", "after", "script")


def _line(command: Callable[..., None], arguments: dict[str, Any]) -> str:
    """``traceinsight analyze t.json``: the command and what it works on (cut to :data:`_QUOTED`)."""
    words = ["traceinsight", command.__name__]
    for name in _SUBJECTS:
        value = arguments.get(name)
        words += [str(item) for item in value] if isinstance(value, list) else [str(value)] if value else []
    line = shlex.join(words)
    return line if len(line) <= _QUOTED else line[: _QUOTED - 1] + "…"


app = typer.Typer(
    name="traceinsight",
    cls=QuickGroup,
    help="Why does my GPU sit idle? Reads torch.profiler traces and names the line to fix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"traceinsight {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Why does my GPU sit idle? Reads torch.profiler traces and names the line to fix."""


app.command(epilog=EXIT_CODES, cls=QuickCommand)(_one_line_errors(analyze.analyze))
app.command(epilog=EXIT_CODES, cls=QuickCommand)(_one_line_errors(diff.diff))
app.command("run", context_settings=run.RUN_CONTEXT_SETTINGS, cls=QuickCommand)(_one_line_errors(run.run))


def _exit_interrupted() -> NoReturn:
    """One line and status 130 (see :func:`traceinsight.process.flush_and_exit`)."""
    with suppress(BrokenPipeError):
        sys.stderr.write("traceinsight: interrupted (Ctrl-C); no output was left half-written\n")
    flush_and_exit(130)


def _interrupted(exit: BaseException) -> bool:
    """Whether ``exit`` is typer's status 130 for a KeyboardInterrupt (it prints nothing itself)."""
    seen: BaseException | None = exit
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def main() -> None:
    """Run the command line (``traceinsight.__main__.main`` does the same with `run`'s script in
    its own frame; here it runs one frame deeper, in :func:`~traceinsight.capture.script.execute`).

    After `analyze` or `diff` (every output written and flushed) the process ends at once
    (:func:`traceinsight.process.flush_and_exit`); `run` ends normally, so the user's script's exit
    handlers still run.
    """
    from traceinsight.capture.script import execute  # `run`'s: see traceinsight.commands.run

    staged = start_main()
    ready = begin_script(staged)
    end_script(staged, None if ready is None else execute(ready))


def start_main() -> StagedRun[int]:
    """Run the command line up to `run`'s script: its staged run (see
    :func:`traceinsight.commands.run.defer_runs`); any other command ends the process here."""
    run.defer_runs()  # `run`'s script starts from the entry point, not under typer's and click's frames
    script = None
    try:
        app()
    except KeyboardInterrupt:  # while typer builds the command, before its own handler
        _exit_interrupted()
    except SystemExit as exc:
        if _interrupted(exc):
            # Ctrl-C before a script ran, or during an analysis (outputs are written whole or not
            # at all); a script's own Ctrl-C is `run`'s, which dies by SIGINT as Python does.
            _exit_interrupted()
        script = run.take_deferred_run() if exc.code in (0, None) else None
        if script is None:
            if not ends_at_once():
                raise
            code = exc.code
    else:
        code = 0
        script = run.take_deferred_run()
    if script is not None:
        return script
    if not isinstance(code, int):
        raise SystemExit(code)
    flush_and_exit(code)


def begin_script(staged: StagedRun[int]) -> ScriptCode | None:
    """Set `run`'s script up (the profiler starts); None when it will not run."""
    try:
        code = staged.start()
    except KeyboardInterrupt:
        _exit_interrupted()
    return code


def end_script(staged: StagedRun[int], outcome: ScriptOutcome | None) -> NoReturn:
    """After `run`'s script: write the trace and the report, exit with the script's status."""
    try:
        status = staged.finish(outcome)
    except KeyboardInterrupt:  # during the analysis that follows the script
        _exit_interrupted()
    raise SystemExit(status)
