"""A stored result read back: input as untrusted as a trace.

A baseline result comes from a teammate, a CI artifact, a bug report. It is read as a trace is:

- **the file** (:func:`read_stored_result`): a regular file (a FIFO, a device, a socket refused
  before it is opened, by :func:`~traceinsight.load.source.open_trace`), at most
  :data:`MAX_RESULT_BYTES` (or ``--max-size``) read, never more;
- **the text** (:func:`from_text`): strict JSON under the limits of :func:`.codec.parse`, then
  every field of its type and range (:class:`.codec.Reader`), into the result type its ``kind``
  says: :class:`~.trace.Result`, :class:`~.job.JobResult`, :class:`~.comparison.Comparison` or
  :class:`~.job_comparison.JobComparison`. The kind is read first (``tool.kind`` ``diff``; then the
  top-level ``kind``: ``job``, ``job-diff``), then the schema that kind had: a job's result is never
  judged by a trace's old schema.

Anything else is one line and exit 2 (:class:`~traceinsight.errors.TraceFormatError`) naming the
file and the field. A file is taken for a stored result when its first bytes say so (an object
whose ``tool`` is ``traceinsight``); anything else is left to the trace loader.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from traceinsight.errors import TraceFormatError
from traceinsight.load.source import SizeLimit, TraceTooLarge, format_bytes, open_trace
from traceinsight.load.text import printable
from traceinsight.results.codec import Reader, parse, read_as

if TYPE_CHECKING:
    from traceinsight.results.comparison import Comparison
    from traceinsight.results.job import JobResult
    from traceinsight.results.job_comparison import JobComparison
    from traceinsight.results.trace import Result

__all__ = [
    "MAX_RESULT_BYTES",
    "from_text",
    "kind_of",
    "looks_stored",
    "read_result",
    "read_stored",
    "read_stored_result",
]

_R = TypeVar("_R", "Result", "JobResult", "Comparison", "JobComparison")

#: A stored result larger than this is refused (unless ``--max-size`` says more): the largest
#: result of the sample traces is 0.55 MB, and every list in a result is bounded.
MAX_RESULT_BYTES: Final = 16 << 20
_HEAD: Final = re.compile(rb'\A(?:\xef\xbb\xbf)?\s*\{[^\0]*?"tool"\s*:\s*\{\s*"name"\s*:\s*"traceinsight"')
_HINT: Final = "is it a complete result of traceinsight analyze --json?"
#: What each kind of result is called in messages.
_KINDS: Final = {
    "trace": "a trace's result",
    "job": "a job's result",
    "diff": "the output of traceinsight diff",
    "job-diff": "the output of traceinsight diff of two jobs",
}


def kind_of(document: Any, reader: Reader) -> str:
    """``trace``, ``job``, ``diff`` or ``job-diff``: which result ``document`` is (after the checks
    every kind shares: an object written by traceinsight, in a schema this version reads)."""
    top = reader.object(document, "the result")
    tool = reader.object(top.get("tool"), "tool")
    if tool.get("name") != "traceinsight":
        reader.fail("tool.name", tool.get("name"), '"traceinsight"')
    if tool.get("kind") == "diff":
        kind = "job-diff" if top.get("kind") == "job-diff" else "diff"
    else:
        kind = "job" if top.get("kind") == "job" else "trace"
    schema = top.get("schema")
    if kind == "trace" and isinstance(schema, int) and not isinstance(schema, bool) and 0 <= schema < 2:
        raise TraceFormatError(
            f"{reader.prefix}: it is a result of schema {schema}, written before traceinsight measured "
            "steps and savings; analyze its trace again"
        )
    if isinstance(schema, bool) or not isinstance(schema, int) or schema < 1:
        reader.fail("schema", schema, "an integer of at least 1")
    return kind


def from_text(
    text: str | bytes, cls: type[_R], *, prefix: str = "cannot read the result", hint: str = _HINT
) -> _R:
    """The result of type ``cls`` in ``text`` (its JSON), read under the module's checks; one
    :class:`~traceinsight.errors.TraceFormatError` (``prefix: what is wrong; hint``) for anything
    else (a result of another kind too: each type says its kind, ``cls.KIND``). A text longer than
    :data:`MAX_RESULT_BYTES` (bytes, or characters of a ``str``) is refused before it is parsed
    (64 MiB took 3.28 GB to parse)."""
    reader = Reader(prefix, hint)
    if len(text) > MAX_RESULT_BYTES:
        unit = "bytes" if isinstance(text, bytes) else "characters"
        raise TraceTooLarge(
            f"{prefix}: it holds {len(text):,} {unit}, more than the {format_bytes(MAX_RESULT_BYTES)} "
            "that every result of traceinsight stays under; it is not one"
        )
    document = parse(text, reader.refused)
    kind = kind_of(document, reader)
    if kind != cls.KIND:
        raise TraceFormatError(f"{prefix}: it is {_KINDS[kind]}, not {_KINDS[cls.KIND]}")
    return read_as(cls, document, reader)


def read_stored_result(path: Path, cls: type[Result], limit: SizeLimit | None = None) -> Result | None:
    """The trace's result (of type ``cls``) stored in ``path`` when it is one (see the module doc),
    else None (a trace). ``limit.max_bytes`` (``--max-size``) replaces :data:`MAX_RESULT_BYTES`
    when given. For a diff of one trace's results: a job's result or a diff's output is refused,
    in its words.
    """
    stored = read_stored(path, (cls,), limit)
    assert stored is None or isinstance(stored, cls)
    return stored


def looks_stored(path: Path) -> bool:
    """Whether ``path`` is a regular file that starts as a stored result does (an object whose
    ``tool`` is traceinsight): a cheap look for choosing a reader, before any result type is
    loaded; the file is then read under every check (:func:`read_result`)."""
    if not path.is_file():  # a FIFO would block the open; a folder is a job's
        return False
    try:
        with path.open("rb") as stream:
            head = stream.read(4096)
    except OSError:
        return False
    return _HEAD.match(head) is not None


def read_stored(
    path: Path, classes: Sequence[type[Result] | type[JobResult]], limit: SizeLimit | None = None
) -> Result | JobResult | None:
    """One side of ``diff`` stored in ``path``: the result of whichever of ``classes`` its kind
    says (see the module doc); None when the file is not a stored result (a trace).
    ``limit.max_bytes`` (``--max-size``) replaces :data:`MAX_RESULT_BYTES` when given. A diff's
    output is refused, a kind not among ``classes`` too, and so is a job's result written before
    job results held their savings per step (what a job diff compares), each in its words.
    """
    return cast("Result | JobResult | None", read_result(path, classes, limit, "compare"))


def read_result(
    path: Path,
    classes: Sequence[type[Result] | type[JobResult] | type[Comparison] | type[JobComparison]],
    limit: SizeLimit | None = None,
    action: str = "render",
) -> Result | JobResult | Comparison | JobComparison | None:
    """The result stored in ``path``, of whichever of ``classes`` its kind says, for ``action``
    (``compare``, ``render``: the errors' words); None when the file is not a stored result. See
    :func:`read_stored`."""
    given = limit if limit is not None else SizeLimit()
    most = given.max_bytes if given.max_bytes is not None else MAX_RESULT_BYTES
    with open_trace(path, SizeLimit(given.max_bytes)) as source:
        if source.compressed:
            return None
        head = source.stream.read(4096)
        if _HEAD.match(head) is None:
            return None
        if source.size > most:
            raise _too_large(path, most, action)
        data = head + source.stream.read(most + 1 - len(head))
    if len(data) > most:  # grew while read
        raise _too_large(path, most, action)
    prefix = f"cannot {action} {path}"
    reader = Reader(prefix, _HINT)
    document = parse(data, reader.refused)
    kind = kind_of(document, reader)
    cls = next((cls for cls in classes if kind == cls.KIND), None)
    if cls is None and kind in ("diff", "job-diff"):
        raise TraceFormatError(
            f"{prefix}: it is {_KINDS[kind]}; give a trace, a job's traces, or a result of traceinsight "
            "analyze --json"
        )
    if cls is None:
        raise TraceFormatError(
            f"{prefix}: it is {_KINDS[kind]}; a trace compares with a trace: give a rank's trace or its "
            "result of traceinsight analyze --json, or two jobs"
            if kind == "job"
            else f"{prefix}: it is {_KINDS[kind]}, not {_KINDS[classes[0].KIND]}"
        )
    if kind == "job":
        _check_job_era(document, prefix)
    return read_as(cls, document, reader)


def _check_job_era(document: dict[str, Any], prefix: str) -> None:
    """A job's result from before job results held savings per step (job schema 1, or schema 2
    without ``job.read_as`` and the findings' ``savings_per_step_us``, which came together) cannot
    be compared: one line saying so."""
    job = document.get("job")
    findings = document.get("findings")
    schema = document.get("schema")
    current = (
        isinstance(schema, int)
        and schema >= 2  # a job's schema was 1 before the kinds shared one version
        and isinstance(job, dict)
        and "read_as" in job
        and isinstance(findings, list)
        and all(isinstance(entry, dict) and "savings_per_step_us" in entry for entry in findings)
    )
    if current:
        return
    tool = document.get("tool") or {}
    version = tool.get("version") if isinstance(tool, dict) else None
    written = (
        f"traceinsight {printable(version)[:40]}" if isinstance(version, str) else "an older traceinsight"
    )
    schema = document.get("schema")
    raise TraceFormatError(
        f"{prefix}: it is a job's result written by {written} (job schema {schema!s:.10}), before job "
        "results held their savings per step, which a job diff compares; analyze the job's traces again "
        "(traceinsight analyze FOLDER --json job.json)"
    )


def _too_large(path: Path, most: int, action: str) -> TraceTooLarge:
    return TraceTooLarge(
        f"cannot {action} {path}: the stored result is larger than {format_bytes(most)}, which no result "
        "of traceinsight analyze --json is; pass --max-size to read it anyway"
    )
