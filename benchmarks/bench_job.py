"""Benchmark `analyze` on distributed jobs: N-rank jobs from a real rank trace, locally and on dask.

Each job is made once by ``tests/jobbuild.py`` (copies of ``sample_traces/two_ranks/rank-0``,
shifted, with one DataLoader-starved and one per-step-sync rank planted), in ``--cache``. Then for
each N and each way of running, :func:`traceinsight.commands.job.analyze_job_and_write` (the
``analyze DIR`` path: discovery, per-rank analysis, combining, JSON) runs in a fresh child process:

- ``local``: the default process pool (sized to cores and memory);
- ``dask``: a ``LocalCluster(processes=True, n_workers=2, threads_per_worker=1)`` started in the child
  before the clock starts (its start-up is printed apart).

Printed per run: wall time of the job, ranks/s, and maximum RSS — of the largest single process
(the job's main process or any worker) and of the whole process tree at once (RSS summed over the
child and every descendant, polled every 50 ms with psutil; pages shared after fork count in each
process, so the sum overstates). For scale: the JSON size of one rank and of all ranks, and the
maximum RSS of ``analyze`` on one rank alone. The stragglers found are checked against the plan.

With ``--ahead`` the jobs are ``jobbuild.AheadPlan`` ones instead (small synthetic ranks whose
collectives end together: a DataLoader rank and an ``.item()`` rank, 3 steps, 3.0 ms transfer), for
many ranks at little cost per rank: the combining step (the wait/transfer split over every rank's
small table of collectives) is then a larger share of the job, and "one rank alone" is one of them.
For ``dask`` it also prints each worker's own maximum RSS (``ru_maxrss``, asked of the workers after
the job: no poll misses a peak) against two baselines of one rank: ``analyze_rank`` alone in a bare
process (``ru_maxrss``), and a worker of the same cluster that analyzed one rank through
:func:`~traceinsight.job.execute.run_dask` (``ru_maxrss``), which holds what any dask worker holds
(distributed, tornado, the worker's own state: about 30 MiB more here).

Run::

    python benchmarks/bench_job.py                 # N = 8, 64, 256; local and dask
    python benchmarks/bench_job.py --ranks 64 --modes local
    python benchmarks/bench_job.py --ahead --ranks 1000 --modes dask
"""

from __future__ import annotations

import argparse
import contextlib
import gzip
import json
import os
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from jobbuild import BASE, AheadPlan, Plan, make_ahead_job, make_job  # noqa: E402

CHILD = """
import json, sys, time
from pathlib import Path
from traceinsight.commands.job import JobOptions, analyze_job_and_write
from traceinsight.commands.options import Reading, Wanted

if __name__ == "__main__":
    folder, mode, out = Path(sys.argv[1]), sys.argv[2], sys.argv[3]
    address, started = None, time.perf_counter()
    if mode == "dask":
        from distributed import LocalCluster
        cluster = LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None)
        address = cluster.scheduler_address
    setup = time.perf_counter() - started
    started = time.perf_counter()
    job = analyze_job_and_write([folder], Wanted(write_html=False, json=out), Reading(), JobOptions(dask=address),
                                console=__import__("rich.console").console.Console(file=open("/dev/null", "w")))
    wall = time.perf_counter() - started
    peaks = []
    if mode == "dask":  # each worker's own maximum RSS, as the kernel counts it (no polling missed)
        from distributed import Client
        with Client(address) as client:
            peaks = list(client.run(_maxrss).values())
    print(json.dumps({"wall": wall, "setup": setup, "stragglers": [s.rank for s in job.stragglers],
                      "worker_maxrss": max(peaks, default=0)}))
"""

MAXRSS = """
def _maxrss():
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
"""

ONE_RANK_DASK = """
import sys
from distributed import Client, LocalCluster
from traceinsight.job import RankTask
from traceinsight.job.execute import run_dask
from traceinsight.thresholds import Thresholds

if __name__ == "__main__":
    cluster = LocalCluster(processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None)
    run_dask([RankTask(sys.argv[1], 0, 0, Thresholds())], cluster.scheduler_address)
    with Client(cluster.scheduler_address) as client:
        print(max(client.run(_maxrss).values()))
"""

ONE_RANK = """
import resource, sys
from pathlib import Path
from traceinsight.job import RankTask, analyze_rank
from traceinsight.thresholds import Thresholds
analyze_rank(RankTask(sys.argv[1], 0, 0, Thresholds()))
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)
"""


def _poll(process: psutil.Process, peaks: dict[str, int], stop: threading.Event) -> None:
    while not stop.is_set():
        try:
            tree = [process, *process.children(recursive=True)]
        except psutil.NoSuchProcess:
            return
        sizes = []
        for member in tree:
            with contextlib.suppress(psutil.Error):
                sizes.append(member.memory_info().rss)
        peaks["sum"] = max(peaks["sum"], sum(sizes))
        peaks["single"] = max(peaks["single"], max(sizes, default=0))
        if sizes:  # the job's own process first, then its workers (and the dask scheduler)
            peaks["main"] = max(peaks["main"], sizes[0])
            peaks["worker"] = max(peaks["worker"], max(sizes[1:], default=0))
        stop.wait(0.05)


def run_job(folder: Path, mode: str) -> dict[str, object]:
    """One job in a fresh child process: its own figures and the process tree's peaks."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "job.json"
        child = psutil.Popen(
            [sys.executable, "-c", MAXRSS + CHILD, str(folder), mode, str(out)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=scratch,
            env={**os.environ, "PYTHONWARNINGS": "ignore"},
        )
        peaks = {"sum": 0, "single": 0, "main": 0, "worker": 0}
        stop = threading.Event()
        poller = threading.Thread(target=_poll, args=(child, peaks, stop), daemon=True)
        poller.start()
        stdout, stderr = child.communicate()
        stop.set()
        poller.join()
        if child.returncode != 0:
            raise SystemExit(f"{mode} job on {folder} failed:\n{stderr[-3000:]}")
        figures = json.loads(stdout.strip().splitlines()[-1])
        return {**figures, **peaks}


def one_rank_peak(path: Path = BASE) -> int:
    done = subprocess.run(
        [sys.executable, "-c", ONE_RANK, str(path)], capture_output=True, text=True, check=True
    )
    return int(done.stdout.strip())


def one_rank_dask_peak(path: Path) -> int:
    """The maximum RSS of a dask worker (same cluster as ``dask`` jobs) that analyzed one rank."""
    done = subprocess.run(
        [sys.executable, "-c", MAXRSS + ONE_RANK_DASK, str(path)],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    return int(done.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--ranks", type=int, nargs="+", default=[8, 64, 256])
    parser.add_argument("--modes", nargs="+", default=["local", "dask"], choices=["local", "dask"])
    parser.add_argument("--cache", type=Path, default=Path(tempfile.gettempdir()) / "traceinsight-bench-jobs")
    parser.add_argument(
        "--ahead", action="store_true", help="jobbuild.AheadPlan jobs (small synthetic ranks)"
    )
    args = parser.parse_args()
    if args.ahead:
        ahead(args)
        return
    rank_json = len(gzip.decompress(BASE.read_bytes()))
    cores = len(os.sched_getaffinity(0))
    print(f"machine: {cores} cores, {psutil.virtual_memory().total / 2**30:.1f} GiB; one rank: "
          f"{rank_json / 1e6:.1f} MB of JSON; analyze_rank on one rank alone: max RSS "
          f"{one_rank_peak() / 2**20:.0f} MiB")  # fmt: skip
    print(f"{'ranks':>5} {'mode':>5} {'JSON (all)':>10} {'wall s':>7} {'ranks/s':>7} "
          f"{'max RSS 1 proc':>14} {'max RSS tree':>12} {'setup s':>7}  stragglers")  # fmt: skip
    for ranks in args.ranks:
        folder = args.cache / f"job{ranks}"
        plan = Plan(ranks, dataloader_rank=ranks // 3, sync_rank=(2 * ranks) // 3)
        if not (folder / f"rank-{ranks - 1}.json.gz").exists():
            make_job(folder, plan)
        for mode in args.modes:
            figures = run_job(folder, mode)
            wall = float(figures["wall"])  # type: ignore[arg-type]
            found = figures["stragglers"]
            check = "ok" if sorted(found) == sorted([plan.dataloader_rank, plan.sync_rank]) else "MISMATCH"  # type: ignore[arg-type]
            print(f"{ranks:>5} {mode:>5} {ranks * rank_json / 1e6:>8.0f}MB {wall:>7.1f} {ranks / wall:>7.1f} "
                  f"{int(figures['single']) / 2**20:>10.0f} MiB {int(figures['sum']) / 2**20:>8.0f} MiB "  # type: ignore[call-overload]
                  f"{float(figures['setup']):>7.1f}  {found} {check}", flush=True)  # type: ignore[arg-type]  # fmt: skip


def ahead(args: argparse.Namespace) -> None:
    """The ``--ahead`` jobs (see the module doc)."""
    for ranks in args.ranks:
        folder = args.cache / f"ahead{ranks}"
        plan = AheadPlan(
            ranks, dataloader_rank=ranks // 3, item_rank=(2 * ranks) // 3, allreduce_us=3000, steps=3
        )
        if not (folder / f"rank-{ranks - 1}.json").exists():
            make_ahead_job(folder, plan)
        one = one_rank_peak(folder / "rank-0.json")
        one_dask = one_rank_dask_peak(folder / "rank-0.json") if "dask" in args.modes else 0
        size = sum(path.stat().st_size for path in folder.glob("rank-*.json"))
        print(
            f"{ranks} ranks, {size / 1e6:.0f} MB of JSON; analyze_rank on one rank alone: max RSS {one / 2**20:.0f} MiB"
            + (f"; a dask worker that analyzed one rank: {one_dask / 2**20:.0f} MiB" if one_dask else "")
        )
        for mode in args.modes:
            figures = run_job(folder, mode)
            wall = float(figures["wall"])  # type: ignore[arg-type]
            found = sorted(figures["stragglers"])  # type: ignore[call-overload]
            check = "ok" if found == sorted([plan.dataloader_rank, plan.item_rank]) else "MISMATCH"
            worker, main = int(figures["worker"]), int(figures["main"])  # type: ignore[call-overload]
            print(f"{ranks:>5} {mode:>5} wall {wall:.1f} s, max RSS of a worker {worker / 2**20:.0f} MiB "
                  f"({worker / one:.2f}x one rank alone), of the job's process {main / 2**20:.0f} MiB "
                  f"({main / one:.2f}x), tree {int(figures['sum']) / 2**20:.0f} MiB; "  # type: ignore[call-overload]
                  f"stragglers {found} {check}", flush=True)  # fmt: skip
            if mode == "dask":
                exact = int(figures["worker_maxrss"])  # type: ignore[call-overload]
                print(f"{ranks:>5}  dask a worker's own max RSS {exact / 2**20:.0f} MiB: {exact / one:.2f}x one rank "
                      f"alone, {exact / one_dask:.2f}x a dask worker that analyzed one rank", flush=True)  # fmt: skip


if __name__ == "__main__":
    main()
