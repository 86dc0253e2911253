"""``optimizer-not-fused``: ``optimizer.step()`` as a per-parameter loop of small kernels, and
``zero_grad()`` writing zeros into every gradient."""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.replay import Fix
from traceinsight.formatting import format_duration
from traceinsight.rules import advice, rule
from traceinsight.rules.common import make_finding, saving_from_total, saving_of
from traceinsight.rules.findings import Finding


@rule("optimizer-not-fused")
def optimizer_not_fused(analysis: Analysis) -> Iterator[Finding]:
    """Many small kernels per optimizer step, none multi-tensor; many zeroing kernels per zero_grad."""
    limits = analysis.thresholds
    stats = analysis.optimizer
    name = stats.optimizer or "the optimizer"
    if (
        stats.steps
        and not stats.multi_tensor
        and stats.kernels / stats.steps >= limits.optimizer_kernels_per_step
    ):
        per_step = stats.kernels / stats.steps
        # A fused step is a few launches: replayed with each step's host time cut to its kernels'
        # GPU time (the host keeping pace with them), its launches spread over that.
        fix = Fix(shorten=tuple((start, end, min(end - start, ns)) for start, end, ns in stats.ranges))
        saving = saving_of(analysis, fix)
        yield make_finding(
            analysis,
            "optimizer-not-fused",
            saving,
            title=f"{name}.step() launches {per_step:,.0f} small kernels per step, one parameter at a time "
            f"(median {format_duration(stats.median_kernel_ns)})",
            evidence=(
                ("optimizer steps in the steady state", str(stats.steps)),
                ("kernels launched inside them", f"{stats.kernels:,} ({per_step:,.0f} per step)"),
                ("median kernel", format_duration(stats.median_kernel_ns)),
                (
                    "host time in optimizer.step()",
                    f"{format_duration(stats.step_ns)} ({format_duration(round(stats.step_ns / stats.steps))} per step)",
                ),
                ("multi-tensor (foreach/fused) kernels", "none"),
            ),
            advice=advice.fused_optimizer(stats.optimizer),
            why="Each parameter's update is a few tiny kernels, each a launch: the host spends the "
            "step launching while the GPU has almost nothing to do.",
            note="replayed with each optimizer step's host time cut to its kernels' GPU time (a fused "
            "step is a few launches: the host then keeps pace with them)",
        )
    if stats.zero_grads and stats.zeroing / stats.zero_grads >= limits.zero_grad_kernels:
        per_call = stats.zeroing / stats.zero_grads
        yield make_finding(
            analysis,
            "optimizer-not-fused",
            saving_from_total(analysis, 0),
            title=f"zero_grad() writes zeros into every gradient: {per_call:,.0f} kernels per call",
            evidence=(
                ("zero_grad calls", str(stats.zero_grads)),
                ("zeroing kernels", f"{stats.zeroing:,} ({per_call:,.0f} per call)"),
            ),
            advice=advice.SET_TO_NONE,
            why="Each gradient's zeroing is a memset kernel and a launch; set to None, the next "
            "backward writes the gradient fresh instead.",
        ).with_(saving_known=False)
