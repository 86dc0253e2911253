"""Prints the loss tensor every step: one line, one fix, however many operators printing takes."""

import torch

torch.manual_seed(0)
model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
for _ in range(10):
    inputs = torch.randn(32, 16)
    loss = model(inputs).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(loss)
