"""The advice the rules give: what to change, with a concrete before/after."""

from __future__ import annotations

from typing import Final

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
UNTRACED: Final = Advice(
    summary="The launching thread recorded nothing during these gaps: record Python stacks to see "
    "what it was doing (Python code outside any operator, a lock, waiting on another thread).",
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
AMP: Final = Advice(
    summary="Run matrix multiplies and convolutions on tensor cores: autocast the forward pass to "
    "fp16 (with a GradScaler) or bf16. Weights stay fp32; the GEMMs run several times faster.",
    before="for x, y in loader:\n    loss = loss_fn(model(x), y)\n    loss.backward()\n    optimizer.step()",
    after="scaler = torch.amp.GradScaler('cuda')\nfor x, y in loader:\n"
    "    with torch.autocast('cuda', dtype=torch.float16):  # bf16 on Ampere+: no scaler needed\n"
    "        loss = loss_fn(model(x), y)\n    scaler.scale(loss).backward()\n"
    "    scaler.step(optimizer)\n    scaler.update()",
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
    "a launch. Use the multi-tensor implementations: fused=True (one kernel for all parameters) "
    "or foreach=True.",
    before="optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)",
    after="optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, fused=True)",
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
