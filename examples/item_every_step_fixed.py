"""Fixed twin of ``item_every_step.py``: keep the running loss on the device, read it rarely.

Summing ``loss.detach()`` on the device queues one more tiny kernel instead of waiting; the host
reads the number once every ``LOG_EVERY`` steps, so the loop in between never blocks.

    traceinsight run examples/item_every_step_fixed.py
"""

import torch
from torch import nn

STEPS = 30
LOG_EVERY = 10


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    inputs = torch.randn(64, 256, device=device)
    targets = torch.randint(0, 10, (64,), device=device)

    running_loss = torch.zeros((), device=device)
    for step in range(STEPS):
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        running_loss += loss.detach()  # stays on the device: no wait
        if (step + 1) % LOG_EVERY == 0:
            print(f"step {step}: mean loss {(running_loss / LOG_EVERY).item():.4f}")  # one sync per log line
            running_loss.zero_()


if __name__ == "__main__":
    main()
