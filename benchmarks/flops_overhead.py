"""What recording shapes costs a training step (the FLOP count's input), and `run`'s wall time.

The four-Linear loop of ``tests/run_scripts/four_linears.py`` (CPU, one thread): the median step
time without a profiler, under ``torch.profiler`` without and with ``record_shapes`` (and with
``with_flops``, which torch 2.13 does not write into the trace), then the script alone vs under
``traceinsight run`` (wall time of the process). Prints one line per measurement.

Run::

    python benchmarks/flops_overhead.py [--steps 12] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "run_scripts" / "four_linears.py"


def _steps(steps: int, **profiler: bool) -> float:
    import torch

    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(256, 1024)
    times = []

    def one() -> None:
        start = time.perf_counter()
        optimizer.zero_grad()
        model(inputs).square().mean().backward()
        optimizer.step()
        times.append(time.perf_counter() - start)

    if profiler:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU], **profiler):
            for _ in range(steps):
                one()
    else:
        for _ in range(steps):
            one()
    return statistics.median(times[2:]) * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    shapes = {
        "no profiler": {},
        "profiler": {"record_shapes": False},
        "profiler + record_shapes": {"record_shapes": True},
        "profiler + record_shapes + with_flops": {"record_shapes": True, "with_flops": True},
    }
    for label, options in shapes.items():
        medians = [_steps(args.steps, **options) for _ in range(args.repeat)]
        print(
            f"step ms, {label}: median {statistics.median(medians):.1f} (runs {', '.join(f'{m:.1f}' for m in medians)})"
        )
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    for label, command in (
        ("python script", [sys.executable, str(SCRIPT), f"steps={args.steps}"]),
        (
            "traceinsight run",
            [
                sys.executable,
                "-m",
                "traceinsight",
                "run",
                "--no-html",
                "--trace",
                "/tmp/flops_overhead.pt.trace.json.gz",
                str(SCRIPT),
                f"steps={args.steps}",
            ],
        ),
    ):
        walls = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            subprocess.run(command, env=env, capture_output=True, check=True)
            walls.append(time.perf_counter() - start)
        print(
            f"wall s, {label}: median {statistics.median(walls):.2f} (runs {', '.join(f'{w:.2f}' for w in walls)})"
        )


if __name__ == "__main__":
    main()
