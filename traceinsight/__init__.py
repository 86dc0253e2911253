"""traceinsight: why does the GPU sit idle? Reads torch.profiler traces and names the line to fix."""

from __future__ import annotations

__version__ = "0.1.0"

# The step API for loops without torch.optim; no-ops outside `traceinsight run`, no torch needed.
from traceinsight.capture import profile_step, step

__all__ = ["__version__", "profile_step", "step"]
