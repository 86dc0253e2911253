"""The one path from a trace file to every output: load → analyze → rules → renderers.

Both commands (`analyze` and `run`) go through :func:`analyze_and_write`, so a report made right
after a capture is the same as one made later from the file alone; `diff` goes through
:func:`diff_and_write`, which reads each side as `analyze` would (or takes its stored JSON result).
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from rich.console import Console
from rich.text import Text

from traceinsight.compare import Comparison, compare, read_result
from traceinsight.errors import OutputError, TraceFormatError
from traceinsight.load import SizeLimit, load_trace
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.text import printable
from traceinsight.render.json_report import JsonRenderer, report_dict
from traceinsight.render.terminal import TerminalConsole, print_summary, reader_gone
from traceinsight.report import Report, RunContext, report_for
from traceinsight.thresholds import Thresholds

if TYPE_CHECKING:
    from traceinsight.job import JobReport


def _stem(trace: Path) -> str:
    name = trace.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def default_report_path(trace: Path) -> Path:
    """``<cwd>/<trace name without .json/.json.gz>.html``."""
    return Path.cwd() / f"{_stem(trace)}.html"


def default_diff_path(before: Path, after: Path) -> Path:
    """``<cwd>/<before>-vs-<after>.html`` (names without .json/.json.gz)."""
    return Path.cwd() / f"{_stem(before)}-vs-{_stem(after)}.html"


def check_writable(path: Path) -> None:
    """Fail before the (possibly long) analysis when an output's folder does not exist."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise OutputError(
            f"cannot write {path}: the folder {directory} does not exist; create it or pick another path"
        )


#: What every report page carries in its head (``templates/base.html``): a file that has it may be
#: replaced by a new report at the default path.
REPORT_MARKER: Final = b'<meta name="generator" content="traceinsight '


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same resolved path, or the same inode (hard links)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a traceinsight report (its head carries :data:`REPORT_MARKER`)."""
    try:
        with path.open("rb") as stream:
            return REPORT_MARKER in stream.read(4096)
    except OSError:
        return False


def check_outputs(
    trace: Path | Sequence[Path],
    outputs: list[tuple[str, Path]],
    *,
    default_report: Path | None = None,
    force: bool = False,
) -> None:
    """Refuse, before the analysis, outputs that would destroy a file that is not ours to replace.

    ``trace`` is the input (or the inputs); ``outputs`` are (option, path) pairs. No output may be
    an input or another output (compared after resolving links and by inode). ``default_report``
    is the report path the user did not choose (``./<trace name>.html``): it may replace only an
    earlier traceinsight report, unless ``force``.
    """
    inputs = [trace] if isinstance(trace, Path) else list(trace)
    for index, (option, path) in enumerate(outputs):
        check_writable(path)
        if any(_same_file(path, source) for source in inputs):
            raise OutputError(
                f"cannot write {path} ({option}): it is the trace being analyzed; pick another path"
            )
        for other_option, other in outputs[:index]:
            if _same_file(path, other):
                raise OutputError(
                    f"cannot write {path}: {other_option} and {option} name the same file; give them different paths"
                )
    replacing = default_report is not None and not force and os.path.lexists(default_report)
    if (
        replacing
        and default_report is not None
        and (default_report.is_dir() or not _is_report(default_report))
    ):
        raise OutputError(
            f"will not replace {default_report}: it exists and is not a traceinsight report; "
            "choose the report's path with -o, or pass --force to replace it"
        )


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it: never a half-written output."""
    directory = path.parent if str(path.parent) else Path(".")
    check_writable(path)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        # mkstemp creates 0600; a report is made to be shared, so use the usual umask mode.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except OSError as exc:
        raise OutputError(
            f"cannot write {path}: {exc.strerror or exc}; check the folder's permissions"
        ) from exc


@contextmanager
def _stage(description: str) -> Iterator[None]:
    """A spinner on stderr for a step that may take a while; nothing when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    with Console(stderr=True).status(description, spinner="dots"):
        yield


@contextmanager
def _timed(stage: str) -> Iterator[None]:
    """With ``TRACEINSIGHT_TIMINGS=1``, print how long ``stage`` took on stderr (for benchmarks:
    ``traceinsight timing: <stage> <seconds> s``, one line per stage)."""
    if os.environ.get("TRACEINSIGHT_TIMINGS") != "1":
        yield
        return
    start = time.perf_counter()
    try:
        yield
    finally:
        print(f"traceinsight timing: {stage} {time.perf_counter() - start:.3f} s", file=sys.stderr)


def render_html(report: Report, source_root: Path | None) -> str:
    """The self-contained HTML page (code excerpts read only from ``source_root``; None: none)."""
    from traceinsight.render.html import HtmlRenderer

    return HtmlRenderer(source_root=source_root).render(report)


def _prepare_html() -> None:
    """Import the HTML renderer and compile its templates; whatever fails here fails again, with
    its one-line error, when the page is rendered.

    matplotlib and jinja2 take ~0.5 s of CPU to import, and the templates ~50 ms to compile. The
    command does both in a thread that starts once the trace is loaded: the load keeps both cores
    busy (two scanning threads and the main one), the analysis about 1.4 of them, so the import
    finds a free core there and during the load took it from the load. 5 paired runs per shape at
    0.5 GB: load 0.60-0.71x, analysis 1.21-1.26x, whole process 0.95-0.98x; maximum RSS the same
    to +14 MB (the import's transient memory now meets the analysis's peak)."""
    with contextlib.suppress(Exception):  # reported by the render itself
        importlib.import_module("traceinsight.render.html").prepare()


def give_back_freed_memory() -> None:
    """Return the heap pages the loader freed to the system (glibc's ``malloc_trim``).

    Loading allocates and frees block after block (gunzipped text, scanned columns); glibc keeps
    freed pages of its heap in the process, where the analysis cannot use them (polars has an
    allocator of its own). Trimming once here lowers the peak that follows; elsewhere it does nothing.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def analyze_and_write(
    trace: Path,
    *,
    html: Path | None,
    json_out: str | None = None,
    console: Console | None = None,
    thresholds: Thresholds | None = None,
    write_html: bool = True,
    progress: ProgressCallback | None = None,
    user_code: tuple[str, ...] = (),
    source_root: Path | None = None,
    run: RunContext | None = None,
    force: bool = False,
    limit: SizeLimit | None = None,
    markdown: str | None = None,
    top: int = 5,
) -> Report:
    """Analyze ``trace``; print the terminal summary; write the HTML report (and JSON if asked).

    ``json_out`` is a path, or ``"-"`` for stdout (the summary then goes to stderr so stdout stays
    valid JSON). ``html`` None means the default name in the current folder. ``progress`` is told
    how the load advances; the slower steps after it show a spinner when stderr is a terminal.
    ``user_code`` names packages whose frames are the user's own code (``--user-code``).
    ``source_root`` is the folder the report's code excerpts may be read from (None: no excerpts,
    only paths and line numbers). ``run`` carries what ``traceinsight run`` knows of the script's
    run. Outputs are checked first (:func:`check_outputs`; ``force`` lets the default report path
    replace any file). ``limit`` bounds how much JSON the trace may expand to. ``markdown`` is a
    path or ``"-"`` for the Markdown summary; ``top`` is how many rows the terminal tables show.
    """
    html_path = (html if html is not None else default_report_path(trace)) if write_html else None
    targets = _targets(html_path, json_out, markdown)
    check_outputs(trace, targets, default_report=html_path if html is None else None, force=force)
    with _timed("load"):
        loaded = load_trace(trace, progress=progress, limit=limit)
        give_back_freed_memory()
    if html_path is not None:
        threading.Thread(target=_prepare_html, daemon=True).start()  # beside the analysis: see there
    with _stage(f"analyzing {trace.name}"), _timed("analysis"):
        report = report_for(loaded, thresholds, user_code, run)
    del loaded

    def page() -> str:
        return render_html(report, source_root)

    def summary() -> str:
        from traceinsight.render.markdown import MarkdownRenderer

        return MarkdownRenderer().render(report)

    outputs, to_stdout = _write_outputs(
        [
            ("JSON", json_out, lambda: JsonRenderer().render(report)),
            ("Markdown", markdown, summary),
            ("report", None if html_path is None else str(html_path), page),
        ]
    )
    with _timed("terminal"):
        print_summary(report, console or TerminalConsole(stderr=to_stdout), outputs, top=top)
    return report


def _targets(html: Path | None, json_out: str | None, markdown: str | None) -> list[tuple[str, Path]]:
    """The files a command will write, as (option, path) pairs for :func:`check_outputs`."""
    targets = [("-o/--output", html)] if html is not None else []
    targets += [(option, Path(value)) for option, value in (("--json", json_out), ("--markdown", markdown))
                if value is not None and value != "-"]  # fmt: skip
    return targets


def _write_outputs(
    outputs: list[tuple[str, str | None, Callable[[], str]]],
) -> tuple[list[tuple[str, Path]], bool]:
    """Write each (label, destination, text maker): a path atomically, ``"-"`` to stdout, None not at
    all. Returns the files written and whether stdout was used (the summary then goes to stderr)."""
    written: list[tuple[str, Path]] = []
    to_stdout = False
    for label, destination, make in outputs:
        if destination is None:
            continue
        stage = "HTML" if label in ("report", "page") else label
        if destination == "-":
            with _timed(stage):
                text = make()
                try:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                except BrokenPipeError:
                    reader_gone()
            to_stdout = True
            continue
        path = Path(destination)
        with _stage(f"writing {path.name}"), _timed(stage):
            text = make()
            write_atomically(path, text)
        written.append((label, path))
    return written, to_stdout


def result_of(
    path: Path,
    *,
    thresholds: Thresholds | None = None,
    user_code: tuple[str, ...] = (),
    progress: ProgressCallback | None = None,
    limit: SizeLimit | None = None,
) -> dict[str, Any]:
    """The JSON result of ``path``: read as it is when it is one (``analyze --json``), else the
    trace analyzed as ``analyze`` does."""
    stored = read_result(path)
    if stored is not None:
        return stored
    loaded = load_trace(path, progress=progress, limit=limit)
    give_back_freed_memory()
    with _stage(f"analyzing {path.name}"):
        report = report_for(loaded, thresholds, user_code)
    del loaded
    return report_dict(report)


def diff_and_write(
    before: Path,
    after: Path,
    *,
    html: Path | None,
    json_out: str | None = None,
    markdown: str | None = None,
    write_html: bool = True,
    console: Console | None = None,
    thresholds: Thresholds | None = None,
    user_code: tuple[str, ...] = (),
    progress: Callable[[Path], AbstractContextManager[ProgressCallback | None]] | None = None,
    limit: SizeLimit | None = None,
    force: bool = False,
    top: int = 10,
) -> tuple[Comparison, dict[str, Any]]:
    """Compare ``before`` with ``after`` (each a trace or a JSON result); print the summary, write
    the page (and JSON/Markdown if asked). Returns the comparison and the after side's result (for
    the gate). ``progress(path)`` opens the load's progress display for each trace read."""
    from traceinsight.compare import comparison_dict
    from traceinsight.render.diff import ComparisonHtmlRenderer, comparison_renderables
    from traceinsight.render.markdown import render_comparison

    html_path = (html if html is not None else default_diff_path(before, after)) if write_html else None
    check_outputs(
        (before, after),
        _targets(html_path, json_out, markdown),
        default_report=html_path if html is None else None,
        force=force,
    )
    documents = []
    for path in (before, after):
        with progress(path) if progress is not None else nullcontext() as callback:
            documents.append(
                result_of(path, thresholds=thresholds, user_code=user_code, progress=callback, limit=limit)
            )
    try:
        comparison = compare(documents[0], documents[1], before.name, after.name, top=top)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as error:
        # Only a stored result can lack what compare reads (an analysis always has it): bad input.
        stored = " and ".join(str(path) for path in (before, after) if read_result(path) is not None)
        raise TraceFormatError(
            f"cannot compare {stored or before}: not a complete traceinsight result "
            f"({type(error).__name__}: {error}); write it again with traceinsight analyze --json"
        ) from None
    outputs, to_stdout = _write_outputs(
        [
            (
                "JSON",
                json_out,
                lambda: json.dumps(comparison_dict(comparison), indent=2, ensure_ascii=False) + "\n",
            ),
            ("Markdown", markdown, lambda: render_comparison(comparison)),
            (
                "page",
                None if html_path is None else str(html_path),
                lambda: ComparisonHtmlRenderer().render(comparison),
            ),
        ]
    )
    out = console or TerminalConsole(stderr=to_stdout)
    for part in comparison_renderables(comparison):
        out.print(part)
    for label, path in outputs:
        out.print(Text.assemble(f"{label}: ", (printable(str(path)), "bold")))
    return comparison, documents[1]


def default_job_report_path(arguments: list[Path]) -> Path:
    """``./<folder name>.html`` for one folder, else ``./job.html``."""
    if len(arguments) == 1 and arguments[0].is_dir():
        return Path.cwd() / f"{arguments[0].resolve().name or 'job'}.html"
    return Path.cwd() / "job.html"


def analyze_job_and_write(
    arguments: list[Path],
    *,
    html: Path | None,
    json_out: str | None = None,
    markdown: str | None = None,
    write_html: bool = True,
    console: Console | None = None,
    thresholds: Thresholds | None = None,
    user_code: tuple[str, ...] = (),
    source_root: Path | None = None,
    force: bool = False,
    limit: SizeLimit | None = None,
    per_rank: Path | None = None,
    dask: str | None = None,
    workers: int | None = None,
    top: int = 10,
) -> JobReport:
    """Analyze a distributed job (several traces, a folder, a pattern): each rank on its own in a
    local process pool, or on the dask cluster at ``dask``; combine; print the job summary; write
    the job's HTML page (and JSON / Markdown if asked). ``per_rank`` is a folder that gets each
    rank's own JSON and HTML report (``rank-<N>.json/.html``); with ``dask`` it must be a folder
    the workers can write to. ``workers`` fixes the local pool's size (default: cores and memory).
    """
    from traceinsight.job import RankTask, combine, discover_ranks
    from traceinsight.job.execute import rank_progress, run_dask, run_local
    from traceinsight.render.job_json import JobJsonRenderer
    from traceinsight.render.job_text import print_job_summary, render_job_markdown

    files = discover_ranks(arguments)
    html_path = (html if html is not None else default_job_report_path(arguments)) if write_html else None
    targets = _targets(html_path, json_out, markdown)
    for file in files:
        check_outputs(file.path, targets, default_report=html_path if html is None else None, force=force)
    if per_rank is not None and not per_rank.is_dir():
        raise OutputError(f"--per-rank {per_rank}: no such folder; create it, or leave the option out")
    tasks = [
        RankTask(
            path=str(file.path),
            name_rank=file.name_rank,
            order=file.order,
            thresholds=thresholds or Thresholds(),
            user_code=user_code,
            max_bytes=limit.max_bytes if limit is not None else None,
            per_rank_dir=None if per_rank is None else str(per_rank.resolve()),
            source_root=None if source_root is None else str(source_root.resolve()),
        )
        for file in files
    ]
    with rank_progress(len(tasks)) as progress:
        if dask:
            results = run_dask(tasks, dask, progress=progress)
        else:
            results = run_local(tasks, workers=workers, progress=progress)
    job = combine(results)

    def page() -> str:
        from traceinsight.render.job_html import JobHtmlRenderer

        return JobHtmlRenderer().render(job)

    outputs, to_stdout = _write_outputs(
        [
            ("JSON", json_out, lambda: JobJsonRenderer().render(job)),
            ("Markdown", markdown, lambda: render_job_markdown(job)),
            ("report", None if html_path is None else str(html_path), page),
        ]
    )
    if per_rank is not None:
        outputs.append(("each rank's report", per_rank))
    print_job_summary(job, console or TerminalConsole(stderr=to_stdout), outputs, top=top)
    return job
