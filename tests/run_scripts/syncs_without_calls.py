"""A training loop whose syncs are made by no Python call on their line (see tests/test_run.py):
``float(loss)``, ``if loss > 100:`` and ``int(...)`` read the tensor through its slots, which a
profile function never sees."""

import warnings

import torch

warnings.filterwarnings("ignore", message="Converting a tensor with requires_grad")

model = torch.nn.Linear(16, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
inputs, targets = torch.randn(8, 16), torch.randn(8, 1)
running, positive = 0.0, 0
for _step in range(10):
    loss = torch.nn.functional.mse_loss(model(inputs), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    running += float(loss)  # sync: float
    if loss > 100:  # sync: if
        print("diverged")
    positive += int(loss.detach() >= 0)  # sync: int
print(f"trained, mean loss {running / 10:.3f}, {positive} positive")
