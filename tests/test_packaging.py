"""Packaging: the wheel carries the templates, the distribution name is ours, torch stays optional."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent
#: The optional C modules (hatch_build.py's MODULES), as their files in a wheel begin.
C_MODULES = (
    "traceinsight/load/_scan.",
    "traceinsight/analysis/_nesting.",
    "traceinsight/analysis/_replay.",
    "traceinsight/_arrays.",
)


def test_distribution_name_and_optional_torch() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "torch-traceinsight"  # "traceinsight" on PyPI is another project
    assert not any(dep.startswith("torch") for dep in project["dependencies"])
    assert any(dep.startswith("torch") for dep in project["optional-dependencies"]["run"])
    assert (
        project["scripts"]["traceinsight"] == "traceinsight.__main__:main"
    )  # Ctrl-C while importing the CLI is one line


def _build_wheel(folder: Path, **environment: str) -> Path:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(folder), str(ROOT)],
        check=True,
        capture_output=True,
        env={**os.environ, **environment},
    )
    (wheel,) = folder.glob("torch_traceinsight-*.whl")
    return wheel


def _have_compiler() -> bool:
    compiler = (sysconfig.get_config_var("CC") or "cc").split()[0]
    return shutil.which(compiler) is not None


def test_built_wheel_contains_the_templates_and_py_typed(tmp_path: Path) -> None:
    temporary = tmp_path / "tmp"
    temporary.mkdir()
    wheel = _build_wheel(tmp_path, TMPDIR=str(temporary))
    assert not list(temporary.glob("traceinsight-build-*"))  # the build hook's scratch is removed
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {p.name for p in (ROOT / "templates").iterdir() if p.is_file()}
    assert templates
    assert {f"traceinsight/templates/{name}" for name in templates} <= names
    assert "traceinsight/py.typed" in names
    assert not any(name.startswith(("tests/", "sample_traces/")) for name in names)
    if _have_compiler() or os.environ.get("CI"):
        for module in C_MODULES:
            built = [name for name in names if name.startswith(module) and not name.endswith(".c")]
            assert len(built) == 1, f"{module}c was not compiled into the wheel"
        assert "-none-any" not in wheel.name  # a binary wheel is tagged for its platform


def test_pure_build_is_a_universal_wheel_without_the_scanner(tmp_path: Path) -> None:
    """TRACEINSIGHT_PURE=1 (or no compiler) still builds: pure Python, loading with msgspec and
    walking host operators with polars."""
    wheel = _build_wheel(tmp_path, TRACEINSIGHT_PURE="1")
    assert wheel.name.endswith("-py3-none-any.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    assert not any(name.startswith(C_MODULES) and not name.endswith(".c") for name in names)
    assert "traceinsight/templates/report.html" in names


def test_analysis_never_imports_torch() -> None:
    code = (
        "import sys; import traceinsight.commands, traceinsight.commands.common, traceinsight.render.html; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_importing_the_package_loads_only_its_version() -> None:
    """Under `python -m traceinsight` the package's __init__ runs before the command can take Ctrl-C
    as one line: it loads none of its own modules but the version, and not typing (the public names,
    step and profile_step included, load on first use)."""
    code = (
        "import sys; before = set(sys.modules); import traceinsight; "
        "print(sorted(name for name in set(sys.modules) - before if name != '__future__')); "
        "print(traceinsight.step.__module__, traceinsight.profile_step.__module__)"
    )
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout
    loaded, modules = out.splitlines()
    assert loaded == str(["traceinsight", "traceinsight.version"])
    assert modules == "traceinsight.capture.steps traceinsight.capture.steps"


def test_ci_checks_the_dependency_floors_that_pyproject_declares() -> None:
    """`.ci/run` runs ``benchmarks/floors.py check``, and what it installs is exactly the ``>=``
    version of each runtime dependency whose marker holds here, read from pyproject.toml by a plain
    split of each requirement string (no version written a second time anywhere)."""
    import importlib.util
    import re

    from packaging.markers import Marker

    expected = {}
    for line in tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]:
        requirement, _, marker = line.partition(";")
        if marker and not Marker(marker).evaluate():
            continue
        name = re.match(r"[A-Za-z0-9_.-]+", requirement)
        floor = re.search(r">=\s*([0-9][^,\s]*)", requirement)
        assert name and floor, f"{line!r}: a runtime dependency needs a '>=' floor"
        expected[name.group()] = floor.group(1)
    assert {"polars", "typer", "rich", "jinja2", "msgspec", "numpy"} <= expected.keys()

    spec = importlib.util.spec_from_file_location("floors", ROOT / "benchmarks" / "floors.py")
    assert spec and spec.loader
    floors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floors)
    assert floors.declared_floors() == expected

    ci = (ROOT / ".ci" / "run").read_text()
    assert "python benchmarks/floors.py check" in [line.strip() for line in ci.splitlines()]
    assert not re.search(r"\b(polars|typer|rich|jinja2|msgspec|numpy|isal)==", ci)
