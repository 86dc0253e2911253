"""The one path from a trace file to every output: load → analyze → rules → renderers.

Both commands (`analyze` and `run`) go through :func:`analyze_and_write`, so a report made right
after a capture is the same as one made later from the file alone; `diff` goes through
:func:`diff_and_write`, which reads each side as `analyze` would (or takes its stored JSON result).
"""

from __future__ import annotations

import contextlib
import dataclasses
import importlib
import json
import os
import re
import shutil
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

from traceinsight.compare import Comparison, compare
from traceinsight.config import SourceRoot
from traceinsight.errors import OutputError
from traceinsight.load import SizeLimit, load_trace
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.text import printable
from traceinsight.outputs import Kind, Output, check_outputs, publish, write_output
from traceinsight.render.json_report import JsonRenderer, report_dict
from traceinsight.render.terminal import TerminalConsole, print_summary, reader_gone
from traceinsight.report import Report, RunContext, report_for
from traceinsight.stored import read_stored_result
from traceinsight.thresholds import Thresholds

if TYPE_CHECKING:
    from traceinsight.job import JobReport, RankResult


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


@contextmanager
def _stage(description: str) -> Iterator[None]:
    """A spinner on stderr for a step that may take a while; nothing when stderr is not a terminal.
    ``description`` names a file: shown as text (never rich markup), control characters replaced."""
    if not sys.stderr.isatty():
        yield
        return
    with Console(stderr=True).status(Text(printable(description)), spinner="dots"):
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
    source_root: SourceRoot | None = None,
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
    ``source_root`` is the folder the report's code excerpts may be read from, and where that
    choice came from (None: no excerpts, only paths and line numbers). ``run`` carries what
    ``traceinsight run`` knows of the script's run. Outputs are checked first
    (:func:`traceinsight.outputs.check_outputs`; ``force`` lets them replace a file that is not
    ours). ``limit`` bounds how much JSON the trace may expand to. ``markdown`` is a path or
    ``"-"`` for the Markdown summary; ``top`` is how many rows the terminal tables show.
    """
    html_path = (html if html is not None else default_report_path(trace)) if write_html else None
    targets = planned_outputs(html_path, json_out, markdown)
    check_outputs(targets, inputs=[trace], force=force)
    with _timed("load"):
        loaded = load_trace(trace, progress=progress, limit=limit)
        give_back_freed_memory()
    if html_path is not None:
        threading.Thread(target=_prepare_html, daemon=True).start()  # beside the analysis: see there
    with _stage(f"analyzing {trace.name}"), _timed("analysis"):
        report = report_for(loaded, thresholds, user_code, run)
    del loaded

    def page() -> str:
        return render_html(report, None if source_root is None else source_root.folder)

    def summary() -> str:
        from traceinsight.render.markdown import MarkdownRenderer

        return MarkdownRenderer().render(report)

    outputs, to_stdout = _write_outputs(
        [
            ("JSON", _destination(targets, "--json", json_out), lambda: JsonRenderer().render(report)),
            ("Markdown", _destination(targets, "--markdown", markdown), summary),
            ("report", _destination(targets, "-o/--output", html_path), page),
        ],
        force=force,
    )
    if html_path is not None and source_root is not None:
        outputs.append(
            (f"code excerpts ({source_root.origin})", Path(source_root.shown or source_root.folder))
        )
    with _timed("terminal"):
        print_summary(report, console or TerminalConsole(stderr=to_stdout), outputs, top=top)
    return report


def planned_outputs(html: Path | None, json_out: str | None, markdown: str | None) -> list[Output]:
    """The files a command will write (``"-"``, stdout, is not a file)."""
    targets = [Output("-o/--output", html, Kind.HTML)] if html is not None else []
    for option, value, kind in (("--json", json_out, Kind.JSON), ("--markdown", markdown, Kind.MARKDOWN)):
        if value is not None and value != "-":
            targets.append(Output(option, Path(value), kind))
    return targets


def _destination(targets: list[Output], option: str, value: str | Path | None) -> Output | str | None:
    """Where one output goes: its planned file, ``"-"`` (stdout), or None (not written)."""
    if value is None or value == "-":
        return None if value is None else "-"
    return next(target for target in targets if target.option == option)


def _write_outputs(
    outputs: list[tuple[str, Output | str | None, Callable[[], str]]], *, force: bool = False
) -> tuple[list[tuple[str, Path]], bool]:
    """Write each (label, destination, text maker): a file through :func:`~.outputs.write_output`,
    ``"-"`` to stdout, None not at all. Returns the files written and whether stdout was used
    (the summary then goes to stderr)."""
    written: list[tuple[str, Path]] = []
    to_stdout = False
    for label, destination, make in outputs:
        if destination is None:
            continue
        stage = "HTML" if label in ("report", "page") else label
        if not isinstance(destination, Output):
            with _timed(stage):
                text = make()
                try:
                    sys.stdout.write(text)
                    sys.stdout.flush()
                except BrokenPipeError:
                    reader_gone()
            to_stdout = True
            continue
        with _stage(f"writing {destination.path.name}"), _timed(stage):
            text = make()
            write_output(destination, text, force=force)
        written.append((label, destination.path))
    return written, to_stdout


def result_of(
    path: Path,
    *,
    thresholds: Thresholds | None = None,
    user_code: tuple[str, ...] = (),
    progress: ProgressCallback | None = None,
    limit: SizeLimit | None = None,
) -> dict[str, Any]:
    """The JSON result of ``path``: read and checked (:func:`traceinsight.stored.read_stored_result`)
    when it is one (``analyze --json``), else the trace analyzed as ``analyze`` does."""
    stored = read_stored_result(path, limit)
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
    targets = planned_outputs(html_path, json_out, markdown)
    check_outputs(targets, inputs=[before, after], inputs_are="one of the runs compared", force=force)
    documents = []
    for path in (before, after):
        with progress(path) if progress is not None else nullcontext() as callback:
            documents.append(
                result_of(path, thresholds=thresholds, user_code=user_code, progress=callback, limit=limit)
            )
    comparison = compare(documents[0], documents[1], printable(before.name), printable(after.name), top=top)
    outputs, to_stdout = _write_outputs(
        [
            (
                "JSON",
                _destination(targets, "--json", json_out),
                lambda: strict_json(comparison_dict(comparison)),
            ),
            (
                "Markdown",
                _destination(targets, "--markdown", markdown),
                lambda: render_comparison(comparison),
            ),
            (
                "page",
                _destination(targets, "-o/--output", html_path),
                lambda: ComparisonHtmlRenderer().render(comparison),
            ),
        ],
        force=force,
    )
    out = console or TerminalConsole(stderr=to_stdout)
    for part in comparison_renderables(comparison):
        out.print(part)
    for label, path in outputs:
        out.print(Text.assemble(f"{label}: ", (printable(str(path)), "bold")))
    return comparison, documents[1]


def strict_json(document: object) -> str:
    """``document`` as indented JSON that every parser reads: a NaN or an infinity is a bug
    (ValueError), never written as the ``NaN`` that strict parsers refuse."""
    return json.dumps(document, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


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
    source_root: SourceRoot | None = None,
    force: bool = False,
    limit: SizeLimit | None = None,
    per_rank: Path | None = None,
    dask: str | None = None,
    workers: int | None = None,
    top: int = 10,
    follow_symlinks: bool = False,
) -> JobReport:
    """Analyze a distributed job (several traces, a folder, a pattern): each rank on its own in a
    local process pool, or on the dask cluster at ``dask``; combine; print the job summary; write
    the job's HTML page (and JSON / Markdown if asked). ``per_rank`` is a folder that gets each
    rank's own JSON and HTML report (``rank-<N>.json/.html``); with ``dask`` it must be a folder
    the workers can write to. The workers write them into a private folder inside it; they are
    put in place only once the job's own checks have passed (nothing is written for a job that
    fails), and go through the same output checks as every other file. ``workers`` fixes the
    local pool's size (default: cores and memory); ``follow_symlinks`` lets a folder or pattern
    take traces through links that lead out of it (see :func:`~traceinsight.job.discover_ranks`).
    """
    from traceinsight.job import RankTask, combine, discover_ranks
    from traceinsight.job.execute import rank_progress, run_dask, run_local
    from traceinsight.render.job_json import JobJsonRenderer
    from traceinsight.render.job_text import print_job_summary, render_job_markdown

    discovery = discover_ranks(arguments, follow_symlinks=follow_symlinks)
    files, notes = discovery.files, discovery.notes
    inputs = [file.path for file in files]
    html_path = (html if html is not None else default_job_report_path(arguments)) if write_html else None
    targets = planned_outputs(html_path, json_out, markdown)
    check_outputs(targets, inputs=inputs, inputs_are="a trace of the job", force=force)
    if per_rank is not None:
        _check_per_rank_folder(per_rank, inputs)
    staging = None if per_rank is None else _staging_folder(per_rank)
    try:
        tasks = [
            RankTask(
                path=str(file.path.absolute()),
                name_rank=file.name_rank,
                order=file.order,
                thresholds=thresholds or Thresholds(),
                user_code=user_code,
                max_bytes=limit.max_bytes if limit is not None else None,
                per_rank_dir=None if staging is None else str(staging),
                source_root=None if source_root is None else str(source_root.folder.resolve()),
                shown_path=file.shown,
                force=force,
            )
            for file in files
        ]
        with rank_progress(len(tasks)) as progress:
            if dask:
                results = run_dask(tasks, dask, progress=progress)
            else:
                results = run_local(tasks, workers=workers, progress=progress)
        job = combine(results)
        if notes:  # what discovery skipped, said wherever the job's warnings are
            job = dataclasses.replace(job, warnings=(*notes, *job.warnings))
        own_reports = _per_rank_outputs(per_rank, results)
        check_outputs([*targets, *(output for output, _ in own_reports)], inputs=inputs,
                      inputs_are="a trace of the job", force=force)  # fmt: skip

        def page() -> str:
            from traceinsight.render.job_html import JobHtmlRenderer

            return JobHtmlRenderer().render(job)

        outputs, to_stdout = _write_outputs(
            [
                ("JSON", _destination(targets, "--json", json_out), lambda: JobJsonRenderer().render(job)),
                ("Markdown", _destination(targets, "--markdown", markdown), lambda: render_job_markdown(job)),
                ("report", _destination(targets, "-o/--output", html_path), page),
            ],
            force=force,
        )
        for output, staged in own_reports:
            publish(staged, output, force=force)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if per_rank is not None:
        outputs.append(("each rank's report", per_rank))
        if source_root is not None:
            outputs.append(
                (f"code excerpts ({source_root.origin})", Path(source_root.shown or source_root.folder))
            )
    print_job_summary(job, console or TerminalConsole(stderr=to_stdout), outputs, top=top)
    return job


#: The names of the files ``--per-rank`` writes.
_PER_RANK_NAME: Final = re.compile(r"rank-\d+\.(?:json|html)")


def _check_per_rank_folder(folder: Path, inputs: list[Path]) -> None:
    """``--per-rank`` names a folder, and no trace of the job there could be replaced by a rank's report."""
    if not folder.is_dir():
        raise OutputError(f"--per-rank {folder}: no such folder; create it, or leave the option out")
    for source in inputs:
        if _PER_RANK_NAME.fullmatch(source.name) and source.parent.resolve() == folder.resolve():
            raise OutputError(
                f"--per-rank {folder}: it holds the job's trace {source.name}, which a rank's own report "
                "would replace; pick another folder"
            )


def _staging_folder(folder: Path) -> Path:
    """A private folder inside ``--per-rank`` for the workers' reports, until they are put in place."""
    try:
        return Path(tempfile.mkdtemp(prefix=".traceinsight-", dir=folder)).resolve()
    except OSError as exc:
        raise OutputError(
            f"cannot write into --per-rank {folder}: {exc.strerror or exc}; check the folder's permissions"
        ) from None


def _per_rank_outputs(per_rank: Path | None, results: Sequence[RankResult]) -> list[tuple[Output, Path]]:
    """Each rank's own reports: where they go in ``--per-rank``, and where the worker staged them."""
    if per_rank is None:
        return []
    kinds = {".json": Kind.JSON, ".html": Kind.HTML}
    return [
        (Output("--per-rank", per_rank / name, kinds[Path(name).suffix]), Path(staged))
        for result in results
        for name, staged in result.staged
    ]
