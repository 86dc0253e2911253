"""``traceinsight diff`` of two jobs (issue 33): job results, folders and patterns compared as a whole,
rank by rank, by stragglers and by findings. Expected figures come from the raw events (plain JSON
and Python), never from the tool's output.

Job A: 4 ranks whose hosts run ahead of their GPUs, rank 1 starved by its DataLoader (a straggler,
``dataloader-stall``). Job B: 5 ranks, rank 2 calling ``.item()`` in forward (a new straggler, a
new ``sync-in-loop``), rank 4 in B only. See :class:`jobbuild.AheadPlan`.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from statistics import median_low
from typing import Any

import pytest
from jobbuild import AheadPlan, jitter_us, make_ahead_job
from markdown_it import MarkdownIt
from reference_split import step_windows
from test_job import _own_idle
from tracebuild import SAMPLES, read_events
from typer.testing import CliRunner

from traceinsight.commands import app

runner = CliRunner()
BEFORE = AheadPlan(4, dataloader_rank=1)
AFTER = AheadPlan(5, item_rank=2)
NCCL = "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)"


def invoke(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, list(args))
    return result.exit_code, result.stdout, result.stderr


@pytest.fixture(scope="module")
def jobs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The two jobs' folders (``A``, ``B``) and their results of analyze --json (``A.json``, ``B.json``)."""
    root = tmp_path_factory.mktemp("jobdiff")
    made = {}
    for name, plan in (("A", BEFORE), ("B", AFTER)):
        make_ahead_job(root / name, plan)
        code, _, stderr = invoke(
            "analyze", str(root / name), "--no-html", "--json", str(root / f"{name}.json")
        )
        assert code == 0, stderr
        made[name], made[f"{name}.json"] = root / name, root / f"{name}.json"
    return made


def diff_json(tmp_path: Path, before: Path | str, after: Path | str, *more: str) -> dict[str, Any]:
    out = tmp_path / "diff.json"
    code, _, stderr = invoke("diff", str(before), str(after), "--no-html", "--json", str(out), *more)
    assert code == 0, stderr
    document: dict[str, Any] = json.loads(out.read_text())
    return document


# --- figures from the raw events -------------------------------------------------------------------


def _events(folder: Path, rank: int) -> list[dict[str, Any]]:
    _, events = read_events(folder / f"rank-{rank}.json")
    return events


def _expected(folder: Path, plan: AheadPlan) -> dict[str, Any]:
    """Per rank (µs): the median step (the spacing of when each step's work was done), the
    all-reduce time per step, its wait in the all-reduces per step (the last rank's start less its
    own), its median lateness (its start less the median rank's); and each rank's own idle by cause."""
    steps, communication, starts, own = {}, {}, {}, {}
    for rank in range(plan.ranks):
        events = _events(folder, rank)
        windows = step_windows(events)
        steps[rank] = sorted(w.done - w.begin for w in windows)[len(windows) // 2] / 1000
        nccl = sorted(
            (e for e in events if e.get("cat") == "kernel" and e["name"] == NCCL), key=lambda e: e["ts"]
        )
        communication[rank] = sum(e["dur"] for e in nccl) / plan.steps
        # on the job's clock: the ranks' clocks are aligned on the collectives' ends, which here
        # differ by the builder's jitter alone (issue 49)
        starts[rank] = [e["ts"] - jitter_us(rank) for e in nccl]
        own[rank] = _own_idle(events)
    count = plan.steps
    waited = {
        rank: sum(max(starts[other][i] for other in starts) - starts[rank][i] for i in range(count))
        / plan.steps
        for rank in starts
    }
    late = {
        rank: median_low([starts[rank][i] - median_low([starts[o][i] for o in starts]) for i in range(count)])
        for rank in starts
    }
    return {"step": steps, "communication": communication, "waited": waited, "late": late, "own": own}


def _excess(expected: dict[str, Any], plan: AheadPlan, rank: int, cause: str) -> float:
    """A straggler's own idle of ``cause`` per step above the median rank's, µs."""
    own = expected["own"]
    middle = median_low(round(idle[cause] / plan.steps) for idle in own.values())
    return (round(own[rank][cause] / plan.steps) - middle) / 1000


@pytest.fixture(scope="module")
def expected(jobs: dict[str, Path]) -> dict[str, dict[str, Any]]:
    return {"before": _expected(jobs["A"], BEFORE), "after": _expected(jobs["B"], AFTER)}


def _metrics(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {entry["key"]: entry for entry in entries}


# --- job.json vs job.json --------------------------------------------------------------------------


def test_two_job_results_compare_as_a_whole_and_rank_by_rank(
    jobs: dict[str, Path], expected: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    """Was: 'it is a job's result (several ranks)', exit 2."""
    document = diff_json(tmp_path, jobs["A.json"], jobs["B.json"])
    assert document["kind"] == "job-diff" and document["tool"]["kind"] == "diff"
    job = _metrics(document["metrics"])
    for side in ("before", "after"):
        steps = expected[side]["step"]
        assert job["step_time"][side] == pytest.approx(median_low(steps.values()), abs=0.001)
        assert job["slowest_step"][side] == pytest.approx(max(steps.values()), abs=0.001)
        assert job["waited_all_ranks"][side] == pytest.approx(
            sum(expected[side]["waited"].values()), abs=0.01
        )
        assert job["late_latest"][side] == pytest.approx(max(expected[side]["late"].values()), abs=0.001)
        communication = expected[side]["communication"]
        assert job["communication"][side] == pytest.approx(
            sum(communication.values()) / len(communication), abs=0.001
        )
    assert (job["ranks"]["before"], job["ranks"]["after"]) == (BEFORE.ranks, AFTER.ranks)
    for side in ("before", "after"):  # the job's figures are the ranks' means: the causes add up
        causes = sum(metric[side] for metric in document["idle_by_cause"])
        assert causes == pytest.approx(job["idle"][side], abs=0.01)
    assert job["step_time"]["change"] == pytest.approx(job["step_time"]["after"] - job["step_time"]["before"])
    # ranks matched by number; rank 4 is in B only
    ranks = {entry["rank"]: entry for entry in document["ranks"]}
    assert sorted(ranks) == [0, 1, 2, 3, 4]
    assert {rank: entry["present"] for rank, entry in ranks.items()} == {0: "both", 1: "both", 2: "both", 3: "both",
                                                                         4: "after"}  # fmt: skip
    assert ranks[4]["before_path"] is None and ranks[4]["after_path"].endswith("rank-4.json")
    for rank, entry in ranks.items():
        figures = _metrics(entry["metrics"])
        for side in ("before", "after"):
            if rank not in expected[side]["step"]:
                assert all(metric[side] is None for metric in figures.values())
                continue
            assert figures["step_time"][side] == pytest.approx(expected[side]["step"][rank], abs=0.001)
            assert figures["communication"][side] == pytest.approx(
                expected[side]["communication"][rank], abs=0.001
            )
            assert figures["waited"][side] == pytest.approx(expected[side]["waited"][rank], abs=0.001)
            assert figures["late_median"][side] == pytest.approx(expected[side]["late"][rank], abs=0.001)
    assert "rank 4 only after" in document["notes"]


def test_stragglers_gone_and_new_with_their_causes(
    jobs: dict[str, Path], expected: dict[str, dict[str, Any]], tmp_path: Path
) -> None:
    document = diff_json(tmp_path, jobs["A.json"], jobs["B.json"])
    stragglers = {entry["rank"]: entry for entry in document["stragglers"]}
    assert set(stragglers) == {BEFORE.dataloader_rank, AFTER.item_rank}
    gone, new = stragglers[BEFORE.dataloader_rank], stragglers[AFTER.item_rank]
    assert gone["status"] == "gone" and (gone["before_cause"], gone["after_cause"]) == ("dataloader", None)
    assert gone["before_cause_excess_per_step_us"] == pytest.approx(
        _excess(expected["before"], BEFORE, 1, "dataloader"), abs=0.001
    )
    assert gone["after_cause_words"] is None and gone["before_cause_words"] == "DataLoader"
    assert new["status"] == "new" and (new["before_cause"], new["after_cause"]) == (None, "sync")
    assert new["after_cause_excess_per_step_us"] == pytest.approx(
        _excess(expected["after"], AFTER, 2, "sync"), abs=0.001
    )


def test_findings_fixed_new_and_still_by_rule_with_per_step_savings(
    jobs: dict[str, Path], tmp_path: Path
) -> None:
    document = diff_json(tmp_path, jobs["A.json"], jobs["B.json"])
    findings = {entry["rule"]: entry for entry in document["findings"]}
    fixed = {rule for rule, entry in findings.items() if entry["status"] == "fixed"}
    new = {rule for rule, entry in findings.items() if entry["status"] == "new"}
    assert "dataloader-stall" in fixed and "sync-in-loop" in new
    # each fired on the rank it was planted on
    assert findings["dataloader-stall"]["before_ranks"] == [BEFORE.dataloader_rank]
    assert findings["dataloader-stall"]["after_ranks"] == []
    assert findings["sync-in-loop"]["after_ranks"] == [AFTER.item_rank]
    assert findings["dataloader-stall"]["after_savings_per_step_us"] is None
    assert findings["sync-in-loop"]["before_savings_per_step_us"] is None
    # in the job view's unit: per step, the median rank's, as each job's own result says it
    for side, name in (("before", "A.json"), ("after", "B.json")):
        own = {entry["rule"]: entry for entry in json.loads(jobs[name].read_text())["findings"]}
        for rule, entry in findings.items():
            if rule in own:
                assert entry[f"{side}_savings_per_step_us"] == own[rule]["savings_per_step_us"]
                assert (
                    entry[f"{side}_savings_per_step_all_ranks_us"]
                    == own[rule]["savings_per_step_all_ranks_us"]
                )
    # a saving per step is at most the step (the raw events' median step of each side)
    for entry in findings.values():
        for side, plan, folder in (("before", BEFORE, jobs["A"]), ("after", AFTER, jobs["B"])):
            saving = entry[f"{side}_savings_per_step_us"]
            if saving is not None:
                windows = step_windows(_events(folder, 0))
                assert saving <= sorted(w.done - w.begin for w in windows)[plan.steps // 2] / 1000


def test_a_job_with_itself_changes_nothing_and_keeps_its_straggler(
    jobs: dict[str, Path], tmp_path: Path
) -> None:
    document = diff_json(tmp_path, jobs["A.json"], jobs["A.json"])
    assert document["notes"] == []
    assert all(metric["change"] in (0, None) for metric in document["metrics"] + document["idle_by_cause"])
    assert [
        (s["rank"], s["status"], s["before_cause"], s["after_cause"]) for s in document["stragglers"]
    ] == [(BEFORE.dataloader_rank, "still", "dataloader", "dataloader")]
    assert {entry["status"] for entry in document["findings"]} == {"still"}


# --- folders and patterns: the job path of analyze ------------------------------------------------


def _figures(document: dict[str, Any]) -> dict[str, Any]:
    """The comparison without the sides' names and the ranks' paths."""
    kept = {key: value for key, value in document.items() if key not in ("before", "after")}
    kept["ranks"] = [
        {k: v for k, v in entry.items() if not k.endswith("_path")} for entry in document["ranks"]
    ]
    return kept


def test_two_folders_compare_as_their_stored_results(jobs: dict[str, Path], tmp_path: Path) -> None:
    """Was: 'cannot read trace A: it is a directory'."""
    stored = diff_json(tmp_path, jobs["A.json"], jobs["B.json"])
    folders = diff_json(tmp_path, jobs["A"], jobs["B"])
    assert (folders["before"], folders["after"]) == ("A", "B")
    assert _figures(folders) == _figures(stored)
    # a stored baseline against a folder (the CI case)
    assert _figures(diff_json(tmp_path, jobs["A.json"], jobs["B"])) == _figures(stored)


def test_what_a_job_folder_holds_that_is_not_a_trace_is_skipped_and_said(
    jobs: dict[str, Path], tmp_path: Path
) -> None:
    """A folder beside its own job.json and a config.json (issue 33 item 2) compares as the folder
    alone, and diff says what it skipped, as analyze does (it used to skip them silently)."""
    kept = tmp_path / "A"
    kept.mkdir()
    for trace in jobs["A"].glob("rank-*.json"):
        (kept / trace.name).write_bytes(trace.read_bytes())
    (kept / "job.json").write_bytes(jobs["A.json"].read_bytes())
    (kept / "config.json").write_text('{"lr": 0.1, "batch_size": 64}')
    out = tmp_path / "diff.json"
    code, _, stderr = invoke("diff", str(kept), str(jobs["B"]), "--no-html", "--json", str(out))
    assert code == 0, stderr
    said = [line for line in stderr.splitlines() if "skipped what is not a trace" in line]
    assert len(said) == 1 and said[0].startswith("! BEFORE (A): ")
    assert "job.json" in said[0] and "config.json" in said[0]
    assert _figures(json.loads(out.read_text())) == _figures(diff_json(tmp_path, jobs["A"], jobs["B"]))


def test_two_patterns_compare_as_their_folders(jobs: dict[str, Path], tmp_path: Path) -> None:
    before, after = str(jobs["A"] / "rank-*.json"), str(jobs["B"] / "rank-*.json")
    patterns = diff_json(tmp_path, before, after)
    assert (patterns["before"], patterns["after"]) == (before, after)
    assert _figures(patterns) == _figures(diff_json(tmp_path, jobs["A"], jobs["B"]))


def test_the_default_page_of_two_patterns_is_named_after_their_folders(
    jobs: dict[str, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    code, _, stderr = invoke("diff", str(jobs["A"] / "rank-*.json"), str(jobs["B"] / "rank-?.json"))
    assert code == 0, stderr
    page = tmp_path / "A-vs-B.html"
    text = page.read_text()
    assert "Stragglers gone (1)" in text and "rank 1: DataLoader" in text
    assert "http://" not in text and "https://" not in text and "<script" not in text


# --- what is not a pair of jobs -------------------------------------------------------------------


def test_a_job_beside_a_trace_is_one_line_and_exit_2(jobs: dict[str, Path], tmp_path: Path) -> None:
    trace = SAMPLES / "two_ranks" / "rank-0.json.gz"
    out = tmp_path / "d.json"
    for before, after, words in (
        (jobs["A"], trace, "BEFORE is a job (4 traces) and AFTER one trace"),
        (jobs["A.json"], trace, "BEFORE is a job's result and AFTER one trace"),
        (trace, str(jobs["B"] / "rank-*.json"), "BEFORE is one trace and AFTER a job (5 traces)"),
    ):
        code, _, stderr = invoke("diff", str(before), str(after), "--no-html", "--json", str(out))
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert words in stderr and "give two jobs" in stderr, stderr
        assert not out.exists()


def _older(document: dict[str, Any], schema: int) -> dict[str, Any]:
    """The job's result as traceinsight wrote it before job results had savings per step (schema 1
    before the three kinds shared one version): no job.read_as, no per-step savings."""
    older = json.loads(json.dumps(document))
    older["schema"] = schema
    older["tool"]["version"] = "0.1.0"
    del older["job"]["read_as"], older["job"]["cycles_of"]
    for finding in older["findings"]:
        del finding["savings_per_step_us"], finding["savings_per_step_all_ranks_us"]
    return older


@pytest.mark.parametrize("schema", [1, 2])
def test_a_job_result_is_never_read_as_an_old_trace_schema(
    jobs: dict[str, Path], tmp_path: Path, schema: int
) -> None:
    """A job's result is read by its kind first: the line names an older job result, never "a
    result of schema 1, written before traceinsight measured steps" (a trace's old schema)."""
    current = json.loads(jobs["A.json"].read_text())
    marked = dict(current, schema=1)  # the current keys under the job's old schema number
    older = _older(current, schema)
    for document in (marked, older):
        path = tmp_path / "old-job.json"
        path.write_text(json.dumps(document))
        code, _, stderr = invoke("diff", str(path), str(jobs["B.json"]), "--no-html")
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert (
            "it is a job's result written by traceinsight " in stderr
            and "analyze the job's traces again" in stderr
        )
        assert "measured steps" not in stderr


def test_a_diff_of_two_jobs_given_back_to_diff_is_refused(jobs: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "jobs.json"
    code, _, stderr = invoke(
        "diff", str(jobs["A.json"]), str(jobs["B.json"]), "--no-html", "--json", str(out)
    )
    assert code == 0, stderr
    for sides in ((out, jobs["B.json"]), (jobs["A.json"], out)):
        code, _, stderr = invoke("diff", *map(str, sides), "--no-html")
        assert code == 2 and stderr.count("\n") == 1, stderr
        assert "it is the output of traceinsight diff of two jobs" in stderr


def test_the_job_diff_json_reads_back_as_written(jobs: dict[str, Path], tmp_path: Path) -> None:
    from traceinsight.results import JobComparison

    out = tmp_path / "jobs.json"
    invoke("diff", str(jobs["A.json"]), str(jobs["B.json"]), "--no-html", "--json", str(out))
    text = out.read_text()
    assert JobComparison.from_json(text).to_json() == text


# --- every output ----------------------------------------------------------------------------------


def test_every_output_of_a_job_diff(jobs: dict[str, Path], tmp_path: Path) -> None:
    page, markdown = tmp_path / "jobs.html", tmp_path / "jobs.md"
    code, stdout, stderr = invoke(
        "diff", str(jobs["A.json"]), str(jobs["B.json"]), "-o", str(page), "--markdown", str(markdown)
    )
    assert code == 0, stderr
    # the terminal: piped, laid out 120 columns wide
    assert max(len(line) for line in stdout.splitlines()) <= 120
    for shown in (stdout, markdown.read_text(), page.read_text()):
        text = shown.replace("\\", "")  # Markdown escapes its punctuation
        assert "rank 1: DataLoader" in text and "not a straggler" in text
        assert "rank 2: not a straggler → a host sync" in text
        assert "dataloader-stall" in text and "sync-in-loop" in text
        assert re.search(r"4 \(only after\)", text)
    assert "Stragglers gone (1)" in stdout and "New stragglers (1)" in stdout
    assert "Findings fixed (" in stdout and "Findings new (" in stdout


# --- the gate on two jobs -------------------------------------------------------------------------


def _gate(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if line.startswith("traceinsight: gate: ")]


def test_max_regression_holds_the_median_step_to_before(
    jobs: dict[str, Path], expected: dict[str, dict[str, Any]]
) -> None:
    was = median_low(expected["after"]["step"].values())  # B is faster: B → A is the regression
    now = median_low(expected["before"]["step"].values())
    grew = (now - was) / was * 100
    code, _, stderr = invoke("diff", str(jobs["B.json"]), str(jobs["A.json"]), "--no-html",
                             "--max-regression", f"{grew - 1:.2f}")  # fmt: skip
    gate = _gate(stderr)
    assert code == 1 and len(gate) == 1, stderr
    assert f"the median step time grew {grew:.1f}%" in gate[0]
    code, _, stderr = invoke("diff", str(jobs["B.json"]), str(jobs["A.json"]), "--no-html",
                             "--max-regression", f"{grew + 1:.2f}")  # fmt: skip
    assert code == 0, stderr


@pytest.mark.parametrize("after", ["B", "B.json"])
def test_a_named_rule_trips_on_the_after_job_naming_its_rank(jobs: dict[str, Path], after: str) -> None:
    code, _, stderr = invoke(
        "diff", str(jobs["A.json"]), str(jobs[after]), "--no-html", "--fail-on-rule", "sync-in-loop"
    )
    gate = _gate(stderr)
    assert code == 1 and len(gate) == 1, stderr
    assert gate[0].startswith(f"traceinsight: gate: rank {AFTER.item_rank}: ") and "sync-in-loop" in gate[0]
    # the fixed rule is not held against AFTER
    code, _, stderr = invoke(
        "diff", str(jobs["A.json"]), str(jobs[after]), "--no-html", "--fail-on-rule", "dataloader-stall"
    )
    assert code == 0, stderr


def test_max_syncs_per_step_on_the_after_job_names_the_rank(jobs: dict[str, Path]) -> None:
    syncs = {}
    for rank in range(AFTER.ranks):
        events = _events(jobs["B"], rank)
        syncs[rank] = sum(1 for e in events if e["name"] == "cudaStreamSynchronize") / AFTER.steps
    assert syncs[AFTER.item_rank] == 1 and sum(syncs.values()) == 1
    code, _, stderr = invoke(
        "diff", str(jobs["A.json"]), str(jobs["B.json"]), "--no-html", "--max-syncs-per-step", "0.5"
    )
    gate = _gate(stderr)
    assert code == 1 and len(gate) == 1, stderr
    assert gate[0].startswith(f"traceinsight: gate: rank {AFTER.item_rank}: 1 host syncs per step")


# --- the Python API --------------------------------------------------------------------------------


def test_the_api_compares_two_jobs_as_the_command_does(jobs: dict[str, Path], tmp_path: Path) -> None:
    import traceinsight
    from traceinsight.errors import TraceInsightError
    from traceinsight.results import JobComparison, JobResult

    command = diff_json(tmp_path, jobs["A.json"], jobs["B"])
    stored = JobResult.from_json(jobs["A.json"].read_text())
    for before in (str(jobs["A.json"]), stored):
        comparison = traceinsight.diff(before, str(jobs["B"]))
        assert isinstance(comparison, JobComparison)
        assert _figures(json.loads(comparison.to_json())) == _figures(command)
        assert "Stragglers gone" in (comparison._repr_html_() or "")
    with pytest.raises(TraceInsightError, match=r"BEFORE is a job \(4 traces\) and AFTER one trace"):
        traceinsight.diff(str(jobs["A"]), str(SAMPLES / "two_ranks" / "rank-0.json.gz"))


def test_strings_of_a_stored_job_result_stay_data_in_every_output(
    jobs: dict[str, Path], tmp_path: Path
) -> None:
    document = json.loads(jobs["B.json"].read_text())
    payload = "[link=https://evil.example]x[/link] <script>alert(1)</script> `](https://e.x)"
    for finding in document["findings"]:
        finding["title"] = payload
    hostile = tmp_path / "hostile.json"
    hostile.write_text(json.dumps(document))
    page, markdown = tmp_path / "h.html", tmp_path / "h.md"
    code, stdout, stderr = invoke(
        "diff", str(jobs["A.json"]), str(hostile), "-o", str(page), "--markdown", str(markdown)
    )
    assert code == 0, stderr
    assert "[link=https://evil.example]x[/link]" in stdout.replace("\n", "")  # shown, not rich markup
    assert "<script>" not in page.read_text() and "&lt;script&gt;" in page.read_text()
    text = markdown.read_text()
    assert "\\<script>" in text and "](https://e.x)" not in text  # escaped: shown, never HTML or a link
    tokens = MarkdownIt("gfm-like").parse(text)
    kinds = {token.type for token in tokens} | {
        child.type for token in tokens for child in token.children or ()
    }
    assert not kinds & {"html_inline", "html_block", "link_open", "image"}


def _with_lone_surrogates(text: str) -> str:
    """``text`` (a result's JSON) with a lone surrogate (valid JSON) in every finding's title and
    in every rank's path: what a fuzzed or hand-edited baseline may hold."""
    document = json.loads(text)
    for finding in document.get("findings", []):
        finding["title"] = "lone \ud800 surrogate"
    for rank in document.get("ranks", []) if document.get("kind") == "job" else []:
        rank["path"] = "rank-\udfff.json"
    return json.dumps(document)  # ensure_ascii: written as \ud800 escapes, as valid JSON holds them


def test_lone_surrogates_in_stored_results_read_as_text(jobs: dict[str, Path], tmp_path: Path) -> None:
    """A stored result with ``"\\ud800"`` (valid JSON) made ``diff`` exit 3 in its terminal summary,
    for a trace's result and a job's, and made ``.frames`` raise: each is U+FFFD now."""
    from traceinsight import JobResult, Result

    trace_result = tmp_path / "trace.json"
    code, _, stderr = invoke("analyze", str(SAMPLES / "gp100_mlp_pageable_sync.json.gz"), "--no-html",
                             "--json", str(trace_result))  # fmt: skip
    assert code == 0, stderr
    for stored, cls in ((trace_result, Result), (jobs["B.json"], JobResult)):
        hostile = tmp_path / f"hostile-{stored.name}"
        text = _with_lone_surrogates(stored.read_text())
        assert "\\ud800" in text
        hostile.write_text(text)
        code, stdout, stderr = invoke(
            "diff", str(stored), str(hostile), "--no-html", "--json", str(tmp_path / "d.json")
        )
        assert code == 0, stderr
        assert "\ufffd" in stdout and "\ud800" not in stdout
        json.loads((tmp_path / "d.json").read_text(encoding="utf-8"))
        read = cls.from_json(text)
        assert all(frame.height >= 0 for frame in read.frames.values())
        assert "\ufffd" in read.to_json() and "\\ud800" not in read.to_json()
