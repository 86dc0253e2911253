"""`analyze` on a distributed job: several traces, a folder, a pattern (:func:`analyze_job_and_write`).

The job layer (:mod:`traceinsight.job`) maps the single-trace analysis over the ranks and combines
them; it writes nothing. The public API finds the job's files and runs it
(:func:`traceinsight.api.find_job`, :func:`traceinsight.api.analyze`). This flow plans and checks the
outputs between the two, hands each rank's own reports to
the workers as a function they call where the rank's result is (:func:`stage_rank_reports`: the
page of a large rank is drawn in parallel, never sent back), and puts them in place once the job's
own checks have passed.
"""

from __future__ import annotations

import functools
import re
import shutil
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from rich.console import Console

from traceinsight import api
from traceinsight.commands.common import Planned, plan, show, write
from traceinsight.commands.options import STDOUT, Reading, Wanted
from traceinsight.commands.outputs import Kind, Output, check_outputs, publish, stage
from traceinsight.config import SourceRoot
from traceinsight.errors import OutputError
from traceinsight.job import RankReports
from traceinsight.job.execute import rank_progress
from traceinsight.job.triage import JobFiles
from traceinsight.model import Model
from traceinsight.render.html import HtmlRenderer
from traceinsight.results import JobResult, Result
from traceinsight.results.job import RankResult

__all__ = ["JobFiles", "JobOptions", "analyze_job_and_write", "run_job", "stage_rank_reports"]

#: The names of the files ``--per-rank`` writes.
_PER_RANK_NAME: Final = re.compile(r"rank-\d+\.(?:json|html)")


class JobOptions(Model, frozen=True):
    """How a job is run: where each rank's own reports go, and where the ranks are analyzed."""

    #: ``--per-rank``: a folder for each rank's own JSON and HTML report (``rank-<N>.json/.html``).
    per_rank: Path | None = None
    #: ``--dask``: a dask.distributed scheduler's address (None: a local process pool).
    dask: str | None = None
    #: ``--workers``: the local pool's size (None: by cores and memory).
    workers: int | None = None
    #: ``--follow-symlinks``: a folder or pattern may take traces through links that lead out of it.
    follow_symlinks: bool = False


def default_page(arguments: list[Path]) -> Path:
    """``./<folder name>.html`` for one folder, else ``./job.html``."""
    if len(arguments) == 1 and arguments[0].is_dir():
        return Path.cwd() / f"{arguments[0].resolve().name or 'job'}.html"
    return Path.cwd() / "job.html"


def stage_rank_reports(
    folder: str, source_root: str | None, result: Result, rank: int
) -> tuple[tuple[str, str], ...]:
    """A rank's own reports, ``rank-<N>.json`` and ``rank-<N>.html``, staged in ``folder`` (a
    private folder the command puts them in place from): (name, staged path) pairs. Called by the
    worker that analyzed the rank (a ``functools.partial`` of it pickles to one)."""
    root = Path(source_root) if source_root is not None else None
    return tuple(
        (name, str(stage(Path(folder), name, text)))
        for name, text in (
            (f"rank-{rank}.json", result.to_json()),
            (f"rank-{rank}.html", HtmlRenderer(root).render(result)),
        )
    )


def run_job(
    found: JobFiles,
    reading: Reading,
    *,
    force: bool = False,
    each: RankReports | None = None,
    dask: str | None = None,
    workers: int | None = None,
) -> JobResult:
    """Analyze and combine the job's ranks through the public API (:func:`traceinsight.api.analyze`),
    the ranks' progress bar on stderr."""
    with rank_progress(len(found.discovery.files)) as progress:
        result = api.analyze(found, user_code=reading.user_code, max_bytes=reading.limit.max_bytes, force=force,
                             each_rank=each, dask=dask, workers=workers, ranks_progress=progress,
                             **reading.threshold_values)  # fmt: skip
    assert isinstance(result, JobResult)  # a job's files are a job
    return result


def analyze_job_and_write(
    arguments: list[Path],
    wanted: Wanted,
    reading: Reading,
    job: JobOptions,
    *,
    source_root: SourceRoot | None = None,
    console: Console | None = None,
    top: int = 10,
) -> JobResult:
    """Analyze a distributed job (several traces, a folder, a pattern): each rank on its own in a
    local process pool, or on the dask cluster at ``job.dask``; combine; print the job summary;
    write the job's outputs ``wanted`` asks for (the page by default).

    ``job.per_rank`` is a folder that gets each rank's own JSON and HTML report; with dask it must
    be a folder the workers can write to. The workers write them into a private folder inside it;
    they are put in place only once the job's own checks have passed (nothing is written for a job
    that fails), and go through the same output checks as every other file.
    """
    found = api.find_job(arguments, follow_symlinks=job.follow_symlinks)
    inputs = found.paths
    planned = plan(wanted, default_page(arguments), inputs=inputs, inputs_are="a trace of the job")
    per_rank = job.per_rank
    if per_rank is not None:
        _check_per_rank_folder(per_rank, inputs)
    staging = None if per_rank is None else _staging_folder(per_rank)
    each = None
    if staging is not None:
        root = None if source_root is None else str(source_root.folder.resolve())
        each = functools.partial(stage_rank_reports, str(staging), root)
    try:
        result = run_job(found, reading, force=wanted.force, each=each, dask=job.dask, workers=job.workers)
        written, to_stdout = _write(result, planned, per_rank, result.rank_results, inputs)
    finally:
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    if per_rank is not None:
        written.append(("each rank's report", per_rank))
        if source_root is not None:
            written.append(source_root.written)
    show(result, written, console=console, to_stderr=to_stdout, top=top)
    return result


def _write(
    result: JobResult,
    planned: Planned,
    per_rank: Path | None,
    ranks: Sequence[RankResult],
    inputs: list[Path],
) -> tuple[list[tuple[str, Path]], bool]:
    """Check every output again with the ranks' own reports among them; write the job's; put the
    ranks' in place."""
    force = planned.wanted.force
    own_reports = _per_rank_outputs(per_rank, ranks)
    check_outputs([*planned.outputs, *(output for output, _ in own_reports)], inputs=inputs,
                  inputs_are="a trace of the job", force=force)  # fmt: skip
    written, to_stdout = write(result, planned)
    for output, staged in own_reports:
        publish(staged, output, force=force)
    return written, to_stdout


def _check_per_rank_folder(folder: Path, inputs: list[Path]) -> None:
    """``--per-rank`` names a folder (made when missing), and no trace of the job there could be
    replaced by a rank's report."""
    if str(folder) == STDOUT:  # what is stdout for the other outputs: never a folder made by that name
        raise OutputError("--per-rank -: each rank's reports go to a folder, not stdout; name a folder")
    if not folder.is_dir():
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise OutputError(
                f"--per-rank {folder}: cannot create the folder ({exc.strerror or exc}); "
                "name a folder you can write to"
            ) from None
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


def _per_rank_outputs(per_rank: Path | None, ranks: Sequence[RankResult]) -> list[tuple[Output, Path]]:
    """Each rank's own reports: where they go in ``--per-rank``, and where the worker staged them."""
    if per_rank is None:
        return []
    kinds = {".json": Kind.JSON, ".html": Kind.HTML}
    return [
        (Output("--per-rank", per_rank / name, kinds[Path(name).suffix]), Path(staged))
        for rank in ranks
        for name, staged in rank.staged
    ]
