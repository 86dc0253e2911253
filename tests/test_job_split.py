"""A job's collectives split into waiting for the last rank and the transfer after it; stragglers
found by the waits they cause; the job's findings led by the straggler's own cause (issue 49).

Every job here is planted by ``jobbuild.AheadPlan``: each collective ends ``allreduce_us`` (the
transfer) after its last member arrived, on every member, and each rank's clock is shifted by its
jitter (``jobbuild.jitter_us``). Expected figures come from the raw events: a kernel's start on
the common clock is its ``ts`` less its rank's jitter; matched by kind and order (by ``Process
Group Name`` and ``Seq`` in the pipeline), the wait is the last start less the rank's, the transfer
the kernel's end less the last start.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

import pytest
from jobbuild import AheadPlan, jitter_us, make_ahead_job
from tracebuild import nccl_kernels, read_events, step_of_launch
from typer.testing import CliRunner

from traceinsight.commands import app

runner = CliRunner()
TRANSFER_US = 3_000
SYNC_RULES = {"sync-in-forward", "sync-in-loop", "latent-sync"}


def _job(folder: Path, plan: AheadPlan) -> dict[str, Any]:
    make_ahead_job(folder, plan)
    out = folder.parent / f"{folder.name}.json"
    result = runner.invoke(app, ["analyze", str(folder), "--no-html", "--json", str(out)])
    assert result.exit_code == 0, result.output
    return json.loads(out.read_text())


def _collectives(folder: Path, plan: AheadPlan) -> list[dict[int, tuple[float, float, int]]]:
    """Each matched collective: rank → (start, end, step) in µs on the common clock (see the module
    doc); its step is the ``ProfilerStep#N`` whose host range holds the kernel's launch."""
    by_key: dict[tuple[Any, ...], dict[int, tuple[float, float, int]]] = defaultdict(dict)
    for rank in range(plan.ranks):
        _, events = read_events(folder / f"rank-{rank}.json")
        step_of = step_of_launch(events)
        seen: Counter[str] = Counter()
        for kernel in nccl_kernels(events):
            shift = jitter_us(rank)
            args = kernel["args"]
            if "Seq" in args:
                key: tuple[Any, ...] = (args["Process Group Name"], args["Seq"])
            else:
                key = (kernel["name"], seen[kernel["name"]])
                seen[kernel["name"]] += 1
            step = step_of[args["correlation"]]
            by_key[key][rank] = (kernel["ts"] - shift, kernel["ts"] + kernel["dur"] - shift, step)
    return list(by_key.values())


def _expected_split(folder: Path, plan: AheadPlan) -> dict[tuple[int, int], tuple[float, float]]:
    """Per (rank, step): (wait, transfer) in µs."""
    split: dict[tuple[int, int], list[float]] = defaultdict(lambda: [0.0, 0.0])
    for members in _collectives(folder, plan):
        last = max(start for start, _, _ in members.values())
        for rank, (start, end, step) in members.items():
            split[rank, step][0] += last - start
            split[rank, step][1] += end - last
    return {key: (wait, transfer) for key, (wait, transfer) in split.items()}


def _expected_waits_caused(folder: Path, plan: AheadPlan) -> dict[int, float]:
    """Per rank: the others' waits (µs) in the collectives it came last to (the lowest rank on a tie)."""
    caused: dict[int, float] = defaultdict(float)
    for members in _collectives(folder, plan):
        last = max(start for start, _, _ in members.values())
        last_rank = min(rank for rank, (start, _, _) in members.items() if start == last)
        caused[last_rank] += sum(last - start for start, _, _ in members.values())
    return caused


SHAPES = {
    "ddp": AheadPlan(16, dataloader_rank=5, item_rank=11, allreduce_us=TRANSFER_US),
    "all-to-all": AheadPlan(8, dataloader_rank=5, item_rank=2, allreduce_us=TRANSFER_US, shape="all-to-all"),
    "fsdp": AheadPlan(8, dataloader_rank=5, item_rank=2, allreduce_us=TRANSFER_US, shape="fsdp"),
    "pipeline": AheadPlan(8, dataloader_rank=5, allreduce_us=TRANSFER_US, shape="pipeline"),
}


@pytest.fixture(scope="module", params=sorted(SHAPES))
def shaped(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, AheadPlan, dict[str, Any]]:
    plan = SHAPES[request.param]
    folder = tmp_path_factory.mktemp(request.param.replace("/", "-"))
    return folder, plan, _job(folder, plan)


def test_wait_and_transfer_per_rank_and_step_equal_the_planted_events(
    shaped: tuple[Path, AheadPlan, dict[str, Any]],
) -> None:
    """Each rank's wait and transfer in each of its steady steps are the ones computed from the raw
    kernels; every collective's transfer is the planted 3.0 ms; the ranks agree on whom they
    waited for in each step."""
    folder, plan, job = shaped
    expected = _expected_split(folder, plan)
    counts = Counter(
        (rank, step) for members in _collectives(folder, plan) for rank, (*_, step) in members.items()
    )
    assert job["job"]["collectives"]["split"] is True
    assert job["job"]["collectives"]["clock"]["aligned_ranks"] == plan.ranks
    residual = job["job"]["collectives"]["clock"]["residual_us"]
    assert residual < 1
    for entry in job["ranks"]:
        rank, collectives = entry["rank"], entry["collectives"]
        steps = collectives["per_step"]
        assert len(steps) == entry["steps"] >= plan.steps - 1
        for step in steps:
            wait, transfer = expected[rank, step["step"]]
            # each collective's split is off by at most twice the stated residual (its arrival, the last's)
            within = 2 * residual * counts[rank, step["step"]] + 0.01
            assert step["wait_us"] == pytest.approx(wait, abs=within)
            assert step["transfer_us"] == pytest.approx(transfer, abs=within)
            assert transfer == pytest.approx(TRANSFER_US * counts[rank, step["step"]], rel=0.01)
        assert sum(step["wait_us"] for step in steps) == pytest.approx(collectives["wait_us"], abs=0.01)
        assert sum(step["transfer_us"] for step in steps) == pytest.approx(
            collectives["transfer_us"], abs=0.01
        )


def test_the_dataloader_rank_is_waited_for_and_leads_the_findings(
    shaped: tuple[Path, AheadPlan, dict[str, Any]],
) -> None:
    """The DataLoader-starved rank comes first among the stragglers and its cause leads the job's
    findings, with the waits it caused; the ranks that waited name it (except in a pipeline,
    where a stage waits for its neighbour)."""
    folder, plan, job = shaped
    first = job["stragglers"][0]
    assert first["rank"] == plan.dataloader_rank and first["cause"] == "dataloader"
    assert first["others_waited_us"] == pytest.approx(
        _expected_waits_caused(folder, plan)[plan.dataloader_rank], abs=0.01
    )
    lead = job["findings"][0]
    assert lead["straggler"] == plan.dataloader_rank
    assert lead["rule"] in {"dataloader-stall", "straggler"}
    assert lead["job_savings_per_step_us"] == first["waits_caused_per_step_us"] > 0
    if plan.shape != "pipeline":
        waited_for = Counter(entry["collectives"]["waited_for"] for entry in job["ranks"])
        assert waited_for[plan.dataloader_rank] >= plan.ranks - 2


def test_exposed_communication_counts_the_transfer_only(
    shaped: tuple[Path, AheadPlan, dict[str, Any]],
) -> None:
    """Nothing computes under a collective here: the job's exposed communication per step is the
    planted transfer times the collectives per step (within 25 %), not the wait for the
    straggler; its note names the wait."""
    folder, plan, job = shaped
    per_rank = Counter(rank for members in _collectives(folder, plan) for rank in members)
    median_rank = sorted(per_rank.values())[(len(per_rank) - 1) // 2] / plan.steps
    finding = next(f for f in job["findings"] if f["rule"] == "exposed-communication")
    assert finding["savings_per_step_us"] == pytest.approx(TRANSFER_US * median_rank, rel=0.25)
    assert "transfer only" in finding["note"]


def test_the_sync_ranks_top_finding_is_its_item(tmp_path: Path) -> None:
    """16 ranks: rank 11 calls .item() in forward; its top finding is its own sync, not the
    communication it waits in (was: exposed-communication, 43 % of each step)."""
    plan = SHAPES["ddp"]
    job = _job(tmp_path / "job", plan)
    stragglers = {s["rank"]: s for s in job["stragglers"]}
    assert set(stragglers) == {plan.dataloader_rank, plan.item_rank}
    item = stragglers[plan.item_rank]
    assert item["cause"] == "sync" and item["top_finding_rule"] in SYNC_RULES
    assert ".item()" in item["top_finding"]
    assert stragglers[plan.dataloader_rank]["top_finding_rule"] == "dataloader-stall"
    assert [f["rule"] for f in job["findings"][:2]] == ["dataloader-stall", item["top_finding_rule"]]
    # the page: every rank but the DataLoader one shows whom it waited for, and the arrivals chart
    page = tmp_path / "job.html"
    assert runner.invoke(app, ["analyze", str(tmp_path / "job"), "-o", str(page)]).exit_code == 0
    html = page.read_text()
    assert html.count(f"<td>rank {plan.dataloader_rank}</td>") == plan.ranks - 1
    assert 'aria-labelledby="arrivals-title"' in html and f"last: rank {plan.dataloader_rank}" in html


@pytest.mark.parametrize("shape", ["ddp", "all-to-all"])
def test_one_large_lateness_in_one_collective_names_that_rank(tmp_path: Path, shape: str) -> None:
    """Rank 3 pauses 30 ms once, with nothing recorded, before one collective; it is on time
    everywhere else, so its median lateness is 0 (was: "No straggler"). It is named, with the
    waits it caused computed from the raw kernels, and a pause with nothing recorded as its cause."""
    plan = AheadPlan(8, late_rank=3, late_us=30_000, allreduce_us=TRANSFER_US, shape=shape)
    job = _job(tmp_path / "job", plan)
    assert [s["rank"] for s in job["stragglers"]] == [3]
    straggler = job["stragglers"][0]
    late = next(entry for entry in job["ranks"] if entry["rank"] == 3)["collectives"]
    assert late["late_median_us"] == 0
    caused = _expected_waits_caused(tmp_path / "job", plan)
    assert straggler["others_waited_us"] == pytest.approx(caused[3], abs=0.01)
    assert caused[3] > 7 * 10_000  # seven ranks waited about the pause less the host's lead
    assert straggler["cause"] == "untraced"
    assert job["findings"][0]["straggler"] == 3


def test_a_rank_with_more_gpu_work_is_named_by_it(tmp_path: Path) -> None:
    """Rank 6's forward kernels take 680 µs instead of 280 (a larger shard): 4 ms more GPU work per
    step, which every other rank waits for in the all-reduce. Its cause is slower GPU work, which no
    rule of one trace names, so the job's first finding is the straggler itself, with the wait."""
    plan = AheadPlan(8, heavy_rank=6, heavy_forward_us=680, allreduce_us=TRANSFER_US)
    job = _job(tmp_path / "job", plan)
    assert [s["rank"] for s in job["stragglers"]] == [6]
    straggler = job["stragglers"][0]
    assert straggler["cause"] == "compute"
    extra = plan.forward * (plan.heavy_forward_us - plan.forward_us)
    assert straggler["cause_excess_per_step_us"] == pytest.approx(extra, rel=0.05)
    lead = job["findings"][0]
    assert (lead["rule"], lead["straggler"]) == ("straggler", 6) and "slower GPU work" in lead["title"]
    caused = _expected_waits_caused(tmp_path / "job", plan)[6]
    assert straggler["others_waited_us"] == pytest.approx(caused, abs=0.01)
    assert lead["job_savings_per_step_us"] == pytest.approx(caused / (plan.ranks - 1) / plan.steps, rel=0.25)


def test_a_64_rank_job_leads_with_the_dataloader_ranks_cause(tmp_path: Path) -> None:
    plan = AheadPlan(64, dataloader_rank=17, item_rank=42, allreduce_us=TRANSFER_US, steps=3)
    job = _job(tmp_path / "job", plan)
    assert {s["rank"] for s in job["stragglers"]} == {17, 42}
    assert job["findings"][0]["rule"] == "dataloader-stall" and job["findings"][0]["straggler"] == 17
    exposed = next(f for f in job["findings"] if f["rule"] == "exposed-communication")
    assert exposed["savings_per_step_us"] == pytest.approx(TRANSFER_US, rel=0.25)
    assert next(s for s in job["stragglers"] if s["rank"] == 42)["top_finding_rule"] in SYNC_RULES


def test_the_job_names_its_step_statistic_and_the_slowest_ranks_step(tmp_path: Path) -> None:
    """Two real ranks (steps 615 and 619 ms): the job's step is named as the median rank's (the
    lower middle: the faster one here), and the slowest rank's step, which sets the pace, is given
    beside it. Their SendRecv kernels do not end together (2 of 128 ranks), so their clocks are
    not aligned and the split is said to be approximate."""
    from tracebuild import SAMPLES

    out = tmp_path / "two.json"
    result = runner.invoke(app, ["analyze", str(SAMPLES / "two_ranks"), "--no-html", "--json", str(out)])
    assert result.exit_code == 0, result.output
    job = json.loads(out.read_text())
    steps = {entry["rank"]: entry["step_time_us"] for entry in job["ranks"]}
    slowest = max(steps, key=lambda rank: steps[rank])
    assert job["job"]["slowest_rank"] == slowest
    assert (
        job["job"]["slowest_step_time_us"]
        == steps[slowest]
        > job["job"]["step_time_us"]
        == min(steps.values())
    )
    assert job["job"]["step_time_statistic"].startswith("median over ranks")
    assert "(median rank), slowest rank" in " ".join(result.output.split())
    assert job["job"]["collectives"]["split"] is False
    assert any("their own clocks are kept" in warning for warning in job["warnings"])


def test_one_ranks_exposed_communication_says_wait_and_transfer_cannot_be_told_apart(tmp_path: Path) -> None:
    from tracebuild import SAMPLES

    out = tmp_path / "one.json"
    trace = SAMPLES / "two_ranks" / "rank-0.json.gz"
    assert runner.invoke(app, ["analyze", str(trace), "--no-html", "--json", str(out)]).exit_code == 0
    finding = next(f for f in json.loads(out.read_text())["findings"] if f["rule"] == "exposed-communication")
    assert "cannot tell waiting for the other ranks from the transfer" in json.dumps(finding)


def test_a_collectives_exposed_stretches_are_where_no_compute_ran() -> None:
    """Compute blocks [10, 20) and [30, 40) under a collective [15, 50): exposed [20, 30) and
    [40, 50). Twenty 3-long blocks under [0, 100): the stretches are cut to 16 by joining the
    closest, the blocks between them then counted as exposed."""
    import numpy as np

    from traceinsight.job.rank import MAX_EXPOSED_STRETCHES, _exposed

    blocks = (np.array([10, 30]), np.array([20, 40]))
    assert _exposed(15, 50, blocks) == (20, 30, 40, 50)
    assert _exposed(0, 5, blocks) == (0, 5)
    assert _exposed(12, 18, blocks) == ()
    assert _exposed(0, 100, None) == (0, 100)
    many = (np.arange(0, 100, 5) + 1, np.arange(0, 100, 5) + 4)  # [1, 4), [6, 9), …: gaps of 2 and 1
    stretches = _exposed(0, 100, many)
    assert len(stretches) == 2 * MAX_EXPOSED_STRETCHES
    exposed = sum(stretches[i + 1] - stretches[i] for i in range(0, len(stretches), 2))
    # 21 stretches ([0, 1), [4, 6), …, [99, 100)) cut to 16: five joins, each counting a 3-long block
    assert exposed == (100 - 20 * 3) + (21 - MAX_EXPOSED_STRETCHES) * 3
