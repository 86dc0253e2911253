"""Bytes moved by the kernels whose FLOPs are not counted (elementwise and other memory-bound work),
from recorded shapes, and their achieved bytes/s.

**Convention.** An operator reads each tensor input once (``Input Dims`` × the size of its ``Input
type``; a ``TensorList`` every tensor in it; a 0-dim tensor one element) and writes one output: an
in-place operator (its name ends with ``_``: ``aten::add_``, ``aten::_foreach_mul_``) its first
input (list) again, except that ``copy_``, ``fill_`` and ``zero_`` (:data:`OVERWRITES`) only write
it (counted once); a reduction (:data:`REDUCTIONS`) nothing
counted (its output is small); any other operator the broadcast of its tensor inputs' shapes, in
its first tensor's type. Scalars, lists of ints and types this table does not know count 0; an
operator with no tensor of a known type has no count. Only the operators of :data:`ELEMENTWISE`
(elementwise, softmax, layer norm, dropout, casts, reductions) and the ``_foreach_`` ones are
counted: a gather, an index or a custom operator (vLLM's KV cache writes) reads a part of its inputs
that the shapes do not show.

**Attribution.** A kernel whose FLOPs are not counted belongs to the operator that launched it (the
innermost around its launch: the kernel's ``External id`` is that operator's), where that operator's
shapes are recorded; an operator's bytes are shared among its kernels by duration. Only steady
kernels count.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import ClassVar, Final

import polars as pl

from traceinsight.analysis.results import COUNT, DURATION
from traceinsight.model import Model, field

__all__ = [
    "DTYPE_BYTES",
    "ELEMENTWISE",
    "OVERWRITES",
    "REDUCTIONS",
    "MemoryKernel",
    "memory_kernels",
    "operator_bytes",
]

#: Bytes per element of each ``Input type`` torch records.
DTYPE_BYTES: Final[dict[str, int]] = {
    "double": 8,
    "float": 4,
    "c10::Half": 2,
    "c10::BFloat16": 2,
    "c10::Float8_e4m3fn": 1,
    "c10::Float8_e5m2": 1,
    "c10::Float8_e4m3fnuz": 1,
    "c10::Float8_e5m2fnuz": 1,
    "long int": 8,
    "int": 4,
    "short int": 2,
    "signed char": 1,
    "unsigned char": 1,
    "bool": 1,
    "c10::complex<float>": 8,
    "c10::complex<double>": 16,
}

#: Operators whose output is a reduction of their input (its bytes not counted).
REDUCTIONS: Final = frozenset(
    {
        "aten::sum",
        "aten::mean",
        "aten::amax",
        "aten::amin",
        "aten::max",
        "aten::min",
        "aten::norm",
        "aten::linalg_vector_norm",
        "aten::var",
        "aten::std",
        "aten::var_mean",
        "aten::prod",
        "aten::any",
        "aten::all",
        "aten::argmax",
        "aten::argmin",
        "aten::nll_loss_forward",
        "aten::_local_scalar_dense",
    }
)

_POINTWISE: Final = [
    "add",
    "sub",
    "mul",
    "div",
    "neg",
    "abs",
    "exp",
    "exp2",
    "log",
    "log1p",
    "sqrt",
    "rsqrt",
    "reciprocal",
    "pow",
    "sign",
    "relu",
    "gelu",
    "silu",
    "sigmoid",
    "tanh",
    "hardtanh",
    "leaky_relu",
    "elu",
    "softplus",
    "clamp",
    "clamp_min",
    "clamp_max",
    "where",
    "masked_fill",
    "copy",
    "fill",
    "zero",
    "eq",
    "ne",
    "gt",
    "lt",
    "ge",
    "le",
    "maximum",
    "minimum",
    "bitwise_and",
    "bitwise_or",
    "bitwise_not",
    "logical_not",
    "addcmul",
    "addcdiv",
    "lerp",
]
#: The operators whose bytes are counted: elementwise (in place or not; their ``_``-suffixed and
#: backward forms), softmax, layer norm, dropout, type casts, the reductions of :data:`REDUCTIONS`
#: and the ``_foreach_`` optimizer operators. Others (gathers, indexing, custom and fused
#: operators, whose kernels read only part of their inputs or inputs the shapes do not show) have no
#: count.
ELEMENTWISE: Final = frozenset(
    {f"aten::{name}" for name in _POINTWISE}
    | {f"aten::{name}_" for name in _POINTWISE}
    | {
        "aten::threshold_backward",
        "aten::gelu_backward",
        "aten::silu_backward",
        "aten::sigmoid_backward",
        "aten::tanh_backward",
        "aten::_softmax",
        "aten::_log_softmax",
        "aten::_softmax_backward_data",
        "aten::_log_softmax_backward_data",
        "aten::native_layer_norm",
        "aten::native_layer_norm_backward",
        "aten::native_dropout",
        "aten::native_dropout_backward",
        "aten::_to_copy",
    }
    | REDUCTIONS
)
_FOREACH: Final = "aten::_foreach_"
#: In-place operators that overwrite their first input without reading it: its bytes count once.
OVERWRITES: Final = frozenset({"aten::copy_", "aten::fill_", "aten::zero_"})

#: No memory moves 1 PB/s (today's fastest, HBM3e, about 8 TB/s): a rate above it is left unknown.
MAX_BYTES_PER_S: Final = 1e15

#: Kernel names kept in :attr:`Flops.memory_kernels` (the most kernel time first).
TOP_MEMORY_KERNELS: Final = 200


def _elements(shape: Sequence[object]) -> int:
    count = 1
    for size in shape:
        count *= size if isinstance(size, int) and size >= 0 else 0
    return count


def _is_shape(value: object) -> bool:
    return isinstance(value, list) and all(isinstance(v, int) for v in value)


def _broadcast(shapes: list[list[int]]) -> list[int]:
    rank = max(len(shape) for shape in shapes)
    out = [1] * rank
    for shape in shapes:
        for axis, size in enumerate(shape, start=rank - len(shape)):
            if size != 1:
                out[axis] = size
    return out


def operator_bytes(name: str, dims: Sequence[object], types: Sequence[object]) -> int | None:
    """Bytes an operator reads and writes under the module doc's convention (None: not an operator
    of :data:`ELEMENTWISE` or ``_foreach_``, or no tensor of a known type among its inputs)."""
    if name not in ELEMENTWISE and not name.startswith(_FOREACH):
        return None
    read = 0
    first: tuple[int, int] | None = None  # (element size, bytes) of the first tensor input (list)
    shapes: list[list[int]] = []
    for value, kind in zip(dims, types, strict=False):
        if kind == "TensorList" and isinstance(value, list) and all(_is_shape(v) for v in value):
            # a list's element type is not recorded: the first tensor input's, else fp32
            size = first[0] if first else 4
            nbytes = sum(_elements(v) for v in value) * size
            if first is None:
                first = (size, nbytes)
            read += nbytes
            continue
        element = DTYPE_BYTES.get(kind) if isinstance(kind, str) else None
        if element is None or not _is_shape(value):
            continue
        assert isinstance(value, list)
        nbytes = _elements(value) * element
        read += nbytes
        shapes.append(value)
        if first is None:
            first = (element, nbytes)
    if first is None:
        return None
    if name in OVERWRITES:
        return read
    if name.endswith("_"):
        return read + first[1]
    if name in REDUCTIONS or not shapes:
        return read
    return read + _elements(_broadcast(shapes)) * first[0]


class MemoryKernel(Model, frozen=True, kw_only=True):
    """One kernel name's (on one device) steady kernel time and bytes moved, for kernels whose FLOPs
    are not counted (elementwise and other memory-bound work) and whose operator's bytes are known
    from recorded shapes; and its achieved bytes/s. A result's ``flops.memory_kernels[]``."""

    JSON_KEYS: ClassVar[tuple[str, ...]] = (
        "device", "name", "launches", "kernel_ns", "bytes_moved", "operator", "achieved_bytes_per_s",
    )  # fmt: skip

    name: str
    device: int
    launches: int = field(metadata=COUNT)
    kernel_ns: int = field(metadata=DURATION)
    bytes_moved: int = field(metadata=COUNT)
    #: The operator most of its launches came from (``aten::add_``).
    operator: str

    @property
    def achieved_bytes_per_s(self) -> float | None:
        """Bytes moved over kernel time (None without kernel time, or above :data:`MAX_BYTES_PER_S`:
        shapes that cannot be what the kernels moved)."""
        rate = self.bytes_moved / self.kernel_ns * 1e9 if self.kernel_ns else None
        return rate if rate is not None and rate <= MAX_BYTES_PER_S else None


def memory_kernels(
    ops: pl.DataFrame, kernels: pl.DataFrame, top: int = TOP_MEMORY_KERNELS
) -> tuple[tuple[MemoryKernel, ...], pl.DataFrame]:
    """The bytes moved by ``kernels`` (steady, FLOPs not counted: ``name``, ``device``, ``ts``,
    ``dur``, ``correlation``, ``external_id``) from the operators ``ops`` (the trace's ``cpu_ops``)
    that launched them: per kernel name, most kernel time first; and per kernel (``correlation``,
    ``ts``) its ``bytes_moved`` (see the module doc)."""
    empty = pl.DataFrame(schema={"correlation": pl.Int64, "ts": pl.Int64, "bytes_moved": pl.Int64})
    if kernels.is_empty():
        return (), empty
    shaped = (
        ops.filter(pl.col("input_dims").is_not_null() & pl.col("external_id").is_not_null())
        .unique("external_id", keep="first")
        .with_row_index("op")
        .select("op", "external_id", operator="name", dims="input_dims", types="input_types")
    )
    if shaped.is_empty():
        return (), empty
    owned = (
        kernels.select("name", "device", "ts", "dur", "correlation", "external_id")
        .filter(pl.col("external_id").is_not_null())
        .join(shaped, on="external_id", how="inner")
    )
    if owned.is_empty():
        return (), empty
    known: dict[tuple[str, str, str | None], int | None] = {}
    signatures = owned.select("operator", "dims", "types").unique()
    rows: dict[str, list[object]] = {"operator": [], "dims": [], "types": [], "op_bytes": []}
    for operator, dims_text, types_text in signatures.iter_rows():
        key = (operator, dims_text, types_text)
        if key not in known:
            try:
                dims = json.loads(dims_text)
                types = json.loads(types_text) if types_text is not None else []
            except ValueError:
                dims, types = None, None
            known[key] = (
                operator_bytes(operator, dims, types)
                if isinstance(dims, list) and isinstance(types, list)
                else None
            )
        for column, value in zip(rows, (*key, known[key]), strict=True):
            rows[column].append(value)
    sized = pl.DataFrame(
        rows, schema={"operator": pl.String, "dims": pl.String, "types": pl.String, "op_bytes": pl.Int64}
    )
    owned = owned.join(sized, on=["operator", "dims", "types"], how="left", nulls_equal=True).filter(
        pl.col("op_bytes").is_not_null()
    )
    # The share's denominator is null (not 0) where an operator's kernels took no time: polars
    # evaluates both branches, and a NaN of 0 / 0 cannot be cast to an integer (polars 1.37 refuses it).
    kernel_ns = pl.when(pl.col("op_kernel_ns") > 0).then(pl.col("op_kernel_ns"))
    owned = owned.with_columns(op_kernel_ns=pl.col("dur").sum().over("op")).with_columns(
        bytes_moved=pl.when(pl.col("op_kernel_ns") > 0)
        .then((pl.col("op_bytes").cast(pl.Float64) * pl.col("dur") / kernel_ns).round().cast(pl.Int64))
        .otherwise(pl.col("op_bytes") // pl.len().over("op"))
    )
    grouped = (
        owned.group_by("name", "device")
        .agg(
            launches=pl.len(),
            kernel_ns=pl.col("dur").sum(),
            bytes_moved=pl.col("bytes_moved").sum(),
            operator=pl.col("operator").mode().sort().first(),
        )
        .sort("kernel_ns", "name", "device", descending=[True, False, False])
        .head(top)
    )
    return (
        tuple(MemoryKernel(**row) for row in grouped.iter_rows(named=True)),  # its columns: the fields
        owned.select("correlation", "ts", "bytes_moved"),
    )
