"""How the host launches work: kernels per step, how long a kernel runs against how long its launch
takes, which operators' dispatch leaves the GPU waiting, and, per device, the pattern of the gaps
the host's launching leaves (launch-bound loops: many short gaps between many short kernels)."""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.causes import CauseKind
from traceinsight.analysis.intervals import joined_where, meeting, overlap_ns, within
from traceinsight.analysis.sources import enclosing_ops
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace, taxonomy
from traceinsight.model import Model
from traceinsight.thresholds import Thresholds

__all__ = ["CompileState", "LaunchPattern", "LaunchStats", "compile_state", "launch_patterns", "launch_stats"]

#: Host calls that put one kernel in the queue.
_KERNEL_LAUNCHES = ("cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel", "cuLaunchKernelEx", "hipLaunchKernel", "hipExtLaunchKernel", "hipModuleLaunchKernel", "hipExtModuleLaunchKernel")  # fmt: skip


class LaunchPattern(Model, frozen=True):
    """The ``host-bound`` gaps of one device in the steady state, split by length.

    A launch-bound loop leaves many short gaps, each the time the host took to dispatch and launch
    the next kernel (tens of µs, at most ``launch_gap_max_us``); a pause of the host's own (Python,
    I/O, a sleep) leaves a few long ones that a CUDA graph would not remove. ``short_ns +
    long_ns`` is the device's ``host-bound`` idle in the steady state.
    """

    device: int
    #: Gaps shorter than ``launch_gap_max_us``: how many, their idle inside the steady windows,
    #: and the median gap's length.
    short_gaps: int
    short_ns: int
    median_gap_ns: int
    #: Gaps as long or longer: how many, their idle inside the steady windows, the longest.
    long_gaps: int
    long_ns: int
    longest_gap_ns: int
    #: Kernels that started on the device in the steady state, and the median kernel's duration.
    kernels: int
    median_kernel_ns: int

    @property
    def short_share(self) -> float:
        """The short gaps' share of the ``host-bound`` idle (0 without any)."""
        total = self.short_ns + self.long_ns
        return self.short_ns / total if total else 0.0


class CompileState(Model, frozen=True):
    """What in the trace shows ``torch.compile`` (whole trace).

    A kernel is compiled when TorchInductor generated it (``taxonomy.INDUCTOR_KERNEL_PATTERN``) or
    its launch ran inside a compiled region (``taxonomy.COMPILED_REGION_PATTERN``: a compiled graph
    also launches cuBLAS/cuDNN kernels). A model is compiled when at least half its kernels are."""

    #: Kernels in the trace, those TorchInductor generated, and those compiled either way.
    kernels: int = 0
    inductor_kernels: int = 0
    compiled_kernels: int = 0
    #: Host ranges of compiled code (``CompiledFunction``, ``Torch-Compiled Region``, ...).
    compiled_regions: int = 0
    #: CUDA/HIP graph replays (``cudaGraphLaunch``).
    graph_launches: int = 0

    @property
    def compiled(self) -> bool:
        """At least half the kernels are compiled."""
        return self.kernels > 0 and self.compiled_kernels >= 0.5 * self.kernels

    @property
    def partly(self) -> bool:
        """Some kernels are compiled, most are not (a compiled function in an eager model)."""
        return self.compiled_kernels > 0 and not self.compiled

    def words(self) -> str:
        """``120 of 800 kernels compiled (90 TorchInductor's triton_*, 12 compiled regions); no CUDA
        graph replays``."""
        graphs = (
            f"{self.graph_launches:,} CUDA graph replays" if self.graph_launches else "no CUDA graph replays"
        )
        return (
            f"{self.compiled_kernels:,} of {self.kernels:,} kernels compiled ({self.inductor_kernels:,} "
            f"TorchInductor's triton_*, {self.compiled_regions:,} compiled regions ran); {graphs}"
        )


class LaunchStats(Model, frozen=True):
    """Launching in the steady state (all devices)."""

    kernels: int
    #: Kernels per steady step (None without steps).
    kernels_per_step: float | None
    median_kernel_ns: int
    #: Median duration of a kernel launch call on the host.
    median_launch_ns: int
    #: The operators the host was dispatching in launch-overhead gaps: (op, idle ns, gaps).
    dispatching: tuple[tuple[str, int, int], ...]
    #: Per device, the gaps the host's launching left (:class:`LaunchPattern`).
    patterns: tuple[LaunchPattern, ...] = ()
    #: Whether the model runs compiled code, which changes the advice.
    compiled: CompileState = CompileState()


def compile_state(trace: Trace) -> CompileState:
    """Compiled kernels, compiled regions and graph replays in the whole trace (see :class:`CompileState`)."""
    kernels = (
        trace.gpu.select("kind", "correlation", "name")
        .filter(pl.col("kind") == "kernel")
        .select("correlation", inductor=pl.col("name").str.contains(taxonomy.INDUCTOR_KERNEL_PATTERN))
    )
    regions = pl.concat(
        [
            table.filter(pl.col("name").str.contains(taxonomy.COMPILED_REGION_PATTERN)).select(
                "pid", "tid", "ts", "end"
            )
            for table in (trace.cpu_ops, trace.annotations)
        ]
    )
    inside = pl.DataFrame(schema={"correlation": pl.Int64})
    if regions.height and kernels.height:
        launches = meeting(
            trace.runtime.select("pid", "tid", "ts", "end", "correlation").join(
                kernels.select("correlation"), on="correlation", how="semi"
            ),
            "ts",
            "end",
            regions.select("ts", "end").rename({"ts": "start"}),
        )
        inside = (
            launches.join_where(
                regions.rename({"pid": "r_pid", "tid": "r_tid", "ts": "r_ts", "end": "r_end"}),
                pl.col("ts") >= pl.col("r_ts"),
                pl.col("ts") < pl.col("r_end"),
            )
            .filter((pl.col("pid") == pl.col("r_pid")) & (pl.col("tid") == pl.col("r_tid")))
            .select("correlation")
            .unique()
        )
    compiled = kernels.filter(
        pl.col("inductor") | pl.col("correlation").is_in(inside.get_column("correlation").implode())
    )
    return CompileState(
        kernels=kernels.height,
        inductor_kernels=int(kernels.get_column("inductor").sum()),
        compiled_kernels=compiled.height,
        compiled_regions=regions.height,
        graph_launches=int(trace.runtime.get_column("name").is_in(list(taxonomy.GRAPH_LAUNCH_CALLS)).sum()),
    )


def launch_patterns(
    trace: Trace, steady: SteadySteps, gaps: pl.DataFrame, limits: Thresholds
) -> tuple[LaunchPattern, ...]:
    """Per device, the ``host-bound`` gaps (every length) that meet the steady windows, split at
    ``launch_gap_max_us`` (:class:`LaunchPattern`), and the kernels that start inside them.

    A gap's idle is its part inside the windows (as the steady usage counts it); its length, which
    decides short or long, is the whole gap's."""
    if not steady.windows:
        return ()
    # gaps and kernels on the GPU's clock: the steps' device windows
    device_windows = steady.device_windows
    windows = pl.DataFrame(
        {"w_start": [start for start, _ in device_windows], "w_end": [end for _, end in device_windows]},
        schema={"w_start": pl.Int64, "w_end": pl.Int64},
    )
    inside = (
        joined_where(
            gaps.lazy()
            .filter(pl.col("cause_kind") == CauseKind.LAUNCH.value)
            .select("device", "start", "end", "duration")
            .with_row_index("gap"),
            windows.lazy(),
            pl.col("w_start") < pl.col("end"),
            pl.col("w_end") > pl.col("start"),
        )
        .group_by("gap", "device", "duration")
        .agg(ns=overlap_ns("start", "end", "w_start", "w_end").sum())
    )
    max_ns = round(limits.launch_gap_max_us * 1000)
    short = pl.col("duration") < max_ns
    by_gaps = inside.group_by("device").agg(
        short_gaps=short.sum(),
        short_ns=pl.col("ns").filter(short).sum(),
        median_gap_ns=pl.col("duration").filter(short).median(),
        long_gaps=(~short).sum(),
        long_ns=pl.col("ns").filter(~short).sum(),
        longest_gap_ns=pl.col("duration").max(),
    )
    kernels = trace.gpu.select("kind", "device", "ts", "dur").filter(pl.col("kind") == "kernel")
    kernels = kernels.filter(within(kernels.get_column("ts"), device_windows))
    by_kernels = (
        kernels.lazy().group_by("device").agg(kernels=pl.len(), median_kernel_ns=pl.col("dur").median())
    )
    table = (
        by_kernels.join(by_gaps, on="device", how="full", coalesce=True)
        .drop_nulls("device")
        .sort("device")
        .fill_null(0)
        .collect(engine="in-memory")
    )
    return tuple(
        LaunchPattern(
            device=int(row["device"]),
            short_gaps=int(row["short_gaps"]),
            short_ns=int(row["short_ns"]),
            median_gap_ns=round(row["median_gap_ns"]),
            long_gaps=int(row["long_gaps"]),
            long_ns=int(row["long_ns"]),
            longest_gap_ns=int(row["longest_gap_ns"]),
            kernels=int(row["kernels"]),
            median_kernel_ns=round(row["median_kernel_ns"]),
        )
        for row in table.iter_rows(named=True)
    )


def launch_stats(
    trace: Trace, steady: SteadySteps, gaps: pl.DataFrame, limits: Thresholds, top: int = 5
) -> LaunchStats:
    """Kernel and launch-call durations in the steady state, and the innermost operator the
    launching thread was in during each ``host-bound`` gap of at least ``min_gap`` (the gaps table
    has a source for exactly those)."""
    kernels = trace.gpu.select("kind", "ts", "dur").filter(pl.col("kind") == "kernel")
    launches = trace.runtime.select("name", "ts", "dur").filter(pl.col("name").is_in(_KERNEL_LAUNCHES))
    if steady.windows:  # kernels on the GPU's clock, launch calls on the host's
        kernels = kernels.filter(within(kernels.get_column("ts"), steady.device_windows))
        launches = launches.filter(within(launches.get_column("ts"), steady.windows))
    steps = len(steady.steady_steps)
    kernel_median = kernels.get_column("dur").median()
    launch_median = launches.get_column("dur").median()
    launch_gaps = gaps.filter(
        (pl.col("cause_kind") == CauseKind.LAUNCH.value)
        & pl.col("pid").is_not_null()
        & pl.col("cause").str.starts_with("dispatching ")
    )
    if steady.windows and launch_gaps.height:
        launch_gaps = launch_gaps.filter(within(launch_gaps.get_column("start"), steady.device_windows))
    dispatching: tuple[tuple[str, int, int], ...] = ()
    if launch_gaps.height:
        points = launch_gaps.with_row_index("key").select(
            pl.col("key").cast(pl.Int64),
            "pid",
            "tid",
            t=(pl.col("start") + pl.col("end")) // 2,
            duration="duration",
        )
        ops = enclosing_ops(trace, points.drop("duration"))
        ranked = (
            points.lazy()
            .join(ops.lazy(), on="key", how="inner")
            .group_by("innermost")
            .agg(ns=pl.col("duration").sum(), gaps=pl.len())
            .sort(["ns", "innermost"], descending=[True, False])
            .head(top)
            .collect(engine="in-memory")
        )
        dispatching = tuple((row[0], row[1], row[2]) for row in ranked.iter_rows())
    return LaunchStats(
        kernels=kernels.height,
        kernels_per_step=kernels.height / steps if steps else None,
        median_kernel_ns=int(kernel_median) if isinstance(kernel_median, (int, float)) else 0,
        median_launch_ns=int(launch_median) if isinstance(launch_median, (int, float)) else 0,
        dispatching=dispatching,
        patterns=launch_patterns(trace, steady, gaps, limits),
        compiled=compile_state(trace),
    )
