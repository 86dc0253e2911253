"""The package's shape: data flows one way through its layers, with no import cycle; the command
starts without the heavy libraries.

Read from the source with ``ast`` (every import: a module's own, a function's, a type checker's),
not from what happens to be imported at run time.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "traceinsight"

#: Each room of the package and its floor: a module may import its own room and the floors below,
#: never a room beside it or above. The floors are the issue's: load < analysis < rules < results
#: < job < render < api < commands; the small modules every layer uses are the ground floor; capture
#: (the only room with torch) reads the trace format's words from load and nothing more; the
#: commands run on the public API (one flow, two doors), so it sits below them.
FLOORS: dict[str, int] = {
    "ground": 0,
    "load": 1,
    "analysis": 2, "capture": 2,
    "rules": 3,
    "results": 4,
    "job": 5,
    "render": 6,
    "api": 7,
    "commands": 8,
    "__init__": 9, "__main__": 9,
}  # fmt: skip


def _modules() -> dict[str, Path]:
    """Every module of the package by dotted name (a package by its own name)."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


MODULES = _modules()


def _guarded(tree: ast.Module) -> set[int]:
    """The ids of the import nodes under ``if TYPE_CHECKING:`` (never run)."""
    guarded: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            guarded.update(id(inner) for statement in node.body for inner in ast.walk(statement))
    return guarded


def _imports(module: str, path: Path) -> Iterator[tuple[str, int, bool]]:
    """(module imported, line, only for the type checker) for each import in ``path``: ``from
    pkg import sub`` imports the submodule ``pkg.sub``; ``from pkg import name`` the package."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    guarded = _guarded(tree)
    for node in ast.walk(tree):
        checker = id(node) in guarded
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("traceinsight"):
                    yield alias.name, node.lineno, checker
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
                base = base[: len(base) - node.level + 1]
                name = ".".join([*base, *([node.module] if node.module else [])])
            else:
                name = node.module or ""
            if not name.startswith("traceinsight"):
                continue
            for alias in node.names:
                submodule = f"{name}.{alias.name}"
                # a compiled module (``_scan``, ``_nesting``) is a submodule too
                if submodule in MODULES or alias.name.startswith("_"):
                    yield submodule, node.lineno, checker
                else:
                    yield name, node.lineno, checker


#: The ground floor's modules: one room.
GROUND = {
    "errors",
    "thresholds",
    "formatting",
    "cores",
    "process",
    "version",
    "config",
    "compat",
    "arrays",
    "_arrays",
    "shown",
    "model",
}


def _room(module: str) -> str:
    parts = module.split(".")
    room = parts[1] if len(parts) > 1 else "__init__"
    return "ground" if room in GROUND else room


def test_every_room_has_a_floor() -> None:
    assert {_room(module) for module in MODULES} <= set(FLOORS)


def test_no_layer_imports_a_higher_one_or_a_room_beside_it() -> None:
    wrong = []
    for module, path in sorted(MODULES.items()):
        room = _room(module)
        for imported, line, _ in _imports(module, path):
            target = _room(imported)
            if target != room and FLOORS[target] >= FLOORS[room]:
                wrong.append(f"{path.relative_to(ROOT)}:{line}: {room} imports {imported}")
    assert not wrong, "\n".join(wrong)


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle() -> None:
    """No module imports, directly or through others, one that imports it (a function's imports
    included; those only the type checker reads are not imports at run time)."""
    edges = {
        module: {
            imported for imported, _, checker in _imports(module, path) if not checker and imported in MODULES
        }
        for module, path in MODULES.items()
    }
    assert _cycles(edges) == []


# --- fast start ----------------------------------------------------------------------------------------

HEAVY = ("polars", "matplotlib", "numpy", "torch")


def _imported(*arguments: str) -> set[str]:
    """The top-level packages ``python -X importtime ARGUMENTS`` imports."""
    environment = {**os.environ, "PYTHONPATH": str(ROOT), "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *arguments],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=environment,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = [line for line in done.stderr.splitlines() if line.startswith("import time:")]
    assert lines, done.stderr[-2000:]
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in lines[1:]}


@pytest.mark.parametrize(
    "arguments",
    [
        ("-m", "traceinsight", "--help"),
        ("-m", "traceinsight", "--version"),
        ("-m", "traceinsight", "analyze", "--help"),
        ("-m", "traceinsight", "diff", "--help"),
        ("-m", "traceinsight", "run", "--help"),
        ("-c", "import traceinsight; traceinsight.step; traceinsight.profile_step; traceinsight.__version__"),
    ],
    ids=lambda arguments: " ".join(arguments[1:]) if arguments[0] == "-m" else "import traceinsight",
)
def test_the_command_starts_without_the_heavy_libraries(arguments: tuple[str, ...]) -> None:
    imported = _imported(*arguments)
    assert "traceinsight" in imported
    assert not imported & set(HEAVY), sorted(imported & set(HEAVY))


def test_the_import_check_sees_a_heavy_import() -> None:
    """The check above reads the import log right: an analysis loads polars."""
    assert "polars" in _imported("-c", "import traceinsight.analysis")


def test_the_api_loads_its_libraries_when_used_and_charts_when_asked() -> None:
    """``traceinsight.analyze`` loads polars and not matplotlib (the page's charts are written as
    SVG); asking for the charts (matplotlib Figures) imports it."""
    trace = ROOT / "sample_traces" / "a100_triton.json.gz"
    code = (
        "import sys, traceinsight\n"
        f"result = traceinsight.analyze({str(trace)!r})\n"
        "assert 'polars' in sys.modules\n"
        "print('matplotlib' in sys.modules)\n"
        "charts = result.charts\n"
        "print('matplotlib' in sys.modules, sorted(charts))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    before, after = done.stdout.splitlines()
    assert before == "False"
    assert after.startswith("True ['")


def test_the_renderers_read_the_result_model_only() -> None:
    """Every renderer draws from the result (``results/``: the types, their vocabulary), never from
    the analyses or the rules that made it: so a stored result draws what a live one draws."""
    reached = sorted(
        f"{module} imports {imported} (line {line})"
        for module, path in MODULES.items()
        if module.startswith("traceinsight.render")
        for imported, line, _ in _imports(module, path)
        if imported.startswith(("traceinsight.analysis", "traceinsight.rules"))
    )
    assert reached == []
