"""`traceinsight run` on real script shapes: each alone and under `run`, with the criteria asserted.

Shapes (``benchmarks/run_scripts/``, all CPU), measured (alone vs under `run`: wall time, time per
step, maximum RSS, trace size, and for the DataLoader shapes the time per batch):

- ``lbfgs``: issue 30's LBFGS shape, ``max_iter=8`` over a 400-step ``LSTMCell`` loop, 6 steps,
  default options (the 2 GiB budget): max RSS under `run` must stay within alone + 2 GiB, and
  nothing may be said of a stop that did not happen;
- ``stack-walk``: a Dataset that reseeds torch and formats the Python stack per sample;
- ``mnist``: pytorch/examples' mnist on a FakeData-like dataset written without torchvision (its
  PyPI build does not import beside this torch), with the same Python work per sample (reseeding,
  ToPILImage, ToTensor, Normalize, ``target.item()``);
- ``compile``: a small conv net (2 conv + linear) under ``torch.compile`` (inductor, a fresh
  cache per run so both runs compile);

and checked for parity only:

- ``own-profiler`` / ``own-profiler-scheduled``: the script's own ``torch.profiler.profile``;
- ``fails``: raises a ValueError at a known line after 10 steps;
- ``help``: ``--help`` (exits before its first step);
- ``torchrun`` / ``run-m-torchrun``: a 2-rank gloo DDP job, ``torchrun … traceinsight run`` and
  ``traceinsight run -m torch.distributed.run …``, each run ``--repeat`` times (default 10).

What is measured. Wall time and maximum RSS of the process tree (the largest maximum RSS of any of
its processes: ``getrusage(RUSAGE_CHILDREN)`` in a fresh measuring process per run); a run whose
tree passes ``--kill-at`` (default 12 GB) is killed and reported so. Time per step alone: the
script's own median (its ``STEP_MS`` line); under `run`: the median of the recorded steps as the
report gives it (``steady_state.step_time_us`` of ``--json``). The DataLoader per step: alone, the
script's ``FETCH_MS`` line (the median wait for a batch in the loop, at the loop indices 3-7 that
`run` records by default; a batch made between two training steps took 1.5-1.65 × one made in a
loop of batches alone, measured, so the loader timed on its own after training, ``LOADER_MS``, is
no baseline); under `run`: the time per step the report's ``dataloader-stall`` card gives (the
median steady step's) and the median of ``enumerate(DataLoader)#…__next__`` per recorded step,
read from the trace; and the fetch's CPU time in the loop (``FETCH_CPU_MS``, this thread's: other
work on the machine does not count), alone and under `run`. The trace's size: the gzip file and
its JSON (from `run`'s "trace written" line).

Checked: the same exit status alone and under `run`; peak RSS under `run` ≤ 2 × alone + 1 GB
(``lbfgs`` instead: ≤ alone + 2 GiB, and no "disableProfiler called" nor "stopped early" in its output);
the DataLoader per recorded step under `run` (the trace's median) ≤ 1.5 × ``FETCH_MS`` alone
(on 2 cores shared with other work, the same batches differed by up to 2 × between runs); no
run killed or hung (``--timeout``); for the torchrun shapes, distinct per-rank files every time
and each rank's JSON with its own rank and its own operator counts (rank 1 runs twice the matmuls).

Run::

    python benchmarks/run_harness.py                    # everything (about an hour on 2 busy cores)
    python benchmarks/run_harness.py --only mnist help  # some shapes
    python benchmarks/run_harness.py --pythonpath /tmp/old  # `run` from another tree (before/after)
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
SCRIPTS = HERE / "run_scripts"
REPO = HERE.parent
GB = 1 << 30


@dataclass
class Measured:
    """One process tree's run."""

    exit_status: int
    wall_s: float
    peak_rss: int
    killed: str | None = None
    output: str = ""
    files: list[str] = field(default_factory=list)
    folder: Path | None = None

    def line_value(self, key: str) -> float | None:
        """The number on the script's ``KEY value`` line (``STEP_MS``, ``FETCH_MS``)."""
        found = re.findall(rf"^{key} ([\d.]+)$", self.output, re.MULTILINE)
        return float(found[-1]) if found else None

    def trace_sizes(self) -> tuple[float, float] | None:
        """(gzip MB, JSON MB) from `run`'s "trace written" line."""
        found = re.findall(r"trace written: \S+ \(([\d.]+) MB, ([\d.]+) MB of JSON", self.output)
        return (float(found[-1][0]), float(found[-1][1])) if found else None

    def report_step_ms(self) -> float | None:
        """The median recorded step of the report (``--json run.json``)."""
        document = self._document()
        value = document.get("steady_state", {}).get("step_time_us") if document else None
        return None if value is None else value / 1000

    def loader_ms_per_step(self) -> float | None:
        """Time in the DataLoader's ``__next__`` per recorded step, from the trace."""
        traces = [f for f in self.files if f.endswith(".pt.trace.json.gz")]
        if self.folder is None or not traces:
            return None
        with gzip.open(self.folder / traces[0], "rt", encoding="utf-8") as stream:
            events = json.load(stream)["traceEvents"]
        steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
        fetches = [
            e
            for e in events
            if e.get("cat") == "user_annotation"
            and str(e.get("name", "")).startswith("enumerate(DataLoader)#")
            and str(e.get("name", "")).endswith("__next__")
        ]
        per_step = [
            sum(
                float(f["dur"])
                for f in fetches
                if float(s["ts"]) <= float(f["ts"]) < float(s["ts"]) + float(s["dur"])
            )
            for s in steps
        ]
        return statistics.median(per_step) / 1000 if per_step else None

    def report_loader_ms(self) -> float | None:
        """The DataLoader time per step the report's ``dataloader-stall`` card gives (the median step's)."""
        document = self._document()
        findings = document.get("findings", []) if document else []
        for finding in findings if isinstance(findings, list) else []:
            if finding.get("rule") == "dataloader-stall":
                said = str(finding.get("evidence", {}).get("time in DataLoader __next__", ""))
                found = re.match(r"(?:median )?([\d.]+) ms per step", said)
                return float(found[1]) if found else None
        return None

    def _document(self) -> dict[str, Any] | None:
        if self.folder is None or not (self.folder / "run.json").is_file():
            return None
        document: dict[str, Any] = json.loads((self.folder / "run.json").read_text(encoding="utf-8"))
        return document


@dataclass(frozen=True)
class Shape:
    """A script shape: how to run it alone and under `run`."""

    name: str
    alone: list[str]
    under_run: list[str]
    repeat: int = 1
    distributed: bool = False
    measured: bool = False
    loader: bool = False


def shapes(python: str, repeat: int) -> list[Shape]:
    """Every shape, with the words to run it alone and under `run`."""
    traceinsight = [python, "-m", "traceinsight", "run"]
    measured = [*traceinsight, "--json", "run.json"]
    torchrun = [python, "-m", "torch.distributed.run", "--nproc-per-node", "2"]
    ddp = str(SCRIPTS / "ddp_gloo.py")
    lbfgs = [str(SCRIPTS / "lbfgs_lstm.py"), "--max-iter", "8", "--length", "401", "--steps", "6"]
    own = str(SCRIPTS / "own_profiler.py")
    walk = str(SCRIPTS / "stack_walk_dataset.py")
    mnist = str(SCRIPTS / "mnist_fakedata.py")
    compiled = str(SCRIPTS / "compiled_convnet.py")
    return [
        Shape("lbfgs", [python, *lbfgs], [*measured, *lbfgs], measured=True),
        Shape("stack-walk", [python, walk], [*measured, walk], measured=True, loader=True),
        Shape("mnist", [python, mnist], [*measured, mnist], measured=True, loader=True),
        Shape("compile", [python, compiled], [*measured, compiled], measured=True),
        Shape("own-profiler", [python, own], [*traceinsight, own]),
        Shape("own-profiler-scheduled", [python, own, "--scheduled"], [*traceinsight, own, "--scheduled"]),
        Shape("fails", [python, str(SCRIPTS / "fails_after_steps.py")],
              [*traceinsight, str(SCRIPTS / "fails_after_steps.py")]),
        Shape("help", [python, str(SCRIPTS / "fails_after_steps.py"), "--help"],
              [*traceinsight, str(SCRIPTS / "fails_after_steps.py"), "--help"]),
        Shape("torchrun", [*torchrun, ddp],
              [*torchrun, "-m", "traceinsight", "run", "--json", "ddp.json", ddp],
              repeat=repeat, distributed=True),
        Shape("run-m-torchrun", [*torchrun, ddp],
              [*traceinsight, "--json", "ddp.json", "-m", "torch.distributed.run", "--nproc-per-node", "2", ddp],
              repeat=repeat, distributed=True),
    ]  # fmt: skip


MEASURE = r"""
import json, os, resource, signal, subprocess, sys, threading, time
cap, timeout, words = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
start = time.perf_counter()
child = subprocess.Popen(words, start_new_session=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
killed = []
def tree_rss():
    total = 0
    for pid in os.listdir('/proc'):
        if not pid.isdigit():
            continue
        try:
            with open(f'/proc/{pid}/stat') as f:
                fields = f.read().rsplit(')', 1)[1].split()
            if int(fields[2]) == child.pid or int(pid) == child.pid:
                total += int(fields[21]) * 4096
        except (OSError, IndexError, ValueError):
            pass
    return total
def watch():
    while child.poll() is None:
        if tree_rss() > cap:
            killed.append(f'killed at {tree_rss() / 2**30:.1f} GB after {time.perf_counter() - start:.0f} s')
            os.killpg(child.pid, signal.SIGKILL)
            return
        if time.perf_counter() - start > timeout:
            killed.append(f'hung: killed after {timeout:.0f} s')
            os.killpg(child.pid, signal.SIGKILL)
            return
        time.sleep(0.2)
threading.Thread(target=watch, daemon=True).start()
output = child.stdout.read().decode(errors='replace')
status = child.wait()
wall = time.perf_counter() - start
peak = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({'exit_status': status, 'wall_s': wall, 'peak_rss': peak,
                  'killed': killed[0] if killed else None, 'output': output[-20000:]}))
"""


def measure(words: list[str], folder: Path, env: dict[str, str], kill_at: int, timeout: float) -> Measured:
    """Run ``words`` in ``folder`` from a fresh measuring process; the files it left there."""
    before = set(_files(folder))
    result = subprocess.run(
        [sys.executable, "-c", MEASURE, str(kill_at), str(timeout), *words],
        cwd=folder, env=env, capture_output=True, text=True, check=True,
    )  # fmt: skip
    record = json.loads(result.stdout)
    status = record["exit_status"]
    if status < 0:
        status = 128 - status  # as a shell shows death by a signal
    files = sorted(set(_files(folder)) - before)
    return Measured(
        status, record["wall_s"], record["peak_rss"], record["killed"], record["output"], files, folder
    )


def _files(folder: Path) -> list[str]:
    return [str(path.relative_to(folder)) for path in folder.rglob("*") if path.is_file()]


def _env(pythonpath: str | None, cache: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (pythonpath or str(REPO), env.get("PYTHONPATH")) if p)
    env["TORCHINDUCTOR_CACHE_DIR"] = str(cache)  # a fresh inductor cache: every run compiles
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    return env


def check_distributed(run: Measured, folder: Path) -> list[str]:
    """Per-rank files distinct and each rank's JSON with its own rank and its own numbers."""
    problems = []
    traces = sorted(f for f in run.files if ".rank" in f and f.endswith(".pt.trace.json.gz"))
    reports = sorted(f for f in run.files if ".rank" in f and f.endswith(".report.html"))
    jsons = sorted(f for f in run.files if f.startswith("ddp.rank") and f.endswith(".json"))
    if len(traces) != 2 or len(reports) != 2 or len(jsons) != 2:
        problems.append(f"expected 2 traces, 2 reports, 2 JSON, got {run.files}")
        return problems
    if len({Path(t).parent for t in traces}) != 1:
        problems.append(f"ranks wrote to different folders: {traces}")
    ranks = []
    matmuls = []
    for name, trace in zip(jsons, traces, strict=True):
        document = json.loads((folder / name).read_text(encoding="utf-8"))
        ranks.append(document["trace"]["rank"])
        if folder / document["trace"]["path"] != folder / trace:  # relative to the run's folder
            problems.append(f"{name} is the report of {document['trace']['path']}, not of {trace}")
        with gzip.open(folder / trace, "rt", encoding="utf-8") as stream:
            events = json.load(stream)["traceEvents"]
        matmuls.append(sum(1 for e in events if e.get("name") == "aten::mm" and e.get("cat") == "cpu_op"))
    if ranks != [0, 1]:
        problems.append(f"the ranks' JSON say ranks {ranks}")
    if not matmuls[1] > matmuls[0]:
        problems.append(f"rank 1 should run more aten::mm than rank 0: {matmuls}")
    summaries = run.output.count("Scorecard")
    if summaries != 1:
        problems.append(f"{summaries} summaries printed (only rank 0 prints one)")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--only", nargs="*", help="shapes to run (default: all)")
    parser.add_argument("--repeat", type=int, default=10, help="runs of each torchrun shape")
    parser.add_argument("--kill-at", type=float, default=12.0, help="GB of RSS at which a tree is killed")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds before a run counts as hung")
    parser.add_argument("--job-timeout", type=float, default=180.0, help="the same for a torchrun job")
    parser.add_argument("--pythonpath", help="import traceinsight from this tree instead of this repo")
    parser.add_argument("--python", default=sys.executable, help="the Python with torch")
    parser.add_argument("--keep", action="store_true", help="keep the work folders")
    args = parser.parse_args()
    kill_at = int(args.kill_at * GB)
    rows = []
    measured: list[str] = []
    loaders: dict[str, tuple[float | None, ...]] = {}
    failures: list[str] = []
    for shape in shapes(args.python, args.repeat):
        if args.only and shape.name not in args.only:
            continue
        work = Path(tempfile.mkdtemp(prefix=f"run-harness-{shape.name}-"))
        alone = measure(shape.alone, _fresh(work / "alone"), _env(args.pythonpath, work / "cache-alone"),
                        kill_at, args.timeout)  # fmt: skip
        runs = []
        for index in range(shape.repeat):
            folder = _fresh(work / f"run{index}")
            timeout = args.job_timeout if shape.distributed else args.timeout
            runs.append(measure(shape.under_run, folder, _env(args.pythonpath, work / f"cache{index}"),
                                kill_at, timeout))  # fmt: skip
            problems = []
            run = runs[-1]
            if run.killed:
                problems.append(run.killed)
            if run.exit_status != alone.exit_status:
                problems.append(f"exit status {run.exit_status} under run, {alone.exit_status} alone")
            if shape.name != "lbfgs" and run.peak_rss > 2 * alone.peak_rss + GB:  # lbfgs: issue 30's bound
                problems.append(
                    f"peak RSS {run.peak_rss / GB:.2f} GB > 2 x {alone.peak_rss / GB:.2f} GB + 1 GB"
                )
            if shape.name == "lbfgs":
                if run.peak_rss > alone.peak_rss + 2 * GB:
                    problems.append(
                        f"peak RSS {run.peak_rss / GB:.2f} GB > {alone.peak_rss / GB:.2f} GB + 2 GiB"
                    )
                for untrue in ("disableProfiler called", "stopped early"):
                    if untrue in run.output:
                        problems.append(f"said {untrue!r}")
            if shape.loader:
                # the trace's DataLoader time per recorded step against the same batches timed in
                # the loop of the script alone (its FETCH_MS: loop indices 3-7, the steps recorded)
                fetch_alone, loader_run = alone.line_value("FETCH_MS"), run.loader_ms_per_step()
                loaders[shape.name] = (
                    fetch_alone,
                    run.report_loader_ms(),
                    loader_run,
                    alone.line_value("FETCH_CPU_MS"),
                    run.line_value("FETCH_CPU_MS"),
                )
                if fetch_alone is None or loader_run is None:
                    problems.append("no DataLoader time alone or in the trace")
                elif loader_run > 1.5 * fetch_alone:
                    problems.append(
                        f"DataLoader {loader_run:.1f} ms per step > 1.5 x {fetch_alone:.1f} ms alone"
                    )
            if shape.name == "help" and run.files:
                problems.append(f"--help left files: {run.files}")
            if shape.distributed and not run.killed:
                problems += check_distributed(run, folder)
            failures += [f"{shape.name} run {index + 1}: {problem}" for problem in problems]
            if problems:
                print(f"--- {shape.name} run {index + 1} output (last lines):", file=sys.stderr)
                print("\n".join(run.output.splitlines()[-25:]), file=sys.stderr)
        rows.append(_row(shape, alone, runs))
        print(rows[-1], flush=True)
        if shape.measured:
            measured.append(_measured_row(shape, alone, runs[0], loaders.get(shape.name)))
            print(measured[-1], flush=True)
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print()
    if measured:
        print(
            "| shape | wall alone / run (s) | step alone / recorded under run (ms) | max RSS alone / run (GB) "
            "| trace (MB gzip / MB JSON) | DataLoader per step (ms): alone in the loop / under run: "
            "the report's card, the trace (medians) (the fetch's CPU time alone / under run) |"
        )
        print("|---|---|---|---|---|---|")
        for row in measured:
            print(row)
        print()
    print(
        "| shape | exit alone / run | wall alone / run (s) | peak RSS alone / run (GB) | files written by run |"
    )
    print("|---|---|---|---|---|")
    for row in rows:
        print(row)
    print()
    if failures:
        print("FAILED:")
        for failure in failures:
            print(f"- {failure}")
        return 1
    print("all criteria met")
    return 0


def _measured_row(
    shape: Shape,
    alone: Measured,
    run: Measured,
    loader_ms: tuple[float | None, ...] | None,
) -> str:
    """Wall, time per step, max RSS, trace size and DataLoader time: alone vs under `run`."""

    def number(value: float | None, digits: int = 1) -> str:
        return "—" if value is None else f"{value:.{digits}f}"

    sizes = run.trace_sizes()
    trace = "—" if sizes is None else f"{sizes[0]:.1f} / {sizes[1]:.1f}"
    loader = "—"
    if loader_ms is not None:
        alone_ms, card_ms, recorded_ms, cpu_alone, cpu_run = loader_ms
        loader = (
            f"{number(alone_ms)} / {number(card_ms)}, {number(recorded_ms)} "
            f"(CPU {number(cpu_alone)} / {number(cpu_run)})"
        )
    return (
        f"| {shape.name} | {alone.wall_s:.1f} / {run.wall_s:.1f} "
        f"| {number(alone.line_value('STEP_MS'))} / {number(run.report_step_ms())} "
        f"| {alone.peak_rss / GB:.2f} / {run.peak_rss / GB:.2f} | {trace} | {loader} |"
    )


def _fresh(folder: Path) -> Path:
    folder.mkdir(parents=True)
    return folder


def _row(shape: Shape, alone: Measured, runs: list[Measured]) -> str:
    statuses = sorted({run.exit_status for run in runs})
    walls = [run.wall_s for run in runs]
    peaks = [run.peak_rss for run in runs]
    wall = f"{walls[0]:.1f}" if len(runs) == 1 else f"{min(walls):.1f}–{max(walls):.1f} ({len(runs)} runs)"
    peak = f"{peaks[0] / GB:.2f}" if len(runs) == 1 else f"{max(peaks) / GB:.2f} (max)"
    killed = [run.killed for run in runs if run.killed]
    files = ", ".join(_short(f) for f in runs[0].files) or "none"
    note = f" **{len(killed)} killed/hung: {killed[0]}**" if killed else ""
    return (
        f"| {shape.name} | {alone.exit_status} / {','.join(map(str, statuses))} | {alone.wall_s:.1f} / {wall} "
        f"| {alone.peak_rss / GB:.2f} / {peak} | {files}{note} |"
    )


def _short(name: str) -> str:
    """File names without the date-time stamp (every run has its own)."""
    parts = name.split("/")
    return "/".join(
        ".".join(p for p in part.split(".") if not (p[:8].isdigit() and "-" in p)) for part in parts
    )


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.default_int_handler)
    sys.exit(main())
