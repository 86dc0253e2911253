"""Check that a change keeps `traceinsight analyze`'s output byte for byte.

``write DIR [TRACE ...]`` runs ``traceinsight analyze TRACE --json … -o … --markdown …`` in a fresh
process on every trace (default: every file in ``sample_traces/``, ``two_ranks/`` included) and
keeps, per trace, the JSON, the HTML, the Markdown, the terminal summary (fixed width) and the
exit status in ``DIR/<trace name>/``. Run it before a change (into one folder) and after it (into
another), then ``compare BEFORE AFTER`` lists every file that differs and exits 1 if any does.

Every run writes into a scratch folder under names relative to it (its working directory), so
the paths the summary prints are the same in both runs. Usage::

    python benchmarks/same_output.py write /tmp/before
    python benchmarks/same_output.py write /tmp/before-large benchmarks/data/*.x0.5GB.json
    python benchmarks/same_output.py compare /tmp/before /tmp/after
    python benchmarks/same_output.py compare --charts-may-differ /tmp/before /tmp/after

``--charts-may-differ`` compares each HTML page with its charts (``<figure class="chart">``
elements) left out, and says how many pages differ only there: what a change to the charts alone
may do.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"


def _samples() -> list[Path]:
    return sorted(
        path
        for path in SAMPLES.rglob("*")
        if path.is_file() and (path.name.endswith(".json") or path.name.endswith(".json.gz"))
    )


def _name(trace: Path) -> str:
    try:
        return str(trace.resolve().relative_to(SAMPLES)).replace(os.sep, "__")
    except ValueError:
        return trace.name


def write(folder: Path, traces: list[Path]) -> None:
    """Analyze each trace and keep every output under ``folder/<name>/``."""
    environment = {**os.environ, "COLUMNS": "120", "TERM": "dumb", "NO_COLOR": "1"}
    environment.pop("TRACEINSIGHT_TIMINGS", None)
    with tempfile.TemporaryDirectory(prefix="same-output-") as scratch:
        out = Path(scratch)
        for trace in traces:
            keep = folder / _name(trace)
            keep.mkdir(parents=True, exist_ok=True)
            for stale in out.iterdir():
                stale.unlink()
            command = [
                sys.executable, "-m", "traceinsight", "analyze", str(trace.resolve()),
                "--json", "report.json", "-o", "report.html", "--markdown", "report.md",
            ]  # fmt: skip
            done = subprocess.run(command, capture_output=True, env=environment, cwd=out)
            (keep / "summary.txt").write_bytes(done.stdout + b"\n--- stderr ---\n" + done.stderr)
            (keep / "status.txt").write_text(f"{done.returncode}\n")
            for made in out.iterdir():
                shutil.copyfile(made, keep / made.name)
            print(f"{trace.name}: exit {done.returncode}", flush=True)


_CHART = re.compile(rb'<figure class="chart">.*?</figure>', re.DOTALL)


def _without_charts(page: bytes) -> bytes:
    return _CHART.sub(b'<figure class="chart"></figure>', page)


def compare(before: Path, after: Path, charts_may_differ: bool = False) -> int:
    """Print every file that is missing or differs (HTML pages without their charts, with
    ``charts_may_differ``); the number of differences."""
    differences = charts_only = 0
    names = sorted({p.relative_to(before) for p in before.rglob("*") if p.is_file()}
                   | {p.relative_to(after) for p in after.rglob("*") if p.is_file()})  # fmt: skip
    for name in names:
        a, b = before / name, after / name
        if not a.exists() or not b.exists():
            print(f"only in {'after' if not a.exists() else 'before'}: {name}")
            differences += 1
        elif a.read_bytes() != b.read_bytes():
            if (
                charts_may_differ
                and name.suffix == ".html"
                and _without_charts(a.read_bytes()) == _without_charts(b.read_bytes())
            ):
                charts_only += 1
                continue
            print(f"differs: {name}")
            differences += 1
    charts = f" ({charts_only} pages differ in their charts only)" if charts_may_differ else ""
    print(f"{len(names)} files compared, {differences} differ{charts}")
    return differences


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    writing = commands.add_parser("write", help="analyze the traces, keep their outputs in DIR")
    writing.add_argument("folder", type=Path)
    writing.add_argument("traces", type=Path, nargs="*", help="default: every sample trace")
    comparing = commands.add_parser("compare", help="compare two folders made by write")
    comparing.add_argument(
        "--charts-may-differ", action="store_true", help="compare HTML pages without their charts"
    )
    comparing.add_argument("before", type=Path)
    comparing.add_argument("after", type=Path)
    options = parser.parse_args()
    if options.command == "write":
        write(options.folder, options.traces or _samples())
    else:
        sys.exit(1 if compare(options.before, options.after, options.charts_may_differ) else 0)


if __name__ == "__main__":
    main()
