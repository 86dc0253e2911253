"""Distributed jobs: one report for many ranks (discovery, per-rank figures, lateness, stragglers,
the local pool and dask giving the same bytes). Expected figures come from plain JSON reading."""

from __future__ import annotations

import gzip
import json
import os
import pickle
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path
from statistics import median_low
from typing import Any

import pytest
from jobbuild import DATALOADER_NEXT, AheadPlan, Plan, make_ahead_job, make_job
from tracebuild import SAMPLES, annotation, launch, read_events, union_length, write_trace
from typer.testing import CliRunner

from traceinsight.commands import app

runner = CliRunner()
TWO_RANKS = SAMPLES / "two_ranks"
DATALOADER_RANK = 17
SYNC_RANK = 42


def _analyze(*args: str) -> Any:
    result = runner.invoke(app, ["analyze", *args])
    assert result.exit_code == 0, result.output
    return result


def _json(tmp_path: Path, *args: str, name: str = "job.json") -> dict[str, Any]:
    out = tmp_path / name
    _analyze(*args, "--no-html", "--json", str(out))
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def job64(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """The 64-rank job (rank 17 DataLoader-starved, rank 42 with a per-step sync) and its JSON."""
    folder = tmp_path_factory.mktemp("job64")
    make_job(folder, Plan(64, dataloader_rank=DATALOADER_RANK, sync_rank=SYNC_RANK))
    out = folder.parent / "job64.json"
    _analyze(str(folder), "--no-html", "--json", str(out))
    return folder, json.loads(out.read_text())


# --- the real two-rank trace -----------------------------------------------------------------


def test_two_rank_folder_gives_each_ranks_own_figures(tmp_path: Path) -> None:
    job = _json(tmp_path, str(TWO_RANKS))
    assert [rank["rank"] for rank in job["ranks"]] == [0, 1]
    count = len(list(TWO_RANKS.glob("*.json.gz")))
    assert any(
        w.startswith(f"{count} ranks: stragglers are named from 3") for w in job["warnings"]
    )  # was "rank(s)"
    for rank in job["ranks"]:
        own = _json(tmp_path, str(TWO_RANKS / f"rank-{rank['rank']}.json.gz"), name=f"own{rank['rank']}.json")
        assert rank["rank_from"] == "distributedInfo"
        assert rank["utilization"] == own["utilization"]
        assert rank["step_time_us"] == own["steady_state"]["step_time_us"]
        assert rank["steps"] == own["steady_state"]["steady_steps"]
        assert rank["top_finding"]["rule"] == next(f["rule"] for f in own["findings"] if not f["minor"])


def test_two_rank_communication_is_apart_from_compute(tmp_path: Path) -> None:
    """Communication per step = the union of NCCL kernels inside the steps, from the raw events."""
    job = _json(tmp_path, str(TWO_RANKS))
    for rank in job["ranks"]:
        _, events = read_events(TWO_RANKS / f"rank-{rank['rank']}.json.gz")
        steps = [e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")]
        start = min(e["ts"] for e in steps)
        end = max(e["ts"] + e["dur"] for e in steps)
        nccl = [
            (max(e["ts"], start), min(e["ts"] + e["dur"], end))
            for e in events
            if e.get("cat") == "kernel"
            and "nccl" in e["name"].lower()
            and e["ts"] < end
            and e["ts"] + e["dur"] > start
        ]
        expected_per_step = union_length(nccl) / len(steps)
        figures = rank["per_step_us"]
        assert figures["communication"] == pytest.approx(expected_per_step, abs=0.01)
        assert 0 < figures["communication_exposed"] <= figures["communication"]
        assert figures["compute"] > 0
        share = rank["utilization"]
        assert share["communication_share"] > 0
        assert share["compute_share"] + share["communication_share"] + share["copy_share"] + share[
            "idle_share"
        ] == pytest.approx(1, abs=0.001)


def test_rank_result_is_small_and_picklable() -> None:
    from traceinsight.job import RankTask, analyze_rank
    from traceinsight.thresholds import Thresholds

    path = TWO_RANKS / "rank-0.json.gz"
    result = analyze_rank(RankTask(str(path), None, 0, Thresholds()))
    blob = pickle.dumps(result)
    assert pickle.loads(blob) == result
    _, events = read_events(path)
    assert len(blob) < len(json.dumps(events)) / 100  # a summary, not the events
    assert len(result.collectives) == sum(
        1 for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()
    )


# --- the 64-rank job with two planted slow ranks ---------------------------------------------


def _expected_lateness(folder: Path, ranks: int) -> dict[int, float]:
    """Median lateness per rank in µs: the n-th NCCL kernel of each kind matched across ranks,
    its start minus the median (lower middle) start, then each rank's median (lower middle)."""
    starts: dict[int, dict[str, list[int]]] = {}
    for rank in range(ranks):
        _, events = read_events(folder / f"rank-{rank}.json.gz")
        kinds: dict[str, list[int]] = {}
        for e in sorted(
            (e for e in events if e.get("cat") == "kernel" and "nccl" in e["name"].lower()),
            key=lambda e: e["ts"],
        ):
            kinds.setdefault(e["name"].split("_")[1], []).append(e["ts"])
        starts[rank] = kinds
    late: dict[int, list[int]] = {rank: [] for rank in range(ranks)}
    for kind in starts[0]:
        for index in range(len(starts[0][kind])):
            middle = median_low(starts[rank][kind][index] for rank in range(ranks))
            for rank in range(ranks):
                late[rank].append(starts[rank][kind][index] - middle)
    return {rank: float(median_low(values)) for rank, values in late.items()}


def test_job_names_exactly_the_planted_ranks_with_their_causes(job64: tuple[Path, dict[str, Any]]) -> None:
    _, job = job64
    stragglers = {s["rank"]: s for s in job["stragglers"]}
    assert set(stragglers) == {DATALOADER_RANK, SYNC_RANK}
    assert stragglers[DATALOADER_RANK]["cause"] == "dataloader"
    assert stragglers[SYNC_RANK]["cause"] == "sync"
    # the others wait for the DataLoader-starved rank, which arrives last at every collective
    assert stragglers[DATALOADER_RANK]["others_waited_us"] > 0
    assert job["job"]["ranks"] == 64
    assert job["job"]["collectives"]["matched"] == 10
    # the job's findings lead with the DataLoader rank's own cause; the sync rank's top finding is its sync
    assert (job["findings"][0]["rule"], job["findings"][0]["straggler"]) == (
        "dataloader-stall",
        DATALOADER_RANK,
    )
    assert stragglers[SYNC_RANK]["top_finding_rule"] in {"sync-in-loop", "sync-in-forward", "latent-sync"}


def test_job_lateness_equals_an_independent_count(job64: tuple[Path, dict[str, Any]]) -> None:
    """The ranks are copies of one trace, each shifted by its clock's jitter: once the clocks are
    aligned on the collectives' ends, every copy's lateness is exactly 0 (on the raw clocks it is
    its jitter). The two planted ranks do not leave their collectives with the others (the copies
    do not wait for them), so their own clocks are kept and said so."""
    folder, job = job64
    raw = _expected_lateness(folder, 64)
    found = {rank["rank"]: rank["collectives"]["late_median_us"] for rank in job["ranks"]}
    planted = {DATALOADER_RANK, SYNC_RANK}
    assert {rank: late for rank, late in found.items() if rank not in planted} == {
        rank: 0.0 for rank in range(64) if rank not in planted
    }
    assert max(abs(late) for rank, late in raw.items() if rank not in planted) > 100  # the jitter was there
    # the planted delays: 100 ms of DataLoader per step; the sync waits, then 30 ms of host time
    assert found[DATALOADER_RANK] >= 100_000 - 300
    assert found[SYNC_RANK] >= 30_000
    assert job["job"]["collectives"]["clock"]["aligned_ranks"] == 62
    assert any(warning.startswith("2 ranks (rank 17 …) left collectives") for warning in job["warnings"])


def stragglers_of(job: dict[str, Any]) -> set[int]:
    return {s["rank"] for s in job["stragglers"]}


def test_findings_common_to_all_ranks_are_reported_once(job64: tuple[Path, dict[str, Any]]) -> None:
    _, job = job64
    rules = [finding["rule"] for finding in job["findings"]]
    assert len(rules) == len(set(rules))
    dataloader = next(f for f in job["findings"] if f["rule"] == "dataloader-stall")
    assert dataloader["ranks"] == [DATALOADER_RANK]
    assert any(f["rank_count"] == 64 for f in job["findings"])


# --- a job whose hosts run ahead of their GPUs ----------------------------------------------

AHEAD = AheadPlan(16, dataloader_rank=5, item_rank=11)


@pytest.fixture(scope="module")
def ahead_job(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, Any]]:
    """16 ranks whose hosts finish each ProfilerStep in about 0.3 ms while their GPUs need 8.4 ms;
    rank 5 waits 20 ms per step for its DataLoader, rank 11 calls .item() in forward (then 3 ms of
    Python). The 64-rank run takes about a minute here; its figures are in the commit message."""
    folder = tmp_path_factory.mktemp("ahead")
    make_ahead_job(folder, AHEAD)
    out = folder.parent / "ahead.json"
    _analyze(str(folder), "--no-html", "--json", str(out))
    return folder, json.loads(out.read_text())


def _gaps(events: list[dict[str, Any]]) -> list[tuple[int, int]]:
    """The GPU's idle stretches (ns): between the union's blocks of every GPU activity."""
    busy = sorted(
        (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000))
        for e in events
        if e.get("cat") in ("kernel", "gpu_memcpy")
    )
    gaps, reach = [], busy[0][1]
    for start, end in busy[1:]:
        if start > reach:
            gaps.append((reach, start))
        reach = max(reach, end)
    return gaps


def _own_idle(events: list[dict[str, Any]]) -> dict[str, int]:
    """The GPU idle (ns) the rank's own host caused: gaps that the main thread spent at least half
    of in DataLoader ``__next__`` (``dataloader``), and the others that began as a stream sync that
    waited at least half their length returned (``sync``)."""

    def ranges(name: str) -> list[tuple[int, int]]:
        return [
            (round(e["ts"] * 1000), round((e["ts"] + e["dur"]) * 1000)) for e in events if e["name"] == name
        ]

    loader, syncs = ranges(DATALOADER_NEXT), ranges("cudaStreamSynchronize")
    idle = {"dataloader": 0, "sync": 0}
    for start, end in _gaps(events):
        inside = sum(max(0, min(end, b) - max(start, a)) for a, b in loader)
        if inside >= (end - start) / 2:
            idle["dataloader"] += end - start
        elif any(start - 50_000 <= b <= start + 50_000 and b - a >= (end - start) / 2 for a, b in syncs):
            idle["sync"] += end - start
    return idle


def test_a_job_whose_hosts_run_ahead_is_timed_by_its_gpus(ahead_job: tuple[Path, dict[str, Any]]) -> None:
    """A rank's step is the spacing of when its steps' work was done: here its GPU's pace (about
    20 ms, held to the slowest rank by the all-reduce), not its ProfilerStep ranges (was: median
    step 0.29 ms)."""
    from reference_split import step_windows

    folder, job = ahead_job
    expected = {}
    for rank in range(AHEAD.ranks):
        _, events = read_events(folder / f"rank-{rank}.json")
        windows = step_windows(events)
        assert len(windows) == AHEAD.steps
        expected[rank] = sorted(w.done - w.begin for w in windows)[AHEAD.steps // 2]
        hosts = sorted(w.host_end - w.host_start for w in windows)
        if rank not in (AHEAD.dataloader_rank, AHEAD.item_rank):
            assert hosts[AHEAD.steps // 2] * 20 < expected[rank]  # the host ran far ahead
    found = {rank["rank"]: rank for rank in job["ranks"]}
    for rank, step_ns in expected.items():
        assert found[rank]["steps"] == AHEAD.steps
        assert found[rank]["step_time_us"] == pytest.approx(step_ns / 1000, abs=0.001)
    assert job["job"]["step_time_us"] == pytest.approx(median_low(expected.values()) / 1000, abs=0.001)


def test_each_straggler_of_a_host_ahead_job_is_named_by_its_own_cause(
    ahead_job: tuple[Path, dict[str, Any]],
) -> None:
    """The DataLoader-starved rank is slow because of its DataLoader, the rank with .item() in
    forward because of a host sync, each by its own excess over the median rank per step (was: the
    .item() rank's "slower GPU work", measured in its 20 ms host ranges against 0.3 ms ones)."""
    folder, job = ahead_job
    own = {}
    for rank in range(AHEAD.ranks):
        _, events = read_events(folder / f"rank-{rank}.json")
        own[rank] = _own_idle(events)
    stragglers = {s["rank"]: s for s in job["stragglers"]}
    assert set(stragglers) == {AHEAD.dataloader_rank, AHEAD.item_rank}
    for rank, cause in ((AHEAD.dataloader_rank, "dataloader"), (AHEAD.item_rank, "sync")):
        assert stragglers[rank]["cause"] == cause
        middle = median_low(round(idle[cause] / AHEAD.steps) for idle in own.values())
        excess = round(own[rank][cause] / AHEAD.steps) - middle
        assert excess > 0.1 * job["job"]["step_time_us"] * 1000
        assert stragglers[rank]["cause_excess_per_step_us"] == pytest.approx(excess / 1000, abs=0.001)


def test_no_copy_card_of_a_host_ahead_job_is_inflated_by_a_short_step(
    ahead_job: tuple[Path, dict[str, Any]],
) -> None:
    """Every rank copies its batch (40 µs, pinned) while no kernel runs: 0.2 % of a 20 ms step,
    not a card (was: blocking-h2d, high, on 14 of 16 ranks: its saving over a 0.3 ms step)."""
    folder, job = ahead_job
    copy_rules = {"blocking-h2d", "pageable-memcpy"}
    assert not [f for f in job["findings"] if f["rule"] in copy_rules and f["severity"] != "low"]
    _, events = read_events(folder / "rank-0.json")
    copies = [e["dur"] for e in events if e.get("name") == "Memcpy HtoD (Pinned -> Device)"]
    share = sum(copies) / AHEAD.steps / job["job"]["step_time_us"]
    assert share < 0.01


# --- where the ranks run ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def job8(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("job8")
    make_job(folder, Plan(8, dataloader_rank=2, sync_rank=5))
    return folder


def test_dask_and_local_give_byte_identical_json(job8: Path, tmp_path: Path) -> None:
    distributed = pytest.importorskip("distributed")
    local = tmp_path / "local.json"
    _analyze(str(job8), "--no-html", "--workers", "2", "--json", str(local))
    with distributed.LocalCluster(
        processes=True, n_workers=2, threads_per_worker=1, dashboard_address=None
    ) as cluster:
        remote = tmp_path / "dask.json"
        _analyze(str(job8), "--no-html", "--dask", cluster.scheduler_address, "--json", str(remote))
    assert remote.read_bytes() == local.read_bytes()
    assert {s["rank"] for s in json.loads(local.read_text())["stragglers"]} == {2, 5}


def _profiled_files(tree: dict[str, Any]) -> set[str]:
    """Every file named in a dask profile tree (``client.profile()``)."""
    files = {str(tree.get("description", {}).get("filename", ""))}
    for child in tree.get("children", {}).values():
        files |= _profiled_files(child)
    return files


def _profile_trees(dask_worker: Any) -> list[dict[str, Any]]:
    """What a dask worker's profiler keeps: this second's tree and each past second's."""
    return [dask_worker.profile_recent, *(tree for _, tree in dask_worker.profile_history)]


def test_a_dask_workers_profiler_keeps_none_of_the_analysis_stacks(job8: Path) -> None:
    """A dask worker's statistical profiler samples the threads running tasks every 10 ms and keeps
    each second's tree of their stacks for 1,000 seconds: the analysis' deep stacks grew a worker
    by about 0.5 MiB per second of work (issue 49). The rank is analyzed in a thread the profiler
    does not sample: it samples the task waiting, in execute.py, and no frame of the analysis."""
    distributed = pytest.importorskip("distributed")
    from traceinsight.job import RankTask
    from traceinsight.job.execute import run_dask
    from traceinsight.thresholds import Thresholds

    tasks = [RankTask(str(job8 / f"rank-{rank}.json.gz"), rank, rank, Thresholds()) for rank in (0, 1)]
    with (
        distributed.LocalCluster(
            processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None
        ) as cluster,
        distributed.Client(cluster) as client,
    ):
        results = run_dask(tasks, cluster.scheduler_address)
        trees = [tree for kept in client.run(_profile_trees).values() for tree in kept]
    assert [result.rank for result in results] == [0, 1]
    ours = {name for tree in trees for name in _profiled_files(tree) if "traceinsight" in name}
    assert sum(tree["count"] for tree in trees) > 0 and ours, "the profiler sampled the tasks"
    assert {Path(name).name for name in ours} == {"execute.py"}, ours


def test_local_job_never_imports_dask(job8: Path, tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from pathlib import Path\n"
        "from traceinsight.commands.job import JobOptions, analyze_job_and_write\n"
        "from traceinsight.commands.options import Reading, Wanted\n"
        "if __name__ == '__main__':\n"
        f"    analyze_job_and_write([Path({str(job8)!r})], Wanted(write_html=False), Reading(), JobOptions(workers=2))\n"
        "    assert 'dask' not in sys.modules and 'distributed' not in sys.modules, 'dask imported'\n"
    )
    script = tmp_path / "local_only.py"
    script.write_text(code)
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=tmp_path)
    assert done.returncode == 0, done.stderr


def test_unreachable_dask_scheduler_is_a_config_error(job8: Path) -> None:
    pytest.importorskip("distributed")
    from traceinsight.errors import ConfigError
    from traceinsight.job import RankTask
    from traceinsight.job.execute import run_dask
    from traceinsight.thresholds import Thresholds

    task = RankTask(str(job8 / "rank-0.json.gz"), 0, 0, Thresholds())
    with pytest.raises(ConfigError, match=r"cannot reach the dask scheduler at tcp://127\.0\.0\.1:9"):
        run_dask([task], "tcp://127.0.0.1:9", connect_timeout_s=1)


def test_per_rank_reports_are_each_ranks_own(tmp_path: Path) -> None:
    folder = tmp_path / "each"
    folder.mkdir()
    _json(
        tmp_path,
        str(TWO_RANKS / "rank-0.json.gz"),
        str(TWO_RANKS / "rank-1.json.gz"),
        "--per-rank",
        str(folder),
    )
    for rank in (0, 1):
        own = _json(tmp_path, str(TWO_RANKS / f"rank-{rank}.json.gz"), name=f"own{rank}.json")
        written = json.loads((folder / f"rank-{rank}.json").read_text())
        own["trace"]["path"] = written["trace"]["path"]
        assert written == own
        assert (folder / f"rank-{rank}.html").read_text().startswith("<!DOCTYPE html>")


# --- which files, which rank -----------------------------------------------------------------


def _tiny_rank(path: Path, shift: float, **top: Any) -> Path:
    events = [annotation("ProfilerStep#1", shift, 1000), *launch(10 + shift, 20 + shift, 50)]
    return write_trace(path, events, **top)


def test_rank_from_file_name_then_order(tmp_path: Path) -> None:
    _tiny_rank(tmp_path / "worker_rank3.json", 0)
    _tiny_rank(tmp_path / "worker_rank1.json", 0)
    _tiny_rank(tmp_path / "other.json", 0)
    job = _json(tmp_path, str(tmp_path / "*.json"))
    found = [(rank["rank"], Path(rank["path"]).name, rank["rank_from"]) for rank in job["ranks"]]
    assert found == [
        (1, "worker_rank1.json", "file name"),
        (2, "other.json", "order"),
        (3, "worker_rank3.json", "file name"),
    ]


def test_two_traces_of_one_rank_are_refused(tmp_path: Path) -> None:
    info = {"distributedInfo": {"rank": 0, "world_size": 2, "backend": "nccl"}}
    _tiny_rank(tmp_path / "a.json", 0, **info)
    _tiny_rank(tmp_path / "b.json", 0, **info)
    result = runner.invoke(app, ["analyze", str(tmp_path), "--no-html"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "two traces say they are rank 0" in result.output


@pytest.mark.parametrize("argument", ["empty", "nothing-*.json.gz"])
def test_no_traces_is_one_line(tmp_path: Path, argument: str) -> None:
    (tmp_path / "empty").mkdir()
    result = runner.invoke(app, ["analyze", str(tmp_path / argument), "--no-html"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1


def test_job_html_and_markdown(job8: Path, tmp_path: Path) -> None:
    page, summary = tmp_path / "job.html", tmp_path / "job.md"
    _analyze(str(job8), "-o", str(page), "--markdown", str(summary))
    html = page.read_text().replace('xmlns="http://www.w3.org/2000/svg"', "")
    assert "<script" not in html and "http://" not in html and "https://" not in html
    assert 'aria-labelledby="arrivals-title"' in html  # the arrivals chart
    assert '<th class="num">wait</th><th class="num">transfer</th><th>waiting for</th>' in html
    assert html.count('<tr class="straggler">') == 2
    assert all(f"<td>{rank}</td>" in html for rank in range(8))
    text = summary.read_text()
    assert "rank 2: slow because of DataLoader" in text.replace("\\", "")
    assert "rank 5: slow because of a host sync" in text.replace("\\", "")


def test_a_bad_rank_trace_is_one_line_naming_it(tmp_path: Path) -> None:
    _tiny_rank(tmp_path / "rank-0.json", 0)
    (tmp_path / "rank-1.json").write_text("{not json")
    result = runner.invoke(app, ["analyze", str(tmp_path), "--no-html", "--workers", "2"])
    assert result.exit_code == 2
    assert result.output.count("\n") == 1 and "rank-1.json" in result.output


def _result(rank: int, starts: list[int], ends: list[int] | None = None) -> Any:
    from traceinsight.analysis.usage import Usage
    from traceinsight.job.rank import Collective, rank_result

    usage = Usage(
        device=-1, window_ns=1000, compute_ns=500, communication_ns=100, copy_ns=0, idle=(), steps=1
    )
    ends = ends if ends is not None else [start + 5 for start in starts]
    return rank_result(
        rank=rank, rank_from="order", path=f"r{rank}.json", world_size=None, backend=None, usage=usage,
        has_usage=True, step_ns=1000, communication_total_ns=100, steady_syncs=0, findings=(),
        collectives=tuple(Collective("AllReduce", start, end) for start, end in zip(starts, ends, strict=True)),
        collectives_from="gpu", warnings=(), steps_ns=((1, 0, 10**9),),
    )  # fmt: skip


def test_lateness_and_waits_by_hand() -> None:
    """Starts (ns) r0: 0, 100; r1: 10, 100; r2: 50, 300; every rank leaves at 55 and 305. Medians
    10 and 100; r2 is last in both. Wait: the last start − the rank's; transfer: the end − the last
    start."""
    from traceinsight.job import combine

    ends = [55, 305]
    job = combine([_result(2, [50, 300], ends), _result(0, [0, 100], ends), _result(1, [10, 100], ends)])
    timings = {rank.rank: rank.collectives for rank in job.ranks if rank.collectives is not None}
    timing = {
        r: (t.late_median_ns, t.late_max_ns, t.waited_ns, t.others_waited_ns) for r, t in timings.items()
    }
    assert timing == {
        0: (-10, 0, 50 + 200, 0),
        1: (0, 0, 40 + 200, 0),
        2: (40, 200, 0, 50 + 40 + 200 + 200),
    }
    split = {r: (t.wait_ns, t.transfer_ns, t.waited_for) for r, t in timings.items()}
    assert split == {0: (250, 10, 2), 1: (240, 10, 2), 2: (0, 10, None)}
    assert timings[2].others_mean_wait_ns == round((50 + 200) / 2 + (40 + 200) / 2)
    assert job.job.collectives.matched == 2
    clock = job.job.collectives.clock
    assert (clock.aligned_ranks, clock.residual_ns) == (3, 0)


def test_clocks_are_aligned_on_the_collectives_ends() -> None:
    """Rank 1's clock runs 70 µs ahead: its starts and ends are 70 µs later than they were. The
    offset is found from the ends, and its wait is the one on the common clock."""
    from traceinsight.job import combine

    skew = 70_000
    job = combine(
        [
            _result(0, [0, 100_000], [50_000, 150_000]),
            _result(1, [20_000 + skew, 100_000 + skew], [50_000 + skew, 150_000 + skew]),
            _result(2, [30_000, 130_000], [50_000, 150_000]),
        ]
    )
    timing = {rank.rank: rank.collectives for rank in job.ranks if rank.collectives is not None}
    assert timing[1].clock_offset_ns == skew and timing[1].clock_aligned
    assert timing[0].wait_ns == 30_000 + 30_000  # the last arrival is rank 2's both times
    assert timing[1].wait_ns == 10_000 + 30_000
    assert timing[0].transfer_ns == timing[1].transfer_ns == 20_000 + 20_000
    assert timing[2].others_mean_wait_ns == round((30_000 + 10_000) / 2 + (30_000 + 30_000) / 2)


# --- collectives matched by process group and sequence number (kineto PRs 1296, 1483) ----------------

_NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*, unsigned long, ncclWork*)"


def _group_rank(path: Path, rank: int, order: list[tuple[str, int, float]]) -> Path:
    """A rank of a 2-rank job whose all-reduces run in two process groups, in ``order``:
    (group name, sequence number, start µs) per collective, each kernel carrying ``Process Group
    Name`` and ``Seq`` as Kineto writes them on communication kernels since 2026."""
    events: list[dict[str, Any]] = [annotation("ProfilerStep#1", 0, 10_000)]
    for group, seq, start in order:
        calls = launch(start - 30, start, 200)
        calls[1]["name"] = _NCCL
        calls[1]["args"].update(
            {"Collective name": "allreduce", "In msg nelems": 1024, "Out msg nelems": 1024, "Group size": 2,
             "dtype": "Float", "Process Group Name": group, "Process Group Description": f"group {group}",
             "Process Group Ranks": "[0, 1]", "Seq": seq}
        )  # fmt: skip
        events += calls
    return write_trace(path, events, distributedInfo={"backend": "nccl", "rank": rank, "world_size": 2})


def test_collectives_are_matched_by_process_group_and_sequence_number(tmp_path: Path) -> None:
    """Rank 0 runs group "0"'s all-reduce before group "1"'s, rank 1 the other way round: matched by
    order (both are AllReduce) each rank's first would be paired, 50 µs apart; by group and sequence
    number they are 1.05 ms apart. Lateness and waits from the raw kernels' args."""
    folder = tmp_path / "job"
    folder.mkdir()
    plans = {
        0: [("0", 1, 1_000.0), ("1", 1, 2_000.0), ("0", 2, 3_000.0), ("1", 2, 4_000.0)],
        1: [("1", 1, 1_050.0), ("0", 1, 2_050.0), ("1", 2, 3_050.0), ("0", 2, 4_050.0)],
    }
    for rank, order in plans.items():
        _group_rank(folder / f"rank-{rank}.json", rank, order)
    starts: dict[tuple[str, int], dict[int, int]] = {}
    for rank in plans:
        _, raw = read_events(folder / f"rank-{rank}.json")
        for e in raw:
            if e.get("cat") == "kernel":
                key = (e["args"]["Process Group Name"], e["args"]["Seq"])
                starts.setdefault(key, {})[rank] = round(e["ts"] * 1000)
    waited = {rank: sum(max(s.values()) - s[rank] for s in starts.values()) for rank in plans}
    late = {rank: sorted(s[rank] - median_low(s.values()) for s in starts.values()) for rank in plans}
    job = _json(tmp_path, str(folder))
    assert job["job"]["collectives"]["matched"] == len(starts) == 4
    for entry in job["ranks"]:
        rank = entry["rank"]
        collectives = entry["collectives"]
        assert collectives["waited_us"] * 1000 == waited[rank]
        assert collectives["late_max_us"] * 1000 == max(late[rank])
        assert collectives["late_median_us"] * 1000 == median_low(late[rank])
    assert waited == {0: 2 * 1_050_000, 1: 2 * 950_000}  # by order it would be 4 x 50 µs and 0
    assert job["job"]["collectives"]["matched_by_seq"] == 4


def test_collectives_without_sequence_numbers_are_matched_by_order(tmp_path: Path) -> None:
    folder = tmp_path / "job"
    folder.mkdir()
    for rank, offset in ((0, 0.0), (1, 50.0)):
        path = _group_rank(
            folder / f"rank-{rank}.json", rank, [("0", 1, 1_000 + offset), ("0", 2, 2_000 + offset)]
        )
        document = json.loads(path.read_text())
        for event in document["traceEvents"]:
            (event.get("args") or {}).pop("Seq", None)
            if event.get("cat") == "kernel":
                event["dur"] -= offset  # rank 1 arrives 50 µs late; both leave together
        path.write_text(json.dumps(document))
    job = _json(tmp_path, str(folder))
    assert {entry["rank"]: entry["collectives"]["waited_us"] for entry in job["ranks"]} == {0: 100.0, 1: 0.0}
    assert (job["job"]["collectives"]["matched"], job["job"]["collectives"]["matched_by_seq"]) == (2, 0)


# --- issue 31: the job folder and its names are untrusted ------------------------------------------


def _two_ranks(folder: Path) -> list[Path]:
    folder.mkdir(parents=True, exist_ok=True)
    info = lambda rank: {"distributedInfo": {"rank": rank, "world_size": 2, "backend": "nccl"}}  # noqa: E731
    return [_tiny_rank(folder / f"rank-{rank}.json", rank * 5, **info(rank)) for rank in (0, 1)]


def test_per_rank_into_the_traces_folder_never_replaces_a_trace(tmp_path: Path) -> None:
    """--per-rank at the traces' own folder would have replaced rank-0.json and rank-1.json with
    result JSON: refused before any analysis, the inputs untouched."""
    traces = _two_ranks(tmp_path / "traces")
    before = {path: path.read_bytes() for path in traces}
    for argument in (str(tmp_path / "traces"), *map(str, traces)):
        result = runner.invoke(app, ["analyze", argument, str(traces[1]), "--no-html", "--per-rank",
                                     str(tmp_path / "traces")])  # fmt: skip
        assert result.exit_code == 2, result.output
        assert result.stderr.count("\n") == 1 and "a rank's own report would replace" in result.stderr
        assert {path: path.read_bytes() for path in traces} == before
        assert sorted(p.name for p in (tmp_path / "traces").iterdir()) == ["rank-0.json", "rank-1.json"]


def test_per_rank_writes_nothing_when_the_job_fails_its_checks(tmp_path: Path) -> None:
    """Two traces that say they are rank 0: the job is refused, and no rank's report is left behind
    (they were written as each rank finished, before the job's checks)."""
    info = {"distributedInfo": {"rank": 0, "world_size": 2, "backend": "nccl"}}
    _tiny_rank(tmp_path / "a.json", 0, **info)
    _tiny_rank(tmp_path / "b.json", 0, **info)
    out = tmp_path / "each"
    out.mkdir()
    for workers in ("1", "2"):
        result = runner.invoke(app, ["analyze", str(tmp_path / "a.json"), str(tmp_path / "b.json"), "--no-html",
                                     "--per-rank", str(out), "--workers", workers])  # fmt: skip
        assert result.exit_code == 2 and "two traces say they are rank 0" in result.stderr, result.output
        assert list(out.iterdir()) == []  # nor the private folder the workers staged them in


def test_per_rank_reports_go_through_the_output_checks(tmp_path: Path) -> None:
    traces = _two_ranks(tmp_path / "traces")
    out = tmp_path / "each"
    out.mkdir()
    (out / "rank-1.json").write_text("someone's notes")
    result = runner.invoke(app, ["analyze", *map(str, traces), "--no-html", "--per-rank", str(out)])
    assert result.exit_code == 2 and "will not replace" in result.stderr and "--force" in result.stderr
    assert sorted(p.name for p in out.iterdir()) == ["rank-1.json"]  # none written, none staged left
    assert (out / "rank-1.json").read_text() == "someone's notes"
    forced = runner.invoke(
        app, ["analyze", *map(str, traces), "--no-html", "--per-rank", str(out), "--force"]
    )
    assert forced.exit_code == 0, forced.output
    assert sorted(p.name for p in out.iterdir()) == [
        "rank-0.html",
        "rank-0.json",
        "rank-1.html",
        "rank-1.json",
    ]


def test_a_symlink_loop_under_a_double_star_pattern_ends(tmp_path: Path) -> None:
    """Two links to "." made ``**`` endless (42,517 matches in 10 s on the way to 2^40): links to
    folders are not walked, so each trace is found once."""
    traces = _two_ranks(tmp_path / "job")
    (tmp_path / "job" / "loop").symlink_to(".")
    (tmp_path / "job" / "again").symlink_to(tmp_path / "job")
    done = subprocess.run(
        [sys.executable, "-m", "traceinsight", "analyze", str(tmp_path / "job" / "**" / "*.json"), "--no-html",
         "--json", str(tmp_path / "job.json")],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    job = json.loads((tmp_path / "job.json").read_text())
    assert sorted(rank["path"] for rank in job["ranks"]) == sorted(map(str, traces))
    followed = _json(tmp_path, str(tmp_path / "job" / "**" / "*.json"), "--follow-symlinks")
    assert len(followed["ranks"]) == 2  # each real folder walked once


def test_a_symlink_out_of_the_folder_is_skipped_with_a_note(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    _two_ranks(tmp_path / "job")
    (tmp_path / "private").mkdir()
    elsewhere = _tiny_rank(tmp_path / "private" / "rank-2.json", 9)
    (tmp_path / "job" / "rank-2.json").symlink_to(elsewhere)
    monkeypatch.chdir(tmp_path)
    for argument in ("job", "job/*.json", "job/**/*.json"):
        job = _json(tmp_path, argument)
        assert sorted(rank["path"] for rank in job["ranks"]) == ["job/rank-0.json", "job/rank-1.json"]
        note = next(w for w in job["warnings"] if w.startswith("skipped 1 symbolic link"))
        assert "leading out of job" in note and "job/rank-2.json" in note and "--follow-symlinks" in note
        assert "private" not in json.dumps(job)  # the link's target is never written
        followed = _json(tmp_path, argument, "--follow-symlinks")
        assert sorted(rank["path"] for rank in followed["ranks"]) == [
            "job/rank-0.json", "job/rank-1.json", "job/rank-2.json"]  # fmt: skip


def test_rank_paths_are_as_given_with_control_characters_replaced(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """ranks[].path was the resolved absolute path (the analyst's home layout in a shared file), and
    raw control characters of a file name stayed in job.json."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "real").mkdir()
    (tmp_path / "link").symlink_to(tmp_path / "real")
    evil = "rank-1\x1b]0;x\x07\x1b[2J.json"
    _tiny_rank(tmp_path / "real" / "rank-0.json", 0)
    _tiny_rank(tmp_path / "real" / evil, 5)
    out = tmp_path / "job.json"
    (tmp_path / "each").mkdir()
    result = runner.invoke(
        app,
        ["analyze", "link", "--no-html", "--json", str(out), "--markdown", "job.md", "--per-rank", "each"],
    )
    assert result.exit_code == 0, result.output
    paths = sorted(rank["path"] for rank in json.loads(out.read_text())["ranks"])
    assert paths == ["link/rank-0.json", "link/rank-1\ufffd]0;x\ufffd\ufffd[2J.json"]
    own = [
        json.loads((tmp_path / "each" / f"rank-{rank}.json").read_text())["trace"]["path"] for rank in (0, 1)
    ]
    assert own == paths  # each rank's own report names its trace the same way
    for text in ((tmp_path / "job.md").read_text(), result.stdout):
        assert "\x1b" not in text and "\x07" not in text


def test_the_pool_is_sized_from_what_a_gzip_holds_not_its_trailer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The gzip trailer is the file's own claim: a rank that says 1000 bytes and inflates to 64 MiB
    takes a worker's share of memory as 64 MiB (the pool trusted the claim, and started 3 workers
    where memory holds 2)."""
    import gzip

    from traceinsight.job import execute
    from traceinsight.job.rank import RankTask
    from traceinsight.thresholds import Thresholds

    event = b'{"ph": "X", "cat": "cpu_op", "name": "a", "pid": 1, "tid": 1, "ts": 1, "dur": 1},'
    text = b'{"traceEvents": [' + event * ((64 << 20) // len(event)) + b"{}]}"
    packed = bytearray(gzip.compress(text, compresslevel=6, mtime=0))
    packed[-4:] = (1000).to_bytes(4, "little")  # ISIZE: what the file says it holds
    path = tmp_path / "rank-0.json.gz"
    path.write_bytes(packed)
    per_worker = execute.WORKER_BASE_BYTES + execute.MEMORY_PER_JSON_BYTE * len(text)
    monkeypatch.setattr(execute, "_available_memory", lambda: int(2.5 * per_worker))
    monkeypatch.setattr(execute, "available_cores", lambda: 8)
    tasks = [
        RankTask(path=str(path), name_rank=rank, order=rank, thresholds=Thresholds()) for rank in range(8)
    ]
    assert execute.pool_size(tasks) == 2


# --- job folders as people keep them (issue 33) ----------------------------------------------


def _has_trace_events(path: Path) -> bool:
    raw = path.read_bytes()
    value = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return isinstance(value, dict) and "traceEvents" in value


def test_a_ddp_folder_holding_its_own_job_json_and_a_config_analyzes(tmp_path: Path) -> None:
    folder = tmp_path / "traces"
    folder.mkdir()
    for trace in TWO_RANKS.glob("*.json.gz"):
        (folder / trace.name).write_bytes(trace.read_bytes())
    (folder / "config.json").write_text(json.dumps({"lr": 0.1, "batch_size": 32, "schema": "v2"}))
    (folder / "metadata.json").write_text(json.dumps([{"host": "node-1"}]))
    first = _json(tmp_path, str(folder), name="traces/job.json")  # the job's JSON beside its traces
    result = runner.invoke(app, ["analyze", str(folder), "--no-html", "--json", str(tmp_path / "again.json")])
    assert result.exit_code == 0, result.output
    again = json.loads((tmp_path / "again.json").read_text())
    traces = sorted(p.name for p in folder.iterdir() if _has_trace_events(p))
    assert (
        sorted(Path(rank["path"]).name for rank in again["ranks"])
        == traces
        == sorted(Path(rank["path"]).name for rank in first["ranks"])
    )
    note = next(w for w in again["warnings"] if w.startswith("skipped what is not a trace"))
    assert all(name in note for name in ("job.json", "config.json", "metadata.json"))
    assert "job.json (a traceinsight result)" in note
    assert again["ranks"] == first["ranks"]
    assert "skipped what is not a trace" in result.stdout  # said on the terminal too


def test_a_folder_without_a_trace_is_one_line_before_any_analysis(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text('{"lr": 0.1}')
    (tmp_path / "metadata.json").write_text("{}")
    result = runner.invoke(app, ["analyze", str(tmp_path), "--no-html"])
    assert result.exit_code == 2 and result.stderr.count("\n") == 1
    assert "no traces to analyze" in result.stderr and "config.json" in result.stderr


def _cycle(path: Path, prep_us: float) -> Path:
    from loops import item_loop

    return write_trace(path, item_loop(prep_us=prep_us).events)


def test_a_tensorboard_log_folder_of_one_process_is_read_as_its_cycles(tmp_path: Path) -> None:
    """tensorboard_trace_handler writes <host>_<pid>.<time ns>.pt.trace.json per profiler cycle;
    no distributedInfo. Three such files are one process's cycles, in time order (the times here
    sort differently as text), side by side, no straggler however different they are."""
    folder = tmp_path / "log"
    folder.mkdir()
    written = [
        _cycle(folder / "gpu-node_4242.999999999999.pt.trace.json", prep_us=300),
        _cycle(folder / "gpu-node_4242.1000000000000.pt.trace.json", prep_us=5000),
        _cycle(folder / "gpu-node_4242.1000000000500.pt.trace.json", prep_us=300),
    ]
    result = runner.invoke(app, ["analyze", str(folder), "--no-html", "--json", str(tmp_path / "job.json")])
    assert result.exit_code == 0, result.output
    job = json.loads((tmp_path / "job.json").read_text())
    assert job["job"]["read_as"] == "cycles" and job["job"]["cycles_of"] == "gpu-node_4242"
    assert [Path(cycle["path"]).name for cycle in job["ranks"]] == [path.name for path in written]
    assert job["stragglers"] == [] and job["job"]["collectives"]["matched"] == 0
    assert not any("stragglers are named" in warning for warning in job["warnings"])
    from reference_split import step_windows

    for cycle, path in zip(job["ranks"], written, strict=True):
        windows = step_windows(read_events(path)[1])
        expected = statistics.median((w.done - w.begin) / 1000 for w in windows)
        assert cycle["step_time_us"] == pytest.approx(expected, rel=0.05)
    assert job["ranks"][1]["step_time_us"] > 2 * job["ranks"][0]["step_time_us"]
    assert "3 profiler cycles of one process (gpu-node_4242), not ranks" in result.stdout
    assert "Cycles" in result.stdout and "Stragglers" not in result.stdout


def test_per_rank_creates_its_folder(tmp_path: Path) -> None:
    out = tmp_path / "reports" / "each"
    _analyze(str(TWO_RANKS), "--no-html", "--per-rank", str(out))
    assert sorted(p.name for p in out.iterdir()) == [
        "rank-0.html",
        "rank-0.json",
        "rank-1.html",
        "rank-1.json",
    ]


def test_job_savings_are_per_step_the_median_ranks_and_the_sum_labelled(tmp_path: Path) -> None:
    job = _json(tmp_path, str(TWO_RANKS))
    own: dict[int, dict[str, float]] = {}
    for rank in (0, 1):
        document = _json(tmp_path, str(TWO_RANKS / f"rank-{rank}.json.gz"), name=f"own{rank}.json")
        steps = document["steady_state"]["steady_steps"]
        for finding in document["findings"]:  # per step: the rank's total over its steady steps
            own.setdefault(rank, {}).setdefault(finding["rule"], 0.0)
            own[rank][finding["rule"]] += finding["savings_us"] / steps
    split = {entry["rank"]: entry["collectives"] for entry in job["ranks"]}
    for finding in job["findings"]:
        values = [own[rank][finding["rule"]] for rank in finding["ranks"]]
        aligned = [split[rank]["clock_aligned"] for rank in finding["ranks"]]
        if finding["rule"] == "exposed-communication" and any(aligned):  # the transfer only (issue 49)
            values = [
                value * split[rank]["exposed_transfer_us"]
                / (split[rank]["exposed_transfer_us"] + split[rank]["exposed_wait_us"]) if split[rank]["clock_aligned"]
                else value
                for rank, value in zip(finding["ranks"], values, strict=True)
            ]  # fmt: skip
            assert "transfer only" in finding["note"]
        assert finding["savings_per_step_us"] == pytest.approx(median_low(values), abs=0.01)
        assert finding["savings_per_step_all_ranks_us"] == pytest.approx(sum(values), abs=0.02)
    terminal = runner.invoke(app, ["analyze", str(TWO_RANKS), "--no-html"]).stdout
    assert "(all ranks)" not in terminal and "per step (median rank;" in terminal


# --- the gate on a job (issue 33) -------------------------------------------------------------


def test_a_job_breaks_a_budget_when_any_rank_does_and_the_line_names_it(tmp_path: Path) -> None:
    idle = {}
    for rank in (0, 1):
        own = _json(tmp_path, str(TWO_RANKS / f"rank-{rank}.json.gz"), name=f"own{rank}.json")
        idle[rank] = own["utilization"]["idle_share"] * 100
    assert idle[0] != idle[1]
    worse = max(idle, key=lambda rank: idle[rank])
    between = (idle[0] + idle[1]) / 2
    result = runner.invoke(app, ["analyze", str(TWO_RANKS), "--no-html", "--max-idle", f"{between:.4f}"])
    gate = [line for line in result.stderr.splitlines() if line.startswith("traceinsight: gate: ")]
    assert result.exit_code == 1 and len(gate) == 1, result.output
    assert gate[0].startswith(f"traceinsight: gate: rank {worse}: ") and "over --max-idle" in gate[0]
    above = max(idle.values()) + 1
    result = runner.invoke(app, ["analyze", str(TWO_RANKS), "--no-html", "--max-idle", f"{above:.4f}"])
    assert result.exit_code == 0, result.output


def test_a_job_gate_on_a_rule_counts_every_rank(tmp_path: Path) -> None:
    # both ranks copy from pageable memory ("Memcpy HtoD (Pageable -> Device)" in the raw events)
    for rank in (0, 1):
        _, events = read_events(TWO_RANKS / f"rank-{rank}.json.gz")
        assert any("Pageable -> Device" in str(e.get("name")) for e in events)
    result = runner.invoke(app, ["analyze", str(TWO_RANKS), "--no-html", "--fail-on-rule", "pageable-memcpy"])
    gate = [line for line in result.stderr.splitlines() if line.startswith("traceinsight: gate: ")]
    assert result.exit_code == 1
    assert sorted(line.split(":")[2].strip() for line in gate) == ["rank 0", "rank 1"]


# --- the API from a plain script -------------------------------------------------------------


_PLAIN_SCRIPT = """\
import sys
import traceinsight
job = traceinsight.analyze(sys.argv[1])  # module level: no main guard
open(sys.argv[2], "w", encoding="utf-8").write(job.to_json())
"""


def test_a_plain_script_analyzes_a_job_folder_with_stray_json_as_the_command_does(tmp_path: Path) -> None:
    """``traceinsight.analyze(folder)`` at a script's module level (no ``if __name__ ==
    "__main__":``): the workers never import the script (a multiprocessing pool did, and died with
    BrokenProcessPool); a config.json beside the traces is skipped with the command's note; the
    JSON is the command's, byte for byte."""
    folder = tmp_path / "job"
    traces = _two_ranks(folder)
    (folder / "config.json").write_text('{"lr": 0.1}', encoding="utf-8")
    script = tmp_path / "plain.py"
    script.write_text(_PLAIN_SCRIPT, encoding="utf-8")
    written = tmp_path / "api.json"
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, str(script), str(folder), str(written)],
        capture_output=True, text=True, env=environment, timeout=300, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    api = json.loads(written.read_text(encoding="utf-8"))
    assert [rank["rank"] for rank in api["ranks"]] == [0, 1] and len(traces) == 2
    assert any("config.json" in warning for warning in api["warnings"])
    command = tmp_path / "command.json"
    _analyze(str(folder), "--no-html", "--workers", "2", "--json", str(command))
    assert written.read_bytes() == command.read_bytes()


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_the_job_workers_end_with_the_process_that_started_them() -> None:
    """SIGTERM (or SIGKILL) to the process that started the workers: they end too, never
    orphans analyzing on."""

    code = (
        "import os, sys, time\n"
        "from traceinsight.job.worker import Workers\n"
        "pool = Workers(2)\n"
        "print(' '.join(str(worker.pid) for worker in pool._started), flush=True)\n"
        "time.sleep(60)\n"
    )
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    parent = subprocess.Popen(
        [sys.executable, "-c", code], stdout=subprocess.PIPE, text=True, env=environment
    )
    assert parent.stdout is not None
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2
    parent.send_signal(signal.SIGTERM)
    parent.wait(timeout=30)
    deadline = time.monotonic() + 10
    alive = set(workers)
    while alive and time.monotonic() < deadline:
        for pid in list(alive):
            status = Path(f"/proc/{pid}/status")
            try:
                if "\tZ" in status.read_text() or not status.exists():  # gone, or a zombie
                    alive.discard(pid)
            except OSError:
                alive.discard(pid)
        time.sleep(0.1)
    assert not alive


def test_the_job_workers_import_nothing_from_the_working_folder(tmp_path: Path) -> None:
    """A job analyzed where a stranger's files were unpacked: a ``pickle.py`` (or a ``traceinsight/``)
    planted in the working folder never runs in a worker (``python -m``/``-c`` put that folder first
    on ``sys.path``)."""
    unpacked = tmp_path / "unpacked"
    (unpacked / "traceinsight").mkdir(parents=True)
    marker = tmp_path / "planted-code-ran"
    planted = f"open({str(marker)!r}, 'a').write('x')\n"
    (unpacked / "pickle.py").write_text(planted + "raise ImportError('planted')\n")
    (unpacked / "traceinsight" / "__init__.py").write_text(planted)
    folder = unpacked / "job"
    folder.mkdir()
    for trace in (SAMPLES / "two_ranks").iterdir():
        shutil.copyfile(trace, folder / trace.name)
    code = "from traceinsight.api import analyze\nprint(len(analyze('job').ranks))\n"
    script = tmp_path / "drive.py"  # outside the working folder: the script's own folder is first
    script.write_text(code)
    environment = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    done = subprocess.run(
        [sys.executable, str(script)],
        cwd=unpacked,
        capture_output=True,
        text=True,
        env=environment,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2"]
    assert not marker.exists()


#: Bugs planted in a job's workers: one that crosses back as it is, one whose pickle does not
#: rebuild it (its ``__init__`` takes two arguments), one that does not pickle (a lambda on it).
_PLANTED_BUGS = {
    "plain": "    raise ZeroDivisionError('made to fail in the worker')\n",
    "unrebuildable": (
        "    class OddError(Exception):\n"
        "        def __init__(self, a, b):\n"
        "            super().__init__(f'made to fail in the worker {a}')\n"
        "    raise OddError(1, 2)\n"
    ),
    "unpicklable": (
        "    error = ValueError('made to fail in the worker')\n"
        "    error.hook = lambda: None\n"
        "    raise error\n"
    ),
}


@pytest.mark.parametrize("bug", list(_PLANTED_BUGS))
def test_a_bug_in_a_worker_is_one_line_and_its_traceback_under_debug(tmp_path: Path, bug: str) -> None:
    """An internal error while a worker analyzes a rank: one line and status 3, as in one trace's
    analyze, whether or not the error itself can cross back between the processes; under
    ``TRACEINSIGHT_DEBUG=1`` the traceback shows where it happened in the worker (the worker's own
    frames, and the rank), not only where the main process raised it again. The bug is planted in
    every process of the run by a ``sitecustomize`` module on its path."""
    job = tmp_path / "job"
    job.mkdir()
    for rank in (0, 1):
        _tiny_rank(job / f"rank{rank}.json", 0)
    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "sitecustomize.py").write_text(
        "import traceinsight.job.rank as rank\n"
        "def planted_bug(task):\n"
        f"{_PLANTED_BUGS[bug]}"
        "rank.analyze_rank = planted_bug\n"
    )
    repo = Path(__file__).resolve().parent.parent
    command = [sys.executable, "-m", "traceinsight", "analyze", str(job), "--no-html", "--workers", "2"]
    environment = {"PATH": "/usr/bin:/bin", "PYTHONPATH": f"{planted}{os.pathsep}{repo}"}
    plain = subprocess.run(
        command, capture_output=True, text=True, env=environment, timeout=300, cwd=tmp_path
    )
    assert plain.returncode == 3, plain.stderr
    assert plain.stderr.count("\n") == 1 and "internal error" in plain.stderr, plain.stderr
    assert "made to fail in the worker" in plain.stderr
    debug = subprocess.run(
        command, capture_output=True, text=True, env={**environment, "TRACEINSIGHT_DEBUG": "1"}, timeout=300,
        cwd=tmp_path,
    )  # fmt: skip
    assert debug.returncode != 0
    assert "in the worker analyzing" in debug.stderr and "rank" in debug.stderr
    assert "in planted_bug" in debug.stderr and "sitecustomize.py" in debug.stderr  # the worker's frame
    assert "The above exception was the direct cause" in debug.stderr
