"""Every file a command writes goes through here: one check, one way of writing.

An output path is untrusted like a trace: it may name the trace being read, a file that is not
ours (a user's notes, another tool's result), a device (``-o /dev/null``), a FIFO or a symlink
(``--json /dev/stdout``). The rules, for every command and every output (``-o``, ``--json``,
``--markdown``, ``--per-rank``, ``run``'s trace and report):

- **never an input** of the run (the trace, a stored result given to ``diff``, a job's ranks,
  the script ``run`` profiles), nor another output: compared after resolving links, and by inode
  (hard links);
- **never a file that is not ours** without ``force``: an existing regular file is replaced only
  when it is empty or what an earlier run of ours wrote there (:data:`MARKERS`, by kind);
- **a device, FIFO or symlink is never replaced by a rename**: a character device or a FIFO
  (also behind a symlink) is written through; a symlink to a regular file keeps the link and
  replaces the file it names; a symlink to nothing, a folder, a block device or a socket is
  refused. A regular file is written atomically (a temporary file beside it, then a rename), so
  there is never a half-written output;
- outputs that must be read back (``run``'s trace) must be regular files.

:func:`check_outputs` runs before the (possibly long) work, :func:`write_output` when the text is
ready (it checks again: the file system may have changed meanwhile). Files made elsewhere (a job's
per-rank reports, written by workers) are :func:`stage`\\ d beside their target and
:func:`publish`\\ ed, or :func:`discard`\\ ed, once the command's own checks pass.

This module knows nothing of the CLI: an :class:`Output` names the option it came from only to
word its errors.
"""

from __future__ import annotations

import contextlib
import gzip
import os
import re
import stat
import tempfile
from collections.abc import Sequence
from enum import Enum
from pathlib import Path
from typing import Final

from traceinsight.errors import OutputError
from traceinsight.model import Model

__all__ = [
    "MARKERS",
    "REPORT_MARKER",
    "Kind",
    "Output",
    "check_outputs",
    "discard",
    "publish",
    "stage",
    "write_output",
]


class Kind(Enum):
    """What an output holds: what an earlier one of ours looks like, and how it is named in errors."""

    HTML = "a traceinsight report"
    JSON = "a traceinsight JSON result"
    MARKDOWN = "a traceinsight Markdown summary"
    TRACE = "a trace"


#: What every report page carries in its head (``templates/base.html``).
REPORT_MARKER: Final = b'<meta name="generator" content="traceinsight '
_JSON_TOOL: Final = re.compile(rb'"tool"\s*:\s*\{\s*"name"\s*:\s*"traceinsight"')
_TRACE_KEYS: Final = re.compile(rb'"(?:traceEvents|schemaVersion|deviceProperties|displayTimeUnit)"\s*:')
#: Bytes read from the start of an existing file to tell whether it is ours.
_HEAD_BYTES: Final = 64 << 10


def _html(head: bytes) -> bool:
    return REPORT_MARKER in head[:4096]


def _json(head: bytes) -> bool:
    return head.lstrip()[:1] == b"{" and _JSON_TOOL.search(head[:4096]) is not None


def _markdown(head: bytes) -> bool:
    return head.startswith(b"## traceinsight")


def _trace(head: bytes) -> bool:
    return head.lstrip()[:1] in (b"{", b"[") and _TRACE_KEYS.search(head) is not None


#: How each kind of output of ours starts: an existing file that passes may be replaced.
MARKERS: Final = {Kind.HTML: _html, Kind.JSON: _json, Kind.MARKDOWN: _markdown, Kind.TRACE: _trace}


class Output(Model, frozen=True):
    """One file a command will write."""

    option: str
    """The option that named it (``-o/--output``, ``--json``, ``--per-rank``…), for messages."""
    path: Path
    kind: Kind
    readable_after: bool = False
    """The command reads the file back (``run``'s trace): it must be a regular file."""


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same resolved path, or the same inode (hard links)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _head(path: Path) -> bytes | None:
    """The first bytes of the regular file ``path`` (gunzipped for gzip), None when unreadable."""
    try:
        with path.open("rb") as stream:
            head = stream.read(_HEAD_BYTES)
            if head[:2] == b"\x1f\x8b":
                stream.seek(0)
                with gzip.GzipFile(fileobj=stream) as unpacked:
                    head = unpacked.read(_HEAD_BYTES)
    except (OSError, EOFError, gzip.BadGzipFile):
        return None
    return head


def _is_ours(path: Path, kind: Kind, size: int) -> bool:
    if size == 0:
        return True
    head = _head(path)
    return head is not None and MARKERS[kind](head)


_SPECIAL: Final = ((stat.S_ISCHR, "a character device"), (stat.S_ISFIFO, "a named pipe (FIFO)"))
_REFUSED: Final = (
    (stat.S_ISDIR, "a folder; give a file name"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def _through(mode: int) -> bool:
    """Whether a file of ``mode`` is written through (a character device or a FIFO)."""
    return any(test(mode) for test, _ in _SPECIAL)


def _check_target(output: Output, force: bool) -> None:
    """What is at ``output.path`` now may be written (see the module doc)."""
    path = output.path
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise OutputError(
            f"cannot write {path} ({output.option}): the folder {folder} does not exist; "
            "create it or pick another path"
        )
    try:
        os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as exc:
        raise OutputError(f"cannot write {path} ({output.option}): {exc.strerror or exc}") from None
    try:
        info = os.stat(path)
    except OSError:
        if Path(os.path.realpath(path)).parent.is_dir():
            return  # a link to a file not made yet, in a folder that is there: the write makes it
        raise OutputError(
            f"will not write {path} ({output.option}): it is a symbolic link that leads nowhere; "
            "remove it or pick another path"
        ) from None
    for test, words in _REFUSED:
        if test(info.st_mode):
            raise OutputError(f"will not write {path} ({output.option}): it is {words}")
    if _through(info.st_mode):
        if output.readable_after:
            kind = next(words for test, words in _SPECIAL if test(info.st_mode))
            raise OutputError(
                f"will not write {path} ({output.option}): it is {kind}, and the file is read back "
                "for the report; give a file path"
            )
        return
    if not force and not _is_ours(path, output.kind, info.st_size):
        choose = "choose the report's path with -o" if output.kind is Kind.HTML else "choose another path"
        raise OutputError(
            f"will not replace {path} ({output.option}): it exists and is not {output.kind.value}; "
            f"{choose}, or pass --force to replace it"
        )


def check_outputs(
    outputs: Sequence[Output],
    *,
    inputs: Sequence[Path] = (),
    inputs_are: str = "the trace being analyzed",
    force: bool = False,
) -> None:
    """Refuse, before the work, outputs that would destroy a file that is not theirs to replace.

    No output may be one of ``inputs`` (``inputs_are`` says what they are, in messages) or another
    output; what is at each path must be writable under the rules of the module doc (``force``: an
    existing regular file that is not ours may be replaced).
    """
    for index, output in enumerate(outputs):
        for source in inputs:
            if _same_file(output.path, source):
                named = "" if len(inputs) == 1 else f" ({source.name})"
                raise OutputError(
                    f"cannot write {output.path} ({output.option}): it is {inputs_are}{named}; pick another path"
                )
        for other in outputs[:index]:
            if _same_file(output.path, other.path):
                raise OutputError(
                    f"cannot write {output.path}: {other.option} and {output.option} name the same file; "
                    "give them different paths"
                )
        _check_target(output, force)


def _umask_mode() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return 0o666 & ~umask


def _write_new(folder: Path, name: str, data: bytes) -> Path:
    """``data`` in a new hidden file in ``folder`` (mode as the umask says): its path."""
    handle, temporary = tempfile.mkstemp(prefix=f".{name}.", suffix=".partial", dir=folder)
    try:
        with os.fdopen(handle, "wb") as stream:
            stream.write(data)
        # mkstemp creates 0600; a report is made to be shared, so use the usual umask mode.
        os.chmod(temporary, _umask_mode())
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
    return Path(temporary)


def _write_through(path: Path, data: bytes) -> None:
    """Write ``data`` into the character device or FIFO at ``path`` (opened, never replaced)."""
    flags = os.O_WRONLY | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0)
    descriptor = os.open(path, flags)
    with os.fdopen(descriptor, "wb") as stream:
        if not _through(os.fstat(descriptor).st_mode):
            raise OutputError(f"cannot write {path}: the file changed while it was opened; try again")
        stream.write(data)


def _encoded(text: str | bytes) -> bytes:
    return text.encode("utf-8") if isinstance(text, str) else text


def write_output(output: Output, text: str | bytes, *, force: bool = False) -> None:
    """Write ``text`` to ``output`` under the module's rules: through a device or FIFO, over the
    file a symlink names (the link kept), atomically over a regular file or a new one."""
    _check_target(output, force)
    data = _encoded(text)
    path = output.path
    try:
        try:
            info: os.stat_result | None = os.stat(path)
        except FileNotFoundError:  # nothing there yet (or a link to a file not made yet)
            info = None
        if info is not None and _through(info.st_mode):
            _write_through(path, data)
            return
        target = Path(os.path.realpath(path)) if path.is_symlink() else path
        folder = target.parent if str(target.parent) else Path(".")
        os.replace(_write_new(folder, target.name, data), target)
    except OSError as exc:
        raise OutputError(
            f"cannot write {path} ({output.option}): {exc.strerror or exc}; check the folder's permissions"
        ) from exc


def stage(folder: Path, name: str, text: str | bytes) -> Path:
    """``text`` written to a hidden file in ``folder``, for :func:`publish` as ``folder/name`` later."""
    try:
        return _write_new(folder, name, _encoded(text))
    except OSError as exc:
        raise OutputError(
            f"cannot write {folder / name}: {exc.strerror or exc}; check the folder's permissions"
        ) from exc


def publish(staged: Path, output: Output, *, force: bool = False) -> None:
    """Move the :func:`stage`\\ d file into ``output``'s place (checked as :func:`write_output` checks)."""
    _check_target(output, force)
    path = output.path
    try:
        if not os.path.lexists(path) or stat.S_ISREG(os.lstat(path).st_mode):
            os.replace(staged, path)
            return
        data = staged.read_bytes()
    except OSError as exc:
        raise OutputError(f"cannot write {path} ({output.option}): {exc.strerror or exc}") from exc
    write_output(output, data, force=force)
    discard([staged])


def discard(staged: Sequence[Path]) -> None:
    """Remove staged files that will not be published."""
    for path in staged:
        with contextlib.suppress(OSError):
            os.unlink(path)
