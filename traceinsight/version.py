"""The package's version, in one place (``pyproject.toml`` says the same)."""

from __future__ import annotations

__version__ = "0.1.0"
