"""`traceinsight run`'s flow: the script checked, run under the profiler, its trace written and
analyzed (:func:`start`; the command and its options: :mod:`.run`).

Imported when `run` runs, never for --help nor by another command: the recorder and the export it
loads (0.06-0.18 s), `run`'s script and launcher pieces (~0.004 s; one trace's analyze loads none
of them: tests/test_cli.py NOT_FOR_ONE_TRACE) and the terminal's renderer (polars) load here, before
the script starts, as they did inside the command before.

Exit status. Once the script has run, `run` exits with the script's own status; when that is 0
but a failure of ours left no report (the trace could not be written or read back, the profiler
failed, the analysis failed), it exits non-zero instead (:func:`_no_report_status`), so a CI job
never passes without its report. A run too short for the schedule (fewer steps than ``--wait +
--warmup``) is not a failure: it says so and keeps the script's status. An error found before the
script starts (bad path, no torch, unwritable folder) exits 2 without running it.
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import shlex
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from traceinsight.capture.distributed import (
    RankInfo,
    job_stamp,
    launcher_module,
    rank_info,
    rank_path,
    worker_launch_args,
)
from traceinsight.capture.memory import rss
from traceinsight.capture.recorder import CaptureResult, RecorderEvents, TraceRecorder, require_torch
from traceinsight.capture.script import (
    ScriptOutcome,
    ScriptSteps,
    ScriptTarget,
    StagedRun,
    drive,
    exit_like_python,
    module_target,
    run_target,
    run_target_steps,
    script_target,
)
from traceinsight.capture.settings import ProfileSettings
from traceinsight.commands.options import STDOUT, Reading, Wanted, one_on_stdout, parse_size
from traceinsight.commands.outputs import Kind, Output, check_outputs
from traceinsight.config import SourceRoot, read_config
from traceinsight.errors import CaptureError, ConfigError, OutputError, TraceInsightError
from traceinsight.load.text import printable
from traceinsight.model import Model, replace
from traceinsight.process import libraries_loading
from traceinsight.render.terminal import TerminalConsole

if TYPE_CHECKING:
    from traceinsight.capture.export import ExportResult, ProgressCallback
    from traceinsight.results import RunContext

__all__ = ["OutputPaths", "profile_and_report", "profile_and_report_steps", "start"]

_STACKS = ("user", "all", "none")


class OutputPaths(Model, frozen=True):
    """Where one run writes (absolute, so that a script that changes folder moves nothing)."""

    trace: Path
    report: Path
    json_out: str | None
    force: bool = False
    """``--force``: the outputs may replace files that are not traceinsight's."""
    markdown: str | None = None
    """``--markdown``: the short Markdown summary's path, ``-`` for stdout, or None."""
    write_html: bool = True
    """False with ``--no-html``."""

    @property
    def to_stdout(self) -> bool:
        """Whether stdout carries the JSON or the Markdown (the script's own prints go to stderr)."""
        return "-" in (self.json_out, self.markdown)


def start(
    ctx: typer.Context,
    script: str,
    script_args: list[str] | None,
    *,
    trace: Path | None,
    output: Path | None,
    json_out: str | None,
    markdown: str | None,
    no_html: bool,
    wait: int,
    warmup: int,
    active: int,
    repeat: int,
    memory: bool,
    stacks: str,
    user_code: list[str] | None,
    max_memory: str,
    module: bool,
    force: bool,
    deferred: list[StagedRun[int]] | None,
) -> int:
    """`traceinsight run` with its options read (:func:`traceinsight.commands.run.run`): the
    script checked, the profiler's settings and the outputs' paths made, then the script run under
    the profiler and reported on (:func:`profile_and_report_steps`); its exit status. With
    ``deferred`` (the entry point's list), the staged run is left there for the entry point to run
    in its own frame, and 0 returned."""
    console = TerminalConsole(stderr=True)  # 120 columns in a CI log, like analyze's
    try:
        # Parsing stops at SCRIPT: the rest arrives in script_args (or, with other settings, ctx.args).
        words = (*(script_args or ()), *ctx.args)
        if stacks not in _STACKS:
            raise CaptureError(f"--stacks must be one of user, all, none (not {stacks!r})")
        budget = parse_size(max_memory, "--max-memory")
        if launcher_module(script, module):
            require_torch()
            status = _launch_workers(script, module, words, _forwarded_options(ctx))
            raise typer.Exit(status)
        target = module_target(script, words) if module else script_target(script, words)
        require_torch()
        project = _project_folder(target)
        settings = ProfileSettings(
            wait=wait,
            warmup=warmup,
            active=active,
            repeat=repeat,
            profile_memory=memory,
            stacks=stacks,  # type: ignore[arg-type]  # checked against _STACKS above
            user_code=_user_code(project, user_code or ()),
            max_memory_bytes=budget,
        )
        rank = rank_info()
        if rank is not None:
            settings = replace(settings, record_startup=False, keep_cycles=False)
        paths = _output_paths(target, trace, output, json_out, rank, force=force, markdown=markdown,
                              write_html=not no_html)  # fmt: skip
    except TraceInsightError as error:
        raise typer.Exit(_said(error)) from None

    def go() -> ScriptSteps[int]:
        try:
            return (
                yield from profile_and_report_steps(
                    target, settings, paths, console, rank=rank, project=project
                )
            )
        except TraceInsightError as error:
            return _said(error)

    if deferred is not None:
        deferred.append(StagedRun(go()))  # run by the entry point once the CLI's frames are gone
        return 0
    return drive(go())


def _said(error: TraceInsightError) -> int:
    """The one line the CLI prints for every command's errors (never a traceback); its status."""
    sys.stderr.write(f"traceinsight: error: {printable(str(error))}\n")
    return error.exit_code


def profile_and_report(
    target: ScriptTarget,
    settings: ProfileSettings,
    paths: OutputPaths,
    console: Console,
    *,
    rank: RankInfo | None = None,
    project: Path | None = None,
) -> int:
    """Run ``target`` under the profiler, write the trace, analyze it; return the script's exit status.

    What went wrong with the trace or the report is said on stderr; it never changes the status.
    For Ctrl-C, this process dies by SIGINT after writing, as Python does.
    """
    return drive(profile_and_report_steps(target, settings, paths, console, rank=rank, project=project))


def profile_and_report_steps(
    target: ScriptTarget,
    settings: ProfileSettings,
    paths: OutputPaths,
    console: Console,
    *,
    rank: RankInfo | None = None,
    project: Path | None = None,
) -> ScriptSteps[int]:
    """:func:`profile_and_report` in stages (the script runs in the frame that drives them)."""
    speaks = rank is None or rank.rank == 0
    say = _Speaker(console if speaks else None, rank)
    recorder = TraceRecorder(
        settings, paths.trace, RecorderEvents(say=say, writing=say.writing, written=say.written)
    )
    owner_pid = os.getpid()
    started = datetime.datetime.now().astimezone()
    clock = time.perf_counter()
    recorder.start()
    if not recorder.records_cuda:
        say("no CUDA device: profiling CPU activity only")
    try:
        with _stdout_to_stderr(paths.to_stdout):
            outcome = yield from run_target_steps(target)
    except BaseException:
        recorder.finish(discard=True)
        raise
    elapsed = time.perf_counter() - clock
    # --help or a usage error before the first step: no trace, no report (nothing worth reading).
    before_first_step = outcome.parser_exit and recorder.steps_run == 0
    capture = recorder.finish(discard=before_first_step)
    if os.getpid() != owner_pid:
        # A child the script forked came back through here: it writes and prints nothing.
        return outcome.exit_status
    if before_first_step:
        say(f"the script exited (status {outcome.exit_status}) before its first step: nothing written")
        return exit_like_python(outcome)

    trace = _trace_to_report(capture, say)
    if trace is None:
        reason, failed = _no_trace_reason(target, capture, settings)
        # A failure of ours is an error; a run too short for the schedule is not (exit status 0).
        (say.error if failed else say)(reason)
        if failed:
            return _no_report_status(outcome, 2 if capture.export_error is not None else 3)
        return exit_like_python(outcome)
    _say_window_notes(say, capture, settings)
    context = _run_context(target, started, elapsed, outcome, capture, trace)
    failure = _analyze(
        trace, paths, settings, project, target, context, console if speaks else _quiet_console(), say
    )
    if failure is not None:
        return _no_report_status(outcome, failure)
    if rank is not None and rank.rank == 0:
        _say_job_files(say, paths, rank)
    if len(capture.cycles) > 1:
        _say_cycles(say, capture.cycles)
    return exit_like_python(outcome)


def _say_cycles(say: _Speaker, cycles: tuple[Path, ...]) -> None:
    """With ``--repeat``: the cycles kept, and how a diff pools them (the summary is the last's)."""
    folder = _shown(cycles[0].parent)
    say(
        f"kept {len(cycles)} profiler cycles, one trace each, in {folder}: "
        + ", ".join(path.name for path in cycles)
        + "; the report above is of the last. traceinsight diff pools a folder of one run's cycles "
        "(or a quoted pattern of them) as one side of several runs: traceinsight diff BEFORE_FOLDER "
        "AFTER_FOLDER"
    )


def _no_report_status(outcome: ScriptOutcome, failure: int) -> int:
    """The exit status of a run whose report a failure of ours prevented: the script's own when it
    failed (or was interrupted: Python's way), else ``failure`` (2: the trace could not be written
    or read; 3: a bug of ours or the profiler's), never 0 without a report."""
    status = exit_like_python(outcome)
    return status if status != 0 else failure


class _Speaker:
    """Status lines on stderr (``traceinsight: ...``) and the progress of writing a trace."""

    def __init__(self, console: Console | None, rank: RankInfo | None) -> None:
        self._console = console
        self._prefix = "traceinsight: " if rank is None else f"traceinsight (rank {rank.rank}): "

    def __call__(self, text: str) -> None:
        if self._console is not None:
            self._console.print(self._prefix + text, markup=False, highlight=False, soft_wrap=True)

    def written(self, export: ExportResult) -> None:
        """The trace file is in place: its path, size and the time writing it took."""
        self(
            f"trace written: {_shown(export.path)} ({export.written_bytes / 1e6:.1f} MB, "
            f"{export.raw_bytes / 1e6:.1f} MB of JSON, in {export.seconds:.1f} s)"
        )
        if export.repaired_names:
            self(f"torch wrote {export.repaired_names} names with unescaped quotes; they were escaped")

    def _stopping_lines(self, started: float, copying: threading.Event) -> None:
        """Every :data:`_LOG_PROGRESS_SECONDS` until our pass over torch's export begins: how long
        torch's stop and export have run, and the process's memory."""
        while not copying.wait(_LOG_PROGRESS_SECONDS):
            self(
                f"stopping the profiler and exporting its trace: {time.monotonic() - started:.0f} s, "
                f"process memory {rss() / 1e9:.1f} GB"
            )

    def error(self, text: str) -> None:
        """A problem of ours (every rank says it; it does not change the exit status)."""
        sys.stderr.write(f"{self._prefix}error: {text}\n")
        sys.stderr.flush()

    @contextlib.contextmanager
    def writing(self) -> Iterator[ProgressCallback | None]:
        """The progress of stopping the profiler and writing the trace: a live line on a terminal;
        elsewhere (a log) a line when it starts and one every few seconds while the file is written."""
        console = self._console
        if console is None:
            yield None
            return
        if not console.is_terminal:
            started = time.monotonic()
            last = [started]
            copying = threading.Event()  # our pass over torch's export has begun: it reports itself

            def logged(done: int, total: int) -> None:
                copying.set()
                now = time.monotonic()
                if now - last[0] >= _LOG_PROGRESS_SECONDS and done < total:
                    last[0] = now
                    self(
                        f"writing the trace: {done / 1e6:.0f} of {total / 1e6:.0f} MB "
                        f"({100 * done // max(total, 1)} %, {now - started:.0f} s)"
                    )

            # torch's stop and its export say nothing while they run (a large window: 30 s, then a
            # minute): a line every few seconds from the moment the stop begins.
            heartbeat = threading.Thread(
                target=self._stopping_lines,
                args=(started, copying),
                name="traceinsight-stop-log",
                daemon=True,
            )
            heartbeat.start()
            try:
                yield logged
            finally:
                copying.set()
                heartbeat.join(timeout=1)
            return
        with console.status(self._prefix + "stopping the profiler…", spinner="dots") as status:

            def progress(done: int, total: int) -> None:
                share = 100 * done // max(total, 1)
                status.update(f"{self._prefix}writing the trace ({total / 1e6:.0f} MB): {share} %")

            yield progress


#: Seconds between two progress lines of a trace being written, in a log.
_LOG_PROGRESS_SECONDS = 5.0


def _trace_to_report(capture: CaptureResult, say: _Speaker) -> Path | None:
    """The trace the report is made from: ours, or the last complete one the script exported with
    its own profiler (its last file holds a partial window when it stopped mid-window)."""
    if capture.foreign_profiler_at is not None:
        if capture.foreign_traces:
            if capture.trace is not None:
                capture.trace.unlink(missing_ok=True)  # the script's own trace is the one to read
            complete = [path for path in capture.foreign_traces if path not in capture.foreign_partial]
            chosen = complete[-1] if complete else capture.foreign_traces[-1]
            said = (
                f"the script started its own torch profiler ({capture.foreign_profiler_at}): "
                f"traceinsight stepped aside and reports on the trace the script exported: {_shown(chosen)}"
            )
            last = capture.foreign_traces[-1]
            if chosen != last:
                said += f" (its last one, {_shown(last)}, holds a window cut short when its profiler stopped)"
            elif not complete:
                said += " (a window cut short when its profiler stopped)"
            say(said)
            return chosen
        if capture.trace is None:
            return None
    return capture.trace


def _no_trace_reason(
    target: ScriptTarget, capture: CaptureResult, settings: ProfileSettings
) -> tuple[str, bool]:
    """Why nothing could be reported, as one sentence with the next step, and whether it is a
    failure (of writing or of the profiler) rather than a run that recorded nothing."""
    if capture.foreign_profiler_at is not None:
        return (
            f"the script started its own torch profiler ({capture.foreign_profiler_at}), so traceinsight "
            "stepped aside and recorded nothing; no trace exported by the script was found: analyze "
            "the script's own trace with traceinsight analyze PATH"
        ), False
    if capture.export_error is not None:
        return (
            f"cannot write trace: {capture.export_error}; check the folder's free space and "
            "permissions, or pass another --trace"
        ), True
    if capture.profiler_error is not None:
        return f"no trace for {target.name}: torch.profiler failed ({capture.profiler_error})", True
    if capture.memory_stop == "start-up" and capture.steps_run == 0:
        return (
            f"no trace for {target.name}: the start-up recording passed the memory budget "
            f"({_size(settings.max_memory_bytes)}) and was dropped, and no step was "
            "marked; raise --max-memory or mark steps with traceinsight.step()"
        ), False
    steps = capture.steps_run
    return (
        f"no trace for {target.name}: the script ran {steps} step{'' if steps == 1 else 's'} but "
        f"recording starts after {settings.first_active_step} (--wait {settings.wait} + "
        f"--warmup {settings.warmup}); lower --wait/--warmup or let the script run more steps"
    ), False


def _say_window_notes(say: _Speaker, capture: CaptureResult, settings: ProfileSettings) -> None:
    """Tell what the trace covers when it is not the full active window (the start-up recording
    dropped for memory was said when it happened)."""
    if capture.foreign_profiler_at is not None:
        return
    budget = _size(settings.max_memory_bytes)
    estimate = _size(capture.memory_estimate_bytes or 0)
    complete = f"{capture.steps_in_trace} complete step{'' if capture.steps_in_trace == 1 else 's'}"
    if capture.memory_stop == "boundary":
        say(
            f"the trace holds {complete} of the {settings.active} asked for: one more step would have "
            f"passed the memory budget (an estimated {estimate} with stopping the profiler, budget "
            f"{budget}, --max-memory); raise --max-memory to record more"
        )
        return
    if capture.memory_stop == "window":
        # No complete step: "0 complete steps and part of the next" read beside the report's "Steps 1".
        holds = (
            "part of one step, stopped before its end"
            if capture.steps_in_trace == 0
            else f"{complete} and part of the next"
        )
        say(
            f"recording was stopped inside a step at an estimated {estimate} with stopping the "
            f"profiler (budget {budget}, --max-memory): the trace holds {holds}; raise --max-memory, "
            "or mark shorter steps with traceinsight.step()"
        )
        return
    if capture.whole_run:
        say(
            "no optimizer.step() or traceinsight.step() was seen: the trace covers the whole run "
            "as one step, without Python frames; call traceinsight.step() at the end of each "
            "iteration of your loop to profile steps"
        )
    elif capture.steps_in_trace == 0:
        say(
            f"the script ended after {capture.steps_run} steps, during the first recorded one: "
            "the trace holds only what ran after the last step; lower --wait/--warmup to record "
            "complete steps"
        )
    elif capture.steps_in_trace < settings.active:
        say(
            f"the script ended during the active window: the trace holds "
            f"{complete} of the {settings.active} asked for"
        )


def _size(size: int) -> str:
    """``2.0 GiB``, or ``150 MiB`` under a GiB."""
    return f"{size / (1 << 30):.1f} GiB" if size >= 1 << 30 else f"{size / (1 << 20):.0f} MiB"


def _run_context(
    target: ScriptTarget,
    started: datetime.datetime,
    elapsed: float,
    outcome: ScriptOutcome,
    capture: CaptureResult,
    trace: Path,
) -> RunContext:
    """What the report says of the run (:class:`traceinsight.results.RunContext`)."""
    import torch  # the script loaded it already; this module is imported for --help, torch ~1-2 s

    from traceinsight.results import RunContext  # the analyses, polars: ~0.8 s, after the script

    words = sys.argv[1:]
    if "run" in words:
        command = "traceinsight " + shlex.join(words)
    else:
        command = "traceinsight run " + shlex.join(
            [*(["-m"] if target.is_module else []), target.name, *target.args]
        )
    ours = capture.trace is not None and trace == capture.trace
    return RunContext(
        command=command,
        script=target.name,
        started=started.isoformat(timespec="seconds"),
        torch_version=str(torch.__version__),
        elapsed_s=round(elapsed, 3),
        exit_status=outcome.exit_status,
        failure=outcome.failure,
        steps_recorded=None if (capture.whole_run or not ours) else capture.steps_in_trace,
        script_is_module=target.is_module,
        cores=os.cpu_count(),
        step_usage=capture.step_usage if ours else (),
        after_window_ns=capture.after_window_ns if ours else (),
    )


def _analyze(
    trace: Path,
    paths: OutputPaths,
    settings: ProfileSettings,
    project: Path | None,
    target: ScriptTarget,
    context: RunContext,
    console: Console,
    say: _Speaker,
) -> int | None:
    """Analyze the trace just written; on failure keep it, say how to retry and return the exit
    status the failure calls for (the error's own; 3 for a bug), else None."""
    try:
        with libraries_loading():
            # `analyze`'s flow and what it loads (polars, the analyses, the renderers): ~0.8 s
            # that the script never waits for (it is loaded once the script has run).
            from traceinsight.commands import common
        # Paths as the user would type them (relative inside the current folder): the report is
        # shared, the user's folder layout need not be.
        common.analyze_and_write(
            _shown(trace),
            Wanted(
                html=_shown(paths.report),
                json=paths.json_out if paths.json_out in (None, "-") else str(_shown(Path(paths.json_out))),
                markdown=paths.markdown
                if paths.markdown in (None, "-")
                else str(_shown(Path(paths.markdown))),
                write_html=paths.write_html,
                force=paths.force,
            ),
            Reading(user_code=settings.user_code),
            console=console,
            source_root=None
            if project is None
            else SourceRoot(project, "the script's project folder", shown=_typed_folder(project, target)),
            run=context,
        )
    except TraceInsightError as error:
        reason, status = str(error), error.exit_code
    except Exception as error:  # an analysis bug must not lose the user's run
        reason, status = f"{type(error).__name__}: {error}", 3
    else:
        return None
    say.error(
        f"the trace {trace} was kept but no report was made ({reason}); "
        f"retry with: traceinsight analyze {trace}"
    )
    return status


def _say_job_files(say: _Speaker, paths: OutputPaths, rank: RankInfo) -> None:
    """Rank 0 says how to make the job report once every rank has written its trace (ranks end at
    their own pace, so rank 0 does not wait for them)."""
    # As the user would type them (relative inside the current folder), like every path run
    # prints: a log shared with the report need not carry the user's folder layout.
    traces = " ".join(str(_shown(rank_path(_rank_zero_name(paths.trace), r))) for r in range(rank.world_size))
    folder = _shown(paths.trace.parent)
    say(
        f"this job has {rank.world_size} ranks, each with its own trace and report in "
        f"{folder}; the summary above is rank 0's. When every rank has finished, "
        f"the job report (stragglers, what each rank waits on): traceinsight analyze {folder}/ "
        f"(the traces: {traces})"
    )


def _rank_zero_name(path: Path) -> Path:
    """The path as given before ``.rank0`` was added (so other ranks' names can be made)."""
    return path.with_name(path.name.replace(".rank0", "", 1))


def _shown(path: Path) -> Path:
    """``path`` relative to the current folder when it lies inside it (as the user would type it)."""
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _typed_folder(folder: Path, target: ScriptTarget) -> str:
    """``folder`` as the user would type it from the current folder (``.``, ``src``, ``../b``) when
    the two share a folder below the root; else reached from the script's path as typed
    (``../lib/train.py``: ``../lib/..``), when that is relative; else its name alone. Never an
    absolute path: the user's folder layout stays out of a log shared with the report."""
    here = Path.cwd()
    try:
        if os.path.commonpath([here, folder]) != os.path.sep:
            return os.path.relpath(folder, here)
    except ValueError:  # another drive
        pass
    if not target.is_module and not os.path.isabs(target.name):
        real = Path(os.path.realpath(target.name)).parent
        if folder == real or folder in real.parents:
            up = len(real.relative_to(folder).parts)
            return os.path.normpath(os.path.join(os.path.dirname(target.name), *[os.pardir] * up))
    return folder.name or str(folder)


def _quiet_console() -> Console:
    return Console(file=io.StringIO(), stderr=False)


def _project_folder(target: ScriptTarget) -> Path:
    """The script's project: the nearest folder at or above it with pyproject.toml or .git."""
    start = Path.cwd() if target.is_module else Path(os.path.realpath(target.name)).parent
    for folder in (start, *start.parents):
        if (folder / "pyproject.toml").is_file() or (folder / ".git").exists():
            return folder
    return start


def _user_code(project: Path, given: tuple[str, ...] | list[str]) -> tuple[str, ...]:
    """``--user-code`` packages merged with ``[tool.traceinsight] user-code`` of the script's project."""
    try:
        configured = read_config(project).user_code
    except ConfigError:
        raise
    merged: list[str] = []
    for name in (*given, *configured):
        if name not in merged:
            merged.append(name)
    return tuple(merged)


def _output_paths(
    target: ScriptTarget,
    trace: Path | None,
    output: Path | None,
    json_out: str | None,
    rank: RankInfo | None,
    *,
    force: bool = False,
    markdown: str | None = None,
    write_html: bool = True,
) -> OutputPaths:
    """The outputs' absolute paths, per rank under torchrun; fails now if one cannot be written, or
    would replace the script or a file that is not ours (:func:`traceinsight.commands.outputs.check_outputs`;
    a trace reached through a symlink is written over the file it names, the link kept)."""
    if trace is not None and str(trace) == STDOUT:
        raise OutputError(
            "--trace -: run writes the trace to a file and reads it back for the report; give a path"
        )
    if write_html and output is not None and str(output) == STDOUT:
        raise OutputError(
            "-o -: run writes its report to a file (stdout is the script's); give a path, "
            "or write the page of a saved trace to stdout with traceinsight analyze TRACE -o -"
        )
    one_on_stdout(page=None, json_out=json_out, markdown=markdown)
    if rank is None:
        stamp = time.strftime("%Y%m%d-%H%M%S")
        trace_path = trace if trace is not None else Path(f"{target.stem}.{stamp}.pt.trace.json.gz")
        report_path = output if output is not None else Path(f"{target.stem}.{stamp}.report.html")
        json_path = json_out
        markdown_path = markdown
    else:
        folder = Path(f"{target.stem}.{job_stamp()}.job")
        if trace is None or output is None:
            folder.mkdir(exist_ok=True)
        trace_path = rank_path(
            trace if trace is not None else folder / f"{target.stem}.pt.trace.json.gz", rank.rank
        )
        report_path = rank_path(
            output if output is not None else folder / f"{target.stem}.report.html", rank.rank
        )
        json_path = str(rank_path(Path(json_out), rank.rank)) if json_out not in (None, "-") else json_out
        markdown_path = str(rank_path(Path(markdown), rank.rank)) if markdown not in (None, "-") else markdown
    _check_writable(trace_path, "--trace")
    if write_html:
        _check_writable(report_path, "-o/--output")
    if json_path is not None and json_path != "-":
        _check_writable(Path(json_path), "--json")
    if markdown_path is not None and markdown_path != "-":
        _check_writable(Path(markdown_path), "--markdown")
    planned = [Output("--trace", trace_path, Kind.TRACE, readable_after=True)]
    if write_html:
        planned.append(Output("-o/--output", report_path, Kind.HTML))
    if json_path is not None and json_path != "-":
        planned.append(Output("--json", Path(json_path), Kind.JSON))
    if markdown_path is not None and markdown_path != "-":
        planned.append(Output("--markdown", Path(markdown_path), Kind.MARKDOWN))
    script = [] if target.is_module else [Path(target.name)]
    check_outputs(planned, inputs=script, inputs_are="the script being profiled", force=force)
    if trace_path.is_symlink():  # the trace is written by a rename: over the file the link names
        trace_path = Path(os.path.realpath(trace_path))
    return OutputPaths(
        trace=trace_path.absolute(),
        report=report_path.absolute(),
        json_out=str(Path(json_path).absolute()) if json_path not in (None, "-") else json_path,
        force=force,
        markdown=str(Path(markdown_path).absolute()) if markdown_path not in (None, "-") else markdown_path,
        write_html=write_html,
    )


def _forwarded_options(ctx: typer.Context) -> list[str]:
    """Our options as given on the command line, to pass on to every worker of a torchrun job."""
    words: list[str] = []
    for name, value in ctx.params.items():
        if name in ("script", "script_args", "module") or value is None:
            continue
        source = ctx.get_parameter_source(name)
        if source is None or source.name == "DEFAULT":
            continue
        flag = "--" + name.replace("_", "-") if name != "json_out" else "--json"
        if isinstance(value, bool):
            if value:
                words.append(flag)
        elif isinstance(value, list):
            for item in value:
                words += [flag, str(item)]
        else:
            words += [flag, str(value)]
    return words


def _launch_workers(script: str, module: bool, words: tuple[str, ...], our_options: list[str]) -> int:
    """Run torchrun unprofiled, its workers under ``traceinsight run``; return its exit status."""
    launcher_args = worker_launch_args(words, our_options)
    name = "torch.distributed.run" if module or not os.path.isfile(script) else script
    target = ScriptTarget(name=name, args=tuple(launcher_args), is_module=name == "torch.distributed.run")
    sys.stderr.write(
        "traceinsight: profiling the workers of this torchrun job (not the launcher); "
        "each rank writes its own files, rank 0 prints the summary\n"
    )
    with warnings.catch_warnings():
        # runpy's "found in sys.modules … prior to execution": torch.distributed.run was imported
        # to recognise the launcher; running it as __main__ is what torchrun itself does.
        warnings.filterwarnings(
            "ignore", message=".*found in sys.modules after import of package", category=RuntimeWarning
        )
        return exit_like_python(run_target(target))


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


@contextlib.contextmanager
def _stdout_to_stderr(active: bool) -> Iterator[None]:
    """While the script runs, its stdout goes to stderr when ours carries the JSON or Markdown
    (``run --json - | jq``): ``print`` (``sys.stdout``) and the file descriptor 1 its children
    and C code write to, both put back after it."""
    if not active:
        yield
        return
    sys.stdout.flush()
    try:
        saved: int | None = os.dup(1)
        os.dup2(2, 1)
    except OSError:  # no file descriptor 1 to move (an embedded interpreter): print() still is
        saved = None
    try:
        with contextlib.redirect_stdout(sys.stderr):
            yield
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
        if saved is not None:
            os.dup2(saved, 1)
            os.close(saved)
