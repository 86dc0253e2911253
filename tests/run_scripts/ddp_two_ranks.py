"""A tiny 2-rank gloo DDP job for torchrun: rank 1 runs an extra matmul per step, so the ranks differ."""

import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group(backend="gloo")
rank = int(os.environ["RANK"])
model = DistributedDataParallel(nn.Linear(8, 1))
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(10):
    inputs = torch.randn(4, 8)
    if rank == 1:
        inputs = inputs @ torch.eye(8)  # rank 1's extra aten::mm
    loss = model(inputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"rank {rank} done", flush=True)
dist.destroy_process_group()
