"""Issue 30's DataLoader criterion on pairs: each loader shape alone and under `run`, one after the other.

For each of ``--pairs`` pairs (the order alternating: alone first, then `run` first), runs the
shape alone and under `run` (``run_harness.measure``, default options) and prints one row: the
batches timed in the loop alone (``FETCH_MS``, loop indices 3-7, the steps `run` records), the
trace's median ``enumerate(DataLoader)#…__next__`` per recorded step under `run`, the report's
card, the fetch's CPU time in the loop alone and under `run` (``FETCH_CPU_MS``, this thread's),
and the ratio (the criterion: trace ÷ alone ≤ 1.5 on every pair). Then the medians and how many
pairs pass. Use it on a quiet machine: on shared cores one pair in three moves 1.5-2 × with
other work (``benchmarks/README.md``).

Run::

    python benchmarks/loader_pairs.py --pairs 5                       # stack-walk and mnist
    python benchmarks/loader_pairs.py --pairs 3 --only stack-walk --python python3
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from run_harness import GB, Measured, _env, _fresh, measure, shapes


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--pairs", type=int, default=5)
    parser.add_argument("--only", nargs="*", default=["stack-walk", "mnist"])
    parser.add_argument("--python", default=sys.executable, help="the Python with torch")
    parser.add_argument("--timeout", type=float, default=600.0)
    args = parser.parse_args()
    failed = 0
    for shape in shapes(args.python, 1):
        if shape.name not in args.only or not shape.loader:
            continue
        print(f"\n{shape.name} (CPUs: {os.cpu_count()}), per batch in ms, CPU time in brackets:")
        print("| pair | order | alone (CPU) | run: trace, card (CPU) | ratio (CPU) | wall s alone / run |")
        print("|---|---|---|---|---|---|")
        ratios: list[float] = []
        cpu_ratios: list[float] = []
        for pair in range(args.pairs):
            work = Path(tempfile.mkdtemp(prefix=f"loader-pairs-{shape.name}-"))
            order = ("alone", "run") if pair % 2 == 0 else ("run", "alone")
            got: dict[str, Measured] = {}
            for which in order:
                words = shape.alone if which == "alone" else shape.under_run
                got[which] = measure(words, _fresh(work / which), _env(None, work / f"cache-{which}"),
                                     12 * GB, args.timeout)  # fmt: skip
            alone, run = got["alone"], got["run"]
            fetch, cpu_alone = alone.line_value("FETCH_MS"), alone.line_value("FETCH_CPU_MS")
            trace, card, cpu_run = (
                run.loader_ms_per_step(),
                run.report_loader_ms(),
                run.line_value("FETCH_CPU_MS"),
            )
            if fetch is None or trace is None or cpu_alone is None or cpu_run is None:
                print(
                    f"| {pair + 1} | {order[0]} first | no figure: exit {alone.exit_status} / {run.exit_status} |"
                )
                print("\n".join(run.output.splitlines()[-15:]))
                failed += 1
                continue
            ratio, cpu_ratio = trace / fetch, cpu_run / cpu_alone
            ratios.append(ratio)
            cpu_ratios.append(cpu_ratio)
            mark = "**" if ratio > 1.5 else ""
            print(
                f"| {pair + 1} | {order[0]} first | {fetch:.1f} ({cpu_alone:.1f}) "
                f"| {trace:.1f}, {card if card is None else f'{card:.1f}'} ({cpu_run:.1f}) "
                f"| {mark}{ratio:.2f}{mark} ({cpu_ratio:.2f}) | {alone.wall_s:.1f} / {run.wall_s:.1f} |",
                flush=True,
            )
            shutil.rmtree(work, ignore_errors=True)
        if ratios:
            within = sum(ratio <= 1.5 for ratio in ratios)
            failed += len(ratios) - within
            print(
                f"median ratio {statistics.median(ratios):.2f} (CPU {statistics.median(cpu_ratios):.2f}), "
                f"worst {max(ratios):.2f}; {within} of {len(ratios)} pairs within 1.5 x"
            )
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
