"""One trace's result: what ``analyze --json`` writes, as types.

:class:`Result` is the JSON contract (the keys below, never renamed; new keys may be added), typed:
its fields are the JSON's keys in order, times held as integer nanoseconds and written as
microseconds (:mod:`.codec`), sizes in bytes. ``start`` times count from the trace's earliest event
(``trace.origin_us``). A live result (:meth:`Result.of`) also carries the analysis it was made
from (:attr:`Result.report`), from which the terminal summary, the page and the Markdown are drawn;
a stored one (:meth:`Result.from_json`) is the same type without it, and compares equal to the
live one it was written from. The methods are written in the modules beside: the JSON
(:mod:`.writer`, :mod:`.stored`), the tables (:mod:`.frames`), the notebook's view (:mod:`.shown`).

Schema 2 (this version) added ``warnings``, ``steady_state``, ``utilization``, the busy classes and
idle split of ``devices`` and ``steps``, and per finding ``minor``, ``savings_per_step_us``,
``saving_share``, ``saving_note``, ``source_kind``; ``savings_us`` is now the step replay's
saving, and ``cause_kind`` has the values of :class:`~traceinsight.analysis.causes.CauseKind`.
Later additions within schema 2 (each read as its default from a file written before it):
``kernels``, ``memory`` (per device: peaks in bytes, the device's total, ``series`` of
``[start_us, allocated, reserved]``; ``allocator_calls`` in the steady state); the ``cause_kind``
value ``other-gpu`` (a GPU waiting for another GPU of its process: a pipeline bubble) and the
finding rule ``pipeline-bubble``; beside each ``source`` (idle gaps, sync hot spots, findings)
``source_line_kind`` (what the line is: ``call``, the call's line; ``def``, the first line of
``source_function``, as torch's stack names it; ``recording-start``, the line ``source_function``
was on when recording began; ``entry``, the lowest of several lines one caller entered a function
of that name at: a generator's ``yield``s or several same-named functions, no def line claimed;
null when the trace does not say) and ``source_function``; on sync
hot spots and findings ``framework_call`` (framework code the calls happen in that reads values on
the host by design, such as ``torch.optim.LBFGS``). ``source`` keeps its meaning: the frame's
``file:line``.

Schema 3 added ``steady_state.step_times_us`` (every steady step's time) and, in a comparison, each
metric's interval and verdict (see :mod:`.comparison`, ``docs/json.md``); a schema-2 file reads
with ``step_times_us`` empty.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from traceinsight.analysis.flops import FlopClass, FlopKernel, Flops, Mfu
from traceinsight.analysis.kernels import Kernel
from traceinsight.analysis.latent import LatentSync
from traceinsight.analysis.memory import AllocatorCall, AllocatorCalls, Memory, MemoryDevice, MemorySample
from traceinsight.analysis.pace import Pace
from traceinsight.analysis.results import (
    COUNT,
    DURATION,
    SHARE,
    CopyGroup,
    Device,
    Host,
    HostOp,
    IdleGap,
    Step,
    SyncCall,
    SyncHotspot,
)
from traceinsight.analysis.timeline import Timeline
from traceinsight.analysis.usage import Usage
from traceinsight.analysis.validity import TraceWarning
from traceinsight.load.tables import STEP_USAGE_KEPT, StepUsage
from traceinsight.load.tables import Device as GpuProperties
from traceinsight.load.taxonomy import ForeignAccelerator
from traceinsight.model import Model, field, replace
from traceinsight.results.frames import result_frames
from traceinsight.results.report import Report, RunContext
from traceinsight.results.stored import from_text
from traceinsight.results.writer import result_json
from traceinsight.rules.findings import Advice, Finding
from traceinsight.shown import figures_of, html_of
from traceinsight.thresholds import Thresholds
from traceinsight.version import __version__

if TYPE_CHECKING:
    import polars as pl
    from matplotlib.figure import Figure

__all__ = [
    "SCHEMA_VERSION",
    "Advice",
    "AllocatorCall",
    "AllocatorCalls",
    "CopyGroup",
    "Details",
    "Device",
    "Finding",
    "FlopClass",
    "FlopKernel",
    "Flops",
    "Host",
    "HostOp",
    "IdleGap",
    "Kernel",
    "KernelTotal",
    "LatentSync",
    "Memory",
    "MemoryDevice",
    "MemorySample",
    "Mfu",
    "Pace",
    "Result",
    "RunContext",
    "Scope",
    "Scopes",
    "SteadyState",
    "Step",
    "StepUsage",
    "SyncCall",
    "SyncHotspot",
    "Timeline",
    "Tool",
    "TraceInfo",
    "TraceWarning",
    "Usage",
    "Utilization",
    "Window",
]

#: The version of every result's JSON (a trace's, a job's, a comparison's).
SCHEMA_VERSION: Final = 3


class Tool(Model, frozen=True, kw_only=True):
    """What wrote the result."""

    name: str = "traceinsight"
    version: str = __version__


class TraceInfo(Model, frozen=True, kw_only=True):
    """The trace: its file, format and run."""

    path: str
    name: str
    #: The trace format's era (``kineto-base-ns``, ``legacy``...).
    era: str
    events: int = field(metadata=COUNT)
    rank: int | None
    world_size: int | None = field(metadata=COUNT)
    backend: str | None
    #: The earliest event on the trace's clock, µs: what every ``start`` counts from. (A float as
    #: written: on a clock since the epoch it is past what µs with 3 decimals hold exactly.)
    origin_us: float
    base_time_ns: int | None = field(metadata={"raw": True})
    cuda_runtime_version: str | None
    cuda_driver_version: str | None
    hip_runtime_version: str | None
    has_gpu_activity: bool
    gpus_listed: int | None
    iterations: int | None
    steps_marked: bool
    #: Each recorded step as the process lived it, from the trace's own record (a trace ``run``
    #: wrote; its first 1,000 steps): what lets a diff of traces alone tell a run starved of CPU.
    #: Empty for other traces. (A ``run`` result's ``run.step_usage`` holds every step.)
    step_usage: tuple[StepUsage, ...] = field(default=(), metadata={"most": STEP_USAGE_KEPT})


class Window(Model, frozen=True):
    """A stretch of time ``[start_us, end_us]`` from the trace's earliest event."""

    JSON_ARRAY: ClassVar[bool] = True
    start_ns: int
    end_ns: int


class SteadyState(Model, frozen=True, kw_only=True):
    """The steps judged, and the time they cover."""

    #: ``ProfilerStep``, ``optimizer`` or ``none``.
    steps_from: str
    step_time_ns: int | None = field(metadata=DURATION)
    host_step_time_ns: int | None = None
    pace: Pace = field(default_factory=Pace)
    steady_steps: int = field(default=0, metadata=COUNT)
    windows_ns: tuple[Window, ...]
    gpu_windows_ns: tuple[Window, ...] = ()
    startup_end_ns: int | None
    startup_evidence: str | None
    #: Every steady step's time, in the trace's order (``step_time_ns`` is their median): what a
    #: diff's interval is drawn from when the trace has no GPU steps (schema 3).
    step_times_ns: tuple[int, ...] = ()
    #: Every steady step's host syncs (waits, as ``sync_hotspots`` count them), in the same
    #: order: what a diff's interval of the syncs per step is drawn from (schema 3; empty in a
    #: file written before it, whose syncs per step are then shown, not judged).
    step_syncs: tuple[int, ...] = ()


class Utilization(Model, frozen=True, kw_only=True):
    """The steady state over every device: the time judged, busy by class, idle by cause."""

    #: What shares are of (``each step``, ``the time analyzed``), null without a steady state on a GPU.
    of: str | None
    window_ns: int | None = field(metadata=DURATION)
    busy_share: float | None = field(metadata=SHARE)
    compute_share: float | None = field(metadata=SHARE)
    communication_share: float | None = field(metadata=SHARE)
    copy_share: float | None = field(metadata=SHARE)
    idle_share: float | None = field(metadata=SHARE)
    #: Idle by cause (:class:`~traceinsight.analysis.causes.CauseKind` values), largest first.
    idle_by_cause_ns: dict[str, int] = field(default_factory=dict, metadata={"check": "id"})


class Scope(Model, frozen=True, kw_only=True):
    """One ``nn.Module`` or region path in the steady state, per step (see
    :mod:`traceinsight.analysis.modules`): times inclusive of the scopes inside it."""

    #: Names from the outermost scope down, joined by ``/`` (``Model_0/Block_3/Linear_0``).
    path: str
    name: str
    depth: int = field(metadata=COUNT)
    #: Calls in the steady state (all steps).
    calls: int = field(metadata=COUNT)
    host_ns: int = field(metadata=DURATION)
    #: Kernel time launched under it, and the idle inside its calls' GPU spans.
    gpu_ns: int = field(metadata=DURATION)
    idle_ns: int = field(metadata=DURATION)
    flops: int = field(metadata=COUNT)
    #: FLOPs over its GPU time (null without GPU time).
    achieved_flops_per_s: float | None
    #: Kernel time and counted FLOPs of the backward operators linked to its forward operators by
    #: autograd's sequence numbers (modules only; inclusive; not in ``gpu_ns``/``flops``).
    backward_gpu_ns: int = field(default=0, metadata=DURATION)
    backward_flops: int = field(default=0, metadata=COUNT)


class Scopes(Model, frozen=True, kw_only=True):
    """GPU time by ``nn.Module`` and by ``record_function`` region, as trees (every path listed,
    parents before children by path order; at most 500 of each)."""

    #: ``step`` (figures per steady step) or ``window`` (totals over the steady window).
    per: str = "window"
    steps: int = field(default=0, metadata=COUNT)
    modules: tuple[Scope, ...] = ()
    regions: tuple[Scope, ...] = ()
    #: Kernel time launched outside every module (backward, optimizer): shown apart.
    outside_modules_gpu_ns: int = field(default=0, metadata=DURATION)
    #: The part of ``outside_modules_gpu_ns`` counted as modules' backward time (``backward_gpu_ns``).
    backward_linked_gpu_ns: int = field(default=0, metadata=DURATION)


class KernelTotal(Model, frozen=True):
    """The summed time of every kernel of one device: what the top kernels' shares are of."""

    device: int
    kernel_ns: int = field(metadata=DURATION)


class Details(Model, frozen=True, kw_only=True):
    """What the terminal summary, the page and the Markdown show beyond the figures above them in
    the JSON: with it a stored result draws all three as the live one did (JSON key ``details``).
    Times from the trace's earliest event."""

    #: The GPUs ``deviceProperties`` lists (name, memory, SMs, architecture).
    gpus: tuple[GpuProperties, ...] = ()
    #: An accelerator traceinsight cannot read (MTIA, Gaudi ...), from the trace's categories.
    foreign_accelerator: ForeignAccelerator | None = None
    #: From the first GPU activity to the last, over every device (None: no GPU activity).
    gpu_span_ns: Window | None = None
    #: The thresholds the analysis ran with.
    thresholds: Thresholds = field(default_factory=Thresholds)
    #: Per device: how the steady state was spent (busy by class, idle by cause), in ns.
    usage: tuple[Usage, ...] = ()
    #: Steps found (``steady_state.steady_steps`` of them steady) and the numbers of those left out.
    steps_found: int = field(default=0, metadata=COUNT)
    steps_left_out: tuple[int, ...] = ()
    #: Requests (``steady_state.steps_from`` ``request``): the range or operator each begins with,
    #: whether it was found from the host's repeating pattern, and the time waiting for work between them.
    request_name: str | None = None
    request_from_pattern: bool = False
    waiting_ns: int = field(default=0, metadata=DURATION)
    #: Every kernel of the trace (``kernels`` holds the top ones): launches, distinct (device,
    #: name) pairs, and the summed time per device.
    kernel_launches: int = field(default=0, metadata=COUNT)
    kernels_distinct: int = field(default=0, metadata=COUNT)
    kernel_totals: tuple[KernelTotal, ...] = ()
    #: Each GPU's activity downsampled for drawing: busy blocks, host syncs, step starts.
    timeline: Timeline | None = None


class Result(Model, frozen=True, kw_only=True):
    """One trace's result: every figure ``analyze`` shows, as ``analyze --json`` writes it.

    :meth:`to_json` is what ``--json`` writes; :meth:`from_json` reads it back (a stored result,
    under the checks of :mod:`.codec`), equal to the result it was written from. An analysis'
    result is made by :func:`.contract.result_of`.
    """

    KIND: ClassVar[str] = "trace"

    schema: int = SCHEMA_VERSION
    tool: Tool = field(default_factory=Tool)
    trace: TraceInfo
    run: RunContext | None = None
    warnings: tuple[TraceWarning, ...] = ()
    steady_state: SteadyState
    utilization: Utilization
    devices: tuple[Device, ...] = ()
    steps: tuple[Step, ...] = ()
    idle_gaps: tuple[IdleGap, ...] = ()
    memcpy: tuple[CopyGroup, ...] = ()
    #: Share of each copy direction's time (``HtoD``, ``DtoH``) overlapped by compute (None: no such copies).
    overlap: dict[str, float | None] = field(default_factory=dict, metadata=SHARE)
    syncs: tuple[SyncCall, ...] = ()
    sync_hotspots: tuple[SyncHotspot, ...] = ()
    #: Empty in a trace with GPU work.
    latent_syncs: tuple[LatentSync, ...] = ()
    findings: tuple[Finding, ...] = ()
    kernels: tuple[Kernel, ...] = ()
    host: Host
    memory: Memory = field(default_factory=Memory)
    flops: Flops = field(default_factory=Flops)
    scopes: Scopes = field(default_factory=Scopes)
    #: What the summary, the page and the Markdown show beyond the figures above (None: a stored
    #: result written before it, which draws none of them).
    details: Details | None = None
    #: The folder the page's code excerpts may be read from (the API's ``source_root``; a command
    #: gives its renderer its own); never written.
    source_root: Path | None = field(default=None, compare=False, repr=False, metadata={"local": True})
    #: The analysis this result was made from (None for a stored result).
    report: Report | None = field(default=None, compare=False, repr=False, metadata={"local": True})
    _cache: dict[str, Any] = field(default_factory=dict, compare=False, repr=False, metadata={"local": True})

    def to_json(self) -> str:
        """The result as ``analyze --json`` writes it (UTF-8 text, keys in contract order)."""
        return result_json(self)

    @classmethod
    def from_json(cls, text: str | bytes) -> Result:
        """A result from its JSON (:meth:`to_json`, or a file ``analyze --json`` wrote), read as
        untrusted input: anything else is one :class:`~traceinsight.errors.TraceFormatError`."""
        return from_text(text, cls)

    @property
    def name(self) -> str:
        """The trace file's name."""
        return self.trace.name

    @property
    def frames(self) -> dict[str, pl.DataFrame]:
        """The result's tables as polars DataFrames (see :mod:`.frames`), made on first use."""
        if "frames" not in self._cache:
            self._cache["frames"] = result_frames(self)
        frames: dict[str, pl.DataFrame] = self._cache["frames"]
        return frames

    @property
    def charts(self) -> dict[str, Figure]:
        """The page's charts as matplotlib Figures (:class:`traceinsight.render.mpl.ChartFigure`:
        drawn from the marks the page's SVG is written from, with its labels and colours; each
        shows itself in a notebook, ``savefig`` writes PNG or PDF, ``.svg`` is the page's markup),
        keyed by name, made on first use (a live result only: a stored one has no timeline to draw).
        matplotlib is imported then, never by ``analyze``."""
        if "charts" not in self._cache:
            self._cache["charts"] = figures_of(self)
        charts: dict[str, Figure] = self._cache["charts"]
        return charts

    def _repr_html_(self) -> str | None:
        return html_of(self)

    def __repr__(self) -> str:
        step = self.steady_state.step_time_ns
        shown = "no steps" if step is None else f"step {step / 1e6:.2f} ms"
        return f"Result({self.trace.name!r}, {shown}, {len(self.findings)} findings)"

    def replace(self, **changes: Any) -> Result:
        """A copy with ``changes`` (:func:`traceinsight.model.replace`; the copy draws its tables afresh)."""
        return replace(self, _cache={}, **changes)
