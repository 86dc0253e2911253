"""Fixed twin of ``pageable_copy.py``: pinned batches and ``non_blocking=True`` copies.

``pin_memory=True`` makes the DataLoader hand out page-locked batches, which the GPU can copy
asynchronously; ``non_blocking=True`` lets the host queue the copy and move on, so the copy
overlaps the previous step's kernels.

    traceinsight run examples/pageable_copy_fixed.py
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
    # Pinning only means something with a GPU to copy to.
    loader = DataLoader(data, batch_size=BATCH, shuffle=True, pin_memory=device.type == "cuda")
    model = nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    for inputs, targets in loader:
        inputs = inputs.to(device, non_blocking=True)  # pinned source: the copy runs asynchronously
        targets = targets.to(device, non_blocking=True)
        loss = nn.functional.cross_entropy(model(inputs), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
