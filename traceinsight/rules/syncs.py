"""Host syncs in the loop: ``sync-in-loop`` (at one line, every step), ``sync-in-forward`` (inside a
module's forward: data-dependent control flow), and, in a run without a GPU, ``latent-sync`` (an
operator that would make the host wait once its tensors are on a GPU; inside a forward it is a
``sync-in-forward``).

Waits for a host-to-device copy (``.to('cuda')``) are the copy rules' evidence, not findings of
their own: the fix is the copy's (one finding per fix).
"""

from __future__ import annotations

from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.latent import LatentSync
from traceinsight.analysis.replay import Fix
from traceinsight.analysis.results import SyncHotspot
from traceinsight.analysis.validity import GPU_RECORDS_LOST, unrecorded_gpu
from traceinsight.load import taxonomy
from traceinsight.rules import advice
from traceinsight.rules.common import (
    beyond,
    hotspot_place,
    how_often,
    in_saving_unit,
    located_evidence,
    make_finding,
    per_step,
    place,
    repeats,
    saving_from_total,
    saving_of,
)
from traceinsight.rules.findings import Advice, Finding, Severity
from traceinsight.rules.registry import rule

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
    """What in the user's code makes these calls, in plain words, and the advice for it (framework
    code that syncs by design first: its waits are not the user's ``if`` or ``.item()``)."""
    if hotspot.framework_call in advice.DESIGNED_SYNC:
        what, _, designed = advice.DESIGNED_SYNC[hotspot.framework_call]
        return what, designed
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


def _sync_findings(analysis: Analysis, in_forward: bool) -> Iterator[Finding]:
    """Hot spots that repeat every steady step; inside a module's forward or not."""
    for hotspot in analysis.sync_hotspots:
        if (hotspot.module is not None) != in_forward:
            continue
        if waits_for_h2d(hotspot) or not repeats(analysis, hotspot.steady_count, hotspot.steady_steps_with):
            continue
        if not hotspot.idle_caused_ns and not hotspot.idle_after_ns:
            continue  # the GPU never idled after these calls: they cost the host, not the GPU
        saving = saving_of(analysis, Fix(remove_calls=frozenset(hotspot.keys)))
        what, fix_advice = what_syncs(hotspot)
        often = how_often(analysis, hotspot.steady_count, hotspot.steady_steps_with)
        evidence = [
            ("call", hotspot.call_text),
            ("operator chain", hotspot.op_chain or "not recorded"),
            ("waits for", hotspot.copy or "everything queued on the GPU (no copy right before)"),
            ("source", located_evidence(hotspot, analysis.meta.recorded_by_run)),
            (
                "how often",
                f"{often} ({hotspot.steady_count} in the steady state, {hotspot.count} in the trace)",
            ),
            # in the steady state and in the saving's unit: per step where there are steps
            ("host blocked", in_saving_unit(analysis, hotspot.steady_blocked_ns)),
            ("GPU idle right after it", in_saving_unit(analysis, hotspot.idle_caused_ns)),
        ]
        if hotspot.module is not None:
            evidence.insert(0, ("inside the forward of", hotspot.module))
        if hotspot.framework_call is not None:
            evidence.insert(0, _inside(hotspot.framework_call))
        copy_call = hotspot.copy is not None and hotspot.call.startswith(taxonomy.COPY_CALL_PREFIXES)
        yield make_finding(
            analysis,
            saving,
            title=" ".join(
                part
                for part in (
                    what,
                    f"in {hotspot.module}'s forward" if hotspot.module else "",
                    hotspot_place(hotspot),
                    "makes the host wait for the GPU",
                    often,
                )
                if part
            ),
            evidence=evidence,
            advice=advice.BRANCH if in_forward and fix_advice is advice.EXPLICIT_SYNC else fix_advice,
            why=(
                f"A copy into pageable host memory ({hotspot.call}) is synchronous: it blocks the host "
                "until the GPU has finished everything queued before it and the copy itself"
                if copy_call
                else f"{hotspot.call} blocks the host until the GPU has finished everything queued"
            )
            + ", so when it returns the GPU has nothing left to run and idles while the host "
            "prepares and launches the next work.",
            op=hotspot.op,
            located=hotspot,
            framework_call=hotspot.framework_call,
            note=wait_note(analysis, saving.total_ns, hotspot.idle_caused_ns, hotspot.steady_blocked_ns),
        )


def wait_note(analysis: Analysis, saving_ns: int, idle_after_ns: int, blocked_ns: int = 0) -> str:
    """What the replayed saving of removing a wait is, beside the GPU idle right after the wait
    (the gap classification): the saving is the change in step time, which can be far less (the
    host is the bottleneck) or more (the wait also held back launches the GPU later idled for)."""
    note = "replayed without the wait: the host runs ahead and the GPU keeps its queue"
    if idle_after_ns and saving_ns < idle_after_ns / 4:
        return (
            "small because the host is the bottleneck here: without the wait it would still "
            "launch the next work late, so the GPU would idle anyway"
        )
    if blocked_ns > 4 * max(saving_ns, idle_after_ns):
        return (
            "replayed without the wait; far less than the host's blocked time because the GPU had "
            "work queued through most of the waiting (running it, or held by another stream, an "
            "event or communication): the host waited for that work, so removing the wait frees "
            "the host, not the GPU"
        )
    extra = beyond(saving_ns, idle_after_ns)
    if extra is not None:
        return (
            f"{note}. More than the GPU idle right after it: the wait also delayed all the host did "
            f"next, and later the GPU sat idle waiting for the host's launches (the other "
            f"{per_step(analysis, extra)})"
        )
    return note


def _inside(framework_call: str) -> tuple[str, str]:
    """The evidence row for calls made inside framework code that syncs by design."""
    known = advice.DESIGNED_SYNC.get(framework_call)
    why = f" ({known[1]})" if known else ""
    return (
        "inside",
        f"{framework_call}, which reads values on the host by design{why}: the wait is its own, the "
        "source line is where your code calls it",
    )


@rule("sync-in-loop")
def sync_in_loop(analysis: Analysis) -> Iterator[Finding]:
    """The same host sync (call, op, source line) happens every steady step, outside a forward."""
    yield from _sync_findings(analysis, in_forward=False)


@rule("sync-in-forward")
def sync_in_forward(analysis: Analysis) -> Iterator[Finding]:
    """A host sync every step inside an ``nn.Module``'s forward (and, without a GPU, an operator that
    would sync there)."""
    yield from _sync_findings(analysis, in_forward=True)
    yield from _latent_findings(analysis, in_forward=True)


@rule("latent-sync")
def latent_sync(analysis: Analysis) -> Iterator[Finding]:
    """Without a GPU: an operator that would make the host wait for one, every step."""
    yield from _latent_findings(analysis, in_forward=False)


_LATENT_WHAT: dict[str, tuple[str, Advice]] = {
    "aten::item": ("`.item()`", advice.ITEM),
    "aten::_local_scalar_dense": ("`.item()`", advice.ITEM),
    "aten::is_nonzero": ("A Python `if` on a tensor", advice.BRANCH),
    "aten::nonzero": ("`torch.nonzero`", advice.DATA_DEPENDENT),
    "aten::nonzero_static": ("`torch.nonzero`", advice.DATA_DEPENDENT),
    "aten::masked_select": ("Boolean-mask indexing", advice.DATA_DEPENDENT),
    "aten::_unique2": ("`torch.unique`", advice.DATA_DEPENDENT),
    "aten::unique_consecutive": ("`torch.unique_consecutive`", advice.DATA_DEPENDENT),
    "aten::unique_dim": ("`torch.unique`", advice.DATA_DEPENDENT),
    "aten::repeat_interleave": ("`repeat_interleave` with tensor repeats", advice.DATA_DEPENDENT),
    "aten::tolist": ("`.tolist()`", advice.TO_HOST),
}
_FORMATTING = '`print(tensor)` or formatting a tensor (`str(t)`, `f"{t}"`)'
_ON_THIS_RUN_IN_FORWARD = "no GPU, so it did not wait; on a GPU it reads a GPU value and waits for the queue"
#: Outside a forward the trace cannot tell where the value would live: said, not guessed.
_ON_THIS_RUN = (
    "no GPU, so it did not wait; on a GPU it waits for the queue if the value is there (computed by "
    "the model, or moved with .to(device)): the trace cannot tell; a value the data pipeline made on "
    "the CPU would not wait"
)


def latent_what(latent: LatentSync) -> tuple[str, Advice]:
    """What the line does, in plain words, and the one fix: framework code that syncs by design is
    named (its fix is in how it is called); a tensor's formatting is that, whatever operators it
    runs; otherwise each kind of read the line makes, the first one's advice."""
    if latent.framework_call in advice.DESIGNED_SYNC:
        what, _, designed_fix = advice.DESIGNED_SYNC[latent.framework_call]
        return what, designed_fix
    if latent.formatting:
        return _FORMATTING, advice.ITEM
    names: list[str] = []
    fixes: list[Advice] = []
    for op in latent.ops or (latent.op,):
        what, fix = _LATENT_WHAT.get(op, (f"`{op}`", advice.TO_HOST))
        if what not in names:
            names.append(what)
            fixes.append(fix)
    words = (
        names[0]
        if len(names) == 1
        else ", ".join(names[:-1]) + " and " + names[-1][0].lower() + names[-1][1:]
    )
    return words, fixes[0]


def _latent_findings(analysis: Analysis, in_forward: bool) -> Iterator[Finding]:
    run = analysis.meta.recorded_by_run
    for latent in analysis.latent_syncs:
        if latent.cpu_value is not None:
            continue  # reads a CPU value whatever the device: no wait on a GPU
        if (latent.module is not None) != in_forward or not repeats(
            analysis, latent.steady_count, latent.steady_steps_with
        ):
            continue
        what, fix_advice = latent_what(latent)
        often = how_often(analysis, latent.steady_count, latent.steady_steps_with)
        at = place(latent)
        listed = analysis.meta.gpus_unprofiled
        lost = unrecorded_gpu(analysis.warnings) == GPU_RECORDS_LOST
        title = " ".join(
            part
            for part in (
                what,
                f"in {latent.module}'s forward" if latent.module else "",
                at or "",
                "would make the host wait for the GPU",
                often,
            )
            if part
        )
        evidence = [
            ("operator chain", latent.op_chain or latent.op),
            ("source", located_evidence(latent, run)),
            (
                "how often",
                f"{often} ({latent.steady_count} in the steady state, {latent.count} in the trace)",
            ),
            (
                "on this run",
                "the GPU's records were lost, so whether it waited cannot be seen; on a GPU it reads "
                "a GPU value and waits for the queue"
                if lost
                else f"GPU activity was not recorded ({listed} listed), so whether it waited cannot be seen; "
                "on a GPU it reads a GPU value and waits for the queue"
                if listed
                else _ON_THIS_RUN_IN_FORWARD
                if latent.module
                else _ON_THIS_RUN,
            ),
        ]
        if len(latent.ops) > 1:
            evidence.insert(1, ("operators at this line", ", ".join(latent.ops)))
        if latent.module:
            evidence.insert(0, ("inside the forward of", latent.module))
        if latent.framework_call is not None:
            evidence.insert(0, _inside(latent.framework_call))
        yield make_finding(
            analysis,
            saving_from_total(analysis, 0),
            title=title
            + (
                " (GPU records lost)"
                if lost
                else " (GPU activity not recorded)"
                if listed
                else " (this run had no GPU)"
            ),
            evidence=evidence,
            advice=fix_advice,
            why=f"{latent.op} needs the tensor's value on the host. On a GPU the host then waits for "
            "every queued kernel before it can go on, and the GPU idles while the host catches up.",
            note=(
                "cannot be measured: the GPU's records were lost (see the warning at the top)"
                if lost
                else "cannot be measured without GPU activity: profile with ProfilerActivity.CUDA to see "
                "the saving"
                if listed
                else "cannot be measured without a GPU: profile it on one to see the saving"
            ),
            located=latent,
            framework_call=latent.framework_call,
            op=latent.op,
        ).with_(saving_known=False, severity=_latent_severity(analysis, latent))


#: Would-be waits per step from which a latent sync ranks as high (its saving cannot be measured,
#: so findings of unknown saving rank by how often they would wait: one in each of 30 layers'
#: forward before one `.item()` per step).
_LATENT_HIGH_PER_STEP = 4


def _latent_severity(analysis: Analysis, latent: LatentSync) -> Severity:
    steps = len(analysis.steady.steady_steps)
    per_step = latent.steady_count / steps if steps else 0
    return Severity.HIGH if per_step >= _LATENT_HIGH_PER_STEP else Severity.MEDIUM
