"""numpy arrays without ``numpy.ma``: handed to polars through the Arrow C data interface, not
through polars' numpy path, and their distinct values and memberships found without numpy's check
for masked arrays.

``pl.Series(array)`` of a numpy array goes through polars' ``numpy_to_pyseries``, which asks
``np.ma.getmask`` of every array, and ``np.unique`` (``np.isin`` too, on its sorting path) asks
``np.ma.is_masked``: the first such call imports ``numpy.ma``, about 8 ms of every job (a small
trace's job takes ~0.45 s; see benchmarks/README.md, stop 46), for masks no array here has.
:func:`series` gives the same Series through ``__arrow_c_array__`` (:mod:`._arrays`, built with the
package's other C modules): polars takes the array's memory without a copy, and the array stays
alive until polars lets it go. Without the C module (a pure-Python build) it is ``pl.Series``.
:func:`distinct` and :func:`member` are ``np.unique`` and ``np.isin`` of integer arrays, by a sort
(at least as fast as numpy's, measured from 100 to 10^6 values; they allocate through the arrays'
own methods, so this module imports no numpy). The same hand-over would carry the scanner's
columns to a loader without numpy.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import polars as pl

try:
    from traceinsight import _arrays  # type: ignore[attr-defined]
except ImportError:  # a build without a C compiler: polars' own numpy path
    _arrays = None

if TYPE_CHECKING:
    from polars._typing import PolarsDataType

__all__ = ["AVAILABLE", "distinct", "member", "series"]

AVAILABLE: Final = _arrays is not None


class _Exported:
    """One array's capsules, as the Arrow PyCapsule interface hands them: polars calls
    ``__arrow_c_array__`` once and takes them."""

    __slots__ = ("capsules",)

    def __init__(self, capsules: tuple[object, object]) -> None:
        self.capsules = capsules

    def __arrow_c_array__(self, requested_schema: object = None) -> tuple[object, object]:
        return self.capsules


def series(array: Any, dtype: PolarsDataType | None = None) -> pl.Series:
    """``pl.Series(array, dtype=dtype)`` of a numpy array: for a one-dimensional array of native
    integers (1-8 bytes), floats (4 or 8 bytes) or booleans (unnamed, no nulls, NaN kept) without
    importing ``numpy.ma``; any other array (float16, another byte order, dates, 2-D) goes to
    polars' own constructor.

    A strided array is copied to a contiguous one first (as polars' path does); booleans come over
    as bytes and are cast (Arrow's booleans are bits); ``dtype``, when the array's own type is
    another, is a strict cast, as polars' constructor does it.
    """
    if _arrays is None or array.ndim != 1:
        return pl.Series(array, dtype=dtype)
    if not array.flags.c_contiguous:
        array = array.copy()
    try:
        capsules = _arrays.capsules(array)
    except (TypeError, ValueError, BufferError):  # not numbers the module hands over
        return pl.Series(array, dtype=dtype)
    result = pl.Series(_Exported(capsules))
    if array.dtype.kind == "b":
        result = result.cast(pl.Boolean)
    if dtype is not None and result.dtype != dtype:
        result = result.cast(dtype, strict=True)
    return result


def distinct(values: Any) -> Any:
    """``np.unique(values)`` of a one-dimensional integer array: its distinct values, sorted."""
    ordered = values.copy()
    ordered.sort()
    keep = ordered.astype(bool)  # any array of booleans of the same length, overwritten
    keep[:1] = True
    keep[1:] = ordered[1:] != ordered[:-1]
    return ordered[keep]


def member(values: Any, of: Any) -> Any:
    """``np.isin(values, of)`` of one-dimensional integer arrays: whether each value is one of ``of``."""
    ordered = of.copy()
    ordered.sort()
    if not ordered.size:
        return values != values  # all False, of the values' shape
    at = ordered.searchsorted(values)
    at.clip(0, ordered.size - 1, out=at)
    return ordered[at] == values
