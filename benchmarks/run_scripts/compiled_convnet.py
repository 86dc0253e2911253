"""A small conv net under ``torch.compile`` (inductor on CPU), trained with SGD on random images.

The first step compiles (forward and backward): millions of Python calls inside dynamo and inductor,
which ``with_stack`` recorded one by one. Prints ``STEP_MS`` (the median step after the first 3).
``--steps`` (default 12), ``--batch-size`` (default 16).
"""

import argparse
import itertools
import statistics
import time

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=16)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 32, 3, padding=1), nn.ReLU(),
        nn.AdaptiveAvgPool2d(4), nn.Flatten(), nn.Linear(512, 10),
    )  # fmt: skip
    compiled = torch.compile(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    steps = [time.perf_counter()]
    for _ in range(args.steps):
        images = torch.randn(args.batch_size, 3, 32, 32)
        labels = torch.randint(0, 10, (args.batch_size,))
        loss = nn.functional.cross_entropy(compiled(images), labels)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        steps.append(time.perf_counter())
    print(f"STEP_MS {statistics.median(b - a for a, b in itertools.pairwise(steps[3:])) * 1e3:.2f}")
    print(f"trained {args.steps} steps, last loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
