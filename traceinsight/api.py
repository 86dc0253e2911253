"""The public API: traceinsight in a notebook or a script, the same results as every output.

``traceinsight.analyze(trace)`` gives the :class:`~traceinsight.results.trace.Result` that
``traceinsight analyze --json`` writes (a folder, a list or a pattern: a distributed job's
:class:`~traceinsight.results.job.JobResult`); ``traceinsight.diff(before, after)`` the
:class:`~traceinsight.results.comparison.Comparison` of ``traceinsight diff`` (of two jobs: a
:class:`~traceinsight.results.job_comparison.JobComparison`);
``traceinsight.load(trace)`` the typed polars tables every analysis reads. Each result has
``to_json()`` and ``from_json(text)``, its tables as polars DataFrames (``frames``), and shows its
scorecard and finding cards in a notebook (once ``import traceinsight`` handed out a name of the
API: the renderers that draw them are loaded then, not by this module); a trace's result draws
the page's charts (``charts``). Errors are :class:`~traceinsight.errors.TraceInsightError` with a one-line message.

The commands run on these functions (one flow, two doors): ``traceinsight analyze`` and ``run``
call :func:`load` and :func:`analyze`, a job's ``analyze`` :func:`find_job` then :func:`analyze`,
``diff`` :func:`diff_sides` then :func:`compare_sides`; the keywords only a command needs (its
progress displays, ``--max-size``, ``--per-rank``, ``--workers`` …) are keywords here too.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeGuard, cast

from traceinsight.errors import ConfigError, TraceFormatError
from traceinsight.load import SizeLimit, Trace, load_trace
from traceinsight.load.head_start import HeadStart
from traceinsight.load.progress import ProgressCallback
from traceinsight.load.text import printable
from traceinsight.model import Model, fields_of, replace
from traceinsight.results import Result, RunContext, report_for, result_of
from traceinsight.results.stored import read_stored
from traceinsight.thresholds import Thresholds

if TYPE_CHECKING:
    from traceinsight.job.execute import RankProgress
    from traceinsight.job.rank import RankReports
    from traceinsight.job.triage import JobFiles
    from traceinsight.results import Comparison, JobComparison, JobResult

__all__ = ["Side", "analyze", "compare_sides", "diff", "diff_sides", "find_job", "is_job", "load", "pooled"]

#: What names a trace: a path (or its text).
TracePath = str | os.PathLike[str]

#: Opens a trace's load progress display around its load (``diff``: one per trace read).
ReadingProgress = Callable[[Path], AbstractContextManager[ProgressCallback | None]]
#: Opens a job's progress display across its ranks (given how many there are).
RanksProgress = Callable[[int], AbstractContextManager["RankProgress | None"]]


def load(
    trace: TracePath,
    *,
    max_bytes: int | None = None,
    force: bool = False,
    progress: ProgressCallback | None = None,
    head_start: HeadStart | None = None,
) -> Trace:
    """The trace's typed polars tables (``trace.gpu``, ``trace.runtime``, ``trace.cpu_ops``, …;
    times in integer nanoseconds on the trace's clock), as every analysis reads them.

    ``max_bytes``: refuse a trace holding more JSON than that (``--max-size``). ``force``: read a
    gzip trace that expands more than 100 times (``--force``; real traces expand at most about 45
    times). ``progress`` is called as the load advances (bytes read, bytes in all, events:
    :mod:`traceinsight.load.progress`). ``head_start``: scans of ``trace`` begun before
    (:mod:`traceinsight.load.head_start`; the command's, while its libraries load)."""
    return load_trace(
        Path(trace), progress=progress, limit=SizeLimit(max_bytes, force=force), head_start=head_start
    )


def _thresholds(given: Mapping[str, float]) -> Thresholds:
    """:class:`~traceinsight.thresholds.Thresholds` with ``given`` changed (their names as keywords)."""
    known = {field.name for field in fields_of(Thresholds)}
    unknown = sorted(set(given) - known)
    if unknown:
        raise ConfigError(
            f"unknown threshold {', '.join(unknown)}: the thresholds are {', '.join(sorted(known))} "
            "(see traceinsight.thresholds.Thresholds)"
        )
    return Thresholds(**given)  # type: ignore[arg-type]  # each is an int or a float, as named


def _paths(trace: TracePath | Sequence[TracePath]) -> list[Path]:
    if isinstance(trace, (str, os.PathLike)):
        return [Path(trace)]
    return [Path(item) for item in trace]


def is_job(paths: Sequence[Path]) -> bool:
    """Whether ``paths`` name a job (several files, a folder, a glob pattern: analyzed rank by rank),
    not one trace (:func:`traceinsight.job.is_job`). One trace file is not, and
    is told without importing the job's modules: with the drawing of a job and a diff, ~8 ms of
    CPU, 2 % of a small trace's whole ``analyze`` (``tests/test_cli.py``'s ``NOT_FOR_ONE_TRACE``)."""
    if len(paths) == 1 and paths[0].is_file():
        return False
    from traceinsight.job import discover  # a job's modules: see above

    return discover.is_job(paths)


def find_job(paths: Sequence[TracePath], *, follow_symlinks: bool = False) -> JobFiles:
    """A job's traces among ``paths`` (traces, folders, glob patterns), found and sorted before
    any is analyzed: what is not a trace (a job's own result, a ``config.json``) is skipped with a
    note, profiler cycles of one process are told from ranks (:mod:`traceinsight.job.triage`).
    ``follow_symlinks``: a folder or pattern may take traces through links that lead out of it.
    :func:`analyze` takes what this returns (the command checks its outputs against the files in
    between)."""
    from traceinsight.job.triage import job_files  # a job's modules: see is_job

    return job_files([Path(path) for path in paths], follow_symlinks=follow_symlinks)


def analyze(
    trace: TracePath | Sequence[TracePath] | Trace | JobFiles,
    *,
    user_code: Sequence[str] = (),
    source_root: TracePath | None = None,
    max_bytes: int | None = None,
    force: bool = False,
    progress: ProgressCallback | None = None,
    every_gap: bool = True,
    run: RunContext | None = None,
    follow_symlinks: bool = False,
    workers: int | None = None,
    dask: str | None = None,
    each_rank: RankReports | None = None,
    ranks_progress: RankProgress | None = None,
    **thresholds: float,
) -> Result | JobResult:
    """Analyze a trace as ``traceinsight analyze`` does: its :class:`~traceinsight.results.trace.Result`.

    ``trace`` is a trace's path, or its tables (:func:`load`). A folder, a list of traces or a glob
    pattern (or what :func:`find_job` found) is a distributed job, one rank per trace: its
    :class:`~traceinsight.results.job.JobResult`. ``user_code``: packages whose frames are your own
    code (``--user-code``). ``source_root``: the folder the finding cards' code excerpts may be
    read from (only ``.py`` files inside it). ``thresholds``: any field of
    :class:`~traceinsight.thresholds.Thresholds` by name (``min_gap_us=10``, ``low_utilization=0.5``).

    Reading: ``max_bytes``, ``force`` and ``progress`` as :func:`load` takes them (for a job each
    rank is read under ``max_bytes`` and ``force``). ``every_gap`` (default): the result keeps the
    table of every idle gap, the short ones too (``frames["idle_gaps"]``); the command, which
    shows only the reported ones, passes False. ``run``: what ``traceinsight run`` knows of the
    script's run (:class:`~traceinsight.results.RunContext`).

    A job: ``follow_symlinks`` as :func:`find_job`; the ranks are analyzed in a local process
    pool of ``workers`` (default: by cores and memory), or on the ``dask.distributed`` scheduler
    at ``dask``; ``each_rank(result, rank)`` is called with each rank's result where it was made
    (``--per-rank``'s reports); ``ranks_progress(done, total)`` as ranks finish.
    """
    limits = _thresholds(thresholds)
    code = tuple(user_code)
    if isinstance(trace, Trace):
        loaded = trace
    else:
        if _is_found(trace):
            found: JobFiles | None = trace
        else:
            paths = _paths(cast("TracePath | Sequence[TracePath]", trace))
            found = find_job(paths, follow_symlinks=follow_symlinks) if is_job(paths) else None
        if found is not None:
            return _job(found, limits, code, max_bytes=max_bytes, force=force, workers=workers, dask=dask,
                        each_rank=each_rank, progress=ranks_progress)  # fmt: skip
        loaded = load(paths[0], max_bytes=max_bytes, force=force, progress=progress)
    report = report_for(loaded, limits, code, run, every_gap=every_gap)
    root = None if source_root is None else Path(source_root)
    return result_of(report if root is None else replace(report, source_root=root))


def _is_found(trace: object) -> TypeGuard[JobFiles]:
    """Whether ``trace`` is a job's files :func:`find_job` found (its type is not imported for a
    trace: see :func:`is_job`)."""
    if isinstance(trace, (str, os.PathLike, Trace, list, tuple)):
        return False
    from traceinsight.job.triage import JobFiles

    return isinstance(trace, JobFiles)


def _job(
    found: JobFiles,
    thresholds: Thresholds,
    user_code: tuple[str, ...],
    *,
    max_bytes: int | None = None,
    force: bool = False,
    workers: int | None = None,
    dask: str | None = None,
    each_rank: RankReports | None = None,
    progress: RankProgress | None = None,
) -> JobResult:
    """A job's result: its ranks analyzed and combined (:func:`~traceinsight.job.execute.analyze_job`;
    what :func:`find_job` skipped is said among the job's warnings)."""
    from traceinsight.job.execute import analyze_job  # a job's modules: see is_job

    return analyze_job(
        found.discovery,
        thresholds=thresholds,
        user_code=user_code,
        max_bytes=max_bytes,
        force=force,
        each=each_rank,
        dask=dask,
        workers=workers,
        progress=progress,
        cycles_of=found.cycles_of,
    )


# --- diff -----------------------------------------------------------------------------------------

_GLOB: Final = re.compile(r"[*?\[]")


class Side(Model, frozen=True):
    """One side of a diff, sorted before anything slow is done (:func:`diff_sides`): a result (in
    memory, or stored by ``analyze --json``: a trace's or a job's), a job's traces to analyze (a
    folder, a pattern), several runs of one setup, or a trace."""

    path: Path
    stored: Result | JobResult | None = None
    files: JobFiles | None = None
    #: Stored results of several runs of one setup (a folder or pattern of ``analyze --json`` or
    #: ``run --json`` files of traces): pooled by a diff as one side.
    runs: tuple[Result, ...] = ()
    run_paths: tuple[Path, ...] = ()
    #: The side's name when it was given as a result in memory (no path names it).
    named: str | None = None

    @property
    def is_job(self) -> bool:
        """A job's result, or a job's traces."""
        return self.files is not None or (self.stored is not None and not isinstance(self.stored, Result))

    @property
    def is_cycles(self) -> bool:
        """One process's profiler cycles (a folder or pattern of them), or several stored runs:
        runs of one setup, pooled by a diff as one side of several runs."""
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
        if self.named is not None:
            return []
        return [self.path, *self.run_paths] if self.files is None else [self.path, *self.files.paths]

    @property
    def label(self) -> str:
        """The side's name in every output: the file's, the folder's, or the pattern as given."""
        if self.named is not None:
            return self.named
        if (self.files is not None or self.runs) and not self.path.is_dir() and is_job([self.path]):
            return printable(str(self.path))  # a pattern: its name alone says too little
        return printable(self.path.resolve().name if self.path.is_dir() else self.path.name) or "job"

    @property
    def stem(self) -> str:
        """The side's name in the default page's file name (no pattern characters)."""
        if (self.files is None and not self.runs) or self.path.is_dir():
            return _stem(self.path.resolve() if self.path.is_dir() else self.path) or "job"
        fixed = [part for part in self.path.parts[:-1] if not _GLOB.search(part)]
        return fixed[-1] if fixed and fixed[-1] not in (".", "/") else "job"


def _stem(trace: Path) -> str:
    """A trace's name without ``.json``/``.json.gz``."""
    name = trace.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return name


def _side(given: Result | JobResult | Side | TracePath, limit: SizeLimit, job: type[JobResult]) -> Side:
    """What ``given`` is (see :class:`Side`): a folder or a pattern is a job, its traces found and
    sorted now (:func:`find_job`), or several stored runs; a file is a stored result when its
    first bytes say so, else a trace."""
    if isinstance(given, Side):
        return given
    if not isinstance(given, (str, os.PathLike)):
        named = given.trace.name if isinstance(given, Result) else f"job of {given.job.ranks} ranks"
        return Side(Path(named), stored=given, named=named)
    path = Path(given)
    if is_job([path]):
        runs = _stored_runs(path, limit, job)
        if runs:
            return Side(path, runs=tuple(run for _, run in runs), run_paths=tuple(file for file, _ in runs))
        return Side(path, files=find_job([path]))
    return Side(path, stored=read_stored(path, (Result, job), limit))


def _stored_runs(path: Path, limit: SizeLimit, job: type[JobResult]) -> tuple[tuple[Path, Result], ...]:
    """The runs of a folder or pattern of stored results of traces (``*.json`` files that
    ``analyze --json`` or ``run --json`` wrote), in name order; empty unless every such file is
    one (a job's traces, or a folder mixing results with traces, are a job's side)."""
    found = sorted(path.glob("*.json") if path.is_dir() else (Path(name) for name in glob.glob(str(path))))
    files = [file for file in found if file.is_file() and not file.is_symlink()]
    if not files or (
        path.is_dir() and any(item.name.endswith((".json.gz", ".pt.trace.json")) for item in path.iterdir())
    ):
        return ()
    runs = []
    for file in files:
        try:
            stored = read_stored(file, (Result, job), limit)
        except TraceFormatError:
            return ()  # not a trace's result (a diff's, an unreadable one): the folder is a job's
        if not isinstance(stored, Result):
            return ()
        runs.append((file, stored))
    return tuple(runs)


def diff_sides(
    before: Result | JobResult | Side | TracePath,
    after: Result | JobResult | Side | TracePath,
    *,
    max_bytes: int | None = None,
    force: bool = False,
) -> tuple[Side, Side]:
    """The two sides of a diff, sorted before anything is analyzed (:class:`Side`); a job beside a
    trace is refused here. ``max_bytes`` (``--max-size``) bounds a stored result read (default
    16 MiB); ``force`` as :func:`load`. The command checks its outputs against the sides' files
    (``Side.inputs``) before :func:`compare_sides`."""
    from traceinsight.results import JobResult  # a job's types: see is_job

    limit = SizeLimit(max_bytes, force=force)
    sides = (_side(before, limit, JobResult), _side(after, limit, JobResult))
    _check_same_kind(*sides)
    return sides


def _check_same_kind(before: Side, after: Side) -> None:
    """A job is compared with a job, a trace with a trace (or with several runs: profiler cycles,
    stored results); anything else is one line."""
    runs_beside_job = (bool(before.runs) and after.is_job) or (bool(after.runs) and before.is_job)
    if not runs_beside_job and (before.is_job == after.is_job or before.is_cycles or after.is_cycles):
        return
    raise TraceFormatError(
        f"cannot compare {printable(str(before.path))} with {printable(str(after.path))}: BEFORE is "
        f"{before.words} and AFTER {after.words}; give two jobs (results of analyze --json of a job, "
        "folders or patterns of rank traces) or two traces (a rank's trace on each side; a side may be "
        "several runs of one setup: a folder or pattern of profiler cycles or of their results)"
    )


def pooled(before: Side, after: Side) -> bool:
    """Whether the two sides are compared as runs of one setup each, pooled (profiler cycles,
    several stored runs; a trace beside them is a side of one run), not as two jobs or two traces."""
    sides = (before, after)
    return all(side.is_cycles for side in sides) or (
        any(side.is_cycles for side in sides) and not all(side.is_job for side in sides)
    )


def compare_sides(
    before: Side,
    after: Side,
    *,
    top: int = 10,
    user_code: Sequence[str] = (),
    max_bytes: int | None = None,
    force: bool = False,
    workers: int | None = None,
    reading_progress: ReadingProgress | None = None,
    analyzing: Callable[[Path], AbstractContextManager[object]] | None = None,
    ranks_progress: RanksProgress | None = None,
    **thresholds: float,
) -> tuple[Comparison | JobComparison, Result | JobResult]:
    """Compare two sorted sides (:func:`diff_sides`), what :func:`diff` does: the comparison, and
    the after side's result (its first run's when it is several), which the command's gate holds
    to the budgets. The traces are read and analyzed as :func:`analyze` does (``user_code``,
    ``max_bytes``, ``force``, ``thresholds``; a job's ranks in a pool of ``workers``).
    ``reading_progress(path)`` opens a progress display around each trace's load,
    ``analyzing(path)`` one around its analysis, ``ranks_progress(total)`` one across a job's
    ranks (the command's bars and spinner on stderr)."""
    from traceinsight.results import JobResult, compare, compare_jobs  # a diff's and a job's: see is_job

    limits = _thresholds(thresholds)
    code = tuple(user_code)

    def trace_of(side: Side) -> Result:
        """A trace side's result: stored, or the trace analyzed."""
        if isinstance(side.stored, Result):
            return side.stored
        with reading_progress(side.path) if reading_progress is not None else nullcontext() as progress:
            loaded = load(side.path, max_bytes=max_bytes, force=force, progress=progress)
        with analyzing(side.path) if analyzing is not None else nullcontext():
            return result_of(report_for(loaded, limits, code))

    if pooled(before, after):
        runs: list[list[Result]] = []
        for side in (before, after):
            traces = side.files.paths if side.files is not None else [] if side.runs else [side.path]
            runs.append(
                [*side.runs, *(trace_of(Side(path) if side.files is not None else side) for path in traces)]
            )
        return compare(runs[0], runs[1], before.label, after.label, top=top), runs[1][0]
    if before.is_job:
        jobs: list[JobResult] = []
        for side in (before, after):
            if isinstance(side.stored, JobResult):
                jobs.append(side.stored)
                continue
            assert side.files is not None
            with (
                ranks_progress(len(side.files.paths)) if ranks_progress is not None else nullcontext() as done
            ):
                jobs.append(_job(side.files, limits, code, max_bytes=max_bytes, force=force, workers=workers,
                                 progress=done))  # fmt: skip
        return compare_jobs(jobs[0], jobs[1], before.label, after.label), jobs[1]
    results = [trace_of(side) for side in (before, after)]
    return compare(results[0], results[1], before.label, after.label, top=top), results[1]


def diff(
    before: Result | JobResult | TracePath,
    after: Result | JobResult | TracePath,
    *,
    top: int = 10,
    user_code: Sequence[str] = (),
    max_bytes: int | None = None,
    force: bool = False,
    workers: int | None = None,
    **thresholds: Any,
) -> Comparison | JobComparison:
    """Compare two runs as ``traceinsight diff`` does: step time, GPU busy and idle by cause, syncs,
    copies, communication, findings fixed / new / still there, the ``top`` kernels that changed
    most. Each side is a :class:`~traceinsight.results.trace.Result`, a trace, or a result
    ``analyze --json`` wrote (read under the checks of a stored result, at most ``max_bytes``:
    16 MiB unless given); a folder or pattern of one process's profiler cycles, or of stored
    results of traces, is one side of several runs, pooled. Two jobs (each a
    :class:`~traceinsight.results.job.JobResult`, a job's stored result, a folder or a pattern of
    rank traces) give a :class:`~traceinsight.results.job_comparison.JobComparison`; a job beside a
    trace is refused. The traces are read and analyzed as :func:`analyze` does."""
    sides = diff_sides(before, after, max_bytes=max_bytes, force=force)
    comparison, _ = compare_sides(*sides, top=top, user_code=user_code, max_bytes=max_bytes, force=force,
                                  workers=workers, **thresholds)  # fmt: skip
    return comparison
