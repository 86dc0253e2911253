"""Problem: ``batch.to("cuda")`` from ordinary (pageable) host memory blocks the host.

The driver must stage a pageable buffer through pinned memory, so ``cudaMemcpyAsync`` is not
asynchronous: the host waits for the copy (and the GPU work queued before it) every step.
The fixed twin is ``pageable_copy_fixed.py``. Runs on a GPU if there is one, else on the CPU.

    traceinsight run examples/pageable_copy.py
"""

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

STEPS = 30
BATCH = 256


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(STEPS * BATCH, 512), torch.randint(0, 10, (STEPS * BATCH,)))
    loader = DataLoader(data, batch_size=BATCH, shuffle=True)  # batches in pageable memory
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    for inputs, targets in loader:
        inputs, targets = inputs.to(device), targets.to(device)  # blocking copies from pageable memory
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
