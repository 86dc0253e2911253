"""`traceinsight run`: profile a training script in this process and leave one trace file.

The only package that imports torch, and only inside functions: importing it (and the public step
API, :func:`step` and :func:`profile_step`) works without torch installed.
"""

from __future__ import annotations

from traceinsight.capture.steps import profile_step, step

__all__ = ["profile_step", "step"]
