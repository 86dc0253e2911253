"""A training loop that allocates a 1 MiB buffer each step and frees it at the step's end: the
allocator's [memory] records rise and fall once per step (``run --memory``)."""

import torch

model = torch.nn.Linear(64, 64)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _step in range(8):
    scratch = torch.ones(256, 1024)  # 1 MiB, freed below
    loss = model(torch.randn(32, 64)).pow(2).mean() + scratch.sum() * 0
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    del scratch
print("done")
