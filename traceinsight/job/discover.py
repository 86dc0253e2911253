"""Which files make the job, and the rank each one is (before anything is loaded).

Arguments are trace files, folders (every ``*.json`` / ``*.json.gz`` directly inside) and glob
patterns (``traces/rank-*.json.gz``, ``runs/**/*.json.gz``, expanded here so that a quoted pattern
works too). A file's rank hint is the number after ``rank`` in its name (``rank-3.json.gz``,
``rank_3``, ``rank3``), else the last number in its name; the worker prefers
``distributedInfo.rank`` when the file has it, and the order given (sorted by hint, then name)
when neither says.

A job folder is untrusted like a trace (an archive from a cluster, a bug report): a folder or a
pattern never follows a symbolic link to a folder while it walks (a link to ``.`` would make
``**`` endless), and a trace that is a symbolic link leading out of the folder (or out of the
pattern's fixed start) is skipped with a note, unless ``follow_symlinks`` (``--follow-symlinks``);
then linked folders are walked too, each real folder once. The walk stops with one line past
:data:`MAX_FOLDERS` folders or :data:`MAX_TRACES` traces. Each file keeps the path as the user's
argument spelled it (``RankFile.shown``), never its resolved absolute path, with control
characters replaced: that is what every output shows.
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Final

from traceinsight.errors import TraceNotFound
from traceinsight.load.text import printable
from traceinsight.model import Model

__all__ = ["MAX_FOLDERS", "MAX_TRACES", "Discovery", "RankFile", "discover_ranks", "is_job"]

_TRACE_SUFFIXES: Final = (".json", ".json.gz")
_RANK_IN_NAME: Final = re.compile(r"(?i)rank[-_.]?(\d+)")
_NUMBER: Final = re.compile(r"(\d+)")
_GLOB_CHARS: Final = re.compile(r"[*?\[]")
#: A pattern that walks more folders than this is refused (narrow it).
MAX_FOLDERS: Final = 100_000
#: A job of more traces than this is refused.
MAX_TRACES: Final = 100_000
#: Skipped links named in the note (the rest are counted).
_NAMED: Final = 5


class RankFile(Model, frozen=True):
    """One trace of the job."""

    path: Path
    """The path to read (as found: relative when the argument was)."""
    shown: str
    """The path as the user's argument spelled it, control characters replaced: what outputs show."""
    name_rank: int | None
    """The rank its file name says, if any."""
    order: int
    """Its place among the job's files (sorted by name rank, then name): the rank of last resort."""


class Discovery(Model, frozen=True):
    """The job's files, and what was skipped on the way (one sentence each)."""

    files: tuple[RankFile, ...]
    notes: tuple[str, ...]


def _is_trace_name(name: str) -> bool:
    return name.endswith(_TRACE_SUFFIXES)


def _name_rank(path: Path) -> int | None:
    name = path.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    match = _RANK_IN_NAME.search(name)
    if match is not None:
        return int(match.group(1))
    numbers = _NUMBER.findall(name.removesuffix(".pt.trace"))
    # a lone number is a rank (worker3); tensorboard's <worker>.<time_ns> names are not
    return int(numbers[0]) if len(numbers) == 1 and len(numbers[0]) < 7 else None


def is_job(arguments: Sequence[Path]) -> bool:
    """Whether the arguments name a job (several files, a folder, a pattern), not one trace file."""
    if len(arguments) != 1:
        return True
    only = arguments[0]
    return only.is_dir() or (not only.exists() and _GLOB_CHARS.search(str(only)) is not None)


class _Walk:
    """One argument's expansion: the files found, the links skipped, the folders counted."""

    def __init__(self, base: Path, follow_symlinks: bool) -> None:
        self.base = base
        self.home = base.resolve()
        self.follow = follow_symlinks
        self.found: list[Path] = []
        self.skipped: list[Path] = []
        self.folders = 0
        self.seen: set[tuple[int, int]] = set()
        if follow_symlinks:
            try:
                info = base.stat()
                self.seen.add((info.st_dev, info.st_ino))
            except OSError:
                pass

    def take(self, path: Path, is_link: bool) -> None:
        """Keep ``path`` (a regular file, or a link to one) unless it is a link leading out."""
        if is_link and not self.follow and not path.resolve().is_relative_to(self.home):
            self.skipped.append(path)
            return
        self.found.append(path)
        if len(self.found) > MAX_TRACES:
            raise TraceNotFound(
                f"{self.base} holds more than {MAX_TRACES:,} traces; name the job's own folder or a narrower pattern"
            )

    def enter(self, folder: Path) -> list[os.DirEntry[str]]:
        """The entries of ``folder`` (nothing when it cannot be read), counting the folders walked."""
        self.folders += 1
        if self.folders > MAX_FOLDERS:
            raise TraceNotFound(
                f"the pattern walks more than {MAX_FOLDERS:,} folders under {self.base}; narrow it"
            )
        try:
            with os.scandir(folder) as entries:
                return sorted(entries, key=lambda entry: entry.name)
        except OSError:
            return []

    def first_visit(self, entry: os.DirEntry[str]) -> bool:
        """Whether the real folder behind ``entry`` is walked for the first time (links followed)."""
        try:
            info = entry.stat()
        except OSError:
            return False
        key = (info.st_dev, info.st_ino)
        if key in self.seen:
            return False
        self.seen.add(key)
        return True


def _is_dir(entry: os.DirEntry[str], follow: bool) -> bool:
    try:
        return entry.is_dir(follow_symlinks=follow)
    except OSError:
        return False


def _is_file(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_file()  # a link to a regular file is one
    except OSError:
        return False


def _matches(name: str, part: str) -> bool:
    # As glob: a wildcard never matches a leading dot unless the pattern's part starts with one.
    return fnmatch.fnmatchcase(name, part) and (not name.startswith(".") or part.startswith("."))


def _walk_pattern(walk: _Walk, folder: Path, parts: list[str]) -> None:
    """Match ``parts`` (a pattern's components after its fixed start) below ``folder``."""
    part, rest = parts[0], parts[1:]
    if part == "**":
        if rest:
            _walk_pattern(walk, folder, rest)
        for entry in walk.enter(folder):
            if _matches(entry.name, "*") and _is_dir(entry, walk.follow):
                if entry.is_symlink() and not walk.follow:
                    continue
                if walk.follow and not walk.first_visit(entry):
                    continue
                _walk_pattern(walk, folder / entry.name, parts)
            elif not rest and _matches(entry.name, "*") and _is_file(entry):
                walk.take(folder / entry.name, entry.is_symlink())
        return
    for entry in walk.enter(folder) if _GLOB_CHARS.search(part) else _exact(folder, part):
        if not _matches(entry.name, part):
            continue
        if rest:
            # A wildcard part names folders one level down: a link is followed only with the option.
            if _is_dir(entry, True) and (walk.follow or not entry.is_symlink()):
                _walk_pattern(walk, folder / entry.name, rest)
        elif _is_file(entry):
            walk.take(folder / entry.name, entry.is_symlink())


def _exact(folder: Path, name: str) -> list[os.DirEntry[str]]:
    """The one entry ``name`` of ``folder`` (a pattern's part without wildcards), if it exists."""
    try:
        with os.scandir(folder) as entries:
            return [entry for entry in entries if entry.name == name]
    except OSError:
        return []


def _split(pattern: str) -> tuple[Path, list[str]]:
    """A pattern's fixed start (the folders before the first wildcard) and its remaining parts."""
    parts = Path(pattern).parts
    fixed = next((index for index, part in enumerate(parts) if _GLOB_CHARS.search(part)), len(parts))
    base = Path(*parts[:fixed]) if fixed else Path(".")
    return base, list(parts[fixed:])


def _expand(argument: Path, follow_symlinks: bool) -> _Walk:
    text = str(argument)
    if argument.is_dir():
        walk = _Walk(argument, follow_symlinks)
        for entry in walk.enter(argument):
            if _is_trace_name(entry.name) and _is_file(entry):
                walk.take(argument / entry.name, entry.is_symlink())
        if not walk.found and not walk.skipped:
            raise TraceNotFound(
                f"no traces in {argument}: the directory holds no .json or .json.gz file; "
                "name the folder the ranks' traces were written to"
            )
        return walk
    if argument.exists():
        walk = _Walk(argument.parent, follow_symlinks=True)  # a file the user named is theirs to name
        walk.found.append(argument)
        return walk
    if _GLOB_CHARS.search(text):
        base, parts = _split(text)
        walk = _Walk(base, follow_symlinks)
        if base.is_dir():
            _walk_pattern(walk, base, parts)
        if not walk.found and not walk.skipped:
            raise TraceNotFound(
                f"no file matches {text}; check the pattern (quote it to let traceinsight expand it)"
            )
        return walk
    raise TraceNotFound(f"cannot read trace {text}: no such file or folder")


def _note(walk: _Walk) -> str:
    names = ", ".join(printable(str(path)) for path in walk.skipped[:_NAMED])
    more = f" and {len(walk.skipped) - _NAMED} more" if len(walk.skipped) > _NAMED else ""
    count = len(walk.skipped)
    return (
        f"skipped {count} symbolic link{'s' if count > 1 else ''} leading out of "
        f"{printable(str(walk.base))} ({names}{more}); pass --follow-symlinks to analyze "
        f"{'them' if count > 1 else 'it'}"
    )


def discover_ranks(arguments: Sequence[Path], *, follow_symlinks: bool = False) -> Discovery:
    """The job's files, each once (by resolved path), in rank order as far as names tell; and a
    note for each argument whose links leading out of it were skipped."""
    paths: dict[Path, Path] = {}
    notes: list[str] = []
    for argument in arguments:
        walk = _expand(argument, follow_symlinks)
        for path in walk.found:
            paths.setdefault(path.resolve(), path)
        if walk.skipped:
            notes.append(_note(walk))
    if not paths:
        raise TraceNotFound("no traces to analyze: " + "; ".join(notes) if notes else "no traces to analyze")
    given = list(paths.values())
    hinted = sorted(given, key=lambda p: (_name_rank(p) is None, _name_rank(p) or 0, p.name, str(p)))
    files = tuple(
        RankFile(path=p, shown=printable(str(p)), name_rank=_name_rank(p), order=i)
        for i, p in enumerate(hinted)
    )
    return Discovery(files=files, notes=tuple(notes))
