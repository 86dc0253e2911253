"""traceinsight: why does the GPU sit idle? Reads torch.profiler traces and names the line to fix.

In a notebook or a script::

    import traceinsight

    result = traceinsight.analyze("trace.json.gz")   # what `traceinsight analyze --json` writes
    result                                            # the scorecard and the finding cards
    result.frames["idle_gaps"]                        # every idle gap, a polars DataFrame
    traceinsight.diff("before.json.gz", "after.json.gz")

(:mod:`traceinsight.api`). Importing the package loads none of it (nor polars, nor matplotlib):
each name is imported when first used, with the renderers that show a result in a notebook (the
commands, which run on :mod:`traceinsight.api` too, never load those: a job's and a diff's types,
~0.04 s of a small trace's ``analyze``). ``traceinsight.step()`` and ``traceinsight.profile_step()``
mark steps for ``traceinsight run`` (no torch needed; no-ops outside it).
"""

from __future__ import annotations

from traceinsight.version import __version__

# Not `from typing import TYPE_CHECKING`: under `python -m traceinsight` this module runs before
# the command can take Ctrl-C as one line (traceinsight.__main__), so it imports next to nothing.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

    from traceinsight.api import analyze, diff, load
    from traceinsight.capture import profile_step, step
    from traceinsight.results import Comparison, Finding, JobResult, Result

__all__ = [
    "Comparison",
    "Finding",
    "JobResult",
    "Result",
    "__version__",
    "analyze",
    "diff",
    "load",
    "profile_step",
    "step",
]

#: The API's names, imported on first use (see the module doc).
_LAZY = {"analyze", "diff", "load", "Comparison", "Finding", "JobResult", "Result", "profile_step", "step"}

if not TYPE_CHECKING:  # the type checker reads the imports above

    def __getattr__(name: str) -> Any:
        if name not in _LAZY:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        import importlib

        if name == "load":  # the package of that name, callable (see traceinsight.load)
            return importlib.import_module("traceinsight.load")
        if name in ("profile_step", "step"):
            return getattr(importlib.import_module("traceinsight.capture"), name)
        from traceinsight import api, results
        from traceinsight.render import figures, notebook  # noqa: F401 (what results show in a notebook)

        return getattr(api, name) if name in api.__all__ else getattr(results, name)
