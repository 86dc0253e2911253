"""Build hook: compile the loader's optional C scanner (``traceinsight/load/_scan.c``).

The scanner makes loading several times faster; without a C compiler (or with
``TRACEINSIGHT_PURE=1``) the package builds as pure Python and loads with msgspec instead, with the
same results. An editable install compiles the module in place, beside its source.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

MODULE = "traceinsight.load._scan"
SOURCE = "traceinsight/load/_scan.c"


class NativeScannerHook(BuildHookInterface):  # type: ignore[type-arg]
    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or os.environ.get("TRACEINSIGHT_PURE") == "1":
            return
        root = Path(self.root)
        editable = version == "editable"
        try:
            built = _compile(root, inplace=editable)
        except Exception as exc:  # no compiler, no headers: the pure-Python loader still works
            print(f"traceinsight: C scanner not built ({exc}); loading will use pure Python", file=sys.stderr)
            return
        build_data["pure_python"] = False
        build_data["infer_tag"] = True
        if not editable:
            build_data["force_include"][str(built)] = "/".join([*MODULE.split(".")[:-1], built.name])


def _compile(root: Path, *, inplace: bool) -> Path:
    from setuptools import Distribution, Extension
    from setuptools.command.build_ext import build_ext

    flags = [] if sys.platform == "win32" else ["-O3", "-std=c11", "-Wall"]
    extension = Extension(MODULE, [SOURCE], extra_compile_args=flags)
    distribution = Distribution({"name": "torch-traceinsight", "ext_modules": [extension]})
    distribution.script_name = "hatch_build.py"
    command = build_ext(distribution)
    scratch = Path(tempfile.mkdtemp(prefix="traceinsight-build-"))
    command.build_temp = str(scratch / "temp")
    command.build_lib = str(scratch / "lib")
    command.inplace = inplace
    cwd = os.getcwd()
    os.chdir(root)
    try:
        command.ensure_finalized()
        command.run()
        path = Path(command.get_ext_fullpath(MODULE))
    finally:
        os.chdir(cwd)
    return path if path.is_absolute() else root / path
