"""The words of the domain for GPU time: busy classes and idle causes, with their plain labels.

Every analysis, rule and renderer takes these from here; the string values are the JSON contract
(``cause_kind``, ``idle_by_cause_us`` keys) and never change meaning.
"""

from __future__ import annotations

from typing import Final

from traceinsight.compat import StrEnum


class CauseKind(StrEnum):
    """Why a GPU was idle for a stretch of time. Every idle nanosecond gets exactly one."""

    DATALOADER = "dataloader"
    """The launching thread waited in DataLoader ``__next__``."""
    SYNC = "sync"
    """A host sync drained the queue (``.item()``, ``.cpu()``, ``synchronize``)."""
    COPY = "copy"
    """The host waited on a blocking copy (pageable ``.to('cuda')``, a synchronous ``cudaMemcpy``)."""
    COMMUNICATION = "communication"
    """The host waited inside a collective or other communication call."""
    OTHER_GPU = "other-gpu"
    """Another GPU driven by the same process worked while this one waited for it (the host blocked
    on the GPUs, or the next work already queued behind the other GPU's): a pipeline bubble."""
    HOST_OP = "cpu_op"
    """The host spent the gap inside one operator or annotated range (value kept from schema 1)."""
    ALLOCATOR = "allocator"
    """The host spent the gap in the allocator's driver calls (``cudaMalloc``/``cudaFree``,
    ``hipMalloc``/``hipFree``), inside whatever operator asked for memory."""
    LAUNCH = "host-bound"
    """The host was busy launching work / running Python between launches (value kept from schema 1)."""
    QUEUED = "queued"
    """The next work was already queued: the GPU waited on another stream, an event or a graph."""
    UNTRACED = "untraced"
    """The launching thread recorded nothing during the gap."""
    UNKNOWN = "unknown"
    """No host thread could be tied to the work that ended the gap."""
    CAPTURE = "graph-capture"
    """The launching thread was capturing a CUDA/HIP graph: its launches were recorded, not run."""
    WAITING = "waiting-for-work"
    """Between two requests of a server (steps taken from repeating request ranges): nothing to do
    until the next request arrived; outside every window, and not the host's fault."""
    OUTSIDE_STEADY = "outside-steady-state"
    """Idle outside the steady-state steps: start-up, warm-up, an outlier step, before/after the steps."""
    BEFORE_FIRST = "before-first-work"
    """Step time before the device's first GPU work in the trace (per-step views only)."""
    AFTER_LAST = "after-last-work"
    """Step time after the device's last GPU work in the trace (per-step views only)."""


#: Plain words for each cause, as every renderer shows them.
CAUSE_LABELS: Final[dict[CauseKind, str]] = {
    CauseKind.DATALOADER: "waiting for the DataLoader",
    CauseKind.SYNC: "after a host sync",
    CauseKind.COPY: "waiting on a blocking copy",
    CauseKind.COMMUNICATION: "waiting on communication",
    CauseKind.OTHER_GPU: "waiting for another GPU (pipeline bubble)",
    CauseKind.HOST_OP: "host busy in an operator",
    CauseKind.ALLOCATOR: "host in the allocator (cudaMalloc / cudaFree)",
    CauseKind.LAUNCH: "host launching (Python / launch overhead)",
    CauseKind.QUEUED: "work queued, GPU waiting on a dependency",
    CauseKind.UNTRACED: "nothing recorded on the host",
    CauseKind.UNKNOWN: "no launching thread found",
    CauseKind.CAPTURE: "capturing a CUDA/HIP graph (launches recorded, not run)",
    CauseKind.WAITING: "waiting for work (between requests)",
    CauseKind.OUTSIDE_STEADY: "outside the steady state (start-up, warm-up, outlier steps)",
    CauseKind.BEFORE_FIRST: "before the GPU's first work",
    CauseKind.AFTER_LAST: "after the GPU's last work",
}

#: The order causes are listed in charts and tables (host waits first, then host work, then the rest).
CAUSE_ORDER: Final[tuple[CauseKind, ...]] = tuple(CAUSE_LABELS)


def cause_label(kind: str) -> str:
    """Plain words for a cause value (the value itself when this version does not know it)."""
    try:
        return CAUSE_LABELS[CauseKind(kind)]
    except ValueError:
        return kind


class BusyClass(StrEnum):
    """What a busy GPU is doing. Each busy nanosecond is counted once, in this priority order."""

    COMPUTE = "compute"
    """Kernels other than communication."""
    COMMUNICATION = "communication"
    """Communication kernels (NCCL/RCCL collectives, send/recv) not overlapped by compute."""
    COPY = "copy"
    """Copies and memsets while no kernel runs."""


BUSY_LABELS: Final[dict[BusyClass, str]] = {
    BusyClass.COMPUTE: "compute",
    BusyClass.COMMUNICATION: "communication (not overlapped)",
    BusyClass.COPY: "copies (not overlapped)",
}
