"""Project settings: the ``[tool.traceinsight]`` table of the nearest ``pyproject.toml``.

Command-line options win over the table; the table wins over the defaults. The table is looked
for from a starting folder upwards (the current folder for ``analyze``, the script's folder for
``run``), and only the first ``pyproject.toml`` found is read, as ruff and pytest do::

    [tool.traceinsight]
    user-code = ["vllm", "mylab"]   # packages whose frames are the user's own code
    source-root = "."               # where report excerpts may be read from (inside this file's folder)
    fail-on = "high"                # the gate (see traceinsight/gate.py): also fail-on-rule,
    max-idle = 30                   # max-syncs-per-step, max-regression

Unknown keys are an error (a typo must not be silently ignored).

A project file is untrusted like a trace: it may come beside a stranger's trace (a bug report
unpacked and analyzed where it lies). So it can only narrow what a report reads: its
``source-root`` must lie inside the folder holding it (after resolving links), else it is refused
in one line, and it is used only from a project file in the working folder itself or in the
trace's own folder, never from one in a folder above (:func:`source_root`); ``--source-root`` on
the command line stays the user's own choice. The file is read
only when it is a regular file of at most :data:`MAX_PYPROJECT_BYTES`, and nesting too deep for
the TOML parser is one line too.
"""

from __future__ import annotations

import os
import stat
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from traceinsight.errors import ConfigError
from traceinsight.model import Model

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

__all__ = [
    "KNOWN_KEYS",
    "MAX_PYPROJECT_BYTES",
    "ProjectConfig",
    "SourceRoot",
    "find_pyproject",
    "read_config",
    "source_root",
]

#: A ``pyproject.toml`` larger than this is refused (real ones hold a few kilobytes).
MAX_PYPROJECT_BYTES: Final = 1 << 20

#: Keys the table may hold, with what each is for (shown when a key is unknown).
KNOWN_KEYS: Final[dict[str, str]] = {
    "user-code": "list of package names whose frames are the user's own code",
    "source-root": "folder (relative to pyproject.toml) that report excerpts may be read from",
    "fail-on": "gate: fail on a finding of this severity or worse (high, medium, low)",
    "fail-on-rule": "gate: fail on a finding of these rules (list of rule ids)",
    "max-idle": "gate: most GPU idle allowed, percent of the step time",
    "max-syncs-per-step": "gate: most host syncs per step allowed",
    "max-regression": "gate (diff): most step-time growth allowed, percent",
}


class ProjectConfig(Model, frozen=True):
    """What the ``[tool.traceinsight]`` table says (empty when there is none)."""

    path: Path | None = None
    """The ``pyproject.toml`` that was read, or None."""
    user_code: tuple[str, ...] = ()
    """Top-level package names to treat as the user's own code for source lines."""
    source_root: Path | None = None
    """Folder that source excerpts may be read from (absolute, inside the file's folder), or None."""
    table: dict[str, Any] | None = None
    """The raw table, for keys later versions read."""


class SourceRoot(Model, frozen=True):
    """The folder report excerpts are read from, and where that choice came from (said on the
    terminal: ``--source-root``, ``source-root in /x/pyproject.toml``, ``the script's project``)."""

    folder: Path
    origin: str
    shown: str | None = None
    """How the terminal names ``folder`` (None: as it is): ``traceinsight run`` gives the script's
    project as the user would type it, not as an absolute path."""

    @property
    def written(self) -> tuple[str, Path]:
        """The summary's line for the page's code excerpts: where they were read from."""
        return f"code excerpts ({self.origin})", Path(self.shown or self.folder)


def source_root(
    option: Path | None, config: ProjectConfig, trace_folders: Sequence[Path] = ()
) -> SourceRoot | None:
    """``--source-root`` (the user's explicit choice), else ``source-root`` of the project table
    (inside its own folder, checked by :func:`read_config`) when that ``pyproject.toml`` lies in
    the working folder itself or in the folder of a trace being read (``trace_folders``), else
    None: no excerpts.

    A project file found in a folder *above* the working folder is not one the user pointed at: a
    ``/tmp/pyproject.toml`` or a shared folder's, planted with ``source-root = "."``, let a
    stranger's trace quote every ``.py`` file below it. Its other keys still apply (they read
    nothing); for its excerpts, name the folder with ``--source-root``."""
    if option is not None:
        if not option.is_dir():
            raise ConfigError(
                f"--source-root {option}: no such folder; name the project folder the trace's code is in"
            )
        return SourceRoot(option, "--source-root")
    if config.source_root is not None and config.path is not None:
        home = config.path.parent.resolve()
        pointed_at = {Path.cwd().resolve(), *(folder.resolve() for folder in trace_folders)}
        if home in pointed_at:
            return SourceRoot(config.source_root, f"source-root in {config.path}")
    return None


def find_pyproject(start: Path) -> Path | None:
    """The nearest ``pyproject.toml`` in ``start`` or a folder above it."""
    folder = start.resolve()
    for candidate in (folder, *folder.parents):
        path = candidate / "pyproject.toml"
        if path.is_file():
            return path
    return None


def read_config(start: Path | None = None) -> ProjectConfig:
    """Read ``[tool.traceinsight]`` from the nearest ``pyproject.toml`` above ``start`` (default: cwd).

    Raises :class:`~traceinsight.errors.ConfigError` (one line naming the file and the key) when the
    file is not valid TOML or the table holds an unknown key or a value of the wrong type.
    """
    path = find_pyproject(start if start is not None else Path.cwd())
    if path is None:
        return ProjectConfig()
    try:
        document = tomllib.loads(_read_small(path))
    except (OSError, UnicodeDecodeError) as error:
        raise ConfigError(f"cannot read {path}: {error}; fix the file or run from another folder") from None
    except tomllib.TOMLDecodeError as error:
        raise ConfigError(f"cannot read {path}: not valid TOML ({error}); fix the file") from None
    except RecursionError:
        raise ConfigError(
            f"cannot read {path}: its TOML is nested too deep to read; fix the file or run from another folder"
        ) from None
    table = document.get("tool", {}).get("traceinsight")
    if table is None:
        return ProjectConfig(path=path)
    if not isinstance(table, dict):
        raise ConfigError(f"{path}: [tool.traceinsight] must be a table")
    unknown = sorted(set(table) - set(KNOWN_KEYS))
    if unknown:
        known = ", ".join(KNOWN_KEYS)
        raise ConfigError(f"{path}: unknown key {unknown[0]!r} in [tool.traceinsight]; the keys are: {known}")
    user_code = table.get("user-code", [])
    if not isinstance(user_code, list) or not all(isinstance(item, str) and item for item in user_code):
        raise ConfigError(
            f"{path}: user-code in [tool.traceinsight] must be a list of package names, "
            'e.g. user-code = ["mylab"]'
        )
    source_root = table.get("source-root")
    if source_root is not None and not isinstance(source_root, str):
        raise ConfigError(f'{path}: source-root in [tool.traceinsight] must be a folder path, e.g. "."')
    return ProjectConfig(
        path=path,
        user_code=tuple(user_code),
        source_root=_inside(path, source_root) if source_root is not None else None,
        table=dict(table),
    )


def _read_small(path: Path) -> str:
    """The text of ``path`` when it is a regular file of at most :data:`MAX_PYPROJECT_BYTES`."""
    with path.open("rb") as stream:
        info = os.fstat(stream.fileno())
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(f"cannot read {path}: not a regular file; remove it or run from another folder")
        data = stream.read(MAX_PYPROJECT_BYTES + 1)
    if len(data) > MAX_PYPROJECT_BYTES:
        raise ConfigError(
            f"cannot read {path}: larger than {MAX_PYPROJECT_BYTES >> 20} MiB, which no project file is; "
            "fix the file or run from another folder"
        )
    return data.decode("utf-8")


def _inside(path: Path, source_root: str) -> Path:
    """``source-root`` resolved against the folder of ``path``; refused unless it lies inside it."""
    home = path.parent.resolve()
    folder = (home / source_root).resolve()
    if not folder.is_relative_to(home):
        raise ConfigError(
            f"{path}: source-root {source_root!r} in [tool.traceinsight] leads out of the folder holding "
            f"the file ({folder}); a project file may only name a folder inside its own (one shipped "
            "beside a trace must not widen what a report reads): fix it, or pass --source-root DIR"
        )
    return folder
