"""The advice the rules give: what to change, with a concrete before/after."""

from __future__ import annotations

from typing import Final

from traceinsight.analysis.launching import CompileState
from traceinsight.rules.findings import Advice

ITEM: Final = Advice(
    summary='`.item()` (also `print(tensor)`, `float(tensor)`, `f"{loss}"`) copies a GPU value to the '
    "host and waits for it. Keep the value on the GPU and read it rarely: accumulate losses in a "
    "tensor and call .item() once every N steps, or after the loop.",
    before="for x, y in loader:\n    loss = step(x, y)\n    print(loss.item())  # waits for the GPU every step",
    after="running = torch.zeros((), device=device)\nfor i, (x, y) in enumerate(loader):\n"
    "    loss = step(x, y)\n    running += loss.detach()\n    if i % 100 == 0:\n"
    "        print((running / 100).item())  # one wait per 100 steps\n        running.zero_()",
)
BRANCH: Final = Advice(
    summary="A Python `if` on a GPU tensor makes the host wait for it. Branch on the GPU with "
    "torch.where / masking, or decide from values already on the host.",
    before="def forward(self, x):\n    if x.sum() > 0:  # reads a GPU value: the host waits\n"
    "        x = self.a(x)\n    return x",
    after="def forward(self, x):\n    return torch.where(x.sum() > 0, self.a(x), x)  # stays on the GPU",
)
PINNED_COPY: Final = Advice(
    summary="Copy from pinned memory without blocking: `pin_memory=True` in the DataLoader and "
    "`.to(device, non_blocking=True)`, so the host queues the copy and keeps launching work.",
    before="loader = DataLoader(ds, batch_size=64)\nfor x, y in loader:\n"
    "    x = x.to('cuda')  # pageable: the host waits for the copy",
    after="loader = DataLoader(ds, batch_size=64, pin_memory=True)\nfor x, y in loader:\n"
    "    x = x.to('cuda', non_blocking=True)",
)
TO_HOST: Final = Advice(
    summary="Moving a GPU tensor to the host (`.cpu()`, `.numpy()`, `.tolist()`, `torch.nonzero`, "
    "boolean-mask indexing) waits for all queued work. Do it less often, batch it, or keep the "
    "computation on the GPU.",
    before="for batch in loader:\n    out = model(batch)\n    preds.append(out.argmax(1).cpu())  # waits every step",
    after="for batch in loader:\n    out = model(batch)\n    preds.append(out.argmax(1))  # stay on the GPU\n"
    "preds = torch.cat(preds).cpu()  # one wait at the end",
)
DATA_DEPENDENT: Final = Advice(
    summary="An operation whose output size depends on GPU data (`torch.nonzero`, `masked_select`, "
    "boolean-mask indexing, `unique`) must read the data on the host first. Keep shapes fixed: use "
    "masks and `torch.where`, or compute the sizes once on the host.",
    before="idx = torch.nonzero(mask)  # the host waits to learn how many\nx = x[idx]",
    after="x = x * mask  # same shape, no wait; or torch.where(mask, x, 0)",
)
EXPLICIT_SYNC: Final = Advice(
    summary="An explicit synchronize in the loop stops the host from queueing ahead. Remove it, or "
    "wait on a CUDA event for just the work you need.",
    before="for batch in loader:\n    step(batch)\n    torch.cuda.synchronize()",
    after="for batch in loader:\n    step(batch)\n# synchronize once, only where a wall-clock time is needed",
)
PREFETCH: Final = Advice(
    summary="Overlap input copies with compute: copy the next batch on a side stream from pinned "
    "memory while the current one computes.",
    before="for x, y in loader:\n    x, y = x.cuda(), y.cuda()\n    loss = step(x, y)",
    after="stream = torch.cuda.Stream()\nit = iter(loader)  # DataLoader(..., pin_memory=True)\n"
    "with torch.cuda.stream(stream):\n    nxt = [t.cuda(non_blocking=True) for t in next(it)]\n"
    "for batch in it:\n    torch.cuda.current_stream().wait_stream(stream)\n    x, y = nxt\n"
    "    with torch.cuda.stream(stream):\n        nxt = [t.cuda(non_blocking=True) for t in batch]\n"
    "    loss = step(x, y)",
)
WORKERS: Final = Advice(
    summary="Load batches in parallel and ahead of time: num_workers > 0 (start with the CPU "
    "core count / GPUs), pin_memory=True, persistent_workers=True, prefetch_factor=2-4.",
    before="loader = DataLoader(dataset, batch_size=64, shuffle=True)",
    after="loader = DataLoader(\n    dataset, batch_size=64, shuffle=True,\n    num_workers=8, "
    "pin_memory=True,\n    persistent_workers=True, prefetch_factor=4,\n)",
)
LAUNCH_BOUND: Final = Advice(
    summary="The host cannot launch kernels as fast as the GPU runs them. Launch fewer, larger "
    "kernels: fuse small ops with torch.compile, replay the step as a CUDA graph, or give each "
    "kernel more work (a larger batch).",
    before="model = MyModel().cuda()\nfor x in loader:\n    loss = model(x)  # hundreds of µs-scale kernels",
    after='model = torch.compile(MyModel().cuda(), mode="reduce-overhead")  # fused + CUDA graphs\n'
    "for x in loader:\n    loss = model(x)",
)
LAUNCH_BOUND_COMPILED: Final = Advice(
    summary="The model is already compiled, yet the host still launches kernels more slowly than "
    "the GPU runs them. Remove the launches that remain: replay each compiled graph as a CUDA graph "
    '(mode="reduce-overhead": one launch per graph), and find the graph breaks that leave eager code '
    "between compiled regions (TORCH_LOGS=graph_breaks); or give each kernel more work (a larger batch).",
    before="model = torch.compile(model)\nfor x in loader:\n    loss = model(x)  # compiled: still one launch per kernel",
    after='model = torch.compile(model, mode="reduce-overhead")  # CUDA graphs: one launch per graph\n'
    "# TORCH_LOGS=graph_breaks python train.py  names the eager code between graphs\n"
    "for x in loader:\n    loss = model(x)",
)
LAUNCH_BOUND_GRAPHED: Final = Advice(
    summary="The model is compiled and replays CUDA graphs, yet the host still launches kernels more "
    "slowly than the GPU runs them: the launches left run outside the graphs. Find what keeps them "
    "out: graph breaks (TORCH_LOGS=graph_breaks), inputs whose shapes change (each new shape runs "
    "eagerly or records a new graph: TORCH_LOGS=cudagraphs), work between the compiled calls.",
    before='model = torch.compile(model, mode="reduce-overhead")\nfor x in loader:\n'
    "    loss = model(x)  # some kernels still launched one by one",
    after="# TORCH_LOGS=graph_breaks,cudagraphs python train.py\n"
    'model = torch.compile(model, mode="reduce-overhead")\n'
    "for x in loader:\n    x = pad_to_bucket(x)  # fixed shapes: one graph per bucket, replayed\n"
    "    loss = model(x)",
)
LAUNCH_BOUND_PARTLY_COMPILED: Final = Advice(
    summary="Only part of the model is compiled: most kernels are still launched one by one from "
    "eager code, and the host cannot launch them as fast as the GPU runs them. Compile the whole "
    "model (not one function), remove the graph breaks that leave eager code between compiled "
    "regions (TORCH_LOGS=graph_breaks), and replay the graphs as CUDA graphs "
    '(mode="reduce-overhead").',
    before="model.block = torch.compile(model.block)  # the rest of the model runs eagerly\n"
    "for x in loader:\n    loss = model(x)",
    after='model = torch.compile(model, mode="reduce-overhead")  # the whole model, CUDA graphs\n'
    "# TORCH_LOGS=graph_breaks python train.py  names the eager code between graphs\n"
    "for x in loader:\n    loss = model(x)",
)
HOST_PAUSES: Final = Advice(
    summary="Between these kernels the host paused for long stretches (Python, many small CPU "
    "operators, I/O, logging, a sleep, a slow first call), not the many short gaps of launch "
    "overhead: CUDA graphs or torch.compile would not remove them. Find the code (profile "
    "with_stack=True, or traceinsight run), then run it less often, move it out of the step (into "
    "DataLoader workers, before the loop), or queue the GPU's work before it so the GPU has "
    "something to do meanwhile; a one-time pause (a first call) belongs in a warm-up step.",
    before="for x, y in loader:\n    loss = step(x, y)\n    log_metrics(model)  # milliseconds of Python while the GPU waits",
    after="for i, (x, y) in enumerate(loader):\n    loss = step(x, y)\n    if i % 100 == 0:\n"
    "        log_metrics(model)  # rarely, or in a background thread",
)


def launch_bound(compiled: CompileState) -> Advice:
    """The launch-bound advice for the model's compile state: compile it (all of it, when a part
    is); already compiled, replay CUDA graphs; already replaying graphs, find what runs outside them."""
    if compiled.partly:
        return LAUNCH_BOUND_PARTLY_COMPILED
    if not compiled.compiled:
        return LAUNCH_BOUND
    return LAUNCH_BOUND_GRAPHED if compiled.graph_launches else LAUNCH_BOUND_COMPILED


PREPROCESSING: Final = Advice(
    summary="Prepare batches off the critical path: move decoding, resizing and augmentation into the "
    "Dataset so DataLoader workers do it while the GPU runs the step before (num_workers > 0, "
    "pin_memory=True, prefetch_factor), or do it on the GPU (torchvision.io.decode_jpeg(device='cuda'), "
    "transforms on CUDA tensors, NVIDIA DALI).",
    before="for path, label in samples:\n    clip = preprocess(decode_video(path))  # on the host, every step\n"
    "    loss = step(clip.cuda(), label.cuda())",
    after="class Clips(Dataset):\n    def __getitem__(self, i):\n"
    "        return preprocess(decode_video(self.paths[i])), self.labels[i]  # in a worker\n"
    "loader = DataLoader(Clips(paths, labels), num_workers=8, pin_memory=True, prefetch_factor=4)\n"
    "for clip, label in loader:\n    loss = step(clip.cuda(non_blocking=True), label.cuda(non_blocking=True))",
)
HOST_WORK: Final = Advice(
    summary="The host runs these operators itself while the GPU waits. Move such work out of the "
    "step: into the Dataset (it then runs in DataLoader workers), before the loop, or onto the GPU.",
    before="for x, y in loader:\n    x = torch.from_numpy(augment(x.numpy()))  # CPU work in the step\n"
    "    loss = step(x.cuda(), y.cuda())",
    after="class Augmented(Dataset):\n    def __getitem__(self, i):\n"
    "        return augment(self.base[i])  # runs in worker processes\n"
    "loader = DataLoader(Augmented(base), num_workers=8, pin_memory=True)",
)
DEPENDENCY: Final = Advice(
    summary="The GPU had the next work but waited on another stream or an event. Wait only for the "
    "work you need (an event recorded right after it, not a whole stream), and check that the "
    "stream you wait on was not itself waiting for the host.",
    before="side = torch.cuda.Stream()\nwith torch.cuda.stream(side):\n    a = prepare(x)\n"
    "    b = other(x)\ntorch.cuda.current_stream().wait_stream(side)  # waits for `other` too\nout = model(a)",
    after="side = torch.cuda.Stream()\nready = torch.cuda.Event()\nwith torch.cuda.stream(side):\n"
    "    a = prepare(x)\n    ready.record()\n    b = other(x)\n"
    "torch.cuda.current_stream().wait_event(ready)  # waits for `prepare` only\nout = model(a)",
)
DEPENDENCY_IN_GRAPH: Final = Advice(
    summary="The GPU had its next work queued but waited inside CUDA graph replays: a node of the graph "
    "waited on something outside it, an event recorded on another stream or by communication with "
    "other ranks (an all-to-all, a send/recv), or a host node. The trace does not show a graph's "
    "insides: profile one step with the graph off (eagerly) to see which wait it is, then start what "
    "the graph waits for earlier, or overlap it with the graph's own work.",
    before="graph.replay()  # its nodes wait for the exchange on another stream before they run",
    after="# profile once without the graph to see the order of waits:\n"
    "with torch.profiler.profile(activities=[...]) as prof:\n    step_eager(batch)\n"
    "# then issue the exchange earlier (for the next batch) so the graph finds it done\n"
    "start_exchange(next_batch)\ngraph.replay()",
)
UNTRACED: Final = Advice(
    summary="Nothing was recorded on the host during these gaps (not launch overhead): record Python "
    "stacks to see what it was doing (Python code outside any operator, a sleep, I/O, a lock, "
    "waiting on another thread).",
    before="with torch.profiler.profile(activities=[...]) as prof:\n    train()",
    after="with torch.profiler.profile(activities=[...], with_stack=True) as prof:\n    train()\n"
    "# or: traceinsight run train.py (records stacks of your own code)",
)
COMMUNICATION: Final = Advice(
    summary="The host waits for communication between ranks. Overlap it with compute: let DDP "
    "bucket gradients during backward, skip needless all-reduces with `no_sync()` under gradient "
    "accumulation, and avoid collectives whose result the host reads right away.",
    before="for i, batch in enumerate(loader):\n    loss = model(batch).mean()\n    loss.backward()  # all-reduce every micro-batch",
    after="for i, batch in enumerate(loader):\n    ctx = model.no_sync() if (i + 1) % accum else contextlib.nullcontext()\n"
    "    with ctx:\n        loss = model(batch).mean()\n        loss.backward()  # all-reduce once per accumulation",
)
PER_PARAMETER_LOOP: Final = Advice(
    summary="Gradients are all-reduced one parameter at a time: hundreds of small collectives per "
    "step, each paying NCCL's latency and a launch, after backward instead of during it. Use "
    "DistributedDataParallel (it all-reduces gradients in buckets of bucket_cap_mb=25 while "
    "backward still runs), or flatten the gradients into a few buckets and all-reduce those.",
    before="loss.backward()\nfor p in model.parameters():\n    dist.all_reduce(p.grad)  # one collective per parameter\n"
    "    p.grad /= world_size",
    after="model = DDP(model, device_ids=[rank])  # bucketed all-reduces overlap backward\nloss.backward()\n"
    "# or by hand, one all-reduce for all gradients:\ngrads = [p.grad for p in model.parameters()]\n"
    "flat = torch._utils._flatten_dense_tensors(grads)\ndist.all_reduce(flat)\n"
    "for g, synced in zip(grads, torch._utils._unflatten_dense_tensors(flat, grads)):\n"
    "    g.copy_(synced / world_size)",
)
PER_PARAMETER_DDP: Final = Advice(
    summary="DDP all-reduces gradients in hundreds of small pieces per step: each pays NCCL's latency "
    "and a launch. Fewer, larger buckets overlap backward better: raise bucket_cap_mb (default 25), "
    "and check that no per-parameter hook or communication hook all-reduces each gradient alone.",
    before="model = DDP(model, device_ids=[rank], bucket_cap_mb=1)",
    after="model = DDP(model, device_ids=[rank], bucket_cap_mb=25,  # or more: fewer, larger all-reduces\n"
    "            gradient_as_bucket_view=True)",
)
PER_PARAMETER_FSDP: Final = Advice(
    summary="FSDP gathers and reduces each wrapped module with collectives of its own: hundreds of "
    "small ones per step mean the wrapping is too fine. Wrap larger blocks (one transformer layer "
    "each) so each all-gather and reduce-scatter carries a whole block, and prefetch the next one.",
    before="model = FSDP(model, auto_wrap_policy=size_based_auto_wrap_policy)  # tiny units",
    after="policy = functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})\n"
    "model = FSDP(model, auto_wrap_policy=policy, forward_prefetch=True)",
)
ASYNC_EXCHANGE: Final = Advice(
    summary="The GPU waits for an exchange between ranks (all-to-all, send/recv) with nothing to "
    "compute meanwhile. Start it asynchronously and wait only where its result is needed, so "
    "independent compute runs under it; pipeline the exchange for the next batch with this "
    "batch's compute (TorchRec's TrainPipelineSparseDist does this for embeddings).",
    before="dist.all_to_all_single(output, input)  # compute waits for the exchange\n"
    "dense = model.dense(x)\nout = model.over(output, dense)",
    after="work = dist.all_to_all_single(output, input, async_op=True)\n"
    "dense = model.dense(x)  # runs while the exchange is in flight\nwork.wait()\n"
    "out = model.over(output, dense)",
)
FSDP_OVERLAP: Final = Advice(
    summary="FSDP's all-gathers and reduce-scatters run with no compute under them. Prefetch the "
    "next unit's parameters while the current one computes (forward_prefetch, "
    "backward_prefetch=BACKWARD_PRE), and keep the units large enough to hide each collective.",
    before="model = FSDP(model, auto_wrap_policy=policy)",
    after="model = FSDP(model, auto_wrap_policy=policy, forward_prefetch=True,\n"
    "             backward_prefetch=BackwardPrefetch.BACKWARD_PRE)",
)
DDP_BUFFERS: Final = Advice(
    summary="The host spends the gap in DDP's own work: at every forward DDP broadcasts the module's "
    "buffers (BatchNorm running statistics) from rank 0, flattening and unflattening them on the "
    "host while the GPU waits. If the buffers need not match on every step, turn the broadcast "
    "off; for synchronized batch statistics use SyncBatchNorm instead.",
    before="model = DDP(model, device_ids=[rank])  # broadcast_buffers=True: every forward",
    after="model = DDP(model, device_ids=[rank], broadcast_buffers=False)\n"
    "# or, before wrapping: model = nn.SyncBatchNorm.convert_sync_batchnorm(model)",
)
PIPELINE: Final = Advice(
    summary="The model is split across GPUs and each batch passes through the stages one after the "
    "other, so each GPU waits while the others work. Split each batch into micro-batches and pipeline "
    "them, so GPU 0 works on micro-batch k+1 while GPU 1 works on micro-batch k: "
    "torch.distributed.pipelining (ScheduleGPipe, Schedule1F1B), or by hand as below. If the model "
    "fits on one GPU, data parallelism (DDP) keeps every GPU busy instead.",
    before="def forward(self, x):\n    x = self.stage0(x.to('cuda:0'))\n"
    "    return self.stage1(x.to('cuda:1'))  # GPU 0 idles while GPU 1 runs, and back",
    after="def forward(self, x, chunks=4):  # micro-batches: the stages overlap\n"
    "    outs, prev = [], None\n    for part in x.split(x.size(0) // chunks):\n"
    "        nxt = self.stage0(part.to('cuda:0')).to('cuda:1')  # GPU 0: micro-batch k+1 ...\n"
    "        if prev is not None:\n            outs.append(self.stage1(prev))  # ... GPU 1: micro-batch k\n"
    "        prev = nxt\n    outs.append(self.stage1(prev))\n    return torch.cat(outs)",
)
DDP_FORWARD: Final = Advice(
    summary="The host spends the gap inside DDP's forward, in DDP's own work: broadcasting the "
    "module's buffers from rank 0 at every step (broadcast_buffers=True) and, with "
    "find_unused_parameters=True, walking the autograd graph after each forward to find the "
    "parameters that got no gradient. Turn off what the model does not need; static_graph=True "
    "lets DDP plan its buckets once.",
    before="model = DDP(model, device_ids=[rank], find_unused_parameters=True)",
    after="model = DDP(model, device_ids=[rank], broadcast_buffers=False,  # or SyncBatchNorm\n"
    "            find_unused_parameters=False, static_graph=True)",
)
AMP: Final = Advice(
    summary="Run matrix multiplies and convolutions on tensor cores: autocast the forward pass to "
    "fp16 (with a GradScaler) or bf16. Weights stay fp32; the GEMMs run several times faster.",
    before="for x, y in loader:\n    loss = loss_fn(model(x), y)\n    loss.backward()\n    optimizer.step()",
    after="scaler = torch.amp.GradScaler('cuda')\nfor x, y in loader:\n"
    "    with torch.autocast('cuda', dtype=torch.float16):  # bf16 on Ampere+: no scaler needed\n"
    "        loss = loss_fn(model(x), y)\n    scaler.scale(loss).backward()\n"
    "    scaler.step(optimizer)\n    scaler.update()",
)
EFFICIENCY: Final = Advice(
    summary="Make the matrix work bigger and better shaped: batch many small GEMMs (larger batch, "
    "fused or grouped projections), keep dimensions multiples of 8 (16 for fp8) for tensor cores, "
    "run in bf16 where fp32 is not needed, and let torch.compile fuse the memory-bound work between them.",
    before="q, k, v = q_proj(x), k_proj(x), v_proj(x)  # three small GEMMs",
    after="q, k, v = qkv_proj(x).chunk(3, dim=-1)  # one GEMM three times as wide\n"
    "model = torch.compile(model)  # fuses the elementwise work around it",
)
TF32: Final = Advice(
    summary="Let fp32 matrix multiplies use TF32 tensor cores (Ampere and newer): one line, fp32 "
    "range, about 10 bits of mantissa. For more, autocast to bf16.",
    before="model = MyModel().cuda()",
    after="torch.backends.cuda.matmul.allow_tf32 = True  # or torch.set_float32_matmul_precision('high')\n"
    "torch.backends.cudnn.allow_tf32 = True\nmodel = MyModel().cuda()",
)
DDP: Final = Advice(
    summary="nn.DataParallel drives every GPU from one Python process (one GIL) and copies the model "
    "each step. Use DistributedDataParallel: one process per GPU, gradients all-reduced in "
    "buckets during backward.",
    before="model = nn.DataParallel(MyModel()).cuda()",
    after="# torchrun --nproc-per-node NUM_GPUS train.py\ndist.init_process_group('nccl')\n"
    "local_rank = int(os.environ['LOCAL_RANK'])\ntorch.cuda.set_device(local_rank)\n"
    "model = DDP(MyModel().cuda(local_rank), device_ids=[local_rank])",
)
FUSED_OPTIMIZER: Final = Advice(
    summary="The optimizer updates one parameter at a time: a few small kernels per parameter, each "
    "a launch. Use the multi-tensor implementations: fused=True (one kernel for all parameters; "
    "Adam, AdamW, SGD, Adagrad) or foreach=True (the other torch.optim classes).",
    before="optimizer = Optimizer(model.parameters(), lr=lr)  # your torch.optim class",
    after="optimizer = Optimizer(model.parameters(), lr=lr, foreach=True)  # or fused=True",
)
#: torch.optim classes with a fused implementation (``fused=True``, torch 2.x), and their usual
#: arguments for the example.
_FUSED_OPTIMIZERS: Final = {
    "SGD": "lr=0.1, momentum=0.9",
    "Adam": "lr=1e-3",
    "AdamW": "lr=1e-3",
    "Adagrad": "lr=1e-2",
}
#: torch.optim classes with only a multi-tensor (``foreach=True``) implementation.
_FOREACH_OPTIMIZERS: Final = frozenset({"Adamax", "NAdam", "RAdam", "RMSprop", "Rprop", "ASGD", "Adadelta"})


def fused_optimizer(name: str | None) -> Advice:
    """The advice for an optimizer that updates one parameter at a time, in the trace's own class:
    ``fused=True`` where torch has a fused kernel, ``foreach=True`` where it has only the
    multi-tensor one; a class torch does not have is the user's, updated with ``torch._foreach_*``."""
    if name in _FUSED_OPTIMIZERS:
        arguments = _FUSED_OPTIMIZERS[name]
        return Advice(
            summary=f"{name} updates one parameter at a time: a few small kernels per parameter, each a "
            "launch. Use its multi-tensor implementations: fused=True (one kernel for all parameters, "
            "torch 2.x) or foreach=True (a few kernels per parameter group).",
            before=f"optimizer = torch.optim.{name}(model.parameters(), {arguments})",
            after=f"optimizer = torch.optim.{name}(model.parameters(), {arguments}, fused=True)\n"
            "# or foreach=True where fused is not available for your device or dtype",
        )
    if name in _FOREACH_OPTIMIZERS:
        return Advice(
            summary=f"{name} updates one parameter at a time: a few small kernels per parameter, each a "
            "launch. Use its multi-tensor implementation: foreach=True (torch has no fused "
            f"{name}; Adam/AdamW/SGD/Adagrad have fused=True).",
            before=f"optimizer = torch.optim.{name}(model.parameters(), lr=1e-3)",
            after=f"optimizer = torch.optim.{name}(model.parameters(), lr=1e-3, foreach=True)",
        )
    if name is None:
        return FUSED_OPTIMIZER
    return Advice(
        summary=f"{name}.step() updates one parameter at a time: a few small kernels per parameter, each "
        "a launch. Update all parameters at once with torch's multi-tensor ops (torch._foreach_*), as "
        "torch.optim's foreach implementations do, or use a torch.optim class with fused=True.",
        before="for p, m in zip(params, momenta):  # inside step(): kernels per parameter\n"
        "    m.mul_(beta).add_(p.grad)\n    p.add_(m, alpha=-lr)",
        after="grads = [p.grad for p in params]\ntorch._foreach_mul_(momenta, beta)  # one launch for all\n"
        "torch._foreach_add_(momenta, grads)\ntorch._foreach_add_(params, momenta, alpha=-lr)",
    )


SET_TO_NONE: Final = Advice(
    summary="zero_grad() writes zeros into every gradient, a kernel each. Setting them to None "
    "instead skips the kernels (the default since torch 2.0).",
    before="optimizer.zero_grad()",
    after="optimizer.zero_grad(set_to_none=True)",
)
ALLOCATOR_CHURN: Final = Advice(
    summary="PyTorch's caching allocator keeps freed blocks for reuse, so a loop at its usual pace "
    "never calls cudaMalloc/cudaFree. Calls every step mean the cache is emptied "
    "(torch.cuda.empty_cache() in the loop) or cannot serve the requests (fragmentation: varying "
    "shapes). Remove empty_cache() from the loop; with varying shapes, let the allocator grow "
    "segments in place instead of allocating new ones.",
    before="for x, y in loader:\n    loss = step(x, y)\n"
    "    torch.cuda.empty_cache()  # frees the cache: the next step allocates it again",
    after="# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True python train.py\n"
    "for x, y in loader:\n    loss = step(x, y)  # blocks reused from the cache, no cudaMalloc",
)
NEAR_MEMORY_LIMIT: Final = Advice(
    summary="The GPU is nearly full: the next larger batch or longer sequence runs out of memory, "
    "and near the limit the allocator frees its cache and retries (synchronizing cudaFree and "
    "cudaMalloc calls). Hold less: mixed precision halves activations, activation checkpointing "
    "recomputes them in backward instead of keeping them, a smaller batch with gradient "
    "accumulation keeps the effective batch; expandable segments cut fragmentation.",
    before="for x, y in loader:  # batch_size=64\n    loss = model(x).loss\n    loss.backward()",
    after="# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True; DataLoader(ds, batch_size=32)\n"
    "for i, (x, y) in enumerate(loader):\n    with torch.autocast('cuda', dtype=torch.bfloat16):\n"
    "        loss = model(x).loss / 2  # or torch.utils.checkpoint on the big blocks\n"
    "    loss.backward()\n    if i % 2 == 1:\n        optimizer.step(); optimizer.zero_grad()",
)

#: Framework code that syncs by design (:data:`traceinsight.load.taxonomy.DESIGNED_SYNCS`): what
#: makes the calls (for a title), why it reads values on the host, and what the user can change.
#: Its waits are not the user's ``if`` or ``.item()``, so the usual advice would not apply.
DESIGNED_SYNC: Final[dict[str, tuple[str, str, Advice]]] = {
    "torch.optim.LBFGS": (
        "`torch.optim.LBFGS.step(closure)`",
        "its convergence tests and its line search read the loss and gradient norms on the host",
        Advice(
            summary="These waits are LBFGS's own: each inner iteration of `step(closure)` reads the loss "
            "and gradient norms on the host to test convergence (and its line search compares values "
            "there), so there is no `if` or `.item()` of yours to remove. What you can change: fewer "
            "iterations per step (a smaller `max_iter` or `max_eval`, or looser `tolerance_grad` / "
            "`tolerance_change` so it stops sooner), more GPU work per read (a larger batch per step), "
            "or, if the waits dominate, a first-order optimizer (Adam, AdamW) that never reads values "
            "on the host.",
            before="opt = torch.optim.LBFGS(model.parameters())  # max_iter=20: several host reads each\n"
            "opt.step(closure)",
            after="opt = torch.optim.LBFGS(model.parameters(), max_iter=5)  # fewer reads per step\n"
            "opt.step(closure)",
        ),
    ),
    "torch.amp.GradScaler": (
        "`GradScaler.step`",
        "it reads on the host whether any gradient is inf/NaN before stepping",
        Advice(
            summary="GradScaler.step checks on the host whether any gradient is inf/NaN before it calls "
            "`optimizer.step()`: one wait per step, by design, not a line of yours. A fused optimizer "
            "takes the check on the GPU instead (`fused=True` on Adam, AdamW, SGD or Adagrad: "
            "GradScaler hands it the scale and the inf flag), and bf16 autocast needs no GradScaler.",
            before="opt = torch.optim.AdamW(model.parameters())\nscaler.step(opt)  # reads found_inf on the host",
            after="opt = torch.optim.AdamW(model.parameters(), fused=True)\n"
            "scaler.step(opt)  # the fused step skips itself on inf: no host read",
        ),
    ),
    "torch.optim.lr_scheduler.ReduceLROnPlateau": (
        "`ReduceLROnPlateau.step(metric)`",
        "it turns the metric into a Python float",
        Advice(
            summary="ReduceLROnPlateau turns its metric into a Python float: given a GPU tensor, it "
            "waits for the GPU. Step it once per epoch with a validation metric already on the host, "
            "not every step with the training loss.",
            before="for x, y in loader:\n    loss = step(x, y)\n    scheduler.step(loss)  # a GPU tensor, every step",
            after="for epoch in range(epochs):\n    train_one_epoch()\n"
            "    scheduler.step(evaluate())  # a Python float, once per epoch",
        ),
    ),
    "torch.nn.utils.clip_grad_norm_": (
        "`clip_grad_norm_(..., error_if_nonfinite=True)`",
        "it reads the total norm on the host to raise on inf/NaN",
        Advice(
            summary="With `error_if_nonfinite=True`, clip_grad_norm_ reads the total norm on the host to "
            "raise on inf/NaN: a wait every step. Leave it off (the default) and check the returned "
            "norm now and then.",
            before="torch.nn.utils.clip_grad_norm_(params, 1.0, error_if_nonfinite=True)",
            after="norm = torch.nn.utils.clip_grad_norm_(params, 1.0)\n"
            "if step % 100 == 0 and not torch.isfinite(norm):  # one host read per 100 steps\n"
            "    raise RuntimeError('non-finite gradients')",
        ),
    ),
    "torch.distributions": (
        "Argument validation in `torch.distributions`",
        "`validate_args` checks parameters and values on the host",
        Advice(
            summary="A distribution checks its parameters when it is made, and each value in "
            "`log_prob`, on the host while `validate_args` is on (the default unless Python runs "
            "with -O): each check waits for the GPU. Turn validation off once the code is known "
            "to be right.",
            before="dist = torch.distributions.Categorical(logits=logits)  # validates on the host",
            after="torch.distributions.Distribution.set_default_validate_args(False)  # once, at start\n"
            "dist = torch.distributions.Categorical(logits=logits)  # or validate_args=False",
        ),
    ),
    "torch.nn.TransformerEncoder": (
        "`nn.TransformerEncoder`'s fast path",
        "it reads the padding mask's sizes on the host to make nested tensors",
        Advice(
            summary="Without gradients, nn.TransformerEncoder turns a padded batch with "
            "`src_key_padding_mask` into nested tensors, whose sizes it reads on the host, and "
            "guesses `is_causal` from an attention `mask` by comparing it there. Build it with "
            "`enable_nested_tensor=False`, and with a `mask` pass `is_causal=` yourself.",
            before="encoder = nn.TransformerEncoder(layer, num_layers)\n"
            "out = encoder(x, src_key_padding_mask=pad)",
            after="encoder = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)\n"
            "out = encoder(x, src_key_padding_mask=pad)  # a padded batch: no host read",
        ),
    ),
    "transformers attention-mask check": (
        "transformers' attention-mask check",
        "it reads the mask on the host to see whether SDPA can drop it",
        Advice(
            summary="transformers checks on the host whether the attention mask is all ones, so that SDPA "
            "can drop it and take its causal fast path: one wait per forward, inside the library, not "
            "an `if` of yours. A batch without padding needs no mask: pass `attention_mask=None` and the "
            "check is skipped; under `torch.compile` it is skipped too.",
            before="out = model(input_ids, attention_mask=torch.ones_like(input_ids))  # read on the host",
            after="out = model(input_ids)  # no padding, no mask: no host read",
        ),
    ),
}
