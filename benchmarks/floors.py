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

``pins`` prints the floors as ``name==version`` lines. Usage::

    python benchmarks/floors.py check       # what CI runs (about 1.5 minutes on 2 cores)
    python benchmarks/floors.py pins

The optional extras (``run``'s torch, ``dask``) are not installed: ``analyze`` of the samples
never loads them.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
SAME_OUTPUT = ROOT / "benchmarks" / "same_output.py"
#: Run at the floors too: what the samples' outputs do not show (``--help``, exit statuses, a cut
#: pipe: typer 0.15 with click 8.5 failed on ``--help``, rich 13.7 on ``| head``).
CLI_TESTS = ["tests/test_diff_gate_cli.py"]


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
        # The two sides at once: each is one process at a time, and CI has two cores.
        outputs = {side: Path(scratch) / side for side in ("floors", "newest")}
        writers = [
            subprocess.Popen(
                [sys.executable, str(SAME_OUTPUT), "write", str(outputs[side])],
                env=_environment(extra),
                stdout=subprocess.DEVNULL,
            )
            for side, extra in (("floors", folder), ("newest", None))
        ]
        if any(writer.wait() for writer in writers):
            print("floors: same_output.py write failed")
            return 1
        compared = subprocess.run(
            [sys.executable, str(SAME_OUTPUT), "compare", str(outputs["newest"]), str(outputs["floors"])]
        )
        verdict = "the same outputs" if compared.returncode == 0 else "DIFFERENT outputs"
        print(f"floors: {verdict} at the floors and the newest releases ({time.monotonic() - began:.0f} s)")
        tested = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CLI_TESTS],
            env=_environment(folder),
            cwd=ROOT,
        )
        verdict = "pass" if tested.returncode == 0 else "FAIL"
        print(f"floors: the CLI's tests {verdict} at the floors ({time.monotonic() - began:.0f} s)")
    return compared.returncode or tested.returncode


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("check", help="install the floors; the samples' outputs must not change")
    commands.add_parser("pins", help="print the declared floors as name==version")
    options = parser.parse_args()
    if options.command == "pins":
        print("\n".join(f"{name}=={version}" for name, version in declared_floors().items()))
    else:
        sys.exit(check())


if __name__ == "__main__":
    main()
