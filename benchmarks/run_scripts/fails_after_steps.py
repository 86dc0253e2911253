"""Trains a few steps, then fails at a known line (``--fail-at``, default step 9): a ValueError."""

import argparse

import torch
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--fail-at", type=int, default=9)
    args = parser.parse_args()
    model = nn.Linear(16, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(100):
        loss = model(torch.randn(8, 16)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if step == args.fail_at:
            raise ValueError(f"bad batch at step {step}")  # the failing line


if __name__ == "__main__":
    main()
