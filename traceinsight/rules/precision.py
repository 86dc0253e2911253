"""``amp-opportunity`` / ``tf32-opportunity``: matrix multiplies and convolutions in plain fp32 on a
GPU with tensor cores. Compute capability 7.x (Volta, Turing): autocast (fp16/bf16). 8.0 and
newer: TF32 first (one line), autocast for more. One finding per device, for the one fix."""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.replay import Fix
from traceinsight.formatting import format_share, short_kernel_name
from traceinsight.rules import advice, rule
from traceinsight.rules.common import make_finding, per_step, saving_of
from traceinsight.rules.findings import Finding


def launches(analysis: Analysis, count: int) -> str:
    """``4.8 launches per step`` where there are steps, else ``24 launches``."""
    steps = len(analysis.steady.steady_steps)
    return f"{count / steps:,.3g} launches per step" if steps else f"{count:,} launches"


def _precision_findings(analysis: Analysis, rule_id: str, tf32: bool) -> Iterator[Finding]:
    limits = analysis.thresholds
    for mix in analysis.precision:
        capability = mix.capability
        if capability is None or capability < 7.0 or (capability >= 8.0) != tf32:
            continue
        share = mix.fp32_matmul_ns / mix.kernel_ns if mix.kernel_ns else 0.0
        if share < limits.fp32_matmul_share:
            continue
        speedup = limits.tensor_core_speedup
        saving = saving_of(analysis, Fix(faster=mix.fp32_correlations, speedup=speedup))
        what = "TF32" if tf32 else "fp16/bf16 (autocast)"
        yield make_finding(
            analysis,
            rule_id,
            saving,
            title=f"{format_share(share)} of GPU {mix.device}'s kernel time is fp32 matrix multiplies and "
            f"convolutions on CUDA cores: its tensor cores (compute capability {mix.compute_capability}) "
            f"would run them in {what}",
            evidence=(
                (
                    "fp32 GEMM/convolution kernels",
                    f"{per_step(analysis, mix.fp32_matmul_ns)} of {per_step(analysis, mix.kernel_ns)} "
                    f"({format_share(share)})",
                ),
                ("already on tensor cores", per_step(analysis, mix.tensor_core_ns)),
                ("compute capability", mix.compute_capability or "not recorded"),
                *(
                    (
                        f"kernel {index}",
                        f"{short_kernel_name(name, 80)}: {launches(analysis, count)}, {per_step(analysis, ns)}",
                    )
                    for index, (name, count, ns) in enumerate(mix.top_fp32, 1)
                ),
            ),
            advice=advice.TF32 if tf32 else advice.AMP,
            why="Plain fp32 GEMMs and convolutions run on the CUDA cores; tensor cores do the same "
            f"work several times faster in {what}, which training tolerates.",
            note=f"replayed with these kernels {speedup:g}× faster (tensor cores are 2-8× faster; "
            "the cautious end)",
            device=mix.device,
        )


@rule("amp-opportunity")
def amp_opportunity(analysis: Analysis) -> Iterator[Finding]:
    """fp32 GEMM/conv kernels on a compute capability 7.x GPU: autocast to fp16/bf16."""
    yield from _precision_findings(analysis, "amp-opportunity", tf32=False)


@rule("tf32-opportunity")
def tf32_opportunity(analysis: Analysis) -> Iterator[Finding]:
    """fp32 GEMM/conv kernels on a compute capability 8.0+ GPU: allow TF32."""
    yield from _precision_findings(analysis, "tf32-opportunity", tf32=True)
