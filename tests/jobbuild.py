"""N-rank jobs made from one real rank trace: shifted copies, with slow ranks planted by editing events.

Used by the job tests and by ``benchmarks/bench_job.py``. Plain stdlib, independent of the loader.

Each rank is a copy of ``sample_traces/two_ranks/rank-0.json.gz`` (a real 2-step DDP rank with
NCCL kernels) with ``distributedInfo.rank``/``world_size`` set, and every time shifted by a small
per-rank jitter (whole µs, below :data:`MAX_JITTER_US`). Two ranks may be made slow:

- **DataLoader-starved**: at the start of each step the main thread spends ``dataloader_us`` in
  ``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__``; everything the host does after
  it, and the GPU work it launches, happens that much later.
- **per-step sync**: once per step, right after the main thread launches an NCCL kernel (the
  queue is then long: the kernel waits for the other ranks), ``cudaDeviceSynchronize`` blocks
  until every GPU stream has drained, then the host spends ``after_sync_us`` before going on.

"Later" is done the same way for both (:func:`_pause`): host events from the pause on move by its
length (events that span it grow by it), and GPU events move with their launching call.
"""

from __future__ import annotations

import copy
import gzip
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tracebuild import SAMPLES

BASE = SAMPLES / "two_ranks" / "rank-0.json.gz"
MAX_JITTER_US = 300
DATALOADER_NEXT = "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__"
_GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
_LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "Runtime"}


@dataclass(frozen=True)
class Plan:
    """Which ranks are slow, and how."""

    ranks: int
    dataloader_rank: int | None = None
    sync_rank: int | None = None
    dataloader_us: int = 100_000
    after_sync_us: int = 30_000


def jitter_us(rank: int) -> int:
    """The rank's clock shift in whole µs (deterministic, 0 ≤ jitter < MAX_JITTER_US)."""
    return (rank * 7919) % MAX_JITTER_US


def _launches(events: list[dict[str, Any]]) -> dict[int, dict[str, Any]]:
    return {
        e["args"]["correlation"]: e
        for e in events
        if e.get("cat") in _LAUNCH_CATS and isinstance(e.get("args"), dict) and "correlation" in e["args"]
    }


def _launch_ts(event: dict[str, Any], launches: dict[int, dict[str, Any]]) -> float | None:
    correlation = (event.get("args") or {}).get("correlation")
    if correlation is None and event.get("ph") in ("s", "f") and event.get("cat") == "ac2g":
        correlation = event.get("id")
    launch = launches.get(correlation) if correlation is not None else None
    return launch["ts"] if launch is not None else None


def _pause(events: list[dict[str, Any]], at: int, length: int, launch_ts: dict[int, float | None]) -> None:
    """Make everything from host time ``at`` on happen ``length`` µs later (see the module doc)."""
    for index, event in enumerate(events):
        if "ts" not in event or event.get("ph") == "M":
            continue
        if event.get("cat") in _GPU_CATS or (event.get("cat") == "ac2g" and event.get("ph") == "f"):
            launched = launch_ts[index]
            if launched is not None and launched >= at:
                event["ts"] += length
            continue
        if event["ts"] >= at:
            event["ts"] += length
        elif event.get("ph") == "X" and event["ts"] + event.get("dur", 0) > at:
            event["dur"] += length


def _main_steps(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return sorted(
        (e for e in events if str(e.get("name", "")).startswith("ProfilerStep#")), key=lambda e: e["ts"]
    )


def _plant_dataloader(events: list[dict[str, Any]], wait_us: int) -> None:
    launches = _launches(events)
    launch_ts = [_launch_ts(e, launches) for e in events]
    steps = _main_steps(events)
    for step in reversed(steps):  # latest first: earlier pauses then move the later ones too
        at = step["ts"] + 1
        _pause(events, at, wait_us, launch_ts)
        launch_ts.append(None)
        events.append(
            {"ph": "X", "cat": "user_annotation", "name": DATALOADER_NEXT, "pid": step["pid"],
             "tid": step["tid"], "ts": at, "dur": wait_us, "args": {"External id": 0}}
        )  # fmt: skip


def _plant_sync(events: list[dict[str, Any]], after_us: int) -> None:
    launches = _launches(events)
    launch_ts = [_launch_ts(e, launches) for e in events]
    gpu = [
        (launch_ts[i], e)
        for i, e in enumerate(events)
        if e.get("cat") in _GPU_CATS and launch_ts[i] is not None
    ]
    steps = _main_steps(events)
    points = []
    for step in steps:
        main = (step["pid"], step["tid"])
        nccl = sorted(
            (launches[e["args"]["correlation"]] for _, e in gpu if "nccl" in e["name"].lower()),
            key=lambda launch: launch["ts"],
        )
        inside = [
            launch for launch in nccl
            if (launch["pid"], launch["tid"]) == main and step["ts"] <= launch["ts"] < step["ts"] + step["dur"]
        ]  # fmt: skip
        at = inside[0]["ts"] + inside[0]["dur"] + 1
        drained = max(e["ts"] + e["dur"] for launched, e in gpu if launched is not None and launched < at)
        points.append((at, drained, main))
    correlation = 10**9
    for at, drained, (pid, tid) in reversed(points):
        waited = max(1, drained - at)
        _pause(events, at, waited + after_us, launch_ts)
        correlation += 1
        launch_ts.append(None)
        events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": "cudaDeviceSynchronize", "pid": pid, "tid": tid,
             "ts": at, "dur": waited, "args": {"correlation": correlation, "External id": 0}}
        )  # fmt: skip


def rank_document(base: dict[str, Any], rank: int, plan: Plan) -> dict[str, Any]:
    """One rank's trace document."""
    document = copy.deepcopy(base)
    events = document["traceEvents"]
    if rank == plan.dataloader_rank:
        _plant_dataloader(events, plan.dataloader_us)
    if rank == plan.sync_rank:
        _plant_sync(events, plan.after_sync_us)
    shift = jitter_us(rank)
    for event in events:
        if "ts" in event and event.get("ph") != "M":
            event["ts"] += shift
    document["distributedInfo"] = {
        **document.get("distributedInfo", {}),
        "rank": rank,
        "world_size": plan.ranks,
    }
    return document


def make_job(folder: Path, plan: Plan) -> list[Path]:
    """Write the job's traces (``rank-<N>.json.gz``) into ``folder``; returns their paths."""
    folder.mkdir(parents=True, exist_ok=True)
    base = json.loads(gzip.decompress(BASE.read_bytes()))
    paths = []
    for rank in range(plan.ranks):
        path = folder / f"rank-{rank}.json.gz"
        text = json.dumps(rank_document(base, rank, plan), separators=(",", ":"))
        path.write_bytes(gzip.compress(text.encode(), compresslevel=1))
        paths.append(path)
    return paths


# --- a synthetic job whose host runs ahead of the GPU ------------------------------------------


@dataclass(frozen=True)
class AheadPlan:
    """A data-parallel job whose hosts run ahead of their GPUs, with slow ranks planted.

    Every rank's step (single stream, all times in µs): the main thread waits ``loader_us`` in a
    DataLoader ``__next__``, then launches, 10 µs apart, a pinned host-to-device copy of the batch
    (``copy_us``), ``forward`` kernels of ``forward_us``, ``backward`` kernels of ``backward_us``,
    and ``optimizer`` kernels of ``optimizer_us``, with the collectives of its ``shape`` between
    them: about 0.3 ms of host range for about 8.4 ms of GPU work, so the host runs ahead.

    Every collective starts on each GPU when that GPU reaches it (its *arrival*) and ends
    ``allreduce_us`` (the transfer) after the last member's arrival, on every member: the others
    wait in it. Shapes:

    - ``ddp``: one NCCL all-reduce after backward;
    - ``all-to-all``: an all-to-all (``SendRecv`` kernels) halfway through forward and one halfway
      through backward (an embedding exchange);
    - ``fsdp``: an all-gather before forward and one before backward, a reduce-scatter after;
    - ``pipeline``: rank r is stage r: it receives from r − 1 before its forward and sends to r + 1
      after it (no backward); each pair's ``SendRecv`` carries ``Process Group Name`` ``pp<r>`` and
      ``Seq`` (the step), as Kineto writes them since 2026.

    Planted:

    - ``dataloader_rank`` waits ``dataloader_us`` (instead of ``loader_us``) in ``__next__``;
    - ``item_rank`` calls ``.item()`` after half its forward launches (``aten::item`` →
      ``cudaMemcpyAsync`` of 4 bytes to pageable memory + ``cudaStreamSynchronize``, which returns
      once every GPU activity launched before it has ended), then the host spends ``after_item_us``
      in Python before it launches the rest;
    - ``late_rank``: once, in step ``late_step``, its host pauses ``late_us`` with nothing
      recorded just before it launches its first collective;
    - ``heavy_rank``'s forward kernels take ``heavy_forward_us`` each (a larger shard, an
      embedding or expert imbalance: more GPU work).
    """

    ranks: int
    dataloader_rank: int | None = None
    item_rank: int | None = None
    steps: int = 5
    loader_us: int = 20
    dataloader_us: int = 20_000
    after_item_us: int = 3_000
    copy_us: int = 40
    forward: int = 10
    forward_us: int = 280
    backward: int = 10
    backward_us: int = 500
    allreduce_us: int = 400
    optimizer: int = 5
    optimizer_us: int = 40
    shape: str = "ddp"
    late_rank: int | None = None
    late_step: int = 1
    late_us: int = 0
    heavy_rank: int | None = None
    heavy_forward_us: int = 0


COLLECTIVE_KERNELS = {
    "all-reduce": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)",
    "all-to-all": "ncclDevKernel_SendRecv(ncclDevComm*)",
    "all-gather": "ncclDevKernel_AllGather_RING_LL(ncclDevComm*)",
    "reduce-scatter": "ncclDevKernel_ReduceScatter_Sum_f32_RING_LL(ncclDevComm*)",
    "send/recv": "ncclDevKernel_SendRecv(ncclDevComm*)",
}
LAUNCH_US = 10  # between launches, and from a launch to its kernel when the GPU is idle
_PID, _TID, _STREAM = 1000, 1000, 7
_FORWARD = "void forward_gemm<float>(float*)"
_BACKWARD = "void backward_gemm<float>(float*)"
_OPTIMIZER = "void multi_tensor_apply_kernel<float>(float*)"


def _step_ops(plan: AheadPlan) -> list[tuple[str, str]]:
    """One step's work after the batch's copy, in launch order: ("kernel", name), ("item", ""),
    ("collective", kind)."""
    forward = [("kernel", _FORWARD)] * plan.forward
    forward.insert(plan.forward // 2, ("item", ""))
    backward = [("kernel", _BACKWARD)] * plan.backward
    optimizer = [("kernel", _OPTIMIZER)] * plan.optimizer
    half = len(forward) // 2 + 1
    if plan.shape == "ddp":
        return [*forward, *backward, ("collective", "all-reduce"), *optimizer]
    if plan.shape == "all-to-all":
        exchange = ("collective", "all-to-all")
        middle = len(backward) // 2
        return [
            *forward[:half],
            exchange,
            *forward[half:],
            *backward[:middle],
            exchange,
            *backward[middle:],
            *optimizer,
        ]
    if plan.shape == "fsdp":
        return [("collective", "all-gather"), *forward, ("collective", "all-gather"), *backward,
                ("collective", "reduce-scatter"), *optimizer]  # fmt: skip
    raise ValueError(f"unknown shape {plan.shape}")


class _Rank:
    """One rank's events and its GPU's frontier (the end of the last work queued)."""

    def __init__(self, rank: int) -> None:
        self.rank = rank
        self.events: list[dict[str, Any]] = []
        self.host = 0.0
        self.frontier = 0.0
        self.correlation = 1

    def host_range(self, cat: str, name: str, ts: float, dur: float) -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": _PID, "tid": _TID, "ts": ts, "dur": dur, "args": {}}
        )

    def launch(self, name: str, call: str = "cudaLaunchKernel") -> tuple[float, int]:
        """A launch call at the host's time → (the time its work can start, its correlation)."""
        correlation = self.correlation
        self.correlation += 1
        self.events.append(
            {"ph": "X", "cat": "cuda_runtime", "name": call, "pid": _PID, "tid": _TID, "ts": self.host,
             "dur": 4, "args": {"correlation": correlation}}
        )  # fmt: skip
        ready = self.host + LAUNCH_US
        self.host += LAUNCH_US
        return ready, correlation

    def gpu(self, cat: str, name: str, start: float, dur: float, correlation: int, **args: Any) -> None:
        self.events.append(
            {"ph": "X", "cat": cat, "name": name, "pid": 0, "tid": _STREAM, "ts": start, "dur": dur,
             "args": {"device": 0, "stream": _STREAM, "correlation": correlation, **args}}
        )  # fmt: skip
        self.frontier = max(self.frontier, start + dur)

    def kernel(self, name: str, dur: float) -> None:
        ready, correlation = self.launch(name)
        start = max(ready, self.frontier)
        self.gpu("kernel", name, start, dur, correlation)


def _begin_step(r: _Rank, plan: AheadPlan) -> float:
    start = r.host
    wait = plan.dataloader_us if r.rank == plan.dataloader_rank else plan.loader_us
    r.host_range("user_annotation", DATALOADER_NEXT, r.host, wait)
    r.host += wait
    ready, correlation = r.launch("Memcpy", call="cudaMemcpyAsync")
    r.gpu("gpu_memcpy", "Memcpy HtoD (Pinned -> Device)", max(ready, r.frontier), plan.copy_us, correlation,
          bytes=1 << 20)  # fmt: skip
    return start


def _item(r: _Rank, plan: AheadPlan) -> None:
    """``.item()``: a 4-byte copy to pageable memory, a stream sync, then Python (see the plan)."""
    item = r.host
    ready, correlation = r.launch("Memcpy", call="cudaMemcpyAsync")
    r.gpu("gpu_memcpy", "Memcpy DtoH (Device -> Pageable)", max(ready, r.frontier), 2, correlation, bytes=4)
    sync_start = r.host
    returned = max(sync_start + 5, r.frontier + 5)
    r.events.append(
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaStreamSynchronize", "pid": _PID,
         "tid": _TID, "ts": sync_start, "dur": returned - sync_start,
         "args": {"correlation": r.correlation}}
    )  # fmt: skip
    r.correlation += 1
    r.host_range("cpu_op", "aten::item", item - 1, returned + 2 - item)
    r.host_range("cpu_op", "aten::_local_scalar_dense", item - 0.5, returned + 1 - item)
    r.host = returned + 2 + plan.after_item_us


def _arrive(r: _Rank, plan: AheadPlan, step: int, kind: str, late: set[int]) -> tuple[float, int]:
    """Launch a collective: (its arrival on the GPU, its correlation); the planted pause first."""
    if r.rank == plan.late_rank and step == plan.late_step and r.rank not in late:
        late.add(r.rank)
        r.host += plan.late_us
    ready, correlation = r.launch(COLLECTIVE_KERNELS[kind])
    return max(ready, r.frontier), correlation


def _finish(members: list[tuple[_Rank, float, int]], kind: str, plan: AheadPlan, **args: Any) -> None:
    """Every member's kernel ends ``allreduce_us`` after the last member arrived."""
    last = max(arrival for _, arrival, _ in members)
    for r, arrival, correlation in members:
        r.gpu(
            "kernel",
            COLLECTIVE_KERNELS[kind],
            arrival,
            last + plan.allreduce_us - arrival,
            correlation,
            **args,
        )


def _data_parallel_step(ranks: list[_Rank], plan: AheadPlan, step: int) -> None:
    starts = {r.rank: _begin_step(r, plan) for r in ranks}
    ops = _step_ops(plan)
    position = dict.fromkeys(starts, 0)
    late: set[int] = set()
    while position[0] < len(ops):
        pending: list[tuple[_Rank, float, int]] = []
        kind = None
        for r in ranks:
            while position[r.rank] < len(ops):
                what, name = ops[position[r.rank]]
                position[r.rank] += 1
                if what == "kernel":
                    forward = plan.heavy_forward_us if r.rank == plan.heavy_rank else plan.forward_us
                    r.kernel(name, forward if name == _FORWARD else plan.backward_us
                             if name == _BACKWARD else plan.optimizer_us)  # fmt: skip
                elif what == "item":
                    if r.rank == plan.item_rank:
                        _item(r, plan)
                else:
                    kind = name
                    pending.append((r, *_arrive(r, plan, step, name, late)))
                    break
        if kind is not None:
            _finish(pending, kind, plan)
    for r in ranks:
        r.host_range("user_annotation", f"ProfilerStep#{step}", starts[r.rank], r.host - starts[r.rank])


def _pipeline_step(ranks: list[_Rank], plan: AheadPlan, step: int) -> None:
    """Stage by stage: receive from the one before, forward, send to the next (see the plan)."""
    late: set[int] = set()
    sending: tuple[_Rank, float, int, float] | None = None  # the previous stage's send and step start

    def close(r: _Rank, start: float) -> None:
        for _ in range(plan.optimizer):
            r.kernel(_OPTIMIZER, plan.optimizer_us)
        r.host_range("user_annotation", f"ProfilerStep#{step}", start, r.host - start)

    for r in ranks:
        start = _begin_step(r, plan)
        if sending is not None:
            sender, arrival, correlation, sender_start = sending
            args = {"Process Group Name": f"pp{sender.rank}", "Seq": step, "Collective name": "send"}
            _finish([(sender, arrival, correlation), (r, *_arrive(r, plan, step, "send/recv", late))],
                    "send/recv", plan, **args)  # fmt: skip
            close(sender, sender_start)
        for index in range(plan.forward):
            if index == plan.forward // 2 and r.rank == plan.item_rank:
                _item(r, plan)
            r.kernel(_FORWARD, plan.forward_us)
        if r.rank == len(ranks) - 1:
            close(r, start)
            sending = None
        else:
            sending = (r, *_arrive(r, plan, step, "send/recv", late), start)


def ahead_job_documents(plan: AheadPlan) -> list[dict[str, Any]]:
    """Each rank's trace document, by rank (see :class:`AheadPlan`)."""
    ranks = [_Rank(rank) for rank in range(plan.ranks)]
    for step in range(plan.steps):
        if plan.shape == "pipeline":
            _pipeline_step(ranks, plan, step)
        else:
            _data_parallel_step(ranks, plan, step)
    documents = []
    for r in ranks:
        shift = jitter_us(r.rank)
        for event in r.events:
            event["ts"] += shift
        documents.append(
            {
                "schemaVersion": 1,
                "deviceProperties": [{"id": 0, "name": "Test GPU"}],
                "distributedInfo": {"backend": "nccl", "rank": r.rank, "world_size": plan.ranks},
                "traceEvents": r.events,
            }
        )
    return documents


def make_ahead_job(folder: Path, plan: AheadPlan) -> list[Path]:
    """Write the host-runs-ahead job's traces (``rank-<N>.json``) into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for rank, document in enumerate(ahead_job_documents(plan)):
        path = folder / f"rank-{rank}.json"
        path.write_text(json.dumps(document, separators=(",", ":")))
        paths.append(path)
    return paths
