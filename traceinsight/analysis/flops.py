"""FLOPs from recorded shapes, attributed to the GPU kernels that did them, and MFU against a peak.

**What is counted.** Operators whose FLOPs follow from their recorded shapes (``Input Dims``, and
``Concrete Inputs`` for stride, padding, dilation and masks where the trace has them): matrix
multiplies (``mm``, ``addmm``, ``bmm``, ``baddbmm``, ``matmul``, ``linear``, ``_scaled_mm``,
``mv``, ``addmv``), convolutions forward and backward, and attention (``scaled_dot_product_attention``
and its flash / efficient / cudnn / math variants, forward and backward). A multiply-add is 2 FLOPs;
a bias add, a softmax, a scale and every elementwise operator count 0 (they are memory-bound: their
time is the busy time without known FLOPs, see ``coverage``). Attention counts as
``torch.utils.flop_counter`` does: 2 matmuls forward, 5 backward (the scores recomputed), causal
masks not halved.

**Never twice.** FLOP-bearing operators nest (``linear`` → ``addmm``, ``conv2d`` → ``convolution``
→ ``cudnn_convolution``, ``scaled_dot_product_attention`` → ``_flash_attention_forward``): a call is
counted at the **outermost** FLOP-bearing operator whose count is known, and nothing inside a
counted operator is counted again. An outer operator whose count is unknown (a 2021 ``conv2d``
without its stride) leaves the count to the operators inside it.

**Torch's own count.** Where an operator carries torch's ``flops`` arg (``with_flops=True``), it
is compared with this count (``torch_agreement``) and used where this count is unknown.

**Attribution.** A counted operator's kernels are those launched (host launch call → correlation →
kernel) while it ran, on its thread; its FLOPs are shared among them by duration. Achieved FLOP/s is
FLOPs over kernel time: per kernel name, per operator class, per device.

**Coverage.** The share of kernel time in the steady state whose FLOPs are known (the kernels of
counted operators); the rest is elementwise, normalization, communication, and FLOP-bearing
operators without shapes.

**MFU.** ``Σ FLOPs_dtype / peak_dtype`` (the time the work would take at the datasheet peak of
each data type, :mod:`.peaks`) over the steady window: MFU = that / window. It is the product of the
share of the window the GPU was busy and the efficiency while busy (MFU / busy share). An
unknown GPU or data type (fp64, a GPU not in the table) gives achieved FLOP/s only.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from typing import ClassVar, Final

import polars as pl

from traceinsight.analysis import peaks
from traceinsight.analysis.intervals import within
from traceinsight.analysis.membytes import MemoryKernel, memory_kernels
from traceinsight.analysis.results import COUNT, DURATION, LOCAL
from traceinsight.analysis.steady import SteadySteps
from traceinsight.load import Trace
from traceinsight.model import Model, field, replace

__all__ = [
    "FlopClass",
    "FlopKernel",
    "Flops",
    "Mfu",
    "attention_flops",
    "conv_backward_flops",
    "conv_forward_flops",
    "dtype_of",
    "flop_stats",
    "gemm_flops",
    "operator_flops",
]

Dims = list[list[int]]

#: GEMM operators → (index of A, index of B) in ``Input Dims``.
GEMM_OPERANDS: Final[dict[str, tuple[int, int]]] = {
    "aten::mm": (0, 1),
    "aten::addmm": (1, 2),
    "aten::_addmm_activation": (1, 2),
    "aten::bmm": (0, 1),
    "aten::baddbmm": (1, 2),
    "aten::matmul": (0, 1),
    "aten::_scaled_mm": (0, 1),
    "aten::mv": (0, 1),
    "aten::addmv": (1, 2),
}
#: Convolutions forward → positions of (stride, padding, dilation, transposed) in the inputs
#: (-1: not an argument of this operator).
CONV_FORWARD: Final[dict[str, tuple[int, int, int, int]]] = {
    "aten::conv1d": (3, 4, 5, -1),
    "aten::conv2d": (3, 4, 5, -1),
    "aten::conv3d": (3, 4, 5, -1),
    "aten::convolution": (3, 4, 5, 6),
    "aten::_convolution": (3, 4, 5, 6),
    "aten::cudnn_convolution": (3, 2, 4, -1),
    "aten::mkldnn_convolution": (4, 3, 5, -1),
    "aten::miopen_convolution": (4, 3, 5, -1),
}
#: Convolutions backward → positions of (grad_output, input, weight, output_mask, transposed).
CONV_BACKWARD: Final[dict[str, tuple[int, int, int, int, int]]] = {
    "aten::convolution_backward": (0, 1, 2, 10, 7),
    "aten::cudnn_convolution_backward": (1, 0, 2, 10, -1),
}
#: Convolution backward halves (2021): (grad_output, weight) positions; one pass each.
CONV_BACKWARD_INPUT: Final = "aten::cudnn_convolution_backward_input"
#: Attention forward in ``[..., L, E]`` layout (q, k, v the first three inputs).
ATTENTION_FORWARD: Final = frozenset(
    {
        "aten::scaled_dot_product_attention",
        "aten::_scaled_dot_product_flash_attention",
        "aten::_scaled_dot_product_efficient_attention",
        "aten::_scaled_dot_product_cudnn_attention",
        "aten::_scaled_dot_product_flash_attention_for_cpu",
        "aten::_scaled_dot_product_attention_math",
        "aten::_scaled_dot_product_fused_attention_overrideable",
    }
)
#: Attention forward in ``[B, L, H, E]`` layout.
ATTENTION_FORWARD_BLHE: Final = frozenset(
    {"aten::_flash_attention_forward", "aten::_efficient_attention_forward"}
)
#: Attention backward (grad_out, q, k, v first) in ``[..., L, E]`` layout.
ATTENTION_BACKWARD: Final = frozenset(
    {
        "aten::_scaled_dot_product_flash_attention_backward",
        "aten::_scaled_dot_product_efficient_attention_backward",
        "aten::_scaled_dot_product_cudnn_attention_backward",
        "aten::_scaled_dot_product_flash_attention_for_cpu_backward",
        "aten::_scaled_dot_product_fused_attention_overrideable_backward",
    }
)
#: Attention backward in ``[B, L, H, E]`` layout.
ATTENTION_BACKWARD_BLHE: Final = frozenset(
    {"aten::_flash_attention_backward", "aten::_efficient_attention_backward"}
)

#: Every operator this module counts, with its class.
OPERATOR_CLASS: Final[dict[str, str]] = {
    **{name: "gemm" for name in GEMM_OPERANDS},
    "aten::linear": "gemm",
    **{name: "conv" for name in CONV_FORWARD},
    **{name: "conv" for name in CONV_BACKWARD},
    CONV_BACKWARD_INPUT: "conv",
    "aten::cudnn_convolution_backward_weight": "conv",
    **{name: "attention" for name in ATTENTION_FORWARD | ATTENTION_FORWARD_BLHE},
    **{name: "attention" for name in ATTENTION_BACKWARD | ATTENTION_BACKWARD_BLHE},
}

#: ``Input type`` words → data type (first match in the lowercased type wins).
_DTYPE_WORDS: Final = (
    ("float8", "fp8"),
    ("bfloat16", "bf16"),
    ("half", "fp16"),
    ("double", "fp64"),
    ("float", "fp32"),
)


# --- counts from shapes (pure functions over the recorded values) --------------------------------


def _prod(values: Sequence[int]) -> int:
    return math.prod(values) if values else 1


def _is_shape(value: object) -> bool:
    return isinstance(value, list) and all(type(v) is int and v >= 0 for v in value)


def gemm_flops(name: str, dims: Dims) -> int | None:
    """FLOPs of a matrix multiply from its inputs' dims (2 per multiply-add; a bias adds none)."""
    if name == "aten::linear":
        if len(dims) < 2 or not dims[0] or len(dims[1]) != 2:
            return None
        x, w = dims[0], dims[1]
        if x[-1] != w[1]:
            return None
        return 2 * _prod(x[:-1]) * w[1] * w[0]
    a_at, b_at = GEMM_OPERANDS[name]
    if len(dims) <= max(a_at, b_at):
        return None
    a, b = dims[a_at], dims[b_at]
    if not a or not b:
        return None
    if name in ("aten::mv", "aten::addmv"):
        return 2 * a[0] * a[1] if len(a) == 2 and len(b) == 1 and a[1] == b[0] else None
    # matmul's rules: a vector is a row (left) or a column (right); leading dims broadcast.
    a_rows, k = (1, a[0]) if len(a) == 1 else (a[-2], a[-1])
    b_k, b_cols = (b[0], 1) if len(b) == 1 else (b[-2], b[-1])
    if k != b_k:
        return None
    a_batch, b_batch = a[:-2], b[:-2]
    width = max(len(a_batch), len(b_batch))
    a_batch = [1] * (width - len(a_batch)) + a_batch
    b_batch = [1] * (width - len(b_batch)) + b_batch
    batch = 1
    for left, right in zip(a_batch, b_batch, strict=True):
        if left != right and 1 not in (left, right):
            return None
        batch *= max(left, right)
    return 2 * batch * a_rows * k * b_cols


def _ints(value: object, rank: int) -> list[int] | None:
    """A concrete list-or-int argument (``"[2, 2]"``, ``"1"``) → ``rank`` ints; None when absent."""
    if not isinstance(value, str) or not value:
        return None
    try:
        parsed = json.loads(value)
    except ValueError:
        return None
    if type(parsed) is int:
        return [parsed] * rank
    if isinstance(parsed, list) and parsed and all(type(v) is int for v in parsed):
        return parsed * rank if len(parsed) == 1 else parsed if len(parsed) == rank else None
    return None


def _flag(value: object) -> bool | None:
    if not isinstance(value, str):
        return None
    return {"true": True, "false": False, "1": True, "0": False}.get(value.strip().lower())


def _mask(value: object) -> list[bool] | None:
    """``output_mask`` (``"[True, False, True]"``) → its flags; None when not recorded."""
    if not isinstance(value, str) or not value.startswith("["):
        return None
    flags = [_flag(part) for part in value.strip("[]").split(",")]
    return [bool(f) for f in flags] if flags and None not in flags else None


def conv_forward_flops(
    name: str, dims: Dims, concrete: Sequence[object] | None, output: list[int] | None = None
) -> int | None:
    """FLOPs of a convolution forward: ``2 · N · C_out · Π out · (C_in / groups) · Π kernel``; the
    output size from stride, padding and dilation (all needed, from ``Concrete Inputs``), else
    ``output`` (the gradient's dims of a backward call with the same input and weight: 2021 traces
    record no stride). A transposed convolution needs neither (its FLOPs follow from the input)."""
    if len(dims) < 2 or len(dims[0]) < 3 or len(dims[1]) != len(dims[0]):
        return None
    x, w = dims[0], dims[1]
    spatial, kernel = x[2:], w[2:]
    rank = len(spatial)
    at_stride, at_padding, at_dilation, at_transposed = CONV_FORWARD[name]
    values = list(concrete or ())

    def arg(at: int) -> object:
        return values[at] if 0 <= at < len(values) else None

    if _flag(arg(at_transposed)):
        return 2 * x[0] * _prod(spatial) * x[1] * w[1] * _prod(kernel)
    stride, padding, dilation = (_ints(arg(at), rank) for at in (at_stride, at_padding, at_dilation))
    if stride is None or padding is None or dilation is None:
        if output is None or len(output) != len(x) or output[:2] != [x[0], w[0]]:
            return None
        return 2 * x[0] * w[0] * _prod(output[2:]) * w[1] * _prod(kernel)
    out = [
        (size + 2 * pad - dil * (k - 1) - 1) // step + 1
        for size, pad, dil, k, step in zip(spatial, padding, dilation, kernel, stride, strict=True)
    ]
    if any(o <= 0 for o in out) or any(step <= 0 for step in stride):
        return None
    return 2 * x[0] * w[0] * _prod(out) * w[1] * _prod(kernel)


def conv_backward_flops(
    name: str, dims: Dims, concrete: Sequence[object] | None, mask: list[bool] | None
) -> int | None:
    """FLOPs of a convolution backward: one forward's worth per gradient asked for (input, weight;
    ``output_mask``, else ``mask`` given by the caller, else both); the output size is the gradient's."""
    if name == CONV_BACKWARD_INPUT:
        if len(dims) < 3 or len(dims[1]) < 3 or len(dims[2]) != len(dims[1]):
            return None
        g, w = dims[1], dims[2]
        return 2 * g[0] * g[1] * _prod(g[2:]) * w[1] * _prod(w[2:])
    if name not in CONV_BACKWARD:
        return None
    at_grad, at_input, at_weight, at_mask, at_transposed = CONV_BACKWARD[name]
    if len(dims) <= max(at_grad, at_input, at_weight):
        return None
    g, x, w = dims[at_grad], dims[at_input], dims[at_weight]
    if len(g) < 3 or len(x) != len(g) or len(w) != len(g):
        return None
    values = list(concrete or ())
    recorded = _mask(values[at_mask]) if at_mask < len(values) else None
    flags = recorded or mask or [True, True]
    passes = int(flags[0]) + int(flags[1] if len(flags) > 1 else False)
    transposed = _flag(values[at_transposed]) if 0 <= at_transposed < len(values) else None
    if transposed:
        one = 2 * x[0] * _prod(x[2:]) * x[1] * w[1] * _prod(w[2:])
    else:
        one = 2 * g[0] * g[1] * _prod(g[2:]) * w[1] * _prod(w[2:])
    return passes * one


def attention_flops(name: str, dims: Dims) -> int | None:
    """FLOPs of attention: forward ``2·B·L·S·E + 2·B·L·S·E_v`` (scores, then values), backward
    ``2·B·L·S·(3E + 2E_v)`` (scores recomputed, then the four gradient matmuls), ``B`` every batch
    and head; as ``torch.utils.flop_counter`` counts (a causal mask is not halved)."""
    backward = name in ATTENTION_BACKWARD or name in ATTENTION_BACKWARD_BLHE
    first = 1 if backward else 0
    if len(dims) < first + 3:
        return None
    q, k, v = dims[first], dims[first + 1], dims[first + 2]
    if name in ATTENTION_FORWARD_BLHE or name in ATTENTION_BACKWARD_BLHE:
        if len(q) != 4 or len(k) != 4 or len(v) != 4:
            return None  # variable-length batches ([total, H, E]) are not counted
        batch, length, source, e, e_v = q[0] * q[2], q[1], k[1], q[3], v[3]
    else:
        if len(q) < 2 or len(k) < 2 or len(v) < 2:
            return None
        batch, length, source, e, e_v = _prod(q[:-2]), q[-2], k[-2], q[-1], v[-1]
    if backward:
        return 2 * batch * length * source * (3 * e + 2 * e_v)
    return 2 * batch * length * source * (e + e_v)


def operator_flops(
    name: str,
    dims: Dims,
    concrete: Sequence[object] | None = None,
    mask: list[bool] | None = None,
    output: list[int] | None = None,
) -> int | None:
    """The FLOPs of one operator call from its recorded shapes; None when they do not say (an
    operator this module does not count, or shapes missing). ``mask`` and ``output``: see
    :func:`conv_backward_flops` and :func:`conv_forward_flops`."""
    op_class = OPERATOR_CLASS.get(name)
    if op_class is None or not all(_is_shape(d) for d in dims):
        return None
    if op_class == "gemm":
        return gemm_flops(name, dims)
    if op_class == "attention":
        return attention_flops(name, dims)
    if name in CONV_FORWARD:
        return conv_forward_flops(name, dims, concrete, output)
    return conv_backward_flops(name, dims, concrete, mask)


def dtype_of(types: Sequence[object] | None) -> str | None:
    """The data type of an operator's first tensor input (``Input type``): fp32 / bf16 / fp16 / fp8 /
    fp64; None when not recorded. (fp32 on tensor cores is told apart by the kernels: tf32.)"""
    for value in types or ():
        if not isinstance(value, str) or not value:
            continue
        lowered = value.lower()
        for word, dtype in _DTYPE_WORDS:
            if word in lowered:
                return dtype
    return None


# --- results -------------------------------------------------------------------------------------


class FlopClass(Model, frozen=True, kw_only=True):
    """Counted FLOPs of one operator class (``gemm``, ``conv``, ``attention``) in the steady state."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "op_class",
        "flops",
        "kernel_ns",
        "operators",
        "achieved_flops_per_s",
    )

    op_class: str
    flops: int = field(metadata=COUNT)
    #: Time of the kernels the class's operators launched (ns; 0 on a CPU-only trace).
    kernel_ns: int = field(metadata=DURATION)
    operators: int = field(metadata=COUNT)

    @property
    def achieved_flops_per_s(self) -> float | None:
        """FLOPs over the class's kernel time (None without kernels)."""
        return self.flops / self.kernel_ns * 1e9 if self.kernel_ns else None


class FlopKernel(Model, frozen=True, kw_only=True):
    """One kernel name's share of the counted FLOPs in the steady state, and its achieved FLOP/s."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "device", "name", "launches", "kernel_ns", "flops", "op_class", "dtype", "achieved_flops_per_s",
    )  # fmt: skip

    name: str
    device: int
    launches: int = field(metadata=COUNT)
    kernel_ns: int = field(metadata=DURATION)
    flops: int = field(metadata=COUNT)
    #: The class of the operators that launched it.
    op_class: str
    #: ``fp32``, ``tf32``, ``bf16``, ``fp16``, ``fp8``, ``fp64`` (None: not recorded).
    dtype: str | None

    @property
    def achieved_flops_per_s(self) -> float:
        """FLOPs over the kernel's time."""
        return self.flops / self.kernel_ns * 1e9 if self.kernel_ns else 0.0


class Mfu(Model, frozen=True, kw_only=True):
    """MFU of one device over the steady window: ``mfu = busy_share × efficiency_while_busy``.

    ``counted_kernel_ns`` and ``at_peak_ns`` (written last, the latter in ns as computed) are what a
    stored result's MFU is worked out from again."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "device", "gpu_name", "model", "peak_source", "dtype", "peak_flops_per_s", "flops", "window_ns",
        "busy_ns", "achieved_flops_per_s", "mfu", "busy_share", "efficiency_while_busy", "unknown",
        "counted_kernel_ns", "at_peak_ns",
    )  # fmt: skip

    device: int
    #: The ``deviceProperties`` name (None: not recorded).
    gpu_name: str | None
    #: The peak table's model (None: the GPU is not in the table, or unnamed).
    model: str | None
    #: Where the peaks come from (the datasheet).
    peak_source: str | None
    #: The data type with the most counted FLOPs (``bf16``, ``tf32`` ...; None: none counted).
    dtype: str | None
    #: That data type's dense peak (FLOP/s; None: unknown GPU or a data type the table lacks).
    peak_flops_per_s: int | None
    #: Counted FLOPs on this device's kernels in the steady window.
    flops: int = field(metadata=COUNT)
    #: The steady window on this device (ns) and its GPU-busy part.
    window_ns: int = field(metadata=DURATION)
    busy_ns: int = field(metadata=DURATION)
    #: Kernel time of the counted operators (ns).
    counted_kernel_ns: int = field(default=0, metadata=DURATION)
    #: Σ FLOPs_dtype / peak_dtype: the time the counted work takes at peak (ns, as computed; None
    #: if any counted data type has no peak).
    at_peak_ns: float | None = field(default=None, metadata={"raw": True})
    #: Why there is no MFU, in words (None when there is one).
    unknown: str | None

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilization: the time at peak over the window."""
        return self.at_peak_ns / self.window_ns if self.at_peak_ns is not None and self.window_ns else None

    @property
    def busy_share(self) -> float:
        """The share of the window the GPU was busy (at most 1: busy time counted past the window's
        edge is not more than all of it)."""
        return min(self.busy_ns / self.window_ns, 1.0) if self.window_ns else 0.0

    @property
    def efficiency_while_busy(self) -> float | None:
        """MFU over the busy time's share of the window: how near the peak the busy time ran."""
        mfu = self.mfu
        busy = self.busy_ns / self.window_ns if self.window_ns else 0.0
        return mfu / busy if mfu is not None and busy else None

    @property
    def achieved_flops_per_s(self) -> float | None:
        """Counted FLOPs over the busy time (None when not busy)."""
        return self.flops / self.busy_ns * 1e9 if self.busy_ns else None


#: The per-kernel table (``result.frames["kernels"]``): every kernel in the steady state.
KERNEL_SCHEMA: Final = pl.Schema(
    {
        "name": pl.String,
        "device": pl.Int64,
        "stream": pl.Int64,
        "ts": pl.Int64,
        "dur": pl.Int64,
        "correlation": pl.Int64,
        "operator": pl.String,
        "op_class": pl.String,
        "dtype": pl.String,
        "flops": pl.Int64,
        "achieved_flops_per_s": pl.Float64,
    }
)


#: The counted operators' table (:func:`counted_operators`).
OPERATOR_SCHEMA: Final = pl.Schema(
    {
        "op": pl.UInt32,
        "name": pl.String,
        "pid": pl.Int64,
        "tid": pl.Int64,
        "ts": pl.Int64,
        "end": pl.Int64,
        "flops": pl.Int64,
        "op_class": pl.String,
        "dtype": pl.String,
        "torch_flops": pl.Int64,
    }
)


class Flops(Model, frozen=True, kw_only=True):
    """FLOPs of one trace's steady state counted from recorded shapes, and MFU (see the module doc;
    all zero and empty when the trace has no shapes): a result's ``flops``. The kernel and operator
    tables the figures come from are kept beside them, never written."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "shapes_recorded", "operators_counted", "operators_unknown", "flops", "steps", "flops_per_step",
        "kernel_ns", "counted_kernel_ns", "coverage", "by_class", "by_dtype", "torch_counted",
        "torch_agreement", "mfu", "kernels", "memory_kernels",
    )  # fmt: skip

    #: Whether any operator in the trace carries recorded shapes (``record_shapes=True``).
    shapes_recorded: bool = False
    #: FLOP-bearing operator calls counted, and those whose count the shapes do not give.
    operators_counted: int = field(default=0, metadata=COUNT)
    operators_unknown: int = field(default=0, metadata=COUNT)
    #: Counted FLOPs of the operators that started in the steady state.
    flops: int = field(default=0, metadata=COUNT)
    #: Steady steps (0: no steps; the window is one).
    steps: int = field(default=0, metadata=COUNT)
    #: Steady kernel time (ns) and the part whose FLOPs are known.
    kernel_ns: int = field(default=0, metadata=DURATION)
    counted_kernel_ns: int = field(default=0, metadata=DURATION)
    by_class: tuple[FlopClass, ...] = ()
    #: (data type, FLOPs), most first (fp32 on tensor-core kernels is ``tf32``); an object in the JSON.
    by_dtype: tuple[tuple[str, int], ...] = field(default=(), metadata={"pairs": True})
    #: torch's ``flops`` args: operators carrying it, and our count over torch's on those both count.
    torch_counted: int = field(default=0, metadata=COUNT)
    torch_agreement: float | None = None
    #: Per device MFU (filled in by :func:`with_mfu` once the busy time is known).
    mfu: tuple[Mfu, ...] = ()
    #: Kernel names with the most counted FLOPs.
    kernels: tuple[FlopKernel, ...] = ()
    #: Kernels whose FLOPs are not counted, with the bytes their operators move
    #: (:mod:`.membytes`): memory-bound work's achieved bytes/s.
    memory_kernels: tuple[MemoryKernel, ...] = ()
    #: Every steady kernel with its operator, class, data type and FLOPs (:data:`KERNEL_SCHEMA`).
    kernel_table: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=KERNEL_SCHEMA), compare=False, repr=False, metadata=LOCAL
    )
    #: The counted operator calls of the whole trace (:func:`counted_operators`' columns).
    operator_table: pl.DataFrame = field(
        default_factory=lambda: pl.DataFrame(schema=OPERATOR_SCHEMA),
        compare=False,
        repr=False,
        metadata=LOCAL,
    )

    @property
    def flops_per_step(self) -> float | None:
        """Counted FLOPs per steady step (None without steps)."""
        return self.flops / self.steps if self.steps else None

    @property
    def coverage(self) -> float | None:
        """The share of steady kernel time whose FLOPs are known (None without kernels)."""
        return self.counted_kernel_ns / self.kernel_ns if self.kernel_ns else None


#: A trace without recorded shapes.
NO_FLOPS: Final = Flops()


# --- the analysis ---------------------------------------------------------------------------------


def _decoded(text: str | None, cache: dict[str, object]) -> object:
    if text is None:
        return None
    if text not in cache:
        try:
            cache[text] = json.loads(text)
        except ValueError:
            cache[text] = None
    return cache[text]


def _conv_outputs(
    rows: list[tuple[object, ...]], cache: dict[str, object]
) -> dict[tuple[str, str], list[int]]:
    """(input dims, weight dims) → output dims, from the convolution backward calls (their
    gradient is the output's size); a pair seen with two output sizes is left out."""
    seen: dict[tuple[str, str], list[int] | None] = {}
    for row in rows:
        name = row[1]
        if name not in CONV_BACKWARD:
            continue
        dims = _decoded(row[6] if isinstance(row[6], str) else None, cache)
        at_grad, at_input, at_weight, _mask_at, _transposed_at = CONV_BACKWARD[name]
        if not isinstance(dims, list) or len(dims) <= max(at_grad, at_input, at_weight):
            continue
        key = (str(dims[at_input]), str(dims[at_weight]))
        grad = dims[at_grad]
        if key in seen and seen[key] != grad:
            seen[key] = None
        else:
            seen[key] = grad
    return {key: value for key, value in seen.items() if value is not None}


def counted_operators(trace: Trace) -> pl.DataFrame:
    """The FLOP-bearing operator calls counted (outermost known, see the module doc): ``op`` (row),
    ``name``, ``pid``, ``tid``, ``ts``, ``end``, ``flops``, ``op_class``, ``dtype``, ``torch_flops``;
    plus, in ``unknown``, how many FLOP-bearing calls had no count and no counted caller."""
    ops = trace.cpu_ops
    names = list(OPERATOR_CLASS)
    has_torch = "flops" in ops.columns
    candidates = (
        ops.lazy()
        .with_row_index("op")
        .filter(pl.col("name").is_in(names) & (pl.col("input_dims").is_not_null() | pl.lit(has_torch)))
        .sort("pid", "tid", "ts", pl.col("end"), descending=[False, False, False, True], nulls_last=True)
        .select(
            "op",
            "name",
            "pid",
            "tid",
            "ts",
            "end",
            "input_dims",
            "input_types",
            "concrete_inputs",
            (pl.col("flops") if has_torch else pl.lit(None, dtype=pl.Int64)).alias("torch_flops"),
        )
        .collect(engine="in-memory")
    )
    cache: dict[str, object] = {}
    known: dict[tuple[object, ...], int | None] = {}
    rows = candidates.rows()
    outputs = _conv_outputs(rows, cache)
    # The nearest enclosing FLOP-bearing call of each (same thread, by time), by a stack walk.
    parent: list[int] = []
    stack: list[int] = []
    thread: tuple[object, object] | None = None
    for index, (_op, _name, pid, tid, ts, end, *_rest) in enumerate(rows):
        if (pid, tid) != thread:
            stack, thread = [], (pid, tid)
        while stack and (rows[stack[-1]][5] is None or rows[stack[-1]][5] <= ts):
            stack.pop()
        parent.append(stack[-1] if stack else -1)
        if end is not None:
            stack.append(index)
    children: dict[int, list[str]] = {}
    for index, up in enumerate(parent):
        if up >= 0:
            children.setdefault(up, []).append(rows[index][1])
    out: dict[str, list[object]] = {
        key: []
        for key in ("op", "name", "pid", "tid", "ts", "end", "flops", "op_class", "dtype", "torch_flops")
    }
    counted_at: list[bool] = []
    inside_counted: list[bool] = []
    unknown = 0
    for index, (op, name, pid, tid, ts, end, dims_text, types_text, concrete_text, torch_flops) in enumerate(
        rows
    ):
        up = parent[index]
        covered = up >= 0 and (counted_at[up] or inside_counted[up])
        inside_counted.append(covered)
        if covered:
            counted_at.append(False)
            continue
        mask = None
        if name in CONV_BACKWARD:
            below = children.get(index, [])
            if any(n.endswith(("_input", "_weight")) for n in below):
                mask = [CONV_BACKWARD_INPUT in below, any(n.endswith("_weight") for n in below)]
        # Shapes repeat step after step: each distinct call is counted once.
        call = (name, dims_text, concrete_text, None if mask is None else tuple(mask))
        if call in known:
            flops = known[call]
        else:
            dims = _decoded(dims_text, cache)
            concrete = _decoded(concrete_text, cache)
            output = (
                outputs.get((str(dims[0]), str(dims[1])))
                if isinstance(dims, list) and len(dims) > 1
                else None
            )
            flops = known[call] = (
                operator_flops(name, dims, concrete if isinstance(concrete, list) else None, mask, output)
                if isinstance(dims, list)
                else None
            )
        if flops is None and torch_flops is not None and torch_flops > 0:
            flops = torch_flops
        counted_at.append(flops is not None)
        if flops is None:
            if index not in children:
                unknown += 1
            continue
        types = _decoded(types_text, cache)
        for key, value in (
            ("op", op),
            ("name", name),
            ("pid", pid),
            ("tid", tid),
            ("ts", ts),
            ("end", end),
            ("flops", flops),
            ("op_class", OPERATOR_CLASS[name]),
            ("dtype", dtype_of(types if isinstance(types, list) else None)),
            ("torch_flops", torch_flops),
        ):
            out[key].append(value)
    frame = pl.DataFrame(out, schema=OPERATOR_SCHEMA)
    return frame.with_columns(unknown=pl.lit(unknown, dtype=pl.Int64))


def flop_stats(
    trace: Trace, steady: SteadySteps, classes: pl.DataFrame | None = None, top: int = 10
) -> Flops:
    """FLOPs of the steady state, attributed to kernels (see the module doc). ``classes``:
    :func:`~traceinsight.analysis.shared.gpu_classes` (its ``tensor_core`` column tells tf32 from fp32)."""
    ops = trace.cpu_ops
    if ops.is_empty() or ops.get_column("input_dims").null_count() == ops.height:
        has_torch = "flops" in ops.columns and ops.get_column("flops").null_count() < ops.height
        if not has_torch:
            return NO_FLOPS
    counted = counted_operators(trace)
    unknown = int(counted.get_column("unknown")[0]) if counted.height else 0
    counted = counted.drop("unknown")
    if counted.is_empty():  # shapes, but no FLOP-bearing call among them: nothing to attribute
        return replace(NO_FLOPS, shapes_recorded=True, steps=len(steady.steady_steps))
    windows = steady.windows
    in_window = counted.filter(within(counted.get_column("ts"), windows)) if windows else counted
    # Kernels of each counted operator: launch calls on its thread while it ran.
    kernels = trace.gpu.filter(pl.col("kind") == "kernel").select(
        "name", "device", "stream", "ts", "dur", "correlation", "external_id"
    )
    if classes is not None and "tensor_core" in classes.columns:
        tensor = classes.filter(pl.col("kind") == "kernel").select("correlation", "ts", "tensor_core")
        kernels = kernels.join(tensor, on=["correlation", "ts"], how="left").unique(
            ["correlation", "ts", "name"], keep="first", maintain_order=True
        )
    else:
        kernels = kernels.with_columns(tensor_core=pl.lit(None, dtype=pl.Boolean))
    calls = trace.runtime.filter(pl.col("correlation").is_not_null()).select(
        "pid", "tid", call_ts="ts", correlation="correlation"
    )
    spans = counted.select(
        "pid", "tid", "op", "op_class", "dtype", op_ts="ts", op_end="end", operator="name", op_flops="flops"
    ).sort("op_ts")
    owned = (
        calls.sort("call_ts")
        .join_asof(
            spans,
            left_on="call_ts",
            right_on="op_ts",
            by=["pid", "tid"],
            strategy="backward",
            check_sortedness=False,  # both sorted by time; the groups are the threads
        )
        .filter(pl.col("op_end").is_not_null() & (pl.col("call_ts") < pl.col("op_end")))
        .select("correlation", "op", "operator", "op_class", "dtype", "op_flops")
        .unique("correlation", keep="first")
    )
    attributed = kernels.join(owned, on="correlation", how="left")
    op_time = (
        attributed.filter(pl.col("op").is_not_null()).group_by("op").agg(op_kernel_ns=pl.col("dur").sum())
    )
    attributed = (
        attributed.join(op_time, on="op", how="left")
        .with_columns(
            dtype=pl.when((pl.col("dtype") == "fp32") & pl.col("tensor_core").fill_null(False))
            .then(pl.lit("tf32"))
            .otherwise(pl.col("dtype")),
            flops=pl.when(pl.col("op_kernel_ns") > 0)
            .then(
                (pl.col("op_flops").cast(pl.Float64) * pl.col("dur") / pl.col("op_kernel_ns"))
                .round()
                .cast(pl.Int64)
            )
            .otherwise(None),
        )
        .with_columns(
            achieved_flops_per_s=pl.when(pl.col("dur") > 0)
            .then(pl.col("flops") / pl.col("dur") * 1e9)
            .otherwise(None)
        )
    )
    device_windows = steady.device_windows
    steady_kernels = (
        attributed.filter(within(attributed.get_column("ts"), device_windows))
        if device_windows
        else attributed
    )
    kernel_table = steady_kernels.select(list(KERNEL_SCHEMA)).cast(KERNEL_SCHEMA).sort("ts")
    memory, _ = memory_kernels(ops, steady_kernels.filter(pl.col("op").is_null()))
    counted_kernels = steady_kernels.filter(pl.col("op").is_not_null())
    # FLOPs by class and data type: from the operators (a CPU trace has no kernels); tf32 where the
    # operator's kernels ran on tensor cores.
    op_tf32 = (
        counted_kernels.group_by("op").agg(pl.col("dtype").first().alias("kernel_dtype"))
        if counted_kernels.height
        else pl.DataFrame(schema={"op": pl.UInt32, "kernel_dtype": pl.String})
    )
    in_window = in_window.join(op_tf32, on="op", how="left").with_columns(
        dtype=pl.coalesce("kernel_dtype", "dtype")
    )
    class_time = dict(counted_kernels.group_by("op_class").agg(pl.col("dur").sum()).iter_rows())
    by_class = tuple(
        FlopClass(op_class=name, flops=int(flops), kernel_ns=int(class_time.get(name, 0)), operators=int(n))
        for name, flops, n in in_window.group_by("op_class")
        .agg(pl.col("flops").sum(), pl.len())
        .sort("flops", "op_class", descending=[True, False])
        .iter_rows()
    )
    by_dtype = tuple(
        (dtype or "unknown", int(flops))
        for dtype, flops in in_window.group_by("dtype")
        .agg(pl.col("flops").sum())
        .sort("flops", "dtype", descending=[True, False], nulls_last=True)
        .iter_rows()
    )
    top_rows = (
        counted_kernels.group_by("name", "device")
        .agg(
            launches=pl.len(),
            kernel_ns=pl.col("dur").sum(),
            flops=pl.col("flops").sum(),
            op_class=pl.col("op_class").mode().sort().first(),
            dtype=pl.col("dtype").mode().sort().first(),
        )
        .sort("flops", "name", descending=[True, False])
        .head(top)
    )
    with_torch = counted.filter(pl.col("torch_flops").is_not_null() & (pl.col("torch_flops") > 0))
    torch_sum = int(with_torch.get_column("torch_flops").sum() or 0)
    return Flops(
        shapes_recorded=ops.get_column("input_dims").null_count() < ops.height,
        operators_counted=counted.height,
        operators_unknown=unknown,
        flops=int(in_window.get_column("flops").sum() or 0),
        steps=len(steady.steady_steps),
        by_class=by_class,
        by_dtype=by_dtype,
        kernel_ns=int(steady_kernels.get_column("dur").sum() or 0),
        counted_kernel_ns=int(counted_kernels.get_column("dur").sum() or 0),
        kernels=tuple(
            FlopKernel(
                name=row["name"],
                device=row["device"],
                launches=row["launches"],
                kernel_ns=row["kernel_ns"],
                flops=round(row["flops"] or 0),
                op_class=row["op_class"],
                dtype=row["dtype"],
            )
            for row in top_rows.iter_rows(named=True)
        ),
        torch_counted=with_torch.height,
        torch_agreement=(int(with_torch.get_column("flops").sum()) / torch_sum) if torch_sum else None,
        kernel_table=kernel_table,
        operator_table=counted,
        memory_kernels=memory,
    )


def with_mfu(stats: Flops, trace: Trace, busy: Sequence[tuple[int, int, int]]) -> Flops:
    """``stats`` with per-device MFU, given each device's (device, steady window ns, busy ns)."""
    if not stats.kernel_table.height or not stats.flops:
        return stats
    names = {device.index: device.name for device in trace.meta.devices}
    per_device = (
        stats.kernel_table.filter(pl.col("flops").is_not_null())
        .group_by("device", "dtype")
        .agg(flops=pl.col("flops").sum(), kernel_ns=pl.col("dur").sum())
    )
    result = []
    for device, window_ns, busy_ns in busy:
        rows = per_device.filter(pl.col("device") == device)
        if rows.is_empty() or not window_ns:
            continue
        mix = sorted(
            (
                (dtype, float(flops), int(ns))
                for dtype, flops, ns in rows.select("dtype", "flops", "kernel_ns").iter_rows()
            ),
            key=lambda item: (-item[1], item[0] or ""),
        )
        flops = sum(f for _, f, _ in mix)
        name = names.get(device)
        row = peaks.peak_for(name)
        main_dtype = mix[0][0]
        at_peak: float | None = 0.0
        unknown: str | None = None
        if row is None:
            at_peak = None
            unknown = f"GPU {name!r} is not in the peak table" if name else "the trace does not name the GPU"
        else:
            for dtype, part, _ns in mix:
                peak = row.peak(dtype) if dtype else None
                if peak is None:
                    at_peak = None
                    unknown = f"no {dtype or 'known data type'} peak for {row.model}"
                    break
                at_peak = (at_peak or 0.0) + part / peak * 1e9
        result.append(
            Mfu(
                device=device,
                gpu_name=name,
                model=row.model if row else None,
                peak_source=row.source if row else None,
                dtype=main_dtype,
                peak_flops_per_s=row.peak(main_dtype) if row and main_dtype else None,
                flops=round(flops),
                window_ns=window_ns,
                busy_ns=busy_ns,
                counted_kernel_ns=sum(ns for _, _, ns in mix),
                at_peak_ns=at_peak,
                unknown=unknown,
            )
        )
    return replace(stats, mfu=tuple(result))
