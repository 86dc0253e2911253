"""`traceinsight analyze`: one trace's result, or a distributed job's (:mod:`.job`), in every output.

The command reads its options (:mod:`.options`), loads the libraries (:func:`~traceinsight.process.libraries_loading`),
and runs the one flow a trace goes through, :func:`~.common.analyze_and_write` (a job's:
:func:`~.job.analyze_job_and_write`), both on the public API (:mod:`traceinsight.api`); `run`
hands the trace it recorded to the same flow, so a report made right after a capture is the one
made later from the file alone.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer

from traceinsight.commands import options
from traceinsight.load.head_start import HeadStart, begin
from traceinsight.load.progress import terminal_progress
from traceinsight.process import collector_paused, libraries_loading, quiet_blas, work_done

__all__ = ["analyze"]


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
            # The flow and what it loads (polars, numpy, the analyses, the renderers): ~0.8 s that
            # --help, --version and `run` before its script never pay (tests/test_cli.py).
            from traceinsight import api
            from traceinsight.commands import common
            from traceinsight.results.gate import broken, broken_job

        read = options.settings(
            output=output, json_out=json_out, markdown=markdown, no_html=no_html, force=force, user_code=user_code,
            max_size=max_size, min_gap_us=min_gap_us, low_utilization=low_utilization, fail_on=fail_on,
            fail_on_rules=fail_on_rule, max_idle=max_idle, max_syncs_per_step=max_syncs_per_step,
        )  # fmt: skip
        if api.is_job(traces):
            with libraries_loading():
                # A job's flow, types and drawing: ~8 ms one trace's analyze never pays (NOT_FOR_ONE_TRACE).
                from traceinsight.commands import job

            options_of_job = job.JobOptions(
                per_rank=per_rank, dask=dask or None, workers=workers, follow_symlinks=follow_symlinks
            )
            job_result = job.analyze_job_and_write(
                traces,
                read.wanted,
                read.reading,
                options_of_job,
                source_root=read.source_root(source_root, traces),
                top=max(top, 10),
            )
            work_done()
            status = common.gate(broken_job(job_result, read.budgets)) if not read.budgets.empty else 0
        else:
            trace = traces[0]
            # A job's options given with one trace would change nothing, silently (``--dask`` also
            # comes from the environment, where it is no one's mistake).
            job_only = (("--per-rank", per_rank is not None), ("--workers", workers is not None))
            unused = [name for name, given in (*job_only, ("--follow-symlinks", follow_symlinks)) if given]
            if unused:
                typer.echo(
                    f"traceinsight: note: {' and '.join(unused)} {'is' if len(unused) == 1 else 'are'} "
                    "for a job (several traces, a folder or a pattern), not one trace: left unused",
                    err=True,
                )
            # A stored result (--json): its outputs again. Its code excerpts come only from a
            # --source-root given here: its source lines are another run's words, and no project
            # file beside it picks a folder of this machine to read them from.
            stored_root = read.source_root(source_root) if source_root is not None else None
            if common.rendered_again(trace, read, top, stored_root, user_code_given=bool(user_code)):
                return
            with collector_paused(), terminal_progress(f"reading {trace.name}") as progress:
                result = common.analyze_and_write(
                    trace, read.wanted, read.reading, source_root=read.source_root(source_root, traces),
                    progress=progress, top=top, head_start=head_start,
                )  # fmt: skip
            work_done()
            status = common.gate(broken(result, read.budgets)) if not read.budgets.empty else 0
        if status:
            raise typer.Exit(status)


@contextmanager
def _head_start(traces: list[Path]) -> Iterator[HeadStart | None]:
    """:func:`traceinsight.load.head_start.begin` for one trace file (it needs neither polars nor
    numpy), closed at the end whatever happens (the load closes it too)."""
    if len(traces) != 1:
        yield None
        return
    head_start = begin(traces[0])
    try:
        yield head_start
    finally:
        if head_start is not None:
            head_start.close()
