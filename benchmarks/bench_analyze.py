"""Benchmark `traceinsight analyze` as ratios to floors measured in the same run.

Absolute speeds move with the machine (the same code ran 2x apart on two machines of one kind,
and a shared machine's load moves them within a run), so every figure here is a ratio to a floor
that runs interleaved with the job, on the same file, in a fresh interpreter each time:

- **small traces** (every sample of at most ``--small-mb`` MB of JSON): the floor is
  ``python -c "import polars, msgspec, jinja2"``; target: the job within 2x;
- **large traces** (real samples repeated end to end to ``--sizes`` GB of JSON, see
  :mod:`make_large_trace`): the floor is reading the file and one validating msgspec scan of it
  (``msgspec.json.decode(raw, type=Nothing)``, which checks every byte and builds nothing);
  targets: the job within 2.5x, maximum RSS at most the file's size, time at twice the size at
  most 2.1x.

The job is ``traceinsight analyze TRACE --json OUT -o OUT.html`` (JSON and HTML) with
``TRACEINSIGHT_TIMINGS=1``, which prints each stage's time (load, analysis, JSON, HTML,
terminal); the rest of its wall time is printed as "startup" (the interpreter, the imports,
reading the arguments, the exit). The package's bytecode and its page templates are compiled
first, as an install has them (the templates after its first run). Each measurement runs
``--repeat`` times, floor and job alternating; printed are the
medians of the floor's and the job's wall time, the median of the per-pair ratios, the median
maximum RSS (``ru_maxrss`` from ``wait4``: what ``/usr/bin/time -v`` prints) over the file, the
median stage times, the job's CPU time over the floor's (median of pairs; a loaded machine moves
it less than wall time), and for each size after the first the job's time over the previous size's
(wall, and CPU time, which the machine's load moves less), per size ratio. The load average
is printed with each row: on a shared machine, say how loaded it was.

After the small traces, two lines say how much of the small target the libraries take on this
machine: every third-party module a job on the largest small sample imports (read from its
``-X importtime``), imported alone in the job's order and as the job imports them (its settings,
the collector paused, the dataclasses' methods compiled), against the floor (paired as above); then
the same without numpy, which only the loader and four analysis modules import.
What is left of the 2x is what the package's own imports, load, analysis and outputs may take.

Run::

    python benchmarks/bench_analyze.py                            # small samples + 4 shapes at 0.5 and 1 GB
    python benchmarks/bench_analyze.py --no-small --shapes v100_ddp_ns_timestamps --sizes 4 --repeat 3
    python benchmarks/bench_analyze.py --no-large --repeat 9
"""

from __future__ import annotations

import argparse
import compileall
import gzip
import importlib.util
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_large_trace import ROOT, SHAPES, ensure_trace

from traceinsight.process import LOAD_SETTINGS

#: The four shapes of issue 34: DDP with many gaps, recsys with thousands of copies, LLM decode with
#: ~10^5 tiny kernels, stacks + syncs (a Hugging Face model's inference with syncs in its forward).
DEFAULT_SHAPES = (
    "v100_ddp_ns_timestamps",
    "a100_recsys_rank0",
    "b200_eager_stacks",
    "h100_qwen_inference_stacks",
)
#: The stages the timing hook reports, in the order they run.
STAGES = ("load", "analysis", "JSON", "HTML", "terminal")
_TIMING = re.compile(rb"^traceinsight timing: (\S+) ([0-9.]+) s$", re.MULTILINE)
SAMPLES = ROOT / "sample_traces"

#: The small traces' floor: the libraries every report needs, imported in a fresh interpreter.
FLOOR_IMPORTS = "import polars, msgspec, jinja2"
#: The large traces' floor: read the file, then one validating JSON scan that builds nothing.
FLOOR_SCAN = """
import gzip, sys, msgspec
class Nothing(msgspec.Struct):
    pass
raw = open(sys.argv[1], 'rb').read()
if raw[:2] == b'\\x1f\\x8b':
    raw = gzip.decompress(raw)
msgspec.json.decode(raw, type=Nothing)
"""
#: The libraries' share of a small job: each third-party module the job imports (read from one
#: job's ``-X importtime``), imported in the job's order in a fresh interpreter, as the job imports
#: them: with its settings and the cyclic collector paused. One the job tries and does not find is
#: tried here too.
LIBRARIES = """
import gc, importlib, os
gc.disable()
os.environ.update({settings!r})
for name in {names!r}:
    try:
        importlib.import_module(name)
    except ImportError:
        pass
"""
_IMPORTED = re.compile(rb"^import time:\s+\d+ \|\s+\d+ \| *(\S+)$", re.MULTILINE)
#: Targets (issue 34).
SMALL_TARGET, LARGE_TARGET, RSS_TARGET, GROWTH_TARGET = 2.0, 2.5, 1.0, 2.1


@dataclass(frozen=True)
class Run:
    """One measured child process."""

    wall_s: float
    cpu_s: float
    max_rss_mb: float
    stages: dict[str, float]
    returncode: int


def measure(command: list[str]) -> Run:
    """Run ``command`` (stdout discarded, stage times read from stderr)."""
    environment = {**os.environ, "TRACEINSIGHT_TIMINGS": "1"}
    start = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=environment
    )
    stderr = child.stderr.read() if child.stderr else b""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    returncode = os.waitstatus_to_exitcode(status)
    if returncode:
        print(f"    ! {' '.join(command[:5])}... exited {returncode}: {stderr.decode()[-400:]}", flush=True)
    stages = {name.decode(): float(seconds) for name, seconds in _TIMING.findall(stderr)}
    # kB (KiB) from the kernel -> MB of 10^6 bytes, the unit of the file sizes it is divided by
    return Run(wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss * 1024 / 1e6, stages, returncode)


def _job(trace: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "traceinsight", "analyze", str(trace),
            "--json", str(out / "r.json"), "-o", str(out / "r.html")]  # fmt: skip


@dataclass(frozen=True)
class Paired:
    """Floor and job measured alternately."""

    floor: list[Run]
    job: list[Run]

    @property
    def floor_s(self) -> float:
        return statistics.median(run.wall_s for run in self.floor)

    @property
    def job_s(self) -> float:
        return statistics.median(run.wall_s for run in self.job)

    @property
    def job_cpu_s(self) -> float:
        return statistics.median(run.cpu_s for run in self.job)

    @property
    def ratio(self) -> float:
        return statistics.median(j.wall_s / f.wall_s for f, j in zip(self.floor, self.job, strict=True))

    @property
    def cpu_ratio(self) -> float:
        """The job's CPU time over the floor's (medians of pairs): what a loaded machine moves less
        than wall time."""
        return statistics.median(j.cpu_s / f.cpu_s for f, j in zip(self.floor, self.job, strict=True))

    @property
    def rss_mb(self) -> float:
        return statistics.median(run.max_rss_mb for run in self.job)

    def stage(self, name: str) -> str:
        values = [run.stages[name] for run in self.job if name in run.stages]
        return f"{statistics.median(values):.2f}" if values else ""

    @property
    def startup(self) -> str:
        """The job's wall time outside the timed stages: the interpreter's start, the imports,
        reading the arguments, ending (median)."""
        values = [run.wall_s - sum(run.stages.values()) for run in self.job if run.stages]
        return f"{statistics.median(values):.2f}" if values else ""

    @property
    def failed(self) -> bool:
        return any(run.returncode for run in (*self.floor, *self.job))


def paired(floor: list[str], job: list[str], repeat: int) -> Paired:
    floors, jobs = [], []
    for _ in range(repeat):
        floors.append(measure(floor))
        jobs.append(measure(job))
    return Paired(floors, jobs)


def _mark(value: float, target: float) -> str:
    return f"{value:.2f}" + ("" if value <= target else " **over**")


def small_traces(limit_mb: float) -> list[Path]:
    """Every sample whose JSON is at most ``limit_mb`` MB, smallest first."""
    sizes = []
    for path in sorted(SAMPLES.rglob("*.json*")):
        if not path.name.endswith((".json", ".json.gz")):
            continue
        raw = path.read_bytes()
        plain = len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)
        if plain <= limit_mb * 1e6:
            sizes.append((plain, path))
    return [path for _, path in sorted(sizes)]


def libraries_of(trace: Path, out: Path) -> list[str]:
    """The third-party modules a job on ``trace`` imports, in the order it imports them: from one
    run's ``-X importtime``, those of a package installed beside the libraries (not the standard
    library's, not this package's, not those every interpreter here has imported at its start)."""
    job = _job(trace, out)
    child = subprocess.run([job[0], "-X", "importtime", *job[1:]], capture_output=True, cwd=ROOT, check=True)
    installed = {Path(sysconfig.get_paths()[key]).resolve() for key in ("purelib", "platlib")}
    at_start = subprocess.run(  # imported by every interpreter here before it runs anything (a .pth's)
        [sys.executable, "-c", "import sys; print(*sys.modules)"], capture_output=True, text=True, check=True
    ).stdout.split()
    names: list[str] = []
    for raw in _IMPORTED.findall(child.stderr):
        name = raw.decode()
        top = name.split(".")[0]
        if name in names or name in at_start or top == "traceinsight" or top in sys.stdlib_module_names:
            continue
        found = importlib.util.find_spec(top)
        origin = found.origin if found is not None else None
        if origin is not None and any(folder in Path(origin).resolve().parents for folder in installed):
            names.append(name)
    return names


def run_libraries(trace: Path, options: argparse.Namespace, out: Path) -> list[str]:
    """The job's libraries alone (:data:`LIBRARIES`) against the floor, paired: all of them, then
    all but numpy (which the loader and four analysis modules use, and polars imports only for
    them)."""
    names = libraries_of(trace, out)
    lines = []
    for label, chosen in (
        ("the job's libraries alone", names),
        ("the same without numpy", [name for name in names if name.split(".")[0] != "numpy"]),
    ):
        tops = list(dict.fromkeys(name.split(".")[0] for name in chosen))
        result = paired(
            [sys.executable, "-c", FLOOR_IMPORTS],
            [sys.executable, "-c", LIBRARIES.format(names=chosen, settings=LOAD_SETTINGS)],
            options.repeat,
        )
        lines.append(
            f"{label} ({len(chosen)} modules of {', '.join(tops)}, as a job on {trace.name} imports "
            f"them): {result.job_s:.2f} s against the floor's {result.floor_s:.2f} s, median "
            f"{result.ratio:.2f}x the floor; left of the {SMALL_TARGET}x for the package's own imports "
            f"and work: {SMALL_TARGET - result.ratio:.2f}x the floor"
        )
        print(lines[-1], flush=True)
    return ["", *lines]


def run_small(options: argparse.Namespace, out: Path) -> list[str]:
    floor = [sys.executable, "-c", FLOOR_IMPORTS]
    header = ("trace", "JSON KB", "floor s", "job s", "job ÷ floor", "CPU ÷ floor CPU", "max RSS MB", "job CPU s",
              "startup s", *(f"{stage} s" for stage in STAGES), "load avg")  # fmt: skip
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    print(
        "\nsmall traces: floor = python -c " + repr(FLOOR_IMPORTS) + f"; target job ÷ floor ≤ {SMALL_TARGET}"
    )
    ratios, cpu_ratios = [], []
    traces = small_traces(options.small_mb)
    for trace in traces:
        raw = trace.read_bytes()
        kb = (len(gzip.decompress(raw)) if raw[:2] == b"\x1f\x8b" else len(raw)) / 1e3
        result = paired(floor, _job(trace, out), options.repeat)
        ratios.append(result.ratio)
        cpu_ratios.append(result.cpu_ratio)
        row = (
            str(trace.relative_to(SAMPLES)), f"{kb:.0f}", f"{result.floor_s:.2f}", f"{result.job_s:.2f}",
            _mark(result.ratio, SMALL_TARGET), f"{result.cpu_ratio:.2f}", f"{result.rss_mb:.0f}",
            f"{result.job_cpu_s:.2f}", result.startup,
            *(result.stage(stage) for stage in STAGES),
            f"{os.getloadavg()[0]:.1f}" + ("; failed" if result.failed else ""),
        )  # fmt: skip
        rows.append("| " + " | ".join(row) + " |")
        print("  " + " | ".join(row), flush=True)
    if ratios:
        rows.append(
            f"\nsmall traces: median job ÷ floor {statistics.median(ratios):.2f}, worst {max(ratios):.2f}; "
            f"CPU ÷ floor CPU median {statistics.median(cpu_ratios):.2f}, worst {max(cpu_ratios):.2f}"
        )
        rows += run_libraries(traces[-1], options, out)  # the largest: the most of the job's imports
    return rows


def run_large(options: argparse.Namespace, out: Path) -> list[str]:
    header = ("shape", "JSON MB", "floor s", "job s", "job ÷ floor", "CPU ÷ floor CPU", "max RSS ÷ file",
              "job CPU s",
              "startup s", *(f"{stage} s" for stage in STAGES), "time at 2× size (wall / CPU)",
              "load avg")  # fmt: skip
    rows = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    print(
        f"\nlarge traces: floor = read + one validating msgspec scan; targets job ÷ floor ≤ {LARGE_TARGET}, "
        f"max RSS ÷ file ≤ {RSS_TARGET}, time at 2× size ≤ {GROWTH_TARGET}"
    )
    for shape in options.shapes:
        previous: tuple[float, float, float] | None = None
        for size in options.sizes:
            trace = ensure_trace(size, options.gzip, SHAPES[shape])
            plain = trace.with_suffix("") if options.gzip else trace
            mb = plain.stat().st_size / 1e6
            floor = [sys.executable, "-c", FLOOR_SCAN, str(trace)]
            result = paired(floor, _job(trace, out), options.repeat)
            growth = ""
            if previous is not None:
                last_mb, last_wall, last_cpu = previous
                per = mb / last_mb
                wall_growth = result.job_s / last_wall * 2 / per
                cpu_growth = result.job_cpu_s / last_cpu * 2 / per
                growth = f"{_mark(wall_growth, GROWTH_TARGET)} / {_mark(cpu_growth, GROWTH_TARGET)}"
            previous = (mb, result.job_s, result.job_cpu_s)
            row = (
                shape, f"{mb:.0f}" + (" (gzip)" if options.gzip else ""), f"{result.floor_s:.2f}",
                f"{result.job_s:.2f}", _mark(result.ratio, LARGE_TARGET), f"{result.cpu_ratio:.2f}",
                _mark(result.rss_mb / mb, RSS_TARGET), f"{result.job_cpu_s:.2f}", result.startup,
                *(result.stage(stage) for stage in STAGES), growth,
                f"{os.getloadavg()[0]:.1f}" + ("; failed" if result.failed else ""),
            )  # fmt: skip
            rows.append("| " + " | ".join(row) + " |")
            print("  " + " | ".join(row), flush=True)
    rows.append(
        "\ntime at 2× size: the job's time over the previous size's, scaled to a doubling "
        "((t2 / t1) × 2 / (size2 / size1)); wall, then CPU time"
    )
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), choices=sorted(SHAPES))
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.5, 1.0], help="GB of JSON")
    parser.add_argument("--gzip", action="store_true", help="large traces gzipped (the floor gunzips)")
    parser.add_argument("--repeat", type=int, default=5, help="floor/job pairs per row (medians)")
    parser.add_argument("--small-mb", type=float, default=1.1, help="largest small sample, MB of JSON")
    parser.add_argument("--no-small", action="store_true", help="skip the small samples")
    parser.add_argument("--no-large", action="store_true", help="skip the large traces")
    options = parser.parse_args()
    print(
        f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; job: analyze --json OUT -o "
        f"OUT.html; {options.repeat} floor/job pairs per row, medians; "
        f"1-min load average at the start: {os.getloadavg()[0]:.2f}",
        flush=True,
    )
    # An installed package has its bytecode; a checkout run with PYTHONDONTWRITEBYTECODE=1 would
    # compile every module it changed on each run (about 50 ms for ten modules on a small trace),
    # and the page's templates (0.1 s) when no run has kept them compiled yet.
    compileall.compile_dir(ROOT / "traceinsight", quiet=1)
    subprocess.run(
        [sys.executable, "-c", "from traceinsight.render.templates import precompile; precompile()"],
        cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True,
    )  # fmt: skip
    rows: list[str] = []
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        if not options.no_small:
            rows += run_small(options, out)
        if not options.no_large:
            rows += ["", *run_large(options, out)]
    print(f"\n1-min load average at the end: {os.getloadavg()[0]:.2f}\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
