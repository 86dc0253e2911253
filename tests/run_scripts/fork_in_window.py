"""Forks a DataLoader worker in every step (a new iterator each time); each worker reports whether
a profile function was set in it. Prints which steps had a worker with one."""

import sys

import torch
from torch.utils.data import DataLoader, Dataset


class ProfileProbe(Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 2

    def __getitem__(self, index: int) -> torch.Tensor:
        return torch.tensor(sys.getprofile() is not None)


model = torch.nn.Linear(1, 1)
optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
traced_steps = []
for step in range(9):
    flags = torch.cat(list(DataLoader(ProfileProbe(), batch_size=1, num_workers=1)))
    if bool(flags.any()):
        traced_steps.append(step)
    loss = model(flags.float().unsqueeze(1)).sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
print(f"workers with a profile function in steps: {traced_steps}")
