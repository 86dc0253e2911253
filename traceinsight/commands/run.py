"""The `traceinsight run` command: profile a training script, then analyze its trace.

Registered by the CLI as::

    app.command("run", context_settings=RUN_CONTEXT_SETTINGS)(run)

``RUN_CONTEXT_SETTINGS`` stops option parsing at the script, so everything after it (including
options that look like ours) reaches the script untouched. This module holds the command's
options, imported by every command and --help; its flow, and what that loads, is in
:mod:`.profiling` (exit status: see there).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from traceinsight.capture.settings import ProfileSettings

if TYPE_CHECKING:
    from traceinsight.capture.script import StagedRun

__all__ = ["RUN_CONTEXT_SETTINGS", "defer_runs", "run", "take_deferred_run"]

RUN_CONTEXT_SETTINGS: dict[str, Any] = {
    "allow_extra_args": True,
    "ignore_unknown_options": True,
    "allow_interspersed_args": False,
}
"""Click context settings `run` needs: the script's own arguments pass through untouched."""

_DEFAULTS = ProfileSettings()


def run(
    ctx: typer.Context,
    script: Annotated[
        str,
        typer.Argument(
            metavar="SCRIPT",
            help="The training script to run (with -m: the module).",
            show_default=False,
        ),
    ],
    script_args: Annotated[
        list[str] | None,
        typer.Argument(
            metavar="SCRIPT_ARGS",
            help="Passed to the script untouched, even if they look like options of ours.",
            show_default=False,
        ),
    ] = None,
    trace: Annotated[
        Path | None,
        typer.Option(
            "--trace",
            metavar="PATH",
            help="Where to write the trace (gzip JSON; plain JSON if PATH does not end in .gz). "
            "Default: SCRIPT.<date-time>.pt.trace.json.gz in the current folder; under torchrun "
            "SCRIPT.<date-time>.job/SCRIPT.rankN.pt.trace.json.gz ({rank} in PATH is replaced, "
            "else .rankN is added).",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            metavar="PATH",
            help="Where to write the HTML report. Default: SCRIPT.<date-time>.report.html.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        str | None,
        typer.Option(
            "--json",
            metavar="PATH|-",
            help="Also write the findings as JSON to PATH ('-': stdout, the script's own output then "
            "going to stderr).",
            show_default=False,
        ),
    ] = None,
    markdown: Annotated[
        str | None,
        typer.Option(
            "--markdown",
            metavar="PATH|-",
            help="Also write a short GitHub Markdown summary to PATH ('-': stdout, as --json -).",
            show_default=False,
        ),
    ] = None,
    no_html: Annotated[bool, typer.Option("--no-html", help="Do not write the HTML report.")] = False,
    wait: Annotated[
        int,
        typer.Option(metavar="N", min=0, help="Steps to skip first (step 0 includes start-up)."),
    ] = _DEFAULTS.wait,
    warmup: Annotated[
        int,
        typer.Option(metavar="N", min=0, help="Steps profiled then thrown away, after the skipped ones."),
    ] = _DEFAULTS.warmup,
    active: Annotated[
        int,
        typer.Option(metavar="N", min=1, help="Steps recorded into the trace."),
    ] = _DEFAULTS.active,
    repeat: Annotated[
        int,
        typer.Option(
            metavar="N",
            min=0,
            help="Wait/warm-up/active cycles (0: until the script ends). With more than one, every "
            "cycle's trace is kept, named as tensorboard_trace_handler names its cycles (--trace's name "
            "with the cycle's time: run.<time_ns>.pt.trace.json.gz); the report is of the last. "
            "traceinsight diff pools a folder (or quoted pattern) of them as one side of several runs.",
        ),
    ] = _DEFAULTS.repeat,
    memory: Annotated[
        bool,
        typer.Option("--memory", help="Also record memory allocations."),
    ] = False,
    stacks: Annotated[
        str,
        typer.Option(
            "--stacks",
            metavar="user|all|none",
            help="Python frames recorded in active steps. user: your own code's frames and the lines "
            "of its calls into torch, so findings name your lines; it makes Python-heavy code in "
            "your loop run slower while recording (a profile function runs on every Python call; "
            "the DataLoader's fetch is not traced), and the report says when recorded steps ran "
            "over 10% slower. all: torch's own tracer, every frame (much larger traces, a slower "
            "stop). none: no frames and no source lines.",
        ),
    ] = "user",
    user_code: Annotated[
        list[str] | None,
        typer.Option(
            "--user-code",
            metavar="PACKAGE",
            help="A package whose frames are your own code, even if installed (repeatable; adds to "
            "[tool.traceinsight] user-code of the script's pyproject.toml).",
            show_default=False,
        ),
    ] = None,
    max_memory: Annotated[
        str,
        typer.Option(
            "--max-memory",
            metavar="SIZE",
            help="Memory one recording may add to the process (e.g. 2G, 512M; powers of 1024): what the profiler "
            "holds while it records, and what stopping it then builds, counted from the RSS "
            "growth of the recorded window. When one more step would pass it, recording ends at "
            "that step boundary (a single step bigger than the budget is stopped inside it) and "
            "what was recorded is written; the memory is given back after the write.",
        ),
    ] = "2G",
    module: Annotated[
        bool,
        typer.Option("-m", "--module", help="Run SCRIPT as a module, like python -m SCRIPT."),
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force", help="Let the trace, report or JSON replace a file that is not traceinsight's."
        ),
    ] = False,
) -> None:
    """Run a training script under the profiler, as `python SCRIPT ARGS` would, then report on it.

    Options go before SCRIPT: every word after SCRIPT is the script's own, even one that looks like
    an option of ours (traceinsight run --active 3 train.py --lr 0.1).

    Steps are marked without changing the script: every optimizer.step() of a torch.optim optimizer
    ends one; in a loop without one, every loss.backward() does (or call traceinsight.step() at the
    end of each iteration). A script that ends before its first recorded step (--wait + --warmup
    steps come first) leaves no trace and no report, and a line says so. The trace and the report are written
    even if the script fails or is interrupted; the exit status is the script's own (when it is 0
    and no report could be made, 2 or 3). Under torchrun
    every rank writes its own files; `traceinsight run -m torch.distributed.run ...` (or `run
    torchrun ...`) profiles the workers.
    """
    # `run`'s flow and what it loads before the script: the recorder and its export (0.06-0.18 s),
    # the script's and the launcher's pieces, the terminal's renderer (polars): never for --help
    # nor for another command (tests/test_cli.py NOT_FOR_ONE_TRACE).
    from traceinsight.commands import profiling

    status = profiling.start(
        ctx, script, script_args, trace=trace, output=output, json_out=json_out, markdown=markdown,
        no_html=no_html, wait=wait, warmup=warmup, active=active, repeat=repeat, memory=memory, stacks=stacks,
        user_code=user_code, max_memory=max_memory, module=module, force=force, deferred=_DEFERRED,
    )  # fmt: skip
    if status != 0:
        raise typer.Exit(status)


_DEFERRED: list[StagedRun[int]] | None = None
"""Set by :func:`defer_runs`: the script run `run` has set up, for the entry point to start."""


def defer_runs() -> None:
    """Make `run` leave its script for :func:`take_deferred_run` instead of running it in the
    command: the entry point then runs the script in its own frame, not under typer's and click's
    dozen frames nor ours (:class:`~traceinsight.capture.script.StagedRun`). A script that walks
    its stack pays for every frame above it (``traceback.format_stack``, which
    ``torch.manual_seed`` calls once per call through ``torch.cuda._lazy_call`` on a machine whose
    CUDA is not initialised: 0.04 ms alone, 0.27 ms 17 frames deeper, per call)."""
    global _DEFERRED
    _DEFERRED = []


def take_deferred_run() -> StagedRun[int] | None:
    """The script run the last `run` command left (see :func:`defer_runs`), once: its status
    comes from ``finish`` after the caller ran what ``start`` gave."""
    return _DEFERRED.pop() if _DEFERRED else None
