"""The built-in rules. Ids are stable: scripts and dashboards key on them."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator

from traceinsight.analysis import Analysis
from traceinsight.analysis.results import SyncHotspot
from traceinsight.formatting import format_duration, format_size
from traceinsight.load import taxonomy
from traceinsight.rules import rule
from traceinsight.rules.findings import Advice, Finding


def severity(analysis: Analysis, savings_ns: int) -> str:
    """high / medium / low by the saving's share of the GPU span."""
    span = analysis.span_ns
    share = savings_ns / span if span else 0.0
    high = analysis.thresholds.high_severity_share
    if share >= high:
        return "high"
    if share >= high / 10:
        return "medium"
    return "low"


# --- sync-in-loop -------------------------------------------------------------------------------

_ITEM_ADVICE = Advice(
    summary="Keep the value on the GPU and read it rarely: accumulate losses in a tensor and call "
    ".item() (or print) once every N steps, after the loop, or from a logged detached copy.",
    before="for x, y in loader:\n    loss = step(x, y)\n"
    "    print(loss.item())  # waits for the GPU every step",
    after="running = torch.zeros((), device=device)\nfor i, (x, y) in enumerate(loader):\n"
    "    loss = step(x, y)\n    running += loss.detach()\n    if i % 100 == 0:\n"
    "        print((running / 100).item())  # one wait per 100 steps\n        running.zero_()",
)
_BRANCH_ADVICE = Advice(
    summary="A Python `if` on a GPU tensor makes the host wait for it. Branch on the GPU with "
    "torch.where / masking, or decide from values already on the host.",
    before="def forward(self, x):\n    if x.sum() > 0:  # reads a GPU value: the host waits\n"
    "        x = self.a(x)\n    return x",
    after="def forward(self, x):\n    return torch.where(x.sum() > 0, self.a(x), x)  # stays on the GPU",
)
_H2D_ADVICE = Advice(
    summary="Copy from pinned memory without blocking: `pin_memory=True` in the DataLoader and "
    "`.to(device, non_blocking=True)`, so the host queues the copy and keeps launching work.",
    before="loader = DataLoader(ds, batch_size=64)\nfor x, y in loader:\n"
    "    x = x.to('cuda')  # pageable: the host waits for the copy",
    after="loader = DataLoader(ds, batch_size=64, pin_memory=True)\nfor x, y in loader:\n"
    "    x = x.to('cuda', non_blocking=True)",
)
_CPU_ADVICE = Advice(
    summary="Moving a GPU tensor to the host (`.cpu()`, `.numpy()`, `.tolist()`, `torch.nonzero`, "
    "boolean-mask indexing) waits for all queued work. Do it less often, batch it, or keep the "
    "computation on the GPU.",
    before="for batch in loader:\n    out = model(batch)\n"
    "    preds.append(out.argmax(1).cpu())  # waits every step",
    after="for batch in loader:\n    out = model(batch)\n    preds.append(out.argmax(1))  # stay on the GPU\n"
    "preds = torch.cat(preds).cpu()  # one wait at the end",
)
_GENERIC_SYNC_ADVICE = Advice(
    summary="An explicit synchronize in the loop stops the host from queueing ahead. Remove it, or "
    "wait on a CUDA event for just the work you need.",
    before="for batch in loader:\n    step(batch)\n    torch.cuda.synchronize()",
    after="for batch in loader:\n    step(batch)\n# synchronize once, only where a wall-clock time is needed",
)


def _sync_advice(hotspot: SyncHotspot) -> tuple[str, Advice]:
    chain = hotspot.op_chain or ""
    direction = taxonomy.parse_copy_name(hotspot.copy).direction if hotspot.copy else None
    if "is_nonzero" in chain:
        return "a Python `if` on a GPU tensor", _BRANCH_ADVICE
    if "_local_scalar_dense" in chain or "aten::item" in chain:
        return "`.item()` / `print(tensor)` / `float(tensor)`", _ITEM_ADVICE
    if direction == "DtoH":
        return "a copy to the host (`.cpu()`, `.numpy()`, `.to('cpu')`, `.tolist()`)", _CPU_ADVICE
    if direction == "HtoD" or "aten::copy_" in chain or "aten::to" in chain or "_to_copy" in chain:
        return "a blocking `.to(device)` / `.cuda()` copy from host memory", _H2D_ADVICE
    if "nonzero" in chain or "masked_select" in chain or "index" in chain:
        return "an op whose output size depends on GPU data", _CPU_ADVICE
    return f"`{hotspot.call}`", _GENERIC_SYNC_ADVICE


@rule("sync-in-loop")
def sync_in_loop(analysis: Analysis) -> Iterator[Finding]:
    """The same host sync (call, op, source line) happens every step and the GPU idles after it."""
    limits = analysis.thresholds
    for hotspot in analysis.sync_hotspots:
        if analysis.iterations:
            repeats = hotspot.count >= analysis.iterations and (hotspot.count >= 2 or analysis.steps_marked)
        else:
            repeats = hotspot.count >= limits.sync_min_repeats
        if not repeats or hotspot.idle_after_ns <= 0:
            continue
        what, advice = _sync_advice(hotspot)
        where = hotspot.source or hotspot.op or hotspot.call
        per_step = (
            f"{hotspot.per_step:g}× per step" if hotspot.per_step is not None else f"{hotspot.count} times"
        )
        evidence = [
            ("call", hotspot.call),
            ("operator chain", hotspot.op_chain or "not recorded"),
            ("waits for", hotspot.copy or "queued GPU work (no copy right before)"),
            ("source", hotspot.source or "not recorded (profile with with_stack=True)"),
            ("count", f"{hotspot.count} ({per_step})"),
            ("host blocked", format_duration(hotspot.blocked_ns)),
            ("GPU idle right after", format_duration(hotspot.idle_after_ns)),
        ]
        yield Finding(
            rule="sync-in-loop",
            severity=severity(analysis, hotspot.idle_after_ns),
            title=f"Host waits for the GPU {per_step} at {where}: {what}",
            evidence=tuple(evidence),
            savings_ns=hotspot.idle_after_ns,
            advice=advice,
            why=f"{hotspot.call} blocks the host until the GPU has finished everything queued, so "
            "when it returns the GPU has nothing left to run and idles while the host prepares "
            "and launches the next work.",
            op=hotspot.op,
            source=hotspot.source,
        )


# --- copies ------------------------------------------------------------------------------------

_LARGE_DTOH = 64 * 1024


@rule("pageable-memcpy")
def pageable_memcpy(analysis: Analysis) -> Iterator[Finding]:
    """Copies to or from pageable host memory: they block the host and cannot overlap compute."""
    by_device: dict[int, list[tuple[str, int, int, int, int]]] = defaultdict(list)
    for group in analysis.copies:
        large_dtoh = group.direction == "DtoH" and group.count and group.bytes / group.count >= _LARGE_DTOH
        if group.pageable and (group.direction == "HtoD" or large_dtoh):
            by_device[group.device].append(
                (group.kind, group.count, group.bytes, group.duration_ns, group.overlapped_ns)
            )
    for device, groups in sorted(by_device.items()):
        count = sum(g[1] for g in groups)
        total_bytes = sum(g[2] for g in groups)
        duration = sum(g[3] for g in groups)
        exposed = duration - sum(g[4] for g in groups)
        yield Finding(
            rule="pageable-memcpy",
            severity=severity(analysis, exposed),
            title=f"{count} copies from pageable host memory on GPU {device} ({format_size(total_bytes)})",
            evidence=tuple(
                [(kind, f"{n} copies, {format_size(b)}, {format_duration(d)}") for kind, n, b, d, _ in groups]
                + [("copy time not overlapped with kernels", format_duration(exposed))]
            ),
            savings_ns=exposed,
            advice=_H2D_ADVICE,
            why="A copy from pageable memory is staged through a driver buffer while the host waits, "
            "so it can neither overlap compute nor let the host queue the next kernels.",
            device=device,
        )


@rule("blocking-h2d")
def blocking_h2d(analysis: Analysis) -> Iterator[Finding]:
    """Host-to-device copies that run while no kernel runs, for a noticeable share of GPU time."""
    limits = analysis.thresholds
    span = analysis.span_ns
    h2d = [group for group in analysis.copies if group.direction == "HtoD"]
    duration = sum(group.duration_ns for group in h2d)
    if not h2d or not duration or not span:
        return
    overlapped = sum(group.overlapped_ns for group in h2d)
    ratio = overlapped / duration
    exposed = duration - overlapped
    if ratio >= limits.h2d_overlap_ratio or exposed < limits.h2d_exposed_share * span:
        return
    blocked = sum(group.host_blocked for group in h2d)
    count = sum(group.count for group in h2d)
    yield Finding(
        rule="blocking-h2d",
        severity=severity(analysis, exposed),
        title=f"Host-to-device copies stall compute: {ratio:.0%} overlapped, {format_duration(exposed)} exposed",
        evidence=(
            ("HtoD copies", f"{count} ({format_size(sum(g.bytes for g in h2d))})"),
            ("copy time", format_duration(duration)),
            ("overlapped with kernels", f"{format_duration(overlapped)} ({ratio:.0%})"),
            ("copies that blocked the host", str(blocked)),
        ),
        savings_ns=exposed,
        advice=Advice(
            summary="Overlap input copies with compute: pinned memory + non_blocking copies, and "
            "prefetch the next batch on a side stream while the current one computes.",
            before="for x, y in loader:\n    x, y = x.cuda(), y.cuda()\n    loss = step(x, y)",
            after="stream = torch.cuda.Stream()\nit = iter(loader)  # DataLoader(..., pin_memory=True)\n"
            "with torch.cuda.stream(stream):\n    nxt = [t.cuda(non_blocking=True) for t in next(it)]\n"
            "for batch in it:\n    torch.cuda.current_stream().wait_stream(stream)\n    x, y = nxt\n"
            "    with torch.cuda.stream(stream):\n        nxt = [t.cuda(non_blocking=True) for t in batch]\n"
            "    loss = step(x, y)",
        ),
        why="While a copy runs alone the SMs have nothing to do; copies issued from pinned memory on "
        "another stream run underneath kernels instead.",
    )


# --- idle --------------------------------------------------------------------------------------


@rule("dataloader-stall")
def dataloader_stall(analysis: Analysis) -> Iterator[Finding]:
    """GPU idle while the launching thread waits in DataLoader ``__next__``."""
    limits = analysis.thresholds
    stalls = [gap for gap in analysis.idle_gaps if gap.cause_kind == "dataloader"]
    idle = sum(gap.duration_ns for gap in stalls)
    span = analysis.span_ns
    if not stalls or not span or idle < limits.dataloader_idle_share * span:
        return
    longest = max(stalls, key=lambda gap: gap.duration_ns)
    serial = "_SingleProcessDataLoaderIter" in longest.cause
    yield Finding(
        rule="dataloader-stall",
        severity=severity(analysis, idle),
        title=f"GPU waits {format_duration(idle)} for the DataLoader ({idle / span:.0%} of GPU time)"
        + (" — loading runs in the training process" if serial else ""),
        evidence=(
            ("idle gaps caused by the DataLoader", str(len(stalls))),
            ("GPU idle in them", f"{format_duration(idle)} ({idle / span:.0%} of the GPU span)"),
            ("longest", format_duration(longest.duration_ns)),
            ("iterator", longest.cause),
            ("source", longest.source or "not recorded"),
        ),
        savings_ns=idle,
        advice=Advice(
            summary="Load batches in parallel and ahead of time: num_workers > 0 (start with the CPU "
            "core count / GPUs), pin_memory=True, persistent_workers=True, prefetch_factor=2-4.",
            before="loader = DataLoader(dataset, batch_size=64, shuffle=True)",
            after="loader = DataLoader(\n    dataset, batch_size=64, shuffle=True,\n    num_workers=8, "
            "pin_memory=True,\n    persistent_workers=True, prefetch_factor=4,\n)",
        ),
        why="The training loop asks for the next batch only after queuing the last step; while the "
        "batch is decoded and collated on the host nothing new reaches the GPU.",
        source=longest.source,
        device=longest.device,
    )


_CAUSE_PHRASE = {
    "dataloader": "waiting for the DataLoader",
    "sync": "after host syncs",
    "cpu_op": "while the host runs operators",
    "host-bound": "host-bound (launching)",
    "untraced": "with no host activity recorded",
    "unknown": "of unknown cause",
}

_CAUSE_ADVICE = {
    "dataloader": "see dataloader-stall: load batches in worker processes",
    "sync": "see sync-in-loop: remove per-step host syncs",
    "cpu_op": "the host spends the gaps inside operators or annotated ranges named in the gap table",
    "host-bound": "the host cannot launch kernels fast enough: use larger batches, fuse small ops "
    "(torch.compile), or capture the step with CUDA graphs",
    "untraced": "the launching thread recorded nothing during these gaps: profile with "
    "with_stack=True to see the Python code, and look for waits on locks or other threads",
}


@rule("low-gpu-utilization")
def low_gpu_utilization(analysis: Analysis) -> Iterator[Finding]:
    """A GPU busy for less than ``low_utilization`` of its span, with where the idle went."""
    limits = analysis.thresholds
    for device in analysis.devices:
        if device.span_ns < limits.min_span_us * 1000 or device.utilization >= limits.low_utilization:
            continue
        by_cause: dict[str, int] = defaultdict(int)
        for gap in analysis.idle_gaps:
            if gap.device == device.device:
                by_cause[gap.cause_kind] += gap.duration_ns
        in_gaps = sum(by_cause.values())
        ranked = sorted(by_cause.items(), key=lambda item: -item[1])
        top = ranked[0][0] if ranked else "host-bound"
        evidence = [
            (
                "busy",
                f"{format_duration(device.busy_ns)} of {format_duration(device.span_ns)} ({device.utilization:.0%})",
            ),
            ("idle", format_duration(device.idle_ns)),
            (f"idle in gaps ≥ {limits.min_gap_us:g} µs", format_duration(in_gaps)),
        ] + [(f"idle: {cause}", format_duration(ns)) for cause, ns in ranked]
        yield Finding(
            rule="low-gpu-utilization",
            severity=severity(analysis, in_gaps),
            title=f"GPU {device.device} is busy only {device.utilization:.0%} of the time; "
            f"most idle is {_CAUSE_PHRASE.get(top, top)}",
            evidence=tuple(evidence),
            savings_ns=in_gaps,
            advice=Advice(
                summary=f"Largest idle cause: {top} — {_CAUSE_ADVICE.get(top, 'see the gap table')}.",
                before="# per step: launch → wait → launch → wait",
                after="# queue work ahead: no host syncs in the loop, batches loaded in workers,\n"
                "# fewer, larger kernels (torch.compile / CUDA graphs)",
            ),
            why="Idle time is the sum of the gaps between GPU work; each gap is a moment the host "
            "had not queued the next kernel yet.",
            device=device.device,
        )
