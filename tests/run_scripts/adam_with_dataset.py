"""Adam over a small model, batches from a Dataset that reads tensor values per sample (as
torchvision's FakeData and Normalize do): every value read here stays on the CPU with a GPU too
(the Dataset's tensors, Adam's step counters), so no line of this script would make a GPU wait."""

import torch
from torch.utils.data import DataLoader, Dataset


class ReadingDataset(Dataset[tuple[torch.Tensor, int]]):
    def __len__(self) -> int:
        return 12 * 8

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        image = torch.randn(3, 8, 8)
        target = torch.randint(0, 10, (1,))[0]
        std = image.std()
        if std > 0:  # Normalize's check: an `if` on a CPU tensor
            image = (image - image.mean()) / std
        return image, int(target.item())  # FakeData's read of its target


model = torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(3 * 8 * 8, 10))
optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
loader = DataLoader(ReadingDataset(), batch_size=8)
for images, targets in loader:
    loss = torch.nn.functional.cross_entropy(model(images), targets)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print("done")
