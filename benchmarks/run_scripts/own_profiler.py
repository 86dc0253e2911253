"""A script that profiles itself: ``with torch.profiler.profile()`` (or a scheduled one) and its own export.

``--scheduled`` uses ``schedule(...)`` with ``tensorboard_trace_handler`` into ``--out`` (a
folder); otherwise a plain ``with profile() as prof`` and ``prof.export_chrome_trace`` to
``--out/own_trace.json``. Trains a small MLP for ``--steps`` (default 10).
"""

import argparse
import os

import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--scheduled", action="store_true")
    parser.add_argument("--out", default=".")
    args = parser.parse_args()
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def train_step() -> None:
        loss = model(torch.randn(16, 32)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()

    for _ in range(3):
        train_step()
    if args.scheduled:
        with profile(
            activities=[ProfilerActivity.CPU],
            schedule=schedule(wait=1, warmup=1, active=3),
            on_trace_ready=tensorboard_trace_handler(args.out),
        ) as prof:
            for _ in range(args.steps):
                train_step()
                prof.step()
    else:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(args.steps):
                train_step()
        prof.export_chrome_trace(os.path.join(args.out, "own_trace.json"))
    print("profiled itself")


if __name__ == "__main__":
    main()
