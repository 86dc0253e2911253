"""CLI: bad input gets one line and a non-zero exit; good input a summary, a JSON contract, a report."""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from tracebuild import SAMPLES, kernel, write_trace
from typer.testing import CliRunner

from traceinsight.commands import app
from traceinsight.commands.options import parse_size

runner = CliRunner()


def _analyze(*args: str) -> tuple[int, str, str]:
    result = runner.invoke(app, ["analyze", *args])
    return result.exit_code, result.stdout, result.stderr


def _bad(tmp_path: Path, name: str, content: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(content)
    return path


BAD_INPUTS = {
    "missing": (None, "no such file"),
    "empty": (b"", "empty"),
    "whitespace": (b"  \n ", "empty"),
    "not-json": (b"this is not json at all", "not valid JSON"),
    "truncated-json": (b'{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1', "not valid JSON"),
    "truncated-gzip": (gzip.compress(b'{"traceEvents": []}' * 200)[:40], "gzip stream ends early"),
    "corrupt-gzip": (b"\x1f\x8b\x08\x00" + b"\x00" * 30, "gzip"),
    "json-number": (b"42", "not a torch.profiler trace"),
    "json-object-without-events": (b'{"hello": "world"}', "no traceEvents"),
    "events-not-a-list": (b'{"traceEvents": {"a": 1}}', "no traceEvents"),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_gets_one_clear_line_and_exit_2(case: str, tmp_path: Path) -> None:
    content, phrase = BAD_INPUTS[case]
    path = tmp_path / "absent.json" if content is None else _bad(tmp_path, f"{case}.json", content)
    code, stdout, stderr = _analyze(str(path), "-o", str(tmp_path / "r.html"))
    assert code == 2
    lines = stderr.strip().splitlines()
    assert len(lines) == 1, stderr
    assert lines[0].startswith("traceinsight: error: ")
    assert str(path) in lines[0]
    assert phrase in lines[0]
    assert "Traceback" not in stderr + stdout
    assert not (tmp_path / "r.html").exists()  # nothing half-written left behind


def test_a_directory_is_not_a_trace(tmp_path: Path) -> None:
    code, _, stderr = _analyze(str(tmp_path))
    assert code == 2
    assert "directory" in stderr


def test_unwritable_output_folder_is_one_line(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", [kernel(0, 10)])
    code, _, stderr = _analyze(str(trace), "-o", str(tmp_path / "no" / "such" / "r.html"))
    assert code == 2
    assert stderr.count("\n") == 1 and "does not exist" in stderr


def test_json_to_stdout_is_valid_and_keeps_the_contract(tmp_path: Path) -> None:
    code, stdout, stderr = _analyze(
        str(SAMPLES / "gp100_mlp_pageable_sync.json.gz"), "--json", "-", "--no-html"
    )
    assert code == 0, stderr
    data = json.loads(stdout)
    for key in ("devices", "idle_gaps", "memcpy", "overlap", "syncs", "sync_hotspots", "findings"):
        assert key in data
    assert set(data["devices"][0]) >= {"device", "name", "span_us", "busy_us", "idle_us"}
    assert set(data["idle_gaps"][0]) >= {"device", "start_us", "duration_us", "cause", "source"}
    assert set(data["memcpy"][0]) >= {
        "device",
        "kind",
        "direction",
        "src",
        "dst",
        "count",
        "bytes",
        "duration_us",
        "overlapped_us",
    }
    assert set(data["overlap"]) == {"HtoD", "DtoH"}
    assert set(data["syncs"][0]) >= {"call", "count", "blocked_us"}
    assert set(data["sync_hotspots"][0]) >= {
        "call",
        "op",
        "source",
        "count",
        "per_step",
        "blocked_us",
        "idle_after_us",
    }
    assert set(data["findings"][0]) >= {"rule", "severity", "title", "evidence", "savings_us", "advice"}
    assert "Scorecard" in stderr  # the summary moved to stderr


def test_json_file_and_summary_in_order(tmp_path: Path) -> None:
    out = tmp_path / "result.json"
    code, stdout, _ = _analyze(
        str(SAMPLES / "gp100_mlp_pageable_sync.json.gz"), "--json", str(out), "--no-html"
    )
    assert code == 0
    data = json.loads(out.read_text())
    sections = (
        "traceinsight",
        "Scorecard",
        "Findings (",
        "Longest idle gaps",
        "Sync hot spots",
        "Copies by kind",
        "Top kernels",
        "Busiest host operators",
    )
    positions = [stdout.index(word) for word in sections]
    assert positions == sorted(positions)
    # findings are printed worst (largest saving) first, as in the JSON
    rules = [finding["rule"] for finding in data["findings"]]
    printed = sorted(rules, key=lambda rule: stdout.index(rule))
    assert printed == rules
    assert str(out) in stdout


def test_cpu_only_trace_is_not_an_error(tmp_path: Path) -> None:
    out = tmp_path / "r.json"
    code, stdout, _ = _analyze(
        str(SAMPLES / "cpu_only_gloo.pt.trace.json.gz"), "--json", str(out), "--no-html"
    )
    assert code == 0
    assert "This run had no GPU" in stdout  # deviceProperties is [] in this trace
    assert "no GPU activity" in stdout
    data = json.loads(out.read_text())
    assert data["trace"]["has_gpu_activity"] is False
    assert data["trace"]["gpus_listed"] == 0
    assert data["devices"] == [] and data["findings"] == []
    assert data["host"]["cpu_ops"] > 0


def test_version() -> None:
    result = runner.invoke(app, ["--version"])
    assert result.exit_code == 0 and "traceinsight" in result.stdout


def test_thresholds_change_what_counts_as_a_gap(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", [kernel(0, 10), kernel(40, 10), kernel(200, 10)])
    out = tmp_path / "r.json"
    assert _analyze(str(trace), "--json", str(out), "--no-html")[0] == 0
    assert [g["duration_us"] for g in json.loads(out.read_text())["idle_gaps"]] == [150.0]
    assert _analyze(str(trace), "--json", str(out), "--no-html", "--min-gap-us", "10")[0] == 0
    assert [g["duration_us"] for g in json.loads(out.read_text())["idle_gaps"]] == [150.0, 30.0]


def test_outputs_are_written_whole_and_readable_by_others(tmp_path: Path) -> None:
    trace = write_trace(tmp_path / "t.json", [kernel(0, 10), kernel(200, 10)])
    out = tmp_path / "r.json"
    assert _analyze(str(trace), "--json", str(out), "--no-html")[0] == 0
    assert out.stat().st_mode & 0o044 == 0o044  # not the 0600 of a temporary file
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no temp left over


# --- whose code it is ----------------------------------------------------------------------------

B200 = SAMPLES / "b200_eager_stacks.json.gz"


def _gap_sources(path: Path) -> set[tuple[str, str]]:
    document = json.loads(path.read_text())
    return {(gap["source"], gap["source_kind"]) for gap in document["idle_gaps"] if gap["source"]}


def test_library_frames_are_named_as_library_code_without_user_code(tmp_path: Path) -> None:
    code, _, _ = _analyze(str(B200), "--no-html", "--json", str(tmp_path / "r.json"))
    assert code == 0
    sources = _gap_sources(tmp_path / "r.json")
    assert sources and {kind for _, kind in sources} == {"library"}
    assert all(not source.startswith("torch/") for source, _ in sources)


def test_user_code_option_makes_a_package_the_users(tmp_path: Path) -> None:
    code, _, _ = _analyze(str(B200), "--no-html", "--user-code", "vllm", "--json", str(tmp_path / "r.json"))
    assert code == 0
    sources = _gap_sources(tmp_path / "r.json")
    vllm = [source for source, kind in sources if source.startswith("vllm/")]
    assert vllm and all(kind == "user" for source, kind in sources if source.startswith("vllm/"))


def test_user_code_from_the_project_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.traceinsight]\nuser-code = ["vllm"]\n')
    monkeypatch.chdir(tmp_path)
    code, _, _ = _analyze(str(B200), "--no-html", "--json", "r.json")
    assert code == 0
    assert any(
        kind == "user" for source, kind in _gap_sources(tmp_path / "r.json") if source.startswith("vllm/")
    )


def test_a_malformed_project_table_is_one_clear_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.traceinsight]\nuser_code = ["vllm"]\n')
    monkeypatch.chdir(tmp_path)
    code, _, stderr = _analyze(str(B200), "--no-html")
    assert code == 2
    assert stderr.count("\n") == 1 and "unknown key 'user_code'" in stderr


# --- the JSON contract ---------------------------------------------------------------------------

#: The keys schema 1 promised (README, 2026-11-21): never renamed or removed.
SCHEMA_1 = {
    "": {"schema", "tool", "trace", "devices", "steps", "idle_gaps", "memcpy", "overlap", "syncs", "sync_hotspots", "findings", "host"},
    "devices": {"device", "name", "span_us", "busy_us", "idle_us", "kernel_us", "copy_us", "utilization"},
    "steps": {"step", "device", "start_us", "span_us", "busy_us", "idle_us", "copy_us", "idle_by_cause_us"},
    "idle_gaps": {"device", "start_us", "duration_us", "cause_kind", "cause", "source"},
    "sync_hotspots": {"call", "op", "op_chain", "source", "copy", "count", "per_step", "blocked_us", "idle_after_us"},
    "findings": {"rule", "severity", "title", "evidence", "savings_us", "advice", "why", "op", "source", "device"},
}  # fmt: skip


def test_the_json_keeps_every_schema_1_key_and_adds_the_new_ones(tmp_path: Path) -> None:
    code, _, _ = _analyze(
        str(SAMPLES / "v100_resnet50_workers0.pt.trace.json.gz"),
        "--no-html",
        "--json",
        str(tmp_path / "r.json"),
    )
    assert code == 0
    document = json.loads((tmp_path / "r.json").read_text())
    assert SCHEMA_1[""] <= set(document)
    for key, fields in SCHEMA_1.items():
        if key:
            assert document[key], key
            for item in document[key]:
                assert fields <= set(item), key
    assert {"warnings", "steady_state", "utilization", "run"} <= set(document)
    assert {"compute_us", "communication_us", "idle_by_cause_us"} <= set(document["devices"][0])
    assert {"compute_us", "communication_us", "steady"} <= set(document["steps"][0])
    assert {"minor", "savings_per_step_us", "saving_share"} <= set(document["findings"][0])
    # the per-device idle split adds up to the idle time
    for device in document["devices"]:
        assert sum(device["idle_by_cause_us"].values()) == pytest.approx(device["idle_us"], abs=0.01)


@pytest.mark.parametrize(
    ("text", "size"),
    [("4096", 4096), ("100B", 100), ("500MB", 500 * 2**20), ("2gb", 2 * 2**30), ("1.5GiB", 1_610_612_736),
     ("8 GiB", 8 * 2**30), ("10k", 10 * 1024), ("3KiB", 3072), ("1T", 2**40), ("2G", 2 * 2**30)],
)  # fmt: skip
def test_every_size_option_reads_sizes_alike(text: str, size: int) -> None:
    """``--max-size 2G`` was 2.0e9 bytes while ``--max-memory 2G`` was 2^31: one reading now,
    powers of 1024, with or without B or iB."""
    from traceinsight.capture.memory import parse_size as memory_size

    assert parse_size(text) == size
    assert parse_size(text, "--max-memory") == memory_size(text) == size


def test_an_unreadable_trace_is_not_a_usage_box(tmp_path: Path) -> None:
    """typer would check readability itself and print its usage box: the loader words it instead."""
    result = runner.invoke(app, ["analyze", str(tmp_path / "absent.json")])
    assert result.exit_code == 2
    assert result.stderr.startswith("traceinsight: error: ") and "Usage" not in result.stderr


@pytest.mark.parametrize("trace", ["gp100_mlp_pageable_sync.json.gz", "not_there.json"])
def test_the_cycle_collector_is_paused_while_one_trace_is_analyzed(
    trace: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`analyze` reads one trace with Python's cyclic garbage collector paused
    (:func:`traceinsight.process.collector_paused`), and leaves it on again, after a report or after
    an error."""
    import gc

    import traceinsight.commands.common

    analyze_and_write = traceinsight.commands.common.analyze_and_write
    seen: list[bool] = []

    def spy(*args: object, **kwargs: object) -> object:
        seen.append(gc.isenabled())
        return analyze_and_write(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(traceinsight.commands.common, "analyze_and_write", spy)
    assert gc.isenabled()
    result = runner.invoke(
        app, ["analyze", str(SAMPLES / trace), "--no-html", "--json", str(tmp_path / "r.json")]
    )
    assert result.exit_code == (0 if trace.endswith(".gz") else 2), result.stderr
    assert seen == [False]
    assert gc.isenabled()


def test_the_cycle_collector_is_paused_while_the_command_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command's imports run with the collector paused; the command itself starts with it on
    (so that `run` gives the user's script the collector as Python sets it)."""
    import gc
    import types

    import traceinsight.__main__ as entry

    seen: list[tuple[str, bool]] = []

    class StandIn(types.ModuleType):
        """The commands' package as the entry point imports it: records the collector's state."""

        def __getattr__(self, name: str) -> object:
            if name not in ("start_main", "begin_script", "end_script"):
                raise AttributeError(name)
            if not seen:
                seen.append(("import", gc.isenabled()))
            stand_ins = {
                "start_main": lambda: seen.append(("command", gc.isenabled())),
                "begin_script": lambda staged: None,  # no script: another command than `run`
                "end_script": lambda staged, outcome: None,
            }
            return stand_ins[name]

    monkeypatch.setitem(sys.modules, "traceinsight.commands", StandIn("traceinsight.commands"))
    entry.main()
    assert seen == [("import", False), ("command", True)]


@pytest.mark.parametrize("users", [None, "narenas:1"])
def test_the_allocator_setting_is_only_there_while_polars_loads(
    users: str | None, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:  # and numpy's BLAS threads the same way
    """A command asks polars' jemalloc to give freed pages back soon, by an environment variable
    it reads once, when polars loads: the variable is there while the command's libraries load
    (:func:`traceinsight.process.libraries_loading`) and gone again before its work (a script under
    `run` never sees it); a value the user set is left as it is."""
    import traceinsight.commands.analyze
    from traceinsight import process

    if users is None:
        monkeypatch.delenv(process.ALLOCATOR_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(process.ALLOCATOR_VARIABLE, users)
    loading = process.libraries_loading
    seen: list[tuple[str, str | None]] = []

    @contextlib.contextmanager
    def spy() -> Iterator[None]:
        with loading():
            seen.append(("loading", os.environ.get(process.ALLOCATOR_VARIABLE)))
            yield
        seen.append(("loaded", os.environ.get(process.ALLOCATOR_VARIABLE)))

    monkeypatch.setattr(traceinsight.commands.analyze, "libraries_loading", spy)
    trace = str(SAMPLES / "a100_triton.json.gz")
    result = runner.invoke(app, ["analyze", trace, "--no-html", "--json", str(tmp_path / "r.json")])
    assert result.exit_code == 0, result.stderr
    assert seen == [("loading", users or process.ALLOCATOR_OPTIONS), ("loaded", users)]


def test_the_allocator_setting_reaches_polars() -> None:
    """In a fresh process, polars' jemalloc starts with the setting a command loads its libraries
    with (asked here to print its options at exit as well): the decay time is the one asked for."""
    script = (
        "from traceinsight import process\n"
        "process.LOAD_SETTINGS[process.ALLOCATOR_VARIABLE] += ',stats_print:true'\n"
        "with process.libraries_loading():\n"
        "    import polars\n"
        "polars.DataFrame({'a': [1]})\n"
    )
    environment = {k: v for k, v in os.environ.items() if k != "_RJEM_MALLOC_CONF"}
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, env=environment, check=True
    )
    if "jemalloc statistics" not in done.stdout + done.stderr:
        pytest.skip("this polars build does not use jemalloc")
    assert "opt.dirty_decay_ms: 100 " in done.stdout + done.stderr


# --- output that fits where it goes (issue 33) -----------------------------------------------

_TWINS = tuple(
    "void at::native::vectorized_elementwise_kernel<4, at::native::BinaryFunctor<float, float, float, "
    f"at::native::{op}Functor<float> >, at::detail::Array<char*, 3>, at::native::memory::LoadWithoutCast, "
    "at::native::memory::StoreWithoutCast>(int, float*)"
    for op in ("Add", "Mul")
)


def _twin_kernels(tmp_path: Path) -> Path:
    """Two kernels whose names differ only in their middle, longer than any column."""
    events = [kernel(100 + 300 * i, 100, name=_TWINS[i % 2]) for i in range(20)]
    return write_trace(tmp_path / "twins.json", events)


def _kernel_rows(stdout: str) -> list[str]:
    return [line for line in stdout.splitlines() if line.lstrip().startswith("0 ") and "…" in line]


def test_piped_output_is_120_columns_and_names_never_read_the_same(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("COLUMNS", raising=False)
    code, stdout, _ = _analyze(str(_twin_kernels(tmp_path)), "--no-html")
    assert code == 0
    widths = [len(line) for line in stdout.splitlines()]
    assert max(widths) <= 120 and max(widths) > 80
    rows = _kernel_rows(stdout)
    assert len(rows) == 2 and len(set(rows)) == 2
    shown = [row.split()[1] for row in rows]  # at::native::vectorized_elem… (no spaces in a head)
    assert any("AddFunctor" in row for row in rows) and any("MulFunctor" in row for row in rows), shown


def test_columns_says_how_wide(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "100")
    code, stdout, _ = _analyze(str(_twin_kernels(tmp_path)), "--no-html")
    assert code == 0 and max(len(line) for line in stdout.splitlines()) <= 100
    rows = _kernel_rows(stdout)
    assert len(rows) == 2 and len(set(rows)) == 2


# --- option values read without pydantic (traceinsight.commands.coercion) ----------------------------

#: Raw values a command line (or a default) gives an option, read by both paths below.
RAW_VALUES: tuple[object, ...] = (
    None, "", "0", "1", "5", "05", "-1", "+2", " 5", "1_0", "0.5", "1.", ".5", "1e3", "inf", "nan", "abc",
    "2.5", "99999999999999999999", 0, 3, 2.5, True, False, (), ("a", "b"), ("1", "2"), "x.json", "a\0b",
)  # fmt: skip


def _outcome(coerce: object, value: object, param: object) -> tuple[str, object]:
    try:
        return "value", coerce(value, param=param, ctx=None)  # type: ignore[operator]
    except Exception as exc:  # typer's BadParameter, or whatever else it raises
        return type(exc).__name__, str(exc)


def test_every_option_reads_its_values_as_typers_own_coercion(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each option of each command reads a value to exactly what typer's pydantic validator gives
    (or fails with its message), for plain values and odd ones, paths that exist or not."""
    coercion = pytest.importorskip("typer._coercion")
    import typer.main

    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.json").write_text("{}")
    (tmp_path / "folder").mkdir()
    group = typer.main.get_command(app)
    commands = [group, *group.commands.values()]  # type: ignore[attr-defined]
    params = [param for command in commands for param in command.params]
    assert len(params) > 40
    extra: tuple[object, ...] = ("folder", str(tmp_path / "x.json"), Path("x.json"), ("x.json", "folder"))
    checked = 0
    for param in params:
        quick = param._runtime_param
        assert quick is not None and type(quick).__name__ == "_Quick", param.name
        typers = coercion.build_runtime_param(param.type_descriptor)
        for value in (*RAW_VALUES, *extra):
            assert _outcome(quick.coerce, value, param) == _outcome(typers.coerce, value, param), (
                param.name,
                value,
            )
            checked += 1
    assert checked > 1000


#: What one trace's ``analyze`` never needs: typer's pydantic validators (~0.15 s), a job's and a
#: diff's types, flow and drawing (~8 ms), the pure-Python loader (the C scanner reads the samples),
#: the Markdown renderer (no --markdown), `run`'s recorder and what it loads (~0.015 s).
NOT_FOR_ONE_TRACE = (
    "pydantic",
    "traceinsight.results.job",
    "traceinsight.results.comparison",
    "traceinsight.job",
    "traceinsight.commands.job",
    "traceinsight.render.diff",
    "traceinsight.render.job_text",
    "traceinsight.render.job_html",
    "traceinsight.load.fallback",
    "traceinsight.render.markdown",
    "traceinsight.capture.recorder",
    "traceinsight.capture.export",
    "traceinsight.capture.script",
    "traceinsight.capture.distributed",
)


def test_one_traces_analyze_loads_nothing_it_does_not_use(tmp_path: Path) -> None:
    """A small trace's job is mostly start-up: one trace's analyze, through the command, loads no
    module it does not use (and polars, which it does)."""
    done = subprocess.run(
        [sys.executable, "-c",
         "import sys\n"
         "from typer.testing import CliRunner\n"
         "from traceinsight.commands import app\n"
         f"result = CliRunner().invoke(app, ['analyze', {str(SAMPLES / 'a100_triton.json.gz')!r}, '--top', '3', "
         f"'--min-gap-us', '10', '--json', {str(tmp_path / 'r.json')!r}, '-o', {str(tmp_path / 'r.html')!r}])\n"
         f"print(result.exit_code, 'polars' in sys.modules, *[name for name in {NOT_FOR_ONE_TRACE!r} if name in sys.modules])\n"],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[1])},
        timeout=300, check=False,
    )  # fmt: skip
    assert done.stdout.split() == ["0", "True"], done.stderr[-2000:]
