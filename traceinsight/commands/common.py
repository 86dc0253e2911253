"""The flow every command shares, written once: read a trace through the public API, plan the
outputs, write them, print the summary, hold the result to the gate; and one trace's whole flow,
:func:`analyze_and_write`, which `analyze` and `run` share.

A command is thin: it reads its options (:mod:`.options`), makes its result, and hands it here.
Every file goes through the outputs writer (:mod:`.outputs`): checked before the work, written
whole or not at all.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Final

import typer
from rich.console import Console
from rich.text import Text

from traceinsight import api
from traceinsight.commands.options import STDOUT, Reading, Settings, Wanted
from traceinsight.commands.outputs import Kind, Output, check_outputs, write_output
from traceinsight.config import SourceRoot
from traceinsight.errors import ConfigError
from traceinsight.load.head_start import HeadStart
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.text import printable
from traceinsight.process import prepare_beside, work_done
from traceinsight.render import AnyResult, shown_details
from traceinsight.render.html import HtmlRenderer
from traceinsight.render.terminal import TerminalConsole, TerminalRenderer, reader_gone
from traceinsight.results import Result, RunContext
from traceinsight.results.gate import EXIT_BROKEN, broken
from traceinsight.results.stored import looks_stored, read_result

__all__ = [
    "Planned",
    "analyze_and_write",
    "gate",
    "plan",
    "read_trace",
    "rendered_again",
    "show",
    "stage",
    "stem",
    "timed",
    "write",
]

#: The module that draws a page, prepared beside the analysis (:func:`~traceinsight.process.prepare_beside`).
PAGE_RENDERER: Final = "traceinsight.render.html"


def stem(trace: Path) -> str:
    """A trace's name without ``.json``/``.json.gz``."""
    name = trace.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


@contextmanager
def stage(description: str) -> Iterator[None]:
    """A spinner on stderr for a step that may take a while; nothing when stderr is not a terminal.
    ``description`` names a file: shown as text (never rich markup), control characters replaced."""
    if not sys.stderr.isatty():
        yield
        return
    with Console(stderr=True).status(Text(printable(description)), spinner="dots"):
        yield


@contextmanager
def timed(step: str) -> Iterator[None]:
    """With ``TRACEINSIGHT_TIMINGS=1``, print how long ``step`` took on stderr (for benchmarks:
    ``traceinsight timing: <step> <seconds> s``, one line per step)."""
    if os.environ.get("TRACEINSIGHT_TIMINGS") != "1":
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        print(f"traceinsight timing: {step} {time.perf_counter() - start:.3f} s", file=sys.stderr)


def read_trace(
    trace: Path,
    reading: Reading,
    *,
    progress: ProgressCallback | None = None,
    run: RunContext | None = None,
    page: bool = False,
    head_start: HeadStart | None = None,
    source_root: Path | None = None,
) -> Result:
    """Load ``trace`` (taking the scans of its ``head_start``) and analyze it through the public
    API (:func:`traceinsight.api.load`, :func:`traceinsight.api.analyze`: the result carries
    ``source_root``, the folder its code excerpts may be read from), as every command does; with
    ``page`` the page's renderer is prepared beside the analysis."""
    with timed("load"):
        loaded = api.load(trace, max_bytes=reading.limit.max_bytes, force=reading.limit.force,
                          progress=progress, head_start=head_start)  # fmt: skip
    if page:
        prepare_beside(PAGE_RENDERER)
    with stage(f"analyzing {trace.name}"), timed("analysis"):
        result = api.analyze(loaded, user_code=reading.user_code, every_gap=False, run=run,
                             source_root=source_root, **reading.threshold_values)  # fmt: skip
    assert isinstance(result, Result)  # a loaded trace is one trace
    return result


class Planned:
    """The files a command will write, checked before its work (:func:`plan`)."""

    def __init__(self, wanted: Wanted, page: Path | str | None, outputs: list[Output]) -> None:
        self.wanted = wanted
        self.page = page
        self.outputs = outputs

    def destination(self, option: str, value: str | Path | None) -> Output | str | None:
        """Where one output goes: its planned file, ``"-"`` (stdout), or None (not written)."""
        if value is None or value == STDOUT:
            return None if value is None else STDOUT
        return next(target for target in self.outputs if target.option == option)


def plan(
    wanted: Wanted,
    default_page: Path,
    *,
    inputs: Sequence[Path],
    inputs_are: str = "the trace being analyzed",
) -> Planned:
    """The files ``wanted`` asks for, checked now (:func:`~.outputs.check_outputs`): none may be an
    input, a file that is not ours (without ``--force``), or another output."""
    page = wanted.page(default_page)
    outputs = [Output("-o/--output", page, Kind.HTML)] if isinstance(page, Path) else []
    for option, value, kind in (
        ("--json", wanted.json, Kind.JSON),
        ("--markdown", wanted.markdown, Kind.MARKDOWN),
    ):
        if value is not None and value != STDOUT:
            outputs.append(Output(option, Path(value), kind))
    check_outputs(outputs, inputs=inputs, inputs_are=inputs_are, force=wanted.force)
    return Planned(wanted, page, outputs)


def write(
    result: AnyResult, planned: Planned, *, source_root: Path | None = None, page_label: str = "report"
) -> tuple[list[tuple[str, Path]], bool]:
    """Write the result's JSON, Markdown and page where ``planned`` says (``source_root``: where
    the page's code excerpts may be read from). Returns the files written, as (label, path), and
    whether stdout was used (``--json -``, ``--markdown -``): the summary then goes to stderr, so
    that stdout holds the one document."""
    wanted = planned.wanted
    return _write(
        [
            ("JSON", planned.destination("--json", wanted.json), result.to_json),
            (
                "Markdown",
                planned.destination("--markdown", wanted.markdown),
                lambda: _markdown(result),
            ),
            (
                page_label,
                planned.destination("-o/--output", planned.page),
                lambda: HtmlRenderer(source_root).render(result),
            ),
        ],
        force=wanted.force,
    )


def _markdown(result: AnyResult) -> str:
    """The Markdown summary (its renderer loaded only when ``--markdown`` asks for it)."""
    from traceinsight.render.markdown import MarkdownRenderer  # ~0.007 s; see NOT_FOR_ONE_TRACE

    return MarkdownRenderer().render(result)


def show(
    result: AnyResult,
    outputs: Sequence[tuple[str, Path]],
    *,
    console: Console | None = None,
    to_stderr: bool = False,
    top: int | None = None,
) -> None:
    """Print the result's terminal summary, then where each output went."""
    with timed("terminal"):
        TerminalRenderer(top=top).print(result, console or TerminalConsole(stderr=to_stderr), outputs)


def _write(
    outputs: list[tuple[str, Output | str | None, Callable[[], str]]], *, force: bool = False
) -> tuple[list[tuple[str, Path]], bool]:
    """Write each (label, destination, text maker): a file through :func:`~.outputs.write_output`,
    ``"-"`` to stdout, None not at all. Returns the files written and whether stdout was used."""
    written: list[tuple[str, Path]] = []
    to_stdout = False
    for label, destination, make in outputs:
        if destination is None:
            continue
        step = "HTML" if label in ("report", "page") else label
        if not isinstance(destination, Output):
            with timed(step):
                text = make()
                try:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                except BrokenPipeError:
                    reader_gone()
            to_stdout = True
            continue
        with stage(f"writing {destination.path.name}"), timed(step):
            text = make()
            write_output(destination, text, force=force)
        written.append((label, destination.path))
    return written, to_stdout


def gate(lines: list[str]) -> int:
    """Print one line per broken budget; the exit status (0: the gate passes)."""
    for line in lines:
        sys.stderr.write(f"traceinsight: gate: {printable(line)}\n")
    return EXIT_BROKEN if lines else 0


def analyze_and_write(
    trace: Path,
    wanted: Wanted,
    reading: Reading,
    *,
    source_root: SourceRoot | None = None,
    run: RunContext | None = None,
    console: Console | None = None,
    progress: ProgressCallback | None = None,
    top: int = 5,
    head_start: HeadStart | None = None,
) -> Result:
    """Analyze ``trace``; write the outputs ``wanted`` asks for (the page by default, as
    ``./<trace name>.html``); print the terminal summary. Returns the result.

    The outputs are checked before the work (:func:`plan`). ``source_root`` is the folder
    the page's code excerpts may be read from, and where that choice came from (None: no excerpts,
    only paths and line numbers). ``run`` carries what ``traceinsight run`` knows of the script's
    run. ``progress`` is told how the load advances; the slower steps after it show a spinner when
    stderr is a terminal. ``top`` is how many rows the terminal tables show. ``head_start``: scans
    of ``trace`` begun before (:mod:`traceinsight.load.head_start`).
    """
    planned = plan(wanted, Path.cwd() / f"{stem(trace)}.html", inputs=[trace])
    folder = None if source_root is None else source_root.folder
    result = read_trace(trace, reading, progress=progress, run=run, page=planned.page is not None,
                        head_start=head_start, source_root=folder)  # fmt: skip
    written, to_stdout = write(result, planned, source_root=folder)
    if planned.page is not None and source_root is not None:
        written.append(source_root.written)
    show(result, written, console=console, to_stderr=to_stdout, top=top)
    return result


def rendered_again(
    path: Path,
    read: Settings,
    top: int,
    source_root: SourceRoot | None = None,
    user_code_given: bool = False,
) -> bool:
    """When ``path`` is a stored result (a file ``--json`` wrote: a trace's, a job's, a diff's):
    its outputs written again from it alone, as the run that stored it wrote them (the page's code
    excerpts from ``source_root``, as a trace's), and its gate judged (a trace's result only);
    False for a trace. A trace's result written before results kept their ``details`` is refused
    before anything is written. What only an analysis uses (thresholds other than the stored
    result's, ``--user-code``: ``user_code_given``) is said to be left unused, in one note."""
    if not looks_stored(path):
        return False
    # A job's and a diff's types: ~3 ms that one trace's analyze never pays (NOT_FOR_ONE_TRACE).
    from traceinsight.results import Comparison, JobComparison, JobResult

    stored = read_result(path, (Result, JobResult, Comparison, JobComparison), read.reading.limit)
    if stored is None:
        return False
    if not isinstance(stored, Result) and not read.budgets.empty:
        raise ConfigError(
            f"{path} is a stored result of a job or a diff: the gate options judge a trace's result; "
            "give the job's traces, or use traceinsight diff --max-regression"
        )
    unused = ["--user-code"] if user_code_given else []
    if isinstance(stored, Result):
        details = shown_details(stored, "the report")  # one line, before any file is written
        if details.thresholds != read.reading.thresholds:
            unused.insert(0, "the thresholds")
    if unused:
        sys.stderr.write(
            f"traceinsight: note: {printable(str(path))} holds figures as they were analyzed; "
            f"{' and '.join(unused)} given here apply when a trace is analyzed\n"
        )
    planned = plan(read.wanted, Path.cwd() / f"{stem(path)}.html", inputs=[path])
    written, to_stdout = write(
        stored,
        planned,
        source_root=None if source_root is None else source_root.folder,
        page_label="page" if isinstance(stored, (Comparison, JobComparison)) else "report",
    )
    if planned.page is not None and source_root is not None and isinstance(stored, Result):
        written.append(source_root.written)
    show(stored, written, to_stderr=to_stdout, top=max(top, 10) if isinstance(stored, JobResult) else top)
    work_done()
    status = (
        gate(broken(stored, read.budgets)) if isinstance(stored, Result) and not read.budgets.empty else 0
    )
    if status:
        raise typer.Exit(status)
    return True
