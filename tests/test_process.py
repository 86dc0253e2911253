"""Process-level tricks of :mod:`traceinsight.process` that change nothing but time: the compiled
methods of dataclasses kept beside the package (issue 34: 752 texts compiled in each `analyze`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

#: A program that defines dataclasses of every kind of generated method with the cache at FILE and
#: prints how each behaves, beside what the cache compiled anew.
PROGRAM = r"""
import dataclasses, json, sys
from traceinsight import process

process.dataclass_code_kept(__import__("pathlib").Path(sys.argv[1]))

@dataclasses.dataclass(frozen=True, slots=True, order=True)
class Span:
    start: int
    end: int = 0
    tags: tuple[str, ...] = ()
    extra: list[int] = dataclasses.field(default_factory=list, compare=False)

@dataclasses.dataclass
class Plain:
    name: str
    weight: float = 1.5

a, b = Span(1, 2, ("x",)), Span(1, 2, ("x",), [9])
try:
    a.start = 5
    frozen = False
except dataclasses.FrozenInstanceError:
    frozen = True
plain = Plain("p")
plain.weight = 2.0
added = process._Kept.code.added
process.dataclass_code_released()
print(json.dumps({
    "repr": [repr(a), repr(b), repr(plain)],
    "eq": a == b, "hash": hash(a) == hash(b), "lt": Span(0) < a, "frozen": frozen,
    "annotations": {k: str(v) for k, v in Span.__init__.__annotations__.items()},
    "exec_left": hasattr(dataclasses, "exec"), "added": added,
}))
"""


def _define(cache: Path, *, write: bool = True) -> dict[str, object]:
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    if not write:
        env["PYTHONDONTWRITEBYTECODE"] = "1"
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, str(cache)], env=env, capture_output=True, text=True, check=True
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def _plain() -> dict[str, object]:
    """The same program with dataclasses as Python has them (no cache)."""
    program = PROGRAM.replace("process.dataclass_code_kept(", "(lambda path: None)(").replace(
        "added = process._Kept.code.added", "added = 0"
    )
    out = subprocess.run(
        [sys.executable, "-c", program, "unused"],
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


def test_dataclass_methods_come_compiled_from_the_file_and_behave_as_pythons_own(tmp_path: Path) -> None:
    cache = tmp_path / "__pycache__" / "methods.marshal"
    plain = _plain()
    first = _define(cache)
    assert cache.is_file()
    second = _define(cache)
    # compiled in the first run (init, repr, eq, hash, setattr, delattr, order...), none in the second
    assert isinstance(first["added"], int) and first["added"] >= 8
    assert second["added"] == 0
    for run in (first, second):
        assert {key: value for key, value in run.items() if key != "added"} == {
            **{key: value for key, value in plain.items() if key != "added"},
            "exec_left": False,  # released: dataclasses has the builtin exec back
        }
    # the generated __init__'s annotations are the classes (a compile that took our
    # `from __future__ import annotations` would have made them the strings "_type_start"...)
    assert plain["annotations"]["start"] == "<class 'int'>"


def test_a_damaged_or_foreign_file_is_compiled_again_and_not_written_where_bytecode_is_not(
    tmp_path: Path,
) -> None:
    cache = tmp_path / "methods.marshal"
    cache.write_bytes(b"\x00garbage" * 100)
    run = _define(cache, write=False)  # PYTHONDONTWRITEBYTECODE: read, never written
    assert isinstance(run["added"], int) and run["added"] >= 8
    assert cache.read_bytes() == b"\x00garbage" * 100
    _define(cache)  # where bytecode is written, the damaged file is replaced
    assert _define(cache)["added"] == 0


def test_runs_script_compiles_its_own_dataclasses(tmp_path: Path) -> None:
    """`run` keeps the methods of the package's dataclasses, never the user's: before the script
    starts dataclasses has the builtin ``exec`` back."""
    import pytest

    pytest.importorskip("torch")
    script = tmp_path / "probe.py"
    script.write_text("import dataclasses\nprint('exec left:', hasattr(dataclasses, 'exec'))\n")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    out = subprocess.run(
        [sys.executable, "-m", "traceinsight", "run", "--no-html", str(script)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert out.returncode == 0, out.stderr
    assert "exec left: False" in out.stdout


def test_past_its_limit_the_file_keeps_only_what_a_run_used(tmp_path: Path) -> None:
    """Texts of older releases pile up after upgrades: past the limit a run writes only the texts it
    used, so the file stays small and what is in use stays kept."""
    import importlib.util
    import marshal

    from traceinsight import process

    cache = tmp_path / "methods.marshal"
    stale = {
        f"def __create_fn__():\n def f{i}(): pass\n return f{i}": compile("pass", "<string>", "exec")
        for i in range(60)
    }
    cache.write_bytes(process._MAGIC + marshal.dumps(stale))
    assert process._MAGIC.startswith(importlib.util.MAGIC_NUMBER)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    program = PROGRAM.replace(
        "process.dataclass_code_kept(", "process._DataclassCode.limit = 20; process.dataclass_code_kept("
    )
    out = subprocess.run(
        [sys.executable, "-c", program, str(cache)], env=env, capture_output=True, text=True, check=True
    )
    added = json.loads(out.stdout)["added"]
    kept = marshal.loads(cache.read_bytes()[len(process._MAGIC) :])
    assert not set(kept) & set(stale)
    assert len(kept) == added  # this run's texts, all new to the file
    assert _define(cache)["added"] == 0


def test_precompiled_file_holds_every_class_an_analyze_makes(tmp_path: Path) -> None:
    """``precompile_dataclasses`` leaves what an install's first run leaves: afterwards, importing
    every module an `analyze` imports compiles no method again. It must come first in its process:
    after another module of the package (the benchmark once prepared the page's templates first and
    kept 381 of 936 texts) it refuses, naming the module."""
    cache = tmp_path / "methods.marshal"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PYTHONDONTWRITEBYTECODE", None)

    def python(program: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, "-c", program, str(cache)], env=env, capture_output=True, text=True, timeout=300
        )

    precompile = "from traceinsight import process\nprocess.precompile_dataclasses(pathlib.Path(sys.argv[1]))"
    for before in ("traceinsight.render.templates", "rich.table"):  # the package's, a library's
        late = python(f"import sys, pathlib\nimport {before}\n{precompile}")
        assert late.returncode != 0
        assert "must come first" in late.stderr and before in late.stderr
        assert not cache.exists()

    first = python(f"import sys, pathlib\n{precompile}")
    assert first.returncode == 0, first.stderr
    assert cache.is_file()
    after = python(
        "import sys, pathlib\nfrom traceinsight import process\n"
        "process.dataclass_code_kept(pathlib.Path(sys.argv[1]))\n"
        "import traceinsight.commands, traceinsight.commands.common, traceinsight.commands.analyze\n"
        "import traceinsight.load.native, traceinsight.analysis, traceinsight.results.writer\n"
        "import traceinsight.render.html, traceinsight.render.terminal, traceinsight.rules\n"
        "import dataclasses\n"
        "assert hasattr(dataclasses, 'exec')\n"
        "print(process._Kept.code.added, len(process._Kept.code.used))"
    )
    assert after.returncode == 0, after.stderr
    added, used = map(int, after.stdout.split())
    assert used > 500  # the package's classes and its libraries' were made, from the file
    assert added == 0
