"""The `traceinsight run` command: profile a training script, then analyze its trace.

Registered by the CLI as::

    app.command("run", context_settings=RUN_CONTEXT_SETTINGS)(run)

``RUN_CONTEXT_SETTINGS`` stops option parsing at the script, so everything after it (including
options that look like ours) reaches the script untouched.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console

from traceinsight.capture.recorder import CaptureResult, ProfileSettings, TraceRecorder, require_torch
from traceinsight.capture.script import (
    ScriptOutcome,
    ScriptTarget,
    exit_like_python,
    module_target,
    run_target,
    script_target,
)
from traceinsight.errors import CaptureError, OutputError, TraceInsightError

__all__ = ["RUN_CONTEXT_SETTINGS", "profile_and_report", "run"]

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
            help="Where to write the trace (gzip JSON; plain JSON if PATH does not end in .gz). "
            "Default: SCRIPT.<date-time>.pt.trace.json.gz in the current folder.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            help="Where to write the HTML report. Default: SCRIPT.<date-time>.report.html.",
            dir_okay=False,
            show_default=False,
        ),
    ] = None,
    json_out: Annotated[
        str | None,
        typer.Option(
            "--json", metavar="PATH", help="Also write the findings as JSON to PATH.", show_default=False
        ),
    ] = None,
    wait: Annotated[
        int,
        typer.Option(min=0, help="Steps to skip first (step 0 includes start-up)."),
    ] = _DEFAULTS.wait,
    warmup: Annotated[
        int,
        typer.Option(min=0, help="Steps profiled then thrown away, after the skipped ones."),
    ] = _DEFAULTS.warmup,
    active: Annotated[
        int,
        typer.Option(min=1, help="Steps recorded into the trace."),
    ] = _DEFAULTS.active,
    repeat: Annotated[
        int,
        typer.Option(min=0, help="Wait/warm-up/active cycles (0: until the script ends); the last is kept."),
    ] = _DEFAULTS.repeat,
    memory: Annotated[
        bool,
        typer.Option("--memory", help="Also record memory allocations."),
    ] = False,
    module: Annotated[
        bool,
        typer.Option("-m", "--module", help="Run SCRIPT as a module, like python -m SCRIPT."),
    ] = False,
) -> None:
    """Run a training script under the profiler, as `python SCRIPT ARGS` would, then report on it.

    Steps are marked without changing the script: every optimizer.step() of a torch.optim optimizer
    ends one (call traceinsight.step() in loops without one). The trace and the report are written
    even if the script fails or is interrupted; the exit status is the script's own.
    """
    console = Console(stderr=True)
    try:
        # Parsing stops at SCRIPT: the rest arrives in script_args (or, with other settings, ctx.args).
        words = (*(script_args or ()), *ctx.args)
        target = module_target(script, words) if module else script_target(script, words)
        require_torch()
        stamp = time.strftime("%Y%m%d-%H%M%S")
        trace_path = trace if trace is not None else Path(f"{target.stem}.{stamp}.pt.trace.json.gz")
        report_path = output if output is not None else Path(f"{target.stem}.{stamp}.report.html")
        _check_writable(trace_path, "--trace")
        _check_writable(report_path, "-o/--output")
        if json_out is not None and json_out != "-":
            _check_writable(Path(json_out), "--json")
        settings = ProfileSettings(
            wait=wait, warmup=warmup, active=active, repeat=repeat, profile_memory=memory
        )
        status = profile_and_report(target, settings, trace_path, report_path, json_out, console)
    except TraceInsightError as error:
        # The same one line the CLI prints for every command's errors; never a traceback.
        sys.stderr.write(f"traceinsight: error: {error}\n")
        raise typer.Exit(error.exit_code) from None
    if status != 0:
        raise typer.Exit(status)


def profile_and_report(
    target: ScriptTarget,
    settings: ProfileSettings,
    trace_path: Path,
    report_path: Path,
    json_out: str | None,
    console: Console,
) -> int:
    """Run ``target`` under the profiler, write the trace, analyze it; return the exit status.

    Raises :class:`TraceInsightError` (carrying the script's failing status, if any) when there is
    no trace or no report; for Ctrl-C, this process dies by SIGINT after writing, as Python does.
    """
    # Absolute, so that a script that changes folder does not move the trace it is writing.
    recorder = TraceRecorder(settings, trace_path.absolute())
    owner_pid = os.getpid()
    recorder.start()
    if not recorder.records_cuda:
        _say(console, "traceinsight: no CUDA device: profiling CPU activity only")
    try:
        outcome = run_target(target)
    finally:
        capture = recorder.finish()
    if os.getpid() != owner_pid:
        # A child the script forked came back through here: it writes and prints nothing.
        return outcome.exit_status

    if capture.trace is None:
        raise _with_exit_status(_no_trace_error(target, trace_path, capture, settings), outcome)
    _say(console, f"traceinsight: trace written: {trace_path}")
    _say_window_notes(console, capture, settings)
    _analyze(trace_path, report_path, json_out, console, outcome)  # prints the report's path
    return exit_like_python(outcome)


def _analyze(
    trace_path: Path, report_path: Path, json_out: str | None, console: Console, outcome: ScriptOutcome
) -> None:
    """Analyze the trace just written; on failure keep it and say how to retry."""
    from traceinsight.pipeline import analyze_and_write

    try:
        analyze_and_write(trace_path, html=report_path, json_out=json_out, console=console)
    except TraceInsightError as error:
        reason = str(error)
    except Exception as error:  # an analysis bug must not lose the user's run
        reason = f"{type(error).__name__}: {error}"
    else:
        return
    raise _with_exit_status(
        CaptureError(
            f"the trace {trace_path} was kept but no report was made ({reason}); "
            f"retry with: traceinsight analyze {trace_path}"
        ),
        outcome,
    )


def _no_trace_error(
    target: ScriptTarget, trace_path: Path, capture: CaptureResult, settings: ProfileSettings
) -> TraceInsightError:
    """Why nothing could be written, as one sentence with the next step."""
    if capture.export_error is not None:
        return OutputError(
            f"cannot write trace {trace_path}: {capture.export_error}; "
            "check the folder's free space and permissions, or pass another --trace"
        )
    if capture.profiler_error is not None:
        return CaptureError(
            f"no trace for {target.name}: torch.profiler failed ({capture.profiler_error}); "
            "if the script starts a profiler of its own, remove it (only one can run at a time)"
        )
    steps = capture.steps_run
    return CaptureError(
        f"no trace for {target.name}: the script ran {steps} step{'' if steps == 1 else 's'} but "
        f"recording starts after {settings.first_active_step} (--wait {settings.wait} + "
        f"--warmup {settings.warmup}); lower --wait/--warmup or let the script run more steps"
    )


def _with_exit_status(error: TraceInsightError, outcome: ScriptOutcome) -> TraceInsightError:
    """Keep the script's failing status on our error, so the CLI exits with it."""
    if outcome.exit_status != 0:
        error.exit_code = outcome.exit_status
    return error


def _say_window_notes(console: Console, capture: CaptureResult, settings: ProfileSettings) -> None:
    """Tell what the trace covers when it is not the full active window."""
    if capture.whole_run:
        _say(
            console,
            "traceinsight: no optimizer.step() or traceinsight.step() was seen: "
            "the trace covers the whole run as one step",
        )
    elif capture.steps_in_trace == 0:
        _say(
            console,
            f"traceinsight: the script ended after {capture.steps_run} steps, during the first recorded "
            "one: the trace holds only what ran after the last step; "
            "lower --wait/--warmup to record complete steps",
        )
    elif capture.steps_in_trace < settings.active:
        _say(
            console,
            f"traceinsight: the script ended during the active window: the trace holds "
            f"{capture.steps_in_trace} complete step{'' if capture.steps_in_trace == 1 else 's'} "
            f"of the {settings.active} asked for",
        )


def _check_writable(path: Path, option: str) -> None:
    """Fail before the script runs if an output could not be written where asked."""
    folder = path.absolute().parent
    if not folder.is_dir():
        raise OutputError(
            f"cannot write {path}: folder {folder} does not exist; create it or change {option}"
        )
    if not os.access(folder, os.W_OK):
        raise OutputError(f"cannot write {path}: folder {folder} is not writable; change {option}")
    if path.is_dir():
        raise OutputError(f"cannot write {path}: it is a folder; give a file name to {option}")


def _say(console: Console, text: str) -> None:
    """One status line on stderr, paths printed literally (no markup)."""
    console.print(text, markup=False, highlight=False, soft_wrap=True)
