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
) -> Loop:
    """A loop that copies its input to the GPU (``x.to('cuda')``), then launches its kernels.

    A pageable copy's host call blocks for the copy (staging) and a stream sync follows it
    (``non_blocking=False``); a pinned copy with ``sync_after=False`` is queued without waiting.
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
            memcpy(copy_start, copy_us, kind, nbytes=1 << 20, correlation=correlation, stream=copy_stream),
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
        for k in range(kernels):
            gpu_free = _launch(loop, t + k * 5, gpu_free, kernel_us)
        t += kernels * 5 + prep_us
        loop.events.append(annotation(f"ProfilerStep#{step}", start, t - start))
        loop.steps.append((start, t))
    return loop


def dataloader_loop(
    *, steps: int = 6, wait_us: float = 5000, kernels: int = 10, kernel_us: float = 100
) -> Loop:
    """A loop that waits ``wait_us`` in a serial DataLoader's ``__next__``, then launches its kernels."""
    loop = Loop()
    t = 0.0
    gpu_free = 0.0
    for step in range(steps):
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
