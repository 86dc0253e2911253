"""Four Linear(1024, 1024) layers, batch 256, SGD: GEMM FLOPs per step known exactly (see
tests/test_flops_run.py). ``steps=N`` optimizer steps (default 8)."""

import sys

import torch

options = dict(word.split("=", 1) for word in sys.argv[1:] if "=" in word)
steps = int(options.get("steps", "8"))
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(*(torch.nn.Linear(1024, 1024) for _ in range(4)))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
inputs = torch.randn(256, 1024)
for _ in range(steps):
    optimizer.zero_grad()
    loss = model(inputs).square().mean()
    loss.backward()
    optimizer.step()
print("trained", steps, "steps")
