"""Honest source lines (issue 29): what a frame's line is, by who wrote the frame, and framework code
that syncs by design.

torch's own tracer names a frame ``file.py(N): func`` with N the function's ``def`` line for frames
entered while recording, or the line the function was on when recording began for frames already
running; ``traceinsight run`` writes call sites (the call's line, ``"Call site": 1``); 2020-21
traces carry ``Call stack`` strings with call lines. A card says "at file:N" only for a call's line.
Expected lines and names here come from the trace events and the scripts' text, never from the code
under test.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import polars as pl
import pytest
from loops import item_loop
from tracebuild import PID, TID, annotation, cpu_op, frame, run_frame, write_trace
from typer.testing import CliRunner

from traceinsight.analysis import Analysis, analyze
from traceinsight.analysis.sources import source_at
from traceinsight.commands import app
from traceinsight.load import load_trace
from traceinsight.rules import advice, evaluate
from traceinsight.rules.findings import Finding

runner = CliRunner()


def analysis_of(tmp_path: Path, events: list[dict[str, Any]], **top: Any) -> Analysis:
    return analyze(load_trace(write_trace(tmp_path / "t.json", events, **top)))


def lines_at(tmp_path: Path, events: list[dict[str, Any]], times: list[float]) -> list[dict[str, Any]]:
    """``source_at`` for points on the main thread at ``times`` (µs), in that order."""
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    points = pl.DataFrame(
        {
            "key": list(range(len(times))),
            "pid": [PID] * len(times),
            "tid": [TID] * len(times),
            "t": [round(t * 1000) for t in times],
        },
        schema={"key": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64},
    )
    found = {row["key"]: row for row in source_at(trace, points).iter_rows(named=True)}
    return [found.get(key, {}) for key in range(len(times))]


def _line(name: str) -> tuple[str, int, str]:
    """(file, line, function) of a frame name, parsed here: ``train.py(12): main``."""
    match = re.fullmatch(r"(.+)\((\d+)\): (.+)", name)
    assert match is not None, name
    return match[1], int(match[2]), match[3]


# --- provenance of a frame's line ---------------------------------------------------------------


def _recording_start_events() -> tuple[list[dict[str, Any]], dict[str, float]]:
    """torch's frames of a loop whose recording began in ``main`` at line 25 (at its prof.step()),
    with ``log_metrics`` (def at line 5) entered while recording, and an op in each."""
    events = [
        # the frames running when recording began: a chain, first without a parent, before any op
        frame("train.py(40): <module>", 0, 10_000, python_id=1),
        frame("train.py(25): main", 0.5, 9_999, python_id=2, parent=1),
        frame("torch/profiler/profiler.py(700): step", 1, 5, python_id=3, parent=2),
        frame("<built-in method perf_counter_ns of PyCapsule object at 0x7f00>", 2, 1, python_id=4, parent=3),
        annotation("ProfilerStep#1", 5, 9_000),
        cpu_op("aten::mm", 10, 50),
        frame("train.py(5): log_metrics", 100, 50, python_id=5, parent=2),
        cpu_op("aten::item", 110, 5),
        cpu_op("aten::item", 200, 5),
    ]
    return events, {"helper": 112, "loop": 202}


def test_frames_running_when_recording_began_are_named_by_that_line(tmp_path: Path) -> None:
    events, at = _recording_start_events()
    helper, loop = lines_at(tmp_path, events, [at["helper"], at["loop"]])
    assert (helper["source"], helper["source_line_kind"], helper["source_function"]) == (
        "train.py:5",
        "def",
        "log_metrics",
    )
    assert (loop["source"], loop["source_line_kind"], loop["source_function"]) == (
        "train.py:25",
        "recording-start",
        "main",
    )


def test_a_chain_cut_from_a_longer_record_is_not_a_recording_start(tmp_path: Path) -> None:
    """A trace cut out of a longer one (its first frame's parent is not in it): every frame was
    entered while recording, so each line is a ``def`` line."""
    events, at = _recording_start_events()
    events[0] = frame("train.py(40): <module>", 0, 10_000, python_id=1, parent=999)
    (loop,) = lines_at(tmp_path, events, [at["loop"]])
    assert loop["source_line_kind"] == "def"


def test_a_frame_begun_after_the_first_operator_is_not_a_recording_start(tmp_path: Path) -> None:
    """A chain-shaped frame (first on its thread, no parent) that begins after an operator was
    recorded was entered while recording: its line is its ``def`` line."""
    events = [
        cpu_op("aten::mm", 0, 5),
        frame("train.py(11): main", 10, 500, python_id=7),
        cpu_op("aten::item", 100, 5),
    ]
    (line,) = lines_at(tmp_path, events, [102])
    assert (line["source"], line["source_line_kind"]) == ("train.py:11", "def")


def test_run_call_sites_are_call_lines_and_its_function_frames_def_lines(tmp_path: Path) -> None:
    events = [
        run_frame("train.py(11): main", 0, 1_000, call_site=0),
        run_frame("train.py(17): main", 10, 100, call_site=1),
        cpu_op("aten::item", 20, 5),
        cpu_op("aten::item", 500, 5),  # main runs no call into torch there: only its def line is known
    ]
    site, body = lines_at(tmp_path, events, [22, 502])
    assert (site["source"], site["source_line_kind"]) == ("train.py:17", "call")
    assert (body["source"], body["source_line_kind"], body["source_function"]) == (
        "train.py:11",
        "def",
        "main",
    )


def test_frames_of_unknown_origin_do_not_claim_either_kind(tmp_path: Path) -> None:
    events = [
        {
            "ph": "X",
            "cat": "python_function",
            "name": "train.py(52): train_step",
            "pid": PID,
            "tid": TID,
            "ts": 0,
            "dur": 100,
            "args": {},
        },
        cpu_op("aten::item", 20, 5),
    ]
    (line,) = lines_at(tmp_path, events, [22])
    assert (line["source"], line["source_line_kind"], line["source_function"]) == (
        "train.py:52",
        None,
        "train_step",
    )


def test_2021_call_stacks_are_call_lines(tmp_path: Path) -> None:
    op = cpu_op("aten::item", 20, 5)
    op["args"]["Call stack"] = "train.py(47): train_step;train.py(90): <module>"
    (line,) = lines_at(tmp_path, [op], [22])
    assert (line["source"], line["source_line_kind"], line["source_function"]) == (
        "train.py:47",
        "call",
        "train_step",
    )


def test_the_2021_sample_names_call_lines() -> None:
    """v100_resnet50_workers0 (torch 1.8) carries ``Call stack`` strings: its sources are call lines."""
    from tracebuild import sample_report

    report = sample_report("v100_resnet50_workers0.pt.trace.json.gz")
    kinds = {gap.source_line_kind for gap in report.analysis.idle_gaps if gap.source}
    assert kinds == {"call"}


# --- what the cards say --------------------------------------------------------------------------


def _cpu_loop(frame_event: dict[str, Any]) -> list[dict[str, Any]]:
    """Four CPU-only steps with ``.item()`` inside ``frame_event``'s span (shifted per step)."""
    events: list[dict[str, Any]] = []
    for step in range(4):
        start = step * 1000
        events.append(annotation(f"ProfilerStep#{step}", start, 1000))
        events.append({**frame_event, "ts": start + 1, "dur": 990})
        events.append(cpu_op("aten::item", start + 500, 10))
    return events


def _latent(tmp_path: Path, frame_event: dict[str, Any]) -> Finding:
    result = analysis_of(tmp_path, _cpu_loop(frame_event), deviceProperties=[])
    return next(f for f in evaluate(result) if f.rule == "latent-sync")


def test_a_def_line_is_never_written_as_the_call(tmp_path: Path) -> None:
    latent = _latent(tmp_path, frame("train.py(52): train_step", 0, 0, python_id=1))
    assert not re.search(r"(?<!defined )\bat train\.py:52", latent.title)
    assert latent.title.startswith("`.item()` in `train_step` (defined at train.py:52) ")
    source = dict(latent.evidence)["source"]
    assert source.startswith(
        "in `train_step`, defined at train.py:52: torch's stack names a function by its `def`"
    )
    assert "traceinsight run" in source
    assert (latent.source, latent.source_line_kind, latent.source_function) == (
        "train.py:52",
        "def",
        "train_step",
    )


def test_a_call_site_is_written_as_the_call(tmp_path: Path) -> None:
    latent = _latent(tmp_path, run_frame("train.py(52): train_step", 0, 0, call_site=1))
    assert latent.title.startswith("`.item()` at train.py:52 would make the host wait")
    assert dict(latent.evidence)["source"] == "train.py:52"
    assert latent.source_line_kind == "call"


def test_a_line_of_unknown_kind_names_the_function_not_the_call(tmp_path: Path) -> None:
    bare = {
        "ph": "X",
        "cat": "python_function",
        "name": "train.py(52): train_step",
        "pid": PID,
        "tid": TID,
        "args": {},
    }
    latent = _latent(tmp_path, bare)
    assert latent.title.startswith("`.item()` in `train_step` (train.py:52) would make the host wait")
    assert "do not say whether" in dict(latent.evidence)["source"]


# --- framework code that syncs by design ---------------------------------------------------------


def _lbfgs_loop(*, stacks: str, closure: bool = False) -> list[dict[str, Any]]:
    """``item_loop``'s syncs made by ``opt.step(closure)`` of torch.optim.LBFGS.

    ``stacks="torch"``: torch's frames (``main`` entered while recording, def line 12) with the sync
    under ``torch/optim/lbfgs.py``'s ``step``; ``"run"``: ``run``'s call site of the user's
    ``opt.step(closure)`` line 30, inside torch's ``Optimizer.step#LBFGS.step`` range. ``closure``:
    the sync is the user's own ``.item()`` in the closure LBFGS calls (line 21 / def line 20).
    """
    loop = item_loop(source="train.py(30): main")
    events = [event for event in loop.events if event.get("cat") != "python_function"]
    sites = [event for event in loop.events if event.get("cat") == "python_function"]
    ids = itertools.count(2)
    if stacks == "torch":
        end = max(float(e["ts"]) + float(e.get("dur", 0)) for e in loop.events)
        events.append(frame("train.py(12): main", 0.5, end, python_id=1))
    for site in sites:
        ts, dur = float(site["ts"]), float(site["dur"])
        if stacks == "run":
            events.append(site)
            events.append(annotation("Optimizer.step#LBFGS.step", ts + 0.1, dur - 0.2))
            if closure:
                events.append(run_frame("train.py(21): closure", ts + 0.2, dur - 0.4, call_site=1))
            continue
        wrapper, step = next(ids), next(ids)
        events.append(frame("torch/optim/optimizer.py(509): wrapper", ts, dur, python_id=wrapper, parent=1))
        events.append(
            frame("torch/optim/lbfgs.py(325): step", ts + 0.1, dur - 0.2, python_id=step, parent=wrapper)
        )
        if closure:
            events.append(
                frame("train.py(20): closure", ts + 0.2, dur - 0.4, python_id=next(ids), parent=step)
            )
    return events


def _sync(tmp_path: Path, events: list[dict[str, Any]]) -> Finding:
    return next(f for f in evaluate(analysis_of(tmp_path, events)) if f.rule == "sync-in-loop")


def test_lbfgs_syncs_are_named_as_lbfgs_with_advice_the_user_can_apply(tmp_path: Path) -> None:
    sync = _sync(tmp_path, _lbfgs_loop(stacks="torch"))
    assert sync.framework_call == "torch.optim.LBFGS"
    assert "LBFGS" in sync.title and "in `main` (defined at train.py:12)" in sync.title
    assert sync.advice is not advice.ITEM and sync.advice is not advice.BRANCH
    assert "max_iter" in sync.advice.summary and "torch.where" not in sync.advice.summary
    inside = dict(sync.evidence)["inside"]
    assert inside.startswith("torch.optim.LBFGS, which reads values on the host by design")
    hotspot = next(h for h in analysis_of(tmp_path, _lbfgs_loop(stacks="torch")).sync_hotspots)
    assert hotspot.framework_call == "torch.optim.LBFGS"


def test_lbfgs_is_named_from_torch_s_range_in_a_run_trace(tmp_path: Path) -> None:
    """``run``'s traces have no torch frames: torch's ``Optimizer.step#LBFGS.step`` range says it."""
    sync = _sync(tmp_path, _lbfgs_loop(stacks="run"))
    assert sync.framework_call == "torch.optim.LBFGS"
    assert "LBFGS" in sync.title and "at train.py:30 " in sync.title  # the call's own line
    assert "max_iter" in sync.advice.summary


@pytest.mark.parametrize("stacks", ["torch", "run"])
def test_the_user_s_own_item_in_the_lbfgs_closure_is_the_user_s(stacks: str, tmp_path: Path) -> None:
    """LBFGS calls the closure: an ``.item()`` there is the user's, under the user's line."""
    sync = _sync(tmp_path, _lbfgs_loop(stacks=stacks, closure=True))
    assert sync.framework_call is None
    assert sync.advice is advice.ITEM
    assert sync.source_function == "closure"


def test_the_designed_syncs_match_torch_s_files_only() -> None:
    from traceinsight.load.taxonomy import designed_sync

    assert designed_sync("torch/optim/lbfgs.py", "step") == "torch.optim.LBFGS"
    assert designed_sync("/venv/lib/python3.11/site-packages/torch/optim/lbfgs.py", "_strong_wolfe") == (
        "torch.optim.LBFGS"
    )
    assert designed_sync("mytorch/optim/lbfgs.py", "step") is None
    assert designed_sync("torch/distributions/distribution.py", "__init__") == "torch.distributions"
    assert designed_sync("torch/distributions/distribution.py", "sample") is None
    assert designed_sync("torch/amp/grad_scaler.py", "<genexpr>") == "torch.amp.GradScaler"
    assert designed_sync("transformers/masking_utils.py", "_ignore_causal_mask_sdpa") == (
        "transformers attention-mask check"
    )
    assert designed_sync("transformers/masking_utils.py", "sdpa_mask") is None


def test_transformers_mask_check_on_the_bert_sample_is_the_library_s() -> None:
    """h100_bert_small: the one ``aten::is_nonzero`` sync runs inside transformers' SDPA mask helper
    (read here from the raw frames), below the user's ``run_on_input``: named as the library's."""
    import gzip

    from tracebuild import SAMPLES, sample_report

    events = json.loads(gzip.decompress((SAMPLES / "h100_bert_small_stacks.json.gz").read_bytes()))[
        "traceEvents"
    ]
    frames = [e for e in events if e.get("cat") == "python_function"]
    (op,) = [e for e in events if e.get("name") == "aten::is_nonzero"]
    around = [
        _line(f["name"])
        for f in frames
        if f["tid"] == op["tid"] and f["ts"] <= op["ts"] <= f["ts"] + f["dur"] and "(" in f["name"]
    ]
    assert ("transformers/modeling_attn_mask_utils.py", 429, "_prepare_4d_attention_mask_for_sdpa") in around
    (hotspot,) = [h for h in sample_report("h100_bert_small_stacks.json.gz").analysis.sync_hotspots if h.op]
    assert hotspot.op == "aten::is_nonzero"
    assert hotspot.framework_call == "transformers attention-mask check"
    assert (hotspot.source_function, hotspot.source_line_kind) == ("run_on_input", "def")


# --- run's mark ---------------------------------------------------------------------------------


def _raw_event(name: str, args: str | None) -> list[bytes]:
    lines = [
        "  {\n",
        '    "ph": "X",\n',
        '    "cat": "user_annotation",\n',
        f'    "name": "{name}",\n',
        '    "pid": 1,\n',
        '    "tid": 1,\n',
        '    "ts": 10.5,\n',
        '    "dur": 4.0\n',
    ]
    if args is not None:
        lines += ["    ,\n", '    "args": {\n', f"      {args}\n", "    }\n"]
    lines.append("  },\n")
    return [line.encode() for line in lines]


@pytest.mark.parametrize(("mark", "flag"), [("traceinsight.site: ", 1), ("traceinsight.frame: ", 0)])
@pytest.mark.parametrize("args", ['"External id": 3,"Record function id": 0, "Ev Idx": 1', None])
def test_run_s_export_marks_what_each_frame_s_line_is(mark: str, flag: int, args: str | None) -> None:
    from traceinsight.capture.export import _fix_event
    from traceinsight.capture.frames import FRAME_MARK, SITE_MARK

    assert {mark} <= {FRAME_MARK, SITE_MARK}
    lines, _, frames = _fix_event(_raw_event(f"{mark}train.py(17): main", args))
    event = json.loads(b"".join(lines).decode().rstrip().rstrip(","))
    assert frames == 1
    assert (event["cat"], event["name"], event["args"]["Call site"]) == (
        "python_function",
        "train.py(17): main",
        flag,
    )
    if args is not None:
        assert event["args"]["External id"] == 3


# --- a real torch.profiler(with_stack=True) trace ------------------------------------------------

_SCRIPT = """\
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule


def log_metrics(x):  # HELPER DEF
    y = x * 2
    return y.sum().item()  # HELPER CALL


def main(out):
    x = torch.randn(32, 32)
    w = torch.randn(32, 32)
    every = schedule(wait=0, warmup=1, active=4, repeat=1)
    ready = lambda p: p.export_chrome_trace(out)  # noqa: E731
    with profile(activities=[ProfilerActivity.CPU], with_stack=True, schedule=every, on_trace_ready=ready) as prof:
        for _ in range(6):
            y = x @ w
            y.sum().item()  # LOOP CALL
            log_metrics(y)
            prof.step()  # STEP


main(sys.argv[1])
"""


def _marked(text: str, marker: str) -> int:
    return next(n for n, line in enumerate(text.splitlines(), 1) if line.endswith(f"# {marker}"))


@pytest.fixture(scope="module")
def torch_trace(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, int]]:
    """A trace torch writes for ``_SCRIPT`` (with_stack, steps by prof.step()), and its lines."""
    if os.environ.get("CI") and importlib.util.find_spec("torch") is None:
        raise ImportError("torch is not installed but CI is set: this test needs real torch")
    pytest.importorskip("torch")
    folder = tmp_path_factory.mktemp("with_stack")
    script = folder / "script.py"
    script.write_text(_SCRIPT)
    out = folder / "script.pt.trace.json"
    subprocess.run(
        [sys.executable, str(script), str(out)], check=True, capture_output=True, cwd=folder, timeout=300
    )
    lines = {
        marker: _marked(_SCRIPT, marker) for marker in ("HELPER DEF", "HELPER CALL", "LOOP CALL", "STEP")
    }
    return out, lines


def test_torch_names_frames_by_def_and_recording_start_lines(
    torch_trace: tuple[Path, dict[str, int]],
) -> None:
    """The premise, from the raw events: torch's frame of ``log_metrics`` carries its def line and
    ``main``'s the line of the prof.step() where recording began; neither names a call line."""
    path, lines = torch_trace
    events = json.loads(path.read_text())["traceEvents"]
    named = {
        _line(e["name"]) for e in events if e.get("cat") == "python_function" and "script.py(" in e["name"]
    }
    assert ("script.py", lines["HELPER DEF"], "log_metrics") in named
    assert ("script.py", lines["STEP"], "main") in named
    assert not {line for _, line, _ in named} & {lines["HELPER CALL"], lines["LOOP CALL"]}


def test_no_output_claims_a_def_or_recording_start_line_as_the_call(
    torch_trace: tuple[Path, dict[str, int]], tmp_path: Path
) -> None:
    path, lines = torch_trace
    outputs = {name: tmp_path / name for name in ("r.json", "r.md", "r.html")}
    result = runner.invoke(
        app,
        [
            "analyze",
            str(path),
            "--json",
            str(outputs["r.json"]),
            "--markdown",
            str(outputs["r.md"]),
            "-o",
            str(outputs["r.html"]),
        ],
    )
    assert result.exit_code == 0, result.output
    texts = {"terminal": result.output, **{name: p.read_text() for name, p in outputs.items()}}
    for name, text in texts.items():
        # "at script.py:N" claims N as the line of the call; "defined at" names a function's line
        claimed = {
            int(n)
            for n in re.findall(
                r"(?<!defined )\bat script\.py:(\d+)", " ".join(re.sub("[│╭╮╰╯]", " ", text).split())
            )
        }
        assert not claimed - {lines["HELPER CALL"], lines["LOOP CALL"]}, name
    report = json.loads(outputs["r.json"].read_text())
    latent = {f["source_function"]: f for f in report["findings"] if f["rule"] == "latent-sync"}
    helper, loop = latent["log_metrics"], latent["main"]
    assert (helper["source"], helper["source_line_kind"]) == (f"script.py:{lines['HELPER DEF']}", "def")
    assert (loop["source"], loop["source_line_kind"]) == (f"script.py:{lines['STEP']}", "recording-start")
    assert f"in `log_metrics` (defined at script.py:{lines['HELPER DEF']})" in helper["title"]
    assert f"in `main` (recorded from script.py:{lines['STEP']})" in loop["title"]


def test_real_lbfgs_syncs_under_torch_s_frames_are_lbfgs_s(tmp_path: Path) -> None:
    """LBFGS on CPU under torch's tracer: its ``aten::item`` ops sit under ``torch/optim/lbfgs.py``
    frames, and the latent syncs are named as LBFGS's with its advice."""
    pytest.importorskip("torch")
    script = tmp_path / "fit.py"
    script.write_text(
        "import sys\nimport torch\nfrom torch.profiler import ProfilerActivity, profile, schedule\n\n"
        "w = torch.randn(8, requires_grad=True)\nopt = torch.optim.LBFGS([w], max_iter=3)\n\n\n"
        "def closure():\n    opt.zero_grad()\n    loss = (w ** 2).sum()\n    loss.backward()\n    return loss\n\n\n"
        "every = schedule(wait=0, warmup=1, active=3, repeat=1)\n"
        "with profile(activities=[ProfilerActivity.CPU], with_stack=True, schedule=every,\n"
        "             on_trace_ready=lambda p: p.export_chrome_trace(sys.argv[1])) as prof:\n"
        "    for _ in range(5):\n        opt.step(closure)\n        prof.step()\n"
    )
    out = tmp_path / "fit.json"
    subprocess.run(
        [sys.executable, str(script), str(out)], check=True, capture_output=True, cwd=tmp_path, timeout=300
    )
    events = json.loads(out.read_text())["traceEvents"]
    frames = [e for e in events if e.get("cat") == "python_function"]
    items = [e for e in events if e.get("cat") == "cpu_op" and e["name"] == "aten::item"]
    under = [
        i
        for i in items
        if any(
            f["name"].startswith("torch/optim/lbfgs.py(") and f["ts"] <= i["ts"] <= f["ts"] + f["dur"]
            for f in frames
        )
    ]
    assert under, "the premise: LBFGS reads values on the host inside its own frames"
    findings = evaluate(analyze(load_trace(out)))
    latent = [f for f in findings if f.rule == "latent-sync"]
    assert latent and all(f.framework_call == "torch.optim.LBFGS" for f in latent)
    assert all("max_iter" in f.advice.summary for f in latent)


def test_diff_matches_on_the_file_line_and_shows_what_the_line_is() -> None:
    """The diff keeps matching findings by rule and ``file:line`` (stable across versions) and shows
    a line that is not the call's as what it is."""
    from traceinsight.results.comparison import finding_site, finding_site_label
    from traceinsight.results.trace import Advice, Finding
    from traceinsight.rules.findings import Severity

    def stored(**fields: Any) -> Finding:
        return Finding(
            rule="latent-sync", severity=Severity.HIGH, title="t", advice=Advice(summary="", before="", after=""),
            why="", op=None, source="train.py:4", device=None, savings_per_step_ns=None, saving_share=None,
            saving_note=None, **fields,
        )  # fmt: skip

    assert finding_site(stored(source_line_kind="def", source_function="f")) == "train.py:4"
    assert (
        finding_site_label(stored(source_line_kind="def", source_function="f"))
        == "`f` (defined at train.py:4)"
    )
    older = stored()  # a result stored before the fields existed: they read as null
    assert finding_site_label(older) == "train.py:4"


def test_an_analysis_indexes_the_frames_once_and_each_lookup_finds_what_its_own_would(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """h100_bert_small has syncs, gaps and step leads: three line lookups. The frame names' locations
    and the recording-start frames depend on the trace alone, so an analysis makes them once
    (:class:`~traceinsight.analysis.sources.FrameIndex`); a lookup given the index finds, for any
    points, exactly what a lookup of its own finds."""
    import random

    from tracebuild import SAMPLES

    from traceinsight.analysis import sources

    trace = load_trace(SAMPLES / "h100_bert_small_stacks.json.gz")
    made: list[str] = []
    for name in ("_frame_locations", "recording_start_frames"):
        original = getattr(sources, name)
        monkeypatch.setattr(sources, name, lambda *args, _f=original, _n=name: made.append(_n) or _f(*args))
    looked_up: list[int] = []
    lookup = sources.source_at
    for module in ("syncs", "idle_gaps", "preprocessing"):
        monkeypatch.setattr(
            f"traceinsight.analysis.{module}.source_at",
            lambda *args, **kwargs: looked_up.append(len(args[1])) or lookup(*args, **kwargs),
        )
    analysis = analyze(trace)
    assert len([n for n in looked_up if n]) == 3  # the three lookups had points
    assert sorted(made) == ["_frame_locations", "recording_start_frames"]
    assert analysis.sync_hotspots and analysis.idle_gaps

    frames = trace.python.filter(pl.col("python_id").is_not_null())
    rng = random.Random(7)
    picked = [frames.row(rng.randrange(frames.height), named=True) for _ in range(300)]
    points = pl.DataFrame(
        {
            "key": list(range(len(picked))),
            "pid": [row["pid"] for row in picked],
            "tid": [row["tid"] for row in picked],
            "t": [rng.randint(row["ts"], row["end"]) for row in picked],
        },
        schema={"key": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64},
    )
    index = sources.FrameIndex(trace)
    shared = [lookup(trace, part, frame_index=index).sort("key") for part in (points[:150], points[150:])]
    alone = [lookup(trace, part).sort("key") for part in (points[:150], points[150:])]
    for with_index, without in zip(shared, alone, strict=True):
        assert with_index.equals(without)
        assert with_index.get_column("source").drop_nulls().len() > 50
    with pytest.raises(ValueError, match="another trace or other user code"):
        lookup(trace, points, ("mypkg",), frame_index=index)
    other = load_trace(SAMPLES / "h100_bert_small_stacks.json.gz")  # the same file, another trace
    with pytest.raises(ValueError, match="another trace or other user code"):
        lookup(other, points, frame_index=index)


# --- frames and operators that start (and end) together -------------------------------------------


def _innermost(candidates: list[tuple[int, dict[str, Any]]], t: float) -> dict[str, Any]:
    """The innermost of the events (with their rows) holding ``t``, by the rule written out: the
    latest start; of those, the earliest end; of those, the last row (a callee is recorded after
    its caller)."""
    holding = [(row, e) for row, e in candidates if e["ts"] <= t <= e["ts"] + e["dur"]]
    return max(holding, key=lambda item: (item[1]["ts"], -(item[1]["ts"] + item[1]["dur"]), item[0]))[1]


@pytest.mark.parametrize(
    ("callee_ends", "written"),
    [("first", "caller first"), ("first", "callee first"), ("with its caller", "caller first")],
)
def test_a_frame_starting_with_its_caller_is_the_innermost(
    tmp_path: Path, callee_ends: str, written: str
) -> None:
    """A function called at the very start of its caller's frame (same start, at the trace's
    resolution): a sync in it is the callee's line, not the caller's, 200 times of 200, whichever
    frame the file holds first when the callee ends first. Was: the caller's whenever the callee
    ended first (the sort kept start only, and a tie went either way). The "with its caller" case
    only guards the rule: the old code named the callee there too."""
    events: list[dict[str, Any]] = []
    times: list[float] = []
    for i in range(200):
        t = i * 100.0
        inner = 30.0 if callee_ends == "first" else 50.0
        pair = [
            frame(f"train.py({10 + i % 7}): step", t, 50, python_id=2 * i + 1),
            frame(f"model.py({100 + i % 7}): forward", t, inner, python_id=2 * i + 2, parent=2 * i + 1),
        ]
        events += pair if written == "caller first" else pair[::-1]
        times.append(t + 10)
    expected = [_innermost(list(enumerate(events)), t)["name"] for t in times]
    assert {name.split("(")[0] for name in expected} == {"model.py"}
    found = lines_at(tmp_path, events, times)
    assert [line["source"] for line in found] == ["{}:{}".format(*_line(name)[:2]) for name in expected]


def test_a_2021_call_stack_of_operators_starting_together_is_the_innermost_s(tmp_path: Path) -> None:
    """``aten::item`` and the ``aten::_local_scalar_dense`` it calls, starting together, each with
    its ``Call stack`` (2020-21 traces): the line is the callee's stack, the innermost by the same
    rule as frames, 200 times of 200."""
    events: list[dict[str, Any]] = []
    times: list[float] = []
    for i in range(200):
        t = i * 100.0
        outer, inner = cpu_op("aten::item", t, 50), cpu_op("aten::_local_scalar_dense", t, 20)
        outer["args"]["Call stack"] = f"train.py({10 + i % 5}): step"
        inner["args"]["Call stack"] = f"model.py({100 + i % 5}): forward;train.py({10 + i % 5}): step"
        events += [outer, inner]
        times.append(t + 5)
    expected = [_innermost(list(enumerate(events)), t)["args"]["Call stack"].split(";")[0] for t in times]
    found = lines_at(tmp_path, events, times)
    assert [line["source"] for line in found] == ["{}:{}".format(*_line(entry)[:2]) for entry in expected]


@pytest.mark.parametrize("written", ["range first", "operator first"])
def test_a_2021_operator_s_stack_beats_a_range_s_that_starts_and_ends_with_it(
    tmp_path: Path, written: str
) -> None:
    """A ``record_function`` range and the operator inside it, starting and ending together, each
    with its ``Call stack``: the operator is the inner one, so its stack names the line, whichever
    the file holds first. Was: the range's, always (the tie went by the tables' order, ranges
    last)."""
    events: list[dict[str, Any]] = []
    for i in range(50):
        t = i * 100.0
        outer, inner = annotation("## step ##", t, 50), cpu_op("aten::item", t, 50)
        outer["args"]["Call stack"] = f"train.py({10 + i % 5}): step"
        inner["args"]["Call stack"] = f"model.py({100 + i % 5}): forward;train.py({10 + i % 5}): step"
        events += [outer, inner] if written == "range first" else [inner, outer]
    times = [i * 100.0 + 5 for i in range(50)]
    found = lines_at(tmp_path, events, times)
    assert [line["source"] for line in found] == [f"model.py:{100 + i % 5}" for i in range(50)]


def test_the_module_of_a_point_is_the_innermost_when_modules_start_together(tmp_path: Path) -> None:
    """``nn.Module`` frames of a model whose forward calls a submodule's at once (the same start):
    the module named is the submodule, the innermost by the frames' rule, 100 times of 100."""
    from traceinsight.analysis.sources import module_at

    events: list[dict[str, Any]] = []
    times: list[float] = []
    for i in range(100):
        t = i * 100.0
        events.append(frame("nn.Module: BertModel_0", t, 80, python_id=2 * i + 1))
        events.append(frame(f"nn.Module: BertLayer_{i % 3}", t, 40, python_id=2 * i + 2, parent=2 * i + 1))
        times.append(t + 20)
    expected = [_innermost(list(enumerate(events)), t)["name"] for t in times]
    trace = load_trace(write_trace(tmp_path / "t.json", events))
    points = pl.DataFrame(
        {"key": range(len(times)), "pid": PID, "tid": TID, "t": [round(t * 1000) for t in times]},
        schema={"key": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64},
    )
    found = dict(module_at(trace, points).iter_rows())
    assert [found[key] for key in range(len(times))] == [
        name.removeprefix("nn.Module: ").rsplit("_", 1)[0] for name in expected
    ]
    assert set(found.values()) == {"BertLayer"}


def test_a_module_frame_named_past_line_1_is_where_recording_began_not_a_definition(tmp_path: Path) -> None:
    """A script's top level profiled directly (no function around the loop): torch names the
    `<module>` frame at line 60, the line running when recording began, from a chain cut out of a
    longer record (so not detected as a recording start by position). A module's code begins at
    line 1, so line 60 is never "defined at"."""
    events = [
        frame("script.py(60): <module>", 0, 10_000, python_id=1, parent=999),
        cpu_op("aten::mm", 10, 50),
        cpu_op("aten::item", 200, 5),
    ]
    (line,) = lines_at(tmp_path, events, [202])
    file, number, function = _line("script.py(60): <module>")
    assert (line["source"], line["source_function"]) == (f"{file}:{number}", function)
    assert number != 1 and line["source_line_kind"] == "recording-start"


# --- one function, several lines (issue 51, item 8) ----------------------------------------------


def _generator_and_forwards(*, started_before_recording: bool) -> tuple[list[dict[str, Any]], list[float]]:
    """torch's frames of a loop in ``main`` (running when recording began) that pulls batches from
    the generator ``batches`` (def line 8, ``yield``s at 11, 14 and 17: torch names each resumed
    frame by its yield line) and calls two different ``forward`` methods of model.py (def lines 20
    and 40), each under its own ``_call_impl`` frame. Each frame holds an ``aten::item``; the times
    returned are inside those ops: the generator's frames first, then the two forwards."""
    events: list[dict[str, Any]] = [
        frame("train.py(40): <module>", 0, 100_000, python_id=1),
        frame("train.py(25): main", 0.5, 99_999, python_id=2, parent=1),
        annotation("ProfilerStep#1", 5, 90_000),
    ]
    lines = [11, 14, 17, 11, 14, 17] if started_before_recording else [8, 11, 14, 17, 8, 11]
    times: list[float] = []
    python_id = 10
    at = 100.0
    for line in lines:
        events.append(frame(f"data.py({line}): batches", at, 50, python_id=python_id, parent=2))
        events.append(cpu_op("aten::item", at + 10, 5))
        times.append(at + 12)
        python_id += 1
        at += 1_000
    for line in (20, 40):
        call_impl = python_id
        events.append(
            frame("torch/nn/modules/module.py(1750): _call_impl", at, 200, python_id=call_impl, parent=2)
        )
        events.append(
            frame(f"model.py({line}): forward", at + 10, 100, python_id=call_impl + 1, parent=call_impl)
        )
        events.append(cpu_op("aten::item", at + 20, 5))
        times.append(at + 22)
        python_id += 2
        at += 1_000
    return events, times


@pytest.mark.parametrize("started_before_recording", [False, True])
def test_a_generator_resumed_at_its_yields_is_named_once_and_never_defined_at_a_yield(
    tmp_path: Path, started_before_recording: bool
) -> None:
    """One generator that torch names at four lines (its def line and three yields), or at three
    yields when it was running before recording began: every frame of it is named by one line, the
    lowest the trace shows, as "entered at", never "defined at". The two ``forward`` methods under
    different callers are two functions and keep their own def lines."""
    events, times = _generator_and_forwards(started_before_recording=started_before_recording)
    found = lines_at(tmp_path, events, times)
    generator_names = [e["name"] for e in events if e["name"].startswith("data.py(")]
    shown_lines = {_line(name)[1] for name in generator_names}
    assert len(shown_lines) == (3 if started_before_recording else 4)
    lowest = f"data.py:{min(shown_lines)}"
    *generator, first_forward, second_forward = found
    assert [(g["source"], g["source_line_kind"], g["source_function"]) for g in generator] == [
        (lowest, "entry", "batches")
    ] * len(generator_names)
    forwards = [_line(e["name"]) for e in events if e["name"].startswith("model.py(")]
    assert (first_forward["source"], first_forward["source_line_kind"]) == (
        f"{forwards[0][0]}:{forwards[0][1]}",
        "def",
    )
    assert (second_forward["source"], second_forward["source_line_kind"]) == (
        f"{forwards[1][0]}:{forwards[1][1]}",
        "def",
    )
    assert forwards[0][1] != forwards[1][1] and forwards[0][2] == forwards[1][2] == "forward"


def test_a_function_entered_at_several_lines_is_not_labelled_as_defined_there() -> None:
    """The label and the evidence for such a line say what it is: entered at, or a later line."""
    from traceinsight.formatting import source_label
    from traceinsight.rules.common import source_evidence

    label = source_label("data.py:8", "user", "entry", "batches")
    assert label == "`batches` (entered at data.py:8 or a later line)"
    evidence = source_evidence("data.py:8", "user", "entry", "batches")
    assert "defined at" not in label + evidence and "yield" in evidence


def test_a_real_trace_names_same_named_methods_by_their_callers() -> None:
    """vllm on a B200: one caller runs three logits processors' ``update_state`` in turn (frames at
    builtin.py lines 52, 199 and 134 under one ``Python parent id``: one generator or three methods,
    the trace cannot say), while linear.py's two ``forward`` methods (557, 1388) are each entered
    under callers of their own. Expected lines come from the raw events: the former are all named by
    their lowest line as ``entry``, the latter keep their own def lines."""
    import gzip
    from collections import defaultdict

    from tracebuild import SAMPLES

    path = SAMPLES / "b200_eager_stacks.json.gz"
    with gzip.open(path) as handle:
        raw = json.load(handle)["traceEvents"]
    frames = [e for e in raw if e.get("cat") == "python_function" and "(" in e["name"]]
    by_caller: dict[tuple[Any, str, str], set[int]] = defaultdict(set)
    for e in frames:
        file, line, function = _line(e["name"])
        by_caller[(e["args"].get("Python parent id"), file, function)].add(line)
    shared = {(file, function): lines for (_, file, function), lines in by_caller.items() if len(lines) > 1}
    update = ("vllm/v1/sample/logits_processor/builtin.py", "update_state")
    forward = ("vllm/model_executor/layers/linear.py", "forward")
    assert len(shared[update]) == 3 and forward not in shared
    picked = [e for e in frames if _line(e["name"])[0::2] in (update, forward)]
    trace = load_trace(path)
    # each frame's start as loaded (the loader's clock), found by its Python id
    starts = dict(trace.python.select("python_id", "ts").iter_rows())
    points = pl.DataFrame(
        {
            "key": range(len(picked)),
            "pid": [e["pid"] for e in picked],
            "tid": [e["tid"] for e in picked],
            "t": [starts[e["args"]["Python id"]] for e in picked],
        },
        schema={"key": pl.Int64, "pid": pl.Int64, "tid": pl.Int64, "t": pl.Int64},
    )
    found = {row["key"]: row for row in source_at(trace, points).iter_rows(named=True)}
    for key, e in enumerate(picked):
        file, line, function = _line(e["name"])
        row = found[key]
        assert row["source_function"] == function
        if (file, function) == update:
            assert (row["source"], row["source_line_kind"]) == (f"{file}:{min(shared[update])}", "entry")
        else:
            assert (row["source"], row["source_line_kind"]) == (f"{file}:{line}", "def")
