"""Problem: a DataLoader without workers prepares every batch in the training loop itself.

With ``num_workers=0`` each ``next(loader)`` reads and decodes a whole batch in the main process
(``enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__`` in the trace) while the GPU has
nothing queued. The fixed twin is ``serial_dataloader_fixed.py``. Runs on a GPU if there is one,
else on the CPU.

    traceinsight run examples/serial_dataloader.py
"""

import time

import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

STEPS = 24
BATCH = 16


class SlowImages(Dataset[tuple[torch.Tensor, int]]):
    """Synthetic images whose loading takes a while, like reading and decoding a JPEG."""

    def __len__(self) -> int:
        return STEPS * BATCH

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        time.sleep(0.001)  # stands in for reading and decoding one file
        generator = torch.Generator().manual_seed(index)
        return torch.rand(3, 32, 32, generator=generator), index % 10


def main() -> None:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    loader = DataLoader(SlowImages(), batch_size=BATCH, shuffle=True)  # num_workers=0: serial
    model = nn.Sequential(nn.Flatten(), nn.Linear(3 * 32 * 32, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
        loss = nn.functional.cross_entropy(model(images), labels)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()


if __name__ == "__main__":
    main()
