"""``exposed-communication``: communication kernels run while no compute does, a large share of the
step; a process driving several GPUs (``nn.DataParallel``) gets the advice to move to DDP."""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.formatting import format_share
from traceinsight.rules import advice, rule
from traceinsight.rules.common import make_finding, saving_from_total, usage_amount
from traceinsight.rules.findings import Advice, Finding

_NCCL: Advice = Advice(
    summary="Collectives between GPUs run over gloo here, through host memory. Use the NCCL backend "
    "for GPU tensors: it moves them GPU to GPU.",
    before="dist.init_process_group('gloo')",
    after="dist.init_process_group('nccl')  # gloo for CPU tensors only",
)


@rule("exposed-communication")
def exposed_communication(analysis: Analysis) -> Iterator[Finding]:
    """Communication not overlapped with compute for ``exposed_communication_share`` of the step."""
    limits = analysis.thresholds
    data_parallel = analysis.multi_gpu_processes > 0
    gloo = (analysis.meta.backend or "").lower() == "gloo" and analysis.has_gpu
    for usage in analysis.usage:
        exposed = usage.communication_ns
        if (
            usage.window_ns < limits.min_span_us * 1000
            or exposed < limits.exposed_communication_share * usage.window_ns
        ):
            continue
        saving = saving_from_total(analysis, exposed, usage.window_ns)
        fix_advice = advice.DDP if data_parallel else _NCCL if gloo else advice.COMMUNICATION
        evidence = [
            (
                "communication with no compute under it",
                usage_amount(usage, exposed),
            ),
            ("compute", usage_amount(usage, usage.compute_ns)),
            ("backend", analysis.meta.backend or "not recorded"),
        ]
        if data_parallel:
            evidence.append(
                ("one process drives several GPUs", "nn.DataParallel: move to DistributedDataParallel")
            )
        yield make_finding(
            analysis,
            "exposed-communication",
            saving,
            title=f"GPU {usage.device} communicates with no compute under it "
            f"{format_share(usage.share(exposed))} of {usage.of_what}"
            + (" (nn.DataParallel)" if data_parallel else ""),
            evidence=evidence,
            advice=fix_advice,
            why="While a collective runs alone the GPU's compute units wait for the other ranks' data; "
            "DDP overlaps all-reduces with the rest of backward when gradients come in buckets.",
            note="an upper bound: the communication no compute runs under",
            device=usage.device,
        )
