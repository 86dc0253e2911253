"""Build hook: compile the optional C modules: the loader's scanner (``traceinsight/load/_scan.c``),
the host analysis's nesting walk (``traceinsight/analysis/_nesting.c``), the replay's walk
(``traceinsight/analysis/_replay.c``) and the hand-over of numpy arrays to polars
(``traceinsight/_arrays.c``).

The scanner makes loading several times faster, the walks the self times of host operators and
the replay of the rules' fixes; without a C compiler (or with ``TRACEINSIGHT_PURE=1``) the package
builds as pure Python, loads with msgspec and walks with polars and Python instead, with the same
results. An editable install compiles the modules in place, beside their sources.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

#: (module, source) of each optional C module.
MODULES = (
    ("traceinsight.load._scan", "traceinsight/load/_scan.c"),
    ("traceinsight.analysis._nesting", "traceinsight/analysis/_nesting.c"),
    ("traceinsight.analysis._replay", "traceinsight/analysis/_replay.c"),
    ("traceinsight._arrays", "traceinsight/_arrays.c"),
)


class NativeScannerHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("TRACEINSIGHT_PURE") == "1":
            return
        root = Path(self.root)
        editable = version == "editable"
        # One scratch folder for the build, removed when the wheel is made (:meth:`finalize`: a
        # wheel's modules are taken from it), at once for an editable install or a failed build;
        # every build used to leave a traceinsight-build-* folder in the temporary folder.
        scratch = Path(tempfile.mkdtemp(prefix="traceinsight-build-"))
        self._scratch = scratch
        try:
            built = [
                (module, _compile(root, module, source, inplace=editable, scratch=scratch / str(index)))
                for index, (module, source) in enumerate(MODULES)
            ]
        except Exception as exc:  # no compiler, no headers: the pure-Python paths still work
            self._remove_scratch()
            print(f"traceinsight: C modules not built ({exc}); loading will use pure Python", file=sys.stderr)
            return
        if editable:
            self._remove_scratch()
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if not editable:
            for module, path in built:
                build_data["force_include"][str(path)] = "/".join([*module.split(".")[:-1], path.name])

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        self._remove_scratch()

    def _remove_scratch(self) -> None:
        scratch = getattr(self, "_scratch", None)
        self._scratch = None
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def _compile(root: Path, module: str, source: str, *, inplace: bool, scratch: Path) -> Path:
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    flags = [] if sys.platform == "win32" else ["-O3", "-std=c11", "-Wall"]
    extension = Extension(module, [source], extra_compile_args=flags)
    distribution = Distribution({"name": "torch-traceinsight", "ext_modules": [extension]})
    distribution.script_name = "hatch_build.py"
    command = build_ext(distribution)
    command.build_temp = str(scratch / "temp")
    command.build_lib = str(scratch / "lib")
    command.inplace = inplace
    cwd = os.getcwd()
    os.chdir(root)
    try:
        command.ensure_finalized()
        command.run()
        path = Path(command.get_ext_fullpath(module))
    finally:
        os.chdir(cwd)
    return path if path.is_absolute() else root / path
