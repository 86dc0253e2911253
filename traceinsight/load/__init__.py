"""Loading a trace file into typed polars tables (:class:`Trace`).

Which loader runs (:func:`choose_loader`): the C scanner (:mod:`.native`) whenever it was built,
which is every install from source with a C compiler; the pure-Python loader (:mod:`.fallback`,
msgspec) where it was not, or for the rare file the scanner leaves to Python. Both give exactly
the tables of the reference loader (:mod:`.reference`, stdlib json), which the tests hold them to.
Every path opens the file the same safe way and streams gzip under the same size limit
(:mod:`.source`); the limits are in :mod:`.limits`.
"""

from __future__ import annotations

import importlib
import os
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from traceinsight.load.loader import choose_loader, load_pure, load_trace
    from traceinsight.load.progress import ProgressCallback
    from traceinsight.load.reference import load_trace_reference
    from traceinsight.load.source import SizeLimit
    from traceinsight.load.tables import Device, RunProfile, Trace, TraceMeta

__all__ = [
    "Device",
    "ProgressCallback",
    "RunProfile",
    "SizeLimit",
    "Trace",
    "TraceMeta",
    "choose_loader",
    "load_pure",
    "load_trace",
    "load_trace_reference",
]

#: Where each name of the package lives. They are imported when first used, so that the light
#: modules (:mod:`.source`, :mod:`.limits`, :mod:`.repair`, :mod:`.taxonomy`) load without polars:
#: the command's ``--help`` and ``traceinsight run`` before its script read them.
_HOMES: Final = {
    "Device": "tables",
    "ProgressCallback": "progress",
    "RunProfile": "tables",
    "SizeLimit": "source",
    "Trace": "tables",
    "TraceMeta": "tables",
    "choose_loader": "loader",
    "load_pure": "loader",
    "load_trace": "loader",
    "load_trace_reference": "reference",
}


if not TYPE_CHECKING:  # the type checker reads the imports above

    def __getattr__(name: str) -> Any:
        home = _HOMES.get(name)
        if home is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        return getattr(importlib.import_module(f"{__name__}.{home}"), name)


class _Callable(types.ModuleType):
    """The package, callable: ``traceinsight.load(trace)`` is :func:`traceinsight.api.load`.

    The public API's ``traceinsight.load`` and this package share a name, and importing the package
    sets the name to it: so the package itself does what the function does, whichever was first.
    """

    def __call__(self, trace: str | os.PathLike[str], *, max_bytes: int | None = None) -> Trace:
        """The trace's typed polars tables (see :func:`traceinsight.api.load`)."""
        from traceinsight.load.loader import load_trace
        from traceinsight.load.source import SizeLimit

        return load_trace(Path(trace), limit=SizeLimit(max_bytes))


sys.modules[__name__].__class__ = _Callable
