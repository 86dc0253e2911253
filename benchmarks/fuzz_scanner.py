"""Fuzz the C scanner under AddressSanitizer and UndefinedBehaviorSanitizer, for a bounded time.

Builds ``traceinsight/load/_scan.c`` (and the analyses' C walks) with
``-fsanitize=address,undefined`` (every report fatal) into a scratch copy of the package, then runs
this script again in a child process with the sanitizer runtime preloaded, which:

1. mutates seeds (every sample trace, cut to its first events and written in two layouts, and the
   small cases of the hostile corpus of ``tests/test_hostile.py``): bit flips, interesting bytes,
   cuts at structural boundaries, spliced and deleted ranges, deep nesting, huge strings and
   numbers, invalid UTF-8, NUL bytes, escapes, missing and doubled commas, repeated keys; each
   input is written plain or gzipped and loaded with small random scan windows and one or two
   scanning threads, so events straddle every kind of run boundary;
2. loads each input with the native loader and the reference loader: when the native one loads,
   the tables must equal the reference's exactly; when it refuses, the refusal must be a one-line
   ``TraceInsightError`` (never another exception); the report (analysis, rules, JSON and the
   terminal summary) is made from every input that loads, and must not fail;
3. calls the scanner directly on random buffers, offsets, states and depths;
4. runs the whole hostile corpus (bombs and special files included) through the CLI,
   ``python -m traceinsight analyze … --json … -o …``, each case with its expected outcome;
5. feeds stored results to ``diff`` (a stored result is input like a trace): results of sample
   traces, mutated as bytes and as values (wrong types, huge and non-finite numbers, deep nesting,
   Markdown, rich markup and terminal escapes in every string), each read by the stored-result
   reader and, when it is accepted, compared both ways and rendered to the diff's JSON (strict),
   Markdown, terminal and gate lines, and drawn as its own report (its summary, Markdown and page,
   what ``analyze RESULT.json`` writes); a refusal must be one ``TraceInsightError`` line, and no
   output may hold a control character, live markup, or a Markdown link, image or HTML. A few
   mutants, and a FIFO, go through the whole CLI (``python -m traceinsight diff``): exit 0 or 2,
   one line.

Any sanitizer report ends the child with a non-zero status; any mismatch or wrong outcome is
printed and saved under ``--artifacts``. The exit status is 0 only when nothing was found.

Run::

    python benchmarks/fuzz_scanner.py --seconds 120          # what CI runs
    python benchmarks/fuzz_scanner.py --seconds 3600 --seed 7
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import sysconfig
import tempfile
import time
import traceback
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Final

ROOT = Path(__file__).resolve().parent.parent
SANITIZE = [
    "-fsanitize=address,undefined",
    "-fno-sanitize-recover=all",
    "-fno-omit-frame-pointer",
    "-g",
    "-O1",
]
#: How long one corpus case may take through the CLI (sanitized: the slowest takes about 10 s).
#: Most blocks one input is read in by the mutation loop (see ``Fuzzer.check``).
MAX_BLOCKS = 2_000
CLI_SECONDS = 300
#: The command as ``python -m traceinsight`` runs it, with every thread's stack printed on SIGUSR1,
#: so that a case that hangs says where.
CLI_WITH_STACKS = (
    "import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, all_threads=True); "
    "sys.argv[0] = 'traceinsight'; from traceinsight.__main__ import main; main()"
)
SANITIZER_ENV = {
    "ASAN_OPTIONS": "detect_leaks=0:halt_on_error=1:abort_on_error=0:exitcode=86:detect_odr_violation=0",
    "UBSAN_OPTIONS": "halt_on_error=1:print_stacktrace=1:exitcode=87",
}


# --- the parent: build, then run the child under the sanitizers ---------------------------------


def build_sanitized(scratch: Path) -> Path:
    """A copy of the package (and its templates) whose C modules (the scanner, the nesting and
    replay walks the reports use, and the arrays' hand-over to polars) are built with the
    sanitizers; the scanner's path."""
    shutil.copytree(
        ROOT / "traceinsight", scratch / "traceinsight", ignore=shutil.ignore_patterns("*.so", "__pycache__")
    )
    shutil.copytree(ROOT / "templates", scratch / "templates")
    compiler = os.environ.get("CC", "gcc")
    include = sysconfig.get_paths()["include"]
    command = [compiler, *SANITIZE, "-std=c11", "-Wall", "-shared", "-fPIC", f"-I{include}"]
    built = []
    for module in ("load/_scan", "analysis/_nesting", "analysis/_replay", "_arrays"):
        target = scratch / "traceinsight" / f"{module}{sysconfig.get_config_var('EXT_SUFFIX')}"
        subprocess.run([*command, str(ROOT / "traceinsight" / f"{module}.c"), "-o", str(target)], check=True)
        built.append(target)
    return built[0]


def runtime_libraries(compiler: str) -> str:
    """What to preload: the AddressSanitizer runtime (Python itself is not built with it), and
    libstdc++, without which its ``__cxa_throw`` interceptor aborts on the first C++ exception of
    an uninstrumented library."""
    paths = []
    for name in ("libasan.so", "libstdc++.so"):
        found = subprocess.run(
            [compiler, f"-print-file-name={name}"], capture_output=True, text=True
        ).stdout.strip()
        if not found or not Path(found).exists():
            raise SystemExit(f"fuzz: {compiler} has no {name}; install gcc's sanitizer runtime (libasan)")
        paths.append(str(Path(found).resolve()))
    return " ".join(paths)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--seconds", type=float, default=120.0, help="time for the mutation loop")
    parser.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock)")
    parser.add_argument("--artifacts", type=Path, default=ROOT / "benchmarks" / "data" / "fuzz")
    parser.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    options = parser.parse_args()
    seed = options.seed if options.seed is not None else int(time.time())
    if options.child is not None:
        return child(options.child, options.seconds, seed, options.artifacts)
    with tempfile.TemporaryDirectory(prefix="traceinsight-fuzz-") as scratch:
        target = build_sanitized(Path(scratch))
        env = {
            **os.environ,
            **SANITIZER_ENV,
            "LD_PRELOAD": runtime_libraries(os.environ.get("CC", "gcc")),
            "PYTHONPATH": scratch,
            "TRACEINSIGHT_FUZZ_SCANNER": str(target),
        }
        print(
            f"fuzz: C modules built with {' '.join(SANITIZE)}; seed {seed}; {options.seconds:g} s", flush=True
        )
        command = [
            sys.executable,
            __file__,
            "--child",
            scratch,
            "--seconds",
            str(options.seconds),
            "--seed",
            str(seed),
        ]
        done = subprocess.run([*command, "--artifacts", str(options.artifacts)], env=env, cwd=scratch)
    if done.returncode in (86, 87) or done.returncode < 0:
        print(
            f"fuzz: FAILED: a sanitizer report or a crash (exit {done.returncode}); seed {seed}", flush=True
        )
    return done.returncode


# --- the child: everything runs with the sanitized scanner ----------------------------------------


def child(scratch: Path, seconds: float, seed: int, artifacts: Path) -> int:
    import ctypes

    from traceinsight.load import native

    expected = os.environ.get("TRACEINSIGHT_FUZZ_SCANNER", "")
    assert native._scan is not None and native._scan.__file__ == expected, (
        "the sanitized scanner is not the one loaded"
    )
    scanner = ctypes.CDLL(native._scan.__file__)  # its symbols and those of the libraries it needs
    for symbol in ("__asan_report_load1", "__ubsan_handle_add_overflow"):
        assert hasattr(scanner, symbol), f"{symbol} missing: the scanner is not built with the sanitizers"
    from traceinsight.analysis import host

    assert (
        host._nesting is not None
        and "_nesting" in host._nesting.__file__
        and str(scratch) in host._nesting.__file__
    ), "the sanitized nesting walk is not the one loaded"
    from traceinsight.analysis import replay

    assert replay._replay is not None and str(scratch) in replay._replay.__file__, (
        "the sanitized replay walk is not the one loaded"
    )
    native._scan = ExactBuffers(native._scan)
    sys.path.insert(0, str(ROOT / "tests"))
    fuzz = Fuzzer(random.Random(seed), scratch / "work", artifacts)
    for phase, run in (
        ("mutation loop", lambda: fuzz.mutation_loop(seconds)),
        ("direct scanner calls", lambda: fuzz.direct_scans(seconds / 6)),
        ("hostile corpus through the CLI", fuzz.hostile_corpus),
        ("stored results through diff", lambda: fuzz.stored_results(seconds / 4)),
    ):
        started = time.monotonic()
        run()
        fuzz.counts[f"seconds: {phase}"] = round(time.monotonic() - started)
    print(fuzz.summary(seed), flush=True)
    return 1 if fuzz.findings else 0


def exact(buffer: Any) -> memoryview:
    """A copy of ``buffer`` in an allocation of exactly its size: Python's bytes and bytearrays
    (and the pages of a mapping) have bytes to spare after their end, where AddressSanitizer
    cannot see a read one byte too far."""
    import numpy as np

    source = np.frombuffer(buffer, dtype=np.uint8)
    array = np.empty(len(source), dtype=np.uint8)
    array[:] = source
    return memoryview(array)


class ExactBuffers:
    """The scanner module, with every buffer it is given copied by :func:`exact` first."""

    def __init__(self, scan: Any) -> None:
        self._scan = scan
        self.Invalid = scan.Invalid
        self.configure = scan.configure
        self.__file__ = scan.__file__

    def scan(self, buffer: Any, *rest: Any) -> Any:
        return self._scan.scan(exact(buffer), *rest)

    def events_start(self, buffer: Any) -> Any:
        return self._scan.events_start(exact(buffer))


class Fuzzer:
    """The mutation loop, the direct scanner calls and the corpus run, with their counts."""

    def __init__(self, rng: random.Random, work: Path, artifacts: Path) -> None:
        self.rng = rng
        self.work = work
        self.work.mkdir(parents=True, exist_ok=True)
        self.artifacts = artifacts
        self.counts: Counter[str] = Counter()
        self.findings: list[str] = []
        self.seeds = self._seeds()

    # seeds ----------------------------------------------------------------------------------

    def _seeds(self) -> list[bytes]:
        from test_hostile import build_corpus

        seeds: list[bytes] = []
        for path in sorted((ROOT / "sample_traces").rglob("*.json*")):
            raw = path.read_bytes()
            value = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
            events = value if isinstance(value, list) else value.get("traceEvents", [])
            head = events[:120]
            head += [e for e in events[120:] if isinstance(e, dict) and e.get("name") == "[memory]"][:20]
            if isinstance(value, list):
                seeds.append(json.dumps(head).encode())
                continue
            document = {**value, "traceEvents": head}
            seeds.append(json.dumps(document).encode())  # compact
            body = ",\n  ".join(json.dumps(event) for event in head)  # Kineto's layout
            rest = json.dumps({k: v for k, v in value.items() if k != "traceEvents"})[1:-1]
            seeds.append(
                ("{\n" + (rest + ",\n" if rest else "") + '"traceEvents": [\n  ' + body + "\n]\n}").encode()
            )
        for _, path in build_corpus(self.work / "corpus-seeds", subprocess_cases=False):
            if path.stat().st_size < 1 << 20:
                raw = path.read_bytes()
                seeds.append(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" and _gunzips(raw) else raw)
        return seeds

    # mutations ------------------------------------------------------------------------------

    def mutate(self, data: bytes) -> bytes:
        for _ in range(self.rng.choice([1, 1, 2, 3, 5])):
            operator = self.rng.choice(MUTATORS)
            data = operator(self, bytearray(data))
            self.counts[f"mutation {operator.__name__}"] += 1
        return bytes(data)

    def at(self, data: bytearray) -> int:
        return self.rng.randrange(len(data) + 1)

    def structural(self, data: bytearray) -> int:
        marks = [i for i, byte in enumerate(data[:200_000]) if byte in b'{}[],:"']
        return self.rng.choice(marks) if marks else self.at(data)

    # one input ------------------------------------------------------------------------------

    def check(self, data: bytes, label: str) -> None:
        """Load ``data`` natively and with the reference; compare; make the report."""
        from tracebuild import assert_same_trace

        from traceinsight.errors import TraceInsightError
        from traceinsight.load import load_pure, load_trace_reference, native
        from traceinsight.load.source import SizeLimit, open_trace
        from traceinsight.load.tables import trace_for

        # Repetitive mutants (a huge string of one byte) expand past the gzip ratio rule, which
        # would stop them before the scanner sees them: both loaders read them as --force does.
        limit = SizeLimit(force=True)

        gzipped = self.rng.random() < 0.3
        path = self.work / ("input.json.gz" if gzipped else "input.json")
        path.write_bytes(gzip.compress(data, compresslevel=1) if gzipped else data)
        # Each block costs about 2 ms (more under the sanitizers): a repetitive mutant a megabyte
        # long read 1 byte at a time held CI for 12 minutes on one input. Blocks small enough to
        # split every token, but never more than MAX_BLOCKS of them.
        sizes = [1, 7, 64, 200, 4096, 65536, 1 << 20, 16 << 20]
        native.BLOCK_BYTES = self.rng.choice([size for size in sizes if len(data) <= size * MAX_BLOCKS])
        native.SCAN_THREADS = self.rng.choice([1, 2])
        self.counts["inputs"] += 1
        outcome: Any
        try:
            with open_trace(path, limit) as source:
                try:
                    document, part = native.load_native(source, None)
                except native.Unavailable:
                    self.counts["left to the pure-Python loader"] += 1
                    source.rewind()
                    document, part = load_pure(source, None)
            outcome = trace_for(path, document, part)
        except TraceInsightError as exc:
            outcome = exc
        except Exception:
            self.finding(f"{label}: the native loader raised {traceback.format_exc()}", data)
            return
        if isinstance(outcome, TraceInsightError):
            self.counts["refused"] += 1
            self.counts[f"refused: {_words(str(outcome))}"] += 1
            if "\n" in str(outcome):
                self.finding(f"{label}: a refusal of more than one line: {outcome}", data)
            return
        try:
            reference: Any = load_trace_reference(path, limit)
        except TraceInsightError as exc:
            self.finding(f"{label}: native loads, the reference refuses: {exc}", data)
            return
        except Exception:
            self.finding(f"{label}: the reference loader raised {traceback.format_exc()}", data)
            return
        try:
            assert_same_trace(outcome, reference)
        except AssertionError as exc:
            self.finding(f"{label}: native and reference tables differ: {str(exc)[:2000]}", data)
            return
        self.counts["loaded, equal to the reference"] += 1
        if self.counts["loaded, equal to the reference"] % 3 == 1:  # the report costs more than the load
            self.report(outcome, label, data)

    def report(self, trace: Any, label: str, data: bytes) -> None:
        """Analysis, rules, JSON and the terminal summary of a loaded input must not fail."""
        from traceinsight.render.json_report import JsonRenderer
        from traceinsight.render.terminal import TerminalRenderer
        from traceinsight.results import result_for

        try:
            made = result_for(trace)
            JsonRenderer().render(made)
            TerminalRenderer().render(made)
        except Exception:
            self.finding(f"{label}: the report of a loaded input failed: {traceback.format_exc()}", data)
            return
        self.counts["reports made"] += 1

    def finding(self, message: str, data: bytes) -> None:
        self.findings.append(message)
        self.artifacts.mkdir(parents=True, exist_ok=True)
        name = self.artifacts / f"finding-{len(self.findings)}.json"
        name.write_bytes(data)
        print(f"fuzz: FINDING ({name}): {message}", flush=True)

    # the three parts ------------------------------------------------------------------------

    def mutation_loop(self, seconds: float) -> None:
        from traceinsight.load import native

        block, threads = native.BLOCK_BYTES, native.SCAN_THREADS
        try:
            for index, seed in enumerate(self.seeds):  # every seed once as it is
                self.check(seed, f"seed {index}")
            deadline = time.monotonic() + seconds
            while time.monotonic() < deadline and len(self.findings) < 20:
                seed = self.rng.randrange(len(self.seeds))
                self.check(self.mutate(self.seeds[seed]), f"mutant of seed {seed}")
        finally:
            native.BLOCK_BYTES, native.SCAN_THREADS = block, threads

    def direct_scans(self, seconds: float) -> None:
        """The scanner's two entry points on arbitrary buffers, offsets, states and depths: no
        sanitizer report, and nothing but a result or ``Invalid``."""
        from traceinsight.load import native

        scan = native._scan
        assert scan is not None
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            data = self.mutate(self.rng.choice(self.seeds))
            data = data[self.rng.randrange(len(data) + 1) :][
                : self.rng.choice([0, 1, 16, 300, 5000, 1 << 20])
            ]
            start = self.rng.randrange(len(data) + 1)
            with contextlib.suppress(scan.Invalid):  # (ExactBuffers: each call reads an exact copy)
                scan.scan(data, start, self.rng.randrange(3), self.rng.randrange(1, 5))
            with contextlib.suppress(scan.Invalid):
                scan.events_start(data[self.rng.randrange(len(data) + 1) :])
            self.counts["direct scanner calls"] += 2

    def hostile_corpus(self) -> None:
        """Every corpus case through the whole CLI, each in a process of its own, two at a time."""
        from test_hostile import build_corpus

        cases = build_corpus(self.work / "corpus")
        with ThreadPoolExecutor(max_workers=2) as pool:
            for (case, _), (code, stderr) in zip(cases, pool.map(self._run_cli, cases), strict=True):
                self.counts["corpus cases through the CLI"] += 1
                if code is None:
                    self.finding(
                        f"corpus {case.name}: analyze did not end within {CLI_SECONDS} s; its stacks:\n"
                        f"{stderr[-8000:]}",
                        b"",
                    )
                elif code in (86, 87) or code < 0:
                    self.finding(f"corpus {case.name}: sanitizer report or crash:\n{stderr[-4000:]}", b"")
                elif case.refused is not None and not (code == 2 and case.refused in stderr):
                    self.finding(
                        f"corpus {case.name}: expected exit 2 ({case.refused}), got {code}: {stderr}", b""
                    )
                elif case.refused is None and code != 0:
                    self.finding(f"corpus {case.name}: expected to load, got {code}: {stderr}", b"")

    def _run_cli(self, built: tuple[Any, Path]) -> tuple[int | None, str]:
        case, path = built
        out = self.work / f"out-{case.name}"
        out.mkdir()
        command = [sys.executable, "-c", CLI_WITH_STACKS, "analyze", str(path), "--json", str(out / "r.json"),
                   *case.options]  # fmt: skip
        # The page for every case that loads; a refusal comes before any rendering.
        html = ["-o", str(out / "r.html")] if case.refused is None else ["--no-html"]
        process = subprocess.Popen(
            [*command, *html],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its own process group: whatever it starts goes with it
        )
        try:
            _, stderr = process.communicate(timeout=CLI_SECONDS)
            return process.returncode, stderr
        except subprocess.TimeoutExpired:
            # Every thread's stack, of the command and of anything it started, then the end of them.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGUSR1)
            time.sleep(2)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            _, stderr = process.communicate()
            return None, stderr
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)  # whatever of the group outlived the command
            shutil.rmtree(out, ignore_errors=True)

    # stored results -------------------------------------------------------------------------

    def _result_seeds(self) -> list[tuple[bytes, Any]]:
        """(stored text, live result) of a few sample traces."""
        from traceinsight.load import load_trace
        from traceinsight.results import result_for

        seeds = []
        for name in (
            "a100_item_event_sync.json.gz",
            "mi250_rocm_toy.json.gz",
            "cpu_only_gloo.pt.trace.json.gz",
        ):
            result = result_for(load_trace(ROOT / "sample_traces" / name))
            seeds.append((result.to_json().encode(), result))
        return seeds

    def stored_results(self, seconds: float) -> None:
        """Mutated stored results through the reader, compare, every renderer and the gate."""
        seeds = self._result_seeds()
        deadline = time.monotonic() + seconds  # from when the seeds are made
        index = 0
        while time.monotonic() < deadline and len(self.findings) < 20:
            text, live = seeds[index % len(seeds)]
            mutant = text if index < len(seeds) else self.mutate_result(text)
            self.check_result(mutant, live, f"stored result {index}")
            index += 1
        for index in range(3):  # each a whole (sanitized) process: a few seconds
            text, _ = seeds[index % len(seeds)]
            self.diff_cli(self.mutate_result(text), f"stored result through the CLI {index}")
        self.diff_cli(None, "a FIFO given to diff")

    def mutate_result(self, data: bytes) -> bytes:
        if self.rng.random() < 0.5:
            return self.mutate(data)
        for _ in range(self.rng.choice([1, 1, 2, 4])):
            data = retype(self, data)
            self.counts["mutation retype"] += 1
        return data

    def check_result(self, data: bytes, live: Any, label: str) -> None:
        from traceinsight.errors import TraceInsightError
        from traceinsight.render.diff import comparison_renderables
        from traceinsight.render.markdown import MarkdownRenderer
        from traceinsight.results import Result
        from traceinsight.results.comparison import compare
        from traceinsight.results.gate import Budgets, broken_diff
        from traceinsight.results.stored import read_stored_result

        path = self.work / "result.json"
        path.write_bytes(data)
        self.counts["stored results"] += 1
        try:
            stored = read_stored_result(path, Result)
        except TraceInsightError as exc:
            self.counts["stored results refused"] += 1
            self.counts[f"stored refused: {_words(str(exc))}"] += 1
            if "\n" in str(exc):
                self.finding(f"{label}: a refusal of more than one line: {exc}", data)
            return
        except Exception:
            self.finding(f"{label}: the stored-result reader raised {traceback.format_exc()}", data)
            return
        if stored is None:
            self.counts["stored results taken for a trace"] += 1
            return
        try:
            outputs = []
            for before, after in ((stored, live), (live, stored)):
                comparison = compare(before, after, "before", "after")
                outputs.append(comparison.to_json())
                outputs.append(MarkdownRenderer().render(comparison))
                outputs.append(_terminal(comparison_renderables(comparison)))
                budgets = Budgets(fail_on="low", max_idle=1.0, max_syncs_per_step=0.5, max_regression=1.0)
                outputs.append("\n".join(broken_diff(comparison, after, budgets)))
        except Exception:
            self.finding(f"{label}: diff of an accepted stored result failed: {traceback.format_exc()}", data)
            return
        problem = _output_problem(outputs)
        if problem is not None:
            self.finding(f"{label}: {problem}", data)
            return
        self.counts["stored results compared and rendered"] += 1
        # A stored trace result draws its own summary, Markdown and page (analyze RESULT.json).
        from traceinsight.render.html import HtmlRenderer
        from traceinsight.render.terminal import trace_renderables

        try:
            own = [
                "",
                MarkdownRenderer().render(stored),
                _terminal(trace_renderables(stored)),
                "",
            ]
            HtmlRenderer().render(stored)
        except TraceInsightError:  # one that holds no details: said in one line
            self.counts["stored results that draw no report"] += 1
            return
        except Exception:
            self.finding(f"{label}: a stored result's own report failed: {traceback.format_exc()}", data)
            return
        problem = _output_problem(own, own_html=True)
        if problem is not None:
            self.finding(f"{label}: its own report: {problem}", data)
            return
        self.counts["stored results that draw their own report"] += 1

    def diff_cli(self, data: bytes | None, label: str) -> None:
        """``python -m traceinsight diff`` on a mutant (or a FIFO): exit 0 or 2, one line."""
        before = self.work / ("cli-result.json" if data is not None else "cli-fifo.json")
        before.unlink(missing_ok=True)
        if data is None:
            os.mkfifo(before)
        else:
            before.write_bytes(data)
        sample = ROOT / "sample_traces" / "a100_item_event_sync.json.gz"
        try:
            done = subprocess.run(
                [sys.executable, "-c", CLI_WITH_STACKS, "diff", str(before), str(sample), "--no-html"],
                capture_output=True, text=True, timeout=CLI_SECONDS,
            )  # fmt: skip
        except subprocess.TimeoutExpired:
            self.finding(f"{label}: diff did not end within {CLI_SECONDS} s", data or b"")
            return
        self.counts["stored results through the CLI"] += 1
        errors = [line for line in done.stderr.splitlines() if line.startswith("traceinsight: error")]
        if done.returncode in (86, 87) or done.returncode < 0:
            self.finding(f"{label}: sanitizer report or crash:\n{done.stderr[-4000:]}", data or b"")
        elif done.returncode not in (0, 2) or (done.returncode == 2 and len(errors) != 1):
            self.finding(f"{label}: diff ended {done.returncode}: {done.stderr[-2000:]}", data or b"")
        elif data is None and "FIFO" not in done.stderr:
            self.finding(f"{label}: a FIFO was not refused: {done.stderr[-2000:]}", b"")

    def summary(self, seed: int) -> str:
        lines = [f"fuzz: seed {seed}; {len(self.findings)} finding(s)"]
        lines += [f"  {count:>9,}  {what}" for what, count in sorted(self.counts.items())]
        return "\n".join(lines)


def _gunzips(raw: bytes) -> bool:
    try:
        gzip.decompress(raw)
    except (OSError, EOFError):
        return False
    return True


def _terminal(parts: list[Any]) -> str:
    """What a colour terminal receives for ``parts`` (escapes included)."""
    import io

    from rich.console import Console

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, color_system="truecolor", width=160)
    for part in parts:
        console.print(part)
    return screen.getvalue()


#: The HTML a trace's own Markdown writes itself: a finding's before / after and the minor
#: findings, folded (``<details><summary>…</summary>`` … ``</details>``).
_OWN_HTML: Final = re.compile(r"(?:<details><summary>[A-Za-z0-9 /()]*</summary>|</details>)\s*")


def _output_problem(outputs: list[str], own_html: bool = False) -> str | None:
    """What is wrong with the diff's outputs of a hostile result, if anything: a control character
    (other than the terminal's own colours and layout), a hyperlink, Markdown that is live
    (``own_html``: but for the folds a trace's own Markdown writes, :data:`_OWN_HTML`)."""

    from markdown_it import MarkdownIt

    json_text, markdown, terminal, gate = outputs[0], outputs[1], outputs[2], outputs[3]
    plain = re.sub(r"\x1b\[[0-9;]*m", "", terminal)  # the SGR colours rich writes itself
    for what, text in (("JSON", json_text), ("Markdown", markdown), ("terminal", plain), ("gate", gate)):
        found = re.search("[\x00-\x09\x0b-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]", text)
        if found is not None:
            return f"the diff's {what} holds {found.group()!r}"
    if "\x1b]" in terminal:
        return "the terminal output holds an OSC sequence (a hyperlink or a title)"
    tokens = MarkdownIt("gfm-like").parse(markdown)
    if own_html:
        tokens = [t for t in tokens if not (t.type == "html_block" and _OWN_HTML.fullmatch(t.content))]
    kinds = {token.type for token in tokens} | {c.type for token in tokens for c in token.children or ()}
    live = kinds & {"link_open", "image", "html_inline", "html_block"}
    return f"the diff's Markdown is live: {sorted(live)}" if live else None


_HOSTILE_VALUES: list[Any] = [
    None, True, -1, 0, 1.5, 10**30, 1e308, "", "x", [], [1, "a"], {}, {"a": {"b": [1]}},
    "x`](https://evil.example)![i](x)<details>", "[bold red]r[/] [link=https://e.x]y[/link]",
    "\x1b]0;title\x07\x1b[2J\u202e", "high", "medium", "sync-in-loop", "dataloader", "a" * 5000,
]  # fmt: skip


def retype(f: Fuzzer, data: bytes) -> bytes:
    """A stored result with one value (or key) replaced: a wrong type, a hostile string, a huge,
    non-finite or deeply nested value, written back as JSON (or as text for NaN and long digits)."""
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return data
    paths: list[tuple[Any, Any]] = []
    stack: list[Any] = [document]
    while stack and len(paths) < 5000:
        item = stack.pop()
        keys = list(item) if isinstance(item, dict) else range(len(item)) if isinstance(item, list) else []
        for key in keys:
            paths.append((item, key))
            stack.append(item[key])
    if not paths:
        return data
    container, key = f.rng.choice(paths)
    choice = f.rng.random()
    if choice < 0.1 and isinstance(container, dict):  # a hostile key
        container[f.rng.choice(_HOSTILE_VALUES[-6:-1])] = container.pop(key)
        return json.dumps(document).encode()
    if choice < 0.25:
        marker = "fuzz-number-marker"
        container[key] = marker
        number = f.rng.choice([b"NaN", b"-Infinity", b"1e400", b"9" * 5000, b"-0.0", b"1" * 21])
        return json.dumps(document).encode().replace(f'"{marker}"'.encode(), number, 1)
    if choice < 0.3:
        depth = f.rng.choice([31, 32, 33, 100, 5000])
        container[key] = json.loads("[" * depth + "]" * depth) if depth < 900 else None
        text = json.dumps(document)
        return text.encode() if depth < 900 else text.replace("null", "[" * depth + "]" * depth, 1).encode()
    container[key] = f.rng.choice(_HOSTILE_VALUES)
    return json.dumps(document).encode()


def _words(message: str) -> str:
    """A refusal's reason without the file name and byte offsets, for counting."""
    reason = message.split(": ", 2)[-1]
    return "".join(c for c in reason.split(";")[0] if not c.isdigit()).replace(",", "")[:70]


# --- mutators (each takes and returns a bytearray) -----------------------------------------------

_INTERESTING = b'\x00\xff\x80\xbf\xc0\xc2\xe0\xed\xf0\xf4\xf5"\\{}[],: \n\t-0eE.'
_STRINGS = [
    b"\\ud800",
    b"\\udc00",
    b"\\ud83d\\ude80",
    b"\\u0058",
    b"\\u0000",
    b"\\\\",
    b'\\"',
    b"\\x",
    b"\\u12",
    b"\xe2\x82",
]
_NUMBERS = [
    b"9" * 19, b"9" * 20, b"-9223372036854775809", b"9" * 4300, b"9" * 4301, b"1e999", b"-1e999", b"-0.0", b"NaN",
    b"Infinity", b"-Infinity", b"1.5e-400", b"0." + b"1" * 80, b"1712195495519695.75", b"8999999999999999.5",
    b"01", b"1.", b"-", b"1e", b"9223372036854775808.0",
]  # fmt: skip


def flip(f: Fuzzer, data: bytearray) -> bytearray:
    if data:
        data[f.rng.randrange(len(data))] ^= 1 << f.rng.randrange(8)
    return data


def interesting_byte(f: Fuzzer, data: bytearray) -> bytearray:
    if data:
        data[f.rng.randrange(len(data))] = f.rng.choice(_INTERESTING)
    return data


def cut(f: Fuzzer, data: bytearray) -> bytearray:
    at = f.structural(data)
    return data[:at] + (b"]}" if f.rng.random() < 0.3 else b"")


def delete(f: Fuzzer, data: bytearray) -> bytearray:
    a = f.at(data)
    return data[:a] + data[a + f.rng.choice([1, 2, 10, 100, 5000]) :]


def splice(f: Fuzzer, data: bytearray) -> bytearray:
    other = f.rng.choice(f.seeds)
    a, b = sorted(f.rng.randrange(len(other) + 1) for _ in range(2))
    at = f.structural(data)
    return data[:at] + other[a : min(b, a + 20_000)] + data[at:]


def duplicate(f: Fuzzer, data: bytearray) -> bytearray:
    a = f.structural(data)
    b = min(len(data), a + f.rng.choice([10, 300, 3000]))
    return data[:b] + data[a:b] + data[b:]


def nest(f: Fuzzer, data: bytearray) -> bytearray:
    depth = f.rng.choice([2, 100, 508, 509, 510, 511, 512, 513, 1000, 20_000])
    opener, closer = (b"[", b"]") if f.rng.random() < 0.5 else (b'{"a":', b"}")
    at = data.find(b": ", f.at(data))
    at = at + 2 if at >= 0 else f.at(data)
    return (
        data[:at]
        + opener * depth
        + b"1"
        + closer * depth
        + (b"," if f.rng.random() < 0.5 else b"")
        + data[at:]
    )


def huge_string(f: Fuzzer, data: bytearray) -> bytearray:
    at = data.find(b'"', f.at(data))
    if at < 0:
        return data
    size = f.rng.choice([100, 16_383, 16_384, 65_536, 65_537, 70_000, 1 << 20])
    filler = f.rng.choice(
        [b"a", b"\xc3\xa9", b"\xf0\x9f\x9a\x80", b"\\n", b"\\ud83d\\ude80", b"\\u0041", b"\x1b"]
    )
    return data[: at + 1] + filler * (size // len(filler)) + data[at + 1 :]


def number(f: Fuzzer, data: bytearray) -> bytearray:
    at = data.find(b": ", f.at(data))
    if at < 0:
        return data
    end = at + 2
    while end < len(data) and (
        data[end : end + 1] in (b"-", b".", b"e", b"E", b"+") or data[end : end + 1].isdigit()
    ):
        end += 1
    return data[: at + 2] + f.rng.choice(_NUMBERS) + data[end:]


def bad_text(f: Fuzzer, data: bytearray) -> bytearray:
    at = data.find(b'"', f.at(data))
    if at < 0:
        return data
    insert = f.rng.choice([*_STRINGS, bytes([f.rng.randrange(128, 256)]), b"\x00", b"\x1f"])
    return data[: at + 1] + insert + data[at + 1 :]


def nul(f: Fuzzer, data: bytearray) -> bytearray:
    at = f.at(data)
    return data[:at] + b"\x00" * f.rng.choice([1, 3, 4096]) + data[at:]


def comma(f: Fuzzer, data: bytearray) -> bytearray:
    marks = [i for i in range(min(len(data), 200_000)) if data[i : i + 2] == b"},"]
    if not marks:
        return data
    at = f.rng.choice(marks) + 1
    return data[:at] + data[at + 1 :] if f.rng.random() < 0.5 else data[:at] + b"," + data[at:]


def repeated_key(f: Fuzzer, data: bytearray) -> bytearray:
    key = f.rng.choice(
        [
            b'"traceEvents": [],',
            b'"traceEvents": null,',
            b'"ph": "i",',
            b'"name": "[memory]", "ph": "i",',
            b'"args": {"Bytes": -1, "Total Allocated": 1e30, "Device Id": "0x"},',
            b'"args": 5,',
            b'"ts": "x",',
            b'"cat": 7,',
        ]
    )
    at = data.find(b"{", f.at(data))
    return data if at < 0 else data[: at + 1] + key + data[at + 1 :]


def whitespace(f: Fuzzer, data: bytearray) -> bytearray:
    at = f.structural(data)
    return data[:at] + f.rng.choice([b" ", b"\n  ", b"\r\n", b"\t", b" " * 70_000, b"\x0b"]) + data[at:]


MUTATORS = (flip, interesting_byte, cut, delete, splice, duplicate, nest, huge_string, number, bad_text, nul, comma,
            repeated_key, whitespace)  # fmt: skip


if __name__ == "__main__":
    sys.exit(main())
