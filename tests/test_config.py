"""The [tool.traceinsight] table and which frames count as the user's code."""

from __future__ import annotations

from pathlib import Path

import pytest

from traceinsight.config import read_config
from traceinsight.errors import ConfigError
from traceinsight.load.taxonomy import is_user_file, top_package


def test_no_pyproject_gives_empty_config(tmp_path: Path) -> None:
    folder = tmp_path / "a" / "b"
    folder.mkdir(parents=True)
    config = read_config(folder)
    # The search may find a pyproject.toml above tmp_path on some machines; none is below it.
    assert config.path is None or not config.path.is_relative_to(tmp_path)


def test_nearest_pyproject_table_is_read(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text(
        '[tool.traceinsight]\nuser-code = ["vllm", "mylab"]\nsource-root = "src"\n'
    )
    folder = tmp_path / "scripts"
    folder.mkdir()
    config = read_config(folder)
    assert config.path == (tmp_path / "pyproject.toml").resolve()
    assert config.user_code == ("vllm", "mylab")
    assert config.source_root == (tmp_path / "src").resolve()


def test_pyproject_without_table_is_fine(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n')
    config = read_config(tmp_path)
    assert config.user_code == () and config.source_root is None


@pytest.mark.parametrize(
    ("text", "words"),
    [
        ("[tool.traceinsight]\nuser_code = ['x']\n", "unknown key 'user_code'"),
        ("[tool.traceinsight]\nuser-code = 'x'\n", "must be a list of package names"),
        ("[tool.traceinsight]\nsource-root = 3\n", "must be a folder path"),
        ("[tool.traceinsight\n", "not valid TOML"),
    ],
)
def test_malformed_table_is_one_clear_error(tmp_path: Path, text: str, words: str) -> None:
    (tmp_path / "pyproject.toml").write_text(text)
    with pytest.raises(ConfigError, match=words) as raised:
        read_config(tmp_path)
    assert str(tmp_path) in str(raised.value) and "\n" not in str(raised.value)


@pytest.mark.parametrize(
    ("path", "package"),
    [
        ("train.py", "train"),
        ("vllm/worker/model_runner.py", "vllm"),
        ("/venv/lib/python3.11/site-packages/vllm/x.py", "vllm"),
        ("/home/me/train.py", None),
        ("C:\\venv\\Lib\\site-packages\\mylab\\m.py", "mylab"),
    ],
)
def test_top_package(path: str, package: str | None) -> None:
    assert top_package(path) == package


def test_user_code_turns_library_frames_into_the_users() -> None:
    assert not is_user_file("vllm/worker/model_runner.py")
    assert is_user_file("vllm/worker/model_runner.py", {"vllm"})
    assert is_user_file("/venv/lib/python3.11/site-packages/vllm/x.py", {"vllm"})
    assert not is_user_file("/venv/lib/python3.11/site-packages/other/x.py", {"vllm"})
    assert not is_user_file("torch/nn/modules/module.py", {"vllm"})
    assert is_user_file("/home/me/train.py")


# --- a project file is untrusted: it can only narrow what a report reads ---------------------------


@pytest.mark.parametrize("root", ["/", "..", "../elsewhere", "sub/../..", "up"])
def test_a_source_root_out_of_the_project_folder_is_refused(tmp_path: Path, root: str) -> None:
    project = tmp_path / "bug-report"
    (project / "sub").mkdir(parents=True)
    (project / "up").symlink_to(tmp_path)  # a link inside the folder to a folder above it
    (project / "pyproject.toml").write_text(f'[tool.traceinsight]\nsource-root = "{root}"\n')
    with pytest.raises(ConfigError, match="leads out of the folder holding the file") as raised:
        read_config(project)
    assert str(project / "pyproject.toml") in str(raised.value) and "--source-root" in str(raised.value)


@pytest.mark.parametrize("root", [".", "sub", "sub/../sub", "./sub/"])
def test_a_source_root_inside_the_project_folder_is_kept(tmp_path: Path, root: str) -> None:
    (tmp_path / "sub").mkdir()
    (tmp_path / "pyproject.toml").write_text(f'[tool.traceinsight]\nsource-root = "{root}"\n')
    expected = (tmp_path / root).resolve()
    assert read_config(tmp_path).source_root == expected


def test_a_pyproject_nested_too_deep_is_one_line(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("[tool.traceinsight]\nx = " + "[" * 900 + "]" * 900 + "\n")
    with pytest.raises(ConfigError, match="nested too deep") as raised:
        read_config(tmp_path)
    assert "\n" not in str(raised.value)


def test_a_huge_pyproject_is_refused_unread(tmp_path: Path) -> None:
    (tmp_path / "pyproject.toml").write_text("# " + "x" * (2 << 20) + "\n")
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        read_config(tmp_path)
