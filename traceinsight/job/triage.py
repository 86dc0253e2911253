"""A job folder as people keep it: which of its files are traces, and how to read them.

Before any rank is analyzed, each file's first bytes are read (at most :data:`HEAD_BYTES` of its
JSON, gzip or not) to sort it:

- a **trace**: a Chrome trace array (``[`` and events with a ``"ph"``), or an object whose head
  holds ``"traceEvents"``;
- a **result** of traceinsight (``analyze --json``: an object with a ``"schema"`` key, the tool
  named ``"traceinsight"``, no ``traceEvents``): skipped;
- **other**: valid JSON read whole without ``traceEvents`` (``config.json``, ``metadata.json``):
  skipped. A file that is not valid JSON stays a trace: the loader's line says where it breaks.

A file too large to read whole whose head says neither stays a trace (the loader judges it).
The skipped files are named in one note; the job needs at least one trace.

Files that are one process's profiler cycles, not ranks: ``tensorboard_trace_handler`` names each
cycle's file ``<worker>.<time in ns>.pt.trace.json[.gz]`` with ``worker`` = ``<host>_<pid>`` by
default. When every trace of the job has such a name with one worker, and no head says a rank
(``distributedInfo``), they are the cycles of one run: shown side by side, in
time order, with no cross-rank analysis (there is no other rank to wait for).

Duplicate ranks (two heads whose ``distributedInfo`` says the same rank) are refused here, before
the slow part, with the line the combine step would give after it.
"""

from __future__ import annotations

import gzip
import json
import re
import zlib
from collections.abc import Sequence
from pathlib import Path
from typing import Final, Literal

from traceinsight.errors import TraceFormatError, TraceNotFound, TraceUnreadable
from traceinsight.job.discover import Discovery, RankFile, discover_ranks
from traceinsight.load.text import printable
from traceinsight.model import Model, replace

__all__ = ["HEAD_BYTES", "JobFiles", "Sniffed", "Triage", "job_files", "sniff", "triage"]

#: How much of a file's JSON is read to sort it (a trace's ``traceEvents`` key comes after its
#: device properties and distributed info: a few kB, tens of kB for thousands of ranks).
HEAD_BYTES: Final = 1 << 20
_TRACE_KEY: Final = re.compile(rb'"traceEvents"\s*:')
_SCHEMA_KEY: Final = re.compile(rb'"schema"\s*:')
_RANK: Final = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*?"rank"\s*:\s*(\d+)')
#: ``tensorboard_trace_handler``'s file names: ``<worker>.<time_ns>.pt.trace.json[.gz]``.
_CYCLE_NAME: Final = re.compile(r"(?P<worker>.+)\.(?P<ns>\d{10,})\.pt\.trace\.json(?:\.gz)?")
_NAMED: Final = 5


class Sniffed(Model, frozen=True):
    """What a file's head says."""

    kind: Literal["trace", "result", "other"]
    rank: int | None
    """``distributedInfo.rank`` when the head holds it."""


class Triage(Model, frozen=True):
    """The job's traces, what was skipped, and how the traces are read."""

    files: tuple[RankFile, ...]
    notes: tuple[str, ...]
    cycles_of: str | None
    """The worker (``host_pid``) whose profiler cycles the traces are; None: they are ranks."""


def _head(path: Path) -> tuple[bytes, bool]:
    """Up to :data:`HEAD_BYTES` of the file's JSON text, and whether that is all of it."""
    try:
        with path.open("rb") as stream:
            magic = stream.read(2)
            stream.seek(0)
            if magic == b"\x1f\x8b":
                with gzip.GzipFile(fileobj=stream) as unpacked:
                    data = unpacked.read(HEAD_BYTES + 1)
            else:
                data = stream.read(HEAD_BYTES + 1)
    except (OSError, EOFError, zlib.error) as error:
        if isinstance(error, OSError) and not isinstance(error, gzip.BadGzipFile) and error.strerror:
            raise TraceUnreadable(
                f"cannot read {printable(str(path))}: {error.strerror}; check the file's permissions"
            ) from None
        raise TraceUnreadable(
            f"cannot read {printable(str(path))}: its gzip stream is damaged ({error}); "
            "was the profiler stopped cleanly? remove it from the folder or name the other traces"
        ) from None
    return data[:HEAD_BYTES], len(data) <= HEAD_BYTES


def sniff(path: Path) -> Sniffed:
    """Sort ``path`` by its head (see the module's docstring)."""
    head, whole = _head(path)
    start = head.lstrip(b"\xef\xbb\xbf \t\r\n")
    if start.startswith(b"[") and (b'"ph"' in head or not whole):  # events all have a phase
        return Sniffed("trace", None)
    events = _TRACE_KEY.search(head)
    if events is not None:
        rank = _RANK.search(head, 0, events.start())
        return Sniffed("trace", int(rank.group(1)) if rank is not None else None)
    if start.startswith(b"{") and _SCHEMA_KEY.search(head) and b'"traceinsight"' in head:
        return Sniffed("result", None)
    return Sniffed("other" if whole and _is_json(head) else "trace", None)


def _is_json(text: bytes) -> bool:
    """Whether ``text`` is one valid JSON value (a broken file stays a trace for the loader to
    word: its line names where the JSON breaks)."""
    try:
        json.loads(text)
    except (ValueError, RecursionError):
        return False
    return True


def _listed(paths: Sequence[str]) -> str:
    more = f" and {len(paths) - _NAMED} more" if len(paths) > _NAMED else ""
    return ", ".join(paths[:_NAMED]) + more


def triage(files: Sequence[RankFile]) -> Triage:
    """The job's traces among ``files`` (a note naming the rest), and whether they are one
    process's profiler cycles. Raises :class:`TraceNotFound` when none is a trace."""
    kept: list[tuple[RankFile, Sniffed]] = []
    results: list[str] = []
    others: list[str] = []
    for file in files:
        found = sniff(file.path)
        if found.kind == "trace":
            kept.append((file, found))
        else:
            (results if found.kind == "result" else others).append(file.shown)
    skipped = []
    if results:
        skipped.append(f"{_listed(results)} (a traceinsight result)")
    if others:
        skipped.append(f"{_listed(others)} (JSON without traceEvents, not a trace)")
    notes = [f"skipped what is not a trace: {'; '.join(skipped)}"] if skipped else []
    if not kept:
        raise TraceNotFound(
            f"no traces to analyze: {'; '.join(skipped)}; name the folder the profiler wrote its traces to"
        )
    workers = {match.group("worker") if (match := _CYCLE_NAME.fullmatch(file.path.name)) else None
               for file, _ in kept}  # fmt: skip
    ranks = {found.rank for _, found in kept if found.rank is not None}
    if len(kept) > 1 and len(workers) == 1 and None not in workers and not ranks:
        worker = printable(str(next(iter(workers))))
        in_time = sorted(kept, key=lambda item: (int(_cycle_ns(item[0].path.name)), item[0].path.name))
        cycles = tuple(replace(file, name_rank=None, order=index) for index, (file, _) in enumerate(in_time))
        notes.append(
            f"read as {len(cycles)} profiler cycles of one process ({worker}), not ranks: the files' names "
            "are tensorboard_trace_handler's <host>_<pid>.<time>.pt.trace.json of one worker; "
            "shown side by side in time order (cycle 0 first), without cross-rank analysis"
        )
        return Triage(files=cycles, notes=tuple(notes), cycles_of=worker)
    _refuse_duplicate_ranks(kept)
    files_kept = tuple(replace(file, order=index) for index, (file, _) in enumerate(kept))
    return Triage(files=files_kept, notes=tuple(notes), cycles_of=None)


def _cycle_ns(name: str) -> str:
    match = _CYCLE_NAME.fullmatch(name)
    return match.group("ns") if match is not None else "0"


def _refuse_duplicate_ranks(kept: Sequence[tuple[RankFile, Sniffed]]) -> None:
    """Two traces whose ``distributedInfo`` says the same rank: one line now, not after the slow part."""
    seen: dict[int, str] = {}
    for file, found in kept:
        if found.rank is None:
            continue
        if found.rank in seen:
            raise TraceFormatError(
                f"two traces say they are rank {found.rank}: {seen[found.rank]} and {file.shown} "
                "(rank taken from distributedInfo); give each rank's trace once"
            )
        seen[found.rank] = file.shown


class JobFiles(Model, frozen=True):
    """A job's traces, found and sorted before any rank is analyzed (:func:`job_files`)."""

    discovery: Discovery
    #: The process whose profiler cycles the files are (None: they are ranks; see :mod:`~traceinsight.job.triage`).
    cycles_of: str | None

    @property
    def paths(self) -> list[Path]:
        """The traces' paths (the inputs no output may replace)."""
        return [file.path for file in self.discovery.files]


def job_files(arguments: Sequence[Path], *, follow_symlinks: bool = False) -> JobFiles:
    """The job's traces among ``arguments`` (traces, folders, patterns): what is not a trace (a job's
    own result, a config) skipped with a note, before any rank is analyzed."""
    discovery = discover_ranks(list(arguments), follow_symlinks=follow_symlinks)
    sorted_out = triage(discovery.files)
    discovery = replace(discovery, files=sorted_out.files, notes=(*discovery.notes, *sorted_out.notes))
    return JobFiles(discovery, sorted_out.cycles_of)
