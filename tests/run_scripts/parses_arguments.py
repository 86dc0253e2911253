"""argparse before any step: ``--help`` and a usage error end it before its first step."""

import argparse

import torch

parser = argparse.ArgumentParser(description="a training script")
parser.add_argument("--epochs", type=int, default=1)
args = parser.parse_args()
model = torch.nn.Linear(4, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for _ in range(10 * args.epochs):
    loss = model(torch.randn(2, 4)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
