"""`traceinsight run` counts a training loop's GEMM FLOPs and names its modules (real torch, CPU,
in a fresh process as tests/test_run.py's real-process tests run)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

if os.environ.get("CI") and importlib.util.find_spec("torch") is None:
    raise ImportError(
        "torch is not installed but CI is set: `traceinsight run` must be tested with real torch"
    )
pytest.importorskip("torch")

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "run_scripts" / "four_linears.py"


def test_four_linears_report_their_gemm_flops_per_step_and_each_linear_module(tmp_path: Path) -> None:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "traceinsight",
            "run",
            "--no-html",
            "--json",
            "r.json",
            str(SCRIPT),
            "steps=8",
        ],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    result = json.loads((tmp_path / "r.json").read_text(encoding="utf-8"))
    # Per step, each layer's GEMM is 2·256·1024·1024 FLOPs: 4 forward, 4 weight gradients, and 3
    # input gradients (the first layer's input needs none).
    one = 2 * 256 * 1024 * 1024
    expected = (4 + 4 + 3) * one
    flops = result["flops"]
    assert flops["steps"] > 0
    assert flops["flops_per_step"] == pytest.approx(expected, rel=0.10)
    modules = {scope["path"]: scope for scope in result["scopes"]["modules"]}
    assert {f"Sequential_0/Linear_{i}" for i in range(4)} <= set(modules)
    # each Linear's forward GEMM counts for its module
    for i in range(4):
        assert modules[f"Sequential_0/Linear_{i}"]["flops"] == pytest.approx(one, rel=0.01)
