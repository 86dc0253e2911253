"""Hand-built training loops with known timing, for the replay and rule tests.

Each builder returns (events, facts): the trace events and the figures a test needs to compute its
expectation independently (when each sync returned, when the GPU next ran ...), all in µs. Their
Python frames are ``traceinsight run``'s call sites (``"Call site": 1``): the line is the call's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

from tracebuild import annotation, cpu_op, kernel, memcpy, run_frame, runtime

LAUNCH_LATENCY = 10  # µs from the launch call to the kernel's start when the GPU is waiting
_correlation = itertools.count(500_000)


@dataclass
class Loop:
    """What a builder knows about the loop it wrote."""

    events: list[dict[str, Any]] = field(default_factory=list)
    #: (start, end) of each ProfilerStep window.
    steps: list[tuple[float, float]] = field(default_factory=list)
    #: When each blocking call returned.
    sync_returns: list[float] = field(default_factory=list)
    #: (start, end) of every GPU activity.
    gpu: list[tuple[float, float]] = field(default_factory=list)

    def idle_after_syncs(self) -> float:
        """GPU idle from each sync's return to the next GPU activity, or to the end of its step."""
        total = 0.0
        for returned in self.sync_returns:
            window_end = next(end for start, end in self.steps if start <= returned < end)
            busy_until = max([end for start, end in self.gpu if start <= returned] or [returned])
            following = [start for start, _ in self.gpu if start >= returned]
            resume = min(min(following, default=window_end), window_end)
            total += max(0.0, resume - max(returned, busy_until))
        return total


def _launch(loop: Loop, at: float, gpu_free: float, duration: float, *, stream: int = 7) -> float:
    """A cudaLaunchKernel at ``at``; the kernel starts when both it and the GPU are ready. → its end."""
    correlation = next(_correlation)
    start = max(at + LAUNCH_LATENCY, gpu_free)
    loop.events.append(runtime("cudaLaunchKernel", at, 3, correlation=correlation))
    loop.events.append(kernel(start, duration, correlation=correlation, stream=stream))
    loop.gpu.append((start, start + duration))
    return start + duration


def item_loop(
    *,
    steps: int = 6,
    kernels: int = 20,
    kernel_us: float = 100,
    launch_every_us: float = 5,
    prep_us: float = 300,
    source: str = "train.py(52): train_step",
) -> Loop:
    """A loop that launches ``kernels`` kernels, then calls ``loss.item()`` and prepares the next step.

    With kernels longer than the launch interval the GPU is the bottleneck and its queue is full
    when ``.item()`` syncs; with kernels shorter than it the host is, and the GPU has long drained.
    """
    loop = Loop()
    t = 0.0
    gpu_free = 0.0
    for step in range(steps):
        start = t
        for k in range(kernels):
            gpu_free = _launch(loop, t + k * launch_every_us, gpu_free, kernel_us)
        t += kernels * launch_every_us
        # loss.item(): a 4-byte copy to pageable memory, then a stream sync until the GPU is done
        copy_correlation = next(_correlation)
        copy_start = max(t + 2 + LAUNCH_LATENCY, gpu_free)
        gpu_free = copy_start + 2
        sync_start = t + 5
        returned = max(sync_start + 3, gpu_free + 2)
        loop.events += [
            run_frame(source, t - 1, returned + 2 - t, call_site=1),
            cpu_op("aten::item", t, returned + 1 - t),
            cpu_op("aten::_local_scalar_dense", t + 0.5, returned + 0.5 - t),
            runtime("cudaMemcpyAsync", t + 1, 3, correlation=copy_correlation),
            memcpy(copy_start, 2, "Memcpy DtoH (Device -> Pageable)", nbytes=4, correlation=copy_correlation),
            runtime("cudaStreamSynchronize", sync_start, returned - sync_start),
        ]
        loop.gpu.append((copy_start, copy_start + 2))
        loop.sync_returns.append(returned)
        t = returned + 1 + prep_us  # Python preparing the next batch: nothing recorded
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def blocking_item_loop(
    *,
    steps: int = 6,
    kernels: int = 20,
    kernel_us: float = 100,
    launch_every_us: float = 5,
    prep_us: float = 300,
    sync_after: bool = False,
    source: str = "train.py(61): train_step",
) -> Loop:
    """``loss.item()`` whose copy into pageable memory waits inside ``cudaMemcpyAsync`` itself:
    the call returns only when the GPU has run every queued kernel and then the 4-byte copy (no
    ``cudaStreamSynchronize`` after it, unless ``sync_after``: then one that barely waits)."""
    loop = Loop()
    t = 0.0
    gpu_free = 0.0
    for step in range(steps):
        start = t
        for k in range(kernels):
            gpu_free = _launch(loop, t + k * launch_every_us, gpu_free, kernel_us)
        t += kernels * launch_every_us
        copy_correlation = next(_correlation)
        copy_start = max(t + 1 + LAUNCH_LATENCY, gpu_free)
        gpu_free = copy_start + 2
        returned = gpu_free + 3  # the call returns once the copy is done
        wait_events = [
            runtime("cudaMemcpyAsync", t + 1, returned - (t + 1), correlation=copy_correlation),
            memcpy(copy_start, 2, "Memcpy DtoH (Device -> Pageable)", nbytes=4, correlation=copy_correlation),
        ]
        if sync_after:
            wait_events.append(runtime("cudaStreamSynchronize", returned + 1, 4))
            returned += 5
        loop.events += [
            run_frame(source, t - 1, returned + 2 - t, call_site=1),
            cpu_op("aten::item", t, returned + 1 - t),
            cpu_op("aten::_local_scalar_dense", t + 0.5, returned + 0.5 - t),
            *wait_events,
        ]
        loop.gpu.append((copy_start, copy_start + 2))
        loop.sync_returns.append(returned)
        t = returned + 1 + prep_us  # Python preparing the next batch: nothing recorded
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def copy_loop(
    *,
    steps: int = 6,
    kind: str = "Memcpy HtoD (Pageable -> Device)",
    copy_us: float = 200,
    kernels: int = 10,
    kernel_us: float = 100,
    prep_us: float = 200,
    sync_after: bool = True,
    copy_stream: int = 7,
    nbytes: int = 1 << 20,
    pinned_beside: tuple[int, float] | None = None,
) -> Loop:
    """A loop that copies its input to the GPU (``x.to('cuda')``), then launches its kernels.

    A pageable copy's host call blocks for the copy (staging) and a stream sync follows it
    (``non_blocking=False``); a pinned copy with ``sync_after=False`` is queued without waiting.
    With ``pinned_beside=(bytes, µs)`` each step also copies a side input from pinned memory,
    queued without waiting on stream 9 and running beside the step's first kernel.
    """
    loop = Loop()
    t = 0.0
    gpu_free = 0.0
    blocking = "Pageable" in kind
    for step in range(steps):
        start = t
        correlation = next(_correlation)
        copy_start = max(t + LAUNCH_LATENCY, gpu_free) if copy_stream == 7 else t + LAUNCH_LATENCY
        copy_end = copy_start + copy_us
        call_end = copy_end + 2 if blocking else t + 5
        loop.events += [
            run_frame("train.py(44): train", t - 1, call_end - t + 20, call_site=1),
            cpu_op("aten::to", t, call_end - t + 15),
            cpu_op("aten::_to_copy", t + 0.5, call_end - t + 14),
            cpu_op("aten::copy_", t + 1, call_end - t + 13),
            runtime("cudaMemcpyAsync", t + 2, call_end - t - 2, correlation=correlation),
            memcpy(copy_start, copy_us, kind, nbytes=nbytes, correlation=correlation, stream=copy_stream),
        ]
        loop.gpu.append((copy_start, copy_end))
        if copy_stream == 7:
            gpu_free = copy_end
        t = call_end
        if sync_after:
            returned = max(t + 4, copy_end + 2, gpu_free + 2)
            loop.events.append(runtime("cudaStreamSynchronize", t + 1, returned - t - 1))
            loop.sync_returns.append(returned)
            t = returned
        t += 10
        first_kernel = max(t + LAUNCH_LATENCY, gpu_free)
        for k in range(kernels):
            gpu_free = _launch(loop, t + k * 5, gpu_free, kernel_us)
        t += kernels * 5
        if pinned_beside is not None:
            side_bytes, side_us = pinned_beside
            side = next(_correlation)
            side_start = max(t + LAUNCH_LATENCY, first_kernel)
            loop.events += [
                runtime("cudaMemcpyAsync", t, 4, correlation=side),
                memcpy(side_start, side_us, "Memcpy HtoD (Pinned -> Device)", nbytes=side_bytes,
                       correlation=side, stream=9),
            ]  # fmt: skip
            loop.gpu.append((side_start, side_start + side_us))
            t += 5
        t += prep_us
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def dataloader_loop(
    *,
    steps: int = 6,
    wait_us: float = 5000,
    kernels: int = 10,
    kernel_us: float = 100,
    waits_us: list[float] | None = None,
) -> Loop:
    """A loop that waits ``wait_us`` in a serial DataLoader's ``__next__`` (or ``waits_us[step]``, one
    wait per step), then launches its kernels."""
    loop = Loop()
    t = 0.0
    gpu_free = 0.0
    waits = waits_us if waits_us is not None else [wait_us] * steps
    for step, wait_us in enumerate(waits):
        start = t
        loop.events.append(
            annotation("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", t, wait_us)
        )
        loop.events.append(run_frame("train.py(40): train", t, wait_us, call_site=1))
        t += wait_us
        for k in range(kernels):
            gpu_free = _launch(loop, t + k * 10, gpu_free, kernel_us)
        t += kernels * 10
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def launch_loop(
    *,
    steps: int = 6,
    kernels: int = 12,
    kernel_us: float = 20,
    dispatch_us: float = 60,
    pause_us: float = 0,
    pause_after: int = 5,
) -> Loop:
    """A loop of tiny kernels, each launched at the end of an operator the host takes ``dispatch_us``
    to run (``aten::add`` → ``cudaLaunchKernel``): the GPU finishes each kernel before the next is
    launched. With ``pause_us``, the host pauses that long after kernel ``pause_after`` of each step,
    recording nothing (Python outside any operator, a sleep)."""
    loop = Loop()
    t = 0.0
    gpu_free = 0.0
    for step in range(steps):
        start = t
        for k in range(kernels):
            loop.events.append(cpu_op("aten::add", t, dispatch_us))
            gpu_free = _launch(loop, t + dispatch_us - 5, gpu_free, kernel_us)
            t += dispatch_us
            if pause_us and k == pause_after:
                t += pause_us
        t = max(t, gpu_free) + 5
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def model_parallel_loop(*, steps: int = 6, stage_kernels: int = 4, kernel_us: float = 300) -> Loop:
    """Naive model parallelism: one process drives two GPUs, the model's first half on GPU 0 and its
    second half on GPU 1 (``x.to('cuda:1')`` between them: GPU 1's stream waits on GPU 0's event).
    Each step the main thread launches the forward on GPU 0, then on GPU 1, and reads the loss
    (``loss.item()``, which waits for GPU 1, so for GPU 0 too); then autograd's thread for each
    device launches the backward, GPU 1's first, GPU 0's behind it. The stages run one after the
    other: each GPU waits while the other works."""
    loop = Loop()
    t = 0.0
    free = {0: 0.0, 1: 0.0}

    def launch(at: float, device: int, after: float = 0.0, tid: int = 100) -> None:
        correlation = next(_correlation)
        start = max(at + LAUNCH_LATENCY, free[device], after)
        loop.events.append(runtime("cudaLaunchKernel", at, 3, correlation=correlation, tid=tid))
        loop.events.append(kernel(start, kernel_us, correlation=correlation, device=device))
        loop.gpu.append((start, start + kernel_us))
        free[device] = start + kernel_us

    for step in range(steps):
        start = t
        for k in range(stage_kernels):  # forward, first half
            launch(t + k * 10, 0)
        loop.events.append(runtime("cudaStreamWaitEvent", t + stage_kernels * 10, 2))
        first_half = free[0]
        for k in range(stage_kernels):  # forward, second half, after GPU 0's
            launch(t + 45 + k * 10, 1, after=first_half)
        # loss.item() on GPU 1: a 4-byte copy, then a stream sync until it is done
        at = t + 90
        copy_correlation = next(_correlation)
        copy_start = max(at + 2 + LAUNCH_LATENCY, free[1])
        free[1] = copy_start + 2
        returned = free[1] + 2
        loop.events += [
            cpu_op("aten::item", at, returned + 1 - at),
            cpu_op("aten::_local_scalar_dense", at + 0.5, returned + 0.5 - at),
            runtime("cudaMemcpyAsync", at + 2, 3, correlation=copy_correlation),
            memcpy(
                copy_start,
                2,
                "Memcpy DtoH (Device -> Pageable)",
                nbytes=4,
                correlation=copy_correlation,
                device=1,
            ),
            runtime("cudaStreamSynchronize", at + 6, returned - at - 6),
        ]
        loop.gpu.append((copy_start, copy_start + 2))
        loop.sync_returns.append(returned)
        for k in range(stage_kernels):  # backward, second half: autograd's thread for GPU 1
            launch(returned + 5 + k * 10, 1, tid=301)
        loop.events.append(runtime("cudaStreamWaitEvent", returned + 45, 2, tid=300))
        second_half = free[1]
        for k in range(stage_kernels):  # backward, first half, after GPU 1's: the thread for GPU 0
            launch(returned + 50 + k * 10, 0, after=second_half, tid=300)
        t = returned + 100
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def ahead_loop(
    *, steps: int = 6, kernels: int = 20, kernel_us: float = 420, launch_every_us: float = 19.5
) -> Loop:
    """A healthy asynchronous loop whose host runs ahead of the GPU: each ``ProfilerStep`` range
    launches ``kernels`` kernels ``launch_every_us`` apart and ends (0.39 ms by default) while the
    GPU still needs ``kernels × kernel_us`` (8.4 ms) for them; nothing waits, so the kernels run
    back to back from the first launch on."""
    loop = Loop()
    t = 0.0
    gpu_free = 0.0
    for step in range(steps):
        start = t
        for k in range(kernels):
            gpu_free = _launch(loop, t + k * launch_every_us, gpu_free, kernel_us)
        t += kernels * launch_every_us
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def preprocessing_loop(
    *,
    steps: int = 4,
    prep_us: float | tuple[float, ...] = 217_000,
    kernels: int = 10,
    kernel_us: float = 16_500,
    source: str = "video.py(31): load_clip",
) -> Loop:
    """A video model's loop: each step the host decodes and resizes a clip (``prep_us`` in
    ``aten::upsample_bilinear2d`` under ``source``; one per step when a tuple) before it launches
    anything, then launches its kernels (``kernels × kernel_us``) and waits for them in
    ``loss.item()``'s stream sync."""
    loop = Loop()
    t = 0.0
    gpu_free = 0.0
    preps = prep_us if isinstance(prep_us, tuple) else (prep_us,) * steps
    for step, prep_us in enumerate(preps):
        start = t
        loop.events.append(run_frame(source, t, prep_us, call_site=1))
        loop.events.append(cpu_op("aten::upsample_bilinear2d", t + 1, prep_us - 2))
        t += prep_us
        for k in range(kernels):
            gpu_free = _launch(loop, t + k * 5, gpu_free, kernel_us)
        t += kernels * 5
        returned = max(t + 3, gpu_free + 2)
        loop.events.append(runtime("cudaStreamSynchronize", t, returned - t))
        loop.sync_returns.append(returned)
        t = returned + 1
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop
