"""Hostile traces, run through the CLI (issue 16): a trace is untrusted input.

Each case of the corpus carries its expected outcome: refused with exit 2 and its words, or loaded
with its load notes (and then loaded exactly as the reference loader does). Every run checks that
no output (terminal, JSON, HTML) holds a control character or live markup. The bombs and the huge
name run in a subprocess whose maximum RSS is measured; special files too (a regression there
would hang). Separate tests plant secret files around a source root and check that no report
shows them, and that no output path can destroy the input or another output.

:func:`build_corpus` writes the corpus into a folder; ``benchmarks/fuzz_scanner.py`` runs the same
corpus, and the whole CLI on it, under AddressSanitizer and UndefinedBehaviorSanitizer.
"""

from __future__ import annotations

import gzip
import json
import os
import re
import socket
import stat
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from io import StringIO
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console
from tracebuild import annotation, assert_same_trace, frame, kernel, launch, runtime, write_trace
from typer.testing import CliRunner

from traceinsight.commands import app
from traceinsight.load import load_trace, load_trace_reference, native
from traceinsight.render.terminal import TerminalRenderer
from traceinsight.results import result_for

runner = CliRunner()

#: Names that try to drive a terminal, inject rich markup, HTML, or reorder text (bidi).
EVIL = (
    "\x1b]0;pwned\x07\x1b[2J\x1b[31m [/red] [link=https://evil.example/x]click[/link] [bold]b "
    "<img src=x onerror=alert(1)> \u202eevil\u2066 \x85\x9b\x7f tab\tnew\nline\r"
)
MARKUP = "[link=https://evil.example/x]"


def _gzip_member(data: bytes) -> bytes:
    return gzip.compress(data, compresslevel=9, mtime=0)


def _repeated_gzip(path: Path, head: bytes, filler: bytes, total: int, tail: bytes = b"") -> Path:
    """A small gzip file that expands to ``head``, ``total`` bytes of ``filler`` and ``tail``:
    one compressed 64 MiB member, repeated (gzip members concatenate)."""
    block = 64 << 20
    member = _gzip_member(filler * (block // len(filler)))
    count, rest = divmod(total, block)
    parts = [_gzip_member(head)] if head else []
    parts += [member] * count
    if rest:
        parts.append(_gzip_member(filler * (rest // len(filler))))
    if tail:
        parts.append(_gzip_member(tail))
    path.write_bytes(b"".join(parts))
    return path


def _text(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def _events(path: Path, events: str) -> Path:
    return _text(path, '{"traceEvents": [' + events + "]}")


def _kernel_text(**fields: Any) -> str:
    event = {"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": 10, "dur": 5}
    event.update(fields)
    return json.dumps(event)


def _evil_names(path: Path) -> Path:
    """Every string a report shows, hostile: kernel, op, annotation, frame, device, trace name."""
    events = [
        kernel(0, 10, name=EVIL),
        kernel(200, 10, name="ok " + EVIL[:40]),
        runtime("cudaStreamSynchronize", 50, 100),
        {**annotation("ProfilerStep#1", 0, 400), "name": "ProfilerStep#1"},
        {**annotation("x", 0, 400), "name": EVIL, "cat": "cpu_op"},
        frame(f"/srv/{EVIL}.py(4): f", 40, 200, python_id=1),
    ]
    return write_trace(
        path,
        events,
        deviceProperties=[{"id": 0, "name": EVIL}],
        traceName=EVIL,
        distributedInfo={"rank": 0, "world_size": 2, "backend": EVIL},
    )


def _window_boundary(path: Path) -> Path:
    """Two events without a comma between them, the first ending exactly where the scanner's
    first window (32 MiB of a mapped file) ends."""
    head = '{"traceEvents": ['
    window = native.BLOCK_BYTES * native.MAPPED_RUNS
    skeleton = '{"ph": "X", "cat": "cpu_op", "ts": 1, "dur": 1, "name": ""}'
    first = skeleton.replace('"name": ""', '"name": "' + "n" * (window - len(skeleton)) + '"')
    assert len(first) == window
    return _text(path, head + first + '{"ph": "X", "cat": "cpu_op", "ts": 2, "dur": 1, "name": "b"}]}')


def _empty_folder(path: Path) -> Path:
    """A folder given as the trace: a job (issue 12) with no rank traces in it."""
    path.mkdir()
    return path


def _fifo(path: Path) -> Path:
    os.mkfifo(path)
    return path


def _socket(path: Path) -> Path:
    server = socket.socket(socket.AF_UNIX)
    server.bind(str(path))  # the file stays after the socket is closed
    server.close()
    return path


@dataclass(frozen=True)
class Hostile:
    """One case: how to make it, and what must happen."""

    name: str
    build: Callable[[Path], Path]
    #: Refused with exit 2 and these words (None: loaded).
    refused: str | None = None
    #: Loaded with these load notes.
    notes: tuple[tuple[str, int], ...] = ()
    #: Run in a subprocess (bombs, special files); its maximum RSS must stay under this many MB.
    rss_mb: int | None = None
    #: Options given to analyze: ``--force`` where a case tests what stops a file past the gzip
    #: ratio rule (which would stop it first).
    options: tuple[str, ...] = ()


CORPUS: tuple[Hostile, ...] = (
    # --- malformed content: one line and exit 2, or read exactly as the reference reads it
    Hostile("float-ids-beyond-int64", lambda p: _events(p, _kernel_text(pid=2.0**63, tid=1e19, args={
        "External id": 9.3e18, "correlation": 1e300, "device": 2.0**64, "stream": -1e19, "bytes": 2.0**63}))),
    Hostile("lone-surrogates", lambda p: _events(p, '{"ph": "X", "cat": "kernel", "name": "k\\ud800", "ts": 10}, '
        '{"ph": "X", "cat": "cpu_\\udfffop", "name": "op", "ts": 20}, '
        '{"ph": "X", "cat": "cpu_op", "name": "op2", "ts": 30, "args": {"Call stack": "a.py(1): f\\udbff"}}')),
    Hostile("invalid-utf8", lambda p: _text(p, b'{"traceEvents": [{"ph": "X", "name": "a\xff\xfeb", "ts": 1}]}'),
        refused="invalid UTF-8"),
    Hostile("utf8-encoded-surrogate", lambda p: _text(p, b'{"traceEvents": [{"ph": "X", "name": "\xed\xa0\x80", "ts": 1}]}'),
        refused="invalid UTF-8"),
    Hostile("nested-100000-deep", lambda p: _events(p, _kernel_text(args={}).replace('"args": {}', '"args": {"x": '
        + "[" * 100_000 + "]" * 100_000 + "}")), refused="nested deeper than 512 levels"),
    Hostile("integer-of-5000-digits", lambda p: _events(p, _kernel_text(args={"Comms Id": 7}).replace("7}", "9" * 5000 + "}")),
        refused="4300 digits"),
    Hostile("two-trace-events-keys", lambda p: _text(p, '{"traceEvents": [' + _kernel_text() + '], "traceEvents": ['
        + _kernel_text(ts=99) + "]}")),
    Hostile("escaped-phase-and-keys", lambda p: _events(p, _kernel_text().replace('"ph": "X"', '"ph": "\\u0058"')
        .replace('"ts"', '"\\u0074s"'))),
    Hostile("missing-comma-at-a-32MiB-window", _window_boundary, refused="not valid JSON"),
    Hostile("missing-comma", lambda p: _events(p, _kernel_text() + " " + _kernel_text()), refused="not valid JSON"),
    Hostile("trailing-garbage", lambda p: _text(p, '{"traceEvents": []} {"x": 1}'), refused="not valid JSON"),
    Hostile("array-of-numbers", lambda p: _text(p, "[1, 2, 3]"), refused="not a torch.profiler trace"),
    Hostile("events-not-objects", lambda p: _text(p, '{"traceEvents": [1, "a", null]}'), refused="not a torch.profiler trace"),
    Hostile("top-level-string", lambda p: _text(p, '"traceEvents"'), refused="not a torch.profiler trace"),
    Hostile("png", lambda p: _text(p, b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR" + bytes(64)), refused="not a JSON text"),
    Hostile("nul-bytes", lambda p: _text(p, bytes(4096)), refused="not a JSON text"),
    Hostile("perfetto-protobuf", lambda p: _text(p, b"\x0a\x15\x40\x80\x90\x01\x50\x01\x5a\x0d\xba\x01\x0aaten::mm 0"
        + b"\x0a\x06\x40\x81\x90\x01\x50\x01"), refused="Perfetto protobuf trace (.pftrace)"),
    Hostile("empty", lambda p: _text(p, b" \n\t "), refused="empty"),
    Hostile("truncated-gzip", lambda p: _text(p, gzip.compress(b'{"traceEvents": []}' * 100)[:30]), refused="gzip stream ends early"),
    Hostile("truncated-json", lambda p: _text(p, '{"traceEvents": [' + _kernel_text()), refused="not valid JSON"),
    Hostile("impossible-times", lambda p: _events(p, ", ".join([_kernel_text(ts=10), _kernel_text(ts="late"),
        _kernel_text(ts=1e300), _kernel_text().replace('"ts": 10', '"ts": NaN'),
        _kernel_text().replace('"ts": 10', '"ts": -Infinity'), json.dumps({"ph": "X", "cat": "kernel", "name": "k"})])),
        notes=(("dropped-time", 5),)),
    Hostile("hostile-memory-records", lambda p: _events(p, ", ".join([_kernel_text(ts=10), *(json.dumps(e) for e in [
        {"ph": "i", "name": "[memory]", "ts": 11, "args": {"Bytes": 2**63 - 1, "Total Allocated": 10**20,
                                                           "Total Reserved": -5, "Device Type": 1, "Device Id": 0}},
        {"ph": "i", "name": "[memory]", "ts": 12, "args": {"Bytes": "x", "Total Allocated": 2**63 - 1,
                                                           "Total Reserved": 2**63 - 1, "Device Type": 1, "Device Id": "0x1f"}},
        {"ph": "i", "name": "[memory]", "ts": 13, "args": {"Bytes": -(2**63), "Device Type": 1, "Device Id": 0}},
        {"ph": "i", "name": "[memory]\x00", "ts": 14, "args": {"Bytes": 1}},
        {"ph": "i", "name": "[memory]", "ts": 1e300, "args": {"Bytes": 1}}])]))),
    Hostile("byte-order-mark", lambda p: _text(p, b"\xef\xbb\xbf" + json.dumps({"traceEvents": [json.loads(_kernel_text())]}).encode())),
    Hostile("non-object-elements", lambda p: _events(p, "1, " + _kernel_text() + ', [], "x", null')),
    Hostile("hostile-names", _evil_names),
    # --- bombs and special files: in a subprocess, memory measured, never waiting
    Hostile("gzip-bomb-of-nuls", lambda p: _repeated_gzip(p, b"", b"\x00", 2 << 30), refused="not a JSON text", rss_mb=600),
    Hostile("gzip-bomb-of-spaces", lambda p: _repeated_gzip(p, b"", b" ", 2 << 30), refused="compression bomb", rss_mb=600),
    Hostile("gzip-bomb-of-spaces-in-the-array", lambda p: _repeated_gzip(p, b'{"traceEvents": [', b" ", 2 << 30, b"]}"),
        refused="compression bomb", rss_mb=600),
    Hostile("gzip-900MB-of-spaces-after-the-array", lambda p: _repeated_gzip(p, b"[\n  " + _kernel_text().encode()
        + b",\n  " + _kernel_text(ts=20).encode() + b"\n]", b" ", 900 << 20), refused="of JSON after the events array",
        rss_mb=600, options=("--force",)),
    # a file cut short, or bad JSON far in: never read again whole to look for a name to repair
    Hostile("gzip-object-cut-short-after-900MB-of-spaces", lambda p: _repeated_gzip(p, b'{"traceEvents": [\n  '
        + _kernel_text().encode() + b",", b" ", 900 << 20), refused="ends inside the events array", rss_mb=600, options=("--force",)),
    Hostile("gzip-object-with-a-bad-byte-after-900MB-of-spaces", lambda p: _repeated_gzip(p, b'{"traceEvents": [\n  '
        + _kernel_text().encode() + b",", b" ", 900 << 20, b'\n    "name": x\n]}'), refused="not valid JSON", rss_mb=600, options=("--force",)),
    Hostile("gzip-quoted-name-then-a-line-of-900MB", lambda p: _repeated_gzip(p, b'{"traceEvents": [\n  {\n'
        b'    "ph": "X",\n    "cat": "python_function",\n    "name": "q.py(1):     """",\n    "pid": 1,\n'
        b'    "tid": 1,\n    "ts": 1,\n    "dur": 1\n  },', b" ", 900 << 20, b'\n  {"ph": "X", "cat": "python_function", '
        b'"name": "g", "pid": 1, "tid": 1, "ts": 5, "dur": 1}\n]}\n'), rss_mb=600, options=("--force",)),
    Hostile("name-of-500MB", lambda p: _repeated_gzip(p, b'{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "', b"a",
        500_000_000, b'", "pid": 0, "tid": 7, "ts": 1, "dur": 1, "args": {"device": 0, "stream": 7}}]}'), rss_mb=1000, options=("--force",)),
    Hostile("fifo", _fifo, refused="named pipe (FIFO), not a regular file", rss_mb=600),
    Hostile("socket", _socket, refused="a socket, not a regular file", rss_mb=600),
    Hostile("character-device", lambda p: Path("/dev/zero"), refused="a character device, not a regular file", rss_mb=600),
    Hostile("directory", _empty_folder, refused="no traces in", rss_mb=600),
)  # fmt: skip


def build_corpus(folder: Path, *, subprocess_cases: bool = True) -> list[tuple[Hostile, Path]]:
    """Write every case into ``folder`` (those run in a subprocess only if asked)."""
    folder.mkdir(parents=True, exist_ok=True)
    built = []
    for case in CORPUS:
        if case.rss_mb is not None and not subprocess_cases:
            continue
        suffix = ".json.gz" if case.name.startswith(("gzip-", "name-of", "truncated-gzip")) else ".json"
        built.append((case, case.build(folder / f"{case.name}{suffix}")))
    return built


# --- what no output may hold -------------------------------------------------------------------

#: Control characters (tab and newline are layout in the outputs, never in a value), DEL, C1,
#: bidi embeddings, overrides and isolates.
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")
_CONTROL_IN_VALUE = re.compile("[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")


def assert_printable(text: str, where: str) -> None:
    found = _CONTROL.search(text)
    assert found is None, f"{where} holds {found.group()!r} at {found.start()}"


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k), *_strings(v))]
    if isinstance(value, list):
        return [s for item in value for s in _strings(item)]
    return []


def assert_outputs_clean(
    stdout: str, json_path: Path, html_path: Path, markdown_path: Path | None = None
) -> None:
    """No control character in the terminal summary, in any JSON value, in the page or the Markdown;
    no live markup: rich markup is printed as written, HTML from the trace is escaped, and nothing
    in the Markdown becomes a link, an image or HTML."""
    assert_printable(stdout, "the terminal summary")
    for value in _strings(json.loads(json_path.read_text(encoding="utf-8"))):
        assert _CONTROL_IN_VALUE.search(value) is None, f"a JSON value holds a control character: {value!r}"
    page = html_path.read_text(encoding="utf-8")
    assert_printable(page, "the HTML report")
    assert "<img" not in page  # the trace's HTML is escaped (the page has no images of its own)
    if markdown_path is not None:
        from markdown_it import MarkdownIt

        summary = markdown_path.read_text(encoding="utf-8")
        assert_printable(summary, "the Markdown summary")
        kinds = {token.type for token in MarkdownIt("gfm-like").parse(summary)}
        for block in MarkdownIt("gfm-like").parse(summary):
            kinds |= {child.type for child in block.children or ()}
        assert not kinds & {"link_open", "image", "html_inline", "html_block"}, kinds


# --- the corpus through the CLI, in-process ------------------------------------------------------


@pytest.mark.parametrize("case", [c for c in CORPUS if c.rss_mb is None], ids=lambda c: c.name)
def test_hostile_trace_is_refused_in_one_line_or_loaded_as_the_reference(
    case: Hostile, tmp_path: Path
) -> None:
    (path,) = [built for c, built in build_corpus(tmp_path / "corpus", subprocess_cases=False) if c is case]
    out = tmp_path / "out"
    out.mkdir()
    result = runner.invoke(
        app,
        [
            "analyze",
            str(path),
            "--json",
            str(out / "r.json"),
            "-o",
            str(out / "r.html"),
            "--markdown",
            str(out / "r.md"),
            *case.options,
        ],
        catch_exceptions=False,
    )
    if case.refused is not None:
        assert result.exit_code == 2, result.output
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("traceinsight: error: "), result.stderr
        assert case.refused in lines[0]
        assert str(path) in lines[0]
        assert list(out.iterdir()) == []  # nothing written, nothing half-written
        return
    assert result.exit_code == 0, result.output
    assert_outputs_clean(result.stdout, out / "r.json", out / "r.html", out / "r.md")
    loaded = load_trace(path)
    assert loaded.meta.load_notes == case.notes
    assert_same_trace(loaded, load_trace_reference(path))


def test_hostile_names_show_as_written_and_never_drive_the_terminal(tmp_path: Path) -> None:
    path = _evil_names(tmp_path / "evil.json")
    result = result_for(load_trace(path))
    buffer = StringIO()
    TerminalRenderer().print(
        result, Console(file=buffer, width=200, force_terminal=True, color_system="truecolor")
    )
    shown = buffer.getvalue()
    assert "\x1b]" not in shown  # no OSC: no window title, no hyperlink
    assert "\x1b[2J" not in shown  # the trace's own clear-screen never reaches the terminal
    assert MARKUP in shown and "[/red]" in shown  # markup is shown, not interpreted
    plain = runner.invoke(app, ["analyze", str(path), "--no-html", "--json", str(tmp_path / "r.json")])
    assert plain.exit_code == 0
    assert MARKUP in plain.stdout


def test_names_are_cut_with_their_full_length_noted(tmp_path: Path) -> None:
    name = "void cutlass_kernel<" + "x" * 5000 + ">"
    path = write_trace(tmp_path / "long.json", [kernel(0, 10, name=name), kernel(50, 10, name=name + "y")])
    gpu = load_trace(path).gpu
    kept = 1024 - 32
    assert sorted(gpu.get_column("name").to_list()) == [
        f"{name[:kept]}…(+{len(name) - kept} chars)",
        f"{name[:kept]}…(+{len(name) + 1 - kept} chars)",
    ]


# --- bombs and special files, in a subprocess ----------------------------------------------------


#: Runs the command given, then reports the largest maximum RSS among its children (kB), as a
#: memory limit sees it; the command is killed past 120 s.
_MEASURE = (
    "import resource, subprocess, sys\n"
    "try:\n    code = subprocess.run(sys.argv[1:], timeout=120).returncode\n"
    "except subprocess.TimeoutExpired:\n    code = 124\n"
    "sys.stderr.write(f'\\nmaxrss-kB {resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss}\\n')\n"
    "sys.exit(code)\n"
)


def run_measured(arguments: list[str]) -> tuple[int, str, str, float]:
    """``python -m traceinsight ARGUMENTS`` in a subprocess: (exit code, stdout, stderr, max RSS MB)."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, sys.executable, "-m", "traceinsight", *arguments],
        capture_output=True,
        text=True,
        timeout=180,
    )
    stderr, _, figure = done.stderr.rstrip().rpartition("\nmaxrss-kB ")
    return done.returncode, done.stdout, stderr.strip(), int(figure) / 1024


@pytest.mark.parametrize("case", [c for c in CORPUS if c.rss_mb is not None], ids=lambda c: c.name)
def test_bombs_and_special_files_end_quickly_in_bounded_memory(case: Hostile, tmp_path: Path) -> None:
    path = case.build(
        tmp_path / (case.name + (".json.gz" if case.name.startswith(("gzip-", "name-of")) else ".json"))
    )
    out = tmp_path / "out"
    out.mkdir()
    code, stdout, stderr, rss_mb = run_measured(
        ["analyze", str(path), "--json", str(out / "r.json"), "-o", str(out / "r.html"), *case.options]
    )
    assert code != 124, f"{case.name}: analyze did not end within 120 s"
    assert rss_mb < (case.rss_mb or 0), f"{case.name}: maximum RSS {rss_mb:.0f} MB"
    if case.refused is not None:
        assert code == 2, stderr
        assert "\n" not in stderr and case.refused in stderr, stderr
        return
    assert code == 0, stderr
    assert_outputs_clean(stdout, out / "r.json", out / "r.html")
    page = (out / "r.html").read_text(encoding="utf-8")
    assert len(page) < 2_000_000  # the report is bounded by the analysis, not by a name
    if case.name == "name-of-500MB":
        assert "a…(+499999008 chars)" in page


# --- no report shows a file outside the source root -----------------------------------------------

SECRET = "AWS_SECRET_ACCESS_KEY = 'hunter2-do-not-leak'"


def _synced_steps(source: str, steps: int = 5) -> list[dict[str, Any]]:
    """Steps that each wait on the GPU in a Python frame of ``source`` line 12: a sync-in-loop
    finding whose source line is that frame's."""
    events: list[dict[str, Any]] = []
    for step in range(steps):
        t = step * 1000
        events.append(annotation(f"ProfilerStep#{step}", t, 900))
        events.append(frame(f"{source}(12): train_step", t + 10, 800, python_id=step * 10 + 1))
        events += launch(t + 20, t + 30, 100)
        events.append(runtime("cudaStreamSynchronize", t + 40, 300))
        events += launch(t + 400, t + 700, 100)
    return events


@pytest.fixture
def planted(tmp_path: Path) -> dict[str, Path]:
    """A project folder (the source root) with a legit script, and secrets planted around it."""
    root = tmp_path / "project"
    outside = tmp_path / "outside"
    (root / "sub").mkdir(parents=True)
    outside.mkdir()
    secret_lines = "".join(f"{SECRET}  # {n}\n" for n in range(1, 30))
    (outside / "secret_settings.py").write_text(secret_lines)
    (outside / "notes.txt").write_text(secret_lines)
    (root / "notes.txt").write_text(secret_lines)
    (root / "train.py").write_text("".join(f"legit_line_{n} = {n}\n" for n in range(1, 30)))
    (root / "linked_outside.py").symlink_to(outside / "secret_settings.py")
    (root / "notes.py").symlink_to(root / "notes.txt")  # a .py name for a file that is not Python
    (root / "outside_dir").symlink_to(outside)
    return {"root": root, "outside": outside}


@pytest.mark.parametrize(
    "source",
    [
        "{outside}/secret_settings.py",  # an absolute path outside the root
        "../outside/secret_settings.py",  # .. out of the root
        "sub/../../outside/secret_settings.py",
        "{root}/sub/../../outside/secret_settings.py",
        "linked_outside.py",  # a symlink inside the root to a file outside
        "outside_dir/secret_settings.py",  # through a symlinked folder
        "notes.py",  # a .py symlink to a file that is not .py
        "{outside}/notes.txt",
    ],
)
def test_no_report_shows_a_file_outside_the_source_root(
    source: str, planted: dict[str, Path], tmp_path: Path
) -> None:
    named = source.format(root=planted["root"], outside=planted["outside"])
    trace = write_trace(tmp_path / "t.json", _synced_steps(named))
    out = tmp_path / "r.html"
    result = runner.invoke(
        app,
        [
            "analyze",
            str(trace),
            "-o",
            str(out),
            "--json",
            str(tmp_path / "r.json"),
            "--source-root",
            str(planted["root"]),
        ],
    )
    assert result.exit_code == 0, result.output
    assert any(f["source"] for f in json.loads((tmp_path / "r.json").read_text())["findings"])
    for output in (out.read_text(), (tmp_path / "r.json").read_text(), result.stdout):
        assert "hunter2" not in output


@pytest.mark.parametrize("spelling", ["train.py", "{root}/train.py", "sub/../train.py"])
def test_excerpts_come_from_the_source_root_only_when_one_is_named(
    spelling: str, planted: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace = write_trace(tmp_path / "t.json", _synced_steps(spelling.format(root=planted["root"])))
    monkeypatch.chdir(planted["root"])  # the project folder itself: still no excerpt unless named
    out = tmp_path / "r.html"
    assert runner.invoke(app, ["analyze", str(trace), "-o", str(out)]).exit_code == 0
    page = out.read_text()
    assert "legit_line_12 = 12" not in page
    assert "--source-root DIR" in page  # the report says how to add them
    assert runner.invoke(app, ["analyze", str(trace), "-o", str(out), "--source-root", "."]).exit_code == 0
    assert "legit_line_12 = 12" in out.read_text()
    (planted["root"] / "pyproject.toml").write_text('[tool.traceinsight]\nsource-root = "."\n')
    assert runner.invoke(app, ["analyze", str(trace), "-o", str(out)]).exit_code == 0
    assert "legit_line_12 = 12" in out.read_text()


def test_a_missing_source_root_is_one_line(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", [kernel(0, 10)])
    result = runner.invoke(app, ["analyze", str(trace), "--no-html", "--source-root", str(tmp_path / "nope")])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "--source-root" in result.stderr


# --- never destroy the input or the user's files -----------------------------------------------------


def _trace(tmp_path: Path) -> tuple[Path, bytes]:
    path = write_trace(tmp_path / "t.json", [kernel(0, 10), kernel(200, 10)])
    return path, path.read_bytes()


@pytest.mark.parametrize(
    ("options", "words"),
    [
        (["-o", "{trace}"], "it is the trace being analyzed"),
        (["--json", "{trace}", "--no-html"], "it is the trace being analyzed"),
        (["-o", "{link}"], "it is the trace being analyzed"),  # a hard link to the trace
        (["-o", "{folder}/../{folder_name}/t.json"], "it is the trace being analyzed"),
        (["-o", "{folder}/same", "--json", "{folder}/same"], "name the same file"),
        (["-o", "{folder}/a.html", "--json", "{folder}/./a.html"], "name the same file"),
    ],
)
def test_outputs_that_would_destroy_a_file_are_refused_before_the_analysis(
    options: list[str], words: str, tmp_path: Path
) -> None:
    trace, content = _trace(tmp_path)
    os.link(trace, tmp_path / "link.json")
    values = {
        "trace": trace,
        "link": tmp_path / "link.json",
        "folder": tmp_path,
        "folder_name": tmp_path.name,
    }
    result = runner.invoke(app, ["analyze", str(trace), *(o.format(**values) for o in options)])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and words in result.stderr
    assert trace.read_bytes() == content
    assert not (tmp_path / "same").exists() and not (tmp_path / "a.html").exists()


def test_the_default_report_path_replaces_only_a_report(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    trace, _ = _trace(tmp_path)
    monkeypatch.chdir(tmp_path)
    default = tmp_path / "t.html"
    default.write_text("my own notes, not a report")
    refused = runner.invoke(app, ["analyze", str(trace)])
    assert (
        refused.exit_code == 2
        and "not a traceinsight report" in refused.stderr
        and "--force" in refused.stderr
    )
    assert default.read_text() == "my own notes, not a report"
    assert runner.invoke(app, ["analyze", str(trace), "--force"]).exit_code == 0
    report = default.read_text()
    assert '<meta name="generator" content="traceinsight ' in report
    default.write_text(report.replace("Scorecard", "an older report"))
    assert runner.invoke(app, ["analyze", str(trace)]).exit_code == 0  # a report is replaced
    assert default.read_text() == report


def test_an_unreadable_file_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Permissions cannot be taken from root (the tests may run as root): os.open refuses instead."""
    trace, _ = _trace(tmp_path)
    real_open = os.open

    def denied(path: Any, flags: int, *args: Any) -> int:
        if Path(path) == trace:
            raise PermissionError(13, "Permission denied", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr("traceinsight.load.source.os.open", denied)
    result = runner.invoke(app, ["analyze", str(trace), "--no-html"])
    assert result.exit_code == 2
    assert result.stderr.count("\n") == 1 and "permission denied" in result.stderr


def test_max_size_stops_a_trace_past_it(tmp_path: Path) -> None:
    trace, content = _trace(tmp_path)
    packed = tmp_path / "t.json.gz"
    packed.write_bytes(gzip.compress(content))
    for path in (trace, packed):
        result = runner.invoke(app, ["analyze", str(path), "--no-html", "--max-size", "100B"])
        assert result.exit_code == 2 and "--max-size" in result.stderr, result.output
        assert runner.invoke(app, ["analyze", str(path), "--no-html", "--max-size", "1MB"]).exit_code == 0
    bad = runner.invoke(app, ["analyze", str(trace), "--no-html", "--max-size", "lots"])
    assert bad.exit_code == 2 and "not a size" in bad.stderr


# --- issue 31: what surrounds a trace is untrusted too -------------------------------------------

PLANTED = "DB_PASSWORD = 'planted-do-not-leak'"


@pytest.fixture
def bug_report(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A bug report unpacked and analyzed where it lies: two rank traces whose frames name a file
    outside the folder holding a planted secret, and a pyproject.toml with ``source-root = "/"``."""
    secrets = tmp_path / "home" / "settings.py"
    secrets.parent.mkdir()
    secrets.write_text("".join(f"{PLANTED}  # {n}\nAPI_KEY = 'k-{n}'\n" for n in range(1, 30)))
    folder = tmp_path / "bug-report"
    folder.mkdir()
    for rank in (0, 1):
        write_trace(folder / f"rank-{rank}.json", _synced_steps(str(secrets)))
    (folder / "pyproject.toml").write_text('[tool.traceinsight]\nsource-root = "/"\n')
    monkeypatch.chdir(folder)
    return folder


def test_a_pyproject_beside_the_trace_cannot_widen_what_the_report_reads(bug_report: Path) -> None:
    result = runner.invoke(app, ["analyze", "rank-0.json", "-o", "page.html", "--json", "r.json"])
    assert result.exit_code == 2, result.output
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "source-root '/'" in lines[0] and "leads out of the folder" in lines[0]
    assert str(bug_report / "pyproject.toml") in lines[0]
    assert not (bug_report / "page.html").exists() and not (bug_report / "r.json").exists()
    assert "planted" not in result.output


def test_per_rank_pages_cannot_be_widened_by_a_pyproject(bug_report: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    result = runner.invoke(app, ["analyze", ".", "--no-html", "--per-rank", str(out)])
    assert result.exit_code == 2, result.output
    assert result.stderr.count("\n") == 1 and "leads out of the folder" in result.stderr
    assert list(out.iterdir()) == []


def test_the_terminal_says_which_source_root_is_in_force(bug_report: Path, tmp_path: Path) -> None:
    (bug_report / "pyproject.toml").write_text('[tool.traceinsight]\nsource-root = "."\n')
    from_file = runner.invoke(app, ["analyze", "rank-0.json", "-o", "page.html"])
    assert from_file.exit_code == 0, from_file.output
    said = "".join(from_file.stdout.split())  # lines folded at the terminal's width
    assert (
        "".join(f"code excerpts (source-root in {bug_report / 'pyproject.toml'}): {bug_report}".split())
        in said
    )
    assert "planted" not in (bug_report / "page.html").read_text()  # the secret is outside "."
    given = runner.invoke(app, ["analyze", "rank-0.json", "-o", "page.html", "--source-root", str(tmp_path)])
    assert given.exit_code == 0, given.output
    assert "".join(f"code excerpts (--source-root): {tmp_path}".split()) in "".join(given.stdout.split())
    assert "planted-do-not-leak" in (bug_report / "page.html").read_text()  # the user's own choice


# --- outputs: never an input, never a file not ours, never a device replaced -----------------------


def _fifo_reader(path: Path) -> tuple[Any, list[bytes]]:
    """A thread reading everything written into the FIFO at ``path``."""
    import threading

    got: list[bytes] = []

    def read() -> None:
        with open(path, "rb") as stream:
            got.append(stream.read())

    thread = threading.Thread(target=read, daemon=True)
    thread.start()
    return thread, got


@pytest.mark.parametrize("option", ["-o", "--json", "--markdown"])
def test_an_output_at_a_fifo_is_written_through_never_replaced(option: str, tmp_path: Path) -> None:
    trace, _ = _trace(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    thread, got = _fifo_reader(fifo)
    others = ["--no-html"] if option != "-o" else []
    result = runner.invoke(app, ["analyze", str(trace), option, str(fifo), *others])
    thread.join(timeout=30)
    assert result.exit_code == 0, result.output
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)  # still a FIFO, never renamed over
    written = got[0].decode()
    assert {"-o": "<!DOCTYPE html>", "--json": '"schema": 3', "--markdown": "## traceinsight"}[
        option
    ] in written


def test_an_output_at_a_character_device_is_written_through_never_replaced(tmp_path: Path) -> None:
    """A device node made in a temp folder (as root, which CI containers are: ``-o /dev/null``
    replaced the device with a 72 KB file). Where nodes cannot be made, /dev/null itself, which
    only root could replace."""
    trace, _ = _trace(tmp_path)
    device = tmp_path / "null"
    try:
        os.mknod(device, 0o666 | stat.S_IFCHR, os.makedev(1, 3))  # the null device
    except PermissionError:
        device = Path("/dev/null")
    before = os.stat(device)
    for option in (["-o", str(device)], ["--json", str(device), "--no-html"]):
        result = runner.invoke(app, ["analyze", str(trace), *option])
        assert result.exit_code == 0, result.output
        after = os.lstat(device)
        assert (
            stat.S_ISCHR(after.st_mode) and after.st_rdev == before.st_rdev and after.st_ino == before.st_ino
        )


def test_a_symlinked_output_keeps_its_link_and_replaces_what_it_names(tmp_path: Path) -> None:
    trace, _ = _trace(tmp_path)
    target = tmp_path / "real.json"
    link = tmp_path / "link.json"
    link.symlink_to(target)
    result = runner.invoke(app, ["analyze", str(trace), "--no-html", "--json", str(link)])
    assert result.exit_code == 0, result.output
    assert link.is_symlink() and json.loads(target.read_text())["schema"] == 3
    dangling = tmp_path / "dangling.json"
    dangling.symlink_to(tmp_path / "nowhere" / "x.json")
    refused = runner.invoke(app, ["analyze", str(trace), "--no-html", "--json", str(dangling)])
    assert refused.exit_code == 2 and "a symbolic link that leads nowhere" in refused.stderr
    link_to_trace = tmp_path / "sneaky.html"
    link_to_trace.symlink_to(trace)
    refused = runner.invoke(app, ["analyze", str(trace), "-o", str(link_to_trace)])
    assert refused.exit_code == 2 and "it is the trace being analyzed" in refused.stderr
    assert trace.read_text().startswith("{")


@pytest.mark.parametrize("option", ["-o", "--json", "--markdown"])
def test_an_output_never_replaces_a_file_that_is_not_ours_without_force(option: str, tmp_path: Path) -> None:
    trace, _ = _trace(tmp_path)
    notes = tmp_path / "notes.txt"
    notes.write_text("my own notes")
    others = ["--no-html"] if option != "-o" else []
    refused = runner.invoke(app, ["analyze", str(trace), option, str(notes), *others])
    assert (
        refused.exit_code == 2 and "is not a traceinsight" in refused.stderr and "--force" in refused.stderr
    )
    assert notes.read_text() == "my own notes"
    forced = runner.invoke(app, ["analyze", str(trace), option, str(notes), *others, "--force"])
    assert forced.exit_code == 0, forced.output
    assert notes.read_text() != "my own notes"
    again = runner.invoke(app, ["analyze", str(trace), option, str(notes), *others])  # now ours
    assert again.exit_code == 0, again.output


def test_a_block_device_or_folder_output_is_refused(tmp_path: Path) -> None:
    trace, _ = _trace(tmp_path)
    folder = tmp_path / "a-folder"
    folder.mkdir()
    result = runner.invoke(app, ["analyze", str(trace), "--no-html", "--json", str(folder)])
    assert result.exit_code == 2 and "it is a folder" in result.stderr


# --- a small gzip of a large amount of tiny events -------------------------------------------------


def test_a_small_gzip_of_tiny_events_is_refused_early_in_bounded_memory(tmp_path: Path) -> None:
    """300 MB of tiny events in a 1 MB gzip (the audit's was 1022 MiB in 3.7 MB, run to the end
    at 6.0 GB): refused by the expansion ratio long before its end; ``--force`` reads it."""
    event = b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},'
    path = _repeated_gzip(tmp_path / "tiny.json.gz", b'{"traceEvents": [', event, 300 << 20, b"{}]}")
    assert path.stat().st_size < 2 << 20
    code, _, stderr, rss_mb = run_measured(
        ["analyze", str(path), "--no-html", "--json", str(tmp_path / "r.json")]
    )
    assert code == 2 and "\n" not in stderr, stderr
    assert "expands more than 100 times" in stderr and "--force" in stderr
    assert rss_mb < 400, rss_mb
    assert not (tmp_path / "r.json").exists()


@pytest.mark.parametrize("name", sorted(p.name for p in Path(__file__).resolve().parent.parent.joinpath(
    "sample_traces").rglob("*.json.gz")))  # fmt: skip
def test_every_real_gzip_sample_stays_under_the_ratio_rule(name: str) -> None:
    """The rule never stops a real trace: each sample streams under it, and its expansion, measured
    as the loader counts it (text out over compressed bytes read so far), stays below half the limit."""
    import zlib

    from traceinsight.load.limits import GZIP_RATIO

    path = next(Path(__file__).resolve().parent.parent.joinpath("sample_traces").rglob(name))
    data = path.read_bytes()
    inflater, consumed, produced, highest = zlib.decompressobj(31), 0, 0, 0.0
    for at in range(0, len(data), 256 << 10):
        pending = data[at : at + (256 << 10)]
        consumed += len(pending)
        while pending and not inflater.eof:
            produced += len(inflater.decompress(pending, 1 << 20))
            highest = max(highest, produced / consumed)
            pending = inflater.unconsumed_tail
    assert highest < GZIP_RATIO / 2, highest
    assert load_trace(path).meta.event_count > 0


# --- names are text: an escape-laden file name on a terminal ---------------------------------------

ESCAPES = "\x1b]0;pwned\x07\x1b[2J[bold red]x [link=https:evil.example]y"


def test_an_escape_laden_file_name_never_drives_the_terminal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The 'reading NAME' progress bar and the 'analyzing NAME' spinner print the name as text:
    no OSC (window title, hyperlink), no clear-screen, no rich markup taken."""
    import io

    import rich.console

    from traceinsight.commands.common import analyze_and_write
    from traceinsight.commands.options import Reading, Wanted
    from traceinsight.load import progress as progress_module

    name = f"t{ESCAPES}.json"
    trace = write_trace(tmp_path / name, [kernel(i * 100, 10) for i in range(50)])
    screen = io.StringIO()
    real_console = rich.console.Console

    def terminal(*args: Any, **kwargs: Any) -> rich.console.Console:
        kwargs.update(file=screen, force_terminal=True, color_system="truecolor", width=200)
        kwargs.pop("stderr", None)
        return real_console(*args, **kwargs)

    monkeypatch.setattr(rich.console, "Console", terminal)
    monkeypatch.setattr("traceinsight.commands.common.Console", terminal)
    monkeypatch.setattr(progress_module, "SHOW_AFTER_S", 0.0)
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    with progress_module.terminal_progress(f"reading {trace.name}") as update:
        assert update is not None
        analyze_and_write(
            trace,
            Wanted(write_html=False),
            Reading(),
            progress=update,
            console=real_console(file=io.StringIO()),
        )
    shown = screen.getvalue()
    assert "reading t" in shown and "analyzing t" in shown
    assert "\x1b]" not in shown and "\x1b[2J" not in shown and "\x07" not in shown
    assert "[bold red]x" in shown and "[link=https:evil.example]" in shown  # shown, not taken


def test_a_pyproject_above_the_working_folder_opens_no_file(
    planted: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ``pyproject.toml`` with ``source-root = "."`` in a folder above the working folder (a
    shared ``/tmp``, a planted parent) let a stranger's trace quote ``.py`` files below it: the page
    embedded the planted secret lines. Only the working folder's own project file, the trace's
    folder's, or ``--source-root`` opens files."""
    up = planted["outside"]
    (up / "pyproject.toml").write_text('[tool.traceinsight]\nsource-root = "."\n')
    work = up / "work"
    work.mkdir()
    monkeypatch.chdir(work)
    elsewhere = tmp_path / "traces"
    elsewhere.mkdir()
    named = str(up / "secret_settings.py")
    trace = write_trace(elsewhere / "t.json", _synced_steps(named))
    out = tmp_path / "r.html"
    assert runner.invoke(app, ["analyze", str(trace), "-o", str(out)]).exit_code == 0
    assert "hunter2" not in out.read_text()
    beside = write_trace(up / "t.json", _synced_steps(named))  # the trace's own folder: its project
    assert runner.invoke(app, ["analyze", str(beside), "-o", str(out)]).exit_code == 0
    assert "hunter2" in out.read_text()
