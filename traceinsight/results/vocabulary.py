"""The values a result's fields take, and their words: what the renderers need besides the result.

Each is declared by the analysis that makes the values (:mod:`traceinsight.analysis.causes`,
:mod:`~traceinsight.analysis.pace`, :mod:`~traceinsight.analysis.sources`,
:mod:`~traceinsight.analysis.usage`, :mod:`~traceinsight.analysis.validity`) and named here, beside
the result types (:mod:`.trace`), so that a renderer reads the model and nothing of ``analysis/``.
"""

from __future__ import annotations

from traceinsight.analysis.causes import (
    BUSY_LABELS,
    CAUSE_LABELS,
    CAUSE_ORDER,
    BusyClass,
    CauseKind,
    cause_label,
)
from traceinsight.analysis.pace import PaceSetter
from traceinsight.analysis.sources import CALL, DEF, ENTRY, RECORDING_START, Located
from traceinsight.analysis.usage import total_usage
from traceinsight.analysis.validity import GPU_RECORDS_LOST, NO_GPU_WORK, unrecorded_gpu

__all__ = [
    "BUSY_LABELS",
    "CALL",
    "CAUSE_LABELS",
    "CAUSE_ORDER",
    "DEF",
    "ENTRY",
    "GPU_RECORDS_LOST",
    "NO_GPU_WORK",
    "RECORDING_START",
    "BusyClass",
    "CauseKind",
    "Located",
    "PaceSetter",
    "cause_label",
    "total_usage",
    "unrecorded_gpu",
]
