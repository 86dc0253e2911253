"""``exposed-communication``: communication kernels run while no compute does, a large share of the
step. The card counts the collectives per step and names the per-parameter pattern (hundreds of
small all-reduces or reduce-scatters per step in a training trace); its advice follows what runs:
a process driving several GPUs (``nn.DataParallel``) → DDP, gloo with GPUs → NCCL, per-parameter
collectives → buckets (DDP's ``bucket_cap_mb``, FSDP's wrapping, or DDP instead of a loop of
``dist.all_reduce``), all-to-all and send/recv → asynchronous exchanges, FSDP → prefetching.

From one rank's trace, a collective's time is waiting for the other ranks and the transfer
together: the saving is an upper bound and says so. A job (every rank's trace) splits them and
counts only the transfer (:mod:`traceinsight.job.combine`)."""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.collectives import CollectiveGroup
from traceinsight.formatting import format_duration, format_share
from traceinsight.rules import advice
from traceinsight.rules.common import make_finding, saving_from_total, usage_amount
from traceinsight.rules.findings import Advice, Finding
from traceinsight.rules.registry import rule

_NCCL: Advice = Advice(
    summary="Collectives between GPUs run over gloo here, through host memory. Use the NCCL backend "
    "for GPU tensors: it moves them GPU to GPU.",
    before="dist.init_process_group('gloo')",
    after="dist.init_process_group('nccl')  # gloo for CPU tensors only",
)

#: Collectives that carry gradients: one per parameter is the per-parameter pattern.
_GRADIENT_COLLECTIVES = frozenset({"all-reduce", "reduce-scatter"})


def _counted(analysis: Analysis, count: int, what: str) -> str:
    """``120 all-reduces per step``, or ``120 all-reduces`` without steps."""
    steps = analysis.communication.steps
    number = count / steps if steps else count
    plural = what if round(number) == 1 or what.endswith("recv") else f"{what}s"
    return f"{number:,.0f} {plural}" + (" per step" if steps else "")


def collectives_words(analysis: Analysis, device: int) -> str:
    """``120 all-reduces per step (median 10.0 µs); 1 broadcast per step (median 18.5 µs)``."""
    return "; ".join(
        f"{_counted(analysis, group.count, group.collective)} (median {format_duration(group.median_ns)})"
        for group in analysis.communication.on_device(device)
    )


def per_parameter(analysis: Analysis, device: int) -> CollectiveGroup | None:
    """The gradient collectives of ``device`` when they are the per-parameter pattern: at least
    ``collectives_per_step_many`` per step (in the window without steps), each shorter than
    ``collective_small_us`` at the median, in a training trace."""
    stats, limits = analysis.communication, analysis.thresholds
    if not stats.training:
        return None
    for group in stats.on_device(device):
        many = group.count >= limits.collectives_per_step_many * max(1, stats.steps)
        small = group.median_ns < limits.collective_small_us * 1000
        if group.collective in _GRADIENT_COLLECTIVES and many and small:
            return group
    return None


def communication_advice(analysis: Analysis, device: int) -> Advice:
    """The advice for the communication ``device`` runs (see the module doc)."""
    stats = analysis.communication
    if analysis.multi_gpu_processes > 0:
        return advice.DDP
    if (analysis.meta.backend or "").lower() == "gloo" and analysis.has_gpu:
        return _NCCL
    if per_parameter(analysis, device) is not None:
        if stats.fsdp:
            return advice.PER_PARAMETER_FSDP
        return advice.PER_PARAMETER_DDP if stats.ddp else advice.PER_PARAMETER_LOOP
    groups = stats.on_device(device)
    largest = max(groups, key=lambda group: (group.total_ns, group.collective)) if groups else None
    if largest is not None and largest.collective in {"all-to-all", "send/recv"}:
        return advice.ASYNC_EXCHANGE
    if stats.fsdp:
        return advice.FSDP_OVERLAP
    return advice.COMMUNICATION


@rule("exposed-communication")
def exposed_communication(analysis: Analysis) -> Iterator[Finding]:
    """Communication not overlapped with compute for ``exposed_communication_share`` of the step."""
    limits = analysis.thresholds
    data_parallel = analysis.multi_gpu_processes > 0
    for usage in analysis.usage:
        exposed = usage.communication_ns
        if (
            usage.window_ns < limits.min_span_us * 1000
            or exposed < limits.exposed_communication_share * usage.window_ns
        ):
            continue
        saving = saving_from_total(analysis, exposed, usage.window_ns)
        evidence = [
            (
                "communication with no compute under it",
                usage_amount(usage, exposed),
            ),
            ("compute", usage_amount(usage, usage.compute_ns)),
            ("backend", analysis.meta.backend or "not recorded"),
        ]
        if analysis.communication.on_device(usage.device):
            evidence.append(("collectives", collectives_words(analysis, usage.device)))
        pattern = per_parameter(analysis, usage.device)
        if pattern is not None:
            evidence.append(
                (
                    "the pattern",
                    f"{_counted(analysis, pattern.count, pattern.collective)}, median "
                    f"{format_duration(pattern.median_ns)} each: one per parameter (or tiny buckets), "
                    "each paying the collective's latency and a launch",
                )
            )
        if data_parallel:
            evidence.append(
                ("one process drives several GPUs", "nn.DataParallel: move to DistributedDataParallel")
            )
        title = (
            f"GPU {usage.device} communicates with no compute under it "
            f"{format_share(usage.share(exposed))} of {usage.of_what}"
        )
        if pattern is not None:
            title += (
                f": {_counted(analysis, pattern.count, 'small ' + pattern.collective)}, one per "
                f"parameter (median {format_duration(pattern.median_ns)} each)"
            )
        yield make_finding(
            analysis,
            saving,
            title=title + (" (nn.DataParallel)" if data_parallel else ""),
            evidence=evidence,
            advice=communication_advice(analysis, usage.device),
            why="While a collective runs alone the GPU's compute units wait for the other ranks' data; "
            "work issued to run beside it (the rest of backward for bucketed gradients, the next "
            "batch's compute for an exchange) hides it.",
            note="an upper bound: the communication no compute runs under; one rank's trace cannot tell "
            "waiting for the other ranks from the transfer (analyze every rank's trace together to split them)",
            device=usage.device,
        )
