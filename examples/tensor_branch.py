"""Problem: ``if h.sum() > 0:`` inside ``forward`` makes the host wait for the GPU every call.

Python needs a real ``bool`` to choose the branch, so the comparison's result is copied to the host
(``aten::is_nonzero`` → ``aten::item`` → ``cudaStreamSynchronize``) in the middle of the forward
pass. The fixed twin is ``tensor_branch_fixed.py``. Runs on a GPU if there is one, else on the CPU.

    traceinsight run examples/tensor_branch.py
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
        if h.sum() > 0:  # bool() of a device tensor: the host waits for the GPU here
            h = torch.relu(h)
        return h


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
