"""Updates the weights by hand (no torch.optim), reading the loss every step with .item()."""

import torch

torch.manual_seed(0)
weight = torch.randn(16, 1, requires_grad=True)
losses = []
for _ in range(10):
    inputs = torch.randn(32, 16)
    loss = (inputs @ weight).pow(2).mean()
    loss.backward()
    with torch.no_grad():
        weight -= 0.01 * weight.grad
        weight.grad.zero_()
    losses.append(loss.item())
print(f"{len(losses)} steps")
