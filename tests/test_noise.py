"""A diff that knows its noise: the interval and verdict of each figure (traceinsight.results.noise),
the gate that breaks only on a slowdown told apart from noise, runs pooled per side, and each fixed
finding's predicted saving beside the measured change.

The real pairs: pytorch/kineto's ResNet-50 samples, two profiler cycles of each of two runs (DataLoader
workers 0 and 4; ``sample_traces/`` holds the first cycles, ``tests/data/resnet50_cycles/`` the
second). Cycles of one run are "nothing changed"; workers 0 → 4 is a real change (~28 % faster).
Expected step times come from the raw events (``reference_split``), not from the code under test.
"""

from __future__ import annotations

import json
import math
import shutil
import statistics
from pathlib import Path

import pytest
from tracebuild import SAMPLES, read_events
from typer.testing import CliRunner

from traceinsight.commands import app
from traceinsight.results.comparison import Metric
from traceinsight.results.gate import held_back
from traceinsight.results.noise import HOST_RUN_SPREAD, estimate

runner = CliRunner()
CYCLES = Path(__file__).parent / "data" / "resnet50_cycles"
RUNS = {
    "w0c1": SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz",
    "w0c2": CYCLES / "workers0" / "worker0.1623143566756.pt.trace.json.gz",
    "w4c1": SAMPLES / "v100_resnet50_workers4.pt.trace.json.gz",
    "w4c2": CYCLES / "workers4" / "worker0.1623213129365.pt.trace.json.gz",
}


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        raise result.exception
    return result.exit_code, result.stdout, result.stderr


def raw_step_times_us(path: Path) -> list[float]:
    """Every step's time from the raw events: when each step was done minus when it began."""
    from reference_split import step_windows

    _, raw = read_events(path)
    return [(window.done - window.begin) / 1000 for window in step_windows(raw)]


@pytest.fixture(scope="module")
def stored(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each cycle's result as ``analyze --json`` writes it (each trace read once for the module)."""
    folder = tmp_path_factory.mktemp("results")
    paths = {}
    for name, trace in RUNS.items():
        paths[name] = folder / f"{name}.json"
        code, _, _ = invoke("analyze", str(trace), "--no-html", "--json", str(paths[name]))
        assert code == 0
    return paths


# --- the statistics, on numbers made here ---------------------------------------------------------


def test_identical_sides_are_no_change() -> None:
    steps = [10.0, 11.0, 9.5, 10.2, 10.4, 9.9]
    found = estimate([steps], [steps], margin=1.0)
    assert found is not None
    assert found.change == 0 and found.lower <= 0 <= found.upper and found.verdict == "no change"


def test_a_clear_shift_is_told_and_its_interval_holds_it() -> None:
    before = [100.0 + (i % 5) for i in range(40)]
    after = [value + 30 for value in before]
    found = estimate([before], [after], margin=5)
    assert found is not None
    assert found.change == pytest.approx(statistics.median(after) - statistics.median(before)) == 30
    assert found.lower <= 30 <= found.upper and found.verdict == "higher"
    backwards = estimate([after], [before], margin=5)
    assert backwards is not None and backwards.verdict == "lower"


def test_the_same_input_gives_the_same_interval() -> None:
    before, after = [[3.0, 5.0, 4.0, 8.0, 4.5]], [[4.0, 6.0, 3.5, 9.0, 5.0]]
    assert estimate(before, after) == estimate(before, after)


def test_one_run_a_side_is_at_least_as_wide_as_the_run_to_run_spread() -> None:
    """Steps that do not vary at all: the interval is the runs' spread alone, ±z·√2·sd."""
    found = estimate([[100.0] * 8], [[100.0] * 8], run_sd_before=5.0, run_sd_after=5.0, margin=1)
    assert found is not None
    half = 1.959964 * math.sqrt(5.0**2 + 5.0**2)
    assert found.lower == pytest.approx(-half) and found.upper == pytest.approx(half)
    assert found.verdict == "cannot tell"


def test_runs_that_differ_more_than_assumed_widen_a_pooled_side() -> None:
    """Two runs a side whose medians are 100 and 120: their standard deviation (14.14), not the
    smaller spread given, is the runs' part."""
    runs = [[100.0] * 5, [120.0] * 5]
    found = estimate(runs, runs, run_sd_before=1.0, run_sd_after=1.0)
    assert found is not None
    spread = statistics.stdev([100.0, 120.0])
    half = 1.959964 * math.sqrt(2 * spread**2 / 2)
    assert found.upper == pytest.approx(half, rel=0.05)


def test_an_empty_side_is_not_judged() -> None:
    assert estimate([[]], [[1.0]]) is None


# --- the gate's rule -------------------------------------------------------------------------------


def _step(before: float, after: float, verdict: str | None) -> Metric:
    return Metric("step_time", "step time", "us", before, after, lower=-1.0, upper=1.0, verdict=verdict)


@pytest.mark.parametrize(
    ("verdict", "breaks"), [("slower", True), ("cannot tell", False), ("no change", False), (None, True)]
)
def test_the_regression_budget_breaks_only_when_told_apart(verdict: str | None, breaks: bool) -> None:
    from traceinsight.results.gate import _regression

    assert bool(_regression(_step(100.0, 120.0, verdict), 5)) is breaks
    assert bool(held_back(_step(100.0, 120.0, verdict), 5)) is (verdict in ("cannot tell", "no change"))
    assert _regression(_step(100.0, 104.0, verdict), 5) == []  # within the budget: never


# --- real pairs ------------------------------------------------------------------------------------


def test_the_cycles_step_times_are_the_raw_steps(stored: dict[str, Path]) -> None:
    """The per-step figures a diff is drawn from are the trace's steady steps, as the raw events time them."""
    for name, path in stored.items():
        kept = json.loads(path.read_text())["steady_state"]["step_times_us"]
        raw = raw_step_times_us(RUNS[name])
        assert len(kept) == 6
        assert all(any(abs(value - step) <= 0.002 for step in raw) for value in kept)


@pytest.mark.parametrize(
    ("before", "after"), [("w0c1", "w0c2"), ("w0c2", "w0c1"), ("w4c1", "w4c2"), ("w4c2", "w4c1")]
)
def test_two_cycles_of_one_run_do_not_break_the_gate(
    stored: dict[str, Path], before: str, after: str, tmp_path: Path
) -> None:
    out = tmp_path / "diff.json"
    code, _, stderr = invoke(
        "diff",
        str(stored[before]),
        str(stored[after]),
        "--no-html",
        "--json",
        str(out),
        "--max-regression",
        "5",
    )
    assert code == 0
    step = next(m for m in json.loads(out.read_text())["metrics"] if m["key"] == "step_time")
    assert step["verdict"] == "cannot tell" and step["lower"] < 0 < step["upper"]
    grew = statistics.median(step["after_steps"]) / statistics.median(step["before_steps"]) - 1
    assert step["relative"] == pytest.approx(grew, abs=1e-4)
    if grew > 0.05:  # over the budget, held back: the line says so and what would tell
        assert "not broken" in stderr and "more runs a side" in stderr


def test_the_real_change_is_faster_with_an_interval(stored: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "diff.json"
    code, stdout, _ = invoke(
        "diff", str(stored["w0c1"]), str(stored["w4c1"]), "--no-html", "--json", str(out)
    )
    assert code == 0
    # The verdict first, with its interval and what it rests on, before the table.
    headline = stdout.index("step time faster by")
    assert (
        headline < stdout.index("Before and after") and "6 steps before and 6 after, one run a side" in stdout
    )
    document = json.loads(out.read_text())
    assert document["schema"] == 3 and document["before_runs"] == document["after_runs"] == 1
    step = next(m for m in document["metrics"] if m["key"] == "step_time")
    before = statistics.median(raw_step_times_us(RUNS["w0c1"])[:6])
    after = statistics.median(raw_step_times_us(RUNS["w4c1"])[:6])
    assert step["before"] == pytest.approx(before, abs=0.01) and step["after"] == pytest.approx(
        after, abs=0.01
    )
    assert step["verdict"] == "faster" and step["lower"] <= step["change"] <= step["upper"] < 0
    # One run a side: the interval is at least what the runs' spread alone gives.
    assert step["upper"] - step["lower"] >= 2 * 1.959964 * HOST_RUN_SPREAD * math.hypot(before, after) - 0.01
    gpu = next(m for m in document["metrics"] if m["key"] == "gpu_work")
    assert gpu["verdict"] == "no change"  # the GPU's own work did not move; the host side did
    assert any("DataLoader" in line for line in document["moved"])


def test_the_real_change_reversed_breaks_the_gate(stored: dict[str, Path]) -> None:
    code, _, stderr = invoke(
        "diff", str(stored["w4c1"]), str(stored["w0c1"]), "--no-html", "--max-regression", "5"
    )
    assert code == 1 and "told apart from noise" in stderr


def _cycles_folder(tmp: Path, workers: str) -> Path:
    """A folder holding one run's two cycles, as ``tensorboard_trace_handler`` names them."""
    folder = tmp / f"workers{workers}"
    folder.mkdir()
    first = RUNS[f"w{workers}c1"]
    stamp = {"0": "1623143089861", "4": "1623212756351"}[workers]
    shutil.copy(first, folder / f"worker0.{stamp}.pt.trace.json.gz")
    second = RUNS[f"w{workers}c2"]
    shutil.copy(second, folder / second.name)
    return folder


def test_two_cycles_a_side_are_pooled(tmp_path: Path) -> None:
    before, after = _cycles_folder(tmp_path, "0"), _cycles_folder(tmp_path, "4")
    out = tmp_path / "pooled.json"
    code, stdout, _ = invoke(
        "diff", str(before), str(after), "--no-html", "--json", str(out), "--max-regression", "5"
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert document["before_runs"] == document["after_runs"] == 2
    assert document["before_steps"] == document["after_steps"] == 12
    assert any("pooled 2 runs" in note for note in document["notes"]) and "pooled" in stdout
    step = next(m for m in document["metrics"] if m["key"] == "step_time")
    pooled_before = statistics.median(
        raw_step_times_us(RUNS["w0c1"])[:6] + raw_step_times_us(RUNS["w0c2"])[:6]
    )
    assert step["before"] == pytest.approx(pooled_before, abs=0.01)
    assert step["verdict"] == "faster"
    code, _, stderr = invoke("diff", str(after), str(before), "--no-html", "--max-regression", "5")
    assert code == 1 and "told apart from noise" in stderr


def test_the_api_pools_a_folder_of_cycles_as_the_command_does(tmp_path: Path) -> None:
    """`traceinsight.diff` of two folders of one run's cycles is the command's pooled comparison,
    byte for byte (before the command ran on the API, the API compared them as two jobs)."""
    import traceinsight
    from traceinsight.results import Comparison

    before, after = _cycles_folder(tmp_path, "0"), _cycles_folder(tmp_path, "4")
    out = tmp_path / "pooled.json"
    code, _, _ = invoke("diff", str(before), str(after), "--no-html", "--json", str(out))
    assert code == 0
    comparison = traceinsight.diff(before, after)
    assert isinstance(comparison, Comparison)
    assert comparison.before_runs == comparison.after_runs == 2
    pooled_after = statistics.median(
        raw_step_times_us(RUNS["w4c1"])[:6] + raw_step_times_us(RUNS["w4c2"])[:6]
    )
    assert comparison.metric("step_time").after == pytest.approx(pooled_after, abs=0.01)
    assert comparison.to_json() == out.read_text()


def test_predicted_beside_measured_in_every_output(stored: dict[str, Path], tmp_path: Path) -> None:
    out, markdown, page = tmp_path / "d.json", tmp_path / "d.md", tmp_path / "d.html"
    code, stdout, _ = invoke(
        "diff",
        str(stored["w0c1"]),
        str(stored["w4c1"]),
        "--json",
        str(out),
        "--markdown",
        str(markdown),
        "-o",
        str(page),
    )
    assert code == 0
    document = json.loads(out.read_text())
    (prediction,) = document["predictions"]
    fixed = next(f for f in document["findings"] if f["status"] == "fixed")
    assert prediction["rule"] == fixed["rule"] == "dataloader-stall"
    assert prediction["predicted_us"] == fixed["before_savings_us"]
    step = next(m for m in document["metrics"] if m["key"] == "step_time")
    dataloader = next(m for m in document["idle_by_cause"] if m["key"] == "idle:dataloader")
    assert prediction["measured_step_us"] == pytest.approx(step["after"] - step["before"], abs=0.01)
    assert prediction["measured_target_us"] == pytest.approx(
        dataloader["after"] - dataloader["before"], abs=0.01
    )
    assert dataloader["after"] == 0 and dataloader["verdict"] == "lower"
    words = "predicted 58.82 ms; measured: step −50.76 ms, idle: waiting for the DataLoader −47.54 ms"
    assert words in stdout.replace("\n", " ").replace("  ", " ") or words.split(";")[0] in stdout
    assert words in markdown.read_text().replace("\\", "")
    html = page.read_text()
    assert "Predicted and measured" in html and all(
        value in html for value in ("58.82 ms", "−50.76 ms", "−47.54 ms")
    )
    assert 'class="dots"' in page.read_text()  # each figure's steps as dots


# --- a run starved of CPU ----------------------------------------------------------------------------


def _with_usage(path: Path, wait_share: float) -> Path:
    """The stored result at ``path`` as if ``run`` had measured its steps: each step's thread waited
    ``wait_share`` of the step for a CPU, on a 2-core machine under load 8."""
    from traceinsight.results import Result
    from traceinsight.results.trace import RunContext, StepUsage

    result = Result.from_json(path.read_bytes())
    usage = tuple(
        StepUsage(round(step * 1000), round(step * 400), round(step * 1000 * wait_share), 8.0)
        for step in json.loads(path.read_text())["steady_state"]["step_times_us"]
    )
    run = RunContext(
        command="traceinsight run train.py", script="train.py", started="2026-12-05T10:00:00+00:00",
        torch_version="2.13.0", elapsed_s=9.0, exit_status=0, failure=None, steps_recorded=6,
        cores=2, step_usage=usage,
    )  # fmt: skip
    out = path.with_name(f"{path.stem}-waited{round(wait_share * 100)}.json")
    out.write_text(result.replace(run=run).to_json())
    return out


def _the_after_run_was_starved(fast: Path, slow: Path, tmp_path: Path) -> None:
    """``diff fast slow`` with the README's gate: the slower side starved of CPU (60 % of its steps
    waiting for one, 2 % before) is the machine's doing: cannot tell, said, exit 0."""
    out = tmp_path / "d.json"
    code, stdout, _ = invoke(
        "diff", str(fast), str(slow), "--no-html", "--json", str(out), "--max-regression", "5"
    )
    assert code == 0
    document = json.loads(out.read_text())
    step = next(m for m in document["metrics"] if m["key"] == "step_time")
    assert step["verdict"] == "cannot tell" and step["lower"] > 0  # the interval alone would say slower
    assert any(
        line.startswith("the after run was starved of CPU: its steps waited 60%")
        for line in document["moved"]
    )
    assert "starved of CPU" in stdout


def test_a_slower_run_starved_of_cpu_does_not_break_the_gate(stored: dict[str, Path], tmp_path: Path) -> None:
    """workers 4 → 0 is slower (exit 1 above); with the slower run's steps waiting 60 % of their
    time for a CPU and the other's 2 %, the difference is the machine's: cannot tell, exit 0."""
    _the_after_run_was_starved(_with_usage(stored["w4c1"], 0.02), _with_usage(stored["w0c1"], 0.6), tmp_path)
    # The faster side starved instead: the slowdown stands.
    code, _, _ = invoke(
        "diff", str(_with_usage(stored["w4c1"], 0.6)), str(_with_usage(stored["w0c1"], 0.02)), "--no-html",
        "--max-regression", "5",
    )  # fmt: skip
    assert code == 1


TRAIN = """\
import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
data, target = torch.randn(32, 64), torch.randint(0, 10, (32,))
for _ in range(20):
    optimizer.zero_grad()
    torch.nn.functional.cross_entropy(model(data), target).backward()
    optimizer.step()
"""


def test_two_identical_cpu_runs_pass_the_readmes_gate(tmp_path: Path) -> None:
    """The README's CI recipe on CPU when nothing changed: two runs of one script under ``run``,
    diffed with its budgets, exit 0; each run measured its steps' CPU time and load."""
    import subprocess
    import sys

    pytest.importorskip("torch")
    (tmp_path / "train.py").write_text(TRAIN)
    repo = Path(__file__).resolve().parent.parent
    env = {**__import__("os").environ, "PYTHONPATH": str(repo)}
    for name in ("baseline.json", "result.json"):
        done = subprocess.run(
            [sys.executable, "-m", "traceinsight", "run", "--json", name, "--no-html", "train.py"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        run = json.loads((tmp_path / name).read_text())["run"]
        assert run["cores"] and len(run["step_usage"]) == 5
        assert all(wall > 0 and cpu > 0 for wall, cpu, _, _ in run["step_usage"])
    code, _, stderr = invoke(
        "diff", str(tmp_path / "baseline.json"), str(tmp_path / "result.json"), "--no-html",
        "--fail-on", "high", "--max-syncs-per-step", "1", "--max-regression", "5",
    )  # fmt: skip
    assert code == 0, stderr


def test_stored_results_of_several_runs_are_pooled(stored: dict[str, Path], tmp_path: Path) -> None:
    """A folder (or a pattern) of results ``analyze --json`` / ``run --json`` wrote: one side of
    several runs, as a folder of cycles is."""
    for name in stored:
        folder = tmp_path / name[:2]
        folder.mkdir(exist_ok=True)
        shutil.copy(stored[name], folder / f"{name}.json")
    out = tmp_path / "pooled.json"
    code, _, _ = invoke(
        "diff", str(tmp_path / "w0"), str(tmp_path / "w4" / "*.json"), "--no-html", "--json", str(out)
    )
    assert code == 0
    document = json.loads(out.read_text())
    assert document["before_runs"] == document["after_runs"] == 2 and document["after"].endswith("*.json")
    step = next(m for m in document["metrics"] if m["key"] == "step_time")
    assert step["verdict"] == "faster"
    steps = raw_step_times_us(RUNS["w4c1"])[:6] + raw_step_times_us(RUNS["w4c2"])[:6]
    assert step["after"] == pytest.approx(statistics.median(steps), abs=0.01)


def test_a_job_diff_judges_its_median_step_on_the_run_to_run_spread(tmp_path: Path) -> None:
    """A job's result keeps no per-step figures: its median step is judged on the measured
    run-to-run spread alone, ±1.96·√(2)·7.8 % of the step for one job against itself."""
    out = tmp_path / "jobs.json"
    job = str(SAMPLES / "two_ranks")
    code, stdout, _ = invoke("diff", job, job, "--no-html", "--json", str(out), "--max-regression", "0")
    assert code == 0
    step = next(m for m in json.loads(out.read_text())["metrics"] if m["key"] == "step_time")
    half = 1.959964 * math.sqrt(2) * HOST_RUN_SPREAD * step["before"]
    assert step["change"] == 0 and step["verdict"] == "cannot tell"
    assert step["lower"] == pytest.approx(-half, abs=0.01) and step["upper"] == pytest.approx(half, abs=0.01)
    assert "step time: cannot tell" in stdout


def test_findings_fixed_together_share_the_measured_change() -> None:
    """Two fixes landing at once: each stands beside the same measured change, naming the other."""
    from traceinsight.results.comparison import Comparison, FindingChange, predictions
    from traceinsight.rules.findings import Severity

    def fixed(rule: str, saving: float) -> FindingChange:
        return FindingChange(
            status="fixed", rule=rule, site="train.py:7", title=rule, severity=Severity.HIGH,
            before_saving_us=saving, after_saving_us=None,
        )  # fmt: skip

    comparison = Comparison(
        before="a", after="b", basis="per step", notes=(),
        metrics=(Metric("step_time", "step time", "us", 1000.0, 700.0),),
        idle=(Metric("idle:dataloader", "dataloader", "us", 300.0, 20.0), Metric("idle:sync", "sync", "us", 50.0, 0.0)),
        findings=(fixed("dataloader-stall", 280.0), fixed("sync-in-loop", 45.0)), kernels=(),
    )  # fmt: skip
    loader, sync = predictions(comparison)
    assert (loader.predicted_us, loader.measured_step_us, loader.measured_target_us) == (
        280.0,
        -300.0,
        -280.0,
    )
    assert (sync.target, sync.measured_target_us) == ("idle:sync", -50.0)
    assert loader.together_with == ("sync-in-loop",) and sync.together_with == ("dataloader-stall",)
    assert "theirs together" in loader.text()


def test_several_runs_beside_a_job_are_refused_in_one_line(stored: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "runs"
    folder.mkdir()
    for name in ("w0c1", "w0c2"):
        shutil.copy(stored[name], folder / f"{name}.json")
    code, _, stderr = invoke("diff", str(folder), str(SAMPLES / "two_ranks"), "--no-html")
    (line,) = [line for line in stderr.splitlines() if line.startswith("traceinsight: error: ")]
    assert code == 2 and "the results of 2 runs" in line and "Traceback" not in stderr


def test_run_repeat_keeps_cycles_that_a_diff_pools(tmp_path: Path) -> None:
    """``run --repeat 2`` twice (nothing changed), each into its own folder: every cycle's
    trace is kept, and a diff of the two folders pools them, 2 runs a side, without breaking
    ``--max-regression 5``. The pooled step time lies among the raw steps of its side's cycles."""
    import os
    import subprocess
    import sys

    pytest.importorskip("torch")
    # One intra-op thread each: two runs side by side on a 2-core machine (CI's) otherwise ask for
    # four threads between them, and their step times swung 40 % apart with nothing changed.
    (tmp_path / "train.py").write_text(
        TRAIN.replace("import torch\n", "import torch\n\ntorch.set_num_threads(1)\n", 1)
    )
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "PYTHONPATH": str(repo)}
    # The two runs side by side, so that both meet the same load on a shared machine (one after
    # the other, a load that came or went between them moved the step time 90x here).
    running = {}
    for side in ("before", "after"):
        (tmp_path / side).mkdir()
        running[side] = subprocess.Popen(
            [sys.executable, "-m", "traceinsight", "run", "--no-html", "--stacks", "none",
             "--wait", "1", "--warmup", "1", "--active", "4", "--repeat", "2",
             "--trace", f"{side}/train.pt.trace.json.gz", "train.py"],
            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
    for process in running.values():
        _, stderr = process.communicate(timeout=300)
        assert process.returncode == 0, stderr
        assert "kept 2 profiler cycles" in stderr
    raw = {
        side: [raw_step_times_us(path) for path in sorted((tmp_path / side).iterdir())]
        for side in ("before", "after")
    }
    assert [len(steps) for side in raw.values() for steps in side] == [4, 4, 4, 4]
    out = tmp_path / "pooled.json"
    code, stdout, stderr = invoke(
        "diff", str(tmp_path / "before"), str(tmp_path / "after"), "--no-html", "--json", str(out),
        "--max-regression", "5",
    )  # fmt: skip
    assert code == 0, stderr
    assert "pooled 2 runs before and 2 after" in stdout
    document = json.loads(out.read_text())
    assert document["before_runs"] == document["after_runs"] == 2
    step = next(m for m in document["metrics"] if m["key"] == "step_time")
    for name, side in (("before", raw["before"]), ("after", raw["after"])):
        steps = [value for cycle in side for value in cycle]
        assert min(steps) - 0.01 <= step[name] <= max(steps) + 0.01
    assert step["verdict"] != "slower"


# --- host syncs per step: a count with an interval ------------------------------------------------


def _sync_steps(path: Path, syncs: list[int]) -> Path:
    """A trace of ``len(syncs)`` steps of 1 ms, each with two kernels and ``syncs[i]``
    cudaStreamSynchronize calls (each after a kernel, so the GPU idles after it)."""
    from tracebuild import annotation, launch, runtime, write_trace

    events: list[dict[str, object]] = []
    for step, count in enumerate(syncs):
        start = step * 1000
        events.append(annotation(f"ProfilerStep#{step}", start, 1000))
        events += launch(start + 10, start + 20, 100)
        for k in range(count):
            events.append(runtime("cudaStreamSynchronize", start + 200 + k * 50, 30))
        events += launch(start + 700, start + 710, 100)
    return write_trace(path, events)


def _steps_in(path: Path, name: str) -> list[int]:
    """Per ProfilerStep range (raw events, in order): how many ``name`` runtime calls start in it."""
    _, events = read_events(path)
    steps = sorted(
        (
            e
            for e in events
            if e.get("cat") == "user_annotation" and str(e["name"]).startswith("ProfilerStep#")
        ),
        key=lambda e: float(e["ts"]),
    )
    calls = [float(e["ts"]) for e in events if e.get("cat") == "cuda_runtime" and e["name"] == name]
    return [sum(float(s["ts"]) <= ts < float(s["ts"]) + float(s["dur"]) for ts in calls) for s in steps]


def test_each_steady_step_keeps_its_host_syncs_counted_from_the_raw_events(tmp_path: Path) -> None:
    """``steady_state.step_syncs``: one count per steady step, the same as the raw events'
    cudaStreamSynchronize calls inside that step (a real run: ``.item()`` every step, whose
    cudaMemcpyAsync + cudaStreamSynchronize are one wait; a hand-made trace, 0-3 a step)."""
    out = tmp_path / "item.json"
    trace = SAMPLES / "h200_run_item_every_step.pt.trace.json.gz"
    assert invoke("analyze", str(trace), "--no-html", "--json", str(out))[0] == 0
    document = json.loads(out.read_text())
    steady = sorted({step["step"] for step in document["steps"] if step["steady"]})
    raw = dict(zip(range(3, 8), _steps_in(trace, "cudaStreamSynchronize")[:5], strict=True))
    assert steady and document["steady_state"]["step_syncs"] == [raw[n] for n in steady]
    made = _sync_steps(tmp_path / "made.json", [0, 2, 1, 3, 2, 0, 1, 2])
    out = tmp_path / "made-result.json"
    assert invoke("analyze", str(made), "--no-html", "--json", str(out))[0] == 0
    document = json.loads(out.read_text())
    steady = sorted({step["step"] for step in document["steps"] if step["steady"]})
    counts = _steps_in(made, "cudaStreamSynchronize")
    assert len(steady) >= 4 and document["steady_state"]["step_syncs"] == [counts[n] for n in steady]


def test_syncs_per_step_gets_an_interval_and_a_verdict(tmp_path: Path) -> None:
    """The same syncs every step: ``no change`` (0 to 0); two more in every step: ``higher``, the
    interval exactly +2 (no step varies, and a count has no run-to-run allowance); counts that vary
    from step to step: an interval around the change that holds it."""
    same = _sync_steps(tmp_path / "same.json", [1] * 8)
    more = _sync_steps(tmp_path / "more.json", [3] * 8)
    varied = _sync_steps(tmp_path / "varied.json", [0, 3, 1, 4, 0, 3, 1, 4])

    def syncs(before: Path, after: Path) -> dict[str, object]:
        out = tmp_path / "diff.json"
        assert invoke("diff", str(before), str(after), "--no-html", "--json", str(out))[0] == 0
        metric: dict[str, object] = next(
            m for m in json.loads(out.read_text())["metrics"] if m["key"] == "syncs_per_step"
        )
        return metric

    unchanged = syncs(same, same)
    assert (unchanged["lower"], unchanged["upper"], unchanged["verdict"]) == (0, 0, "no change")
    grew = syncs(same, more)
    raw_same, raw_more = _steps_in(same, "cudaStreamSynchronize"), _steps_in(more, "cudaStreamSynchronize")
    step_change = statistics.median(raw_more) - statistics.median(raw_same)
    assert step_change == 2 and grew["change"] == step_change
    assert (grew["lower"], grew["upper"], grew["verdict"]) == (2, 2, "higher")
    spread = syncs(same, varied)
    assert isinstance(spread["lower"], float) and isinstance(spread["upper"], float)
    assert spread["lower"] < spread["change"] < spread["upper"] and spread["upper"] > spread["lower"] + 0.5


def test_a_pool_reads_every_run_on_its_own_basis() -> None:
    """Pooled figures are each run's on the comparison's basis. Per step (the first runs have
    steps), a run without steady steps has no per-step figures: it is left out, with a note (its
    window's totals were averaged with steps'). In all (a first run lacks steps), a run with steps
    adds its window's totals (its per-step figures were averaged with windows'). Expected figures
    from the results' own totals, outside the comparison."""
    from traceinsight import analyze
    from traceinsight.results.comparison import compare

    stepped = analyze(SAMPLES / "gp100_mlp_pageable_sync.json.gz")
    stepless = analyze(SAMPLES / "a100_alexnet_cuda_sync.json.gz")
    steps = stepped.steady_state.steady_steps
    assert steps > 0 and stepless.steady_state.steady_steps == 0

    per_step = compare([stepped, stepless], [stepped], "before", "after")
    assert per_step.basis == "per step"
    idle = {metric.key: metric for metric in per_step.idle}
    for cause, ns in stepped.utilization.idle_by_cause_ns.items():
        assert idle[f"idle:{cause}"].before == idle[f"idle:{cause}"].after == round(ns / 1000 / steps, 3)
    assert set(idle) == {f"idle:{cause}" for cause in stepped.utilization.idle_by_cause_ns}
    busy = next(metric for metric in per_step.metrics if metric.key == "busy_share")
    assert busy.before == busy.after == stepped.utilization.busy_share
    assert "1 run before without steady steps: left out of the pooled per-step figures" in per_step.notes

    in_all = compare([stepless, stepped], [stepless], "before", "after")
    assert in_all.basis == "in all"
    time = next(metric for metric in in_all.metrics if metric.key == "step_time")
    windows = [stepless.utilization.window_ns / 1000, stepped.utilization.window_ns / 1000]
    assert time.before == pytest.approx(sum(windows) / 2, abs=1e-3)
    idle = {metric.key: metric for metric in in_all.idle}
    causes = {*stepless.utilization.idle_by_cause_ns, *stepped.utilization.idle_by_cause_ns}
    for cause in causes:
        both = [run.utilization.idle_by_cause_ns.get(cause, 0) / 1000 for run in (stepless, stepped)]
        assert idle[f"idle:{cause}"].before == pytest.approx(sum(both) / 2, abs=1e-3)
    assert not any("left out" in note for note in in_all.notes)


def _trace_with_usage(path: Path, wait_share: float, out: Path) -> Path:
    """The trace at ``path`` as ``run`` now writes one: its record holds each recorded step's usage,
    every step's thread waiting ``wait_share`` of it for a CPU, under load 8."""
    import gzip

    document = json.loads(gzip.decompress(path.read_bytes()))
    wall = 150_000_000
    document["traceinsight"] = {
        "stacks": "none",
        "stepMarks": "optimizer",
        "stepUsage": [[wall, wall * 2 // 5, round(wall * wait_share), 8.0]] * 6,
    }
    out.write_bytes(gzip.compress(json.dumps(document).encode()))
    return out


def test_a_diff_of_traces_alone_tells_a_run_starved_of_cpu(tmp_path: Path) -> None:
    """The traces ``run`` writes hold their steps' usage: a diff of two traces (what ``run
    --repeat`` leaves, without the ``--json`` results) says a run was starved of CPU as a diff of
    their results does, and the gate holds (it broke on the machine's load before)."""
    fast = _trace_with_usage(RUNS["w4c1"], 0.02, tmp_path / "fast.json.gz")
    slow = _trace_with_usage(RUNS["w0c1"], 0.6, tmp_path / "slow.json.gz")
    _the_after_run_was_starved(fast, slow, tmp_path)
    code, _, _ = invoke("analyze", str(slow), "--no-html", "--json", str(tmp_path / "slow.json"))
    written = json.loads((tmp_path / "slow.json").read_text())["trace"]["step_usage"]
    assert code == 0 and written == [[150000.0, 60000.0, 90000.0, 8.0]] * 6  # µs, as run.step_usage
    starved_before = _trace_with_usage(RUNS["w4c1"], 0.6, tmp_path / "starved.json.gz")
    calm_after = _trace_with_usage(RUNS["w0c1"], 0.02, tmp_path / "calm.json.gz")
    code, _, _ = invoke("diff", str(starved_before), str(calm_after), "--no-html", "--max-regression", "5")
    assert code == 1  # the faster side starved: the slowdown stands
    plain, _, _ = invoke("diff", str(RUNS["w4c1"]), str(RUNS["w0c1"]), "--no-html", "--max-regression", "5")
    assert plain == 1  # without the record, as before: slower
