"""Typed, frozen results of the analyses. Times are integer nanoseconds; renderers convert.

The types a trace's :class:`~traceinsight.results.trace.Result` holds are declared here (and in
the modules beside that make them), once: the analyses produce them, the result keeps them, the
JSON codec (:mod:`traceinsight.results.codec`) writes and reads them by their fields. A field's
``metadata`` is the codec's: the checks a stored value is read under (:data:`SHARE`,
:data:`DURATION`, :data:`COUNT`, :data:`ID`, :data:`CODE`), and :data:`LOCAL` for what only a live
analysis knows (never written; a stored result holds the field's default, and equality ignores it).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, TypeVar

from traceinsight.model import CODE, COUNT, DURATION, ID, LOCAL, SHARE, Model, field, fields_of

__all__ = ["CODE", "COUNT", "DURATION", "ID", "LOCAL", "SHARE", "from_columns", "share_of"]

_Record = TypeVar("_Record")


def share_of(value: float | None) -> float | None:
    """A share as results hold it (and the JSON writes it): 4 decimals."""
    return None if value is None else round(value, 4)


def from_columns(cls: type[_Record], columns: Sequence[Sequence[Any]]) -> tuple[_Record, ...]:
    """One ``cls`` per row of ``columns`` (a column per field, in the fields' order, each field a
    positional argument of ``cls``): ``tuple(cls(*row) for row in zip(*columns, strict=True))``.

    A result type's ``__init__`` is msgspec's, in C: about 0.35 us a row of 11 fields, against
    2.3 us for a frozen dataclass's (which set each field through ``object.__setattr__``). An LLM
    decode trace reports tens of thousands of idle gaps, each made twice (the analysis's and the
    result's).
    """
    if len(columns) != len(fields_of(cls)):
        raise TypeError(f"{cls.__name__}: one column per field ({len(columns)} for {len(fields_of(cls))})")
    rows = len(columns[0]) if columns else 0
    if any(len(column) != rows for column in columns):
        raise ValueError(f"{cls.__name__}: columns of different lengths")
    return tuple(map(cls, *columns))


class Device(Model, frozen=True, kw_only=True):
    """GPU time on one device.

    busy = length of the union of kernel, copy and memset intervals on the device (all streams);
    span = first GPU activity start to last GPU activity end; idle = span − busy.
    busy = compute + communication + exposed copies: each busy nanosecond is counted once, compute
    first (non-communication kernels), then communication kernels, then copies and memsets.
    """

    device: int
    name: str | None
    span_ns: int
    busy_ns: int
    #: Span minus busy.
    idle_ns: int
    kernel_ns: int  # union of kernel intervals only (communication kernels included)
    copy_ns: int  # summed copy durations
    #: busy / span, 4 decimals (0 for an empty span).
    utilization: float
    #: Union of non-communication kernels.
    compute_ns: int = 0
    #: Communication kernel time not overlapped by compute.
    communication_ns: int = 0
    #: Copy and memset time while no kernel ran.
    copy_exposed_ns: int = 0
    #: Idle split by cause (``CauseKind`` values), largest first, adding up to ``idle_ns`` exactly;
    #: time outside the steady-state steps is ``outside-steady-state``.
    idle_by_cause_ns: dict[str, int] = field(default_factory=dict)
    #: The first GPU activity's start and the last one's end, on the trace's clock. Live only.
    first_ns: int = field(default=0, compare=False, repr=False, metadata=LOCAL)
    last_ns: int = field(default=0, compare=False, repr=False, metadata=LOCAL)


class Step(Model, frozen=True, kw_only=True):
    """One step (``ProfilerStep#N``, or an optimizer step) on one device: the step's device window
    (from when the step before it was done to when its own work was done, see
    :mod:`traceinsight.analysis.steady`) and the GPU time inside it. compute + communication +
    exposed copies + idle = the window, exactly. Times count from the trace's earliest event
    (``meta.origin_ns``), as every output shows them."""

    step: int
    device: int
    #: The device window: the GPU's clock (the step's host range is ``host_start_ns``/``host_span_ns``).
    start_ns: int
    #: Length of the device window: the step's step time.
    span_ns: int
    #: The step's host range (``ProfilerStep#N``, or between two ``Optimizer.step`` ends).
    host_start_ns: int = 0
    host_span_ns: int = 0
    busy_ns: int
    #: Window length minus GPU busy inside it.
    idle_ns: int
    copy_ns: int
    #: Idle inside the window split by cause kind (``CauseKind`` values), largest first, adding up
    #: to ``idle_ns``.
    idle_by_cause_ns: dict[str, int]
    compute_ns: int = 0
    communication_ns: int = 0
    copy_exposed_ns: int = 0
    #: False for start-up, outlier and cut-short steps (see :mod:`traceinsight.analysis.steady`).
    steady: bool = True
    #: Why the step is not steady, in plain words.
    not_steady_because: str | None = None
    #: The part of ``idle_by_cause_ns`` from the window's start until the step's own first GPU work
    #: on this device (work launched in its host range), by cause: the GPU waiting while the host
    #: prepared the step. Empty when the step launched nothing on this device. Live only.
    lead_by_cause_ns: tuple[tuple[str, int], ...] = field(
        default=(), compare=False, repr=False, metadata=LOCAL
    )
    #: Start of the step's own first GPU work on this device, on the trace's clock (None: it
    #: launched none there). Live only.
    first_work_ns: int | None = field(default=None, compare=False, repr=False, metadata=LOCAL)

    @property
    def end_ns(self) -> int:
        """End of the device window, from the trace's earliest event."""
        return self.start_ns + self.span_ns


class IdleGap(Model, frozen=True):
    """A stretch with no GPU activity on a device, and what the host was doing meanwhile;
    ``start_ns`` counts from the trace's earliest event (``meta.origin_ns``), as every output shows it.

    cause_kind: ``dataloader`` (host in DataLoader ``__next__``), ``sync`` (a blocking call drained
    the queue), ``other-gpu`` (waiting for another GPU of the same process: a pipeline bubble),
    ``cpu_op`` (host inside an op or annotation), ``host-bound`` (host only launching /
    running Python), ``untraced`` (the launching thread recorded nothing during the gap), ``unknown`` (no host thread could be tied to the next GPU work).
    """

    device: int
    start_ns: int
    duration_ns: int
    cause_kind: str
    cause: str  # readable: "cudaStreamSynchronize in aten::item", "DataLoader __next__", ...
    source: str | None  # "train.py:47" (the user's innermost frame), when stacks exist
    #: ``user`` when ``source`` is the user's own line, ``library`` when only library frames were there.
    source_kind: str | None = None
    #: What ``source``'s line is: ``call`` (the call's line), ``def`` (the first line of
    #: ``source_function``: torch's stack names a function so), ``recording-start`` (the line
    #: ``source_function`` was on when recording began), None when the trace does not say (see
    #: :mod:`traceinsight.analysis.sources`).
    source_line_kind: str | None = None
    #: The function ``source`` is in (``log_metrics``), when frames name it.
    source_function: str | None = None
    #: The blocking call (``blocking_calls`` key) that drained the queue, for ``sync``/``copy``
    #: causes. Live only.
    sync_key: int | None = field(default=None, compare=False, metadata=LOCAL)
    #: The GPU this one waited for, for the ``other-gpu`` cause (a pipeline bubble). Live only.
    other_device: int | None = field(default=None, compare=False, metadata=LOCAL)

    @property
    def end_ns(self) -> int:
        """Gap end, from the trace's earliest event."""
        return self.start_ns + self.duration_ns


class CopyGroup(Model, frozen=True, kw_only=True):
    """Copies on one device with one name (``Memcpy HtoD (Pageable -> Device)``)."""

    device: int
    kind: str
    direction: str
    src: str | None
    dst: str | None
    count: int
    bytes: int
    duration_ns: int
    #: Time of these copies that ran while a kernel ran on the same device (any stream).
    overlapped_ns: int
    #: bytes / duration in GB/s, 3 decimals (None without duration).
    bandwidth_gbps: float | None
    #: How many of these copies blocked the host (pageable memory, a synchronous API, or the host
    #: call followed by a blocking sync within the window).
    host_blocked: int

    @property
    def pageable(self) -> bool:
        """Either side is pageable host memory."""
        return self.src == "Pageable" or self.dst == "Pageable"


class H2DCopy(Model, frozen=True):
    """One host-to-device copy whose host call starts in the steady state."""

    #: The host call that issued it (``cudaMemcpyAsync`` ...), ns on the trace clock.
    call_start_ns: int
    call_end_ns: int
    correlation: int
    #: The copy's name (``Memcpy HtoD (Pageable -> Device)``).
    kind: str
    device: int
    bytes: int
    #: Its time on the GPU, and how much of it ran while a kernel ran on its device (any stream).
    duration_ns: int
    overlapped_ns: int


class SyncCall(Model, frozen=True, kw_only=True):
    """All host-blocking calls of one name."""

    call: str
    count: int
    blocked_ns: int


class SyncHotspot(Model, frozen=True, kw_only=True):
    """Host waits grouped by (call, call after it, op, source line, copy waited for).

    A wait is one blocking call, or a copy call that waits inside itself (a device-to-host copy
    into pageable memory) and the sync right after it: ``call`` then ``then_call``, one wait.
    op is the outermost operator enclosing the call on its thread (the one user code called, e.g.
    ``aten::item``); op_chain lists every enclosing operator, outermost first. blocked is the
    host time in the waits' calls; idle_after is the GPU idle time from each wait's return until
    the device's next activity, summed.
    """

    call: str
    op: str | None
    op_chain: str | None
    source: str | None
    #: The copy the calls wait for (``Memcpy DtoH (Device -> Pageable)``), when one precedes them.
    copy: str | None
    count: int
    #: Calls per iteration, 4 decimals (None without iterations).
    per_step: float | None
    blocked_ns: int
    idle_after_ns: int
    #: ``user`` or ``library`` (see :func:`traceinsight.analysis.sources.source_at`).
    source_kind: str | None
    #: Calls inside the steady-state steps.
    steady_count: int = field(default=0, metadata=COUNT)
    #: Steady steps with at least one of these calls (None: a result stored before it).
    steady_steps_with: int | None = field(default=None, metadata=COUNT)
    #: GPU idle in gaps whose cause is these calls (``sync`` or ``copy``), inside the steady state.
    idle_caused_ns: int = 0
    #: The sync that completes each wait after a copy call (``cudaStreamSynchronize`` after the
    #: ``cudaMemcpyAsync`` of ``.item()``), when there is one: the pair is one wait, counted once.
    then_call: str | None = None
    #: What ``source``'s line is: ``call`` (the call's line), ``def`` (the first line of
    #: ``source_function``: torch's stack names a function so), ``recording-start`` (the line
    #: ``source_function`` was on when recording began), None when the trace does not say (see
    #: :mod:`traceinsight.analysis.sources`).
    source_line_kind: str | None = None
    #: The function ``source`` is in (``log_metrics``), when frames name it.
    source_function: str | None = None
    #: Framework code the line calls that reads GPU values on the host by design
    #: (``torch.optim.LBFGS``: :data:`traceinsight.load.taxonomy.DESIGNED_SYNCS`), when the calls
    #: happen inside it.
    framework_call: str | None = None
    #: The calls' keys in the blocking-call table (for the step replay). Live only.
    keys: tuple[int, ...] = field(default=(), compare=False, repr=False, metadata=LOCAL)
    #: The ``nn.Module`` whose forward makes these calls (data-dependent control flow), if known.
    #: Live only.
    module: str | None = field(default=None, compare=False, metadata=LOCAL)
    #: Host time blocked in the calls inside the steady state (``blocked_ns`` counts every call).
    steady_blocked_ns: int = field(default=0, metadata=DURATION)

    @property
    def call_text(self) -> str:
        """The wait's calls as shown: ``cudaMemcpyAsync + cudaStreamSynchronize``."""
        return f"{self.call} + {self.then_call}" if self.then_call else self.call


class HostOp(Model, frozen=True, kw_only=True):
    """A host operator: its top-level occurrences, their total and their own (self) time."""

    name: str
    count: int
    total_ns: int
    #: Total minus the operators it calls directly.
    self_ns: int = 0


class Host(Model, frozen=True, kw_only=True):
    """The host-side view, available with or without GPU activity."""

    threads: int
    cpu_ops: int
    python_frames: int
    dataloader_ns: int
    dataloader_count: int
    #: The busiest operators by self time, most first.
    top_ops: tuple[HostOp, ...] = ()
