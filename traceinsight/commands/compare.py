"""`traceinsight diff`'s flow: two sides compared through the public API, the outputs written
(:func:`diff_and_write`).

Each side is a trace, analyzed as `analyze` does, or a result ``analyze --json`` wrote, read back
under the checks of :mod:`traceinsight.results.stored`: both are the same typed
:class:`~traceinsight.results.trace.Result`, which :func:`~traceinsight.results.compare` and the
gate read; several runs of one setup are one side, pooled; two jobs compare as jobs
(:func:`traceinsight.api.diff_sides`, :func:`traceinsight.api.compare_sides`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path

from rich.console import Console

from traceinsight import api
from traceinsight.api import Side
from traceinsight.commands.common import gate, plan, show, stage, timed, write
from traceinsight.commands.options import Reading, Wanted
from traceinsight.job.execute import rank_progress
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.text import printable
from traceinsight.results import Comparison, JobComparison, JobResult, Result
from traceinsight.results.gate import Budgets, broken_diff, broken_job_diff, held_back

__all__ = ["diff_and_write", "held_to"]


def diff_and_write(
    before: Path,
    after: Path,
    wanted: Wanted,
    reading: Reading,
    *,
    progress: Callable[[Path], AbstractContextManager[ProgressCallback | None]] | None = None,
    console: Console | None = None,
    top: int = 10,
) -> tuple[Comparison | JobComparison, Result | JobResult]:
    """Compare ``before`` with ``after`` through the public API: the sides sorted
    (:func:`traceinsight.api.diff_sides`: two traces or their stored results, several runs of one
    setup, or two jobs, each a job's stored result, a folder or a pattern of rank traces; a job
    beside a trace is refused before anything is analyzed), the outputs ``wanted`` asks for checked
    (the page by default, ``./<before>-vs-<after>.html``), then compared
    (:func:`traceinsight.api.compare_sides`); write the outputs, print the summary. Returns the
    comparison and the after side's result (for the gate). ``progress(path)`` opens the load's
    progress display for each trace read; ``top`` kernels are listed (a job's: ``top`` ranks in
    the summary)."""
    limit = reading.limit
    sides = api.diff_sides(before, after, max_bytes=limit.max_bytes, force=limit.force)
    planned = plan(
        wanted,
        Path.cwd() / f"{sides[0].stem}-vs-{sides[1].stem}.html",
        inputs=[path for side in sides for path in side.inputs],
        inputs_are="one of the runs compared",
    )
    if sides[0].is_job and not api.pooled(*sides):
        _say_skipped(sides, console)
    comparison, after_result = api.compare_sides(
        *sides, top=top, user_code=reading.user_code, max_bytes=limit.max_bytes, force=wanted.force,
        reading_progress=_reading(progress), analyzing=_analyzing, ranks_progress=rank_progress,
        **reading.threshold_values,
    )  # fmt: skip
    written, to_stdout = write(comparison, planned, page_label="page")
    show(comparison, written, console=console, to_stderr=to_stdout, top=top if sides[0].is_job else None)
    return comparison, after_result


def _reading(
    progress: Callable[[Path], AbstractContextManager[ProgressCallback | None]] | None,
) -> Callable[[Path], AbstractContextManager[ProgressCallback | None]]:
    """Around each trace's load: ``progress(path)``'s display, and its time with
    ``TRACEINSIGHT_TIMINGS=1`` (:func:`~.common.timed`)."""

    @contextmanager
    def reading(path: Path) -> Iterator[ProgressCallback | None]:
        with progress(path) if progress is not None else nullcontext() as callback, timed("load"):
            yield callback

    return reading


@contextmanager
def _analyzing(path: Path) -> Iterator[None]:
    """Around each trace's analysis: a spinner on a terminal, its time with ``TRACEINSIGHT_TIMINGS=1``."""
    with stage(f"analyzing {path.name}"), timed("analysis"):
        yield


def _say_skipped(sides: tuple[Side, Side], console: Console | None) -> None:
    """What a job side's folder or pattern held that is not a trace (a job's own result, a config),
    said on stderr before its ranks are analyzed, as ``analyze`` says it."""
    err = Console(stderr=True, highlight=False) if console is None or not console.stderr else console
    for name, side in zip(("BEFORE", "AFTER"), sides, strict=True):
        for note in side.files.discovery.notes if side.files is not None else ():
            err.print(f"! {name} ({printable(side.label)}): {printable(note)}", markup=False, soft_wrap=True)


def held_to(comparison: Comparison | JobComparison, after: Result | JobResult, budgets: Budgets) -> int:
    """The gate on a diff: the after side held to the budgets (a job: every rank), its step time
    to ``--max-regression``; one line per broken budget, and one for a growth over it that could
    not be told apart from noise (not broken on). The exit status (0: the gate passes)."""
    if isinstance(comparison, JobComparison):
        assert isinstance(after, JobResult)
        status = gate(broken_job_diff(comparison, after, budgets))
    else:
        assert isinstance(after, Result)
        status = gate(broken_diff(comparison, after, budgets))
    for line in held_back(comparison.metric("step_time"), budgets.max_regression):
        sys.stderr.write(f"traceinsight: gate: {printable(line)}\n")
    return status
