"""Write a finished window as the trace file: torch's export, then one streaming pass of ours.

torch (libkineto) writes the Chrome trace as JSON text, one event over a few lines, in one of two
layouts: one key per line (torch 2.13), or several keys per line (``"ph": "X", "cat": "…",
"name": "…", "pid": …`` in the kineto of torch 2.1-2.12, whose file opens with a blank line and
an indented ``{``). That text is read back line by line and copied to the trace file (gzip when
its name ends in ``.gz``), fixing on the way what ``traceinsight run`` must not leave behind:

- **torch's unescaped names.** libkineto writes names as they are, removing only newlines (the
  one in torch 2.13 also turns backslashes into ``/``; some older ones only on Windows): a frame
  whose function or file name holds a ``"`` makes the whole file invalid JSON (seen with
  torchvision's ``roi_align.py``), and so does a backslash that starts no JSON escape. Every
  quote and backslash of a name is escaped (:func:`traceinsight.load.repair.escaped_name`, as
  ``analyze`` mends a trace torch wrote) and the names changed counted.
- **the user frames of ``--stacks user``** (:mod:`.frames`) arrive as ``user_annotation`` ranges
  named :data:`~.frames.FRAME_MARK` ``+ name`` (a function, named by its first line) or
  :data:`~.frames.SITE_MARK` ``+ name`` (a call site, named by the call's line); they are written
  as the ``python_function`` frames torch would have written, with ``"Call site": 0`` or ``1`` in
  their ``args`` (torch's own frames have none).
- **the temporary file's path** torch writes as ``traceName`` (an absolute path, the user's folder
  layout in a shared trace), unescaped: a ``"`` in a folder's or the trace's name used to end the
  string there, leaving invalid JSON or, with a name like ``x", "distributedInfo": {…}, "z": "``,
  keys of a stranger's choosing in the trace. The key is the last torch writes: from it to the end
  of torch's text is dropped and written anew, the trace file's own name as a JSON string (never
  text spliced into JSON).
- **what `run` knows of how it profiled** is added as a top-level ``"traceinsight"`` object
  (:data:`RUN_RECORD_KEY`): ``stacks`` (``--stacks``), ``stepMarks`` (what ended steps:
  ``optimizer``, ``explicit`` for ``traceinsight.step()``, ``backward``, or ``none``: the whole run
  is one window) and ``unprofiledStepNs`` / ``unprofiledSteps`` (the median duration of the steps
  that ran just before the window without being recorded, and how many), ``unprofiledStepsNs``
  (each of those steps, in order: the first ones are often start-up, which a fair baseline leaves
  out) and ``loaderFetch``
  (``"range only"`` when the DataLoader's fetch was recorded as its range, without its operators:
  :mod:`.fetch`) and ``cutShort`` (``true`` when the memory budget stopped the window inside its
  last step, which the trace holds only part of) and ``stepUsage`` (each recorded step as the
  process lived it, ``[wall_ns, cpu_ns, cpu_wait_ns, load_1m]``, its first 1,000: what lets a diff
  of traces alone tell a run starved of CPU), so that ``analyze`` says
  the same of the file later, and what recording cost the steps can be told.

The pass holds one event (a dozen lines) at a time, so memory does not grow with the trace.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from traceinsight.capture.frames import FRAME_MARK, SITE_MARK
from traceinsight.load.repair import escaped_name
from traceinsight.model import Model

__all__ = ["RUN_RECORD_KEY", "ExportResult", "write_trace"]

RUN_RECORD_KEY = "traceinsight"
"""Top-level key of what `traceinsight run` recorded about how it profiled."""

#: torch writes ``],"traceName": "…" }`` on the line that closes the events (torch 2.1-2.12:
#: ``"traceName": "…"`` on a line of its own after them, then ``}``), the last key of its text.
_TRACE_NAME_KEY = b'"traceName": '
#: An event's name: its line's first key, or after another key on the line.
_NAME_KEY = b'"name": "'
#: What follows a name on its line in the older layout (``"name": "…", "pid": 1, "tid": 1,``),
#: the last of them on the line; a name at the end of its line ends at the line's last quote.
_NEXT_KEYS = (b'", "pid": ', b'", "ph": ', b'", "bp": ')
_COMMA, _QUOTE = ord(","), ord('"')
_CATEGORY = re.compile(rb'"cat": "[^"]*"')
_FRAME_CATEGORY = b'"cat": "python_function"'
_MARKS = ((FRAME_MARK.encode(), b"0"), (SITE_MARK.encode(), b"1"))
_MARK_STEM = b"traceinsight."  # what both marks start with
assert all(mark.startswith(_MARK_STEM) for mark, _ in _MARKS)
_ARGS_LINE = b'"args": {'
_EVENT_START = b"  {"
_COPY_CHUNK = 1 << 16
#: Bytes of torch's export between two progress reports.
_PROGRESS_BYTES = 4 << 20

ProgressCallback = Callable[[int, int], None]
"""``progress(bytes_done, bytes_total)`` of the pass over torch's export."""


class ExportResult(Model, frozen=True):
    """What one export wrote."""

    path: Path
    raw_bytes: int
    """Size of torch's own (uncompressed) export."""
    written_bytes: int
    """Size of the trace file."""
    repaired_names: int
    """Names torch wrote with a bare ``"`` or a bare backslash that were escaped."""
    user_frames: int
    """User frames (``--stacks user``) written as ``python_function`` events."""
    seconds: float
    """Time from the start of torch's export to the file being in place."""


def write_trace(
    profiler: Any,
    destination: Path,
    progress: ProgressCallback | None = None,
    run_record: dict[str, Any] | None = None,
) -> ExportResult:
    """Export ``profiler``'s last window to ``destination`` (atomically); raise OSError on failure.

    ``run_record``: written as the top-level :data:`RUN_RECORD_KEY` object."""
    started = time.perf_counter()
    folder = destination.parent
    raw_path = folder / f".{destination.name}.{os.getpid()}.torch.json"
    partial = folder / f".{destination.name}.{os.getpid()}.partial"
    try:
        profiler.export_chrome_trace(str(raw_path))
        raw_bytes = raw_path.stat().st_size
        with raw_path.open("rb") as source, _open_output(partial, destination.name.endswith(".gz")) as out:
            repaired, frames = _copy_fixed(source, out, raw_bytes, progress, run_record, destination.name)
        written = partial.stat().st_size
        os.replace(partial, destination)
    finally:
        raw_path.unlink(missing_ok=True)
        partial.unlink(missing_ok=True)
    return ExportResult(
        path=destination,
        raw_bytes=raw_bytes,
        written_bytes=written,
        repaired_names=repaired,
        user_frames=frames,
        seconds=time.perf_counter() - started,
    )


def _open_output(path: Path, compress: bool) -> IO[bytes]:
    if compress:
        # Level 6: about as small as torch's level 9 on traces, several times faster.
        return gzip.GzipFile(path, "wb", compresslevel=6)  # type: ignore[return-value]
    return path.open("wb")


def _copy_fixed(
    source: IO[bytes],
    out: IO[bytes],
    total: int,
    progress: ProgressCallback | None,
    run_record: dict[str, Any] | None = None,
    trace_name: str | None = None,
) -> tuple[int, int]:
    """Copy torch's export to ``out`` event by event; return (names repaired, user frames).
    ``run_record`` goes in as the first key of the top-level object; ``trace_name`` replaces the
    ``traceName`` torch wrote."""
    repaired = frames = 0
    done = 0
    next_report = 0
    event: list[bytes] = []
    pending: list[bytes] = []
    record = (
        None
        if run_record is None
        else f'  "{RUN_RECORD_KEY}": {json.dumps(run_record, sort_keys=True)},\n'.encode()
    )
    for line in source:
        done += len(line)
        if record is not None and line.strip() in (b"{", b""):
            # torch opens the top-level object alone on a line (torch 2.1-2.12: after a blank one)
            pending += [line, record] if line.strip() == b"{" else [line]
            record = record if line.strip() == b"" else None
            continue
        record = None
        if event:
            event.append(line)
            if line.startswith(b"  }"):
                fixed, was_repaired, was_frame = _fix_event(event)
                repaired += was_repaired
                frames += was_frame
                pending.extend(fixed)
                event = []
        elif line.startswith(_EVENT_START):
            event.append(line)
        elif trace_name is not None and _TRACE_NAME_KEY in line:
            # torch's path is spliced in unescaped (a quote or a newline in it ends nothing it
            # should): whatever follows the key is dropped, the file's own name written as JSON.
            shown = trace_name.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            head = line[: line.index(_TRACE_NAME_KEY)]
            pending.append(head + _TRACE_NAME_KEY + json.dumps(shown).encode() + b"\n}\n")
            done = total
            break
        else:
            pending.append(line)
        if len(pending) > 512:
            out.write(b"".join(pending))
            pending.clear()
        if progress is not None and done >= next_report:
            progress(done, total)
            next_report = done + _PROGRESS_BYTES
    pending.extend(event)  # an unfinished last event (never from torch): copied as it is
    out.write(b"".join(pending))
    if progress is not None:
        progress(total, total)
    return repaired, frames


def _fix_event(lines: list[bytes]) -> tuple[list[bytes], int, int]:
    """One event's lines with its name escaped and a user-frame range turned into a frame."""
    if len(lines) > 1 and b', "' not in lines[1]:  # one key per line (torch 2.13): "ph" alone first
        for index, line in enumerate(lines):
            if line.lstrip().startswith(_NAME_KEY):
                start = line.index(_NAME_KEY) + len(_NAME_KEY)
                end = _line_end(line, start)
                return (lines, 0, 0) if end is None else _fixed(lines, index, start, end)
        return lines, 0, 0
    for index, line in enumerate(lines):  # several keys per line (torch 2.1-2.12)
        if line.lstrip().startswith(b'"args"'):
            break  # the event's own name comes before its args (a metadata event's args hold a name)
        key = line.find(_NAME_KEY)
        if key < 0 or (line[:key].strip() and not line[:key].endswith(b", ")):
            continue  # no name key here (a key's value or a name that holds the words)
        start = key + len(_NAME_KEY)
        end = line.rfind(_NEXT_KEYS[0], start)  # an operator or kernel: its pid follows
        if end < 0:
            end = max(line.rfind(_NEXT_KEYS[1], start), line.rfind(_NEXT_KEYS[2], start))
        end = end if end >= 0 else _line_end(line, start)
        return (lines, 0, 0) if end is None else _fixed(lines, index, start, end)
    return lines, 0, 0


def _line_end(line: bytes, start: int) -> int | None:
    """Where a name that ends its line ends (its closing quote), None if the line does not end so."""
    end = len(line.rstrip(b"\r\n"))
    if end > start and line[end - 1] == _COMMA:
        end -= 1
    return end - 1 if end > start and line[end - 1] == _QUOTE else None


def _fixed(lines: list[bytes], index: int, start: int, end: int) -> tuple[list[bytes], int, int]:
    """``lines`` with the name at ``lines[index][start:end]`` escaped and, if it is one of our user
    ranges, the event made a frame: category ``python_function``, ``"Call site"`` in its args."""
    line = lines[index]
    text = line[start:end]
    call_site = (
        next((flag for mark, flag in _MARKS if text.startswith(mark)), None)
        if text.startswith(_MARK_STEM)
        else None
    )
    if call_site is not None:
        text = text.partition(b": ")[2]
    escaped = escaped_name(text)
    if call_site is None and escaped == text:
        return lines, 0, 0
    lines = [*lines]
    lines[index] = line[:start] + escaped + line[end:]
    if call_site is None:
        return lines, 1, 0
    for before, other in enumerate(lines[: index + 1]):  # the category comes before the name
        head = other[:start] if before == index else other
        category = _CATEGORY.search(head)
        if category is not None:
            lines[before] = other[: category.start()] + _FRAME_CATEGORY + other[category.end() :]
            break
    return _with_call_site(lines, call_site), int(escaped != text), 1


def _with_call_site(lines: list[bytes], flag: bytes) -> list[bytes]:
    """An event's lines with ``"Call site": flag`` first in its ``args`` (added when it has none)."""
    for index, line in enumerate(lines):
        if line.strip() == _ARGS_LINE:
            empty = index + 1 < len(lines) and lines[index + 1].lstrip().startswith(b"}")
            member = b'      "Call site": ' + flag + (b"\n" if empty else b",\n")
            return [*lines[: index + 1], member, *lines[index + 1 :]]
    closing = len(lines) - 1  # the event's closing "  }" line
    return [*lines[:closing], b'    ,\n    "args": {"Call site": ' + flag + b"}\n", lines[closing]]
