"""``pipeline-bubble``: a GPU waits for another GPU driven by the same process (naive model
parallelism: the model split across GPUs, each batch passing the stages one after the other;
with ``nn.DataParallel``'s thread per GPU, the replicas waiting on the one that scatters, gathers
and steps, advised as DDP).

The idle is the ``other-gpu`` cause of the idle split (:mod:`traceinsight.analysis.idle_gaps`):
while one stage works the others wait, and the host waits with them. Its saving is that idle, an
upper bound: micro-batches shrink the bubble to about (s − 1) / (m + s − 1) of it (s stages, m
micro-batches), never to nothing.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.causes import CauseKind
from traceinsight.formatting import format_duration
from traceinsight.rules import advice
from traceinsight.rules.common import make_finding, saving_from_total, source_evidence, usage_amount
from traceinsight.rules.findings import Finding
from traceinsight.rules.registry import rule


@rule("pipeline-bubble")
def pipeline_bubble(analysis: Analysis) -> Iterator[Finding]:
    """A GPU idle waiting for another GPU of its process for ``pipeline_bubble_share`` of the step."""
    limits = analysis.thresholds
    windows = analysis.steady.device_windows
    origin = analysis.meta.origin_ns
    for usage in analysis.usage:
        idle = dict(usage.idle).get(CauseKind.OTHER_GPU, 0)
        if (
            usage.window_ns < limits.min_span_us * 1000
            or idle < limits.pipeline_bubble_share * usage.window_ns
        ):
            continue
        gaps = [
            gap
            for gap in analysis.idle_gaps
            if gap.device == usage.device
            and gap.cause_kind == CauseKind.OTHER_GPU.value
            and any(gap.start_ns + origin < end and gap.end_ns + origin > start for start, end in windows)
        ]
        waited: Counter[int] = Counter()
        for gap in gaps:
            if gap.other_device is not None:
                waited[gap.other_device] += gap.duration_ns
        other = f"GPU {waited.most_common(1)[0][0]}" if waited else "another GPU"
        longest = max(gaps, key=lambda gap: gap.duration_ns) if gaps else None
        amount = usage_amount(usage, idle)
        evidence = [
            ("GPU idle waiting for another GPU", amount),
            (
                "waited for",
                ", ".join(
                    f"GPU {device} ({format_duration(ns)} in all)" for device, ns in waited.most_common()
                )
                or "another GPU",
            ),
        ]
        if longest is not None:
            evidence.append(("longest such gap", f"{format_duration(longest.duration_ns)}: {longest.cause}"))
            evidence.append(
                (
                    "source",
                    source_evidence(longest.source, longest.source_kind, run=analysis.meta.recorded_by_run),
                )
            )
        data_parallel = analysis.communication.data_parallel
        if data_parallel:
            title = f"GPU {usage.device} waits for {other} {amount} (nn.DataParallel): its replicas wait for one another"
            why = (
                "One process drives every GPU: the batch is scattered from and gathered to one GPU, "
                "which also runs the loss and the optimizer while the others wait."
            )
        else:
            title = f"GPU {usage.device} waits for {other} {amount}: a pipeline bubble, the model's stages run one after the other"
            why = (
                "One process drives several GPUs that each hold part of the model: a batch passes "
                "through them in turn, so each GPU waits while the others work, and the host waits with them."
            )
        yield make_finding(
            analysis,
            saving_from_total(analysis, idle),
            title=title,
            evidence=evidence,
            advice=advice.DDP if data_parallel else advice.PIPELINE,
            why=why,
            source=longest.source if longest else None,
            source_kind=longest.source_kind if longest else None,
            device=usage.device,
            note="an upper bound: with m micro-batches over s stages about (s - 1) / (m + s - 1) of the "
            "bubble remains",
        )
