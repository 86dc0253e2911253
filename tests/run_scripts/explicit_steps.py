"""A loop without torch.optim marks its steps with the public API (both forms)."""

import torch

from traceinsight.capture import profile_step, step

weights = torch.randn(8, 1, requires_grad=True)
for iteration in range(10):
    if iteration % 2:
        with profile_step():
            loss = (torch.randn(4, 8) @ weights).pow(2).mean()
            loss.backward()
            with torch.no_grad():
                weights -= 0.01 * weights.grad
                weights.grad = None
    else:
        loss = (torch.randn(4, 8) @ weights).pow(2).mean()
        loss.backward()
        with torch.no_grad():
            weights -= 0.01 * weights.grad
            weights.grad = None
        step()
