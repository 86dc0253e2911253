"""traceinsight: why does the GPU sit idle? Reads torch.profiler traces and names the line to fix."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
