"""Check that the dependency floors ``pyproject.toml`` declares are true: the tool at its oldest
allowed releases gives the same output as at the newest.

``check`` installs every runtime dependency of ``[project].dependencies`` that applies here (its
environment marker holds) at its declared floor (``polars>=1.37`` → ``polars==1.37``) into a
folder of its own, with what those releases depend on resolved by pip as for a user who already
has them (``polars-runtime-32`` for a polars that is split in two, ``click`` for typer), checks
that each floor is the version then imported, then writes every sample's outputs with
``benchmarks/same_output.py`` twice, in fresh processes: with that folder ahead of the current
environment on ``PYTHONPATH``, and without it. Every file (JSON, HTML, Markdown, the terminal
summary, the exit status) must be byte for byte the same, and the CLI's tests
(:data:`CLI_TESTS`: help, exit statuses, a cut pipe) must pass at the floors; the exit status is
1 otherwise. A dependency without a ``>=`` floor is refused: nothing could check it.

``python`` does the same for ``requires-python``'s floor: it finds that Python (``python3.10`` on
the path, or a pyenv version of it), installs the package from this checkout into a fresh venv of
it (the scanner compiled for it, the newest releases pip finds for it), writes every sample's
outputs there and here, and compares them (3.10 lacks ``enum.StrEnum``, which the package
imported unguarded until ``traceinsight.compat``: every ``analyze`` on 3.10 failed, and nothing
ran it there). A machine without that Python gets a line saying so and status 0.

``pins`` prints the floors as ``name==version`` lines. Usage::

    python benchmarks/floors.py check       # what CI runs (about 1.5 minutes on 2 cores)
    python benchmarks/floors.py python      # CI too (about 1.5 minutes)
    python benchmarks/floors.py pins

The optional extras (``run``'s torch, ``dask``) are not installed: ``analyze`` of the samples
never loads them.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.specifiers import SpecifierSet
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
SAME_OUTPUT = ROOT / "benchmarks" / "same_output.py"
#: Run at the floors too: what the samples' outputs do not show (``--help``, exit statuses, a cut
#: pipe: typer 0.15 with click 8.5 failed on ``--help``, rich 13.7 on ``| head``); the result
#: types' behaviour (msgspec 0.20's ``replace`` skipped ``__post_init__``).
CLI_TESTS = ["tests/test_diff_gate_cli.py", "tests/test_records.py"]


def declared_floors(pyproject: Path = ROOT / "pyproject.toml") -> dict[str, str]:
    """The ``>=`` version of each runtime dependency whose marker holds here, by name."""
    floors = {}
    for line in tomllib.loads(pyproject.read_text())["project"]["dependencies"]:
        requirement = Requirement(line)
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        lower = [spec.version for spec in requirement.specifier if spec.operator == ">="]
        if len(lower) != 1:
            raise SystemExit(f"{pyproject}: {line!r} has no single '>=' floor to check")
        floors[requirement.name] = lower[0]
    return floors


def _imported_versions(folder: Path, names: list[str]) -> dict[str, str]:
    """The version of each distribution that Python finds with ``folder`` first on its path."""
    probe = "import sys, importlib.metadata as m; print(*(m.version(n) for n in sys.argv[1:]))"
    done = subprocess.run(
        [sys.executable, "-c", probe, *names],
        env=_environment(folder),
        capture_output=True,
        text=True,
        check=True,
    )
    return dict(zip(names, done.stdout.split(), strict=True))


def _environment(folder: Path | None) -> dict[str, str]:
    environment = dict(os.environ)
    if folder is not None:
        environment["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(folder), environment.get("PYTHONPATH")])
        )
    return environment


def check() -> int:
    """Install the floors, write the samples' outputs with and without them, compare; the exit status."""
    floors = declared_floors()
    pins = [f"{name}=={version}" for name, version in floors.items()]
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="floors-") as scratch:
        folder = Path(scratch) / "site"
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "-q", "--disable-pip-version-check",
             "--target", str(folder), *pins],
            check=True,
        )  # fmt: skip
        imported = _imported_versions(folder, list(floors))
        wrong = {name: got for name, got in imported.items() if Version(got) != Version(floors[name])}
        if wrong:
            print(f"floors: the floor environment imports {wrong}, not the floors {floors}")
            return 1
        print(f"floors: installed {' '.join(pins)} ({time.monotonic() - began:.0f} s)", flush=True)
        compared = _same_outputs(
            Path(scratch),
            reference=(sys.executable, _environment(None)),
            checked=(sys.executable, _environment(folder)),
        )
        if compared is None:
            return 1
        verdict = "the same outputs" if compared == 0 else "DIFFERENT outputs"
        print(f"floors: {verdict} at the floors and the newest releases ({time.monotonic() - began:.0f} s)")
        tested = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CLI_TESTS],
            env=_environment(folder),
            cwd=ROOT,
        )
        verdict = "pass" if tested.returncode == 0 else "FAIL"
        print(f"floors: the CLI's tests {verdict} at the floors ({time.monotonic() - began:.0f} s)")
    return compared or tested.returncode


def _same_outputs(
    scratch: Path, *, reference: tuple[str, dict[str, str] | None], checked: tuple[str, dict[str, str] | None]
) -> int | None:
    """Every sample's outputs written by ``reference`` and by ``checked`` (each an interpreter and
    its environment), the two at once (each is one process at a time, and CI has two cores), then
    compared (``same_output.py compare`` lists what differs): its exit status; None when a write
    failed (said in a line)."""
    outputs = {side: scratch / side for side in ("reference", "checked")}
    writers = [
        subprocess.Popen(
            [executable, str(SAME_OUTPUT), "write", str(outputs[side])],
            env=environment,
            stdout=subprocess.DEVNULL,
        )
        for side, (executable, environment) in (("reference", reference), ("checked", checked))
    ]
    if any(writer.wait() for writer in writers):
        print("floors: same_output.py write failed")
        return None
    compared = subprocess.run(
        [sys.executable, str(SAME_OUTPUT), "compare", str(outputs["reference"]), str(outputs["checked"])]
    )
    return compared.returncode


def python_floor() -> str:
    """The lowest Python ``requires-python`` allows, as ``3.10``."""
    required = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["requires-python"]
    lower = [spec.version for spec in SpecifierSet(required) if spec.operator == ">="]
    if len(lower) != 1:
        raise SystemExit(f"pyproject.toml: requires-python {required!r} has no single '>=' floor")
    return ".".join(lower[0].split(".")[:2])


def _interpreter(version: str) -> str | None:
    """A Python ``version`` that runs: on the path, else a pyenv version of it."""
    candidates = [shutil.which(f"python{version}")]
    root = os.environ.get("PYENV_ROOT", os.path.expanduser("~/.pyenv"))
    candidates += sorted(glob.glob(os.path.join(root, "versions", f"{version}.*", "bin", f"python{version}")))
    probe = "import sys; print('%d.%d' % sys.version_info[:2])"
    for candidate in filter(None, candidates):
        done = subprocess.run([candidate, "-c", probe], capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == version:
            return candidate
    return None


def check_python() -> int:
    """Install the package on ``requires-python``'s floor; its outputs must equal this Python's."""
    version = python_floor()
    interpreter = _interpreter(version)
    if interpreter is None:
        print(f"floors: no Python {version} on this machine: the package was not checked on it")
        return 0
    began = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="python-floor-") as scratch:
        venv = Path(scratch) / "venv"
        subprocess.run([interpreter, "-m", "venv", str(venv)], check=True)
        python = str(venv / "bin" / "python")
        subprocess.run(
            [python, "-m", "pip", "install", "-q", "--disable-pip-version-check", str(ROOT)], check=True
        )
        print(
            f"floors: installed the package on Python {version} ({time.monotonic() - began:.0f} s)",
            flush=True,
        )
        environment = {key: value for key, value in os.environ.items() if key != "PYTHONPATH"}
        compared = _same_outputs(
            Path(scratch), reference=(sys.executable, None), checked=(python, environment)
        )
    if compared is None:
        return 1
    verdict = "the same outputs" if compared == 0 else "DIFFERENT outputs"
    print(f"floors: {verdict} on Python {version} and this Python ({time.monotonic() - began:.0f} s)")
    return compared


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="install the floors; the samples' outputs must not change")
    commands.add_parser("python", help="install on requires-python's floor; the outputs must not change")
    commands.add_parser("pins", help="print the declared floors as name==version")
    options = parser.parse_args()
    if options.command == "pins":
        print("\n".join(f"{name}=={version}" for name, version in declared_floors().items()))
    elif options.command == "python":
        sys.exit(check_python())
    else:
        sys.exit(check())


if __name__ == "__main__":
    main()
