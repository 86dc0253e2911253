"""Classification rules for trace events, as named data in one place.

Which categories are GPU activity, which host calls block, how a copy name splits into direction
and memory kinds, which annotation names mark steps or the DataLoader, which Python frames are the
user's own code. Loader and analyses import these; nothing else hard-codes a name.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Collection
from typing import Final

from traceinsight.compat import StrEnum
from traceinsight.model import Model

# --- categories (current name and the 2021 legacy name map to one table) -----------------------

#: ``cat`` → kind of GPU activity. Only these count as GPU busy time.
GPU_ACTIVITY_CATEGORIES: Final[dict[str, str]] = {
    "kernel": "kernel",
    "Kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "Memcpy": "memcpy",
    "gpu_memset": "memset",
    "Memset": "memset",
}
RUNTIME_CATEGORIES: Final[frozenset[str]] = frozenset({"cuda_runtime", "cuda_driver", "Runtime"})
CPU_OP_CATEGORIES: Final[frozenset[str]] = frozenset({"cpu_op", "Operator"})
ANNOTATION_CATEGORIES: Final[frozenset[str]] = frozenset({"user_annotation"})
GPU_ANNOTATION_CATEGORIES: Final[frozenset[str]] = frozenset({"gpu_user_annotation"})
PYTHON_CATEGORIES: Final[frozenset[str]] = frozenset({"python_function"})
CUDA_SYNC_CATEGORIES: Final[frozenset[str]] = frozenset({"cuda_sync"})

#: ``cat`` of activity on accelerators that are not CUDA or ROCm GPUs, which traceinsight cannot read
#: (their device work is not kernels, copies or memsets), → the accelerator's name. Kineto writes
#: MTIA's device work as ``mtia_ccp_events`` on "MTIA N" rows (pid = device) and its host calls as
#: ``mtia_runtime``; Gaudi's as ``hpu_op``; Intel XPU's host calls as ``xpu_runtime``; a custom
#: PrivateUse1 backend's as ``privateuse1_*``.
UNREADABLE_ACCELERATOR_CATEGORIES: Final[dict[str, str]] = {
    "mtia_ccp_events": "MTIA",
    "mtia_runtime": "MTIA",
    "mtia_insight": "MTIA",
    "mtia_counters": "MTIA",
    "mtia_workloadd": "MTIA",
    "hpu_op": "HPU (Intel Gaudi)",
    "xpu_runtime": "Intel XPU",
    "xpu_driver": "Intel XPU",
    "privateuse1_runtime": "a custom (PrivateUse1) accelerator",
    "privateuse1_driver": "a custom (PrivateUse1) accelerator",
}


class ForeignAccelerator(Model, frozen=True):
    """Activity of an accelerator traceinsight cannot read: its name and the events that show it."""

    name: str
    #: (category, events) of each of its categories in the trace, most events first.
    categories: tuple[tuple[str, int], ...]

    @property
    def events(self) -> str:
        """``1,313 mtia_ccp_events and 823 mtia_runtime events``."""
        parts = [f"{count:,} {category}" for category, count in self.categories]
        return (", ".join(parts[:-1]) + " and " + parts[-1] if len(parts) > 1 else parts[0]) + " events"


def foreign_accelerator(categories: Collection[tuple[str, int]]) -> ForeignAccelerator | None:
    """The unreadable accelerator whose categories (:data:`UNREADABLE_ACCELERATOR_CATEGORIES`) hold
    the most events among ``categories`` (``(cat, events)`` pairs), or None."""
    found: dict[str, list[tuple[str, int]]] = {}
    for category, count in categories:
        name = UNREADABLE_ACCELERATOR_CATEGORIES.get(category)
        if name is not None and count > 0:
            found.setdefault(name, []).append((category, count))
    if not found:
        return None
    name, seen = max(found.items(), key=lambda item: (sum(count for _, count in item[1]), item[0]))
    return ForeignAccelerator(name, tuple(sorted(seen, key=lambda item: (-item[1], item[0]))))


# --- annotations ---------------------------------------------------------------------------------

STEP_PATTERN: Final[re.Pattern[str]] = re.compile(r"^ProfilerStep#(\d+)$")
DATALOADER_PREFIX: Final[str] = "enumerate(DataLoader)#"
OPTIMIZER_STEP_PREFIX: Final[str] = "Optimizer.step#"

#: 2021 traces record annotations as ``Operator`` events; names with these prefixes are annotations.
LEGACY_ANNOTATION_PREFIXES: Final[tuple[str, ...]] = (
    "ProfilerStep#",
    DATALOADER_PREFIX,
    "Optimizer.step#",
    "Optimizer.zero_grad#",
)


def is_dataloader_next(name: str) -> bool:
    """True for ``enumerate(DataLoader)#<Iter>.__next__`` (serial or multi-process)."""
    return name.startswith(DATALOADER_PREFIX) and name.endswith("__next__")


# --- communication ---------------------------------------------------------------------------------

#: GPU kernels that move data between ranks (NCCL/RCCL collectives, send/recv, custom all-reduce):
#: their own busy class, apart from compute. A regex over the kernel name.
COMMUNICATION_KERNEL_PATTERN: Final[str] = (
    r"(?i)nccl|rccl|all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|sendrecv|cross_device_reduce"
)
#: Host operators that issue or wait for communication (``c10d::allreduce_``, ``record_param_comms``,
#: gloo/NCCL ranges, vLLM's collectives). A regex over the operator name.
COMMUNICATION_OP_PATTERN: Final[str] = (
    r"^(c10d::|c10d_functional::|_c10d_functional::|record_param_comms|nccl:|gloo:|symm_mem::)"
    r"|^vllm::all_|ProcessGroup"
)

#: Communication kernel name → the collective it runs, first match wins (NCCL/RCCL
#: ``ncclKernel_AllReduce_RING_LL_Sum_float``, ``ncclDevKernel_AllGather_RING_LL``; vLLM's custom
#: ``cross_device_reduce``). Kernels matching none are ``other``.
COLLECTIVE_KINDS: Final[tuple[tuple[str, str], ...]] = (
    (r"(?i)all_?reduce|cross_device_reduce", "all-reduce"),
    (r"(?i)all_?gather", "all-gather"),
    (r"(?i)reduce_?scatter", "reduce-scatter"),
    (r"(?i)all_?to_?all", "all-to-all"),
    (r"(?i)broadcast", "broadcast"),
    (r"(?i)send|recv", "send/recv"),
    (r"(?i)reduce", "reduce"),
)
#: Host ranges of the data-parallel wrappers: DDP's forward, FSDP (1: ``FullyShardedDataParallel.*``,
#: 2: ``FSDP::*``). Regexes over annotation and operator names.
DDP_RANGE_PATTERN: Final[str] = r"^DistributedDataParallel\."
FSDP_RANGE_PATTERN: Final[str] = r"^(FullyShardedDataParallel\.|FSDP::)"
#: Autograd's backward operators (``autograd::engine::evaluate_function: AddmmBackward0``).
BACKWARD_OP_PREFIX: Final[str] = "autograd::engine::evaluate_function"
#: Host operators that flatten tensors into one buffer and back (``broadcast_coalesced``: DDP's
#: buffer broadcast at each forward, DataParallel's replication): host work for communication.
COALESCING_OPS: Final[frozenset[str]] = frozenset(
    {"aten::flatten_dense_tensors", "aten::unflatten_dense_tensors"}
)

# --- kernel families: precision ---------------------------------------------------------------

#: GEMM and convolution kernels that run in plain fp32 on CUDA cores (no tensor cores): cuBLAS
#: ``*_sgemm``, cuDNN ``scudnn`` / ``implicit_convolve_sgemm`` / float dgrad/wgrad engines, FFT and
#: Winograd convolutions on float, CUTLASS SIMT sgemm. A regex over the kernel name.
FP32_MATMUL_KERNEL_PATTERN: Final[str] = (
    r"(?i)(^|[^a-z0-9])(maxwell|pascal|volta|turing|ampere|ada|hopper|sm\d+)_sgemm"
    r"|(^|[^a-z0-9])sgemm[_<]|simt_sgemm|gcgemm|scudnn|implicit_convolve_sgemm"
    r"|(dgrad|wgrad)\w*engine<float|wgrad_alg\d\w*<float|fft2d_[rc]2[rc]\w*<float|winograd\w*<float"
)
#: Kernels that use tensor cores (so precision is already reduced): TF32 (``s1688``, ``tf32``),
#: half/bfloat16 (``h884``, ``h1688``, ``bf16``, ``f16``, ``hmma``, ``wmma``), fp8/fp4, Hopper+ jet kernels.
TENSOR_CORE_KERNEL_PATTERN: Final[str] = (
    r"(?i)tensorop|s1688|s16816|tf32|h884|h1688|h16816|hmma|wmma|bf16|f16|fp16|half|e4m3|e5m2|fp8|mxfp|"
    r"nvjet|xmma_gemm_(bf16|f16)|_bf16|i8816|imma"
)
#: Optimizer kernels that update many tensors per launch (``foreach``/``fused`` implementations).
MULTI_TENSOR_KERNEL_PATTERN: Final[str] = (
    r"(?i)multi_tensor_apply|fused_adam|fusedadam|fused_sgd|FusedOptimizer"
)

# --- torch.compile ---------------------------------------------------------------------------------

#: Kernels TorchInductor generates (``triton_poi_fused_add_0``, ``triton_red_*``, ``triton_per_*``,
#: templates ``triton_tem_*``, foreach ``triton_for_*``; 2023 builds named them ``triton__0d1d2d``).
#: Hand-written Triton kernels (vLLM's, Liger's) have other names: they are not a compiled model.
INDUCTOR_KERNEL_PATTERN: Final[str] = r"^triton_(poi|red|per|tem|for)_|^triton__\d"
#: Host ranges of compiled code: the autograd function of a compiled graph, dynamo's frame entry,
#: the compiled graph's call. A regex over operator and annotation names.
COMPILED_REGION_PATTERN: Final[str] = (
    r"^(CompiledFunction|Torch-Compiled Region|## Call CompiledFxGraph|TorchDynamo Cache Lookup)"
)
#: Host calls that replay a captured CUDA/HIP graph (``mode="reduce-overhead"``, ``torch.cuda.graph``).
GRAPH_LAUNCH_CALLS: Final[frozenset[str]] = frozenset({"cudaGraphLaunch", "cuGraphLaunch", "hipGraphLaunch"})

# --- syncs waiting to happen: ops that make the host wait when their tensors are on a GPU ----------

#: Operators that read a tensor's value (or size) on the host: on a GPU tensor each one waits for
#: the GPU. Without a GPU they cost nothing, so a CPU trace shows where the waits will be.
LATENT_SYNC_OPS: Final[frozenset[str]] = frozenset(
    {
        "aten::item",
        "aten::_local_scalar_dense",
        "aten::is_nonzero",
        "aten::nonzero",
        "aten::nonzero_static",
        "aten::masked_select",
        "aten::_unique2",
        "aten::unique_consecutive",
        "aten::unique_dim",
        "aten::repeat_interleave",
        "aten::tolist",
    }
)

#: torch.optim optimizers whose own ``.item()`` calls read their step counters, which stay CPU
#: tensors whatever the parameters' device unless ``capturable``/``fused`` (and then no ``.item()`` is
#: called): ``state["step"] = torch.tensor(0.0)`` in torch 2.x's Adam, AdamW, Adamax, Adagrad,
#: NAdam, RAdam and Adafactor. Not ASGD (its counters live on the parameters' device), nor LBFGS
#: (its ``.item()`` and ``if`` read the loss and the gradients: real syncs on a GPU).
CPU_STEP_COUNTER_OPTIMIZERS: Final[frozenset[str]] = frozenset(
    {"Adam", "AdamW", "Adamax", "Adagrad", "NAdam", "RAdam", "Adafactor"}
)

#: The ``loaderFetch`` of a `traceinsight run` trace's ``traceinsight`` record when the
#: DataLoader's fetch was recorded as its ``enumerate(DataLoader)#…`` range alone, without the
#: operators the Dataset ran (:mod:`traceinsight.capture.fetch`).
LOADER_FETCH_RANGE_ONLY: Final[str] = "range only"

#: A tensor's formatting, as torch's tracer and `run`'s name its frames: ``print(loss)``,
#: ``str(loss)`` (``__repr__``) and ``f"{loss:.3f}"`` (``__format__``).
TENSOR_FORMAT_FRAME_PATTERN: Final[str] = r"_tensor\.py\(\d+\): __(?:repr|format)__$"


def optimizer_of_step(name: str) -> str | None:
    """``Optimizer.step#AdamW.step`` → ``AdamW`` (None for other names)."""
    if not name.startswith(OPTIMIZER_STEP_PREFIX):
        return None
    return name.removeprefix(OPTIMIZER_STEP_PREFIX).removesuffix(".step") or None


class LineKind(StrEnum):
    """What the line in a Python frame's name is (see :mod:`traceinsight.analysis.sources`)."""

    CALL = "call"
    """The line of the call the frame was making (``run``'s call sites, 2020-21 ``Call stack``)."""
    DEF = "def"
    """The function's first line: torch's tracer names the frames it sees entered so."""
    RECORDING_START = "recording-start"
    """The line the function was on when recording began (torch's frames already running then)."""
    ENTRY = "entry"
    """One of several lines a function of one name was entered at under one caller: torch names a
    frame by its def line, but a generator resumed by the line of its ``yield``, so these are one
    generator or several functions of that name; the lowest line is given, no def line claimed."""


class DesignedSync(Model, frozen=True):
    """Framework (or library) code a user calls that reads GPU values on the host by design: its
    syncs are not the user's ``if`` or ``.item()``, and the fix is in how the user calls it."""

    name: str
    """What it is, as the report names it: ``torch.optim.LBFGS``."""
    files: tuple[str, ...]
    """Its frames' files, as the end of the path (``torch/optim/lbfgs.py``)."""
    functions: frozenset[str] = frozenset()
    """Only frames of these functions (empty: any function of ``files``)."""
    annotations: tuple[str, ...] = ()
    """Host ranges torch records around it (found without Python frames, as in ``run``'s traces)."""


#: The framework code users meet that syncs by design (checked on torch 2.13's sources and on CPU
#: traces of each: the ``aten::item`` / ``aten::is_nonzero`` ops sit under these frames).
DESIGNED_SYNCS: Final[tuple[DesignedSync, ...]] = (
    # Convergence tests (``if opt_cond``), ``float(loss)`` and the line search's comparisons.
    DesignedSync("torch.optim.LBFGS", ("torch/optim/lbfgs.py",), annotations=("Optimizer.step#LBFGS.step",)),
    # ``_maybe_opt_step``: ``sum(v.item() for v in found_inf_per_device)`` before each step.
    DesignedSync("torch.amp.GradScaler", ("torch/amp/grad_scaler.py", "torch/cuda/amp/grad_scaler.py")),
    # ``ReduceLROnPlateau.step(metrics)``: ``float(metrics)``.
    DesignedSync("torch.optim.lr_scheduler.ReduceLROnPlateau", ("torch/optim/lr_scheduler.py",)),
    # ``clip_grad_norm_(..., error_if_nonfinite=True)``: ``if total_norm.isnan() or ...isinf()``.
    DesignedSync("torch.nn.utils.clip_grad_norm_", ("torch/nn/utils/clip_grad.py",)),
    # ``validate_args``: ``if not valid.all(): raise`` when a distribution is made and in ``log_prob``.
    DesignedSync(
        "torch.distributions",
        ("torch/distributions/distribution.py",),
        functions=frozenset({"__init__", "_validate_sample"}),
    ),
    # The inference fast path: a padding mask made into nested tensors (``masked_select``, sizes
    # read on the host) and ``_detect_is_causal_mask``'s ``bool((mask == causal).all())``.
    DesignedSync("torch.nn.TransformerEncoder", ("torch/nn/modules/transformer.py",)),
    # transformers' SDPA mask helpers: ``torch.all(mask == 1)`` on the host, to drop an all-ones
    # mask so that SDPA can take its causal fast path (seen in h100_bert/qwen: BertModel, Qwen2Model).
    DesignedSync(
        "transformers attention-mask check",
        ("transformers/modeling_attn_mask_utils.py", "transformers/masking_utils.py"),
        functions=frozenset(
            {
                "_ignore_causal_mask_sdpa",
                "_prepare_4d_attention_mask_for_sdpa",
                "_prepare_4d_causal_attention_mask_for_sdpa",
            }
        ),
    ),
)


def designed_sync(file: str, function: str) -> str | None:
    """The :data:`DESIGNED_SYNCS` entry a frame belongs to (its ``name``), else None."""
    normalised = file.replace("\\", "/")
    for entry in DESIGNED_SYNCS:
        if normalised.endswith(entry.files) and (not entry.functions or function in entry.functions):
            # A path ending "xtorch/optim/lbfgs.py" is not torch's.
            head = normalised[: -len(next(f for f in entry.files if normalised.endswith(f)))]
            if not head or head.endswith("/"):
                return entry.name
    return None


#: Host ranges that enclose a designed sync → its ``name``.
DESIGNED_SYNC_ANNOTATIONS: Final[dict[str, str]] = {
    annotation: entry.name for entry in DESIGNED_SYNCS for annotation in entry.annotations
}

#: ``python_function`` frames that mark a module's forward: ``nn.Module: BertModel_0``.
MODULE_FRAME_PREFIX: Final[str] = "nn.Module: "


def module_name(frame_name: str) -> str:
    """``nn.Module: BertModel_0`` → ``BertModel``."""
    name = frame_name.removeprefix(MODULE_FRAME_PREFIX)
    head, _, tail = name.rpartition("_")
    return head if head and tail.isdigit() else name


# --- start-up ------------------------------------------------------------------------------------

#: Annotation names that say they are a warm-up (benchmark harnesses label their phases).
WARMUP_ANNOTATION_PATTERN: Final[str] = r"(?i)warm_?up"

# --- host-blocking calls ---------------------------------------------------------------------------

#: Host calls that block the calling thread until the GPU has caught up.
BLOCKING_CALLS: Final[frozenset[str]] = frozenset(
    {
        "cudaStreamSynchronize",
        "cudaDeviceSynchronize",
        "cudaEventSynchronize",
        "cudaMemcpy",
        "cudaMemcpy2D",
        "cuStreamSynchronize",
        "cuCtxSynchronize",
        "cuEventSynchronize",
        "hipStreamSynchronize",
        "hipDeviceSynchronize",
        "hipEventSynchronize",
        "hipMemcpy",
        "hipMemcpyWithStream",
    }
)

#: Host calls that start a copy; the copy's memory kinds tell whether it blocked.
COPY_CALL_PREFIXES: Final[tuple[str, ...]] = ("cudaMemcpy", "hipMemcpy", "cuMemcpy")

#: Synchronous copy APIs: the host waits for the copy itself.
SYNCHRONOUS_COPY_CALLS: Final[frozenset[str]] = frozenset(
    {"cudaMemcpy", "cudaMemcpy2D", "hipMemcpy", "hipMemcpyWithStream"}
)


def waits_inside_copy_call(copy_name: str) -> bool:
    """Whether the host call of a copy named ``copy_name`` waits for the copy inside itself, even
    an ``*Async`` one: a device-to-host copy into pageable memory (``.item()``, ``.cpu()``,
    ``.tolist()`` into a fresh host tensor) is synchronous, so the call returns only after the GPU
    has run everything queued before it on the stream and then the copy. (A copy from pageable
    memory to the device returns once the data is staged; ROCm names every host side ``Host``,
    so its copies do not tell.)"""
    kind = parse_copy_name(copy_name)
    return kind.direction == "DtoH" and kind.dst == "Pageable"


# --- graph capture -----------------------------------------------------------------------------------

#: Host calls that start and end capturing a stream into a CUDA/HIP graph: launches between them
#: are recorded into the graph and do not run (no GPU activity follows them, by design).
GRAPH_CAPTURE_BEGIN_PREFIXES: Final[tuple[str, ...]] = (
    "cudaStreamBeginCapture",
    "hipStreamBeginCapture",
    "cuStreamBeginCapture",
)
GRAPH_CAPTURE_END_PREFIXES: Final[tuple[str, ...]] = (
    "cudaStreamEndCapture",
    "hipStreamEndCapture",
    "cuStreamEndCapture",
)
#: Host calls that launch one kernel (each should be followed by GPU activity of its correlation).
KERNEL_LAUNCH_CALLS: Final[tuple[str, ...]] = (
    "cudaLaunchKernel",
    "cudaLaunchKernelExC",
    "cuLaunchKernel",
    "cuLaunchKernelEx",
    "hipLaunchKernel",
    "hipExtLaunchKernel",
    "hipModuleLaunchKernel",
    "hipExtModuleLaunchKernel",
)

# --- memory ------------------------------------------------------------------------------------------

#: Runtime calls of the device allocator. The caching allocator calls them when it grows or gives
#: memory back (``torch.cuda.empty_cache()``, an allocation that fails and frees the cache first);
#: in a loop at its usual pace they are rare.
ALLOCATOR_CALLS: Final[frozenset[str]] = frozenset({"cudaMalloc", "cudaFree", "hipMalloc", "hipFree"})

#: ``Device Type`` of ``[memory]`` records (c10's ``DeviceType``) → what the report calls it. ROCm
#: builds record their GPUs as CUDA devices.
MEMORY_DEVICE_TYPES: Final[dict[int, str]] = {0: "CPU", 1: "GPU"}
#: The ``Device Type`` of a GPU, whose total memory ``deviceProperties`` gives.
GPU_DEVICE_TYPE: Final = 1

# --- copies ------------------------------------------------------------------------------------------

_COPY_NAME = re.compile(r"^Memcpy (?P<dir>[A-Za-z]+)(?: \((?P<src>\w+) -> (?P<dst>\w+)\))?")


class CopyKind(Model, frozen=True):
    """A copy name split into its parts: ``Memcpy HtoD (Pageable -> Device)``."""

    direction: str  # HtoD, DtoH, DtoD, HtoH, PtoP (or "unknown")
    src: str | None  # Pageable, Pinned, Device, Managed, Host
    dst: str | None

    @property
    def pageable(self) -> bool:
        """True when either side is pageable host memory (the copy blocks the host)."""
        return self.src == "Pageable" or self.dst == "Pageable"


def parse_copy_name(name: str) -> CopyKind:
    """Split a copy name; unknown layouts give direction "unknown" rather than an error."""
    match = _COPY_NAME.match(name)
    if match is None:
        return CopyKind("unknown", None, None)
    return CopyKind(match["dir"], match["src"], match["dst"])


# --- Python frames: which are the user's own code ----------------------------------------------------

#: Top-level packages whose frames are library code, not the user's. torch trims site-packages and
#: sys.path prefixes from frame paths, so a library frame reads ``transformers/models/...``.
LIBRARY_PACKAGES: Final[frozenset[str]] = frozenset(
    {
        "torch",
        "torchvision",
        "torchaudio",
        "torchtext",
        "torchdata",
        "functorch",
        "triton",
        "numpy",
        "transformers",
        "accelerate",
        "datasets",
        "tokenizers",
        "vllm",
        "lightning",
        "pytorch_lightning",
        "lightning_fabric",
        "deepspeed",
        "apex",
        "timm",
        "fairscale",
        "xformers",
        "flash_attn",
        "peft",
        "diffusers",
        "huggingface_hub",
        "safetensors",
        "tqdm",
        "hydra",
        "omegaconf",
        "einops",
        "megatron",
        "tensorboard",
        "wandb",
        "PIL",
        "scipy",
        "pandas",
        "sklearn",
        "typing_extensions",
        "importlib_metadata",
        "packaging",
        "traceinsight",
        "runpy",
        "flashinfer",
        "sglang",
        "bitsandbytes",
        "cupy",
        "jax",
        "jaxlib",
        "onnxruntime",
        "tensorrt",
        "torch_tensorrt",
        "nvidia",
        "thunder",
        "liger_kernel",
        "unsloth",
        "trl",
        "ray",
        "sentencepiece",
        "mamba_ssm",
        "torchrec",
        "fbgemm_gpu",
        "torchmetrics",
        "torch_geometric",
        "sympy",
        "networkx",
        "filelock",
        "fsspec",
        "jinja2",
    }
)
_LIBRARY_ROOTS: Final[frozenset[str]] = LIBRARY_PACKAGES | frozenset(sys.stdlib_module_names)
_FRAME = re.compile(r"^(?P<file>.+?)\((?P<line>\d+)\): (?P<func>.*)$")


class Frame(Model, frozen=True):
    """A ``python_function`` frame name split into file, line and function."""

    file: str
    line: int
    function: str

    @property
    def location(self) -> str:
        """``file:line`` as written in the trace."""
        return f"{self.file}:{self.line}"


def parse_frame(name: str) -> Frame | None:
    """Parse ``path/file.py(47): func``; None for built-ins and ``nn.Module:`` labels."""
    match = _FRAME.match(name)
    if match is None or name.startswith("<"):
        return None
    return Frame(match["file"], int(match["line"]), match["func"])


def top_package(path: str) -> str | None:
    """The top-level package a frame's file belongs to, as far as its path tells.

    ``transformers/models/bert.py`` → ``transformers`` (torch trims site-packages and sys.path
    prefixes); ``/venv/lib/python3.11/site-packages/vllm/x.py`` → ``vllm``; a single file
    ``train.py`` → ``train``; None for an absolute path outside any site-packages.
    """
    normalised = path.replace("\\", "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in normalised:
            normalised = normalised.rsplit(marker, 1)[1]
            break
    else:
        if normalised.startswith("/"):
            return None
    parts = [part for part in normalised.split("/") if part]
    if not parts:
        return None
    return parts[0].removesuffix(".py") if len(parts) == 1 else parts[0]


def is_user_file(path: str, user_code: Collection[str] = ()) -> bool:
    """True when a frame's file is the user's code: not torch, site-packages, stdlib or built-in.

    Packages named in ``user_code`` (``--user-code``, ``[tool.traceinsight] user-code``) are the
    user's even when installed in site-packages or listed in :data:`LIBRARY_PACKAGES`.
    """
    if path.startswith("<"):
        return False
    if user_code and top_package(path) in user_code:
        return True
    if "site-packages" in path or "dist-packages" in path:
        return False
    normalised = path.replace("\\", "/")
    if "/lib/python3" in normalised or "/torch/" in normalised:
        return False
    parts = [part for part in normalised.split("/") if part]
    if not parts:
        return False
    if normalised.startswith("/"):
        # An absolute path was not trimmed by torch, so it is outside sys.path: the user's own.
        return True
    root = parts[0]
    if len(parts) == 1:
        root = root.removesuffix(".py")
    return root not in _LIBRARY_ROOTS
