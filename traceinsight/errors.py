"""The project's exception tree.

Every error a user can cause (a bad path, a file that is not a trace, a script that cannot be run)
is a :class:`TraceInsightError`. The CLI maps each to one line on stderr and an exit code; nothing
else in the package prints or exits.
"""

from __future__ import annotations


class TraceInsightError(Exception):
    """Base of every error meant for the user: its message is one complete sentence."""

    exit_code: int = 2


class TraceNotFound(TraceInsightError):
    """The trace path does not exist or is not a file."""


class TraceUnreadable(TraceInsightError):
    """The file exists but cannot be read or decompressed (permissions, truncated gzip)."""


class TraceFormatError(TraceInsightError):
    """The bytes are read but are not a torch.profiler Chrome trace (not JSON, truncated, wrong shape).

    ``at``: for JSON that stops being valid before its end, the byte of the (uncompressed) text
    where it does, when the parser says; None otherwise (a text cut short, a valid JSON text that
    is not a trace).
    """

    def __init__(self, message: str, *, at: int | None = None) -> None:
        super().__init__(message)
        self.at = at


class CaptureError(TraceInsightError):
    """`traceinsight run` cannot profile the script (torch missing, script missing, bad schedule)."""


class OutputError(TraceInsightError):
    """A report or JSON file cannot be written where the user asked."""


class ConfigError(TraceInsightError):
    """The ``[tool.traceinsight]`` table of ``pyproject.toml`` (or an option) is malformed."""
