"""``sync-in-loop``: the host waits for the GPU every step, at one line of code.

Waits for a host-to-device copy (``.to('cuda')``) are the copy rules' evidence, not findings of
their own: the fix is the copy's (one finding per fix).
"""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.replay import Fix
from traceinsight.analysis.results import SyncHotspot
from traceinsight.formatting import format_duration
from traceinsight.load import taxonomy
from traceinsight.rules import advice, rule
from traceinsight.rules.common import (
    hotspot_place,
    how_often,
    make_finding,
    repeats,
    saving_of,
    source_evidence,
)
from traceinsight.rules.findings import Advice, Finding

_EXPLICIT = {
    "cudaDeviceSynchronize": "`torch.cuda.synchronize()`",
    "hipDeviceSynchronize": "`torch.cuda.synchronize()`",
    "cudaStreamSynchronize": "`stream.synchronize()`",
    "hipStreamSynchronize": "`stream.synchronize()`",
    "cudaEventSynchronize": "`event.synchronize()`",
    "hipEventSynchronize": "`event.synchronize()`",
}


def waits_for_h2d(hotspot: SyncHotspot) -> bool:
    """True when the calls wait for a host-to-device copy (the copy rules report them)."""
    return hotspot.copy is not None and taxonomy.parse_copy_name(hotspot.copy).direction == "HtoD"


def what_syncs(hotspot: SyncHotspot) -> tuple[str, Advice]:
    """What in the user's code makes these calls, in plain words, and the advice for it."""
    chain = hotspot.op_chain or ""
    direction = taxonomy.parse_copy_name(hotspot.copy).direction if hotspot.copy else None
    if "is_nonzero" in chain:
        return "A Python `if` on a GPU tensor", advice.BRANCH
    if "_local_scalar_dense" in chain or "aten::item" in chain:
        return "`.item()`", advice.ITEM
    if direction == "DtoH":
        return "A copy to the host (`.cpu()`, `.numpy()`, `.tolist()`)", advice.TO_HOST
    if any(name in chain for name in ("nonzero", "masked_select", "unique", "index")):
        return "An operation whose output size depends on GPU data", advice.DATA_DEPENDENT
    if hotspot.op is None and hotspot.call in _EXPLICIT:
        return f"{_EXPLICIT[hotspot.call]} ({hotspot.call})", advice.EXPLICIT_SYNC
    return f"`{hotspot.call}`" + (f" in {hotspot.op}" if hotspot.op else ""), advice.EXPLICIT_SYNC


@rule("sync-in-loop")
def sync_in_loop(analysis: Analysis) -> Iterator[Finding]:
    """The same host sync (call, op, source line) happens every steady step."""
    for hotspot in analysis.sync_hotspots:
        if waits_for_h2d(hotspot) or not repeats(analysis, hotspot.steady_count):
            continue
        if not hotspot.idle_caused_ns and not hotspot.idle_after_ns:
            continue  # the GPU never idled after these calls: they cost the host, not the GPU
        saving = saving_of(analysis, Fix(remove_calls=frozenset(hotspot.keys)))
        what, fix_advice = what_syncs(hotspot)
        often = how_often(analysis, hotspot.steady_count)
        evidence = [
            ("call", hotspot.call),
            ("operator chain", hotspot.op_chain or "not recorded"),
            ("waits for", hotspot.copy or "everything queued on the GPU (no copy right before)"),
            ("source", source_evidence(hotspot.source, hotspot.source_kind)),
            (
                "how often",
                f"{often} ({hotspot.steady_count} in the steady state, {hotspot.count} in the trace)",
            ),
            ("host blocked", format_duration(hotspot.blocked_ns)),
            ("GPU idle it caused", format_duration(hotspot.idle_caused_ns)),
        ]
        note = "replayed without the wait: the host runs ahead and the GPU keeps its queue"
        if hotspot.idle_caused_ns and saving.total_ns < hotspot.idle_caused_ns / 4:
            note = (
                "small because the host is the bottleneck here: without the wait it would still "
                "launch the next work late, so the GPU would idle anyway"
            )
        yield make_finding(
            analysis,
            "sync-in-loop",
            saving,
            title=" ".join(
                part
                for part in (what, hotspot_place(hotspot), "makes the host wait for the GPU", often)
                if part
            ),
            evidence=(evidence),
            advice=fix_advice,
            why=f"{hotspot.call} blocks the host until the GPU has finished everything queued, so "
            "when it returns the GPU has nothing left to run and idles while the host prepares "
            "and launches the next work.",
            op=hotspot.op,
            source=hotspot.source,
            source_kind=hotspot.source_kind,
            note=note,
        )
