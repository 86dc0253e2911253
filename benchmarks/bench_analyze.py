"""Benchmark `traceinsight analyze` on large traces of several real shapes, as a whole process.

For each shape (a real sample, see ``make_large_trace.SHAPES``), each size (GB of uncompressed
JSON) and each form (plain, gzip) it makes the trace once with :mod:`make_large_trace` (the sample
repeated end to end), then runs in a fresh process:

- ``traceinsight analyze TRACE --json OUT -o OUT.html``: the full job, with
  ``TRACEINSIGHT_TIMINGS=1`` so that it prints the time of each stage (load, analysis, JSON, HTML,
  terminal) on stderr;
- with ``--floor``, the floors: reading (and gunzipping) the bytes alone, and reading + a full
  msgspec JSON scan that validates every byte but builds no objects;
- optionally HolisticTraceAnalysis (``--hta-python``: an interpreter where it is installed, or the
  current one if it imports): parse + temporal breakdown on the same file.

Printed per run: wall time (``time.perf_counter`` around the child), MB/s of uncompressed trace,
CPU seconds (``wait4``: the child and the workers it waited for), **maximum RSS** — the larger of
the child's ``ru_maxrss`` (``wait4``, what ``/usr/bin/time -v`` prints: the largest single process
among the child and the workers it reaped) and the peak, polled every 100 ms from ``/proc``, of the
child's RSS plus its workers' private pages (the HTML renderer forks one to draw half the charts;
the pages it shares with its parent count once) — and its ratio to the file, the peak PSS of the
tree as a second figure (reading smaps makes the kernel walk the page tables, so it is polled no
faster), the stage times from the timing hook, and how time grows with size (time ratio over
size ratio vs the previous size of the same shape and form: 1.0 is linear).

Run::

    python benchmarks/bench_analyze.py                      # 4 shapes; 0.25, 0.5, 1 GB; plain + gzip
    python benchmarks/bench_analyze.py --shapes a100_recsys_rank0 --sizes 0.5 --forms plain --repeat 3
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_large_trace import ROOT, SHAPES, ensure_trace

#: The shapes run unless --shapes says otherwise (LLM decode: b200_eager_stacks).
DEFAULT_SHAPES = (
    "v100_ddp_ns_timestamps",
    "a100_recsys_rank0",
    "b200_eager_stacks",
    "v100_resnet50_workers0",
)
#: The stages the timing hook reports, in the order they run.
STAGES = ("load", "analysis", "JSON", "HTML", "terminal")
_TIMING = re.compile(rb"^traceinsight timing: (\S+) ([0-9.]+) s$", re.MULTILINE)

FLOOR_READ = """
import sys, zlib
path = sys.argv[1]
with open(path, 'rb') as f:
    head = f.read(2); f.seek(0)
    if head == b'\\x1f\\x8b':
        d = zlib.decompressobj(31)
        while chunk := f.read(1 << 23):
            d.decompress(chunk)
    else:
        while f.read(1 << 23):
            pass
"""

FLOOR_SCAN = """
import gzip, sys, msgspec
class Nothing(msgspec.Struct):
    pass
raw = open(sys.argv[1], 'rb').read()
if raw[:2] == b'\\x1f\\x8b':
    raw = gzip.decompress(raw)
msgspec.json.decode(raw, type=Nothing)
"""

HTA = """
import os, sys, tempfile
from hta.trace_analysis import TraceAnalysis
path = os.path.abspath(sys.argv[1])
with tempfile.TemporaryDirectory() as folder:
    os.symlink(path, os.path.join(folder, os.path.basename(path)))
    analyzer = TraceAnalysis(trace_dir=folder)
    analyzer.get_temporal_breakdown(visualize=False)
"""


#: How often the tree's PSS is read (see the module docstring).
POLL_SECONDS = 0.1


@dataclass
class Run:
    """One measured child process."""

    wall_s: float
    cpu_s: float
    max_rss_mb: float
    """max(``ru_maxrss`` of the child, polled peak of its RSS plus its workers' private pages)."""
    peak_pss_mb: float
    stages: dict[str, float]
    returncode: int


def _tree(root: int) -> list[int]:
    """``root`` and its descendants."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as stat:
                fields = stat.read().rsplit(b")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(entry))
        except OSError:
            continue
    found, stack = [], [root]
    while stack:
        pid = stack.pop()
        found.append(pid)
        stack.extend(children.get(pid, ()))
    return found


def _rollup_kb(pid: int) -> dict[bytes, int]:
    """The kB figures of ``/proc/PID/smaps_rollup`` (empty when the process is gone)."""
    figures: dict[bytes, int] = {}
    try:
        with open(f"/proc/{pid}/smaps_rollup", "rb") as lines:
            for line in lines:
                parts = line.split()
                if len(parts) == 3 and parts[2] == b"kB":
                    figures[parts[0].rstrip(b":")] = int(parts[1])
    except OSError:
        pass
    return figures


def _tree_memory_kb(root: int) -> tuple[int, int]:
    """(RSS of ``root`` plus the private pages of its descendants, PSS summed over the tree) in kB.

    A worker forked by the job shares its parent's pages until either writes them: those count
    once (in the parent's RSS), the worker's own pages on top.
    """
    rss = pss = 0
    for pid in _tree(root):
        figures = _rollup_kb(pid)
        pss += figures.get(b"Pss", 0)
        if pid == root:
            rss += figures.get(b"Rss", 0)
        else:
            rss += figures.get(b"Private_Clean", 0) + figures.get(b"Private_Dirty", 0)
    return rss, pss


def measure(command: list[str]) -> Run:
    """Run ``command`` (stdout discarded, stage times read from stderr); see the module docstring."""
    environment = {**os.environ, "TRACEINSIGHT_TIMINGS": "1"}
    start = time.perf_counter()
    child = subprocess.Popen(
        command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT, env=environment
    )
    peak_rss = peak_pss = 0
    done = threading.Event()

    def poll() -> None:
        nonlocal peak_rss, peak_pss
        while not done.is_set():
            rss, pss = _tree_memory_kb(child.pid)
            peak_rss, peak_pss = max(peak_rss, rss), max(peak_pss, pss)
            time.sleep(POLL_SECONDS)

    watcher = threading.Thread(target=poll, daemon=True)
    watcher.start()
    stderr = child.stderr.read() if child.stderr else b""
    _, status, usage = os.wait4(child.pid, 0)
    wall = time.perf_counter() - start
    done.set()
    watcher.join()
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode:
        print(f"    ! {' '.join(command[:4])}... exited {child.returncode}: {stderr.decode()[-400:]}")
    # wait4's usage covers the child and every worker it waited for: CPU time is what the job
    # costs on a machine that other work shares; wall >= cpu / cores on an idle one.
    cpu = usage.ru_utime + usage.ru_stime
    stages = {name.decode(): float(seconds) for name, seconds in _TIMING.findall(stderr)}
    # kB (KiB) from the kernel -> MB of 10^6 bytes, the unit of the file sizes it is divided by
    max_rss = max(usage.ru_maxrss, peak_rss) * 1024 / 1e6
    return Run(wall, cpu, max_rss, peak_pss * 1024 / 1e6, stages, child.returncode)


def _analyze_command(trace: Path, out: Path) -> list[str]:
    return [sys.executable, "-m", "traceinsight", "analyze", str(trace),
            "--json", str(out / "r.json"), "-o", str(out / "r.html")]  # fmt: skip


def _hta_python(option: str | None) -> str | None:
    if option:
        return option
    probe = subprocess.run([sys.executable, "-c", "import hta"], capture_output=True)
    return sys.executable if probe.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--shapes", nargs="+", default=list(DEFAULT_SHAPES), choices=sorted(SHAPES))
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.25, 0.5, 1.0], help="GB of JSON")
    parser.add_argument("--forms", nargs="+", default=["plain", "gzip"], choices=["plain", "gzip"])
    parser.add_argument("--floor", action="store_true", help="also run the read / read + scan floors")
    parser.add_argument(
        "--hta-python", help="python with HolisticTraceAnalysis installed (default: this one)"
    )
    parser.add_argument("--hta-max-gb", type=float, default=0.5, help="largest size to run HTA on")
    parser.add_argument("--hta-repeat", type=int, default=1, help="runs of HTA per measurement (it is slow)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per measurement; the median run (by wall time) is kept"
    )
    options = parser.parse_args()

    hta = _hta_python(options.hta_python)
    print(
        f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; "
        f"job: analyze --json OUT -o OUT.html; HTA: {hta or 'not installed'}; "
        f"1-min load average at the start: {os.getloadavg()[0]:.2f}"
    )
    header = (
        "shape", "JSON MB", "input", "what", "wall s", "MB/s", "CPU s", "max RSS MB", "max RSS / file",
        "peak PSS MB", *(f"{stage} s" for stage in STAGES), "time growth per size", "load avg after",
    )  # fmt: skip
    print("  " + " | ".join(header))
    rows: list[tuple[str, ...]] = []
    previous: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        for shape in options.shapes:
            for size in options.sizes:
                for form in options.forms:
                    trace = ensure_trace(size, form == "gzip", SHAPES[shape])
                    rows.extend(_measure_trace(shape, trace, form, out, hta, options, previous))
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print(
        "\ntime growth: (time ratio) / (size ratio) vs the previous size of the same shape and form; 1.00 = linear"
    )


def _measure_trace(
    shape: str,
    trace: Path,
    form: str,
    out: Path,
    hta: str | None,
    options: argparse.Namespace,
    previous: dict[str, tuple[float, float]],
) -> list[tuple[str, ...]]:
    """Every job on one trace file: its printed rows."""
    plain = trace.with_suffix("") if form == "gzip" else trace
    mb = plain.stat().st_size / 1e6
    disk_mb = trace.stat().st_size / 1e6
    jobs: list[tuple[str, list[str]]] = [("traceinsight", _analyze_command(trace, out))]
    if options.floor:
        jobs.append(
            (
                "floor: read" + (" + gunzip" if form == "gzip" else ""),
                [sys.executable, "-c", FLOOR_READ, str(trace)],
            )
        )
        jobs.append(("floor: read + JSON scan", [sys.executable, "-c", FLOOR_SCAN, str(trace)]))
    if hta and mb / 1000 <= options.hta_max_gb:
        jobs.append(("HTA (parse + temporal breakdown)", [hta, "-c", HTA, str(trace)]))
    rows = []
    for label, command in jobs:
        repeat = options.hta_repeat if label.startswith("HTA") else options.repeat
        runs = sorted((measure(command) for _ in range(repeat)), key=lambda run: run.wall_s)
        best = runs[len(runs) // 2]  # the median: this machine's speed varies by ±10 %
        growth = ""
        key = f"{shape}/{label}/{form}"
        if key in previous:
            last_mb, last_wall = previous[key]
            growth = f"{(best.wall_s / last_wall) / (mb / last_mb):.2f}"
        previous[key] = (mb, best.wall_s)
        row = (
            shape,
            f"{mb:.0f}",
            form + (f" ({disk_mb:.0f} MB)" if form == "gzip" else ""),
            label,
            f"{best.wall_s:.2f}",
            f"{mb / best.wall_s:.0f}",
            f"{best.cpu_s:.2f}",
            f"{best.max_rss_mb:.0f}",
            f"{best.max_rss_mb / mb:.2f}",
            f"{best.peak_pss_mb:.0f}",
            *(f"{best.stages[stage]:.2f}" if stage in best.stages else "" for stage in STAGES),
            growth,
            f"{os.getloadavg()[0]:.1f}" + ("" if best.returncode == 0 else f"; exit {best.returncode}"),
        )
        rows.append(row)
        print("  " + " | ".join(row), flush=True)
    return rows


if __name__ == "__main__":
    main()
