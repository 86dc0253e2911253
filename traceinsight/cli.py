"""The `traceinsight` command: thin typer commands; errors become one line on stderr."""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, NoReturn

import typer

from traceinsight import __version__
from traceinsight.collector import collector_paused
from traceinsight.config import ProjectConfig, read_config
from traceinsight.config import source_root as resolve_source_root
from traceinsight.errors import ConfigError, TraceInsightError
from traceinsight.rules.findings import SEVERITIES
from traceinsight.thresholds import Thresholds

if TYPE_CHECKING:
    from traceinsight.gate import Budgets
    from traceinsight.load import SizeLimit

_DEFAULTS = Thresholds()

app = typer.Typer(
    name="traceinsight",
    help="Why does my GPU sit idle? Reads torch.profiler traces and names the line to fix.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


#: Set by a finished `analyze`: the process may then skip tearing down its objects (see :func:`main`).
_analysis_done = False


def fail(message: str, code: int = 2) -> typer.Exit:
    """Print ``traceinsight: error: message`` on stderr; return the Exit to raise.

    The message may quote a file name or a trace: control characters are replaced, so that it
    stays one line and cannot drive the terminal.
    """
    from traceinsight.load.text import printable

    sys.stderr.write(f"traceinsight: error: {printable(message)}\n")
    return typer.Exit(code)


_SIZE = re.compile(r"(?i)\s*(\d+(?:\.\d+)?)\s*(b|[kmgt]i?b?)?\s*")
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


def parse_size(text: str) -> int:
    """``500MB``, ``2GB``, ``1.5GiB``, ``4096`` → bytes (k/M/G/T are powers of 1000, with i of 1024)."""
    match = _SIZE.fullmatch(text)
    if match is None:
        raise ConfigError(f"--max-size {text!r}: not a size; write it like 500MB, 2GB or 8GiB")
    number, unit = float(match.group(1)), (match.group(2) or "").lower()
    scale = 1024 ** ("kmgt".index(unit[0]) + 1) if len(unit) > 1 and unit[1] == "i" else _UNITS[unit[:1]]
    return int(number * scale)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"traceinsight {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[
        bool, typer.Option("--version", callback=_version, is_eager=True, help="Show the version and exit.")
    ] = False,
) -> None:
    """Why does my GPU sit idle? Reads torch.profiler traces and names the line to fix."""


_EXIT_CODES = """\b
Exit status: 0 done; 1 a gate was broken (one line per broken budget on stderr);
2 bad input (an unreadable or invalid trace, a bad option or project setting);
3 an internal error (please report it)."""

_PROJECT = (
    "Every option below the outputs can also be set in [tool.traceinsight] of the nearest pyproject.toml."
)

# --- options shared by `analyze` and `diff` ------------------------------------------------------

JsonOption = Annotated[
    str | None,
    typer.Option("--json", metavar="PATH|-", help="Also write the result as JSON to PATH ('-': stdout).",
                 show_default=False),
]  # fmt: skip
MarkdownOption = Annotated[
    str | None,
    typer.Option("--markdown", metavar="PATH|-", show_default=False,
                 help="Also write a short GitHub Markdown summary (a PR comment, $GITHUB_STEP_SUMMARY) to PATH "
                 "('-': stdout)."),
]  # fmt: skip
NoHtmlOption = Annotated[bool, typer.Option("--no-html", help="Do not write the HTML page.")]
MinGapOption = Annotated[
    float,
    typer.Option(
        "--min-gap-us", metavar="US", min=0, help="Shortest GPU idle stretch reported as a gap, in µs."
    ),
]
LowUseOption = Annotated[
    float,
    typer.Option("--low-utilization", metavar="SHARE", min=0, max=1,
                 help="GPU compute share (0-1) below which low-gpu-utilization fires."),
]  # fmt: skip
UserCodeOption = Annotated[
    list[str] | None,
    typer.Option("--user-code", metavar="PACKAGE", show_default=False,
                 help="A package whose frames are your own code, for source lines (repeatable; also "
                 "user-code in [tool.traceinsight])."),
]  # fmt: skip
ForceOption = Annotated[
    bool,
    typer.Option("--force", help="Let an output replace a file that is not traceinsight's, and read a gzip trace "
                 "that expands more than 100 times (real traces expand at most about 45 times)."),
]  # fmt: skip
MaxSizeOption = Annotated[
    str | None,
    typer.Option("--max-size", metavar="SIZE", show_default=False,
                 help="Refuse traces holding more JSON than SIZE (e.g. 8GB) [default: no limit for traces, "
                 "16 MiB for a stored result; a gzip that expands more than 100 times is refused anyway]."),
]  # fmt: skip
FailOnOption = Annotated[
    str | None,
    typer.Option("--fail-on", metavar="SEVERITY", show_default=False,
                 help="Gate: exit 1 when a finding of SEVERITY or worse is found (high, medium or low)."),
]  # fmt: skip
FailOnRuleOption = Annotated[
    list[str] | None,
    typer.Option("--fail-on-rule", metavar="RULE", show_default=False,
                 help="Gate: exit 1 when a finding of rule RULE is found (repeatable; ids in the README)."),
]  # fmt: skip
MaxIdleOption = Annotated[
    float | None,
    typer.Option("--max-idle", metavar="PCT", min=0, show_default=False,
                 help="Gate: exit 1 when the GPU is idle more than PCT % of the step time."),
]  # fmt: skip
MaxSyncsOption = Annotated[
    float | None,
    typer.Option("--max-syncs-per-step", metavar="N", min=0, show_default=False,
                 help="Gate: exit 1 when the host waits on the GPU more than N times per step."),
]  # fmt: skip
TopOption = Annotated[
    int, typer.Option("--top", metavar="N", min=1, help="Rows shown in each terminal table.")
]


@dataclass(frozen=True, slots=True)
class _Shared:
    """What `analyze` and `diff` read alike from their options and the project table."""

    config: ProjectConfig
    user_code: tuple[str, ...]
    budgets: Budgets
    limit: SizeLimit
    thresholds: Thresholds


def _shared(
    *,
    user_code: list[str] | None,
    max_size: str | None,
    json_out: str | None,
    markdown: str | None,
    min_gap_us: float,
    low_utilization: float,
    fail_on: str | None,
    fail_on_rules: list[str] | None,
    max_idle: float | None,
    max_syncs_per_step: float | None,
    max_regression: float | None = None,
    force: bool = False,
) -> _Shared:
    """Read the project table and check the options both commands take (the command line wins)."""
    from traceinsight.gate import Budgets, budgets_from_table
    from traceinsight.load import SizeLimit

    config = read_config()
    if fail_on is not None and fail_on not in SEVERITIES:
        raise ConfigError(f"--fail-on {fail_on!r}: give one of {', '.join(SEVERITIES)}")
    if json_out == "-" and markdown == "-":
        raise ConfigError("--json - and --markdown - both ask for stdout; write one of them to a file")
    given = Budgets(
        fail_on=fail_on,
        fail_on_rules=tuple(fail_on_rules or ()),
        max_idle=max_idle,
        max_syncs_per_step=max_syncs_per_step,
        max_regression=max_regression,
    )
    return _Shared(
        config=config,
        user_code=tuple(dict.fromkeys([*(user_code or ()), *config.user_code])),
        budgets=budgets_from_table(config.table, str(config.path)).over(given),
        limit=SizeLimit(parse_size(max_size) if max_size is not None else None, force=force),
        thresholds=Thresholds(min_gap_us=min_gap_us, low_utilization=low_utilization),
    )


def _gate(lines: list[str]) -> None:
    """Print one line per broken budget and exit 1 (nothing when the gate passes)."""
    from traceinsight.gate import EXIT_BROKEN
    from traceinsight.load.text import printable

    for line in lines:
        sys.stderr.write(f"traceinsight: gate: {printable(line)}\n")
    if lines:
        raise typer.Exit(EXIT_BROKEN)


@contextmanager
def _errors(subject: object) -> Iterator[None]:
    """Every error becomes one line: bad input exit 2, no memory or a bug exit 3."""
    try:
        yield
    except TraceInsightError as exc:
        raise fail(str(exc), exc.exit_code) from None
    except MemoryError:
        raise fail(f"ran out of memory analyzing {subject}; try a machine with more memory", 3) from None
    except Exception as exc:  # a bug, not bad input: still one line unless debugging
        if os.environ.get("TRACEINSIGHT_DEBUG"):
            raise
        raise fail(
            f"internal error analyzing {subject}: {type(exc).__name__}: {exc}; "
            "rerun with TRACEINSIGHT_DEBUG=1 for the traceback and please report it",
            3,
        ) from None


@app.command(epilog=_EXIT_CODES)
def analyze(
    traces: Annotated[
        list[Path],
        # readable=False: the loader words an unreadable file in one line, not typer's usage box.
        typer.Argument(
            metavar="TRACE",
            help="A torch.profiler trace: .json or .json.gz. Several traces, a folder or a glob pattern: "
            "one report for a distributed job, one rank per trace.",
            show_default=False,
            readable=False,
        ),
    ],
    output: Annotated[
        Path | None,
        typer.Option(
            "-o",
            "--output",
            metavar="PATH",
            show_default=False,
            help="Where to write the HTML report [default: ./<trace name>.html].",
        ),
    ] = None,
    json_out: JsonOption = None,
    markdown: MarkdownOption = None,
    no_html: NoHtmlOption = False,
    top: TopOption = 5,
    min_gap_us: MinGapOption = _DEFAULTS.min_gap_us,
    low_utilization: LowUseOption = _DEFAULTS.low_utilization,
    user_code: UserCodeOption = None,
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
    force: ForceOption = False,
    max_size: MaxSizeOption = None,
    fail_on: FailOnOption = None,
    fail_on_rule: FailOnRuleOption = None,
    max_idle: MaxIdleOption = None,
    max_syncs_per_step: MaxSyncsOption = None,
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
    # numpy's OpenBLAS starts a spinning thread per core at import; nothing here uses BLAS, and on
    # a 2-core machine those threads take CPU from the loader's. (Only here: `run` keeps the user's.)
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from traceinsight.load.progress import terminal_progress
    from traceinsight.pipeline import analyze_and_write

    global _analysis_done
    from traceinsight.job.discover import is_job

    if is_job(traces):
        with _errors(" ".join(map(str, traces))):
            shared = _shared(user_code=user_code, max_size=max_size, json_out=json_out, markdown=markdown,
                             min_gap_us=min_gap_us, low_utilization=low_utilization, fail_on=fail_on,
                             fail_on_rules=fail_on_rule, max_idle=max_idle, max_syncs_per_step=max_syncs_per_step,
                             force=force)  # fmt: skip
            _analyze_job(traces, shared, output=output, json_out=json_out, markdown=markdown, no_html=no_html,
                         top=top, source_root=source_root, force=force, per_rank=per_rank, dask=dask,
                         workers=workers, follow_symlinks=follow_symlinks)  # fmt: skip
            _analysis_done = True
        return
    trace = traces[0]
    with _errors(trace), collector_paused():
        shared = _shared(user_code=user_code, max_size=max_size, json_out=json_out, markdown=markdown,
                         min_gap_us=min_gap_us, low_utilization=low_utilization, fail_on=fail_on,
                         fail_on_rules=fail_on_rule, max_idle=max_idle, max_syncs_per_step=max_syncs_per_step,
                         force=force)  # fmt: skip
        with terminal_progress(f"reading {trace.name}") as progress:
            report = analyze_and_write(
                trace,
                html=output,
                json_out=json_out,
                markdown=markdown,
                thresholds=shared.thresholds,
                write_html=not no_html,
                progress=progress,
                user_code=shared.user_code,
                source_root=resolve_source_root(source_root, shared.config),
                force=force,
                limit=shared.limit,
                top=top,
            )
        broken: list[str] = []
        if not shared.budgets.empty:
            from traceinsight.gate import broken as broken_budgets
            from traceinsight.render.json_report import report_dict

            broken = broken_budgets(report_dict(report), shared.budgets)
        _analysis_done = True
    _gate(broken)


def _analyze_job(traces: list[Path], shared: _Shared, *, output: Path | None, json_out: str | None,
                 markdown: str | None, no_html: bool, top: int, source_root: Path | None, force: bool,
                 per_rank: Path | None, dask: str | None, workers: int | None,
                 follow_symlinks: bool) -> None:  # fmt: skip
    """`analyze` on a distributed job (see :func:`traceinsight.pipeline.analyze_job_and_write`)."""
    from traceinsight.pipeline import analyze_job_and_write

    if not shared.budgets.empty:
        raise ConfigError("the gate options take one trace; gate each rank's trace on its own")
    analyze_job_and_write(
        traces,
        html=output,
        json_out=json_out,
        markdown=markdown,
        write_html=not no_html,
        thresholds=shared.thresholds,
        user_code=shared.user_code,
        source_root=resolve_source_root(source_root, shared.config),
        force=force,
        limit=shared.limit,
        per_rank=per_rank,
        dask=dask or None,
        workers=workers,
        top=max(top, 10),
        follow_symlinks=follow_symlinks,
    )


@app.command(epilog=_EXIT_CODES)
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
    json_out: JsonOption = None,
    markdown: MarkdownOption = None,
    no_html: NoHtmlOption = False,
    top: Annotated[
        int, typer.Option("--top", metavar="N", min=1, help="Kernels listed whose time changed most.")
    ] = 10,
    min_gap_us: MinGapOption = _DEFAULTS.min_gap_us,
    low_utilization: LowUseOption = _DEFAULTS.low_utilization,
    user_code: UserCodeOption = None,
    force: ForceOption = False,
    max_size: MaxSizeOption = None,
    fail_on: FailOnOption = None,
    fail_on_rule: FailOnRuleOption = None,
    max_idle: MaxIdleOption = None,
    max_syncs_per_step: MaxSyncsOption = None,
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
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    from traceinsight.load.progress import terminal_progress
    from traceinsight.pipeline import diff_and_write

    global _analysis_done
    with _errors(f"{before} and {after}"):
        shared = _shared(user_code=user_code, max_size=max_size, json_out=json_out, markdown=markdown,
                         min_gap_us=min_gap_us, low_utilization=low_utilization, fail_on=fail_on,
                         fail_on_rules=fail_on_rule, max_idle=max_idle, max_syncs_per_step=max_syncs_per_step,
                         max_regression=max_regression, force=force)  # fmt: skip
        comparison, after_result = diff_and_write(
            before,
            after,
            html=output,
            json_out=json_out,
            markdown=markdown,
            write_html=not no_html,
            thresholds=shared.thresholds,
            user_code=shared.user_code,
            progress=lambda path: terminal_progress(f"reading {path.name}"),
            limit=shared.limit,
            force=force,
            top=top,
        )
        broken: list[str] = []
        if not shared.budgets.empty:
            from traceinsight.gate import broken_diff

            broken = broken_diff(comparison, after_result, shared.budgets)
        _analysis_done = True
    _gate(broken)


def _deferred_runs() -> Callable[[], Callable[[], int] | None]:
    """Where `run` leaves its script for :func:`main` to start (see
    :func:`traceinsight.capture.command.defer_runs`); without torch's side, nothing."""
    try:
        from traceinsight.capture.command import defer_runs, take_deferred_run
    except ImportError:
        return lambda: None
    defer_runs()
    return take_deferred_run


def _register_run() -> None:
    """`run` lives with capture, the only part of the package that imports torch (lazily)."""
    try:
        from traceinsight.capture.command import run
    except ImportError:
        return
    app.command(
        "run",
        context_settings={
            "allow_extra_args": True,
            "ignore_unknown_options": True,
            "allow_interspersed_args": False,
        },
    )(run)


_register_run()


def _exit_interrupted() -> NoReturn:
    """One line and status 130. Not SystemExit: after an interrupted import the interpreter can end
    itself by SIGINT on the way out (seen 3 runs in 30), which a caller reads as another status."""
    with suppress(BrokenPipeError):
        sys.stderr.write("traceinsight: interrupted (Ctrl-C); no output was left half-written\n")
    _flush_and_exit(130)


def _interrupted(exit: BaseException) -> bool:
    """Whether ``exit`` is typer's status 130 for a KeyboardInterrupt (it prints nothing itself)."""
    seen: BaseException | None = exit
    for _ in range(8):
        if seen is None:
            return False
        if isinstance(seen, KeyboardInterrupt):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def main() -> None:
    """Console-script entry point.

    After `analyze` (every output written and flushed) the process ends at once: tearing down the
    tables of a large trace takes a noticeable part of a second and changes nothing. `run` ends
    normally, so the user's script's exit handlers still run.
    """
    deferred = _deferred_runs()
    try:
        app()
    except KeyboardInterrupt:  # while typer builds the command, before its own handler
        _exit_interrupted()
    except SystemExit as exc:
        if _interrupted(exc):
            # Ctrl-C before a script ran, or during an analysis (outputs are written whole or not
            # at all); a script's own Ctrl-C is `run`'s, which dies by SIGINT as Python does.
            _exit_interrupted()
        script = deferred() if exc.code in (0, None) else None
        if script is None:
            if not _analysis_done:
                raise
            code = exc.code
    else:
        code = 0
        script = deferred()
    if script is not None:  # `run`'s script, from here: not under typer's and click's frames
        try:
            status = script()
        except KeyboardInterrupt:  # during the analysis that follows the script
            _exit_interrupted()
        raise SystemExit(status)
    if not isinstance(code, int):
        raise SystemExit(code)
    _flush_and_exit(code)


def _flush_and_exit(code: int) -> NoReturn:
    """Flush stdout and stderr, then end the process at once with ``code``."""
    for stream in (sys.stdout, sys.stderr):
        with suppress(BrokenPipeError):  # its reader went away (`| head`): what is left is dropped
            stream.flush()
    os._exit(code)
