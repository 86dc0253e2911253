"""Benchmark `traceinsight analyze` on large traces, as a whole process, against a floor and HTA.

For each size (GB of uncompressed JSON) and each form (plain, gzip) it makes the trace once with
:mod:`make_large_trace` (a real sample repeated end to end), then runs in a fresh process:

- ``traceinsight analyze TRACE --json OUT`` (plus the HTML report when ``render/html.py`` exists,
  else ``--no-html``): the full job;
- the floors: reading (and gunzipping) the bytes alone, and reading + a full msgspec JSON scan
  that validates every byte but builds no objects — no parser in Python gets below that;
- optionally HolisticTraceAnalysis (``--hta-python``: an interpreter where it is installed, or the
  current one if it imports): parse + temporal breakdown on the same file.

Printed per run: wall time (``time.perf_counter`` around the child), MB/s of uncompressed trace,
peak memory of the whole process tree (sum of PSS over the child and its workers, polled every
100 ms from ``/proc``, so pages shared after fork are not counted twice; reading PSS makes the
kernel walk the page tables, so polling faster would take a large share of a 2-core machine from
the job being measured) and its ratio to the file
size, the peak RSS of the main process (``wait4``), and how time grows with size (time ratio over
size ratio between consecutive sizes: 1.0 is linear).

Run::

    python benchmarks/bench_analyze.py                      # 0.1, 0.25, 0.5, 1 GB, plain + gzip
    python benchmarks/bench_analyze.py --sizes 0.5 --hta-python /tmp/hta-venv/bin/python
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from make_large_trace import DEFAULT_SOURCE, ROOT, ensure_trace

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
    peak_tree_mb: float
    peak_main_mb: float
    returncode: int


def _tree_pss_kb(root: int) -> int:
    """Sum of PSS (kB) over ``root`` and its descendants (falls back to RSS without smaps_rollup)."""
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
    total, stack = 0, [root]
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, ()))
        try:
            with open(f"/proc/{pid}/smaps_rollup", "rb") as rollup:
                for line in rollup:
                    if line.startswith(b"Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            continue
    return total


def measure(command: list[str]) -> Run:
    """Run ``command`` (output discarded); wall, peak tree PSS and peak main RSS."""
    start = time.perf_counter()
    child = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=ROOT)
    peak = 0
    done = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not done.is_set():
            peak = max(peak, _tree_pss_kb(child.pid))
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
    return Run(wall, cpu, peak / 1024, usage.ru_maxrss / 1024, child.returncode)


def _analyze_command(trace: Path, out: Path, html: bool) -> list[str]:
    command = [sys.executable, "-m", "traceinsight", "analyze", str(trace), "--json", str(out / "r.json")]
    return [*command, "-o", str(out / "r.html")] if html else [*command, "--no-html"]


def _hta_python(option: str | None) -> str | None:
    if option:
        return option
    probe = subprocess.run([sys.executable, "-c", "import hta"], capture_output=True)
    return sys.executable if probe.returncode == 0 else None


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", type=float, nargs="+", default=[0.1, 0.25, 0.5, 1.0], help="GB of JSON")
    parser.add_argument("--forms", nargs="+", default=["plain", "gzip"], choices=["plain", "gzip"])
    parser.add_argument("--source", type=Path, default=DEFAULT_SOURCE, help="the real trace to repeat")
    parser.add_argument("--no-floor", action="store_true", help="skip the read/scan floors")
    parser.add_argument(
        "--hta-python", help="python with HolisticTraceAnalysis installed (default: this one)"
    )
    parser.add_argument("--hta-max-gb", type=float, default=0.5, help="largest size to run HTA on")
    parser.add_argument("--hta-repeat", type=int, default=1, help="runs of HTA per measurement (it is slow)")
    parser.add_argument(
        "--repeat", type=int, default=1, help="runs per measurement; the median run (by wall time) is kept"
    )
    options = parser.parse_args()

    html = (ROOT / "traceinsight" / "render" / "html.py").exists()
    hta = _hta_python(options.hta_python)
    print(
        f"machine: {os.cpu_count()} cores; python {sys.version.split()[0]}; "
        f"job: analyze --json {'+ HTML' if html else '--no-html (render/html.py missing)'}; "
        f"HTA: {hta or 'not installed'}"
    )
    rows: list[tuple[str, ...]] = []
    previous: dict[str, tuple[float, float]] = {}
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch)
        for size in options.sizes:
            for form in options.forms:
                trace = ensure_trace(size, form == "gzip", options.source)
                plain = trace.with_suffix("") if form == "gzip" else trace
                mb = plain.stat().st_size / 1e6
                disk_mb = trace.stat().st_size / 1e6
                jobs: list[tuple[str, list[str]]] = [("traceinsight", _analyze_command(trace, out, html))]
                if not options.no_floor:
                    jobs.append(
                        (
                            "floor: read" + (" + gunzip" if form == "gzip" else ""),
                            [sys.executable, "-c", FLOOR_READ, str(trace)],
                        )
                    )
                    jobs.append(("floor: read + JSON scan", [sys.executable, "-c", FLOOR_SCAN, str(trace)]))
                if hta and size <= options.hta_max_gb:
                    jobs.append(("HTA (parse + temporal breakdown)", [hta, "-c", HTA, str(trace)]))
                for label, command in jobs:
                    repeat = options.hta_repeat if label.startswith("HTA") else options.repeat
                    runs = sorted((measure(command) for _ in range(repeat)), key=lambda run: run.wall_s)
                    best = runs[len(runs) // 2]  # the median: this machine's speed varies by ±10 %
                    growth = ""
                    key = f"{label}/{form}"
                    if key in previous:
                        last_mb, last_wall = previous[key]
                        growth = f"{(best.wall_s / last_wall) / (mb / last_mb):.2f}"
                    previous[key] = (mb, best.wall_s)
                    row = (
                        f"{mb:.0f}",
                        form + (f" ({disk_mb:.0f} MB)" if form == "gzip" else ""),
                        label,
                        f"{best.wall_s:.2f}",
                        f"{mb / best.wall_s:.0f}",
                        f"{best.cpu_s:.2f}",
                        f"{mb / (best.cpu_s / 2):.0f}" if label == "traceinsight" and best.cpu_s else "",
                        f"{best.peak_tree_mb:.0f}",
                        f"{best.peak_tree_mb / mb:.2f}",
                        f"{best.peak_main_mb:.0f}",
                        growth,
                        f"load {os.getloadavg()[0]:.1f}"
                        + ("" if best.returncode == 0 else f"; exit {best.returncode}"),
                    )
                    rows.append(row)
                    print("  " + " | ".join(row), flush=True)
    header = (
        "JSON MB",
        "input",
        "what",
        "wall s",
        "MB/s",
        "CPU s",
        "MB/s if both cores were free (CPU s / 2)",
        "peak MB (tree PSS)",
        "peak / file",
        "main RSS MB",
        "time growth per size",
        "note (1-min load average of the machine after the run)",
    )
    print()
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for row in rows:
        print("| " + " | ".join(row) + " |")
    print("\ntime growth: (time ratio) / (size ratio) vs the previous size of the same form; 1.00 = linear")


if __name__ == "__main__":
    main()
