"""Problem: printing ``loss.item()`` every step makes the host wait for the GPU every iteration.

``.item()`` copies one number to the host, so the host blocks (``cudaStreamSynchronize``) until
every queued kernel has run; the GPU then idles while Python prepares the next step.
The fixed twin is ``item_every_step_fixed.py``. Runs on a GPU if there is one, else on the CPU.

    traceinsight run examples/item_every_step.py
"""

import torch
from torch import nn

STEPS = 30


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(64, 256, device=device)
    targets = torch.randint(0, 10, (64,), device=device)

    for step in range(STEPS):
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"step {step}: loss {loss.item():.4f}")  # a host-GPU sync every step


if __name__ == "__main__":
    main()
