"""The tables several analyses share (analysis/shared.py): the kernel-name classes, held to plain
Python's ``re`` over the raw events' kernel names, on both of the ways they are computed."""

from __future__ import annotations

import re

import polars as pl
import pytest
from tracebuild import SAMPLES, read_events

from traceinsight.analysis import shared
from traceinsight.load import load_trace, taxonomy
from traceinsight.load.text import clean_text

PATTERNS = {
    "communication": taxonomy.COMMUNICATION_KERNEL_PATTERN,
    "tensor_core": taxonomy.TENSOR_CORE_KERNEL_PATTERN,
    "fp32_matmul": taxonomy.FP32_MATMUL_KERNEL_PATTERN,
}


@pytest.mark.parametrize(
    "sample",
    ["a100_ddp_nccl.json.gz", "v100_resnet50_workers0.pt.trace.json.gz", "b200_eager_stacks.json.gz"],
)
@pytest.mark.parametrize("by_distinct_name", [False, True])
def test_kernel_name_classes_are_the_patterns_over_each_kernel(
    sample: str, by_distinct_name: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    if by_distinct_name:  # the path a trace of more than _DISTINCT_FROM_ROWS GPU rows takes
        monkeypatch.setattr(shared, "_DISTINCT_FROM_ROWS", 0)
    _, events = read_events(SAMPLES / sample)
    kernel_categories = {cat for cat, kind in taxonomy.GPU_ACTIVITY_CATEGORIES.items() if kind == "kernel"}
    # as the tables hold them: a name over the text limit is cut (the loader's rule, not under test)
    raw_names = {
        clean_text(e["name"]) for e in events if e.get("ph") == "X" and e.get("cat") in kernel_categories
    }
    compiled = {column: re.compile(pattern) for column, pattern in PATTERNS.items()}

    trace = load_trace(SAMPLES / sample)
    classes = shared.gpu_classes(trace)

    # the GPU table itself, row for row, with the three columns after it
    assert classes.select(trace.gpu.columns).equals(trace.gpu)
    kernels = classes.filter(pl.col("kind") == "kernel")
    assert set(kernels.get_column("name")) == raw_names
    hits = {column: 0 for column in PATTERNS}
    for row in kernels.iter_rows(named=True):
        for column, pattern in compiled.items():
            expected = pattern.search(row["name"]) is not None
            assert row[column] is expected, (row["name"], column)
            hits[column] += expected
    others = classes.filter(pl.col("kind") != "kernel")
    for column in PATTERNS:
        assert others.get_column(column).null_count() == others.height
    # each sample exercises at least one class on real kernels
    assert any(hits.values()), hits
