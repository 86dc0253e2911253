"""The `traceinsight` command: thin typer commands; errors become one line on stderr."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from traceinsight import __version__
from traceinsight.config import read_config
from traceinsight.errors import ConfigError, TraceInsightError
from traceinsight.thresholds import Thresholds

_DEFAULTS = Thresholds()

app = typer.Typer(
    name="traceinsight",
    help="Why does my GPU sit idle? Reads torch.profiler traces and names the line to fix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)


#: Set by a finished `analyze`: the process may then skip tearing down its objects (see :func:`main`).
_analysis_done = False


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``traceinsight: error: message`` on stderr; return the Exit to raise.

    The message may quote a file name or a trace: control characters are replaced, so that it
    stays one line and cannot drive the terminal.
    """
    from traceinsight.load.text import printable

    sys.stderr.write(f"traceinsight: error: {printable(message)}\n")
    return typer.Exit(code)


_SIZE = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(b|[kmgt]i?b?)?\s*")
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """``500MB``, ``2GB``, ``1.5GiB``, ``4096`` → bytes (k/M/G/T are powers of 1000, with i of 1024)."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ConfigError(f"--max-size {text!r}: not a size; write it like 500MB, 2GB or 8GiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    scale = 1024 ** ("kmgt".index(unit[0]) + 1) if len(unit) > 1 and unit[1] == "i" else _UNITS[unit[:1]]
    return int(number * scale)


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


@app.command()
def analyze(
    trace: Annotated[
        Path,
        # readable=False: the loader words an unreadable file in one line, not typer's usage box.
        typer.Argument(help="A torch.profiler trace: .json or .json.gz.", show_default=False, readable=False),
    ],
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", help="Where to write the HTML report [default: ./<trace name>.html]."),
    ] = None,
    json_out: Annotated[
        str | None,
        typer.Option("--json", help="Also write the full result as JSON to PATH ('-' for stdout)."),
    ] = None,
    no_html: Annotated[bool, typer.Option("--no-html", help="Do not write the HTML report.")] = False,
    min_gap_us: Annotated[
        float, typer.Option(help="Shortest GPU idle stretch reported as a gap, in µs.", min=0)
    ] = _DEFAULTS.min_gap_us,
    low_utilization: Annotated[
        float, typer.Option(help="GPU compute share below which low-gpu-utilization fires.", min=0, max=1)
    ] = _DEFAULTS.low_utilization,
    user_code: Annotated[
        list[str] | None,
        typer.Option(
            "--user-code",
            metavar="PACKAGE",
            help="A package whose frames are your own code, for source lines (repeatable; also "
            "`user-code` in [tool.traceinsight] of pyproject.toml).",
            show_default=False,
        ),
    ] = None,
    source_root: Annotated[
        Path | None,
        typer.Option(
            "--source-root",
            help="Show code excerpts in the report, read from .py files inside DIR only "
            "[default: source-root of [tool.traceinsight] in pyproject.toml, else no excerpts].",
            metavar="DIR",
            readable=False,
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Let the default report path replace a file that is not a report.")
    ] = False,
    max_size: Annotated[
        str | None,
        typer.Option(
            "--max-size",
            help="Refuse traces holding more JSON than SIZE (e.g. 8GB) [default: refuse gzip files that "
            "expand more than 200 times, past 1 GiB].",
            metavar="SIZE",
        ),
    ] = None,
) -> None:
    """Measure GPU idle gaps, copy overlap and sync hot spots in TRACE; print a summary, write a report."""
    # numpy's OpenBLAS starts a spinning thread per core at import; nothing here uses BLAS, and on
    # a 2-core machine those threads take CPU from the loader's. (Only here: `run` keeps the user's.)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from traceinsight.load.progress import terminal_progress
    from traceinsight.pipeline import analyze_and_write

    global _analysis_done
    thresholds = Thresholds(min_gap_us=min_gap_us, low_utilization=low_utilization)
    try:
        config = read_config()
        packages = tuple(dict.fromkeys([*(user_code or ()), *config.user_code]))
        from traceinsight.load import SizeLimit

        limit = SizeLimit(parse_size(max_size) if max_size is not None else None)
        with terminal_progress(f"reading {trace.name}") as progress:
            analyze_and_write(
                trace,
                html=output,
                json_out=json_out,
                thresholds=thresholds,
                write_html=not no_html,
                progress=progress,
                user_code=packages,
                source_root=_source_root(source_root),
                force=force,
                limit=limit,
            )
        _analysis_done = True
    except TraceInsightError as exc:
        raise fail(str(exc), exc.exit_code) from None
    except MemoryError:
        raise fail(f"ran out of memory analyzing {trace}; try a machine with more memory", 3) from None
    except Exception as exc:  # a bug, not bad input: still one line unless debugging
        if os.environ.get("TRACEINSIGHT_DEBUG"):
            raise
        raise fail(
            f"internal error analyzing {trace}: {type(exc).__name__}: {exc}; "
            "rerun with TRACEINSIGHT_DEBUG=1 for the traceback and please report it",
            3,
        ) from None


def _source_root(option: Path | None) -> Path | None:
    """The folder report excerpts may be read from: ``--source-root``, else ``source-root`` of the
    ``[tool.traceinsight]`` table, else None (no excerpts)."""
    if option is None:
        from traceinsight.config import read_config

        return read_config().source_root
    if not option.is_dir():
        raise ConfigError(
            f"--source-root {option}: no such folder; name the project folder the trace's code is in"
        )
    return option


def _register_run() -> None:
    """`run` lives with capture, the only part of the package that imports torch (lazily)."""
    try:
        from traceinsight.capture.command import run
    except ImportError:
        return
    app.command(
        "run",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "allow_interspersed_args": False,
        },
    )(run)


_register_run()


def main() -> None:
    """Console-script entry point.

    After `analyze` (every output written and flushed) the process ends at once: tearing down the
    tables of a large trace takes a noticeable part of a second and changes nothing. `run` ends
    normally, so the user's script's exit handlers still run.
    """
    try:
        app()
    except SystemExit as exc:
        if not _analysis_done:
            raise
        code = exc.code
    else:
        code = 0
    if not isinstance(code, int):
        raise SystemExit(code)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
