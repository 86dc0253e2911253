"""`traceinsight analyze`: one trace's result, or a distributed job's (:mod:`.job`), in every output.

The command reads its options (:mod:`.options`), loads the libraries (:func:`~traceinsight.process.libraries_loading`),
and runs the one flow a trace goes through, :func:`analyze_and_write`; `run` hands the trace it
recorded to the same flow, so a report made right after a capture is the one made later from the
file alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from traceinsight.commands import options
from traceinsight.errors import ConfigError
from traceinsight.process import collector_paused, libraries_loading, quiet_blas, work_done

if TYPE_CHECKING:
    from rich.console import Console

    from traceinsight.commands.options import Reading, Wanted
    from traceinsight.config import SourceRoot
    from traceinsight.load.head_start import HeadStart
    from traceinsight.load.progress import ProgressCallback
    from traceinsight.results import Result, RunContext

__all__ = ["analyze", "analyze_and_write"]


def analyze(
    traces: Annotated[
        list[Path],
        # readable=False: the loader words an unreadable file in one line, not typer's usage box.
        typer.Argument(
            metavar="TRACE",
            help="A torch.profiler trace: .json or .json.gz. Several traces, a folder or a glob pattern: "
            "one report for a distributed job, one rank per trace. A result --json wrote: its outputs again.",
            show_default=False,
            readable=False,
        ),
    ],
    output: Annotated[
        str | None,  # as typed: "-" is stdout, "./-" a file named "-"
        typer.Option(
            "-o",
            "--output",
            metavar="PATH|-",
            show_default=False,
            help="Where to write the HTML report ('-': stdout) [default: ./<trace name>.html].",
        ),
    ] = None,
    json_out: options.JsonOption = None,
    markdown: options.MarkdownOption = None,
    no_html: options.NoHtmlOption = False,
    top: Annotated[
        int, typer.Option("--top", metavar="N", min=1, help="Rows shown in each terminal table.")
    ] = 5,
    min_gap_us: options.MinGapOption = options.DEFAULTS.min_gap_us,
    low_utilization: options.LowUseOption = options.DEFAULTS.low_utilization,
    user_code: options.UserCodeOption = None,
    source_root: Annotated[
        Path | None,
        typer.Option(
            "--source-root",
            metavar="DIR",
            readable=False,
            show_default=False,
            help="Show code excerpts in the report, read from .py files inside DIR only "
            "[default: source-root of [tool.traceinsight], else no excerpts].",
        ),
    ] = None,
    force: options.ForceOption = False,
    max_size: options.MaxSizeOption = None,
    fail_on: options.FailOnOption = None,
    fail_on_rule: options.FailOnRuleOption = None,
    max_idle: options.MaxIdleOption = None,
    max_syncs_per_step: options.MaxSyncsOption = None,
    per_rank: Annotated[
        Path | None,
        typer.Option(
            "--per-rank",
            metavar="DIR",
            show_default=False,
            readable=False,
            help="Job: also write each rank's own report into DIR (rank-N.json, rank-N.html).",
        ),
    ] = None,
    dask: Annotated[
        str | None,
        typer.Option(
            "--dask",
            metavar="ADDRESS",
            envvar="TRACEINSIGHT_DASK",
            show_default=False,
            help="Job: analyze the ranks on this dask.distributed scheduler (tcp://host:8786); "
            "the traces must be readable there. Needs torch-traceinsight[dask].",
        ),
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            metavar="N",
            min=1,
            show_default=False,
            help="Job: local worker processes [default: by cores and memory].",
        ),
    ] = None,
    follow_symlinks: Annotated[
        bool,
        typer.Option(
            "--follow-symlinks",
            help="Job: let a folder or pattern take traces through symbolic links that lead out of it "
            "(and walk linked folders, each once) [default: skip them, with a note].",
        ),
    ] = False,
) -> None:
    """Measure GPU idle gaps, copy overlap and sync hot spots in TRACE; print a summary, write a report.

    Given several traces, a folder or a pattern, analyzes each rank on its own and writes one job
    report: a per-rank table, the stragglers and why, findings common to the ranks.

    Writes ./<trace name>.html unless -o or --no-html says otherwise; --json and --markdown add the
    full result and a short summary. The gate options turn findings and budgets into exit status 1.
    """
    quiet_blas()
    with _head_start(traces) as head_start:  # a large trace's scan begun while the libraries load
        with libraries_loading():
            from traceinsight.commands.common import gate
            from traceinsight.load.progress import terminal_progress
            from traceinsight.results.gate import broken

        read = options.settings(
            output=output, json_out=json_out, markdown=markdown, no_html=no_html, force=force, user_code=user_code,
            max_size=max_size, min_gap_us=min_gap_us, low_utilization=low_utilization, fail_on=fail_on,
            fail_on_rules=fail_on_rule, max_idle=max_idle, max_syncs_per_step=max_syncs_per_step,
        )  # fmt: skip
        if _job(traces):
            with libraries_loading():
                from traceinsight.commands.job import JobOptions, analyze_job_and_write
                from traceinsight.results.gate import broken_ranks
            job = JobOptions(
                per_rank=per_rank, dask=dask or None, workers=workers, follow_symlinks=follow_symlinks
            )
            job_result = analyze_job_and_write(
                traces,
                read.wanted,
                read.reading,
                job,
                source_root=read.source_root(source_root, traces),
                top=max(top, 10),
            )
            work_done()
            if not read.budgets.empty:
                unit = "cycle" if job_result.cycles else "rank"
                status = gate(broken_ranks(job_result.rank_results, read.budgets, unit))
                if status:
                    raise typer.Exit(status)
            return
        trace = traces[0]
        if _rendered_again(trace, read, top):
            return
        with collector_paused(), terminal_progress(f"reading {trace.name}") as progress:
            result = analyze_and_write(
                trace,
                read.wanted,
                read.reading,
                source_root=read.source_root(source_root, traces),
                progress=progress,
                top=top,
                head_start=head_start,
            )
        work_done()
        status = gate(broken(result, read.budgets)) if not read.budgets.empty else 0
        if status:
            raise typer.Exit(status)


def _rendered_again(path: Path, read: options.Settings, top: int) -> bool:
    """When ``path`` is a stored result (a file ``--json`` wrote: a trace's, a job's, a diff's):
    its outputs written again from it alone, as the run that stored it wrote them, and its gate
    judged (a trace's result only); False for a trace."""
    from traceinsight.results.stored import looks_stored

    if not looks_stored(path):
        return False
    from traceinsight.commands.common import gate, plan, show, stem, write
    from traceinsight.results import Comparison, JobComparison, JobResult, Result
    from traceinsight.results.gate import broken
    from traceinsight.results.stored import read_result

    stored = read_result(path, (Result, JobResult, Comparison, JobComparison), read.reading.limit)
    if stored is None:
        return False
    if not isinstance(stored, Result) and not read.budgets.empty:
        raise ConfigError(
            f"{path} is a stored result of a job or a diff: the gate options judge a trace's result; "
            "give the job's traces, or use traceinsight diff --max-regression"
        )
    planned = plan(read.wanted, Path.cwd() / f"{stem(path)}.html", inputs=[path])
    written, to_stdout = write(stored, planned)
    show(stored, written, to_stderr=to_stdout, top=max(top, 10) if isinstance(stored, JobResult) else top)
    work_done()
    status = (
        gate(broken(stored, read.budgets)) if isinstance(stored, Result) and not read.budgets.empty else 0
    )
    if status:
        raise typer.Exit(status)
    return True


@contextmanager
def _head_start(traces: list[Path]) -> Iterator[HeadStart | None]:
    """:func:`traceinsight.load.head_start.begin` for one trace file (it needs neither polars nor
    numpy), closed at the end whatever happens (the load closes it too)."""
    if len(traces) != 1:
        yield None
        return
    from traceinsight.load.head_start import begin

    head_start = begin(traces[0])
    try:
        yield head_start
    finally:
        if head_start is not None:
            head_start.close()


def _job(traces: list[Path]) -> bool:
    """Whether ``traces`` name a job (:func:`traceinsight.job.is_job`); one trace file is not, and
    is told without loading the job's modules (their types take ~0.03 s to make)."""
    if len(traces) == 1 and traces[0].is_file():
        return False
    from traceinsight.job import is_job

    return is_job(traces)


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

    The outputs are checked before the work (:func:`~.common.plan`). ``source_root`` is the folder
    the page's code excerpts may be read from, and where that choice came from (None: no excerpts,
    only paths and line numbers). ``run`` carries what ``traceinsight run`` knows of the script's
    run. ``progress`` is told how the load advances; the slower steps after it show a spinner when
    stderr is a terminal. ``top`` is how many rows the terminal tables show. ``head_start``: scans
    of ``trace`` begun before (:mod:`traceinsight.load.head_start`).
    """
    from traceinsight.commands.common import plan, read_trace, show, stem, write

    planned = plan(wanted, Path.cwd() / f"{stem(trace)}.html", inputs=[trace])
    result = read_trace(
        trace, reading, progress=progress, run=run, page=planned.page is not None, head_start=head_start
    )
    written, to_stdout = write(
        result, planned, source_root=None if source_root is None else source_root.folder
    )
    if planned.page is not None and source_root is not None:
        written.append(
            (f"code excerpts ({source_root.origin})", Path(source_root.shown or source_root.folder))
        )
    show(result, written, console=console, to_stderr=to_stdout, top=top)
    return result
