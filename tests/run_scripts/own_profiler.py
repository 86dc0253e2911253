"""Profiles itself: a plain ``with profile()`` (or ``scheduled`` as first argument: a scheduled one
with tensorboard_trace_handler; ``repeating``: windows of 2 steps over 5 steps, so its last file
holds a window cut short), then exports into the folder named by the second argument."""

import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler

scheduled = sys.argv[1] in ("scheduled", "repeating")
repeating = sys.argv[1] == "repeating"
out = sys.argv[2]
model = torch.nn.Linear(8, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)


def train_step() -> None:
    loss = model(torch.randn(4, 8)).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()


for _ in range(2):
    train_step()
if scheduled:
    handler = tensorboard_trace_handler(out)
    with profile(activities=[ProfilerActivity.CPU],
                 schedule=schedule(wait=0, warmup=0, active=2, repeat=0 if repeating else 1),
                 on_trace_ready=handler) as prof:  # fmt: skip
        for _ in range(5 if repeating else 4):
            train_step()
            prof.step()
else:
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(3):
            train_step()
    prof.export_chrome_trace(os.path.join(out, "own_trace.json"))
print("profiled itself")
