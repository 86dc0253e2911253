"""Fixed twin of ``tensor_branch.py``: choose on the device with ``torch.where``, never in Python.

Both branches are computed and the condition selects between them on the device, so the host
keeps queueing work and the forward pass never blocks.

    traceinsight run examples/tensor_branch_fixed.py
"""

import torch
from torch import nn

STEPS = 30


class GatedBlock(nn.Module):
    """A linear layer whose activation depends on the sign of its output's sum."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.linear = nn.Linear(width, width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.linear(x)
        return torch.where(h.sum() > 0, torch.relu(h), h)  # decided on the device: no wait


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(*(GatedBlock(256) for _ in range(4)), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(64, 256, device=device)
    targets = torch.randint(0, 10, (64,), device=device)

    for _ in range(STEPS):
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
