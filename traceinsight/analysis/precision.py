"""How much GPU time goes to matrix multiplies and convolutions in plain fp32, on GPUs with tensor
cores that would run them several times faster in reduced precision (AMP: fp16/bf16; TF32)."""

from __future__ import annotations

import polars as pl

from traceinsight.analysis.intervals import within
from traceinsight.analysis.shared import gpu_classes
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace
from traceinsight.model import Model

__all__ = ["PrecisionMix", "precision_mix"]


class PrecisionMix(Model, frozen=True):
    """Kernel time by precision family on one device, in the steady state (summed durations)."""

    device: int
    #: ``major.minor`` from ``deviceProperties`` (None when the trace does not say).
    compute_capability: str | None
    kernel_ns: int
    #: fp32 GEMM/convolution kernels running on CUDA cores (:data:`taxonomy.FP32_MATMUL_KERNEL_PATTERN`).
    fp32_matmul_ns: int
    #: Kernels already on tensor cores (TF32, fp16, bf16, fp8 ...).
    tensor_core_ns: int
    #: The fp32 GEMM/convolution kernels with the most time: (name, launches, ns).
    top_fp32: tuple[tuple[str, int, int], ...]
    #: Their correlations, for replaying them on tensor cores.
    fp32_correlations: frozenset[int]

    @property
    def capability(self) -> float | None:
        """The compute capability as a number (7.0, 8.0 ...)."""
        try:
            return float(self.compute_capability) if self.compute_capability else None
        except ValueError:
            return None


def precision_mix(
    trace: Trace, steady: SteadySteps, top: int = 5, classes: pl.DataFrame | None = None
) -> tuple[PrecisionMix, ...]:
    """Per device: fp32 GEMM/convolution vs tensor-core kernel time, kernels starting in the steady
    state (``classes``: :func:`~traceinsight.analysis.shared.gpu_classes`, when the caller has it)."""
    gpu = gpu_classes(trace) if classes is None else classes
    kernels = gpu.filter((pl.col("kind") == "kernel") & pl.col("device").is_not_null())
    if kernels.is_empty():
        return ()
    if steady.windows:
        kernels = kernels.filter(within(kernels.get_column("ts"), steady.device_windows))
    classified = kernels.with_columns(
        fp32=pl.col("fp32_matmul") & ~pl.col("tensor_core"), tensor=pl.col("tensor_core")
    )
    capability = {device.index: device.compute_capability for device in trace.meta.devices}
    result = []
    for (device,), group in sorted(classified.group_by(["device"]), key=lambda item: item[0][0]):
        matmul = group.filter(pl.col("fp32"))
        ranked = (
            matmul.lazy()
            .group_by("name")
            .agg(count=pl.len(), ns=pl.col("dur").sum())
            .sort(["ns", "name"], descending=[True, False])
            .head(top)
            .collect(engine="in-memory")
        )
        result.append(
            PrecisionMix(
                device=int(device),
                compute_capability=capability.get(int(device)),
                kernel_ns=int(group.get_column("dur").sum()),
                fp32_matmul_ns=int(matmul.get_column("dur").sum()),
                tensor_core_ns=int(group.filter(pl.col("tensor")).get_column("dur").sum()),
                top_fp32=tuple((row[0], row[1], row[2]) for row in ranked.iter_rows()),
                fp32_correlations=frozenset(matmul.get_column("correlation").drop_nulls().to_list()),
            )
        )
    return tuple(result)
