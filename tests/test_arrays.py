"""numpy arrays without ``numpy.ma`` (:mod:`traceinsight.arrays`): handed to polars as Arrow arrays,
the same Series as polars' own constructor gives; distinct values and memberships as numpy's; and
a whole `analyze` that never imports ``numpy.ma``."""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import polars as pl
import pytest
from polars.testing import assert_series_equal

from traceinsight import arrays

ROOT = Path(__file__).resolve().parent.parent
SAMPLES = ROOT / "sample_traces"

needs_c = pytest.mark.skipif(
    not arrays.AVAILABLE and not os.environ.get("CI"), reason="traceinsight._arrays was not built here"
)


def _cases() -> list[tuple[np.ndarray, pl.DataType | None]]:
    rng = np.random.default_rng(7)
    ints = rng.integers(-(2**62), 2**62, 1_000)
    return [
        (ints, None),
        (ints, pl.Int64),
        (np.array([], dtype=np.int64), pl.Int64),
        (ints[::3], pl.Int64),  # strided: copied first
        (ints.astype(np.int32), pl.Int64),  # cast, as polars' constructor casts
        (rng.integers(0, 255, 100).astype(np.uint8), None),
        (rng.integers(0, 2**40, 100).astype(np.uint64), None),
        (rng.integers(-100, 100, 100).astype(np.int16), None),
        (np.array([1.5, np.nan, -0.0, np.inf, -np.inf, 2.0**-1074]), pl.Float64),
        (rng.random(100).astype(np.float32), None),
        (rng.random(1_000) < 0.3, None),
        (rng.random(1_000) < 0.3, pl.Boolean),
        (np.array([], dtype=bool), pl.Boolean),
        (np.arange(5, dtype=">i8"), None),  # another byte order: polars' own constructor
        (np.array([0.5, -2.0], dtype=np.float16), None),  # float16: polars' own constructor
    ]


@needs_c
def test_built_where_ci_says() -> None:
    assert arrays.AVAILABLE, "CI is set but traceinsight._arrays was not built"


@needs_c
@pytest.mark.parametrize("index", range(len(_cases())))
def test_series_is_what_polars_makes_of_the_array(index: int) -> None:
    array, dtype = _cases()[index]
    expected = pl.Series(array, dtype=dtype)
    got = arrays.series(array, dtype)
    assert got.dtype == expected.dtype
    assert got.name == expected.name == ""
    assert_series_equal(got, expected, check_exact=True)
    assert got.null_count() == 0
    # The values, read back one by one, against numpy's (NaN compared as NaN).
    assert [repr(v) for v in got.to_list()] == [
        repr(v) for v in pl.Series(array.tolist(), dtype=got.dtype).to_list()
    ]


@needs_c
def test_series_keeps_the_array_alive_until_polars_lets_it_go() -> None:
    from traceinsight import _arrays  # type: ignore[attr-defined]

    deferred = _arrays.deferred()
    values = np.arange(100_000, dtype=np.int64) * 3
    copy = values.copy()
    held = arrays.series(values)
    del values
    gc.collect()
    _ = [np.full(100_000, -1, dtype=np.int64) for _ in range(20)]  # reuse freed memory, if any was
    assert held.to_list() == copy.tolist()
    # Let go of from another thread (polars may drop a column on any of its threads).
    done = threading.Event()

    def drop() -> None:
        nonlocal held
        del held
        gc.collect()
        done.set()

    thread = threading.Thread(target=drop)
    thread.start()
    thread.join()
    assert done.is_set()
    assert _arrays.deferred() == deferred  # a Python thread holds the GIL: released there and then


@needs_c
def test_a_buffer_that_is_no_array_of_numbers_is_refused() -> None:
    from traceinsight import _arrays  # type: ignore[attr-defined]

    with pytest.raises(TypeError, match="not a flat buffer of numbers"):
        _arrays.capsules(np.zeros(3, dtype=np.complex128))
    with pytest.raises(TypeError, match="not a flat buffer of numbers"):
        _arrays.capsules(np.zeros((2, 2), dtype=np.int64))
    with pytest.raises((BufferError, ValueError)):  # numpy's refusal: not contiguous
        _arrays.capsules(np.zeros((4, 4), dtype=np.int64)[:, 1])
    # A 2-D array goes to polars' own constructor, as before.
    assert_series_equal(
        arrays.series(np.zeros((2, 2), dtype=np.int64)), pl.Series(np.zeros((2, 2), dtype=np.int64))
    )


def test_distinct_and_member_are_numpys() -> None:
    rng = np.random.default_rng(11)
    for size, high in ((0, 5), (1, 5), (7, 3), (1_000, 10), (10_000, 2**40)):
        values = rng.integers(-high, high, size).astype(np.int64)
        assert arrays.distinct(values).tolist() == np.unique(values).tolist()
        for of_size in (0, 1, 50):
            of = np.concatenate(
                [
                    rng.choice(values, min(of_size, size)) if size else values[:0],
                    rng.integers(-high, high, of_size),
                ]
            )
            got = arrays.member(values, of)
            assert got.dtype == bool and got.shape == values.shape
            assert got.tolist() == np.isin(values, of).tolist()
            assert got.tolist() == [value in set(of.tolist()) for value in values.tolist()]


@needs_c
@pytest.mark.parametrize(
    "sample",
    [
        "h100_bert_small_stacks.json.gz",  # stacks: the line lookups
        "a100_alexnet_cuda_sync.json.gz",  # the rules' replay of fixes (streams per window)
        "gp100_mlp_pageable_sync.json.gz",  # pageable copies: a fix moves them to a side stream
    ],
)
def test_an_analyze_never_imports_numpy_ma(sample: str, tmp_path: Path) -> None:
    """polars' numpy path and ``np.unique`` import ``numpy.ma`` (~8 ms of a job); nothing of ours
    needs it. Read from the job's own ``-X importtime``."""
    child = subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "traceinsight", "analyze", str(SAMPLES / sample),
         "--json", str(tmp_path / "r.json"), "-o", str(tmp_path / "r.html")],
        capture_output=True, text=True, check=True, cwd=tmp_path,
    )  # fmt: skip
    imported = {
        line.rsplit("|", 1)[-1].strip()
        for line in child.stderr.splitlines()
        if line.startswith("import time:")
    }
    # the reading is what it seems: numpy's and polars' modules are there (a package's own line can
    # be missing when another thread imports at the same time, as the head start's does)
    assert any(name.startswith("numpy._core") for name in imported)
    assert any(name.startswith("polars.dataframe") for name in imported)
    assert not [name for name in imported if name == "numpy.ma" or name.startswith("numpy.ma.")]
    assert (tmp_path / "r.json").stat().st_size and (tmp_path / "r.html").stat().st_size


@needs_c
def test_a_release_without_the_gil_is_left_to_the_main_thread() -> None:
    """polars' workers release arrays without the GIL: the view is let go of by a pending call on
    the main thread (never waiting for the GIL there), and the array is freed soon after."""
    import ctypes
    import time
    import weakref

    from traceinsight import _arrays  # type: ignore[attr-defined]

    class ArrowArray(ctypes.Structure):
        _fields_ = [  # the C layout
            *(
                (name, ctypes.c_int64)
                for name in ("length", "null_count", "offset", "n_buffers", "n_children")
            ),
            *(
                (name, ctypes.c_void_p)
                for name in ("buffers", "children", "dictionary", "release", "private_data")
            ),
        ]

    values = np.arange(1_000, dtype=np.int64)
    alive = weakref.ref(values)
    _schema, array_capsule = _arrays.capsules(values)
    del values
    gc.collect()
    assert alive() is not None  # the view holds it
    get = ctypes.pythonapi.PyCapsule_GetPointer
    get.restype, get.argtypes = ctypes.c_void_p, [ctypes.py_object, ctypes.c_char_p]
    struct = ArrowArray.from_address(get(array_capsule, b"arrow_array"))
    assert struct.length == 1_000 and struct.release
    release = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(struct.release)
    before = _arrays.deferred()
    release(ctypes.addressof(struct))  # a ctypes call lets go of the GIL: as a polars worker would
    assert not struct.release  # released, as the interface asks
    assert _arrays.deferred() == before + 1  # left to the main thread, not released there and then
    deadline = time.monotonic() + 5
    while alive() is not None and time.monotonic() < deadline:
        time.sleep(0.001)  # the main thread runs Python: the pending call lets go of the view
    assert alive() is None
    del array_capsule  # its destructor frees the structure, and releases nothing twice
    gc.collect()
