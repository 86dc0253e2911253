"""A plain trace cut short or written again by another process while it is read.

The loader maps a plain trace; a page read after the file was truncated past it used to end the
process with SIGBUS (exit -7, not a word). The scanner's guard (``_scan.guard``) reads such pages
as zeros, and the load says in one line that the file changed. Each case runs in a child process,
so that a guard that fails ends the child, not the test run.
"""

from __future__ import annotations

import mmap
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from tracebuild import kernel, write_trace

from traceinsight.load.scanner import C_SCANNER

pytestmark = pytest.mark.skipif(
    C_SCANNER is None or not hasattr(signal, "SIGBUS"), reason="needs the C scanner and POSIX signals"
)

CHANGED = "the file changed while it was read"


def _child(code: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONFAULTHANDLER": ""},
    )


def _many_runs(tmp_path: Path, events: int = 20_000) -> Path:
    """A plain trace of ~2 MB: many runs once runs are 64 KiB (each event on its own line)."""
    path = tmp_path / "trace.json"
    write_trace(path, [kernel(10 * i, 5, name=f"k{i % 50}") for i in range(events)])
    text = path.read_text().replace("}, {", "},\n  {").replace('"traceEvents": [{', '"traceEvents": [\n  {')
    path.write_text(text)
    return path


def test_guarded_pages_past_a_new_end_read_as_zeros_and_are_counted(tmp_path: Path) -> None:
    """A 4-page file mapped and guarded, cut to 1.5 pages: the rest of page 2 reads zeros (the
    kernel's, no fault), pages 3 and 4 fault once each and read zeros; the bytes before the cut
    are the file's."""
    page = mmap.PAGESIZE
    path = tmp_path / "data"
    path.write_bytes(b"a" * (4 * page))
    result = _child(
        """
        import mmap, os, sys
        from traceinsight.load.scanner import C_SCANNER, cut_short, guard, close_quietly
        path, page = sys.argv[1], mmap.PAGESIZE
        with open(path, "rb") as f:
            m = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        guard(m)
        print(cut_short(m))
        os.truncate(path, page + page // 2)
        print(m[0], m[page + page // 2 - 1], m[page + page // 2], m[2 * page], m[3 * page + 5], m[4 * page - 1])
        print(C_SCANNER.faults(m), cut_short(m))
        slot = C_SCANNER.slot(m)
        close_quietly(m)
        print(slot >= 0, C_SCANNER.slot(memoryview(b"x")))
        """,
        str(path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[:4] == ["False", f"{ord('a')} {ord('a')} 0 0 0 0", "2 True", "True -1"]


def test_a_fault_outside_a_guarded_mapping_still_ends_the_process(tmp_path: Path) -> None:
    """The handler only answers for guarded pages: an unguarded mapping cut short ends the process
    with SIGBUS as before (here with another mapping guarded, so the handler is set)."""
    page = mmap.PAGESIZE
    for name in ("guarded", "plain"):
        (tmp_path / name).write_bytes(b"b" * (3 * page))
    result = _child(
        """
        import mmap, os, sys
        from traceinsight.load.scanner import guard
        maps = {}
        for name in ("guarded", "plain"):
            with open(os.path.join(sys.argv[1], name), "rb") as f:
                maps[name] = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        guard(maps["guarded"])
        for name in maps:
            os.truncate(os.path.join(sys.argv[1], name), 10)
        print(maps["guarded"][2 * mmap.PAGESIZE], flush=True)
        print(maps["plain"][2 * mmap.PAGESIZE], flush=True)
        """,
        str(tmp_path),
    )
    assert result.returncode == -signal.SIGBUS
    assert result.stdout == "0\n"


LOAD_WHILE_CUT = """
    import mmap, os, sys
    from traceinsight.errors import TraceFormatError
    from traceinsight.load import native
    from traceinsight.load.loader import load_trace
    from pathlib import Path
    path, how = Path(sys.argv[1]), sys.argv[2]
    native.BLOCK_BYTES = 1 << 16
    drop, calls = native._drop_pages, []

    def drop_then_change(mapped, begin, end):
        calls.append(end)
        if len(calls) == 1:  # after the first run was scanned
            if how == "cut":
                os.truncate(path, end - end % mmap.PAGESIZE + mmap.PAGESIZE)  # whole pages past it
            else:  # written again in place: same size, new bytes and time
                with open(path, "r+b") as f:
                    f.seek(end + 10)
                    f.write(b"x")
                os.utime(path, ns=(1, 1))
        drop(mapped, begin, end)

    native._drop_pages = drop_then_change
    try:
        load_trace(path)
    except TraceFormatError as error:
        print("error:", error)
    else:
        print("loaded")
    print("runs:", len(calls))
    """


@pytest.mark.parametrize("how", ["cut", "rewritten"])
def test_a_trace_changed_while_it_is_read_is_one_line(how: str, tmp_path: Path) -> None:
    """After the first of many runs, the file is cut short (the next runs' pages are past its new
    end: the load stops there) or one byte is written again with a new time (seen once every run
    is read): the load ends with the one line."""
    path = _many_runs(tmp_path)
    size = path.stat().st_size
    result = _child(LOAD_WHILE_CUT, str(path), how)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert (
        lines[0]
        == f"error: cannot read trace {path}: {CHANGED} (another process cut it short or wrote it again); read it again once it is written"
    )
    runs = int(lines[1].removeprefix("runs: "))
    if how == "cut":  # stopped at the first run past the cut, not at the end
        assert 1 <= runs < size // (2 << 16)


def test_a_trace_left_alone_loads_as_before(tmp_path: Path) -> None:
    """The same load with nothing changed: no error, every run read."""
    path = _many_runs(tmp_path)
    result = _child(LOAD_WHILE_CUT.replace("if len(calls) == 1:", "if False:"), str(path), "cut")
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[0] == "loaded"


def test_analyze_of_a_trace_cut_short_by_another_process(tmp_path: Path) -> None:
    """The command: the trace is cut short once its load has scanned a run (one line, status 2;
    it used to be a SIGBUS, status -7)."""
    path = _many_runs(tmp_path)
    result = _child(
        """
        import mmap, os, sys
        from traceinsight.load import native
        path = sys.argv[1]
        native.BLOCK_BYTES = 1 << 16
        drop, calls = native._drop_pages, []
        def drop_then_cut(mapped, begin, end):
            calls.append(end)
            if len(calls) == 1:
                os.truncate(path, end - end % mmap.PAGESIZE + mmap.PAGESIZE)  # whole pages past it
            drop(mapped, begin, end)
        native._drop_pages = drop_then_cut
        from traceinsight.commands import main
        sys.argv = ["traceinsight", "analyze", path, "--no-html"]
        main()
        """,
        str(path),
    )
    assert result.returncode == 2, result.stderr
    assert result.stderr.count("\n") == 1 and CHANGED in result.stderr and "Traceback" not in result.stderr


def test_a_head_start_scanning_a_trace_cut_short_reads_zeros(tmp_path: Path) -> None:
    """The head start maps the trace before the loader (while the libraries load): its scans of
    pages past a new end read zeros (an error in their results), not a SIGBUS."""
    path = _many_runs(tmp_path)
    result = _child(
        """
        import mmap, os, sys, threading
        from traceinsight.load import head_start
        from traceinsight.load.scanner import C_SCANNER, cut_short
        path, go = sys.argv[1], threading.Event()

        class Held:  # the scans wait until the file is cut
            events_start = staticmethod(C_SCANNER.events_start)
            Invalid = C_SCANNER.Invalid
            @staticmethod
            def scan(*args):
                go.wait()
                return C_SCANNER.scan(*args)

        head_start.C_SCANNER = Held
        head_start.MIN_BYTES, head_start.BLOCK_BYTES = 0, 1 << 15
        head = head_start.begin(path)
        runs = list(head._runs)
        os.truncate(path, 4 * mmap.PAGESIZE)  # the first run's 64 KiB, all but 4 pages, gone
        go.set()
        outcomes = []
        for run in runs:
            try:
                run.future.result()
                outcomes.append("read")
            except C_SCANNER.Invalid as error:
                outcomes.append(error.args[0])
        print(len(runs), outcomes[0], cut_short(head._mapped))
        head.close()
        """,
        str(path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["3", "json", "True"]


def test_failed_loads_leave_no_guard_behind(tmp_path: Path) -> None:
    """Loads that fail keep their mapping alive in the error's traceback for a while; 80 of them
    (more than the 64 ranges guarded at once), on files of different sizes, then a trace cut short
    while it is read: still the one line, not a SIGBUS; and the same file written whole again
    loads (a notebook's retry)."""
    path = _many_runs(tmp_path)
    whole = path.read_bytes()
    result = _child(
        """
        import mmap, os, sys
        from pathlib import Path
        from traceinsight.errors import TraceFormatError
        from traceinsight.load import native
        from traceinsight.load.loader import load_trace
        path, folder = Path(sys.argv[1]), Path(sys.argv[2])
        failed = 0
        for n in range(80):
            bad = folder / f"bad{n}.json"
            bad.write_bytes(b'{"traceEvents": [' + b" " * (4096 * (n + 1)) + b"{oops")
            try:
                load_trace(bad)
            except TraceFormatError:
                failed += 1
        native.BLOCK_BYTES = 1 << 16
        drop, calls = native._drop_pages, []
        def drop_then_cut(mapped, begin, end):
            calls.append(end)
            if len(calls) == 1:
                os.truncate(path, end - end % mmap.PAGESIZE + mmap.PAGESIZE)
            drop(mapped, begin, end)
        native._drop_pages = drop_then_cut
        whole = path.read_bytes()
        try:
            load_trace(path)
        except TraceFormatError as error:
            print(failed, "changed" if "changed while it was read" in str(error) else str(error))
        native._drop_pages = drop
        path.write_bytes(whole)
        print(load_trace(path).gpu.height)
        """,
        str(path),
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "80 changed"
    assert int(lines[1]) == whole.count(b'"cat": "kernel"')


@pytest.mark.parametrize("order", ["enabled after", "disabled after"])
def test_the_guard_holds_whatever_faulthandler_did_in_between(order: str, tmp_path: Path) -> None:
    """faulthandler enabled after a first guard (its handler on top of ours), or enabled before
    and disabled after (the default handler put back): the next guard puts ours back on top."""
    page = mmap.PAGESIZE
    for name in ("first", "second"):
        (tmp_path / name).write_bytes(b"c" * (3 * page))
    result = _child(
        """
        import faulthandler, mmap, os, sys
        from traceinsight.load.scanner import guard
        order, folder = sys.argv[1], sys.argv[2]
        def mapped(name):
            with open(os.path.join(folder, name), "rb") as f:
                return mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        if order == "disabled after":
            faulthandler.enable()
        first = mapped("first")
        guard(first)
        if order == "enabled after":
            faulthandler.enable()
        else:
            faulthandler.disable()
        second = mapped("second")
        guard(second)
        os.truncate(os.path.join(folder, "second"), 10)
        print(second[2 * mmap.PAGESIZE], flush=True)
        """,
        order,
        str(tmp_path),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == "0\n"
