"""The loaded trace: typed polars tables plus metadata, and the one step every loader ends with.

Every loader turns the ``"ph": "X"`` events it keeps into one frame of :data:`.schema.EVENT_COLUMNS`
(with a ``group`` column naming the table each row goes to); :func:`assemble` splits that frame
into the tables; the ``[memory]`` instant events are each loader's ``memory`` table beside them. Legacy names are mapped here once (2021 ``Kernel``/``Runtime``/``Operator``
categories, annotations recorded as operators, device and stream taken from pid/tid).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import ClassVar, Final

import msgspec
import polars as pl

from traceinsight.load import schema, taxonomy
from traceinsight.load.coerce import as_int, as_version
from traceinsight.load.decode import TraceDocument
from traceinsight.load.text import clean_text, clean_texts
from traceinsight.model import DURATION, Model, field, replace


class Device(Model, frozen=True):
    """A GPU seen in the trace: from ``deviceProperties`` and/or from its activity."""

    index: int
    name: str | None = None
    total_memory_bytes: int | None = None
    compute_capability: str | None = None
    sm_count: int | None = None
    #: True for an AMD GPU (a 64-wide wavefront, or a name that says so): its ``major.minor`` is
    #: its gfx architecture (gfx90a reads 9.0), not a CUDA compute capability.
    amd: bool = False
    #: The index ``deviceProperties`` listed it under, when that differs from the one its activity
    #: uses (one listed device, work on another index: ``HIP_VISIBLE_DEVICES``).
    listed_as: int | None = None

    @property
    def architecture(self) -> str | None:
        """``compute capability 8.0``, or for AMD the gfx architecture (``gfx942 (MI300)``); None
        when the trace does not say."""
        if not self.compute_capability:
            return None
        if not self.amd:
            return f"compute capability {self.compute_capability}"
        return _AMD_ARCHITECTURES.get(
            self.compute_capability, "gfx" + self.compute_capability.replace(".", "")
        )


#: AMD GPUs' ``computeMajor.computeMinor`` (HIP's ``major.minor``) and the gfx architectures behind it.
_AMD_ARCHITECTURES: Final[dict[str, str]] = {
    "9.0": "gfx90a or gfx908 (MI200 or MI100)",
    "9.4": "gfx942 (MI300)",
    "9.5": "gfx950 (MI350)",
    "11.0": "gfx1100 (RDNA 3)",
}


class StepUsage(Model, frozen=True):
    """One step ``traceinsight run`` recorded, as the process lived it: what the trace cannot say
    (wall far above the process's CPU time, with the thread waiting for a CPU, is a step starved of
    CPU). In a result's JSON ``run.step_usage[]``: ``[wall_us, cpu_us, cpu_wait_us, load_1m]``."""

    JSON_ARRAY: ClassVar[bool] = True
    wall_ns: int = field(metadata=DURATION)
    #: The process's CPU time (every thread, user + system) during the step.
    cpu_ns: int = field(metadata=DURATION)
    #: Time the stepping thread waited in the run queue for a CPU (Linux
    #: ``/proc/thread-self/schedstat``); None where not measured.
    cpu_wait_ns: int | None = field(metadata=DURATION)
    #: The machine's 1-minute load average at the step's end (None where not measured).
    load_1m: float | None


class RunProfile(Model, frozen=True):
    """How ``traceinsight run`` recorded a trace (its top-level ``traceinsight`` object)."""

    stacks: str | None
    """``--stacks``: ``user`` (its own frame tracer), ``all`` (torch's) or ``none``."""
    step_marks: str | None
    """What ended steps: ``optimizer``, ``explicit`` (``traceinsight.step()``), ``backward``, or
    ``none`` (no step was marked: the whole run is one window)."""
    unprofiled_step_ns: int | None
    """The median duration of the steps that ran just before the recorded window, unrecorded (to
    tell what recording cost the recorded steps); None when no such step ran."""
    unprofiled_steps: int | None
    """How many steps that median is of."""
    unprofiled_each_ns: tuple[int, ...] = ()
    """``unprofiledStepsNs``: each step that ran unrecorded before the window, in order (the first
    ones are often start-up); empty in traces before it."""
    after_window_ns: tuple[int, ...] = ()
    """Each step that ran unrecorded after the window, in order (the first one also wrote the
    trace). Never in the file, which is written before they run: ``run`` adds them to its own
    report (:class:`traceinsight.results.RunContext`)."""
    loader_fetch: str | None = None
    """``range only`` (:data:`~traceinsight.load.taxonomy.LOADER_FETCH_RANGE_ONLY`) when each
    DataLoader fetch was recorded as its range, without the operators inside it; None when they
    were recorded (traces before it, other profilers)."""
    last_step_cut: bool = False
    """``cutShort``: the memory budget stopped the window inside its last step, which the trace
    holds only part of (a figure "per step" over it would be over part of one)."""
    step_usage: tuple[StepUsage, ...] = ()
    """``stepUsage``: each recorded step as the process lived it (its first 1,000), what lets a
    diff of traces alone tell a run starved of CPU; empty in traces before it."""


class TraceMeta(Model, frozen=True):
    """Facts about the trace as a whole."""

    path: str
    event_count: int
    devices: tuple[Device, ...]
    rank: int
    world_size: int | None
    backend: str | None
    base_time_ns: int | None
    #: The earliest timestamp of any timed event (ns, trace clock): the report's time zero.
    origin_ns: int
    schema_version: int | None
    trace_name: str | None
    cuda_runtime_version: str | None
    cuda_driver_version: str | None
    hip_runtime_version: str | None
    era: str  # "array-2020", "legacy-2021", "kineto" (int µs), "kineto-float", "kineto-base-ns"
    #: How many GPUs ``deviceProperties`` lists (0: the run saw no GPU at all; None: not recorded).
    gpus_listed: int | None
    categories: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    #: What loading had to do to the file, as (kind, count) pairs, reported as warnings:
    #: ``dropped-time`` (events dropped for impossible times), ``repaired-name`` (torch's malformed
    #: ``python_function`` names repaired or dropped). Empty for a clean file.
    load_notes: tuple[tuple[str, int], ...] = field(default_factory=tuple)
    #: Set when ``traceinsight run`` wrote the trace: how it recorded it.
    recorded_by_run: RunProfile | None = None

    @property
    def foreign_accelerator(self) -> taxonomy.ForeignAccelerator | None:
        """Activity of an accelerator traceinsight cannot read (MTIA, Gaudi, ...), from the
        trace's categories (:func:`.taxonomy.foreign_accelerator`); None for CUDA/ROCm or CPU."""
        return taxonomy.foreign_accelerator(self.categories)

    @property
    def gpus_unprofiled(self) -> str | None:
        """For a trace without GPU activity: the GPUs ``deviceProperties`` lists, in words ("1 GPU",
        "8 GPUs"), when it lists any: the run had GPUs and the profiler was not asked to record their
        activity (``ProfilerActivity.CUDA`` left out). None when it lists none or is absent."""
        return gpus_in_words(self.gpus_listed)


def gpus_in_words(listed: int | None) -> str | None:
    """``listed`` GPUs in words ("1 GPU", "8 GPUs"); None for none or not recorded."""
    if not listed:
        return None
    return f"{listed} GPU{'s' if listed > 1 else ''}"


# tables compare as frames, not as a bool: by identity
class Trace(Model, frozen=True, eq=False):
    """A loaded trace: one polars table per kind of event (schemas in :mod:`schema`)."""

    meta: TraceMeta
    gpu: pl.DataFrame
    runtime: pl.DataFrame
    cpu_ops: pl.DataFrame
    python: pl.DataFrame
    annotations: pl.DataFrame
    gpu_annotations: pl.DataFrame
    cuda_sync: pl.DataFrame
    memory: pl.DataFrame

    @property
    def has_gpu_activity(self) -> bool:
        """True when the trace holds at least one kernel, copy or memset."""
        return self.gpu.height > 0


# --- from kept events to tables -----------------------------------------------------------------

#: The groups of tables events are routed to ("ops" splits into cpu_ops and annotations by name).
GROUPS: Final = ("gpu", "runtime", "ops", "python", "gpu_annotations", "cuda_sync")
#: ``cat`` → the index in :data:`GROUPS` of its events' group (absent: the event is in no table).
GROUP_OF_CATEGORY: Final[dict[str, int]] = {
    **{cat: 0 for cat in taxonomy.GPU_ACTIVITY_CATEGORIES},
    **{cat: 1 for cat in taxonomy.RUNTIME_CATEGORIES},
    **{cat: 2 for cat in taxonomy.CPU_OP_CATEGORIES | taxonomy.ANNOTATION_CATEGORIES},
    **{cat: 3 for cat in taxonomy.PYTHON_CATEGORIES},
    **{cat: 4 for cat in taxonomy.GPU_ANNOTATION_CATEGORIES},
    **{cat: 5 for cat in taxonomy.CUDA_SYNC_CATEGORIES},
}

#: The tables each group's events go to.
GROUP_TABLES: Final[dict[str, tuple[str, ...]]] = {
    "gpu": ("gpu",),
    "runtime": ("runtime",),
    "ops": ("cpu_ops", "annotations"),
    "python": ("python",),
    "gpu_annotations": ("gpu_annotations",),
    "cuda_sync": ("cuda_sync",),
}
#: Event columns a table column is taken from where its own is missing (see :func:`assemble`).
_STAND_INS: Final = {"device": "pid", "stream": "tid"}


def group_columns(group: str) -> tuple[str, ...]:
    """The event columns the tables of ``group`` read: what a loader builds for its events (the
    others may be left out of the group's frame)."""
    needed = {"cat", "name", "ts", "dur", "end"}
    for table in GROUP_TABLES[group]:
        for column in schema.TABLES[table]:
            needed |= {column, _STAND_INS.get(column, column)} & set(schema.EVENT_COLUMNS)
    return tuple(column for column in schema.EVENT_COLUMNS if column in needed)


_EMPTY_TABLES: Final = {
    name: pl.DataFrame(schema=table_schema) for name, table_schema in schema.TABLES.items()
}
#: The frame of a group without events (:func:`assemble` takes one frame per group).
NO_EVENTS: Final = pl.DataFrame(schema=schema.EVENT_COLUMNS)


# tables compare as frames, not as a bool: by identity
class ChunkTables(msgspec.Struct, eq=False):
    """The tables of a run of consecutive events, plus what :class:`TraceMeta` needs from them."""

    tables: dict[str, pl.DataFrame]
    #: Event objects read (elements of the events array that are objects).
    event_count: int
    #: Events per (cleaned) category in first-seen order (non-string categories count as "").
    categories: dict[str, int] = msgspec.field(default_factory=dict)
    origin: int | None = None
    legacy: bool = False
    float_time: bool = False
    #: ``"ph": "X"`` events dropped because their ``ts`` is not a time (missing, not a number,
    #: NaN or infinite, beyond year 2262).
    dropped_time: int = 0
    #: Elements of the events array that are not objects (skipped).
    skipped: int = 0


def empty_chunk(event_count: int, categories: dict[str, int], skipped: int = 0) -> ChunkTables:
    """A chunk that adds no rows."""
    return ChunkTables(_EMPTY_TABLES, event_count, categories, skipped=skipped)


def _select(frame: pl.DataFrame, table_schema: pl.Schema, **columns: pl.Expr) -> pl.DataFrame:
    if columns:
        frame = frame.with_columns(**columns)
    return frame.select([pl.col(n).cast(t) for n, t in table_schema.items()])


def assemble(frames: dict[str, pl.DataFrame]) -> tuple[dict[str, pl.DataFrame], bool]:
    """One frame of kept X events per group (at least its :func:`group_columns`) → the loader's
    tables in file order, and whether GPU categories are the 2021 capitalised ones."""
    cat, name = pl.col("cat"), pl.col("name")
    legacy_annotation = cat.is_in(list(taxonomy.CPU_OP_CATEGORIES)) & pl.any_horizontal(
        [name.str.starts_with(prefix) for prefix in taxonomy.LEGACY_ANNOTATION_PREFIXES]
    )
    ops = frames["ops"].with_columns(
        annotation=legacy_annotation | cat.is_in(list(taxonomy.ANNOTATION_CATEGORIES))
    )
    gpu = frames["gpu"]
    tables = {
        "gpu": _select(
            gpu,
            schema.GPU_ACTIVITY,
            kind=cat.replace_strict(taxonomy.GPU_ACTIVITY_CATEGORIES, default=None, return_dtype=pl.String),
            device=pl.coalesce("device", "pid"),
            stream=pl.coalesce("stream", "tid"),
        ),
        "runtime": _select(frames["runtime"], schema.RUNTIME_CALLS),
        "cpu_ops": _select(ops.filter(~pl.col("annotation")), schema.CPU_OPS),
        "python": _select(frames["python"], schema.PYTHON_FRAMES),
        "annotations": _select(ops.filter(pl.col("annotation")), schema.ANNOTATIONS),
        "gpu_annotations": _select(
            frames["gpu_annotations"], schema.GPU_ANNOTATIONS, device=pl.col("pid"), stream=pl.col("tid")
        ),
        "cuda_sync": _select(frames["cuda_sync"], schema.CUDA_SYNC, device=pl.coalesce("device", "pid")),
    }
    legacy = bool(gpu.height and gpu.get_column("cat").str.slice(0, 1).is_in(["K", "M"]).any())
    return tables, legacy


def clean_categories(counts: Iterable[tuple[str, int]]) -> dict[str, int]:
    """Category counts keyed by the raw strings, in first-seen order → keyed by the cleaned ones
    (two raw categories may clean to one), still in first-seen order."""
    pairs = list(counts)
    keys = clean_texts(pl.Series([key for key, _ in pairs], dtype=pl.String)).to_list()
    merged: dict[str, int] = {}
    for key, (_, count) in zip(keys, pairs, strict=True):
        merged[key] = merged.get(key, 0) + count
    return merged


def merge(parts: Sequence[ChunkTables]) -> ChunkTables:
    """Chunks in file order → one :class:`ChunkTables` (tables concatenated, counts summed).

    Each table is copied into one contiguous chunk, and the parts' frames of it are let go as soon
    as it is (the parts are emptied): the copy costs at most one table's memory at a time. Left in
    one chunk per block, the tables made polars' work superlinear in the trace's size: a sort by
    several columns of a 2 GB trace's 60-chunk operator table took 1.5 s of CPU, 0.2 s in one chunk.
    """
    categories: dict[str, int] = {}
    for part in parts:
        for key, count in part.categories.items():
            categories[key] = categories.get(key, 0) + count
    origins = [p.origin for p in parts if p.origin is not None]
    pieces = {name: [p.tables[name] for p in parts if p.tables[name].height] for name in schema.TABLES}
    for part in parts:
        part.tables = {}  # a new dict: parts without events share one (``_EMPTY_TABLES``)
    tables: dict[str, pl.DataFrame] = {}
    for name, table_schema in schema.TABLES.items():
        frames = pieces.pop(name)
        tables[name] = (
            pl.concat(frames, how="vertical", rechunk=True) if frames else pl.DataFrame(schema=table_schema)
        )
        del frames
    return ChunkTables(
        tables=tables,
        event_count=sum(p.event_count for p in parts),
        categories=categories,
        origin=min(origins) if origins else None,
        legacy=any(p.legacy for p in parts),
        float_time=any(p.float_time for p in parts),
        dropped_time=sum(p.dropped_time for p in parts),
        skipped=sum(p.skipped for p in parts),
    )


# --- metadata -----------------------------------------------------------------------------------


def _text(value: object) -> str | None:
    return clean_text(value) if isinstance(value, str) else None


def _devices(document: TraceDocument, gpu: pl.DataFrame) -> tuple[Device, ...]:
    known: dict[int, Device] = {}
    for props in document.deviceProperties or ():
        index = as_int(props.id)
        if index is None:
            continue
        major, minor = as_int(props.computeMajor), as_int(props.computeMinor)
        name = _text(props.name) if props.name else None
        known[index] = Device(
            index=index,
            name=name,
            total_memory_bytes=as_int(props.totalGlobalMem),
            compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
            sm_count=as_int(props.numSms),
            amd=as_int(props.warpSize) == 64
            or any(word in (name or "") for word in ("AMD", "Instinct", "Radeon")),
        )
    active: list[int] = gpu.get_column("device").drop_nulls().unique().sort().to_list()
    if len(known) == 1 and len(active) == 1 and active[0] not in known:
        # One device listed, the work on another index (the process saw one GPU, numbered 0; its
        # activity carries the machine's index): it is that GPU.
        (only,) = known.values()
        return (replace(only, index=active[0], listed_as=only.index),)
    # Only devices with activity are reported; deviceProperties lists every visible GPU.
    return tuple(known.get(index, Device(index=index)) for index in active)


def trace_for(path: Path, document: TraceDocument, part: ChunkTables) -> Trace:
    """The :class:`Trace` of a loaded file: its tables and the metadata from the document and them."""
    dist = document.distributedInfo
    base = as_int(document.baseTimeNanoseconds)
    if document.bare_array:
        era = "array-2020"
    elif part.legacy:
        era = "legacy-2021"
    elif base is not None and part.float_time:
        era = "kineto-base-ns"
    elif part.float_time:
        era = "kineto-float"
    else:
        era = "kineto"
    meta = TraceMeta(
        path=clean_text(str(path)),
        event_count=part.event_count,
        devices=_devices(document, part.tables["gpu"]),
        rank=(as_int(dist.rank) if dist is not None else None) or 0,
        world_size=as_int(dist.world_size) if dist is not None else None,
        backend=_text(dist.backend) if dist is not None else None,
        base_time_ns=base,
        origin_ns=part.origin or 0,
        schema_version=as_int(document.schemaVersion),
        trace_name=_text(document.traceName),
        cuda_runtime_version=_text(as_version(document.cuda_runtime_version)),
        cuda_driver_version=_text(as_version(document.cuda_driver_version)),
        hip_runtime_version=_text(as_version(document.hip_runtime_version)),
        era=era,
        gpus_listed=None if document.deviceProperties is None else len(document.deviceProperties),
        categories=tuple(sorted(part.categories.items(), key=lambda item: -item[1])),
        load_notes=(("dropped-time", part.dropped_time),) if part.dropped_time else (),
        recorded_by_run=_run_profile(document),
    )
    return Trace(meta=meta, **part.tables)


#: Step durations read from a run record at most (``run`` writes 8).
_RUN_STEPS_READ = 64


def _durations(value: object) -> tuple[int, ...]:
    """A run record's list of step durations (ns): the positive ints of a list, at most
    :data:`_RUN_STEPS_READ`; anything else reads as none."""
    if not isinstance(value, list):
        return ()
    kept = (as_int(item) if isinstance(item, int) else None for item in value[:_RUN_STEPS_READ])
    return tuple(item for item in kept if item is not None and item > 0)


def _run_profile(document: TraceDocument) -> RunProfile | None:
    record = document.traceinsight
    if record is None:
        return None
    return RunProfile(
        stacks=_text(record.stacks),
        step_marks=_text(record.stepMarks),
        unprofiled_step_ns=as_int(record.unprofiledStepNs),
        unprofiled_steps=as_int(record.unprofiledSteps),
        unprofiled_each_ns=_durations(record.unprofiledStepsNs),
        loader_fetch=_text(record.loaderFetch),
        last_step_cut=record.cutShort == 1,  # true (0/1 once read as a scalar)
        step_usage=_step_usage(record.stepUsage),
    )


#: Steps of a run record's ``stepUsage`` ``run`` writes and a trace's reader reads (the first ones).
STEP_USAGE_KEPT: Final = 1_000
_MAX_NS: Final = 1 << 62


def _step_usage(value: object) -> tuple[StepUsage, ...]:
    """A run record's ``stepUsage`` (the file's value as parsed, by either loader): of its first
    :data:`STEP_USAGE_KEPT` entries, those that are a step as :class:`StepUsage` holds it, the
    first four items of a list (a later field may follow): a wall time above 0, a CPU time of at
    least 0 and a wait from 0 to the wall time, in integer ns, a finite load of at least 0; the
    wait and the load may be null. Anything else (a boolean, a string, a float time, a list
    inside) is left out."""
    if not isinstance(value, list):
        return ()
    usage = []
    for item in value[:STEP_USAGE_KEPT]:
        if not isinstance(item, list) or len(item) < 4:
            continue
        wall, cpu, waited, load = item[:4]
        if type(wall) is not int or type(cpu) is not int or not (0 < wall < _MAX_NS and 0 <= cpu < _MAX_NS):
            continue
        if waited is not None and (type(waited) is not int or not 0 <= waited <= wall):
            continue
        if load is not None and (type(load) not in (int, float) or not 0 <= load < 1e6):
            continue
        usage.append(StepUsage(wall, cpu, waited, None if load is None else float(load) + 0.0))  # -0.0: 0.0
    return tuple(usage)
