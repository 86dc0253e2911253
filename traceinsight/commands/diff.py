"""`traceinsight diff`: two results compared (:func:`diff_and_write`).

Each side is a trace, analyzed as `analyze` does, or a result ``analyze --json`` wrote, read back
under the checks of :mod:`traceinsight.results.stored`: both are the same typed
:class:`~traceinsight.results.trace.Result`, which :func:`~traceinsight.results.compare` and the
gate read.
"""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from traceinsight.commands import options
from traceinsight.process import libraries_loading, quiet_blas, work_done

if TYPE_CHECKING:
    from rich.console import Console

    from traceinsight.commands.options import Reading, Wanted
    from traceinsight.load.progress import ProgressCallback
    from traceinsight.results import Comparison, Result

__all__ = ["diff", "diff_and_write", "side_of"]


def diff(
    before: Annotated[
        Path,
        typer.Argument(
            metavar="BEFORE",
            show_default=False,
            readable=False,
            help="The baseline: a trace (.json/.json.gz) or a result of analyze --json.",
        ),
    ],
    after: Annotated[
        Path,
        typer.Argument(
            metavar="AFTER",
            show_default=False,
            readable=False,
            help="The change to judge: a trace or a result of analyze --json.",
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            metavar="PATH",
            show_default=False,
            help="Where to write the HTML page [default: ./<before>-vs-<after>.html].",
        ),
    ] = None,
    json_out: options.JsonOption = None,
    markdown: options.MarkdownOption = None,
    no_html: options.NoHtmlOption = False,
    top: Annotated[
        int, typer.Option("--top", metavar="N", min=1, help="Kernels listed whose time changed most.")
    ] = 10,
    min_gap_us: options.MinGapOption = options.DEFAULTS.min_gap_us,
    low_utilization: options.LowUseOption = options.DEFAULTS.low_utilization,
    user_code: options.UserCodeOption = None,
    force: options.ForceOption = False,
    max_size: options.MaxSizeOption = None,
    fail_on: options.FailOnOption = None,
    fail_on_rule: options.FailOnRuleOption = None,
    max_idle: options.MaxIdleOption = None,
    max_syncs_per_step: options.MaxSyncsOption = None,
    max_regression: Annotated[
        float | None,
        typer.Option(
            "--max-regression",
            metavar="PCT",
            min=0,
            show_default=False,
            help="Gate: exit 1 when the step time grew more than PCT % over BEFORE.",
        ),
    ] = None,
) -> None:
    """Compare two runs: step time, GPU busy and idle by cause, syncs, copies, communication,
    findings fixed / new / still there, and the kernels that changed most.

    A stored result (analyze --json) works as a baseline without its trace. The gate options hold
    AFTER to the budgets, and --max-regression its step time to BEFORE's.
    """
    quiet_blas()
    with libraries_loading():
        from traceinsight.commands.common import gate
        from traceinsight.load.progress import terminal_progress
        from traceinsight.results.gate import broken_diff

    read = options.settings(
        output=output, json_out=json_out, markdown=markdown, no_html=no_html, force=force, user_code=user_code,
        max_size=max_size, min_gap_us=min_gap_us, low_utilization=low_utilization, fail_on=fail_on,
        fail_on_rules=fail_on_rule, max_idle=max_idle, max_syncs_per_step=max_syncs_per_step,
        max_regression=max_regression,
    )  # fmt: skip
    comparison, after_result = diff_and_write(
        before,
        after,
        read.wanted,
        read.reading,
        progress=lambda path: terminal_progress(f"reading {path.name}"),
        top=top,
    )
    work_done()
    status = gate(broken_diff(comparison, after_result, read.budgets)) if not read.budgets.empty else 0
    if status:
        raise typer.Exit(status)


def side_of(path: Path, reading: Reading, progress: ProgressCallback | None = None) -> Result:
    """One side of a diff: the result stored in ``path`` when it is one (``analyze --json``), else
    the trace analyzed as ``analyze`` does."""
    from traceinsight.commands.common import read_trace
    from traceinsight.results import Result
    from traceinsight.results.stored import read_stored_result

    stored = read_stored_result(path, Result, reading.limit)
    if stored is not None:
        return stored
    return read_trace(path, reading, progress=progress)


def diff_and_write(
    before: Path,
    after: Path,
    wanted: Wanted,
    reading: Reading,
    *,
    progress: Callable[[Path], AbstractContextManager[ProgressCallback | None]] | None = None,
    console: Console | None = None,
    top: int = 10,
) -> tuple[Comparison, Result]:
    """Compare ``before`` with ``after`` (each a trace or a stored result, :func:`side_of`); write
    the outputs ``wanted`` asks for (the page by default, ``./<before>-vs-<after>.html``); print the
    summary. Returns the comparison and the after side's result (for the gate). ``progress(path)``
    opens the load's progress display for each trace read; ``top`` kernels are listed."""
    from traceinsight.commands.common import plan, show, stem, write
    from traceinsight.load.text import printable
    from traceinsight.results import compare

    planned = plan(
        wanted,
        Path.cwd() / f"{stem(before)}-vs-{stem(after)}.html",
        inputs=[before, after],
        inputs_are="one of the runs compared",
    )
    sides = []
    for path in (before, after):
        with progress(path) if progress is not None else nullcontext() as callback:
            sides.append(side_of(path, reading, callback))
    comparison = compare(sides[0], sides[1], printable(before.name), printable(after.name), top=top)
    written, to_stdout = write(comparison, planned, page_label="page")
    show(comparison, written, console=console, to_stderr=to_stdout)
    return comparison, sides[1]
