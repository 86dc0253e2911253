"""Where the ranks are analyzed: in this process, a local process pool, or a dask.distributed cluster.

Local (the default): a pool of worker processes sized to the cores and to the memory available
(:func:`pool_size`: the largest rank measured from the files themselves, never a gzip trailer's
claim), each worker analyzing one rank at a time and freeing it before the next, so peak memory
is about ``workers × the largest rank``, never the sum of the ranks. The workers are processes of
their own (:mod:`.worker`), never a copy of the caller's ``__main__``: a plain script calling
``traceinsight.analyze("traces/")`` needs no main guard, and the workers end with the caller.

Dask (``--dask ADDRESS`` or ``TRACEINSIGHT_DASK``): the same :func:`~.rank.analyze_rank` goes to an
existing cluster with ``client.map``, in a thread of its own on the worker (out of dask's profiler,
whose kept stacks otherwise grow a worker with its busy seconds); the paths must be readable where
the workers run. Only this path imports dask.
"""

from __future__ import annotations

import importlib
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Final

from traceinsight.cores import available_cores
from traceinsight.errors import ConfigError, TraceInsightError
from traceinsight.job.combine import combine
from traceinsight.job.discover import Discovery
from traceinsight.job.rank import RankReports, RankTask, analyze_rank
from traceinsight.job.worker import Workers
from traceinsight.load.limits import GZIP_RATIO
from traceinsight.load.source import GZIP_MAGIC, SizeLimit, open_trace
from traceinsight.model import replace
from traceinsight.process import threads_per_worker
from traceinsight.results.job import JobResult, RankResult
from traceinsight.thresholds import Thresholds

__all__ = ["RankProgress", "analyze_job", "pool_size", "rank_progress", "run_dask", "run_local"]

#: ``(ranks done, ranks in all)`` after each rank.
RankProgress = Callable[[int, int], None]

#: Peak memory of analyzing a trace, per byte of its JSON, rounded up: benchmarks/bench_analyze.py
#: measured 1.2 to 1.7 times the JSON (results-2026-11-22.txt, 250 MB plain and gzip), and the
#: audit of issue 52 about 3 times on a job's ranks (2 let a pool take more memory than there was).
MEMORY_PER_JSON_BYTE: Final = 3
#: What a worker holds before it reads a trace (interpreter, polars, the analysis' imports).
WORKER_BASE_BYTES: Final = 250 * 2**20


def _json_bound(task: RankTask) -> float:
    """The most JSON a rank's file can hold and still be read: a plain file's size; a gzip's
    compressed size times the expansion ratio the loader allows (:data:`~..load.limits.GZIP_RATIO`,
    not under ``--force``), within ``--max-size``; read from the file system alone."""
    try:
        size = os.stat(task.path).st_size
    except OSError:
        return 0
    bound = float("inf") if task.force else float(GZIP_RATIO * size)
    if not _is_gzip(task.path):
        bound = size
    return min(bound, task.max_bytes) if task.max_bytes is not None else bound


def _is_gzip(path: str) -> bool:
    try:
        with open(path, "rb") as stream:
            return stream.read(2) == GZIP_MAGIC
    except OSError:
        return False


def _json_bytes(task: RankTask, enough: int) -> int:
    """How much JSON a rank's file holds, counted: a plain file's size; for gzip, the bytes its
    stream inflates to (nothing kept), stopping once past ``enough``. Never the gzip trailer, which
    the file itself sets (a 3.7 MB file can say 4 kB and hold 1 GB)."""
    if not _is_gzip(task.path):
        return int(_json_bound(task))
    counted = 0
    try:
        with open_trace(Path(task.path), SizeLimit(force=True)) as source:
            for block in source.blocks(4 << 20):
                counted += len(block)
                if counted > enough:
                    break
    except TraceInsightError:  # the worker says what is wrong with the file
        pass
    return counted


def _available_memory() -> int | None:
    """``MemAvailable`` of ``/proc/meminfo`` in bytes (None elsewhere)."""
    try:
        with open("/proc/meminfo", encoding="ascii") as stream:
            for line in stream:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def pool_size(tasks: Sequence[RankTask], requested: int | None = None) -> int:
    """Workers for the local pool: ``requested``, else as many as there are cores, ranks, and
    memory for a worker each holding the largest rank.

    The largest rank is measured by what the files are, never by what they claim: when even the
    most JSON each file could hold (:func:`_json_bound`) leaves memory for a worker per core, that
    is the size; else each gzip rank is inflated and counted (threads beside each other, nothing
    kept, each stopping once one worker is all the memory allows)."""
    if requested is not None:
        return max(1, min(requested, len(tasks)))
    most = max(1, min(available_cores(), len(tasks)))
    available = _available_memory()
    if most == 1 or available is None:
        return most

    def workers_for(largest: float) -> int:
        return int(max(1, min(most, available // (WORKER_BASE_BYTES + MEMORY_PER_JSON_BYTE * largest))))

    if workers_for(max(_json_bound(task) for task in tasks)) == most:
        return most
    enough = max(0, (available - WORKER_BASE_BYTES) // MEMORY_PER_JSON_BYTE)
    with ThreadPoolExecutor(max_workers=most, thread_name_prefix="traceinsight-count") as counting:
        largest = max(counting.map(lambda task: _json_bytes(task, enough), tasks))
    return workers_for(largest)


def run_local(
    tasks: Sequence[RankTask], *, workers: int | None = None, progress: RankProgress | None = None
) -> list[RankResult]:
    """Analyze every rank on this machine; results in the order of ``tasks``."""
    size = pool_size(tasks, workers)
    if size == 1:
        results = []
        for done, task in enumerate(tasks, start=1):
            results.append(analyze_rank(task))
            if progress is not None:
                progress(done, len(tasks))
        return results
    with (
        threads_per_worker(size),
        ThreadPoolExecutor(max_workers=size, thread_name_prefix="traceinsight-rank") as threads,
        Workers(size) as pool,  # stopped first on the way out: no thread waits on a worker then
    ):
        futures: dict[Future[RankResult], int] = {
            threads.submit(pool.run, task): index for index, task in enumerate(tasks)
        }
        found: dict[int, RankResult] = {}
        pending = set(futures)
        try:
            while pending:
                finished, pending = wait(pending, return_when=FIRST_COMPLETED)
                for future in finished:
                    found[futures[future]] = future.result()
                if progress is not None:
                    progress(len(found), len(tasks))
        except BaseException:
            for future in pending:
                future.cancel()
            raise
    return [found[index] for index in range(len(tasks))]


def _analyze_rank_unsampled(task: RankTask) -> RankResult:
    """:func:`~.rank.analyze_rank` in a thread of its own, for a dask worker.

    A dask worker's statistical profiler (``distributed.worker.profile``, on by default) samples
    the threads running tasks every 10 ms and keeps each second's tree of their stacks, for the
    last ``distributed.admin.low-level-log-length`` (1,000) seconds, twice (all tasks and per
    task name). The analysis' stacks are deep and many, about 0.4 MiB of trees per second of
    work: a worker grew by ~20 MiB over a 1,000-rank job (about 50 s of work each), and at that
    rate could grow by some hundreds over a long one (1,000 seconds kept). Here the task's thread
    only waits, so each sample is this one short stack: 1,000 ranks left a worker within 1.1x of
    one that analyzed one rank (benchmarks/job-results-2026-12-05-i49-dask.txt)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="traceinsight-rank") as thread:
        return thread.submit(analyze_rank, task).result()


def run_dask(
    tasks: Sequence[RankTask],
    address: str,
    *,
    progress: RankProgress | None = None,
    connect_timeout_s: float = 30,
) -> list[RankResult]:
    """Analyze every rank on the dask.distributed cluster at ``address``; results in ``tasks``' order."""
    try:
        distributed: Any = importlib.import_module("distributed")
    except ImportError:
        raise ConfigError(
            "--dask needs dask.distributed, which is not installed: pip install 'torch-traceinsight[dask]'"
        ) from None
    try:
        client: Any = distributed.Client(address, timeout=connect_timeout_s)
    except (OSError, TimeoutError, ValueError) as exc:
        raise ConfigError(
            f"cannot reach the dask scheduler at {address}: {exc}; check the address (tcp://host:8786) "
            "or drop --dask / TRACEINSIGHT_DASK to analyze locally"
        ) from None
    with client:
        futures = client.map(_analyze_rank_unsampled, list(tasks), pure=False)
        for done, _ in enumerate(distributed.as_completed(futures), start=1):
            if progress is not None:
                progress(done, len(tasks))
        results: list[RankResult] = client.gather(futures)
    return results


def analyze_job(
    discovery: Discovery,
    *,
    thresholds: Thresholds | None = None,
    user_code: tuple[str, ...] = (),
    max_bytes: int | None = None,
    force: bool = False,
    each: RankReports | None = None,
    dask: str | None = None,
    workers: int | None = None,
    progress: RankProgress | None = None,
    cycles_of: str | None = None,
) -> JobResult:
    """Analyze each rank ``discovery`` found, where it says (``dask``: that cluster; else a local
    pool of ``workers``), and combine them into the job's result; what discovery skipped is said
    among the job's warnings. ``each`` is called with each rank's result where it was made (see
    :class:`~.rank.RankTask`). The ranks are read as ``analyze`` reads one trace (``thresholds``,
    ``user_code``, ``max_bytes``: ``--max-size``, ``force``: ``--force``'s gzip ratio; ``cycles_of``: the process whose profiler cycles the files
    are, see :mod:`.triage`)."""
    tasks = [
        RankTask(
            path=str(file.path.absolute()),
            name_rank=file.name_rank,
            order=file.order,
            thresholds=thresholds or Thresholds(),
            user_code=user_code,
            max_bytes=max_bytes,
            each=each,
            shown_path=file.shown,
            force=force,
        )
        for file in discovery.files
    ]
    ranks = (
        run_dask(tasks, dask, progress=progress)
        if dask
        else run_local(tasks, workers=workers, progress=progress)
    )
    job = combine(ranks, cycles_of=cycles_of, thresholds=thresholds)
    if discovery.notes:  # what discovery skipped, said wherever the job's warnings are
        job = replace(job, warnings=(*discovery.notes, *job.warnings))
    return job


@contextmanager
def rank_progress(total: int) -> Iterator[RankProgress | None]:
    """A rich progress bar on stderr across the ranks, or None when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    bar = Progress(
        TextColumn("analyzing ranks"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeRemainingColumn(),
        transient=True,
        console=Console(stderr=True),
    )
    task = bar.add_task("ranks", total=total)

    def update(done: int, _total: int) -> None:
        bar.update(task, completed=done)

    with bar:
        yield update
