"""`traceinsight diff`: two results compared; the command's options, its flow in
:mod:`.compare` (:func:`~.compare.diff_and_write`, on the public API).
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from traceinsight.commands import options
from traceinsight.load.progress import terminal_progress
from traceinsight.process import libraries_loading, quiet_blas, work_done

__all__ = ["diff"]


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
        # The flow and what it loads (polars, numpy, the analyses, a job's and a diff's types, the
        # renderers): ~0.8 s that --help and the other commands never pay (tests/test_cli.py).
        from traceinsight.commands import compare

    read = options.settings(
        output=output, json_out=json_out, markdown=markdown, no_html=no_html, force=force, user_code=user_code,
        max_size=max_size, min_gap_us=min_gap_us, low_utilization=low_utilization, fail_on=fail_on,
        fail_on_rules=fail_on_rule, max_idle=max_idle, max_syncs_per_step=max_syncs_per_step,
        max_regression=max_regression,
    )  # fmt: skip
    comparison, after_result = compare.diff_and_write(
        before,
        after,
        read.wanted,
        read.reading,
        progress=lambda path: terminal_progress(f"reading {path.name}"),
        top=top,
    )
    work_done()
    status = compare.held_to(comparison, after_result, read.budgets) if not read.budgets.empty else 0
    if status:
        raise typer.Exit(status)
