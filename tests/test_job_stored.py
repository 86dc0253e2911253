"""A job's stored result (``analyze FOLDER --json``) renders its terminal summary, page and Markdown
as the live run did (issue 50): every job renderer reads the :class:`~traceinsight.JobResult`
alone, and what they need beyond the older keys is in the JSON (``job.collectives.arrivals``,
``ranks[].busy_us``, ``ranks[].collectives.others_mean_wait_us``).

The new keys' figures are recomputed here from the raw events of a job planted by
``jobbuild.AheadPlan`` (one stream per rank, each collective ending ``allreduce_us`` after its last
member's arrival on every member, each rank's clock shifted by ``jobbuild.jitter_us``): a kernel's
start on the common clock is its ``ts`` less its rank's jitter, the n-th all-reduce of every rank
is one collective, and a rank's busy time is the length of its GPU work in its steady steps.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path
from statistics import median_low
from typing import Any

import pytest
from jobbuild import AheadPlan, jitter_us, make_ahead_job
from loops import item_loop
from tracebuild import SAMPLES, nccl_kernels, read_events, step_of_launch, write_trace
from typer.testing import CliRunner

import traceinsight
from traceinsight.commands import app
from traceinsight.render.html import HtmlRenderer
from traceinsight.render.markdown import MarkdownRenderer
from traceinsight.render.terminal import TerminalRenderer
from traceinsight.results import JobComparison

PLAN = AheadPlan(6, dataloader_rank=1, item_rank=4, allreduce_us=3_000)
_GPU = {"kernel", "gpu_memcpy", "gpu_memset"}


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, traceinsight.JobResult]:
    folder = tmp_path_factory.mktemp("ahead") / "job"
    make_ahead_job(folder, PLAN)
    result = traceinsight.analyze(str(folder))
    assert isinstance(result, traceinsight.JobResult)
    return folder, result


@pytest.fixture(scope="module")
def two_ranks() -> traceinsight.JobResult:
    result = traceinsight.analyze(str(SAMPLES / "two_ranks"))
    assert isinstance(result, traceinsight.JobResult)
    return result


@pytest.fixture(scope="module")
def cycles(tmp_path_factory: pytest.TempPathFactory) -> traceinsight.JobResult:
    """One process's three profiler cycles (tensorboard_trace_handler's names), read side by side."""
    folder = tmp_path_factory.mktemp("log")
    for name, prep_us in (("999999999999", 300), ("1000000000000", 5000), ("1000000000500", 300)):
        write_trace(folder / f"gpu-node_4242.{name}.pt.trace.json", item_loop(prep_us=prep_us).events)
    result = traceinsight.analyze(str(folder))
    assert isinstance(result, traceinsight.JobResult) and result.cycles
    return result


def _renders(result: traceinsight.JobResult) -> dict[str, str]:
    return {
        "terminal": TerminalRenderer(width=100).render(result),
        "markdown": MarkdownRenderer().render(result),
        "page": HtmlRenderer().render(result),
    }


@pytest.mark.parametrize("which", ["planted", "two_ranks", "cycles"])
def test_a_stored_job_renders_as_the_live_one(which: str, request: pytest.FixtureRequest) -> None:
    """Written, read back and rendered: the terminal summary, the Markdown and the page are the live
    run's, byte for byte; the stored result writes the same JSON again."""
    live = request.getfixturevalue(which)
    live = live[1] if isinstance(live, tuple) else live
    text = live.to_json()
    stored = traceinsight.JobResult.from_json(text)
    assert stored.rank_results == () and live.rank_results != ()  # the stored one has only its JSON
    assert stored.to_json() == text
    renders = _renders(live)
    assert _renders(stored) == renders
    unit = "cycle" if live.cycles else "rank"
    assert f"Findings across {unit}s" in renders["terminal"] and ("<svg" in renders["page"]) != live.cycles


def _collectives(folder: Path) -> list[dict[int, tuple[float, float, int]]]:
    """Each collective in start order: rank → (start, end, step) in µs on the common clock, its step
    the ``ProfilerStep#N`` whose host range holds the kernel's launch."""
    matched: list[dict[int, tuple[float, float, int]]] = []
    for rank in range(PLAN.ranks):
        _, events = read_events(folder / f"rank-{rank}.json")
        step_of = step_of_launch(events)
        for index, kernel in enumerate(nccl_kernels(events)):
            if index == len(matched):
                matched.append({})
            step = step_of[kernel["args"]["correlation"]]
            shift = jitter_us(rank)
            matched[index][rank] = (kernel["ts"] - shift, kernel["ts"] + kernel["dur"] - shift, step)
    return sorted(matched, key=lambda members: median_low(start for start, _, _ in members.values()))


def _steady_steps(job: dict[str, Any]) -> dict[int, set[int]]:
    """Each rank's steady steps, as its ``collectives.per_step`` lists them."""
    return {
        entry["rank"]: {step["step"] for step in entry["collectives"]["per_step"]} for entry in job["ranks"]
    }


def test_the_arrivals_are_the_kernels_starts(planted: tuple[Path, traceinsight.JobResult]) -> None:
    """``job.collectives.arrivals``: the first collectives (up to 12), each rank's kernel start less
    the first rank's on the common clock, the last rank (the lowest on a tie), and the step it ran in
    on that rank (null outside its steady steps)."""
    folder, result = planted
    job = json.loads(result.to_json())
    steady = _steady_steps(job)
    expected = []
    for members in _collectives(folder)[:12]:
        first = min(start for start, _, _ in members.values())
        last = max(start for start, _, _ in members.values())
        last_rank = min(rank for rank, (start, _, _) in members.items() if start == last)
        step = members[last_rank][2]
        expected.append(
            {
                "kind": "AllReduce",
                "step": step if step in steady[last_rank] else None,
                "last_rank": last_rank,
                "arrivals": [
                    [rank, pytest.approx(members[rank][0] - first, abs=1e-3)] for rank in sorted(members)
                ],
            }
        )
    arrivals = job["job"]["collectives"]["arrivals"]
    assert len(arrivals) == len(expected) == PLAN.steps
    assert arrivals == expected
    assert {arrival["last_rank"] for arrival in arrivals} == {PLAN.dataloader_rank}  # the starved rank


def test_the_others_mean_wait_is_the_raw_waits(planted: tuple[Path, traceinsight.JobResult]) -> None:
    """``others_mean_wait_us``: over the collectives a rank came last to in its steady steps, the
    others' wait for it (the last start less theirs) averaged over the others, summed; its per step
    is the straggler's ``waits_caused_per_step_us``."""
    folder, result = planted
    job = json.loads(result.to_json())
    steady = _steady_steps(job)
    expected: dict[int, float] = defaultdict(float)
    for members in _collectives(folder):
        last = max(start for start, _, _ in members.values())
        last_rank = min(rank for rank, (start, _, _) in members.items() if start == last)
        if members[last_rank][2] in steady[last_rank]:
            expected[last_rank] += sum(last - start for start, _, _ in members.values()) / (len(members) - 1)
    found = {entry["rank"]: entry["collectives"]["others_mean_wait_us"] for entry in job["ranks"]}
    assert found == {rank: pytest.approx(expected.get(rank, 0.0), abs=1e-3) for rank in range(PLAN.ranks)}
    assert found[PLAN.dataloader_rank] > 0
    straggler = next(entry for entry in job["stragglers"] if entry["rank"] == PLAN.dataloader_rank)
    steps = job["ranks"][PLAN.dataloader_rank]["steps"]
    assert straggler["waits_caused_per_step_us"] == pytest.approx(
        found[PLAN.dataloader_rank] / steps, abs=1e-3
    )


def test_busy_is_the_gpu_work_in_the_steady_steps(planted: tuple[Path, traceinsight.JobResult]) -> None:
    """``ranks[].busy_us``: each rank's GPU work (kernels and copies, one stream, none overlapping)
    launched in its steady steps, summed; over ``utilization.window_us`` it is the busy share."""
    folder, result = planted
    job = json.loads(result.to_json())
    steady = _steady_steps(job)
    for entry in job["ranks"]:
        _, events = read_events(folder / f"rank-{entry['rank']}.json")
        step_of = step_of_launch(events)
        busy = 0.0
        for event in events:
            if event.get("cat") not in _GPU:
                continue
            if step_of[event["args"]["correlation"]] in steady[entry["rank"]]:
                busy += event["dur"]
        assert entry["busy_us"] == pytest.approx(busy, abs=1e-3), entry["rank"]
        utilization = entry["utilization"]
        assert round(entry["busy_us"] / utilization["window_us"], 4) == utilization["busy_share"]


def test_a_job_result_written_before_the_new_keys_still_renders(
    planted: tuple[Path, traceinsight.JobResult],
) -> None:
    """Without ``busy_us`` the busy share is the rounded ``utilization.busy_share``; without arrivals
    the page has no chart; an arrival whose last rank has no arrival (hand-edited) is left out of the
    chart, never a traceback."""
    _, result = planted
    document = json.loads(result.to_json())
    for entry in document["ranks"]:
        del entry["busy_us"]
    arrivals = document["job"]["collectives"].pop("arrivals")
    older = traceinsight.JobResult.from_json(json.dumps(document))
    assert all(rank.busy_ns is None for rank in older.ranks)
    assert (
        TerminalRenderer(width=100).render(older).splitlines()[:3]
        == TerminalRenderer(width=100).render(result).splitlines()[:3]
    )
    assert "<svg" not in HtmlRenderer().render(older) and older.charts == {}
    document["job"]["collectives"]["arrivals"] = [{**arrivals[0], "last_rank": 99}, arrivals[1]]
    edited = traceinsight.JobResult.from_json(json.dumps(document))
    page = HtmlRenderer().render(edited)
    assert page.count("last: rank") == 1


def test_two_stored_jobs_compare_as_the_live_ones(
    planted: tuple[Path, traceinsight.JobResult], tmp_path: Path
) -> None:
    """``diff`` of two jobs' stored results is the diff of the live ones (the same JSON, summary,
    Markdown and page), and a stored comparison renders as the live one: nothing of it comes
    from the ranks' analyses."""
    _, before = planted
    make_ahead_job(tmp_path / "fixed", AheadPlan(6, item_rank=4, allreduce_us=3_000))
    after = traceinsight.analyze(str(tmp_path / "fixed"))
    assert isinstance(after, traceinsight.JobResult)
    live = traceinsight.diff(before, after)
    stored_sides = traceinsight.diff(
        traceinsight.JobResult.from_json(before.to_json()), traceinsight.JobResult.from_json(after.to_json())
    )
    assert isinstance(live, JobComparison) and isinstance(stored_sides, JobComparison)
    assert stored_sides.to_json() == live.to_json()
    stored = JobComparison.from_json(live.to_json())
    for renderer in (TerminalRenderer(width=100), MarkdownRenderer(), HtmlRenderer()):
        text = renderer.render(live)
        assert renderer.render(stored_sides) == text and renderer.render(stored) == text
    assert any(change.status == "gone" for change in live.stragglers)  # rank 1's DataLoader wait is fixed


def test_analyze_of_a_jobs_stored_result_writes_the_live_outputs(
    planted: tuple[Path, traceinsight.JobResult], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``traceinsight analyze job.json -o page.html --markdown s.md`` (a file ``--json`` wrote for a
    job) writes the page and the Markdown the live run wrote, and prints the same summary (every
    rank the live one showed), the lines naming the files written aside."""
    folder, _ = planted
    monkeypatch.chdir(tmp_path)
    runner = CliRunner()
    live = runner.invoke(
        app, ["analyze", str(folder), "-o", "live.html", "--markdown", "live.md", "--json", "job.json"]
    )
    assert live.exit_code == 0, live.output
    again = runner.invoke(app, ["analyze", "job.json", "-o", "stored.html", "--markdown", "stored.md"])
    assert again.exit_code == 0, again.output
    assert (tmp_path / "stored.html").read_bytes() == (tmp_path / "live.html").read_bytes()
    assert (tmp_path / "stored.md").read_bytes() == (tmp_path / "live.md").read_bytes()

    def summary(output: str) -> list[str]:
        return [
            line for line in output.splitlines() if not line.startswith(("JSON:", "Markdown:", "report:"))
        ]

    assert summary(again.output) == summary(live.output)
    assert f"{PLAN.ranks} ranks" in again.output
