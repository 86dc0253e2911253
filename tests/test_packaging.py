"""Packaging: the wheel carries the templates, the distribution name is ours, torch stays optional."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parent.parent


def test_distribution_name_and_optional_torch() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == "torch-traceinsight"  # "traceinsight" on PyPI is another project
    assert not any(dep.startswith("torch") for dep in project["dependencies"])
    assert any(dep.startswith("torch") for dep in project["optional-dependencies"]["run"])
    assert project["scripts"]["traceinsight"] == "traceinsight.cli:main"


def test_built_wheel_contains_the_templates_and_py_typed(tmp_path: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        check=True,
        capture_output=True,
    )
    (wheel,) = tmp_path.glob("torch_traceinsight-*.whl")
    names = set(zipfile.ZipFile(wheel).namelist())
    templates = {p.name for p in (ROOT / "templates").iterdir() if p.is_file()}
    assert templates
    assert {f"traceinsight/templates/{name}" for name in templates} <= names
    assert "traceinsight/py.typed" in names
    assert not any(name.startswith(("tests/", "sample_traces/")) for name in names)


def test_analysis_never_imports_torch() -> None:
    code = (
        "import sys; import traceinsight.cli, traceinsight.pipeline, traceinsight.render.html; "
        "assert 'torch' not in sys.modules, 'torch imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
