"""Dense peak FLOP/s per GPU model and data type, for MFU: named data, one row per model.

Every figure is the vendor's datasheet peak **without** 2:4 structured sparsity (datasheets print
the sparse figure with an asterisk; the dense one is half of it), at the boost clock, per GPU.
``fp32`` is the plain (CUDA-core / vector) rate; ``tf32`` the tensor-core rate for fp32 inputs;
``fp16`` and ``bf16`` the tensor-core rates with fp32 accumulation (what PyTorch's GEMMs use; GeForce
cards run half the fp16-accumulate rate there); ``fp8`` likewise. A data type a GPU has no tensor
cores for is absent: MFU is then not given for work in it.

A GPU is matched by its ``deviceProperties`` name (:func:`peak_for`), first pattern first (the
PCIe and NVL cards before the SXM ones their names contain). AMD traces often name the GPU
"AMD Radeon Graphics": no model, no peak.
"""

from __future__ import annotations

import re
from typing import Final

from traceinsight.model import Model

__all__ = ["DTYPES", "PEAKS", "GpuPeak", "peak_for"]

#: The data types a peak is given for.
DTYPES: Final = ("fp32", "tf32", "fp16", "bf16", "fp8")

T: Final = 10**12


class GpuPeak(Model, frozen=True):
    """One GPU model's dense peaks."""

    model: str
    """The model's name as the report prints it (``H100 SXM``)."""
    pattern: str
    """A case-insensitive regular expression matched against ``deviceProperties`` names."""
    flops_per_s: tuple[tuple[str, int], ...]
    """(data type, dense peak FLOP/s) pairs."""
    source: str
    """Where the figures come from."""

    def peak(self, dtype: str) -> int | None:
        """The dense peak FLOP/s for ``dtype`` (None: not given for this GPU)."""
        return dict(self.flops_per_s).get(dtype)


def _peaks(
    fp32: float, tf32: float | None, half: float | None, bf16: float | None, fp8: float | None
) -> tuple[tuple[str, int], ...]:
    pairs = (("fp32", fp32), ("tf32", tf32), ("fp16", half), ("bf16", bf16), ("fp8", fp8))
    return tuple((dtype, round(value * T)) for dtype, value in pairs if value is not None)


#: The table (TFLOP/s dense; sources in each row).
PEAKS: Final[tuple[GpuPeak, ...]] = (
    # NVIDIA GH200 Grace Hopper Superchip datasheet (H100 SXM figures; sparse 989/1979/3958 halved).
    GpuPeak("GH200", r"GH200", _peaks(67, 494.5, 989.5, 989.5, 1979), "NVIDIA GH200 datasheet"),
    # NVIDIA H200 datasheet, NVL column (sparse 835/1671/3341 halved).
    GpuPeak("H200 NVL", r"H200 NVL", _peaks(60, 417.5, 835.5, 835.5, 1670.5), "NVIDIA H200 datasheet, NVL"),
    # NVIDIA H200 datasheet, SXM column (sparse 989/1979/3958 halved).
    GpuPeak("H200 SXM", r"H200", _peaks(67, 494.5, 989.5, 989.5, 1979), "NVIDIA H200 datasheet, SXM"),
    # NVIDIA H100 datasheet, PCIe column (sparse 756/1513/3026 halved).
    GpuPeak("H100 PCIe", r"H100.*PCIe", _peaks(51, 378, 756.5, 756.5, 1513), "NVIDIA H100 datasheet, PCIe"),
    # NVIDIA H100 datasheet, NVL column (sparse 835/1671/3341 halved).
    GpuPeak("H100 NVL", r"H100 NVL", _peaks(60, 417.5, 835.5, 835.5, 1670.5), "NVIDIA H100 datasheet, NVL"),
    # NVIDIA H100 datasheet, SXM column (sparse 989/1979/3958 halved); "H100 80GB HBM3" is the SXM5.
    GpuPeak("H100 SXM", r"H100", _peaks(67, 494.5, 989.5, 989.5, 1979), "NVIDIA H100 datasheet, SXM"),
    # NVIDIA HGX B200 specifications, per GPU (sparse TF32 2.2 / BF16 4.5 / FP8 9 PFLOP/s halved).
    GpuPeak("B200", r"B200", _peaks(75, 1100, 2250, 2250, 4500), "NVIDIA HGX B200 datasheet"),
    # NVIDIA A100 datasheet, PCIe column (the same peaks as SXM, lower sustained clocks).
    GpuPeak("A100 PCIe", r"A100.*PCIE", _peaks(19.5, 156, 312, 312, None), "NVIDIA A100 datasheet, PCIe"),
    # NVIDIA A100 datasheet, SXM column; PG509 is the SXM4 board.
    GpuPeak("A100 SXM", r"A100", _peaks(19.5, 156, 312, 312, None), "NVIDIA A100 datasheet, SXM"),
    # NVIDIA V100 datasheet, PCIe column (no tf32/bf16 tensor cores).
    GpuPeak("V100 PCIe", r"V100.*PCIE", _peaks(14, None, 112, None, None), "NVIDIA V100 datasheet, PCIe"),
    # NVIDIA V100 datasheet, SXM2 column (DGXS: the DGX Station's SXM2 parts).
    GpuPeak("V100 SXM2", r"V100", _peaks(15.7, None, 125, None, None), "NVIDIA V100 datasheet, SXM2"),
    # NVIDIA L4 datasheet (sparse 120/242/485 halved).
    GpuPeak("L4", r"\bL4\b", _peaks(30.3, 60, 121, 121, 242.5), "NVIDIA L4 datasheet"),
    # NVIDIA T4 datasheet (fp16 mixed precision; no tf32/bf16).
    GpuPeak("T4", r"\bT4\b", _peaks(8.1, None, 65, None, None), "NVIDIA T4 datasheet"),
    # NVIDIA Ada Lovelace architecture whitepaper, RTX 4090 (fp32 accumulate, dense).
    GpuPeak(
        "RTX 4090",
        r"RTX 4090",
        _peaks(82.6, 82.6, 165.2, 165.2, 330.3),
        "NVIDIA Ada GPU architecture whitepaper",
    ),
    # Same whitepaper, RTX 4080.
    GpuPeak(
        "RTX 4080",
        r"RTX 4080",
        _peaks(48.7, 48.7, 97.5, 97.5, 194.9),
        "NVIDIA Ada GPU architecture whitepaper",
    ),
    # NVIDIA Ampere GA102 whitepaper, RTX 3090 (fp32 accumulate, dense).
    GpuPeak(
        "RTX 3090",
        r"RTX 3090",
        _peaks(35.6, 35.6, 71, 71, None),
        "NVIDIA Ampere GA102 GPU architecture whitepaper",
    ),
    # Same whitepaper, RTX 3080.
    GpuPeak(
        "RTX 3080",
        r"RTX 3080",
        _peaks(29.8, 29.8, 59.5, 59.5, None),
        "NVIDIA Ampere GA102 GPU architecture whitepaper",
    ),
    # AMD Instinct MI300X datasheet (matrix; sparse figures not used).
    GpuPeak(
        "MI300X", r"MI300X", _peaks(163.4, 653.7, 1307.4, 1307.4, 2614.9), "AMD Instinct MI300X datasheet"
    ),
    # AMD Instinct MI250X datasheet (fp32 matrix; no tf32/fp8).
    GpuPeak("MI250X", r"MI250X", _peaks(95.7, None, 383, 383, None), "AMD Instinct MI250X datasheet"),
    # AMD Instinct MI250 datasheet.
    GpuPeak("MI250", r"MI250", _peaks(90.5, None, 362.1, 362.1, None), "AMD Instinct MI250 datasheet"),
    # AMD Instinct MI210 datasheet.
    GpuPeak("MI210", r"MI210", _peaks(45.3, None, 181, 181, None), "AMD Instinct MI210 datasheet"),
)


def peak_for(device_name: str | None) -> GpuPeak | None:
    """The table's row for a ``deviceProperties`` name (None: not named, or not in the table).

    Each pattern is compiled when first tried (``re``'s own cache), not all 21 at import: a trace
    names one or two devices, and the first row that matches ends the search."""
    if not device_name:
        return None
    return next((row for row in PEAKS if re.search(row.pattern, device_name, re.IGNORECASE)), None)
