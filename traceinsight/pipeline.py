"""The one path from a trace file to every output: load → analyze → rules → renderers.

Both commands (`analyze` and `run`) go through :func:`analyze_and_write`, so a report made right
after a capture is the same as one made later from the file alone.
"""

from __future__ import annotations

import importlib
import os
import sys
import tempfile
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Final

from rich.console import Console

from traceinsight.errors import OutputError
from traceinsight.load import SizeLimit, load_trace
from traceinsight.load.progress import ProgressCallback
from traceinsight.render.json_report import JsonRenderer
from traceinsight.render.terminal import print_summary
from traceinsight.report import Report, RunContext, report_for
from traceinsight.thresholds import Thresholds


def default_report_path(trace: Path) -> Path:
    """``<cwd>/<trace name without .json/.json.gz>.html``."""
    name = trace.name
    for suffix in (".gz", ".json"):
        name = name.removesuffix(suffix)
    return Path.cwd() / f"{name}.html"


def check_writable(path: Path) -> None:
    """Fail before the (possibly long) analysis when an output's folder does not exist."""
    directory = path.parent if str(path.parent) else Path(".")
    if not directory.is_dir():
        raise OutputError(
            f"cannot write {path}: the folder {directory} does not exist; create it or pick another path"
        )


#: What every report page carries in its head (``templates/base.html``): a file that has it may be
#: replaced by a new report at the default path.
REPORT_MARKER: Final = b'<meta name="generator" content="traceinsight '


def _same_file(a: Path, b: Path) -> bool:
    """Whether two paths name one file: the same resolved path, or the same inode (hard links)."""
    if a.resolve() == b.resolve():
        return True
    try:
        return os.path.samefile(a, b)
    except OSError:  # one of them does not exist (yet)
        return False


def _is_report(path: Path) -> bool:
    """Whether ``path`` is a traceinsight report (its head carries :data:`REPORT_MARKER`)."""
    try:
        with path.open("rb") as stream:
            return REPORT_MARKER in stream.read(4096)
    except OSError:
        return False


def check_outputs(
    trace: Path, outputs: list[tuple[str, Path]], *, default_report: Path | None = None, force: bool = False
) -> None:
    """Refuse, before the analysis, outputs that would destroy a file that is not ours to replace.

    ``outputs`` are (option, path) pairs. No output may be the trace itself or another output
    (compared after resolving links and by inode). ``default_report`` is the report path the user
    did not choose (``./<trace name>.html``): it may replace only an earlier traceinsight report,
    unless ``force``.
    """
    for index, (option, path) in enumerate(outputs):
        check_writable(path)
        if _same_file(path, trace):
            raise OutputError(
                f"cannot write {path} ({option}): it is the trace being analyzed; pick another path"
            )
        for other_option, other in outputs[:index]:
            if _same_file(path, other):
                raise OutputError(
                    f"cannot write {path}: {other_option} and {option} name the same file; give them different paths"
                )
    replacing = default_report is not None and not force and os.path.lexists(default_report)
    if (
        replacing
        and default_report is not None
        and (default_report.is_dir() or not _is_report(default_report))
    ):
        raise OutputError(
            f"will not replace {default_report}: it exists and is not a traceinsight report; "
            "choose the report's path with -o, or pass --force to replace it"
        )


def write_atomically(path: Path, text: str) -> None:
    """Write to a temporary file beside ``path`` and rename it: never a half-written output."""
    directory = path.parent if str(path.parent) else Path(".")
    check_writable(path)
    try:
        handle, temporary = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=directory)
        with os.fdopen(handle, "w", encoding="utf-8") as stream:
            stream.write(text)
        # mkstemp creates 0600; a report is made to be shared, so use the usual umask mode.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(temporary, 0o666 & ~umask)
        os.replace(temporary, path)
    except OSError as exc:
        raise OutputError(
            f"cannot write {path}: {exc.strerror or exc}; check the folder's permissions"
        ) from exc


@contextmanager
def _stage(description: str) -> Iterator[None]:
    """A spinner on stderr for a step that may take a while; nothing when stderr is not a terminal."""
    if not sys.stderr.isatty():
        yield
        return
    with Console(stderr=True).status(description, spinner="dots"):
        yield


def render_html(report: Report, source_root: Path | None) -> str:
    """The self-contained HTML page (code excerpts read only from ``source_root``; None: none)."""
    from traceinsight.render.html import HtmlRenderer

    return HtmlRenderer(source_root=source_root).render(report)


def _give_back_freed_memory() -> None:
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
    source_root: Path | None = None,
    run: RunContext | None = None,
    force: bool = False,
    limit: SizeLimit | None = None,
) -> Report:
    """Analyze ``trace``; print the terminal summary; write the HTML report (and JSON if asked).

    ``json_out`` is a path, or ``"-"`` for stdout (the summary then goes to stderr so stdout stays
    valid JSON). ``html`` None means the default name in the current folder. ``progress`` is told
    how the load advances; the slower steps after it show a spinner when stderr is a terminal.
    ``user_code`` names packages whose frames are the user's own code (``--user-code``).
    ``source_root`` is the folder the report's code excerpts may be read from (None: no excerpts,
    only paths and line numbers). ``run`` carries what ``traceinsight run`` knows of the script's
    run. Outputs are checked first (:func:`check_outputs`; ``force`` lets the default report path
    replace any file). ``limit`` bounds how much JSON the trace may expand to.
    """
    html_path = (html if html is not None else default_report_path(trace)) if write_html else None
    targets = [("-o/--output", html_path)] if html_path is not None else []
    if json_out is not None and json_out != "-":
        targets.append(("--json", Path(json_out)))
    check_outputs(trace, targets, default_report=html_path if html is None else None, force=force)
    if html_path is not None:
        # matplotlib and jinja2 take ~1 s to import; do it while the trace loads (the loader mostly
        # waits on its worker processes), not after.
        threading.Thread(
            target=importlib.import_module, args=("traceinsight.render.html",), daemon=True
        ).start()
    loaded = load_trace(trace, progress=progress, limit=limit)
    _give_back_freed_memory()
    with _stage(f"analyzing {trace.name}"):
        report = report_for(loaded, thresholds, user_code, run)
    del loaded
    outputs: list[tuple[str, Path]] = []
    if json_out == "-":
        sys.stdout.write(JsonRenderer().render(report))
        sys.stdout.flush()
        console = Console(stderr=True)
    elif json_out is not None:
        json_path = Path(json_out)
        write_atomically(json_path, JsonRenderer().render(report))
        outputs.append(("JSON", json_path))
    if html_path is not None:
        with _stage(f"writing {html_path.name}"):
            page = render_html(report, source_root)
        write_atomically(html_path, page)
        outputs.append(("report", html_path))
    print_summary(report, console or Console(), outputs)
    return report
