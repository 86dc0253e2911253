"""Which files make the job, and the rank each one is (before anything is loaded).

Arguments are trace files, folders (every ``*.json`` / ``*.json.gz`` directly inside) and glob
patterns (``traces/rank-*.json.gz``, expanded here so that a quoted pattern works too). A file's
rank hint is the number after ``rank`` in its name (``rank-3.json.gz``, ``rank_3``, ``rank3``),
else the last number in its name; the worker prefers ``distributedInfo.rank`` when the file has it,
and the order given (sorted by hint, then name) when neither says.
"""

from __future__ import annotations

import glob
import re
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from traceinsight.errors import TraceNotFound

__all__ = ["RankFile", "discover_ranks", "is_job"]

_TRACE_SUFFIXES: Final = (".json", ".json.gz")
_RANK_IN_NAME: Final = re.compile(r"(?i)rank[-_.]?(\d+)")
_NUMBER: Final = re.compile(r"(\d+)")
_GLOB_CHARS: Final = re.compile(r"[*?\[]")


@dataclass(frozen=True, slots=True)
class RankFile:
    """One trace of the job."""

    path: Path
    """Absolute path (the same text whichever machine reads it, for a shared file system)."""
    name_rank: int | None
    """The rank its file name says, if any."""
    order: int
    """Its place among the job's files (sorted by name rank, then name): the rank of last resort."""


def _is_trace_name(path: Path) -> bool:
    return path.name.endswith(_TRACE_SUFFIXES)


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


def _expand(argument: Path) -> list[Path]:
    text = str(argument)
    if argument.is_dir():
        found = sorted(p for p in argument.iterdir() if p.is_file() and _is_trace_name(p))
        if not found:
            raise TraceNotFound(
                f"no traces in {argument}: the directory holds no .json or .json.gz file; "
                "name the folder the ranks' traces were written to"
            )
        return found
    if argument.exists():
        return [argument]
    if _GLOB_CHARS.search(text):
        matched = sorted(Path(p) for p in glob.glob(text, recursive=True) if Path(p).is_file())
        if not matched:
            raise TraceNotFound(
                f"no file matches {text}; check the pattern (quote it to let traceinsight expand it)"
            )
        return matched
    raise TraceNotFound(f"cannot read trace {text}: no such file or folder")


def discover_ranks(arguments: Sequence[Path]) -> tuple[RankFile, ...]:
    """The job's files, each once (by resolved path), in rank order as far as names tell."""
    paths: dict[Path, None] = {}
    for argument in arguments:
        for path in _expand(argument):
            paths.setdefault(path.resolve(), None)
    hinted = sorted(paths, key=lambda p: (_name_rank(p) is None, _name_rank(p) or 0, p.name, str(p)))
    return tuple(RankFile(path=p, name_rank=_name_rank(p), order=i) for i, p in enumerate(hinted))
