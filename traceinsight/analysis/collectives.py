"""Collectives in the steady state: how many of each kind per step, how long, on which device, and
which data-parallel wrapper issued them (DDP, FSDP, or the user's own ``dist.*`` calls).

Hundreds of small all-reduces per step are the per-parameter pattern (a ``dist.all_reduce`` per
gradient in a loop, or DDP with tiny buckets): each pays NCCL's latency and a launch, where a few
large bucketed ones would overlap backward.
"""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.intervals import within
from traceinsight.analysis.shared import gpu_classes
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model

__all__ = ["CollectiveGroup", "CommunicationStats", "communication_stats"]


class CollectiveGroup(Model, frozen=True):
    """The communication kernels of one kind (``all-reduce``, ...) on one device that started in
    the steady state."""

    device: int
    collective: str
    count: int
    #: Summed and median kernel duration.
    total_ns: int
    median_ns: int


class CommunicationStats(Model, frozen=True):
    """Collectives per device and kind (largest count first), and the wrapper that issued them."""

    groups: tuple[CollectiveGroup, ...] = ()
    #: Steady steps the counts are over (0 without steps: the counts are the steady window's).
    steps: int = 0
    #: ``DistributedDataParallel.*`` / FSDP annotations on the host (``taxonomy.DDP_RANGE_PATTERN``, ...).
    ddp: bool = False
    fsdp: bool = False
    #: A process drives several GPUs with no thread launching a fifth or more of the kernels of
    #: two of them: each GPU's compute comes from a thread of its own (``nn.DataParallel``'s
    #: replicas), not from one thread across them (model parallelism: the main thread's forward).
    data_parallel: bool = False
    #: The trace trains (``Optimizer.step#`` ranges or autograd's backward operators): its
    #: all-reduces may be gradients. Tensor-parallel inference all-reduces activations instead.
    training: bool = False

    def on_device(self, device: int) -> tuple[CollectiveGroup, ...]:
        """The groups of ``device``, largest count first."""
        return tuple(group for group in self.groups if group.device == device)


def _kind() -> pl.Expr:
    """The collective a communication kernel runs, from its name (``taxonomy.COLLECTIVE_KINDS``)."""
    return pl.coalesce(
        *(
            pl.when(pl.col("name").str.contains(pattern)).then(pl.lit(kind))
            for pattern, kind in taxonomy.COLLECTIVE_KINDS
        ),
        pl.lit("other"),
    )


#: A thread spans two GPUs when it launched at least this share of the kernels of each.
_SPANNING_SHARE = 0.2


def _data_parallel(trace: Trace) -> bool:
    """Whether a process drives several GPUs with one thread per GPU (see :class:`CommunicationStats`)."""
    launched = (
        trace.gpu.lazy()
        .select("kind", "correlation", "device")
        .filter(pl.col("kind") == "kernel")
        .select("correlation", "device")
        .join(trace.runtime.lazy().select("correlation", "pid", "tid"), on="correlation", how="inner")
        .group_by("pid", "tid", "device")
        .len()
        .with_columns(share=pl.col("len") / pl.col("len").sum().over("pid", "device"))
        .collect(engine="in-memory")
        .lazy()
    )
    several = launched.group_by("pid").agg(devices=pl.col("device").n_unique()).filter(pl.col("devices") >= 2)
    spanning = (
        launched.filter(pl.col("share") >= _SPANNING_SHARE)
        .group_by("pid", "tid")
        .agg(devices=pl.col("device").n_unique())
        .filter(pl.col("devices") >= 2)
        .select("pid")
        .unique()
    )
    return several.select("pid").join(spanning, on="pid", how="anti").collect(engine="in-memory").height > 0


def communication_stats(
    trace: Trace, steady: SteadySteps, classes: pl.DataFrame | None = None
) -> CommunicationStats:
    """Communication kernels started inside the steady windows, per device and kind (``classes``:
    :func:`~traceinsight.analysis.shared.gpu_classes`, when the caller has it)."""
    gpu = gpu_classes(trace) if classes is None else classes
    kernels = gpu.filter((pl.col("kind") == "kernel") & pl.col("communication")).select(
        "device", "name", "ts", "dur"
    )
    if steady.windows:
        kernels = kernels.filter(within(kernels.get_column("ts"), steady.device_windows))
    groups = (
        kernels.lazy()
        .drop_nulls("device")
        .with_columns(collective=_kind())
        .group_by("device", "collective")
        .agg(count=pl.len(), total_ns=pl.col("dur").sum(), median_ns=pl.col("dur").median())
        .sort(["device", "count", "collective"], descending=[False, True, False])
        .collect(engine="in-memory")
    )
    names = trace.annotations.get_column("name")
    training = bool(names.str.starts_with(taxonomy.OPTIMIZER_STEP_PREFIX).any()) or bool(
        trace.cpu_ops.get_column("name").str.starts_with(taxonomy.BACKWARD_OP_PREFIX).any()
    )
    return CommunicationStats(
        groups=tuple(
            CollectiveGroup(device, collective, count, int(total), round(median))
            for device, collective, count, total, median in groups.iter_rows()
        ),
        steps=len(steady.steady_steps),
        ddp=bool(names.str.contains(taxonomy.DDP_RANGE_PATTERN).any()),
        fsdp=bool(names.str.contains(taxonomy.FSDP_RANGE_PATTERN).any()),
        training=training,
        data_parallel=_data_parallel(trace),
    )
