"""`traceinsight diff`: two results compared (:func:`diff_and_write`).

Each side is a trace, analyzed as `analyze` does, or a result ``analyze --json`` wrote, read back
under the checks of :mod:`traceinsight.results.stored`: both are the same typed
:class:`~traceinsight.results.trace.Result`, which :func:`~traceinsight.results.compare` and the
gate read.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer

from traceinsight.commands import options
from traceinsight.process import libraries_loading, quiet_blas, work_done

if TYPE_CHECKING:
    from rich.console import Console

    from traceinsight.commands.job import JobFiles
    from traceinsight.commands.options import Reading, Wanted
    from traceinsight.load.progress import ProgressCallback
    from traceinsight.results import Comparison, JobResult, Result
    from traceinsight.results.job_comparison import JobComparison

__all__ = ["Side", "diff", "diff_and_write", "side_of", "sort_side"]


def diff(
    before: Annotated[
        Path,
        typer.Argument(
            metavar="BEFORE",
            show_default=False,
            readable=False,
            help="The baseline: a trace (.json/.json.gz) or a result of analyze --json; several runs "
            "of one setup, pooled: a folder or a quoted pattern of one process's profiler cycles or "
            "of results of analyze/run --json; or a job: its result of analyze --json, a folder or a "
            "quoted pattern of its rank traces.",
        ),
    ],
    after: Annotated[
        Path,
        typer.Argument(
            metavar="AFTER",
            show_default=False,
            readable=False,
            help="The change to judge: the same kind as BEFORE (a trace or its result, or a job).",
        ),
    ],
    output: Annotated[
        str | None,  # as typed: "-" is stdout, "./-" a file named "-"
        typer.Option(
            "-o",
            "--output",
            metavar="PATH|-",
            show_default=False,
            help="Where to write the HTML page ('-': stdout) [default: ./<before>-vs-<after>.html].",
        ),
    ] = None,
    json_out: options.JsonOption = None,
    markdown: options.MarkdownOption = None,
    no_html: options.NoHtmlOption = False,
    top: Annotated[
        int,
        typer.Option(
            "--top", metavar="N", min=1, help="Kernels listed whose time changed most (two jobs: ranks)."
        ),
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
            help="Gate: exit 1 when the step time grew more than PCT % over BEFORE and the growth is "
            "told apart from noise (its verdict is slower; a growth that cannot be told apart is said, "
            "not broken on).",
        ),
    ] = None,
) -> None:
    """Compare two runs: step time, GPU busy and idle by cause, syncs, copies, communication,
    findings fixed / new / still there, and the kernels that changed most. Each figure with
    per-step values gets a verdict (faster / slower, lower / higher, no change, cannot tell) with
    its 95 % interval, from its steps and a measured run-to-run spread (docs/noise.md).

    Two jobs (results, folders or patterns of rank traces) compare as a whole, rank by rank, and by
    their stragglers gone / new / still there. A stored result (analyze --json) works as a baseline
    without its traces. The gate options hold AFTER to the budgets (a job: every rank), and
    --max-regression its (median) step time to BEFORE's.
    """
    quiet_blas()
    with libraries_loading():
        from traceinsight.commands.common import gate
        from traceinsight.load.progress import terminal_progress
        from traceinsight.load.text import printable
        from traceinsight.results import JobResult, Result
        from traceinsight.results.gate import broken_diff, broken_job_diff, held_back
        from traceinsight.results.job_comparison import JobComparison

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
    status = 0
    if not read.budgets.empty:
        if isinstance(comparison, JobComparison):
            assert isinstance(after_result, JobResult)
            status = gate(broken_job_diff(comparison, after_result, read.budgets))
        else:
            assert isinstance(after_result, Result)
            status = gate(broken_diff(comparison, after_result, read.budgets))
        for line in held_back(comparison.metric("step_time"), read.budgets.max_regression):
            sys.stderr.write(f"traceinsight: gate: {printable(line)}\n")
    if status:
        raise typer.Exit(status)


def side_of(path: Path, reading: Reading, progress: ProgressCallback | None = None) -> Result:
    """One side of a diff of two traces: the result stored in ``path`` when it is one
    (``analyze --json``), else the trace analyzed as ``analyze`` does."""
    from traceinsight.commands.common import read_trace
    from traceinsight.results import Result
    from traceinsight.results.stored import read_stored_result

    stored = read_stored_result(path, Result, reading.limit)
    if stored is not None:
        return stored
    return read_trace(path, reading, progress=progress)


@dataclass(frozen=True, slots=True)
class Side:
    """One side of a diff, sorted before anything slow is done (:func:`sort_side`): a stored
    result (a trace's or a job's), a job's traces to analyze (a folder, a pattern), or a trace."""

    path: Path
    stored: Result | JobResult | None = None
    files: JobFiles | None = None
    #: Stored results of several runs of one setup (a folder or pattern of ``analyze --json`` or
    #: ``run --json`` files of traces): pooled by a diff as one side.
    runs: tuple[Result, ...] = ()
    run_paths: tuple[Path, ...] = ()

    @property
    def is_job(self) -> bool:
        """A job's result, or a job's traces."""
        from traceinsight.results import JobResult

        return self.files is not None or isinstance(self.stored, JobResult)

    @property
    def is_cycles(self) -> bool:
        """One process's profiler cycles (a folder or pattern of them): runs of one setup, pooled
        by a diff as one side of several runs."""
        return bool(self.runs) or (self.files is not None and self.files.cycles_of is not None)

    @property
    def words(self) -> str:
        """What the side is, for the line that refuses a job beside a trace."""
        if self.runs:
            return f"the results of {len(self.runs)} runs"
        if self.files is not None:
            return f"a job ({len(self.files.discovery.files)} traces)"
        if self.stored is not None:
            return "a job's result" if self.is_job else "a trace's result"
        return "one trace"

    @property
    def inputs(self) -> list[Path]:
        """The files no output may replace."""
        return [self.path, *self.run_paths] if self.files is None else [self.path, *self.files.paths]

    @property
    def label(self) -> str:
        """The side's name in every output: the file's, the folder's, or the pattern as given."""
        from traceinsight.job.discover import is_job
        from traceinsight.load.text import printable

        if (self.files is not None or self.runs) and not self.path.is_dir() and is_job([self.path]):
            return printable(str(self.path))  # a pattern: its name alone says too little
        return printable(self.path.resolve().name if self.path.is_dir() else self.path.name) or "job"

    @property
    def stem(self) -> str:
        """The side's name in the default page's file name (no pattern characters)."""
        from traceinsight.commands.common import stem

        if (self.files is None and not self.runs) or self.path.is_dir():
            return stem(self.path.resolve() if self.path.is_dir() else self.path) or "job"
        fixed = [part for part in self.path.parts[:-1] if not _GLOB.search(part)]
        return fixed[-1] if fixed and fixed[-1] not in (".", "/") else "job"


_GLOB: Final = re.compile(r"[*?\[]")


def sort_side(path: Path, reading: Reading) -> Side:
    """What ``path`` is (see :class:`Side`): a folder or a pattern is a job, its traces found and
    sorted now (:func:`~traceinsight.commands.job.job_files`); a file is a stored result when its
    first bytes say so, else a trace."""
    from traceinsight.commands.job import job_files
    from traceinsight.job.discover import is_job
    from traceinsight.results import JobResult, Result
    from traceinsight.results.stored import read_stored

    if is_job([path]):
        runs = _stored_runs(path, reading)
        if runs:
            return Side(path, runs=tuple(run for _, run in runs), run_paths=tuple(file for file, _ in runs))
        return Side(path, files=job_files([path]))
    return Side(path, stored=read_stored(path, (Result, JobResult), reading.limit))


def _stored_runs(path: Path, reading: Reading) -> tuple[tuple[Path, Result], ...]:
    """The runs of a folder or pattern of stored results of traces (``*.json`` files that
    ``analyze --json`` or ``run --json`` wrote), in name order; empty unless every such file is
    one (a job's traces, or a folder mixing results with traces, are a job's side)."""
    import glob

    from traceinsight.errors import TraceFormatError
    from traceinsight.results import JobResult, Result
    from traceinsight.results.stored import read_stored

    found = sorted(path.glob("*.json") if path.is_dir() else (Path(name) for name in glob.glob(str(path))))
    files = [file for file in found if file.is_file() and not file.is_symlink()]
    if not files or (
        path.is_dir() and any(item.name.endswith((".json.gz", ".pt.trace.json")) for item in path.iterdir())
    ):
        return ()
    runs = []
    for file in files:
        try:
            stored = read_stored(file, (Result, JobResult), reading.limit)
        except TraceFormatError:
            return ()  # not a trace's result (a diff's, an unreadable one): the folder is a job's
        if not isinstance(stored, Result):
            return ()
        runs.append((file, stored))
    return tuple(runs)


def _check_same_kind(before: Side, after: Side) -> None:
    """A job is compared with a job, a trace with a trace (or with several runs: profiler cycles,
    stored results); anything else is one line."""
    from traceinsight.errors import TraceFormatError
    from traceinsight.load.text import printable

    runs_beside_job = (bool(before.runs) and after.is_job) or (bool(after.runs) and before.is_job)
    if not runs_beside_job and (before.is_job == after.is_job or before.is_cycles or after.is_cycles):
        return
    raise TraceFormatError(
        f"cannot compare {printable(str(before.path))} with {printable(str(after.path))}: BEFORE is "
        f"{before.words} and AFTER {after.words}; give two jobs (results of analyze --json of a job, "
        "folders or patterns of rank traces) or two traces (a rank's trace on each side; a side may be "
        "several runs of one setup: a folder or pattern of profiler cycles or of their results)"
    )


def _job_of(side: Side, reading: Reading, force: bool) -> JobResult:
    """The job's result of a job side: stored, or its ranks analyzed as ``analyze`` does."""
    from traceinsight.commands.job import run_job
    from traceinsight.results import JobResult

    if isinstance(side.stored, JobResult):
        return side.stored
    assert side.files is not None
    return run_job(side.files, reading, force=force)


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
    """Compare ``before`` with ``after``: two traces or their stored results (:func:`side_of`), or
    two jobs, each a job's stored result, a folder or a pattern of rank traces (analyzed as
    ``analyze`` analyzes a job); a job beside a trace is refused before anything is analyzed. Write
    the outputs ``wanted`` asks for (the page by default, ``./<before>-vs-<after>.html``); print the
    summary. Returns the comparison and the after side's result (for the gate). ``progress(path)``
    opens the load's progress display for each trace read; ``top`` kernels are listed (a job's:
    ``top`` ranks in the summary)."""
    from traceinsight.commands.common import plan, show, write
    from traceinsight.results import compare
    from traceinsight.results.job_comparison import compare_jobs

    sides = [sort_side(path, reading) for path in (before, after)]
    _check_same_kind(*sides)
    planned = plan(
        wanted,
        Path.cwd() / f"{sides[0].stem}-vs-{sides[1].stem}.html",
        inputs=[path for side in sides for path in side.inputs],
        inputs_are="one of the runs compared",
    )
    comparison: Comparison | JobComparison
    after_result: Result | JobResult
    if all(side.is_cycles for side in sides) or (
        any(side.is_cycles for side in sides) and not all(side.is_job for side in sides)
    ):
        pooled = []
        for side in sides:
            runs = list(side.runs)
            for path in side.files.paths if side.files is not None else [] if side.runs else [side.path]:
                with progress(path) if progress is not None else nullcontext() as callback:
                    runs.append(_trace_of(Side(path) if side.files is not None else side, reading, callback))
            pooled.append(runs)
        comparison = compare(pooled[0], pooled[1], sides[0].label, sides[1].label, top=top)
        after_result = pooled[1][0]
    elif sides[0].is_job:
        _say_skipped(sides, console)
        jobs = [_job_of(side, reading, wanted.force) for side in sides]
        comparison = compare_jobs(jobs[0], jobs[1], sides[0].label, sides[1].label)
        after_result = jobs[1]
    else:
        results = []
        for side in sides:
            with progress(side.path) if progress is not None else nullcontext() as callback:
                results.append(_trace_of(side, reading, callback))
        comparison = compare(results[0], results[1], sides[0].label, sides[1].label, top=top)
        after_result = results[1]
    written, to_stdout = write(comparison, planned, page_label="page")
    show(comparison, written, console=console, to_stderr=to_stdout, top=top if sides[0].is_job else None)
    return comparison, after_result


def _say_skipped(sides: list[Side], console: Console | None) -> None:
    """What a job side's folder or pattern held that is not a trace (a job's own result, a config),
    said on stderr before its ranks are analyzed, as ``analyze`` says it."""
    from rich.console import Console

    from traceinsight.load.text import printable

    err = Console(stderr=True, highlight=False) if console is None or not console.stderr else console
    for name, side in zip(("BEFORE", "AFTER"), sides, strict=True):
        for note in side.files.discovery.notes if side.files is not None else ():
            err.print(f"! {name} ({printable(side.label)}): {printable(note)}", markup=False, soft_wrap=True)


def _trace_of(side: Side, reading: Reading, progress: ProgressCallback | None) -> Result:
    """A trace side's result: stored, or the trace analyzed."""
    from traceinsight.commands.common import read_trace
    from traceinsight.results import Result

    if isinstance(side.stored, Result):
        return side.stored
    return read_trace(side.path, reading, progress=progress)
