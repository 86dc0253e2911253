"""The JSON output: the result's own (:meth:`~traceinsight.results.trace.Result.to_json`, the
versioned contract that :mod:`traceinsight.results` declares and reads back)."""

from __future__ import annotations

from traceinsight.render import AnyResult

__all__ = ["JsonRenderer"]


class JsonRenderer:
    """Renders a result as the JSON ``--json`` writes."""

    def render(self, result: AnyResult) -> str:
        """The result as its JSON document (UTF-8, keys in contract order)."""
        return result.to_json()
